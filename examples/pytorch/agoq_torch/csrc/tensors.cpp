/// \file
/// compress / decompress / fake_quantize of saved tensors and the fused producer/consumer ops
/// (agoq/activation/fused.hpp) on CPU tensors.
#include "common.hpp"

#include <span>
#include <tuple>

namespace agoq_torch {
namespace {

namespace act = agoq::activation;
namespace py = pybind11;

agoq::quantize_options options(std::uint64_t seed, std::uint64_t offset) { return {seed, offset}; }

std::int64_t quantized_bytes(std::string const& spec, std::int64_t rows, std::int64_t cols) {
  TORCH_CHECK(rows >= 0 && cols >= 0, "quantized_bytes: negative extents [", rows, ", ", cols, "]");
  return agoq::make_layout(parse_spec(spec), rows, cols).total_bytes;
}

torch::Tensor compress(torch::Tensor const& x, std::string const& spec, std::uint64_t seed,
                       std::uint64_t offset) {
  check_matrix(x, "compress");
  agoq::spec const s = parse_spec(spec);
  std::int64_t const rows = x.size(0), cols = x.size(1);
  torch::Tensor buf = new_buffer(s, rows, cols);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    note_nonfinite(agoq::quantize(executor(), matrix_of<T const>(x), view_of(s, rows, cols, buf),
                                  options(seed, offset)));
  });
  return buf;
}

torch::Tensor decompress(torch::Tensor const& buf, std::string const& spec, std::int64_t rows,
                         std::int64_t cols, py::object dtype) {
  agoq::spec const s = parse_spec(spec);
  TORCH_CHECK(rows >= 0 && cols >= 0, "decompress: negative extents [", rows, ", ", cols, "]");
  check_buffer(buf, s, rows, cols, "decompress");
  auto const st = dtype_or_float(dtype);
  torch::Tensor out = torch::empty({rows, cols}, torch::TensorOptions().dtype(st));
  check_matrix(out, "decompress (dtype)");
  dispatch_element(st, [&]<class T>(T) {
    agoq::dequantize(executor(), const_view_of(s, rows, cols, buf), matrix_of<T>(out));
  });
  return out;
}

torch::Tensor fake_quantize(torch::Tensor const& x, std::string const& spec, std::uint64_t seed,
                            std::uint64_t offset) {
  check_matrix(x, "fake_quantize");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor out = torch::empty_like(x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    note_nonfinite(agoq::fake_quantize(executor(), s, matrix_of<T const>(x), matrix_of<T>(out),
                                       options(seed, offset)));
  });
  return out;
}

/// Checks an op's weight vector: same dtype as x, `cols` elements.
void check_weight(torch::Tensor const& w, torch::Tensor const& x, char const* what) {
  check_vector(w, x.size(1), what);
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), what, ": the weight's dtype ", w.scalar_type(),
              " differs from the input's ", x.scalar_type());
}

torch::Tensor new_rstd(torch::Tensor const& x) {
  return torch::empty({x.size(0)}, torch::TensorOptions().dtype(torch::kFloat));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> rmsnorm_forward(
    torch::Tensor const& x, torch::Tensor const& w, double eps, std::string const& spec,
    std::uint64_t seed, std::uint64_t offset) {
  check_matrix(x, "rmsnorm_forward");
  check_weight(w, x, "rmsnorm_forward (weight)");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor y = torch::empty_like(x);
  torch::Tensor saved = new_buffer(s, x.size(0), x.size(1));
  torch::Tensor rstd = new_rstd(x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::rmsnorm_forward(
        executor(), matrix_of<T const>(x), std::span<T const>(data_as<T const>(w), x.size(1)),
        static_cast<float>(eps), matrix_of<T>(y), view_of(s, x.size(0), x.size(1), saved),
        std::span<float>(rstd.data_ptr<float>(), x.size(0)), options(seed, offset)));
  });
  return {y, saved, rstd};
}

std::tuple<torch::Tensor, torch::Tensor> rmsnorm_forward_plain(torch::Tensor const& x,
                                                               torch::Tensor const& w, double eps) {
  check_matrix(x, "rmsnorm_forward_plain");
  check_weight(w, x, "rmsnorm_forward_plain (weight)");
  torch::Tensor y = torch::empty_like(x);
  torch::Tensor rstd = new_rstd(x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    act::rmsnorm_forward(executor(), matrix_of<T const>(x),
                         std::span<T const>(data_as<T const>(w), x.size(1)),
                         static_cast<float>(eps), matrix_of<T>(y),
                         std::span<float>(rstd.data_ptr<float>(), x.size(0)));
  });
  return {y, rstd};
}

std::tuple<torch::Tensor, torch::Tensor> rmsnorm_backward(torch::Tensor const& dy,
                                                          torch::Tensor const& saved,
                                                          std::string const& spec,
                                                          torch::Tensor const& rstd,
                                                          torch::Tensor const& w) {
  check_matrix(dy, "rmsnorm_backward");
  check_weight(w, dy, "rmsnorm_backward (weight)");
  agoq::spec const s = parse_spec(spec);
  check_buffer(saved, s, dy.size(0), dy.size(1), "rmsnorm_backward (saved_x)");
  TORCH_CHECK(rstd.device().is_cpu() && rstd.is_contiguous() && rstd.dim() == 1 &&
                  rstd.scalar_type() == torch::kFloat && rstd.numel() == dy.size(0),
              "rmsnorm_backward: rstd must be the float32 [tokens] tensor of the forward");
  torch::Tensor dx = torch::empty_like(dy);
  torch::Tensor dw = torch::zeros({dy.size(1)}, torch::TensorOptions().dtype(torch::kFloat));
  dispatch_element(dy.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::rmsnorm_backward(
        executor(), matrix_of<T const>(dy), const_view_of(s, dy.size(0), dy.size(1), saved),
        std::span<float const>(rstd.data_ptr<float>(), dy.size(0)),
        std::span<T const>(data_as<T const>(w), dy.size(1)), matrix_of<T>(dx),
        std::span<float>(dw.data_ptr<float>(), dy.size(1))));
  });
  return {dx, dw};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> swiglu_forward(
    torch::Tensor const& gate, torch::Tensor const& up, std::string const& spec_gate,
    std::string const& spec_up, std::uint64_t seed, std::uint64_t offset) {
  check_matrix(gate, "swiglu_forward (gate)");
  check_matrix(up, "swiglu_forward (up)");
  check_same(gate, up, "swiglu_forward");
  agoq::spec const sg = parse_spec(spec_gate);
  agoq::spec const su = parse_spec(spec_up);
  std::int64_t const rows = gate.size(0), cols = gate.size(1);
  torch::Tensor out = torch::empty_like(gate);
  torch::Tensor saved_gate = new_buffer(sg, rows, cols);
  torch::Tensor saved_up = new_buffer(su, rows, cols);
  dispatch_element(gate.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::swiglu_forward(executor(), matrix_of<T const>(gate), matrix_of<T const>(up),
                                       matrix_of<T>(out), view_of(sg, rows, cols, saved_gate),
                                       view_of(su, rows, cols, saved_up), options(seed, offset)));
  });
  return {out, saved_gate, saved_up};
}

torch::Tensor swiglu_forward_plain(torch::Tensor const& gate, torch::Tensor const& up) {
  check_matrix(gate, "swiglu_forward_plain (gate)");
  check_matrix(up, "swiglu_forward_plain (up)");
  check_same(gate, up, "swiglu_forward_plain");
  torch::Tensor out = torch::empty_like(gate);
  dispatch_element(gate.scalar_type(), [&]<class T>(T) {
    act::swiglu_forward(executor(), matrix_of<T const>(gate), matrix_of<T const>(up),
                        matrix_of<T>(out));
  });
  return out;
}

std::tuple<torch::Tensor, torch::Tensor> swiglu_backward(torch::Tensor const& dout,
                                                         torch::Tensor const& saved_gate,
                                                         std::string const& spec_gate,
                                                         torch::Tensor const& saved_up,
                                                         std::string const& spec_up) {
  check_matrix(dout, "swiglu_backward");
  agoq::spec const sg = parse_spec(spec_gate);
  agoq::spec const su = parse_spec(spec_up);
  std::int64_t const rows = dout.size(0), cols = dout.size(1);
  check_buffer(saved_gate, sg, rows, cols, "swiglu_backward (saved_gate)");
  check_buffer(saved_up, su, rows, cols, "swiglu_backward (saved_up)");
  torch::Tensor dgate = torch::empty_like(dout);
  torch::Tensor dup = torch::empty_like(dout);
  dispatch_element(dout.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::swiglu_backward(
        executor(), matrix_of<T const>(dout), const_view_of(sg, rows, cols, saved_gate),
        const_view_of(su, rows, cols, saved_up), matrix_of<T>(dgate), matrix_of<T>(dup)));
  });
  return {dgate, dup};
}

std::tuple<torch::Tensor, torch::Tensor> gelu_forward(torch::Tensor const& x,
                                                      std::string const& spec, std::uint64_t seed,
                                                      std::uint64_t offset) {
  check_matrix(x, "gelu_forward");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor y = torch::empty_like(x);
  torch::Tensor saved = new_buffer(s, x.size(0), x.size(1));
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::gelu_forward(executor(), matrix_of<T const>(x), matrix_of<T>(y),
                                     view_of(s, x.size(0), x.size(1), saved),
                                     options(seed, offset)));
  });
  return {y, saved};
}

torch::Tensor gelu_forward_plain(torch::Tensor const& x) {
  check_matrix(x, "gelu_forward_plain");
  torch::Tensor y = torch::empty_like(x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    act::gelu_forward(executor(), matrix_of<T const>(x), matrix_of<T>(y));
  });
  return y;
}

torch::Tensor gelu_backward(torch::Tensor const& dy, torch::Tensor const& saved,
                            std::string const& spec) {
  check_matrix(dy, "gelu_backward");
  agoq::spec const s = parse_spec(spec);
  check_buffer(saved, s, dy.size(0), dy.size(1), "gelu_backward (saved_x)");
  torch::Tensor dx = torch::empty_like(dy);
  dispatch_element(dy.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::gelu_backward(executor(), matrix_of<T const>(dy),
                                      const_view_of(s, dy.size(0), dy.size(1), saved),
                                      matrix_of<T>(dx)));
  });
  return dx;
}

std::tuple<torch::Tensor, torch::Tensor> residual_add(torch::Tensor const& a,
                                                      torch::Tensor const& b,
                                                      std::string const& spec, std::uint64_t seed,
                                                      std::uint64_t offset) {
  check_matrix(a, "residual_add (a)");
  check_matrix(b, "residual_add (b)");
  check_same(a, b, "residual_add");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor sum = torch::empty_like(a);
  torch::Tensor saved = new_buffer(s, a.size(0), a.size(1));
  dispatch_element(a.scalar_type(), [&]<class T>(T) {
    note_nonfinite(act::residual_add(executor(), matrix_of<T const>(a), matrix_of<T const>(b),
                                     matrix_of<T>(sum), view_of(s, a.size(0), a.size(1), saved),
                                     options(seed, offset)));
  });
  return {sum, saved};
}

}  // namespace

void register_tensors(py::module_& m) {
  auto const nogil = py::call_guard<py::gil_scoped_release>();
  m.def("quantized_bytes", &quantized_bytes, py::arg("spec"), py::arg("rows"), py::arg("cols"),
        "Bytes of the quantized buffer (codes, scales, zero points) of a [rows, cols] tensor.");
  m.def("compress", &compress, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil,
        "Quantizes a 2-D float32/bfloat16/float16 tensor into a new uint8 buffer (codes and "
        "scales in agoq's layout). Stochastic rounding uses Philox stream positions offset + "
        "r * cols + c under `seed`.");
  m.def("decompress", &decompress, py::arg("buffer"), py::arg("spec"), py::arg("rows"),
        py::arg("cols"), py::arg("dtype") = py::none(),
        "Dequantizes a buffer from compress into a new [rows, cols] tensor of `dtype` "
        "(default float32).");
  m.def("fake_quantize", &fake_quantize, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil,
        "Quantizes and dequantizes a 2-D tensor (same shape and dtype), as compress then "
        "decompress.");
  m.def("rmsnorm_forward", &rmsnorm_forward, py::arg("x"), py::arg("weight"), py::arg("eps"),
        py::arg("spec"), py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused RMSNorm forward: (y, saved_x buffer, rstd float32 [tokens]).");
  m.def("rmsnorm_forward_plain", &rmsnorm_forward_plain, py::arg("x"), py::arg("weight"),
        py::arg("eps"), nogil, "RMSNorm forward without saving: (y, rstd); the same bits of y.");
  m.def("rmsnorm_backward", &rmsnorm_backward, py::arg("dy"), py::arg("saved_x"), py::arg("spec"),
        py::arg("rstd"), py::arg("weight"), nogil,
        "RMSNorm backward from the quantized input: (dx, dweight float32).");
  m.def("swiglu_forward", &swiglu_forward, py::arg("gate"), py::arg("up"), py::arg("spec_gate"),
        py::arg("spec_up"), py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused SwiGLU forward silu(gate) * up: (out, saved_gate, saved_up); up draws stream "
        "positions after gate's.");
  m.def("swiglu_forward_plain", &swiglu_forward_plain, py::arg("gate"), py::arg("up"), nogil,
        "SwiGLU forward without saving; the same bits of out.");
  m.def("swiglu_backward", &swiglu_backward, py::arg("dout"), py::arg("saved_gate"),
        py::arg("spec_gate"), py::arg("saved_up"), py::arg("spec_up"), nogil,
        "SwiGLU backward from the quantized inputs: (dgate, dup).");
  m.def("gelu_forward", &gelu_forward, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil, "Fused GeLU (tanh approximation) forward: (y, saved_x).");
  m.def("gelu_forward_plain", &gelu_forward_plain, py::arg("x"), nogil,
        "GeLU forward without saving; the same bits of y.");
  m.def("gelu_backward", &gelu_backward, py::arg("dy"), py::arg("saved_x"), py::arg("spec"), nogil,
        "GeLU backward from the quantized input: dx.");
  m.def("residual_add", &residual_add, py::arg("a"), py::arg("b"), py::arg("spec"),
        py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused residual add: (a + b, saved copy of the sum).");
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
