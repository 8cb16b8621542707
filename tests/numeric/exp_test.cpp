#include <agoq/numeric/exp.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include <doctest/doctest.h>

using namespace agoq::numeric;

namespace {

/// |y - e^x| in units of the last place of e^x as a float (subnormal spacing below 2^-126).
double ulp_error(float x, float y) {
  double const ref = std::exp(static_cast<double>(x));
  int e = 0;
  std::frexp(ref, &e);
  return std::fabs(static_cast<double>(y) - ref) / std::ldexp(1.0, std::max(e - 24, -149));
}

}  // namespace

TEST_CASE("exp_fp32 is within 0.94 ulp of e^x on a sweep of every 61st float") {
  // All 2^32 floats were checked once (tens of seconds): at most 0.9386 ulp, at x = 0x1.ab05d2p+4,
  // and 99.54% rounded to nearest. The sweep below covers every binade in both signs.
  double worst = 0.0;
  std::int64_t nearest = 0;
  std::int64_t checked = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 61) {
    float const x = bits_float(static_cast<std::uint32_t>(u));
    if (std::isnan(x)) continue;
    float const y = exp_fp32(x);
    float const want = static_cast<float>(std::exp(static_cast<double>(x)));
    ++checked;
    nearest += y == want ? 1 : 0;
    if (std::isinf(want) || want == 0.0f) {
      REQUIRE(y == want);  // overflow to +Inf, underflow to 0, as e^x rounded
      continue;
    }
    worst = std::max(worst, ulp_error(x, y));
  }
  CHECK(worst < 0.94);
  CHECK(static_cast<double>(nearest) / static_cast<double>(checked) > 0.995);
}

TEST_CASE("exp_fp32 at the ends of its range and on special values") {
  float const inf = std::numeric_limits<float>::infinity();
  CHECK(exp_fp32(0.0f) == 1.0f);
  CHECK(exp_fp32(-0.0f) == 1.0f);
  CHECK(exp_fp32(inf) == inf);
  CHECK(exp_fp32(-inf) == 0.0f);
  CHECK(std::isnan(exp_fp32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(exp_fp32(-std::numeric_limits<float>::quiet_NaN())));
  // The largest x with a finite e^x (ln(FLT_MAX) = 88.7228390... rounded down), and the next.
  float const top = bits_float(0x42b17217u);
  CHECK(std::isfinite(exp_fp32(top)));
  CHECK(exp_fp32(top) == static_cast<float>(std::exp(static_cast<double>(top))));
  CHECK(exp_fp32(std::nextafter(top, inf)) == inf);
  CHECK(exp_fp32(89.0f) == inf);
  CHECK(exp_fp32(1e30f) == inf);
  // Subnormal results round once: the smallest subnormal and 0 below half of it.
  float const tiny = std::numeric_limits<float>::denorm_min();
  for (float const x : {-87.3f, -100.0f, -103.0f, -103.27893f, -103.97208f, -104.0f, -1e30f}) {
    CHECK(exp_fp32(x) == static_cast<float>(std::exp(static_cast<double>(x))));
  }
  CHECK(exp_fp32(-103.2789f) == tiny);
  CHECK(exp_fp32(-104.0f) == 0.0f);
}

TEST_CASE("exp_parts is an exact split: head * scale rounds to exp_fp32, scale a power of two") {
  for (float x = -110.0f; x <= 95.0f; x += 0.37f) {
    exp_product const e = exp_parts(x);
    CHECK((float_bits(e.scale) & 0x807fffffu) == 0u);
    CHECK(e.head * e.scale == exp_fp32(x));
    // The one rounding of 1 + e^x that sigmoid relies on.
    CHECK(std::fma(e.head, e.scale, 1.0f) ==
          static_cast<float>(static_cast<double>(e.head) * static_cast<double>(e.scale) + 1.0));
  }
}
