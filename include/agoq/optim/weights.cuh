/// \file
/// The CUDA forms of the weight quantization helpers (optim/weights.hpp): the same formats and
/// the same straight-through convention on device memory, stream-ordered, with codes and scales
/// bit-identical to the host helpers (they run quantize_async's kernels). Needs nvcc.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "../cuda_check.hpp"
#include "../quantize.cuh"
#include "weights.hpp"

namespace agoq::optim {

/// Quantizes the [out, in] weight matrix `w` into `q` (both device memory; `q` laid out for
/// `f.to_spec()` and w's extents, e.g. view_of_buffer over make_layout(f.to_spec(), out, in)
/// .total_bytes bytes) on `ex.stream`: the bytes quantize_weights writes on the host. `nonfinite`
/// as quantize_async's. Does not synchronize.
/// \throws agoq::invalid_argument on an invalid format, a view of another spec or shape, a null
/// or pageable host pointer; agoq::cuda_error when a CUDA call fails.
template <class In>
requires element_type<std::remove_const_t<In>>
void quantize_weights_async(cuda_executor ex, matrix_view<In> w, weight_format const& f,
                            quantized_view q, quantize_options opt = {},
                            std::int64_t* nonfinite = nullptr) {
  spec const s = f.to_spec();
  AGOQ_EXPECTS(q.spec == s, "quantize_weights_async: the view holds " + q.spec.name() +
                                " codes, the format is " + s.name());
  quantize_async<weight_codes>(ex, w, q, opt, nonfinite);
}

/// fake_quantize_weights on device memory (`w` and `out` may be the same buffer) on `ex.stream`,
/// bit-identical to the host. Does not synchronize.
/// \throws as fake_quantize_async, or for an invalid format.
template <class In, class Out>
requires element_type<std::remove_const_t<In>> && element_type<Out>
void fake_quantize_weights_async(cuda_executor ex, weight_format const& f, matrix_view<In> w,
                                 matrix_view<Out> out, quantize_options opt = {},
                                 std::int64_t* nonfinite = nullptr) {
  fake_quantize_async<weight_codes>(ex, f.to_spec(), w, out, opt, nonfinite);
}

/// straight_through on device memory: copies `grad_wq` into `grad_w` on `ex.stream` (nothing when
/// they are the same buffer). Does not synchronize.
/// \throws agoq::invalid_argument when the extents differ, a pointer is null or pageable host
/// memory, or the buffers partly overlap; agoq::cuda_error when a CUDA call fails.
template <class G>
requires element_type<G>
void straight_through_async(cuda_executor ex, matrix_view<G const> grad_wq, matrix_view<G> grad_w) {
  if (!detail::straight_through_copies(grad_wq, grad_w, "straight_through_async")) return;
  agoq::detail::gpu::check_device_pointers("straight_through_async",
                                           {grad_wq.data_handle(), grad_w.data_handle()});
  auto const bytes = static_cast<std::uintptr_t>(grad_w.size()) * sizeof(G);
  auto const src = reinterpret_cast<std::uintptr_t>(grad_wq.data_handle());
  auto const dst = reinterpret_cast<std::uintptr_t>(grad_w.data_handle());
  AGOQ_EXPECTS(src + bytes <= dst || dst + bytes <= src,
               "straight_through_async: the gradients partly overlap");
  AGOQ_CUDA_TRY(cudaMemcpyAsync(grad_w.data_handle(), grad_wq.data_handle(), bytes,
                                cudaMemcpyDeviceToDevice, ex.stream.get()));
}

}  // namespace agoq::optim
