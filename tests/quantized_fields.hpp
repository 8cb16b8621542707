// Test helpers: spec names of every code family, readers of a quantized view's fields straight
// from its bytes, independent of agoq's own readers (the tests compare agoq's output with these),
// and the portable executor the vector loops are compared with.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <agoq/host_executor.hpp>
#include <agoq/layout/view.hpp>
#include <agoq/scheme/spec.hpp>

namespace agoq::test {

/// The host executor without its vector loops: the portable loops, whose bits the vector loops
/// must reproduce.
inline constexpr agoq::host_executor portable{.simd = false};

/// The code field of element (r, c), read from the packed rows (LSB first, rows byte-aligned).
inline int code_field(agoq::const_quantized_view v, std::int64_t r, std::int64_t c) {
  std::int64_t const row_bytes = (v.cols * v.spec.bits + 7) / 8;
  std::int64_t const bit = c * v.spec.bits;
  int const byte = v.codes[r * row_bytes + bit / 8];
  return (byte >> (bit % 8)) & ((1 << v.spec.bits) - 1);
}

/// Group g's stored scale (any format) as a float; agoq stores a zero scale as 0 in every format.
inline float stored_scale(agoq::const_quantized_view v, std::int64_t g) {
  switch (v.spec.scale) {
    case agoq::scale_format::f32: {
      float s;
      std::memcpy(&s, v.scales + 4 * g, 4);
      return s;
    }
    case agoq::scale_format::bf16: {
      std::uint16_t b;
      std::memcpy(&b, v.scales + 2 * g, 2);
      return std::bit_cast<float>(std::uint32_t{b} << 16);
    }
    case agoq::scale_format::e8m0:
      return v.scales[g] == 0 ? 0.0f : std::ldexp(1.0f, v.scales[g] - 127);
  }
  return 0.0f;
}

/// Name prefixes of every code family, "{}" standing for the grouping.
inline std::vector<std::string> const& code_prefixes() {
  static std::vector<std::string> const p = {"int2_{}_sym",  "int4_{}_sym",  "int8_{}_sym",
                                             "int2_{}_asym", "int4_{}_asym", "int8_{}_asym",
                                             "fp8e4m3_{}",   "fp8e5m2_{}"};
  return p;
}

/// The spec named by a prefix of code_prefixes(), a grouping ("g128", "row", ...) and a tail
/// ("rne_f32", ...).
inline agoq::spec make_spec(std::string const& prefix, std::string const& grouping,
                            std::string const& tail) {
  std::string name = prefix;
  name.replace(name.find("{}"), 2, grouping);
  return agoq::spec::parse(name + "_" + tail);
}

}  // namespace agoq::test
