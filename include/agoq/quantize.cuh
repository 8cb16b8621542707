/// \file
/// The CUDA executor: stream-ordered quantize, dequantize and fake-quantize for every scheme the
/// CPU executor supports, bit-identical to it (both call numeric/codec.hpp). Needs nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include <cuda_runtime_api.h>
#include <cuda/stream_ref>

#include "cuda_check.hpp"
#include "detail/gpu/kernels.cuh"
#include "quantize.hpp"

namespace agoq {

/// The CUDA executor: work is enqueued on `stream` and the calls return without synchronizing.
struct cuda_executor {
  ::cuda::stream_ref stream;
};

namespace detail::gpu {

/// Launches `kernel` on `grid` x `block` threads with `shared_bytes` of dynamic shared memory on
/// `stream` (the arguments convert to the kernel's parameters as in a triple-chevron launch). Every
/// agoq kernel is launched here; under AGOQ_DEVICE_EMULATION (agoq's emulated device tier,
/// tests/emulator) the grid runs on the host through agoq_emulation::launch instead.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
#if defined(AGOQ_DEVICE_EMULATION)
  ::agoq_emulation::launch(grid, block, shared_bytes, stream, [&] { kernel(args...); });
#else
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
#endif
}

/// Blocks for `work` threads under the launch policy of the current device.
inline unsigned grid_for(std::int64_t work, device::launch_policy pol) {
  int dev = 0, sms = 0;
  AGOQ_CUDA_TRY(cudaGetDevice(&dev));
  AGOQ_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::int64_t const wanted = (work + pol.block_threads - 1) / pol.block_threads;
  std::int64_t const resident = std::int64_t{sms} * pol.blocks_per_sm;
  return static_cast<unsigned>(wanted < resident ? (wanted > 0 ? wanted : 1) : resident);
}

inline device::launch_policy current_policy() {
  int dev = 0, major = 0, minor = 0;
  AGOQ_CUDA_TRY(cudaGetDevice(&dev));
  AGOQ_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  AGOQ_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return device::policy_for(major * 10 + minor);
}

/// Refuses pointers the device cannot read (plain pageable host memory).
inline void check_device_pointer(void const* p, char const* what) {
  if (p == nullptr) return;
  cudaPointerAttributes a{};
  AGOQ_CUDA_TRY(cudaPointerGetAttributes(&a, p));
  AGOQ_EXPECTS(a.type != cudaMemoryTypeUnregistered,
               std::string(what) + ": a pageable host pointer was passed to a CUDA call");
}

/// check_device_pointer of each of `pointers`, in order (the local checks of a CUDA call: they
/// throw on the calling host thread, before anything is enqueued).
inline void check_device_pointers(char const* what, std::initializer_list<void const*> pointers) {
  for (void const* p : pointers) check_device_pointer(p, what);
}

template <class V>
void check_device_view(V const& v, char const* what) {
  check_device_pointers(what, {v.codes, v.scales, v.zero_points});
}

inline bool one_pass(spec const& s) {
  return s.grouping == grouping_kind::group &&
         (s.group_cols == 32 || s.group_cols == 64 || s.group_cols == 128 || s.group_cols == 256);
}

template <class Code, class Rounding, class T>
void launch_quantize(T const* x, quantized_view const& out, quantize_options opt,
                     unsigned long long* nonfinite, cudaStream_t stream) {
  device::launch_policy const pol = current_policy();
  quantized_layout const l = out.layout();
  if (one_pass(out.spec)) {
    int const lanes_log2 = device::group_lanes_log2(out.spec.group_cols);
    // The linear path holds runs_in_flight runs per thread.
    std::int64_t const threads =
        (l.groups() << lanes_log2) /
        (quantize_linear(x, l.cols, out.spec.group_cols) ? runs_in_flight : 1);
    launch(quantize_groups_kernel<T, Code, Rounding>, grid_for(threads, pol), pol.block_threads, 0,
           stream, x, out, lanes_log2, opt.seed, opt.offset, nonfinite);
    AGOQ_CUDA_TRY(cudaGetLastError());
    return;
  }
  void* scratch = nullptr;
  std::size_t const bytes = static_cast<std::size_t>(l.groups()) * sizeof(group_accumulator);
  AGOQ_CUDA_TRY(cudaMallocAsync(&scratch, bytes, stream));
  auto* acc = static_cast<group_accumulator*>(scratch);
  launch(init_accumulators_kernel<>, grid_for(l.groups(), pol), pol.block_threads, 0, stream, acc,
         l.groups());
  std::int64_t const units = device::unit_count(l.rows, l.cols);
  launch(stats_kernel<T, Code>, grid_for(units, pol), pol.block_threads, 0, stream, x, l, acc,
         nonfinite);
  launch(params_kernel<Code>, grid_for(l.groups(), pol), pol.block_threads, 0, stream, acc, out,
         l.groups());
  launch(encode_kernel<T, Code, Rounding>, grid_for(units, pol), pol.block_threads, 0, stream, x,
         out, l, opt.seed, opt.offset);
  AGOQ_CUDA_TRY(cudaGetLastError());
  AGOQ_CUDA_TRY(cudaFreeAsync(scratch, stream));
}

}  // namespace detail::gpu

/// Quantizes `in` (device memory) into `out` (device memory) on `ex.stream`. When `nonfinite` is
/// not null it must point to one device-accessible std::int64_t, which receives the count of
/// non-finite inputs once the stream reaches the end of the call. Codes and scales equal the CPU
/// executor's bit for bit. Does not synchronize. Any size (64-bit indexing); pointers need no
/// particular alignment (16-byte accesses are used where they are aligned). `Codes` lists the
/// code families whose kernels the call compiles (by default the dispatch set's eight, each with
/// both roundings); a caller that knows its schemes names fewer, e.g.
/// `quantize_async<type_list<int_sym<8>>>(ex, in, out)`, and compiles an eighth of them.
/// \throws agoq::invalid_argument on an invalid spec, mismatched extents, a null or pageable host
/// pointer; agoq::unsupported_scheme on a code family outside `Codes`; agoq::cuda_error when a
/// CUDA call fails.
template <code_list Codes = dispatch_codes, detail::readable_elements In>
void quantize_async(cuda_executor ex, matrix_view<In> in, quantized_view out,
                    quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  out.validate();
  require_code<Codes>(out.spec);
  detail::check_extents(in.extent(0), in.extent(1), out.rows, out.cols, "quantize_async");
  detail::check_data(in.data_handle(), in.size(), "quantize_async");
  cudaStream_t const stream = ex.stream.get();
  auto* count = reinterpret_cast<unsigned long long*>(nonfinite);
  if (count != nullptr) AGOQ_CUDA_TRY(cudaMemsetAsync(count, 0, sizeof(*count), stream));
  if (in.size() == 0) return;
  detail::gpu::check_device_pointer(in.data_handle(), "quantize_async");
  detail::gpu::check_device_view(out, "quantize_async");
  using T = std::remove_const_t<In>;
  dispatch_code<Codes>(out.spec, [&](auto code) {
    dispatch_rounding(out.spec, [&](auto rounding) {
      detail::gpu::launch_quantize<decltype(code), decltype(rounding)>(
          static_cast<T const*>(in.data_handle()), out, opt, count, stream);
    });
  });
}

/// Dequantizes `in` into `out` (both device memory) on `ex.stream`. When `nonfinite` is not null
/// it receives the count of outputs decoded under a non-finite stored scale (zero for buffers
/// written by quantize). Bit-identical to the CPU executor. Does not synchronize. `Codes` as in
/// quantize_async.
/// \throws as quantize_async.
template <code_list Codes = dispatch_codes, detail::writable_elements Out>
void dequantize_async(cuda_executor ex, const_quantized_view in, matrix_view<Out> out,
                      std::int64_t* nonfinite = nullptr) {
  in.validate();
  require_code<Codes>(in.spec);
  detail::check_extents(out.extent(0), out.extent(1), in.rows, in.cols, "dequantize_async");
  detail::check_data(out.data_handle(), out.size(), "dequantize_async");
  cudaStream_t const stream = ex.stream.get();
  auto* count = reinterpret_cast<unsigned long long*>(nonfinite);
  if (count != nullptr) AGOQ_CUDA_TRY(cudaMemsetAsync(count, 0, sizeof(*count), stream));
  if (out.size() == 0) return;
  detail::gpu::check_device_pointer(out.data_handle(), "dequantize_async");
  detail::gpu::check_device_view(in, "dequantize_async");
  quantized_layout const l = in.layout();
  device::launch_policy const pol = detail::gpu::current_policy();
  dispatch_code<Codes>(in.spec, [&](auto code) {
    using Code = decltype(code);
    // The linear path holds runs_in_flight runs per thread.
    std::int64_t const threads =
        device::unit_count(l.rows, l.cols) /
        (detail::gpu::dequantize_linear_applies<Code>(in, l, out.data_handle())
             ? detail::gpu::runs_in_flight
             : 1);
    detail::gpu::launch(detail::gpu::dequantize_kernel<Out, Code>,
                        detail::gpu::grid_for(threads, pol), pol.block_threads, 0, stream, in, l,
                        out.data_handle(), count);
  });
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// Quantizes and dequantizes `in` with scheme `s` into `out` on `ex.stream` through a
/// stream-ordered temporary, bit-identical to quantize_async followed by dequantize_async.
/// `in` and `out` may be the same buffer. Does not synchronize. `Codes` as in quantize_async.
/// \throws as quantize_async.
template <code_list Codes = dispatch_codes, detail::readable_elements In,
          detail::writable_elements Out>
void fake_quantize_async(cuda_executor ex, spec const& s, matrix_view<In> in, matrix_view<Out> out,
                         quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  s.validate();
  require_code<Codes>(s);  // before the temporary is allocated
  detail::check_extents(in.extent(0), in.extent(1), out.extent(0), out.extent(1),
                        "fake_quantize_async", "the output");
  quantized_layout const l = make_layout(s, in.extent(0), in.extent(1));
  cudaStream_t const stream = ex.stream.get();
  void* tmp = nullptr;
  if (l.total_bytes > 0) AGOQ_CUDA_TRY(cudaMallocAsync(&tmp, l.total_bytes, stream));
  quantized_view const q =
      view_of_buffer(s, in.extent(0), in.extent(1), static_cast<std::uint8_t*>(tmp));
  quantize_async<Codes>(ex, in, q, opt, nonfinite);
  dequantize_async<Codes>(ex, const_quantized_view(q), out);
  if (tmp != nullptr) AGOQ_CUDA_TRY(cudaFreeAsync(tmp, stream));
}

}  // namespace agoq
