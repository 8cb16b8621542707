/// \file
/// The CPU executor: quantize, dequantize and fake-quantize on the host for every scheme.
///
/// It is the bit-exact reference of the CUDA path (both call numeric/codec.hpp) and a CPU
/// implementation in its own right: with AVX-512 enabled at compile time (-march=native on a
/// machine that has it) the hot schemes run vectorized loops, elsewhere portable loops written
/// for the auto-vectorizer; both give the same bits (tests/quantize_test.cpp checks).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "detail/host/engine.hpp"
#include "error.hpp"
#include "host_executor.hpp"
#include "layout/matrix.hpp"
#include "layout/view.hpp"
#include "numeric/element.hpp"
#include "scheme/dispatch.hpp"

namespace agoq {

/// True when the CPU executor was compiled with its AVX-512 loops (AVX-512 F, BW and VL enabled
/// for the including translation unit); otherwise it runs the portable loops.
inline constexpr bool host_simd_available = detail::host::simd_available;

/// The vector loops the CPU executor was compiled with for the including translation unit:
/// "AVX-512" (all of them), "AVX2" (the row path of the integer codes, per_group and per_row
/// groupings, and the stochastic-rounding draws; the rest portable) or "portable" (loops written
/// for the compiler's auto-vectorizer). Every choice gives the same bits.
inline constexpr char const* host_simd_isa = detail::host::simd_isa;

/// Arguments of stochastic rounding: element i (row-major index) of a call draws stream
/// position `offset + i` under `seed`. Give each step, layer and micro-batch its own seed or
/// offset range; nearest rounding ignores both.
struct quantize_options {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
};

namespace detail {

template <class In>
concept readable_elements = element_type<std::remove_const_t<In>>;

template <class Out>
concept writable_elements = element_type<Out> && !std::is_const_v<Out>;

/// Throws unless the tensor's extents equal the other operand's (`other` names it in the message).
inline void check_extents(std::int64_t rows, std::int64_t cols, std::int64_t qrows,
                          std::int64_t qcols, char const* what,
                          char const* other = "the quantized view") {
  AGOQ_EXPECTS(rows == qrows && cols == qcols,
               std::string(what) + ": the tensor is " + std::to_string(rows) + "x" +
                   std::to_string(cols) + " but " + other + " is " + std::to_string(qrows) + "x" +
                   std::to_string(qcols));
}

template <class T>
void check_data(T const* p, std::int64_t n, char const* what) {
  AGOQ_EXPECTS(p != nullptr || n == 0,
               std::string(what) + ": null data pointer for " + std::to_string(n) + " elements");
}

}  // namespace detail

/// Quantizes `in` into `out` (whose spec is the scheme) and returns how many non-finite inputs
/// (NaN, ±Inf) it met; those are left out of their group's statistics and encoded as documented
/// (NaN -> the code of zero, ±Inf -> the largest/smallest code). Host only; synchronous.
/// Empty tensors are no-ops. Pointers need no particular alignment. `Codes` lists the code
/// families the call compiles (by default the dispatch set's eight); a caller that knows its
/// schemes names fewer, e.g. `quantize<type_list<int_sym<8>>>(ex, in, out)`, and compiles less.
/// \throws agoq::invalid_argument on an invalid spec, mismatched extents or a null pointer;
/// agoq::unsupported_scheme on a code family outside `Codes`.
template <code_list Codes = dispatch_codes, detail::readable_elements In>
std::int64_t quantize(host_executor ex, matrix_view<In> in, quantized_view out,
                      quantize_options opt = {}) {
  out.validate();
  detail::check_extents(in.extent(0), in.extent(1), out.rows, out.cols, "quantize");
  detail::check_data(in.data_handle(), in.size(), "quantize");
  if (in.size() == 0) return 0;
  using T = std::remove_const_t<In>;
  T const* x = in.data_handle();
  return dispatch_code<Codes>(out.spec, [&](auto code) {
    return dispatch_rounding(out.spec, [&](auto rounding) {
      return detail::host::quantize<decltype(code), decltype(rounding)>(ex, x, out, opt.seed,
                                                                        opt.offset);
    });
  });
}

/// Dequantizes `in` into `out` and returns how many outputs were decoded under a non-finite
/// stored scale (zero for any buffer written by quantize; non-zero flags a corrupted buffer).
/// Host only; synchronous. Empty tensors are no-ops. `Codes` as in quantize.
/// \throws agoq::invalid_argument on an invalid spec, mismatched extents or a null pointer;
/// agoq::unsupported_scheme on a code family outside `Codes`.
template <code_list Codes = dispatch_codes, detail::writable_elements Out>
std::int64_t dequantize(host_executor ex, const_quantized_view in, matrix_view<Out> out) {
  in.validate();
  detail::check_extents(out.extent(0), out.extent(1), in.rows, in.cols, "dequantize");
  detail::check_data(out.data_handle(), out.size(), "dequantize");
  if (out.size() == 0) return 0;
  return dispatch_code<Codes>(in.spec, [&](auto code) {
    return detail::host::dequantize<decltype(code)>(ex, in, out.data_handle());
  });
}

/// Quantizes and dequantizes `in` with scheme `s` into `out` without storing the codes; the
/// result is bit-identical to quantize followed by dequantize. `in` and `out` may be the same
/// buffer (same element type); any other overlap is refused. Returns the non-finite input count.
/// Host only; synchronous. `Codes` as in quantize.
/// \throws agoq::invalid_argument on an invalid spec, mismatched extents, a null pointer or
/// partially overlapping buffers; agoq::unsupported_scheme on a code family outside `Codes`.
template <code_list Codes = dispatch_codes, detail::readable_elements In,
          detail::writable_elements Out>
std::int64_t fake_quantize(host_executor ex, spec const& s, matrix_view<In> in,
                           matrix_view<Out> out, quantize_options opt = {}) {
  s.validate();
  detail::check_extents(in.extent(0), in.extent(1), out.extent(0), out.extent(1), "fake_quantize",
                        "the output");
  detail::check_data(in.data_handle(), in.size(), "fake_quantize");
  detail::check_data(out.data_handle(), out.size(), "fake_quantize");
  if (in.size() == 0) return 0;
  using T = std::remove_const_t<In>;
  auto const* ib = reinterpret_cast<unsigned char const*>(in.data_handle());
  auto const* ob = reinterpret_cast<unsigned char const*>(out.data_handle());
  auto const in_bytes = in.size() * static_cast<std::int64_t>(sizeof(T));
  auto const out_bytes = out.size() * static_cast<std::int64_t>(sizeof(Out));
  bool const disjoint = ib + in_bytes <= ob || ob + out_bytes <= ib;
  bool const same = std::is_same_v<T, Out> && ib == ob;
  AGOQ_EXPECTS(disjoint || same,
               "fake_quantize: input and output overlap without being the same buffer");
  return dispatch_code<Codes>(s, [&](auto code) {
    return dispatch_rounding(s, [&](auto rounding) {
      return detail::host::fake_quantize<decltype(code), decltype(rounding)>(
          ex, s, in.extent(0), in.extent(1), in.data_handle(), out.data_handle(), opt.seed,
          opt.offset);
    });
  });
}

}  // namespace agoq
