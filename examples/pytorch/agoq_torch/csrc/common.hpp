/// \file
/// Shared helpers of the agoq PyTorch extension: argument checks that turn a wrong tensor into a
/// clear Python exception, the dtype dispatch from torch's scalar types to agoq's element types,
/// and the process-wide count of non-finite values the extension's quantizing calls have seen.
#pragma once

// agoq first: parsing the AVX-512 intrinsics headers (which agoq includes) after torch's headers
// makes g++ 12 warn about the intrinsics' deliberately uninitialized values.
#include <agoq/activation/error_model.hpp>
#include <agoq/agoq.hpp>

// torch's tensor API and its pybind11 casters, not <torch/extension.h>: that adds all of libtorch's
// C++ frontend (nn, optim, data, jit), which this extension does not use and which took about 40%
// of each translation unit's compile time.
#include <ATen/Parallel.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>

namespace agoq_torch {

/// Runs agoq's tasks on torch's intra-op pool (agoq::host_pool): at::parallel_for, one task per
/// index.
inline void run_on_torch_pool(void*, std::int64_t n, agoq::host_task task) {
  at::parallel_for(0, n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) task.run(task.context, i);
  });
}

/// The host executor of the extension's calls: as many tasks as torch's intra-op threads
/// (torch.get_num_threads(), set by torch.set_num_threads), run on torch's own pool, so that they
/// do not compete with its (spinning) OpenMP workers; agoq gives the same bits for any count, so
/// this changes only the speed.
inline agoq::host_executor executor() {
  return agoq::host_executor{.threads = at::get_num_threads(),
                             .pool = {&run_on_torch_pool, nullptr}};
}

/// NaN / ±Inf values seen by every quantizing call of this process since the last reset
/// (agoq encodes them as documented in docs/formats.md and counts them; the extension adds the
/// counts here so a training loop can check once per step).
inline std::atomic<std::int64_t>& nonfinite_seen() {
  static std::atomic<std::int64_t> count{0};
  return count;
}

/// Adds a quantizing call's non-finite count to nonfinite_seen().
inline void note_nonfinite(std::int64_t n) {
  if (n != 0) nonfinite_seen().fetch_add(n, std::memory_order_relaxed);
}

/// Parses and validates an agoq spec name; agoq::invalid_argument (Python ValueError) otherwise.
inline agoq::spec parse_spec(std::string const& name) {
  agoq::spec s = agoq::spec::parse(name);
  s.validate();
  return s;
}

/// The scalar type of a torch.dtype object; float32 for None.
inline torch::ScalarType dtype_or_float(pybind11::object const& dtype) {
  if (dtype.is_none()) return torch::kFloat;
  TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "expected a torch.dtype or None");
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

/// Where the tensors of the extension's CPU calls must be. Each check below takes a place: this one
/// by default, or the device backend of device.cu, whose tensors are on the first input's GPU. A
/// place has holds(t) and expected(), the phrase a refusal names.
struct cpu_place {
  static bool holds(torch::Tensor const& t) { return t.device().is_cpu(); }
  static std::string expected() { return "a CPU tensor"; }
};

/// Checks that `st` is float32, bfloat16 or float16 (the element types agoq takes).
inline void check_floating_type(torch::ScalarType st, char const* what) {
  TORCH_CHECK(st == torch::kFloat || st == torch::kBFloat16 || st == torch::kHalf, what,
              ": expected float32, bfloat16 or float16, got ", st);
}

/// Checks that `t` is a contiguous tensor of float32, bfloat16 or float16 at `place`.
template <class Place = cpu_place>
void check_floating(torch::Tensor const& t, char const* what, Place const& place = {}) {
  TORCH_CHECK(t.defined(), what, ": expected a tensor, got None");
  TORCH_CHECK(place.holds(t), what, ": expected ", place.expected(), ", got one on ", t.device());
  TORCH_CHECK(t.is_contiguous(), what, ": expected a contiguous tensor");
  check_floating_type(t.scalar_type(), what);
}

/// Checks a 2-D floating tensor [rows, cols] at `place`.
template <class Place = cpu_place>
void check_matrix(torch::Tensor const& t, char const* what, Place const& place = {}) {
  check_floating(t, what, place);
  TORCH_CHECK(t.dim() == 2, what, ": expected a 2-D tensor [rows, cols], got ", t.dim(),
              " dimensions");
}

/// Checks a 1-D floating tensor of `n` elements (n < 0: any length) at `place`.
template <class Place = cpu_place>
void check_vector(torch::Tensor const& t, std::int64_t n, char const* what,
                  Place const& place = {}) {
  check_floating(t, what, place);
  TORCH_CHECK(t.dim() == 1, what, ": expected a 1-D tensor, got ", t.dim(), " dimensions");
  TORCH_CHECK(n < 0 || t.numel() == n, what, ": expected ", n, " elements, got ", t.numel());
}

/// Checks that `a` and `b` have the same dtype and shape.
inline void check_same(torch::Tensor const& a, torch::Tensor const& b, char const* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, ": dtypes differ (", a.scalar_type(),
              " and ", b.scalar_type(), ")");
  TORCH_CHECK(a.sizes() == b.sizes(), what, ": shapes differ (", a.sizes(), " and ", b.sizes(),
              ")");
}

/// Checks that `buf` is a contiguous 1-D uint8 tensor at `place` holding exactly the quantized
/// buffer of `s` for [rows, cols].
template <class Place = cpu_place>
void check_buffer(torch::Tensor const& buf, agoq::spec const& s, std::int64_t rows,
                  std::int64_t cols, char const* what, Place const& place = {}) {
  TORCH_CHECK(buf.defined(), what, ": expected a uint8 buffer, got None");
  TORCH_CHECK(place.holds(buf) && buf.is_contiguous() && buf.dim() == 1 &&
                  buf.scalar_type() == torch::kByte,
              what, ": expected ", place.expected(),
              ": a contiguous 1-D uint8 buffer from compress");
  std::int64_t const bytes = agoq::make_layout(s, rows, cols).total_bytes;
  TORCH_CHECK(buf.numel() == bytes, what, ": a ", s.name(), " buffer of [", rows, ", ", cols,
              "] holds ", bytes, " bytes, got ", buf.numel());
}

/// A writable quantized view over a buffer.
inline agoq::quantized_view view_of(agoq::spec const& s, std::int64_t rows, std::int64_t cols,
                                    torch::Tensor& buf) {
  return agoq::view_of_buffer(s, rows, cols, buf.data_ptr<std::uint8_t>());
}

/// A read-only quantized view over a buffer.
inline agoq::const_quantized_view const_view_of(agoq::spec const& s, std::int64_t rows,
                                                std::int64_t cols, torch::Tensor const& buf) {
  return agoq::view_of_buffer(s, rows, cols,
                              static_cast<std::uint8_t const*>(buf.data_ptr<std::uint8_t>()));
}

/// The keys of a statistics dict, as agoq::activation::tensor_stats names its fields.
inline pybind11::dict stats_dict(agoq::activation::tensor_stats const& st) {
  namespace py = pybind11;
  py::dict d;
  d["tile"] = py::make_tuple(st.tile.rows, st.tile.cols);
  d["elements"] = st.elements;
  d["sum_squares"] = st.sum_squares;
  d["sum_group_absmax_sq"] = st.sum_group_absmax_sq;
  d["sum_group_range_sq"] = st.sum_group_range_sq;
  if (st.has_dead_zones) {
    d["dead_energy"] = py::make_tuple(st.dead_energy[0], st.dead_energy[1], st.dead_energy[2]);
    d["live_absmax_sq"] =
        py::make_tuple(st.live_absmax_sq[0], st.live_absmax_sq[1], st.live_absmax_sq[2]);
    d["live_error_2bit"] =
        py::make_tuple(st.live_error_2bit[0], st.live_error_2bit[1], st.live_error_2bit[2]);
  }
  return d;
}

/// Calls `f(T{})` with T the agoq element type of `st` (float, agoq::bfloat16, agoq::half).
template <class F>
decltype(auto) dispatch_element(torch::ScalarType st, F&& f) {
  switch (st) {
    case torch::kFloat:
      return f(float{});
    case torch::kBFloat16:
      return f(agoq::bfloat16{});
    case torch::kHalf:
      return f(agoq::half{});
    default:
      TORCH_CHECK(false, "agoq: unsupported dtype ", st, " (float32, bfloat16 or float16)");
  }
}

/// The data of a floating tensor as agoq element type T (torch's BFloat16 and Half have the same
/// bits as cuda_bf16.h's and cuda_fp16.h's types).
template <class T>
T* data_as(torch::Tensor const& t) {
  return static_cast<T*>(t.data_ptr());
}

/// A tensor's elements as a span of E (E may be const).
template <class E>
std::span<E> span_of(torch::Tensor const& t) {
  return std::span<E>(data_as<E>(t), static_cast<std::size_t>(t.numel()));
}

/// A 2-D tensor as an agoq matrix view.
template <class T>
agoq::matrix_view<T> matrix_of(torch::Tensor const& t) {
  return agoq::matrix_view<T>(data_as<T>(t), t.size(0), t.size(1));
}

/// The options of a GradientBuffer (CPU or device).
inline agoq::gradient::buffer_options buffer_options(int group_size, bool stochastic,
                                                     std::uint64_t seed) {
  return {group_size, stochastic ? agoq::rounding_kind::stochastic : agoq::rounding_kind::nearest,
          seed};
}

/// The options of an 8-bit all-reduce or reduce-scatter (CPU or device).
inline agoq::gradient::all_reduce_options reduce_options(int group_size, bool average,
                                                         bool stochastic, std::uint64_t seed,
                                                         std::uint64_t step) {
  return {group_size, average,
          stochastic ? agoq::rounding_kind::stochastic : agoq::rounding_kind::nearest, seed, step};
}

/// The moment format named `name` (agoq::optim::format_name); agoq::invalid_argument otherwise.
inline agoq::optim::moment_format moment_format_of(std::string const& name, char const* what) {
  namespace optim = agoq::optim;
  for (auto const f : {optim::moment_format::f32, optim::moment_format::bf16,
                       optim::moment_format::int8_linear, optim::moment_format::uint8_sqrt,
                       optim::moment_format::e4m3_sqrt, optim::moment_format::e4m3})
    if (name == optim::format_name(f)) return f;
  throw agoq::invalid_argument(std::string("AdamW8bit: unknown ") + what + " format '" + name +
                               "' (f32, bf16, int8_linear, uint8_sqrt, e4m3_sqrt, e4m3)");
}

/// The options of an AdamW8bit (CPU or device).
inline agoq::optim::adamw_state_options adamw_options(std::int64_t block, std::uint64_t seed,
                                                      std::string const& m_format,
                                                      std::string const& v_format) {
  agoq::optim::adamw_state_options o;
  o.m = moment_format_of(m_format, "first-moment");
  o.v = moment_format_of(v_format, "second-moment");
  o.block = block;
  o.seed = seed;
  return o;
}

/// AdamW8bit.step's parameters, checked (a float32 1-D tensor of n elements at `place`), as a span.
template <class Place = cpu_place>
std::span<float> adamw_params(torch::Tensor const& params, std::int64_t n,
                              Place const& place = {}) {
  check_vector(params, n, "AdamW8bit.step (params)", place);
  TORCH_CHECK(params.scalar_type() == torch::kFloat,
              "AdamW8bit.step: the parameters must be float32 (a master copy)");
  return span_of<float>(params);
}

/// AdamW8bit.step's hyper-parameters.
inline agoq::optim::adamw_hyper adamw_hyper_of(double lr, double beta1, double beta2, double eps,
                                               double weight_decay) {
  return {static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2),
          static_cast<float>(eps), static_cast<float>(weight_decay)};
}

/// A host AdamW state as an agoq AdamW state record (optim/checkpoint.hpp).
inline pybind11::bytes adamw_record(agoq::optim::adamw_state const& s) {
  std::ostringstream out;
  agoq::optim::write_adamw_state(out, s);
  return pybind11::bytes(out.str());
}

/// The host AdamW state of a record.
inline agoq::optim::adamw_state adamw_of_record(pybind11::bytes const& data) {
  std::istringstream in(static_cast<std::string>(data));
  return agoq::optim::read_adamw_state(in);
}

}  // namespace agoq_torch
