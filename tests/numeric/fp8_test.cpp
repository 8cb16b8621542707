// FP8 encoding and decoding against the CUDA toolkit's host conversions (cuda_fp8.h).
#include <agoq/numeric/fp8.hpp>

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include <doctest/doctest.h>

#include <agoq/numeric/element.hpp>

using namespace agoq::numeric;

namespace {

struct format_case {
  fp8_format format;
  __nv_fp8_interpretation_t nv;
};

float nv_decode(std::uint8_t code, __nv_fp8_interpretation_t nv) {
  __half_raw const h = __nv_cvt_fp8_to_halfraw(code, nv);
  return half_bits_to_float(h.x);
}

}  // namespace

TEST_CASE("fp8 decoding is exact for all 256 codes") {
  for (format_case const fc :
       {format_case{fp8_e4m3_format, __NV_E4M3}, format_case{fp8_e5m2_format, __NV_E5M2}}) {
    for (std::uint32_t c = 0; c < 256; ++c) {
      auto const code = static_cast<std::uint8_t>(c);
      float const ref = nv_decode(code, fc.nv);
      float const got = fp8_to_float(code, fc.format);
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(got));
      } else {
        INFO("code " << c);
        REQUIRE(float_bits(got) == float_bits(ref));
      }
    }
  }
  CHECK(fp8_to_float(0x7e, fp8_e4m3_format) == 448.0f);
  CHECK(fp8_to_float(0x7b, fp8_e5m2_format) == 57344.0f);
  CHECK(fp8_to_float(0x01, fp8_e4m3_format) == 0.001953125f);       // 2^-9
  CHECK(fp8_to_float(0x01, fp8_e5m2_format) == 1.52587890625e-5f);  // 2^-16
}

TEST_CASE("fp8 encoding rounds to nearest even and saturates like __NV_SATFINITE") {
  for (format_case const fc :
       {format_case{fp8_e4m3_format, __NV_E4M3}, format_case{fp8_e5m2_format, __NV_E5M2}}) {
    auto check = [&](std::uint32_t u) {
      float const x = bits_float(u);
      if (std::isnan(x)) return;
      std::uint8_t const ref = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fc.nv);
      std::uint8_t const got = float_to_fp8_rne_sat(x, fc.format);
      INFO("float bits " << u);
      REQUIRE(got == ref);
    };
    for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) check(static_cast<std::uint32_t>(u));
    // Every code's value, and the midpoints and their neighbours between consecutive codes.
    for (std::uint32_t c = 0; c < fc.format.max_code; ++c) {
      float const lo = fp8_magnitude_to_float(c, fc.format);
      float const hi = fp8_magnitude_to_float(c + 1, fc.format);
      float const mid = 0.5f * (lo + hi);
      for (float const v : {lo, std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e30f), hi}) {
        check(float_bits(v));
        check(float_bits(-v));
      }
    }
  }
}

TEST_CASE("fp8 encoding of non-finite values follows the format contract") {
  float const inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_fp8_rne_sat(std::nanf(""), fp8_e4m3_format) == 0x00);
  CHECK(float_to_fp8_rne_sat(inf, fp8_e4m3_format) == 0x7e);
  CHECK(float_to_fp8_rne_sat(-inf, fp8_e4m3_format) == 0xfe);
  CHECK(float_to_fp8_rne_sat(inf, fp8_e5m2_format) == 0x7b);
  CHECK(float_to_fp8_rne_sat(-inf, fp8_e5m2_format) == 0xfb);
}

TEST_CASE("fp8 stochastic rounding at u = 0 truncates toward zero and saturates") {
  for (fp8_format const f : {fp8_e4m3_format, fp8_e5m2_format}) {
    for (std::uint32_t c = 0; c < f.max_code; ++c) {
      float const lo = fp8_magnitude_to_float(c, f);
      float const hi = fp8_magnitude_to_float(c + 1, f);
      REQUIRE(fp8_stochastic_magnitude(float_bits(lo), 0.0f, f) == c);
      REQUIRE(fp8_stochastic_magnitude(float_bits(std::nextafter(hi, 0.0f)), 0.0f, f) == c);
      REQUIRE(fp8_stochastic_magnitude(float_bits(hi), 0.0f, f) == c + 1);
    }
    CHECK(fp8_stochastic_magnitude(float_bits(1e30f), 0.0f, f) == f.max_code);
    CHECK(fp8_stochastic_magnitude(0x7f800000u, 0x1.fffffep-1f, f) == f.max_code);
  }
}

namespace {

/// The reference of fp8_stochastic_magnitude, in double from the format's values: lo the largest
/// finite FP8 magnitude not above a, and the smallest k with (1 - k 2^-24) (next - lo) <= a - lo
/// (exact in double), 2^24 when none or when lo is the largest magnitude: the magnitude under the
/// draw u = k 2^-24 is lo + (k >= threshold).
struct stochastic_reference {
  std::uint32_t lo = 0;
  std::uint32_t threshold = 0;

  stochastic_reference(double a, fp8_format f) {
    while (lo < f.max_code && fp8_magnitude_to_float(lo + 1, f) <= a) ++lo;
    threshold = 1u << 24;
    if (lo == f.max_code || a != a) return;
    double const below = fp8_magnitude_to_float(lo, f);
    double const gap = static_cast<double>(fp8_magnitude_to_float(lo + 1, f)) - below;
    threshold = static_cast<std::uint32_t>(std::ceil(0x1p24 - 0x1p24 * ((a - below) / gap)));
  }
  std::uint32_t at(std::uint32_t k) const { return lo + (k >= threshold ? 1u : 0u); }
};

}  // namespace

TEST_CASE("fp8 stochastic rounding rounds up exactly when (1 - u) gap <= a - lo") {
  // Floats from 0 to twice the largest value (every 1031st, and the 64 on each side of every FP8
  // magnitude: binade edges, the subnormal-normal edge, the largest value) and +Inf, each at u = 0,
  // at the largest u, and at the two draws around the threshold where it starts to round up.
  std::int64_t checked = 0;
  for (fp8_format const f : {fp8_e4m3_format, fp8_e5m2_format}) {
    auto check = [&](std::uint32_t a) {
      stochastic_reference const ref(bits_float(a), f);
      std::uint32_t const t = ref.threshold;
      for (std::uint32_t const k : {0u, t > 0 ? t - 1u : 0u, t, (1u << 24) - 1u}) {
        if (k >= (1u << 24)) continue;
        CAPTURE(a);
        CAPTURE(k);
        REQUIRE(fp8_stochastic_magnitude(a, static_cast<float>(k) * 0x1p-24f, f) == ref.at(k));
        ++checked;
      }
    };
    std::uint32_t const end = float_bits(2.0f * f.max_value);
    for (std::uint32_t a = 0; a < end; a += 1031) check(a);
    for (std::uint32_t c = 0; c <= f.max_code; ++c) {
      std::uint32_t const b = float_bits(fp8_magnitude_to_float(c, f));
      for (std::uint32_t d = 0; d < 64; ++d) {
        check(b + d);
        if (b >= d) check(b - d);
      }
    }
    check(0x7f800000u);
  }
  CHECK(checked > 7000000);
}
