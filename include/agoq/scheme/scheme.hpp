/// \file
/// A scheme as a type: code family x grouping x rounding x scale storage, fixed at compile time.
#pragma once

#include <type_traits>

#include "../numeric/codes.hpp"
#include "../numeric/rounding.hpp"
#include "../numeric/scale.hpp"
#include "grouping.hpp"
#include "spec.hpp"

namespace agoq {

/// A quantization scheme fixed at compile time; `to_spec()` gives its runtime description.
/// For example `scheme<int_sym<4>, per_group<128>>` is `int4_g128_sym_rne_f32`, and the OCP
/// MXFP8 format is `scheme<fp8_e4m3, per_group<32>, round_nearest, scale_e8m0>`.
template <code_format Code, grouping Grouping, rounding_mode Rounding = round_nearest,
          scale_storage Scale = scale_f32>
struct scheme {
  using code = Code;
  using grouping = Grouping;
  using rounding = Rounding;
  using scale = Scale;

  /// The runtime spec of this scheme.
  static constexpr spec to_spec() noexcept {
    spec s;
    s.code = Code::kind;
    s.bits = Code::bits;
    s.grouping = Grouping::kind;
    s.group_rows = Grouping::group_rows;
    s.group_cols = Grouping::group_cols;
    if (Grouping::kind == grouping_kind::tensor || Grouping::kind == grouping_kind::row ||
        Grouping::kind == grouping_kind::column) {
      s.group_rows = 1;
      s.group_cols = 128;
    }
    s.rounding = Rounding::kind;
    s.scale = Scale::format;
    return s;
  }
};

namespace detail {
template <class T>
struct is_scheme : std::false_type {};
template <class C, class G, class R, class S>
struct is_scheme<scheme<C, G, R, S>> : std::true_type {};
}  // namespace detail

/// Satisfied by instantiations of agoq::scheme.
template <class S>
concept quant_scheme = detail::is_scheme<S>::value;

/// The OCP MXFP8 (E4M3) format: 32-element groups with E8M0 scales.
using mxfp8_e4m3 = scheme<fp8_e4m3, per_group<32>, round_nearest, scale_e8m0>;
/// The OCP MXFP8 (E5M2) format.
using mxfp8_e5m2 = scheme<fp8_e5m2, per_group<32>, round_nearest, scale_e8m0>;
/// The OCP MXINT8 format: 32-element groups of symmetric int8 with E8M0 scales. (OCP reads the
/// element as a 1.6 fixed-point number, so its E8M0 exponent is agoq's plus 6.)
using mxint8 = scheme<int_sym<8>, per_group<32>, round_nearest, scale_e8m0>;

}  // namespace agoq
