/// \file
/// The extension's tensor calls (compress, decompress, fake_quantize, the fused producer/consumer
/// ops of agoq/activation/fused.hpp and fused.cuh, and the error model's measure), written once
/// for both
/// executors. `B` is the backend of one call, made from its first tensor:
///   - cpu_backend (tensors.cpp): CPU tensors, the CPU executor on torch's intra-op pool;
///   - cuda_backend (device.cu): tensors on the first tensor's GPU, the CUDA executor on torch's
///     current stream of that GPU (or, built for the emulated device tier, tensors in the CUDA
///     emulator's memory).
/// A backend is a place (holds, expected: common.hpp) that also allocates outputs where its
/// tensors are (empty, zeros) and makes each agoq call: one member per call below, taking the
/// agoq call's arguments after the executor, that adds the call's non-finite count to the
/// process's (the `_plain` members: the ops' overloads without a saved copy, which count nothing).
#pragma once

#include "common.hpp"

#include <tuple>

namespace agoq_torch::ops {

namespace act = agoq::activation;

inline agoq::quantize_options options(std::uint64_t seed, std::uint64_t offset) {
  return {seed, offset};
}

/// A new zeroed uint8 buffer for the quantized copy of [rows, cols] with spec `s` (the alignment
/// padding stays zero, so equal tensors give equal buffers byte for byte).
template <class B>
torch::Tensor new_buffer(B const& b, agoq::spec const& s, std::int64_t rows, std::int64_t cols) {
  return b.zeros({agoq::make_layout(s, rows, cols).total_bytes}, torch::kByte);
}

/// A new tensor of x's shape and dtype where the backend's tensors are.
template <class B>
torch::Tensor new_like(B const& b, torch::Tensor const& x) {
  return b.empty(x.sizes(), x.scalar_type());
}

/// What compress and compress_measured share: checks x (`what` names the call), makes the new
/// buffer of `spec` and calls quantize(x's matrix view, the buffer's quantized view) for x's
/// element type; returns the buffer.
template <class B, class Quantize>
torch::Tensor compress_with(B const& b, torch::Tensor const& x, std::string const& spec,
                            char const* what, Quantize&& quantize) {
  check_matrix(x, what, b);
  agoq::spec const s = parse_spec(spec);
  std::int64_t const rows = x.size(0), cols = x.size(1);
  torch::Tensor buf = new_buffer(b, s, rows, cols);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    quantize(matrix_of<T const>(x), view_of(s, rows, cols, buf));
  });
  return buf;
}

template <class B>
torch::Tensor compress(torch::Tensor const& x, std::string const& spec, std::uint64_t seed,
                       std::uint64_t offset) {
  B const b(x);
  return compress_with(b, x, spec, "compress",
                       [&](auto in, auto out) { b.quantize(in, out, options(seed, offset)); });
}

template <class B>
torch::Tensor decompress(torch::Tensor const& buf, std::string const& spec, std::int64_t rows,
                         std::int64_t cols, pybind11::object dtype) {
  B const b(buf);
  agoq::spec const s = parse_spec(spec);
  TORCH_CHECK(rows >= 0 && cols >= 0, "decompress: negative extents [", rows, ", ", cols, "]");
  check_buffer(buf, s, rows, cols, "decompress", b);
  auto const st = dtype_or_float(dtype);
  check_floating_type(st, "decompress (dtype)");
  torch::Tensor out = b.empty({rows, cols}, st);
  dispatch_element(
      st, [&]<class T>(T) { b.dequantize(const_view_of(s, rows, cols, buf), matrix_of<T>(out)); });
  return out;
}

template <class B>
torch::Tensor fake_quantize(torch::Tensor const& x, std::string const& spec, std::uint64_t seed,
                            std::uint64_t offset) {
  B const b(x);
  check_matrix(x, "fake_quantize", b);
  agoq::spec const s = parse_spec(spec);
  torch::Tensor out = new_like(b, x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    b.fake_quantize(s, matrix_of<T const>(x), matrix_of<T>(out), options(seed, offset));
  });
  return out;
}

/// Checks an op's weight vector: where x is, same dtype as x, `cols` elements.
template <class B>
void check_weight(B const& b, torch::Tensor const& w, torch::Tensor const& x, char const* what) {
  check_vector(w, x.size(1), what, b);
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), what, ": the weight's dtype ", w.scalar_type(),
              " differs from the input's ", x.scalar_type());
}

/// What rmsnorm_forward and rmsnorm_forward_measured share: the checks, the new outputs, and
/// call(x, w, eps, y, saved_x, rstd) (the agoq call's arguments, as views) for x's element type.
template <class B, class Call>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> rmsnorm_saving(
    B const& b, torch::Tensor const& x, torch::Tensor const& w, double eps, std::string const& spec,
    Call&& call) {
  check_matrix(x, "rmsnorm_forward", b);
  check_weight(b, w, x, "rmsnorm_forward (weight)");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor y = new_like(b, x);
  torch::Tensor saved = new_buffer(b, s, x.size(0), x.size(1));
  torch::Tensor rstd = b.empty({x.size(0)}, torch::kFloat);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    call(matrix_of<T const>(x), span_of<T const>(w), static_cast<float>(eps), matrix_of<T>(y),
         view_of(s, x.size(0), x.size(1), saved), span_of<float>(rstd));
  });
  return {y, saved, rstd};
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> rmsnorm_forward(
    torch::Tensor const& x, torch::Tensor const& w, double eps, std::string const& spec,
    std::uint64_t seed, std::uint64_t offset) {
  B const b(x);
  return rmsnorm_saving(b, x, w, eps, spec,
                        [&](auto... a) { b.rmsnorm_forward(a..., options(seed, offset)); });
}

/// rmsnorm_forward that also returns measure's statistics of x under the groups of `spec`
/// (agoq::activation::rmsnorm_forward_measured: gathered beside the op on the CPU, x read once);
/// like measure it synchronizes a GPU's stream.
template <class B>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, pybind11::dict> rmsnorm_forward_measured(
    torch::Tensor const& x, torch::Tensor const& w, double eps, std::string const& spec,
    std::uint64_t seed, std::uint64_t offset) {
  B const b(x);
  act::tensor_stats st;
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> out;
  {
    pybind11::gil_scoped_release release;
    out = rmsnorm_saving(b, x, w, eps, spec, [&](auto... a) {
      b.rmsnorm_forward_measured(a..., st, options(seed, offset));
    });
  }
  return std::tuple_cat(std::move(out), std::make_tuple(stats_dict(st)));
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor> rmsnorm_forward_plain(torch::Tensor const& x,
                                                               torch::Tensor const& w, double eps) {
  B const b(x);
  check_matrix(x, "rmsnorm_forward_plain", b);
  check_weight(b, w, x, "rmsnorm_forward_plain (weight)");
  torch::Tensor y = new_like(b, x);
  torch::Tensor rstd = b.empty({x.size(0)}, torch::kFloat);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    b.rmsnorm_forward_plain(matrix_of<T const>(x), span_of<T const>(w), static_cast<float>(eps),
                            matrix_of<T>(y), span_of<float>(rstd));
  });
  return {y, rstd};
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor> rmsnorm_backward(torch::Tensor const& dy,
                                                          torch::Tensor const& saved,
                                                          std::string const& spec,
                                                          torch::Tensor const& rstd,
                                                          torch::Tensor const& w) {
  B const b(dy);
  check_matrix(dy, "rmsnorm_backward", b);
  check_weight(b, w, dy, "rmsnorm_backward (weight)");
  agoq::spec const s = parse_spec(spec);
  check_buffer(saved, s, dy.size(0), dy.size(1), "rmsnorm_backward (saved_x)", b);
  TORCH_CHECK(b.holds(rstd) && rstd.is_contiguous() && rstd.dim() == 1 &&
                  rstd.scalar_type() == torch::kFloat && rstd.numel() == dy.size(0),
              "rmsnorm_backward: rstd must be the float32 [tokens] tensor of the forward, ",
              b.expected());
  torch::Tensor dx = new_like(b, dy);
  torch::Tensor dw = b.zeros({dy.size(1)}, torch::kFloat);
  dispatch_element(dy.scalar_type(), [&]<class T>(T) {
    b.rmsnorm_backward(matrix_of<T const>(dy), const_view_of(s, dy.size(0), dy.size(1), saved),
                       span_of<float const>(rstd), span_of<T const>(w), matrix_of<T>(dx),
                       span_of<float>(dw));
  });
  return {dx, dw};
}

/// What swiglu_forward and swiglu_forward_measured share: the checks, the new outputs, and
/// call(gate, up, out, saved_gate, saved_up) (as views) for gate's element type.
template <class B, class Call>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> swiglu_saving(
    B const& b, torch::Tensor const& gate, torch::Tensor const& up, std::string const& spec_gate,
    std::string const& spec_up, Call&& call) {
  check_matrix(gate, "swiglu_forward (gate)", b);
  check_matrix(up, "swiglu_forward (up)", b);
  check_same(gate, up, "swiglu_forward");
  agoq::spec const sg = parse_spec(spec_gate);
  agoq::spec const su = parse_spec(spec_up);
  std::int64_t const rows = gate.size(0), cols = gate.size(1);
  torch::Tensor out = new_like(b, gate);
  torch::Tensor saved_gate = new_buffer(b, sg, rows, cols);
  torch::Tensor saved_up = new_buffer(b, su, rows, cols);
  dispatch_element(gate.scalar_type(), [&]<class T>(T) {
    call(matrix_of<T const>(gate), matrix_of<T const>(up), matrix_of<T>(out),
         view_of(sg, rows, cols, saved_gate), view_of(su, rows, cols, saved_up));
  });
  return {out, saved_gate, saved_up};
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> swiglu_forward(
    torch::Tensor const& gate, torch::Tensor const& up, std::string const& spec_gate,
    std::string const& spec_up, std::uint64_t seed, std::uint64_t offset) {
  B const b(gate);
  return swiglu_saving(b, gate, up, spec_gate, spec_up,
                       [&](auto... a) { b.swiglu_forward(a..., options(seed, offset)); });
}

/// swiglu_forward that also returns measure's statistics of gate and of up under the groups of
/// their specs (agoq::activation::swiglu_forward_measured); like measure it synchronizes a GPU's
/// stream.
template <class B>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, pybind11::dict, pybind11::dict>
swiglu_forward_measured(torch::Tensor const& gate, torch::Tensor const& up,
                        std::string const& spec_gate, std::string const& spec_up,
                        std::uint64_t seed, std::uint64_t offset) {
  B const b(gate);
  act::tensor_stats sg, su;
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> out;
  {
    pybind11::gil_scoped_release release;
    out = swiglu_saving(b, gate, up, spec_gate, spec_up, [&](auto... a) {
      b.swiglu_forward_measured(a..., sg, su, options(seed, offset));
    });
  }
  return std::tuple_cat(std::move(out), std::make_tuple(stats_dict(sg), stats_dict(su)));
}

template <class B>
torch::Tensor swiglu_forward_plain(torch::Tensor const& gate, torch::Tensor const& up) {
  B const b(gate);
  check_matrix(gate, "swiglu_forward_plain (gate)", b);
  check_matrix(up, "swiglu_forward_plain (up)", b);
  check_same(gate, up, "swiglu_forward_plain");
  torch::Tensor out = new_like(b, gate);
  dispatch_element(gate.scalar_type(), [&]<class T>(T) {
    b.swiglu_forward_plain(matrix_of<T const>(gate), matrix_of<T const>(up), matrix_of<T>(out));
  });
  return out;
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor> swiglu_backward(torch::Tensor const& dout,
                                                         torch::Tensor const& saved_gate,
                                                         std::string const& spec_gate,
                                                         torch::Tensor const& saved_up,
                                                         std::string const& spec_up) {
  B const b(dout);
  check_matrix(dout, "swiglu_backward", b);
  agoq::spec const sg = parse_spec(spec_gate);
  agoq::spec const su = parse_spec(spec_up);
  std::int64_t const rows = dout.size(0), cols = dout.size(1);
  check_buffer(saved_gate, sg, rows, cols, "swiglu_backward (saved_gate)", b);
  check_buffer(saved_up, su, rows, cols, "swiglu_backward (saved_up)", b);
  torch::Tensor dgate = new_like(b, dout);
  torch::Tensor dup = new_like(b, dout);
  dispatch_element(dout.scalar_type(), [&]<class T>(T) {
    b.swiglu_backward(matrix_of<T const>(dout), const_view_of(sg, rows, cols, saved_gate),
                      const_view_of(su, rows, cols, saved_up), matrix_of<T>(dgate),
                      matrix_of<T>(dup));
  });
  return {dgate, dup};
}

/// What gelu_forward and gelu_forward_measured share: the checks, the new outputs, and call(x, y,
/// saved_x) (as views) for x's element type.
template <class B, class Call>
std::tuple<torch::Tensor, torch::Tensor> gelu_saving(B const& b, torch::Tensor const& x,
                                                     std::string const& spec, Call&& call) {
  check_matrix(x, "gelu_forward", b);
  agoq::spec const s = parse_spec(spec);
  torch::Tensor y = new_like(b, x);
  torch::Tensor saved = new_buffer(b, s, x.size(0), x.size(1));
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    call(matrix_of<T const>(x), matrix_of<T>(y), view_of(s, x.size(0), x.size(1), saved));
  });
  return {y, saved};
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor> gelu_forward(torch::Tensor const& x,
                                                      std::string const& spec, std::uint64_t seed,
                                                      std::uint64_t offset) {
  B const b(x);
  return gelu_saving(b, x, spec, [&](auto... a) { b.gelu_forward(a..., options(seed, offset)); });
}

/// gelu_forward that also returns measure's statistics of x under the groups of `spec`
/// (agoq::activation::gelu_forward_measured); like measure it synchronizes a GPU's stream.
template <class B>
std::tuple<torch::Tensor, torch::Tensor, pybind11::dict> gelu_forward_measured(
    torch::Tensor const& x, std::string const& spec, std::uint64_t seed, std::uint64_t offset) {
  B const b(x);
  act::tensor_stats st;
  std::tuple<torch::Tensor, torch::Tensor> out;
  {
    pybind11::gil_scoped_release release;
    out = gelu_saving(b, x, spec,
                      [&](auto... a) { b.gelu_forward_measured(a..., st, options(seed, offset)); });
  }
  return std::tuple_cat(std::move(out), std::make_tuple(stats_dict(st)));
}

template <class B>
torch::Tensor gelu_forward_plain(torch::Tensor const& x) {
  B const b(x);
  check_matrix(x, "gelu_forward_plain", b);
  torch::Tensor y = new_like(b, x);
  dispatch_element(x.scalar_type(), [&]<class T>(T) {
    b.gelu_forward_plain(matrix_of<T const>(x), matrix_of<T>(y));
  });
  return y;
}

template <class B>
torch::Tensor gelu_backward(torch::Tensor const& dy, torch::Tensor const& saved,
                            std::string const& spec) {
  B const b(dy);
  check_matrix(dy, "gelu_backward", b);
  agoq::spec const s = parse_spec(spec);
  check_buffer(saved, s, dy.size(0), dy.size(1), "gelu_backward (saved_x)", b);
  torch::Tensor dx = new_like(b, dy);
  dispatch_element(dy.scalar_type(), [&]<class T>(T) {
    b.gelu_backward(matrix_of<T const>(dy), const_view_of(s, dy.size(0), dy.size(1), saved),
                    matrix_of<T>(dx));
  });
  return dx;
}

/// What residual_add and residual_add_measured share: the checks, the new outputs, and call(a,
/// x, sum, saved_sum) (as views) for a's element type.
template <class B, class Call>
std::tuple<torch::Tensor, torch::Tensor> residual_saving(B const& b, torch::Tensor const& a,
                                                         torch::Tensor const& x,
                                                         std::string const& spec, Call&& call) {
  check_matrix(a, "residual_add (a)", b);
  check_matrix(x, "residual_add (b)", b);
  check_same(a, x, "residual_add");
  agoq::spec const s = parse_spec(spec);
  torch::Tensor sum = new_like(b, a);
  torch::Tensor saved = new_buffer(b, s, a.size(0), a.size(1));
  dispatch_element(a.scalar_type(), [&]<class T>(T) {
    call(matrix_of<T const>(a), matrix_of<T const>(x), matrix_of<T>(sum),
         view_of(s, a.size(0), a.size(1), saved));
  });
  return {sum, saved};
}

template <class B>
std::tuple<torch::Tensor, torch::Tensor> residual_add(torch::Tensor const& a,
                                                      torch::Tensor const& x,
                                                      std::string const& spec, std::uint64_t seed,
                                                      std::uint64_t offset) {
  B const b(a);
  return residual_saving(b, a, x, spec,
                         [&](auto... v) { b.residual_add(v..., options(seed, offset)); });
}

/// residual_add that also returns measure's statistics of the sum under the groups of `spec`
/// (agoq::activation::residual_add_measured); like measure it synchronizes a GPU's stream.
template <class B>
std::tuple<torch::Tensor, torch::Tensor, pybind11::dict> residual_add_measured(
    torch::Tensor const& a, torch::Tensor const& x, std::string const& spec, std::uint64_t seed,
    std::uint64_t offset) {
  B const b(a);
  act::tensor_stats st;
  std::tuple<torch::Tensor, torch::Tensor> out;
  {
    pybind11::gil_scoped_release release;
    out = residual_saving(b, a, x, spec, [&](auto... v) {
      b.residual_add_measured(v..., st, options(seed, offset));
    });
  }
  return std::tuple_cat(std::move(out), std::make_tuple(stats_dict(st)));
}

/// The error model's statistics of x under the groups of `spec` (agoq::activation::measure);
/// unlike the other calls it returns host values, so on a GPU it synchronizes the stream.
template <class B>
pybind11::dict measure(torch::Tensor const& x, std::string const& spec) {
  B const b(x);
  check_matrix(x, "measure", b);
  agoq::spec const s = parse_spec(spec);
  act::tensor_stats st;
  {
    pybind11::gil_scoped_release release;
    dispatch_element(x.scalar_type(),
                     [&]<class T>(T) { st = b.measure(matrix_of<T const>(x), s); });
  }
  return stats_dict(st);
}

/// compress that also returns the error model's statistics of x under the groups of `spec`
/// (agoq::activation::quantize_measured: the buffer compress returns and the dict measure
/// returns, gathered in one sweep on the CPU); like measure it synchronizes a GPU's stream.
template <class B>
std::tuple<torch::Tensor, pybind11::dict> compress_measured(torch::Tensor const& x,
                                                            std::string const& spec,
                                                            std::uint64_t seed,
                                                            std::uint64_t offset) {
  B const b(x);
  act::tensor_stats st;
  torch::Tensor buf;
  {
    pybind11::gil_scoped_release release;
    buf = compress_with(b, x, spec, "compress_measured", [&](auto in, auto out) {
      st = b.quantize_measured(in, out, options(seed, offset));
    });
  }
  return {buf, stats_dict(st)};
}

/// Register the calls above on backend B in module m, in three sets that a module may compile in
/// separate translation units (device.cu does, so that its kernels build in parallel):
/// register_tensor_ops (compress, decompress, fake_quantize, measure, compress_measured),
/// register_forward_ops (the
/// fused ops' forward calls, with and without a saved copy) and register_backward_ops. The same
/// names, arguments and documents for both executors; agoq_torch/__init__.py sends each call to
/// the module of its first tensor's device.
template <class B>
void register_tensor_ops(pybind11::module_& m) {
  namespace py = pybind11;
  auto const nogil = py::call_guard<py::gil_scoped_release>();
  m.def("compress", &compress<B>, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil,
        "Quantizes a 2-D float32/bfloat16/float16 tensor into a new uint8 buffer (codes and "
        "scales in agoq's layout) on the same device. Stochastic rounding uses Philox stream "
        "positions offset + r * cols + c under `seed`.");
  m.def("decompress", &decompress<B>, py::arg("buffer"), py::arg("spec"), py::arg("rows"),
        py::arg("cols"), py::arg("dtype") = py::none(),
        "Dequantizes a buffer from compress into a new [rows, cols] tensor of `dtype` "
        "(default float32) on the buffer's device.");
  m.def("fake_quantize", &fake_quantize<B>, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil,
        "Quantizes and dequantizes a 2-D tensor (same shape and dtype), as compress then "
        "decompress.");
  m.def("compress_measured", &compress_measured<B>, py::arg("x"), py::arg("spec"),
        py::arg("seed") = 0, py::arg("offset") = 0,
        "compress that also returns measure's statistics of x under the groups of `spec`: "
        "(buffer, statistics), the same buffer and dict as the two calls, gathered in one "
        "sweep over x on the CPU. Like measure it synchronizes a GPU's stream.");
  m.def("measure", &measure<B>, py::arg("x"), py::arg("spec"),
        "Statistics of a 2-D tensor for the error model under the groups of `spec`: {'tile', "
        "'elements', 'sum_squares', 'sum_group_absmax_sq', 'sum_group_range_sq'} (finite "
        "elements only), plus the groups' dead zones; pass them to make_plan(statistics=...). "
        "The same values on the CPU and on a GPU (which it synchronizes).");
}

template <class B>
void register_forward_ops(pybind11::module_& m) {
  namespace py = pybind11;
  auto const nogil = py::call_guard<py::gil_scoped_release>();
  m.def("rmsnorm_forward", &rmsnorm_forward<B>, py::arg("x"), py::arg("weight"), py::arg("eps"),
        py::arg("spec"), py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused RMSNorm forward: (y, saved_x buffer, rstd float32 [tokens]).");
  m.def("rmsnorm_forward_plain", &rmsnorm_forward_plain<B>, py::arg("x"), py::arg("weight"),
        py::arg("eps"), nogil, "RMSNorm forward without saving: (y, rstd); the same bits of y.");
  m.def("swiglu_forward", &swiglu_forward<B>, py::arg("gate"), py::arg("up"), py::arg("spec_gate"),
        py::arg("spec_up"), py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused SwiGLU forward silu(gate) * up: (out, saved_gate, saved_up); up draws stream "
        "positions after gate's.");
  m.def("swiglu_forward_plain", &swiglu_forward_plain<B>, py::arg("gate"), py::arg("up"), nogil,
        "SwiGLU forward without saving; the same bits of out.");
  m.def("gelu_forward", &gelu_forward<B>, py::arg("x"), py::arg("spec"), py::arg("seed") = 0,
        py::arg("offset") = 0, nogil, "Fused GeLU (tanh approximation) forward: (y, saved_x).");
  m.def("gelu_forward_plain", &gelu_forward_plain<B>, py::arg("x"), nogil,
        "GeLU forward without saving; the same bits of y.");
  m.def("residual_add", &residual_add<B>, py::arg("a"), py::arg("b"), py::arg("spec"),
        py::arg("seed") = 0, py::arg("offset") = 0, nogil,
        "Fused residual add: (a + b, saved copy of the sum).");
  // The measured forms return dicts, so they hold the GIL and release it around the op.
  m.def("rmsnorm_forward_measured", &rmsnorm_forward_measured<B>, py::arg("x"), py::arg("weight"),
        py::arg("eps"), py::arg("spec"), py::arg("seed") = 0, py::arg("offset") = 0,
        "rmsnorm_forward that also returns measure(x, spec): (y, saved_x, rstd, statistics), "
        "gathered beside the op on the CPU (x read once). Synchronizes a GPU's stream.");
  m.def("swiglu_forward_measured", &swiglu_forward_measured<B>, py::arg("gate"), py::arg("up"),
        py::arg("spec_gate"), py::arg("spec_up"), py::arg("seed") = 0, py::arg("offset") = 0,
        "swiglu_forward that also returns measure(gate, spec_gate) and measure(up, spec_up): "
        "(out, saved_gate, saved_up, statistics of gate, statistics of up). Synchronizes a "
        "GPU's stream.");
  m.def("gelu_forward_measured", &gelu_forward_measured<B>, py::arg("x"), py::arg("spec"),
        py::arg("seed") = 0, py::arg("offset") = 0,
        "gelu_forward that also returns measure(x, spec): (y, saved_x, statistics). "
        "Synchronizes a GPU's stream.");
  m.def("residual_add_measured", &residual_add_measured<B>, py::arg("a"), py::arg("b"),
        py::arg("spec"), py::arg("seed") = 0, py::arg("offset") = 0,
        "residual_add that also returns measure(a + b, spec): (sum, saved copy, statistics). "
        "Synchronizes a GPU's stream.");
}

template <class B>
void register_backward_ops(pybind11::module_& m) {
  namespace py = pybind11;
  auto const nogil = py::call_guard<py::gil_scoped_release>();
  m.def("rmsnorm_backward", &rmsnorm_backward<B>, py::arg("dy"), py::arg("saved_x"),
        py::arg("spec"), py::arg("rstd"), py::arg("weight"), nogil,
        "RMSNorm backward from the quantized input: (dx, dweight float32).");
  m.def("swiglu_backward", &swiglu_backward<B>, py::arg("dout"), py::arg("saved_gate"),
        py::arg("spec_gate"), py::arg("saved_up"), py::arg("spec_up"), nogil,
        "SwiGLU backward from the quantized inputs: (dgate, dup).");
  m.def("gelu_backward", &gelu_backward<B>, py::arg("dy"), py::arg("saved_x"), py::arg("spec"),
        nogil, "GeLU backward from the quantized input: dx.");
}

}  // namespace agoq_torch::ops
