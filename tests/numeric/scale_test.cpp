#include <agoq/numeric/scale.hpp>

#include <cmath>
#include <cstdint>
#include <random>

#include <doctest/doctest.h>

using namespace agoq;
using agoq::numeric::bits_float;
using agoq::numeric::float_bits;

TEST_CASE_TEMPLATE("round_up gives the smallest storable value not below the scale", S, scale_f32,
                   scale_bf16, scale_e8m0) {
  std::mt19937 gen(42);
  std::uniform_int_distribution<std::uint32_t> dist(0x00800000u, 0x7f7fffffu);  // normal floats
  for (int i = 0; i < 200000; ++i) {
    float const s = bits_float(dist(gen));
    float const r = S::round_up(s);
    REQUIRE(S::load(S::store(r)) == r);                                          // storable
    if (r == bits_float(0x7f7f0000u) || r == bits_float(0x7f000000u)) continue;  // clamped top
    REQUIRE(r >= s);
    // No storable value lies in [s, r): the float just below r is either below s or not storable.
    float const below = std::nextafter(r, 0.0f);
    REQUIRE((below < s || S::load(S::store(below)) != below));
  }
}

TEST_CASE("bf16 and e8m0 rounding examples") {
  CHECK(scale_bf16::round_up(1.0f) == 1.0f);
  CHECK(scale_bf16::round_up(std::nextafter(1.0f, 2.0f)) == 1.0078125f);
  CHECK(scale_bf16::store(1.0078125f) == 0x3f81);
  CHECK(scale_e8m0::round_up(1.0f) == 1.0f);
  CHECK(scale_e8m0::round_up(1.5f) == 2.0f);
  CHECK(scale_e8m0::round_up(0.3f) == 0.5f);
  CHECK(scale_e8m0::store(0.5f) == 126);
  CHECK(scale_e8m0::store(1.0f) == 127);
  CHECK(scale_e8m0::load(0) == 0.0f);  // agoq's zero scale
  CHECK(scale_e8m0::load(254) == std::ldexp(1.0f, 127));
  // Overflow clamps to the largest storable value instead of infinity.
  CHECK(scale_bf16::round_up(3.4e38f) == bits_float(0x7f7f0000u));
  CHECK(scale_e8m0::round_up(3.4e38f) == std::ldexp(1.0f, 127));
  CHECK(scale_bytes(scale_format::f32) == 4);
  CHECK(scale_bytes(scale_format::bf16) == 2);
  CHECK(scale_bytes(scale_format::e8m0) == 1);
}
