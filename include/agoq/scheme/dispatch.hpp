/// \file
/// Runtime-to-compile-time dispatch: one constrained helper over type lists maps a runtime spec
/// onto the documented set of compiled scheme instantiations.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "../config.hpp"
#include "../error.hpp"
#include "scheme.hpp"
#include "spec.hpp"

namespace agoq {

/// A list of types.
template <class... Ts>
struct type_list {};

/// The code families of the dispatch set.
using dispatch_codes = type_list<int_sym<2>, int_sym<4>, int_sym<8>, uint_asym<2>, uint_asym<4>,
                                 uint_asym<8>, fp8_e4m3, fp8_e5m2>;
/// The groupings of the dispatch set.
using dispatch_groupings = type_list<per_tensor, per_row, per_column, per_group<32>, per_group<64>,
                                     per_group<128>, per_group<256>, per_block<128, 128>>;
/// The roundings of the dispatch set.
using dispatch_roundings = type_list<round_nearest, round_stochastic>;
/// The scale storages of the dispatch set.
using dispatch_scales = type_list<scale_f32, scale_bf16, scale_e8m0>;

/// Calls `f(T{})` for the first `T` of the list for which `match(T{})` is true and returns its
/// result; throws agoq::unsupported_scheme with `what` when none matches. Every call of `f` must
/// return the same type.
template <class T, class... Ts, class Match, class F>
decltype(auto) dispatch_type(type_list<T, Ts...>, Match&& match, F&& f, char const* what) {
  static_assert((std::is_same_v<std::invoke_result_t<F, T>, std::invoke_result_t<F, Ts>> && ...),
                "agoq::dispatch_type: every instantiation of the callable must return one type");
  if (match(T{})) return std::forward<F>(f)(T{});
  if constexpr (sizeof...(Ts) == 0) {
    throw unsupported_scheme(std::string("agoq: ") + what);
  } else {
    return dispatch_type(type_list<Ts...>{}, std::forward<Match>(match), std::forward<F>(f), what);
  }
}

namespace detail {
template <class L>
struct is_code_list : std::false_type {};
template <code_format C, code_format... Cs>
struct is_code_list<type_list<C, Cs...>> : std::true_type {};
}  // namespace detail

/// A non-empty type_list of code families, e.g. `type_list<int_sym<4>, int_sym<8>>`: the codes a
/// quantize call compiles its kernels for (see quantize and quantize_async).
template <class L>
concept code_list = detail::is_code_list<L>::value;

/// Whether `Code` is the code family of `s` (its kind and bit width): the one test of a family,
/// on the host (dispatch_code) and inside kernels that branch over a code list.
template <code_format Code>
AGOQ_HOST_DEVICE constexpr bool is_code_of(spec const& s) noexcept {
  return Code::kind == s.code && Code::bits == s.bits;
}

/// Calls `f(Code{})` for the code family of `s`, which must be one of `Codes` (by default every
/// code family of the dispatch set): `f` is instantiated for the families of `Codes` alone, and any
/// other family throws agoq::unsupported_scheme.
template <code_list Codes = dispatch_codes, class F>
decltype(auto) dispatch_code(spec const& s, F&& f) {
  return dispatch_type(
      Codes{}, [&](auto c) { return is_code_of<decltype(c)>(s); }, std::forward<F>(f),
      std::is_same_v<Codes, dispatch_codes>
          ? "code family outside the dispatch set"
          : "code family outside the code list the call was compiled for");
}

/// Throws agoq::unsupported_scheme, as dispatch_code<Codes> would, unless the code family of `s` is
/// one of `Codes`: the check a stream-ordered call makes before it enqueues anything.
template <code_list Codes>
void require_code(spec const& s) {
  dispatch_code<Codes>(s, [](auto) {});
}

/// Calls `f(Rounding{})` for the rounding of `s`.
template <class F>
decltype(auto) dispatch_rounding(spec const& s, F&& f) {
  return dispatch_type(
      dispatch_roundings{}, [&](auto r) { return decltype(r)::kind == s.rounding; },
      std::forward<F>(f), "rounding outside the dispatch set");
}

/// Calls `f(Scale{})` for the scale storage of `s`.
template <class F>
decltype(auto) dispatch_scale(spec const& s, F&& f) {
  return dispatch_type(
      dispatch_scales{}, [&](auto c) { return decltype(c)::format == s.scale; }, std::forward<F>(f),
      "scale format outside the dispatch set");
}

/// Calls `f(Scheme{})` with the agoq::scheme type of `s` (validated first). The dispatch set is
/// every code family x {per_tensor, per_row, per_column, per_group<32|64|128|256>,
/// per_block<128,128>} x both roundings x every scale storage (384 schemes, see
/// README.md, "Schemes"); a spec outside it (e.g. g48) throws agoq::unsupported_scheme. The host
/// executor takes any valid spec without this helper.
template <class F>
decltype(auto) dispatch(spec const& s, F&& f) {
  s.validate();
  return dispatch_code(s, [&](auto c) -> decltype(auto) {
    return dispatch_type(
        dispatch_groupings{},
        [&](auto g) {
          using G = decltype(g);
          bool const sized = G::kind == grouping_kind::group || G::kind == grouping_kind::block;
          return G::kind == s.grouping &&
                 (!sized || (G::group_rows == s.group_rows && G::group_cols == s.group_cols));
        },
        [&](auto g) -> decltype(auto) {
          return dispatch_rounding(s, [&](auto r) -> decltype(auto) {
            return dispatch_scale(s, [&](auto sc) -> decltype(auto) {
              return std::forward<F>(f)(
                  scheme<decltype(c), decltype(g), decltype(r), decltype(sc)>{});
            });
          });
        },
        "grouping outside the dispatch set");
  });
}

}  // namespace agoq
