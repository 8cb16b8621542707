/// \file
/// The gradient path and the optimizer: agoq::gradient::gradient_buffer, the communicator over a
/// torch.distributed ProcessGroup with CPU tensors (process_group.hpp), the 8-bit all-reduce and
/// reduce-scatter over it, and the 8-bit AdamW state and step.
#include "process_group.hpp"

#include <span>
#include <string>
#include <utility>

namespace agoq_torch {
namespace {

namespace py = pybind11;
namespace grad = agoq::gradient;
namespace optim = agoq::optim;

grad::gradient_buffer make_buffer(std::int64_t n, int group_size, bool stochastic,
                                  std::uint64_t seed) {
  return grad::gradient_buffer(n, buffer_options(group_size, stochastic, seed));
}

std::int64_t accumulate(grad::gradient_buffer& b, torch::Tensor const& g) {
  check_vector(g, b.size(), "GradientBuffer.accumulate");
  return dispatch_element(
      g.scalar_type(), [&]<class T>(T) { return b.accumulate(executor(), span_of<T const>(g)); });
}

torch::Tensor buffer_values(grad::gradient_buffer const& b) {
  torch::Tensor out = torch::empty({b.size()}, torch::TensorOptions().dtype(torch::kFloat));
  agoq::dequantize(executor(), b.view(), agoq::as_row(out.data_ptr<float>(), b.size()));
  return out;
}

py::dict reduce_result(bool nonfinite, std::int64_t local) {
  py::dict d;
  d["nonfinite"] = nonfinite;
  d["local_nonfinite"] = local;
  return d;
}

/// Calls f(source) with the GIL released, source being the GradientBuffer or the 1-D span of the
/// tensor `input` is (the operand forms agoq's collectives take).
template <class F>
void with_source(py::object const& input, char const* what, F&& f) {
  if (py::isinstance<grad::gradient_buffer>(input)) {
    auto const& b = input.cast<grad::gradient_buffer const&>();
    py::gil_scoped_release nogil;
    f(b);
    return;
  }
  auto const in = input.cast<torch::Tensor>();
  check_vector(in, -1, what);
  py::gil_scoped_release nogil;
  dispatch_element(in.scalar_type(), [&]<class I>(I) { f(span_of<I const>(in)); });
}

/// Calls f(span) with the 1-D tensor `out` as a span of its element type.
template <class F>
void with_output(torch::Tensor const& out, F&& f) {
  dispatch_element(out.scalar_type(), [&]<class O>(O) { f(span_of<O>(out)); });
}

/// all_reduce_8bit from a tensor or a GradientBuffer into a 1-D tensor.
py::dict all_reduce(counted_communicator& c, py::object const& input, torch::Tensor const& output,
                    int group_size, bool average, bool stochastic, std::uint64_t seed,
                    std::uint64_t step) {
  check_vector(output, -1, "all_reduce_8bit (output)");
  auto const opt = reduce_options(group_size, average, stochastic, seed, step);
  grad::all_reduce_result r;
  with_source(input, "all_reduce_8bit (input)", [&](auto const& src) {
    with_output(output,
                [&](auto out) { r = grad::all_reduce_8bit(executor(), c.comm(), src, out, opt); });
  });
  return reduce_result(r.nonfinite, r.local_nonfinite);
}

/// reduce_scatter_8bit from a tensor or a GradientBuffer into this rank's shard.
py::dict reduce_scatter(counted_communicator& c, py::object const& input,
                        torch::Tensor const& shard, int group_size, bool average, bool stochastic,
                        std::uint64_t seed, std::uint64_t step) {
  check_vector(shard, -1, "reduce_scatter_8bit (shard)");
  auto const opt = reduce_options(group_size, average, stochastic, seed, step);
  grad::reduce_scatter_result r;
  with_source(input, "reduce_scatter_8bit (input)", [&](auto const& src) {
    with_output(shard, [&](auto out) {
      r = grad::reduce_scatter_8bit(executor(), c.comm(), src, out, opt);
    });
  });
  py::dict d = reduce_result(r.nonfinite, r.local_nonfinite);
  d["begin"] = r.begin;
  d["end"] = r.end;
  return d;
}

optim::adamw_state make_adamw(std::int64_t n, std::int64_t block, std::uint64_t seed,
                              std::string const& m_format, std::string const& v_format) {
  return optim::adamw_state(n, adamw_options(block, seed, m_format, v_format));
}

/// One AdamW step on fp32 parameters (updated in place) with a tensor or GradientBuffer gradient.
std::int64_t adamw_step(optim::adamw_state& s, torch::Tensor const& params, py::object const& grad,
                        double lr, double beta1, double beta2, double eps, double weight_decay) {
  std::span<float> const p = adamw_params(params, s.size());
  optim::adamw_hyper const h = adamw_hyper_of(lr, beta1, beta2, eps, weight_decay);
  if (py::isinstance<grad::gradient_buffer>(grad)) {
    auto const& b = grad.cast<grad::gradient_buffer const&>();
    py::gil_scoped_release nogil;
    return optim::adamw_step(executor(), s, h, p, b.view());
  }
  auto const g = grad.cast<torch::Tensor>();
  check_vector(g, s.size(), "AdamW8bit.step (grad)");
  py::gil_scoped_release nogil;
  return dispatch_element(g.scalar_type(), [&]<class T>(T) {
    return optim::adamw_step(executor(), s, h, p, span_of<T const>(g));
  });
}

}  // namespace

void register_collectives(py::module_& m) {
  py::class_<grad::gradient_buffer>(
      m, "GradientBuffer",
      "An 8-bit gradient accumulation buffer (int8 codes + fp32 group scales, about 1.03 bytes "
      "per element at group 128): accumulate() dequantizes, adds in fp32 and requantizes with "
      "fresh scales (stochastic rounding by default, so the sum is unbiased).")
      .def(py::init(&make_buffer), py::arg("n"), py::arg("group_size") = 128,
           py::arg("stochastic") = true, py::arg("seed") = 0)
      .def("accumulate", &accumulate, py::arg("gradient"), py::call_guard<py::gil_scoped_release>(),
           "Adds a 1-D float32/bfloat16/float16 gradient of size elements; returns its "
           "non-finite count.")
      .def("zero", &grad::gradient_buffer::zero, "Sets every element to zero.")
      .def("to_tensor", &buffer_values, "The dequantized values as a float32 1-D tensor.")
      .def_property_readonly("size", &grad::gradient_buffer::size)
      .def_property_readonly("group_size", &grad::gradient_buffer::group_size)
      .def_property_readonly("bytes", &grad::gradient_buffer::bytes, "Bytes held.")
      .def_property_readonly("nonfinite_count", &grad::gradient_buffer::nonfinite_count)
      .def_property_readonly("spec",
                             [](grad::gradient_buffer const& b) { return b.spec().name(); });

  register_communicator(
      m,
      [](c10::intrusive_ptr<c10d::ProcessGroup> pg) {
        return std::make_unique<counted_communicator>(std::move(pg), torch::Device(torch::kCPU),
                                                      agoq::comm::memory_space::host);
      },
      "agoq's communicator over a torch.distributed ProcessGroup with CPU tensors (e.g. gloo), "
      "counting the bytes this rank sends to and receives from its peers.",
      false);

  register_collective_calls(
      m, &all_reduce,
      "The precision-preserving 8-bit all-reduce of a 1-D tensor or GradientBuffer into a 1-D "
      "tensor of the same length; every rank receives the same bits. Returns "
      "{'nonfinite': bool (the same on every rank), 'local_nonfinite': int}.",
      &reduce_scatter,
      "The reduce-scatter form: this rank's shard [begin, end) of the reduced bucket. Returns "
      "{'nonfinite', 'local_nonfinite', 'begin', 'end'}.");
  m.def("all_reduce_bytes_sent", &grad::all_reduce_bytes_sent, py::arg("n"), py::arg("ranks"),
        py::arg("group_size") = 128,
        "Bytes one rank sends to its peers in all_reduce_8bit of n elements.");
  m.def(
      "shard_range",
      [](std::int64_t n, int ranks, int rank, int group_size) {
        auto const r = grad::shard_range(n, ranks, rank, group_size);
        return std::make_pair(r.begin, r.end);
      },
      py::arg("n"), py::arg("ranks"), py::arg("rank"), py::arg("group_size") = 128,
      "The element range [begin, end) rank `rank` owns in reduce_scatter_8bit.");

  py::class_<optim::adamw_state>(
      m, "AdamW8bit",
      "AdamW with quantized moments: m as int8 codes per block, sqrt(v) as FP8 E4M3 codes per "
      "block (2.0625 bytes per parameter at block 128); the update is torch.optim.AdamW's.")
      .def(py::init(&make_adamw), py::arg("n"), py::arg("block") = 128, py::arg("seed") = 0,
           py::arg("m_format") = "int8_linear", py::arg("v_format") = "e4m3_sqrt")
      .def("step", &adamw_step, py::arg("params"), py::arg("grad"), py::arg("lr"),
           py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 0.0,
           "One step on float32 parameters (in place) with a 1-D tensor or GradientBuffer "
           "gradient; returns the number of elements skipped for a non-finite gradient.")
      .def_property_readonly("size", &optim::adamw_state::size)
      .def_property_readonly("bytes", &optim::adamw_state::bytes)
      .def_property_readonly("bytes_per_parameter", &optim::adamw_state::bytes_per_parameter)
      .def_property_readonly("step_count", &optim::adamw_state::step)
      .def("state_bytes", &adamw_record,
           "The whole state (options, step count, both moments) as an agoq AdamW state record "
           "(docs/formats.md section 12), for a checkpoint.")
      .def_static("from_state_bytes", &adamw_of_record, py::arg("data"),
                  "The state of a record from state_bytes(): it continues the run bit for bit.")
      .def(py::pickle(&adamw_record, &adamw_of_record));
}

}  // namespace agoq_torch
