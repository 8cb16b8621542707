/// \file
/// The extension's tensor calls (ops.hpp: compress / decompress / fake_quantize of saved tensors,
/// the fused producer/consumer ops of agoq/activation/fused.hpp and the error model's measure) on
/// CPU tensors, and the module's CPU-side helpers.
#include "ops.hpp"

#include <agoq/activation/statistics.hpp>

namespace agoq_torch {
namespace {

namespace act = agoq::activation;
namespace py = pybind11;

/// ops.hpp's backend for CPU tensors: the CPU executor on torch's intra-op pool (executor()),
/// outputs allocated by torch on the CPU, non-finite counts added to nonfinite_seen().
struct cpu_backend : cpu_place {
  explicit cpu_backend(torch::Tensor const&) {}

  static torch::Tensor empty(at::IntArrayRef sizes, torch::ScalarType st) {
    return torch::empty(sizes, torch::TensorOptions().dtype(st));
  }
  static torch::Tensor zeros(at::IntArrayRef sizes, torch::ScalarType st) {
    return torch::zeros(sizes, torch::TensorOptions().dtype(st));
  }

  template <class... A>
  void quantize(A&&... a) const {
    note_nonfinite(agoq::quantize(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void dequantize(A&&... a) const {
    agoq::dequantize(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void fake_quantize(A&&... a) const {
    note_nonfinite(agoq::fake_quantize(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void rmsnorm_forward(A&&... a) const {
    note_nonfinite(act::rmsnorm_forward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void rmsnorm_forward_plain(A&&... a) const {
    act::rmsnorm_forward(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void rmsnorm_backward(A&&... a) const {
    note_nonfinite(act::rmsnorm_backward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void swiglu_forward(A&&... a) const {
    note_nonfinite(act::swiglu_forward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void swiglu_forward_plain(A&&... a) const {
    act::swiglu_forward(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void swiglu_backward(A&&... a) const {
    note_nonfinite(act::swiglu_backward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void gelu_forward(A&&... a) const {
    note_nonfinite(act::gelu_forward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void gelu_forward_plain(A&&... a) const {
    act::gelu_forward(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void gelu_backward(A&&... a) const {
    note_nonfinite(act::gelu_backward(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void residual_add(A&&... a) const {
    note_nonfinite(act::residual_add(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void rmsnorm_forward_measured(A&&... a) const {
    note_nonfinite(act::rmsnorm_forward_measured(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void swiglu_forward_measured(A&&... a) const {
    note_nonfinite(act::swiglu_forward_measured(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void gelu_forward_measured(A&&... a) const {
    note_nonfinite(act::gelu_forward_measured(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  void residual_add_measured(A&&... a) const {
    note_nonfinite(act::residual_add_measured(executor(), std::forward<A>(a)...));
  }
  template <class... A>
  act::tensor_stats measure(A&&... a) const {
    return act::measure(executor(), std::forward<A>(a)...);
  }
  template <class In>
  act::tensor_stats quantize_measured(agoq::matrix_view<In> x, agoq::quantized_view out,
                                      agoq::quantize_options opt) const {
    act::tensor_stats st;
    note_nonfinite(act::quantize_measured(executor(), x, out, st, opt));
    return st;
  }
};

std::int64_t quantized_bytes(std::string const& spec, std::int64_t rows, std::int64_t cols) {
  TORCH_CHECK(rows >= 0 && cols >= 0, "quantized_bytes: negative extents [", rows, ", ", cols, "]");
  return agoq::make_layout(parse_spec(spec), rows, cols).total_bytes;
}

}  // namespace

void register_tensors(py::module_& m) {
  ops::register_tensor_ops<cpu_backend>(m);
  ops::register_forward_ops<cpu_backend>(m);
  ops::register_backward_ops<cpu_backend>(m);
  m.def("quantized_bytes", &quantized_bytes, py::arg("spec"), py::arg("rows"), py::arg("cols"),
        "Bytes of the quantized buffer (codes, scales, zero points) of a [rows, cols] tensor.");
  m.def(
      "nonfinite_seen", [] { return nonfinite_seen().load(); },
      "NaN/Inf values the quantizing calls of this process have met since the last reset.");
  m.def(
      "reset_nonfinite", [] { nonfinite_seen().store(0); }, "Sets nonfinite_seen() to 0.");
  m.def(
      "simd", [] { return agoq::host_simd_available; },
      "True when the extension was compiled with agoq's AVX-512 loops.");
  m.def(
      "simd_isa", [] { return std::string(agoq::host_simd_isa); },
      "The vector loops the extension's CPU executor was compiled with: AVX-512, AVX2 or "
      "portable.");
}

}  // namespace agoq_torch
