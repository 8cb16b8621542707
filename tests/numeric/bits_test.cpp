#include <agoq/numeric/bits.hpp>

#include <cmath>
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
