/// \file
/// The runtime description of a scheme, its short name (`int4_g128_sym_rne_f32`), parsing,
/// printing and validation.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../numeric/codes.hpp"
#include "../numeric/rounding.hpp"
#include "../numeric/scale.hpp"
#include "grouping.hpp"

namespace agoq {

/// A quantization scheme chosen at run time: code family and width, grouping, rounding and scale
/// storage. Trivially copyable; passed by value to kernels.
///
/// Short names: `<code>_<grouping>[_sym|_asym]_<rounding>_<scale>` with
/// - code: `int2`, `int4`, `int8` (followed by `sym` or `asym`), `fp8e4m3`, `fp8e5m2`;
/// - grouping: `tensor`, `row`, `col`, `g<G>` (G >= 1), `b<R>x<C>`;
/// - rounding: `rne` (nearest even) or `sr` (stochastic);
/// - scale: `f32`, `bf16`, `e8m0`.
///
/// The OCP MX formats are ordinary schemes; `parse` also accepts their names:
/// `mxfp8` / `mxfp8e4m3` = `fp8e4m3_g32_rne_e8m0`, `mxfp8e5m2` = `fp8e5m2_g32_rne_e8m0`,
/// `mxint8` = `int8_g32_sym_rne_e8m0`.
struct spec {
  code_kind code = code_kind::int_sym;
  int bits = 8;
  grouping_kind grouping = grouping_kind::group;
  std::int64_t group_rows = 1;    ///< rows of a group (group: 1; block: R; else unused)
  std::int64_t group_cols = 128;  ///< columns of a group (group: G; block: C; else unused)
  rounding_kind rounding = rounding_kind::nearest;
  scale_format scale = scale_format::f32;

  friend constexpr bool operator==(spec const&, spec const&) = default;

  /// True for codes with an integer zero point (unsigned asymmetric).
  AGOQ_HOST_DEVICE constexpr bool has_zero_point() const noexcept {
    return code == code_kind::uint_asym;
  }

  /// The rectangle one group covers in a [rows, cols] tensor. Host and device.
  AGOQ_HOST_DEVICE constexpr tile_shape tile(std::int64_t rows, std::int64_t cols) const noexcept {
    switch (grouping) {
      case grouping_kind::tensor:
        return {detail::at_least_one(rows), detail::at_least_one(cols)};
      case grouping_kind::row:
        return {1, detail::at_least_one(cols)};
      case grouping_kind::column:
        return {detail::at_least_one(rows), 1};
      default:
        return {group_rows, group_cols};
    }
  }

  /// Throws agoq::invalid_argument naming the first field that is out of range.
  void validate() const {
    if (code == code_kind::int_sym || code == code_kind::uint_asym) {
      AGOQ_EXPECTS(bits == 2 || bits == 4 || bits == 8,
                   "spec: integer codes have 2, 4 or 8 bits, got " + std::to_string(bits));
    } else {
      AGOQ_EXPECTS(code == code_kind::fp8_e4m3 || code == code_kind::fp8_e5m2,
                   "spec: unknown code family");
      AGOQ_EXPECTS(bits == 8, "spec: fp8 codes have 8 bits, got " + std::to_string(bits));
    }
    AGOQ_EXPECTS(grouping == grouping_kind::tensor || grouping == grouping_kind::row ||
                     grouping == grouping_kind::column || grouping == grouping_kind::group ||
                     grouping == grouping_kind::block,
                 "spec: unknown grouping");
    if (grouping == grouping_kind::group) {
      AGOQ_EXPECTS(group_cols >= 1,
                   "spec: group size must be at least 1, got " + std::to_string(group_cols));
      AGOQ_EXPECTS(group_rows == 1, "spec: a per-group scheme has groups of one row");
    }
    if (grouping == grouping_kind::block) {
      AGOQ_EXPECTS(group_rows >= 1 && group_cols >= 1,
                   "spec: block extents must be at least 1, got " + std::to_string(group_rows) +
                       "x" + std::to_string(group_cols));
    }
    AGOQ_EXPECTS(rounding == rounding_kind::nearest || rounding == rounding_kind::stochastic,
                 "spec: unknown rounding");
    AGOQ_EXPECTS(
        scale == scale_format::f32 || scale == scale_format::bf16 || scale == scale_format::e8m0,
        "spec: unknown scale format");
  }

  /// The canonical short name, e.g. `int4_g128_sym_rne_f32`. Throws on an invalid spec.
  std::string name() const {
    validate();
    std::string s;
    switch (code) {
      case code_kind::int_sym:
      case code_kind::uint_asym:
        s = "int" + std::to_string(bits);
        break;
      case code_kind::fp8_e4m3:
        s = "fp8e4m3";
        break;
      case code_kind::fp8_e5m2:
        s = "fp8e5m2";
        break;
    }
    switch (grouping) {
      case grouping_kind::tensor:
        s += "_tensor";
        break;
      case grouping_kind::row:
        s += "_row";
        break;
      case grouping_kind::column:
        s += "_col";
        break;
      case grouping_kind::group:
        s += "_g" + std::to_string(group_cols);
        break;
      case grouping_kind::block:
        s += "_b" + std::to_string(group_rows) + "x" + std::to_string(group_cols);
        break;
    }
    if (code == code_kind::int_sym) s += "_sym";
    if (code == code_kind::uint_asym) s += "_asym";
    s += rounding == rounding_kind::nearest ? "_rne" : "_sr";
    s += scale == scale_format::f32 ? "_f32" : scale == scale_format::bf16 ? "_bf16" : "_e8m0";
    return s;
  }

  /// Parses a short name (or an MX alias). Throws agoq::invalid_argument naming the token that
  /// is wrong, and validates the result.
  static spec parse(std::string_view name) {
    if (name == "mxfp8" || name == "mxfp8e4m3") return parse("fp8e4m3_g32_rne_e8m0");
    if (name == "mxfp8e5m2") return parse("fp8e5m2_g32_rne_e8m0");
    if (name == "mxint8") return parse("int8_g32_sym_rne_e8m0");

    std::string const whole(name);
    std::vector<std::string_view> tok;
    for (std::size_t start = 0;;) {
      std::size_t const end = name.find('_', start);
      tok.push_back(name.substr(start, end == std::string_view::npos ? end : end - start));
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
    auto fail = [&](std::string const& why) -> void {
      AGOQ_EXPECTS(false, "spec \"" + whole + "\": " + why);
    };
    auto to_int = [&](std::string_view t, std::string_view what) -> std::int64_t {
      std::int64_t v = -1;
      auto const [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (ec != std::errc{} || ptr != t.data() + t.size() || t.empty())
        fail("bad " + std::string(what) + " '" + std::string(t) + "'");
      return v;
    };

    spec s;
    if (tok.size() < 4) fail("expected <code>_<grouping>[_sym|_asym]_<rounding>_<scale>");
    std::string_view const code = tok[0];
    bool const is_int = code.starts_with("int");
    if (is_int) {
      s.bits = static_cast<int>(to_int(code.substr(3), "bit width"));
    } else if (code == "fp8e4m3") {
      s.code = code_kind::fp8_e4m3;
    } else if (code == "fp8e5m2") {
      s.code = code_kind::fp8_e5m2;
    } else {
      fail("unknown code '" + std::string(code) + "' (int2, int4, int8, fp8e4m3, fp8e5m2)");
    }
    if (tok.size() != (is_int ? 5u : 4u))
      fail(is_int ? "integer codes need 5 fields: int<b>_<grouping>_<sym|asym>_<rounding>_<scale>"
                  : "fp8 codes need 4 fields: fp8e4m3_<grouping>_<rounding>_<scale>");

    std::string_view const g = tok[1];
    if (g == "tensor") {
      s.grouping = grouping_kind::tensor;
    } else if (g == "row") {
      s.grouping = grouping_kind::row;
    } else if (g == "col") {
      s.grouping = grouping_kind::column;
    } else if (g.starts_with("g")) {
      s.grouping = grouping_kind::group;
      s.group_rows = 1;
      s.group_cols = to_int(g.substr(1), "group size");
    } else if (g.starts_with("b") && g.find('x') != std::string_view::npos) {
      s.grouping = grouping_kind::block;
      std::size_t const x = g.find('x');
      s.group_rows = to_int(g.substr(1, x - 1), "block rows");
      s.group_cols = to_int(g.substr(x + 1), "block columns");
    } else {
      fail("unknown grouping '" + std::string(g) + "' (tensor, row, col, g<G>, b<R>x<C>)");
    }

    std::size_t next = 2;
    if (is_int) {
      if (tok[2] == "sym") {
        s.code = code_kind::int_sym;
      } else if (tok[2] == "asym") {
        s.code = code_kind::uint_asym;
      } else {
        fail("expected 'sym' or 'asym', got '" + std::string(tok[2]) + "'");
      }
      next = 3;
    }
    if (tok[next] == "rne") {
      s.rounding = rounding_kind::nearest;
    } else if (tok[next] == "sr") {
      s.rounding = rounding_kind::stochastic;
    } else {
      fail("unknown rounding '" + std::string(tok[next]) + "' (rne, sr)");
    }
    std::string_view const sc = tok[next + 1];
    if (sc == "f32") {
      s.scale = scale_format::f32;
    } else if (sc == "bf16") {
      s.scale = scale_format::bf16;
    } else if (sc == "e8m0") {
      s.scale = scale_format::e8m0;
    } else {
      fail("unknown scale format '" + std::string(sc) + "' (f32, bf16, e8m0)");
    }
    s.validate();
    return s;
  }
};

}  // namespace agoq
