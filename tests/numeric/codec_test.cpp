// The shared math: each encoding is checked against a brute-force search over all codes.
#include <agoq/numeric/codec.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;

namespace {

template <class Code>
int code_count() {
  return 1 << Code::bits;
}

// Is code c a valid output of the encoder (in range, not NaN)?
template <class Code>
bool valid_code(std::uint32_t c) {
  if constexpr (is_fp8_code<Code>) {
    return (c & 0x7fu) <= Code::format.max_code;
  } else if constexpr (Code::has_zero_point) {
    return c <= static_cast<std::uint32_t>(Code::levels);
  } else {
    std::int32_t const q = numeric::sign_extend(c, Code::bits);
    return q >= -Code::qmax && q <= Code::qmax;
  }
}

// The value decode gives in units of the scale, in double.
template <class Code>
double code_value(std::uint32_t c, group_params p) {
  return static_cast<double>(
      decode<Code>(static_cast<std::uint8_t>(c), group_params{1.0f, p.zero_point}));
}

}  // namespace

TEST_CASE_TEMPLATE("encode_nearest picks the nearest code, ties to even", Code, int_sym<2>,
                   int_sym<4>, int_sym<8>, uint_asym<2>, uint_asym<4>, uint_asym<8>, fp8_e4m3,
                   fp8_e5m2) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> unit(-1.2f, 1.2f);
  for (int trial = 0; trial < 20000; ++trial) {
    group_params p{1.0f, 0};
    if constexpr (Code::has_zero_point) {
      p.zero_point = static_cast<std::int32_t>(gen() % (Code::levels + 1));
    }
    // v is the value in units of the scale (scale 1 makes x / scale exact).
    float v = unit(gen) * Code::range_divisor;
    if (trial % 4 == 0) v = std::nearbyint(v * 2.0f) / 2.0f;  // exact ties
    std::uint8_t const c = encode_nearest<Code>(v, p);
    REQUIRE(valid_code<Code>(c));
    double const got = code_value<Code>(c, p);
    double best = std::numeric_limits<double>::infinity();
    int at_best = 0;
    for (int k = 0; k < code_count<Code>(); ++k) {
      if (!valid_code<Code>(static_cast<std::uint32_t>(k))) continue;
      double const d = std::fabs(code_value<Code>(static_cast<std::uint32_t>(k), p) - v);
      if (d < best) at_best = 0;
      if (d <= best) ++at_best;
      best = std::fmin(best, d);
    }
    INFO("v = " << v << " code " << int(c));
    REQUIRE(std::fabs(got - v) == best);
    if (!is_fp8_code<Code> && at_best == 2 && got != 0.0) {
      // A tie between two integers (q or q - z) goes to the even one. (+0 and -0 of fp8 are
      // two codes of one value, hence the exclusions.)
      REQUIRE(std::fmod(std::fabs(got), 2.0) == 0.0);
    }
  }
}

TEST_CASE_TEMPLATE("encode_stochastic picks one of the two neighbours", Code, int_sym<4>,
                   int_sym<8>, uint_asym<4>, fp8_e4m3, fp8_e5m2) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    group_params p{1.0f, Code::has_zero_point ? 3 : 0};
    // Inside the code range (outside it both roundings clamp to the end codes).
    float v = unit(gen) * Code::range_divisor;
    if constexpr (Code::has_zero_point) v = (v + Code::range_divisor) / 2.0f - 3.0f;
    float const u = std::floor(u01(gen) * 16777216.0f) / 16777216.0f;
    std::uint8_t const c = encode_stochastic<Code>(v, p, u);
    REQUIRE(valid_code<Code>(c));
    double const got = code_value<Code>(c, p);
    // No valid code lies strictly between v and the chosen code.
    for (int k = 0; k < code_count<Code>(); ++k) {
      if (!valid_code<Code>(static_cast<std::uint32_t>(k))) continue;
      double const other = code_value<Code>(static_cast<std::uint32_t>(k), p);
      REQUIRE_FALSE((other > std::fmin(got, v) && other < std::fmax(got, v)));
    }
    // u = 0 rounds down (towards -inf for integers, towards zero for fp8 magnitudes), as
    // floor(v + u) does.
    std::uint8_t const c0 = encode_stochastic<Code>(v, p, 0.0f);
    if constexpr (is_fp8_code<Code>) {
      REQUIRE(std::fabs(code_value<Code>(c0, p)) <= std::fabs(v));
    } else {
      REQUIRE(code_value<Code>(c0, p) <= v);
    }
  }
}

TEST_CASE("group parameters follow the contract") {
  SUBCASE("symmetric") {
    group_params const p = make_group_params<int_sym<8>, scale_f32>({2.54f, -2.54f, 1.0f});
    CHECK(p.scale == 2.54f / 127.0f);
    CHECK(p.zero_point == 0);
  }
  SUBCASE("asymmetric widens the range to include zero") {
    group_params const p = make_group_params<uint_asym<8>, scale_f32>({0.0f, 1.0f, 3.0f});
    CHECK(p.scale == 3.0f / 255.0f);
    CHECK(p.zero_point == 0);
    group_params const q = make_group_params<uint_asym<4>, scale_f32>({0.0f, -3.0f, 12.0f});
    CHECK(q.scale == 1.0f);
    CHECK(q.zero_point == 3);
  }
  SUBCASE("zero and underflowing groups get scale 0") {
    CHECK(make_group_params<int_sym<8>, scale_f32>({}).scale == 0.0f);
    CHECK(make_group_params<int_sym<8>, scale_f32>({1e-37f, 0, 0}).scale == 0.0f);
    CHECK(make_group_params<uint_asym<8>, scale_bf16>({0, -1e-40f, 0}).scale == 0.0f);
    CHECK(encode_nearest<int_sym<8>>(1.0f, {}) == 0);
    CHECK(decode<int_sym<8>>(0x7f, {}) == 0.0f);
  }
  SUBCASE("ranges wider than the float range do not overflow") {
    float const big = std::numeric_limits<float>::max();
    group_params const p = make_group_params<uint_asym<8>, scale_f32>({0.0f, -big, big});
    CHECK(std::isfinite(p.scale));
    CHECK(p.scale > 0.0f);
    CHECK(p.zero_point == 128);
  }
  SUBCASE("non-finite values encode to the documented codes") {
    float const inf = std::numeric_limits<float>::infinity();
    group_params const p{0.5f, 0};
    CHECK(encode_nearest<int_sym<8>>(std::nanf(""), p) == 0);
    CHECK(encode_nearest<int_sym<8>>(inf, p) == 127);
    CHECK(encode_nearest<int_sym<8>>(-inf, p) == 0x81);  // -127
    CHECK(encode_nearest<int_sym<4>>(-inf, p) == 0x9);   // -7 in 4 bits
    group_params const a{0.5f, 5};
    CHECK(encode_nearest<uint_asym<4>>(std::nanf(""), a) == 5);
    CHECK(encode_nearest<uint_asym<4>>(inf, a) == 15);
    CHECK(encode_nearest<uint_asym<4>>(-inf, a) == 0);
    CHECK(encode_stochastic<uint_asym<4>>(std::nanf(""), a, 0.9f) == 5);
    CHECK(encode_stochastic<int_sym<8>>(inf, p, 0.99f) == 127);
    CHECK(encode_stochastic<fp8_e4m3>(-inf, p, 0.5f) == 0xfe);
  }
}

TEST_CASE("floor_stochastic rounds up with probability floor(2^24 f) / 2^24, exactly") {
  float const last = 1.0f - 5.9604644775390625e-8f;  // the largest draw, 1 - 2^-24
  // An fp32 sum v + u would round these up across an integer; the exact rule does not.
  CHECK(numeric::floor_stochastic(100.0f, last) == 100.0f);
  CHECK(numeric::floor_stochastic(-127.0f, last) == -127.0f);
  CHECK(numeric::floor_stochastic(127.0f, last) == 127.0f);
  CHECK(numeric::floor_stochastic(126.99999f, last) == 127.0f);
  CHECK(numeric::floor_stochastic(126.99999f, 0.0f) == 126.0f);
  // v - floor(v) = 1 + v is not a float for tiny negative v: compared as u >= -v instead.
  CHECK(numeric::floor_stochastic(-0x1p-30f, 0.0f) == -1.0f);
  CHECK(numeric::floor_stochastic(-0x1p-30f, 5.9604644775390625e-8f) == 0.0f);
  for (float const v : {0.25f, -3.75f, 126.999992f, -0.3f, 5.0f, 1e-7f, -1e-9f, -0.7f, -1.0f}) {
    double const f = static_cast<double>(v) - std::floor(static_cast<double>(v));
    std::int64_t ups = 0, outside = 0;
    for (std::uint32_t k = 0; k < (1u << 24); ++k) {
      float const u = static_cast<float>(k) * 5.9604644775390625e-8f;
      float const q = numeric::floor_stochastic(v, u);
      outside += q != std::floor(v) && q != std::floor(v) + 1.0f;
      ups += q != std::floor(v);
    }
    INFO("v = " << v);
    CHECK(outside == 0);
    CHECK(ups == static_cast<std::int64_t>(std::floor(f * 16777216.0)));
  }
}

namespace {

// The clamp and saturation of the codec written with float comparisons and selects: the
// definition that codec.hpp computes on the bits (so that loops calling it vectorize).
template <class Code>
float clamped_by_selects(float v, group_params p) {
  float lo, hi;
  if constexpr (Code::has_zero_point) {
    lo = static_cast<float>(-p.zero_point);
    hi = static_cast<float>(Code::levels - p.zero_point);
  } else {
    hi = static_cast<float>(Code::qmax);
    lo = -hi;
  }
  v = v != v ? 0.0f : v;
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

float saturated_by_selects(float y) {
  float const m = std::numeric_limits<float>::max();
  y = y > m ? m : y;
  return y < -m ? -m : y;
}

// Every 4093rd float bit pattern, the specials and the neighbourhoods of the clamp bounds.
template <class F>
void for_swept_floats(F&& f) {
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093)
    f(numeric::bits_float(static_cast<std::uint32_t>(u)));
  for (std::uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                          0xffc00000u, 0x7f800001u, 0xffffffffu, 0x00000001u, 0x80000001u}) {
    f(numeric::bits_float(u));
  }
  for (int k = -256; k <= 256; ++k) {
    for (float d : {-0.5f, -0x1p-20f, 0.0f, 0x1p-20f, 0.5f}) f(static_cast<float>(k) + d);
  }
}

// The FP8 format of an FP8 code (any format for the others, whose callers do not read it).
template <class Code>
constexpr numeric::fp8_format fp8_of() {
  if constexpr (is_fp8_code<Code>) {
    return Code::format;
  } else {
    return numeric::fp8_e4m3_format;
  }
}

// Zero points to try: both ends of the range and inside it (0 alone without a zero point).
template <class Code>
std::vector<std::int32_t> zero_points() {
  if constexpr (Code::has_zero_point) {
    return {0, 1, Code::levels / 2, Code::levels - 1, Code::levels};
  } else {
    return {0};
  }
}

template <class Code>
void check_integer_encoders_against_selects(group_params p) {
  float const draws[] = {0.0f, 0.5f, 1.0f - 0x1p-24f};
  std::int64_t mismatches = 0;
  for_swept_floats([&](float v) {
    float const c = clamped_by_selects<Code>(v, p);
    std::uint8_t const nearest = numeric::integer_code<Code>(numeric::rne_small(c), p);
    mismatches += numeric::nearest_code<Code>(v, p) != nearest;
    for (float const u : draws) {
      std::uint8_t const st = numeric::integer_code<Code>(numeric::floor_stochastic(c, u), p);
      mismatches += numeric::stochastic_code<Code>(v, p, u) != st;
    }
  });
  INFO("zero point " << p.zero_point);
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("the integer encoders' clamp on the bits equals the float clamp", Code,
                   int_sym<2>, int_sym<4>, int_sym<8>, uint_asym<2>, uint_asym<4>, uint_asym<8>) {
  for (std::int32_t const z : zero_points<Code>()) {
    check_integer_encoders_against_selects<Code>(group_params{1.0f, z});
  }
}

TEST_CASE_TEMPLATE("decode saturates at ±FLT_MAX on the bits as the float selects do", Code,
                   int_sym<4>, int_sym<8>, uint_asym<8>, fp8_e4m3, fp8_e5m2) {
  float const big = std::numeric_limits<float>::max();
  float const inf = std::numeric_limits<float>::infinity();
  std::int64_t mismatches = 0;
  for (float const s : {1.0f, 3.0e36f, 1.0e38f, big, inf, -inf, std::nanf(""), 1e-30f}) {
    for (std::int32_t const z : zero_points<Code>()) {
      group_params const p{s, z};
      for (std::uint32_t c = 0; c < (1u << Code::bits); ++c) {
        // The code's value (exact; FP8's ±Inf codes as themselves, which decode would saturate
        // at scale 1) times the scale, exact in double and rounded once to float: the float
        // product decode computes.
        double const value = is_fp8_code<Code> ? static_cast<double>(numeric::fp8_to_float(
                                                     static_cast<std::uint8_t>(c), fp8_of<Code>()))
                                               : code_value<Code>(c, p);
        auto const y = static_cast<float>(value * static_cast<double>(s));
        float const want = saturated_by_selects(y);
        float const got = decode<Code>(static_cast<std::uint8_t>(c), p);
        mismatches +=
            (want != want) ? (got == got) : (numeric::float_bits(got) != numeric::float_bits(want));
      }
    }
  }
  CHECK(mismatches == 0);
}
