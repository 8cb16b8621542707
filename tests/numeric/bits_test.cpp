#include <agoq/numeric/bits.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include <doctest/doctest.h>

using namespace agoq::numeric;

TEST_CASE("rne_small rounds half to even") {
  CHECK(rne_small(0.5f) == 0.0f);
  CHECK(rne_small(1.5f) == 2.0f);
  CHECK(rne_small(2.5f) == 2.0f);
  CHECK(rne_small(-0.5f) == 0.0f);
  CHECK(rne_small(-1.5f) == -2.0f);
  CHECK(rne_small(-2.5f) == -2.0f);
  CHECK(rne_small(126.5f) == 126.0f);
  CHECK(rne_small(127.49f) == 127.0f);
  CHECK(rne_small(0.49999997f) == 0.0f);
}

TEST_CASE("rne_small equals nearbyint on every float step in [-300, 300]") {
  for (float v = -300.0f; v <= 300.0f; v += 0.015625f) {  // exact steps, ties included
    REQUIRE(rne_small(v) == std::nearbyint(v));
  }
  // And on the floats just around the ties.
  for (int k = -256; k <= 256; ++k) {
    float const tie = static_cast<float>(k) + 0.5f;
    for (float const v : {std::nextafter(tie, -1e9f), tie, std::nextafter(tie, 1e9f)}) {
      REQUIRE(rne_small(v) == std::nearbyint(v));
    }
  }
}

TEST_CASE("is_finite on the bits") {
  CHECK(is_finite(0.0f));
  CHECK(is_finite(-max_finite_float));
  CHECK(is_finite(std::numeric_limits<float>::denorm_min()));
  CHECK_FALSE(is_finite(std::numeric_limits<float>::infinity()));
  CHECK_FALSE(is_finite(-std::numeric_limits<float>::infinity()));
  CHECK_FALSE(is_finite(std::numeric_limits<float>::quiet_NaN()));
  CHECK(min_normal_float == std::numeric_limits<float>::min());
  CHECK(max_finite_float == std::numeric_limits<float>::max());
}

TEST_CASE("floor_small is floor on every float up to 2^22 in magnitude") {
  // Every float of magnitude at most 2^22 (0x4a800000), both signs.
  std::int64_t wrong = 0;
  for (std::uint32_t a = 0; a <= 0x4a800000u; ++a) {
    for (std::uint32_t const sign : {0u, 0x80000000u}) {
      float const v = bits_float(a | sign);
      wrong += floor_small(v) != std::floor(v);
    }
  }
  CHECK(wrong == 0);
  CHECK(float_bits(floor_small(-0.0f)) == 0u);  // +0, as documented
  CHECK(floor_small(-0.5f) == -1.0f);
  CHECK(floor_small(2.5f) == 2.0f);
  CHECK(floor_small(-0x1p-149f) == -1.0f);
}

TEST_CASE("select_float and all_ones_if") {
  CHECK(all_ones_if(true) == 0xffffffffu);
  CHECK(all_ones_if(false) == 0u);
  float const nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(float_bits(select_float(true, -0.0f, 1.0f)) == 0x80000000u);
  CHECK(select_float(false, -0.0f, 1.0f) == 1.0f);
  CHECK(float_bits(select_float(true, nan, 1.0f)) == float_bits(nan));
}
