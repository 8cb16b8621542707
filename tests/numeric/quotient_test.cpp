// The proof that numeric::scale_divisor (x * 2^k * r, one remainder, one correction) gives the
// codes of the IEEE division x / scale, for every code format, both roundings and every draw
// (docs/formats.md, "The quotient").
//
// The argument: after the exact move of the scale into [2, 2^65) by 2^k, codes depend on the
// quotient v only through (1) its exact bits where 2^-50 <= |v| <= 2^17, (2) its sign and whether
// it is zero below 2^-50 (a stochastic floor of a negative v is -1 at u = 0 unless v is 0; every
// other code there is that of a signed zero), (3) its sign above 2^17 (every format saturates).
// In (1) all intermediates are normal, so the result depends only on the significands A, B of
// x * 2^k and of the scale: Markstein's bound leaves a wrong rounding possible only where
// |A 2^24 - B N| = 1 (quotient in [1, 2)) or |A 2^25 - B N| <= 6 (quotient in (1/2, 1)) for an
// odd N (a midpoint of the quotient's binade), and the first test checks every such (A, B) for
// every scale significand B. (2) can differ only where x / scale is within 2^-22 of 2^-150
// relative, and the second test checks every such pair. The sweeps and random pairs check the
// whole argument, (3) and the non-finite values end to end.
#include <agoq/detail/host/simd.hpp>
#include <agoq/numeric/codec.hpp>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;
using numeric::bits_float;
using numeric::float_bits;

namespace {

// Encodes with the codes of every format under round-half-to-even and under stochastic rounding
// at every draw u = i 2^-24: do quotients v1 and v2 give the same codes? A stochastic code is
// non-decreasing in u and takes two values, so it is equal for every u when it is at u = 0 and
// at the largest u and steps up at the same draw (found by bisection).
template <class Code>
bool same_codes_of(float v1, float v2, group_params p) {
  if (numeric::nearest_code<Code>(v1, p) != numeric::nearest_code<Code>(v2, p)) return false;
  auto code = [&](float v, std::uint32_t i) {
    return numeric::stochastic_code<Code>(v, p, static_cast<float>(i) * 0x1p-24f);
  };
  constexpr std::uint32_t top = (1u << 24) - 1u;
  auto step = [&](float v) {
    std::uint32_t lo = 0, hi = top + 1u;  // code(v, lo) == code(v, 0); the step is in (lo, hi]
    while (hi - lo > 1u) {
      std::uint32_t const mid = lo + (hi - lo) / 2u;
      (code(v, mid) == code(v, 0) ? lo : hi) = mid;
    }
    return hi;
  };
  return code(v1, 0) == code(v2, 0) && code(v1, top) == code(v2, top) && step(v1) == step(v2);
}

bool same_codes(float v1, float v2) {
  bool same = same_codes_of<fp8_e4m3>(v1, v2, {}) && same_codes_of<fp8_e5m2>(v1, v2, {});
  same = same && same_codes_of<int_sym<2>>(v1, v2, {}) && same_codes_of<int_sym<4>>(v1, v2, {}) &&
         same_codes_of<int_sym<8>>(v1, v2, {});
  for (std::int32_t z : {0, 1, 2, 3}) same = same && same_codes_of<uint_asym<2>>(v1, v2, {1, z});
  for (std::int32_t z : {0, 1, 7, 15}) same = same && same_codes_of<uint_asym<4>>(v1, v2, {1, z});
  for (std::int32_t z : {0, 1, 128, 255}) {
    same = same && same_codes_of<uint_asym<8>>(v1, v2, {1, z});
  }
  return same;
}

// The classes of the argument above: same bits, or both below 2^-50 with one sign and both zero
// or both not, or both above 2^17 with one sign, or both NaN. same_codes checks that each class
// has one set of codes wherever a pair differs.
bool equivalent(float v1, float v2) {
  std::uint32_t const a = float_bits(v1), b = float_bits(v2);
  if (a == b || (v1 != v1 && v2 != v2)) return true;
  if ((a ^ b) >> 31) return false;
  float const m1 = std::fabs(v1), m2 = std::fabs(v2);
  if (m1 < 0x1p-50f && m2 < 0x1p-50f) return (m1 == 0.0f) == (m2 == 0.0f);
  return m1 > 0x1p17f && m2 > 0x1p17f;
}

// Counts of a comparison: pairs, quotients whose bits differ (of which inside [2^-50, 2^17]),
// pairs whose codes differ. same_codes checks the classes of `equivalent` on the first thousand
// differing quotients and on every 65536th.
struct tally {
  std::uint64_t pairs = 0;
  std::uint64_t v_differ = 0;
  std::uint64_t v_differ_inside = 0;
  std::uint64_t codes_differ = 0;

  void add(float x, float s, float v) {
    ++pairs;
    float const ref = x / s;
    if (float_bits(ref) == float_bits(v) || (ref != ref && v != v)) return;
    ++v_differ;
    differ(x, s, ref, v, v_differ <= 1000u || (v_differ & 0xffffu) == 0);
  }
  // A pair (counted) whose quotients differ in bits; `sample`: check its codes too.
  void differ(float x, float s, float ref, float v, bool sample) {
    v_differ_inside += std::fabs(ref) >= 0x1p-50f && std::fabs(ref) <= 0x1p17f;
    if (!equivalent(ref, v) || (sample && !same_codes(ref, v))) {
      ++codes_differ;
      if (codes_differ <= 5) {
        MESSAGE("x = " << std::hexfloat << x << " scale = " << s << ": x / scale = " << ref
                       << ", divisor " << v);
      }
    }
  }
  void add(tally const& t) {
    pairs += t.pairs;
    v_differ += t.v_differ;
    v_differ_inside += t.v_differ_inside;
    codes_differ += t.codes_differ;
  }
};

// The scale families the scale formats produce: fp32 anywhere in the normal range, bf16-rounded,
// powers of two (e8m0), and the significands 1.0 and 1.11...1 at the extremes.
float random_scale(std::mt19937_64& rng) {
  std::uint32_t const e = static_cast<std::uint32_t>(rng() % 254u) + 1u;
  std::uint32_t m = static_cast<std::uint32_t>(rng()) & 0x7fffffu;
  switch (rng() % 6u) {
    case 0:
      m &= 0x7f0000u;  // bf16
      break;
    case 1:
      m = 0;  // e8m0
      break;
    case 2:
      m = rng() % 2u ? 0x7fffffu : m | 0x7ffff0u;
      break;
    default:
      break;
  }
  return bits_float(e << 23 | m);
}

#if defined(AGOQ_HOST_AVX512)
// numeric::scale_divisor's operations lane by lane (fmsub is fma(q, scale, -xs), fnmadd
// fma(-e, reciprocal, q), each one rounding; q where v is NaN or q is 0), so that the sweeps run
// 16 quotients at a time; checked against the scalar divisor where scalar_too.
__m512 vector_quotient(numeric::scale_divisor const& d, __m512 x) {
  __m512 const xs = _mm512_mul_ps(x, _mm512_set1_ps(d.factor));
  __m512 const r = _mm512_set1_ps(d.reciprocal);
  __m512 const q = _mm512_mul_ps(xs, r);
  __m512 const e = _mm512_fmsub_ps(q, _mm512_set1_ps(d.scale), xs);
  __m512 const v = _mm512_fnmadd_ps(e, r, q);
  __mmask16 const take_q = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) |
                           _mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(v, take_q, q);
}
#endif

// Sweeps x over bit patterns first, first + stride, ... below 2^32 for one scale, comparing the
// divisor's quotient (16 lanes at a time where AVX-512 is compiled) with x / scale.
tally sweep(float s, std::uint64_t first, std::uint64_t stride, [[maybe_unused]] bool scalar_too) {
  tally t;
  numeric::scale_divisor const d(s);
#if defined(AGOQ_HOST_AVX512)
  __m512 const sv = _mm512_set1_ps(s);
  __m512i const lane =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  std::uint64_t i = first;
  for (; i + 15 * stride < (std::uint64_t{1} << 32); i += 16 * stride) {
    __m512 const x =
        _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), lane));
    __m512 const ref = _mm512_div_ps(x, sv);
    __m512 const v = vector_quotient(d, x);
    t.pairs += 16;
    __mmask16 const differ =
        _mm512_cmpneq_epi32_mask(_mm512_castps_si512(ref), _mm512_castps_si512(v)) &
        ~(_mm512_cmp_ps_mask(ref, ref, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
    if (scalar_too) {
      alignas(64) float xs[16], vs[16];
      _mm512_store_ps(xs, x);
      _mm512_store_ps(vs, v);
      for (int k = 0; k < 16; ++k) {
        float const w = d(xs[k]);
        CHECK(((float_bits(w) == float_bits(vs[k])) || (w != w && vs[k] != vs[k])));
      }
    }
    if (differ == 0) continue;
    // `equivalent`, lane by lane; the other differing lanes, and a sample, go to tally::differ.
    __m512 const big = _mm512_set1_ps(0x1p17f), tiny = _mm512_set1_ps(0x1p-50f);
    __m512 const ar = _mm512_abs_ps(ref), av = _mm512_abs_ps(v), zero = _mm512_setzero_ps();
    __mmask16 const same_sign =
        _mm512_testn_epi32_mask(_mm512_xor_si512(_mm512_castps_si512(ref), _mm512_castps_si512(v)),
                                _mm512_set1_epi32(static_cast<int>(0x80000000u)));
    __mmask16 const both_big =
        _mm512_cmp_ps_mask(ar, big, _CMP_GT_OQ) & _mm512_cmp_ps_mask(av, big, _CMP_GT_OQ);
    __mmask16 const both_tiny =
        _mm512_cmp_ps_mask(ar, tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(av, tiny, _CMP_LT_OQ) &
        ~(_mm512_cmp_ps_mask(ar, zero, _CMP_EQ_OQ) ^ _mm512_cmp_ps_mask(av, zero, _CMP_EQ_OQ));
    bool const sample = t.v_differ < 1000u || ((i / stride) & 0xfffff0u) == 0;
    __mmask16 const slow =
        differ & static_cast<__mmask16>(sample ? 0xffffu : ~(same_sign & (both_big | both_tiny)));
    t.v_differ += static_cast<std::uint64_t>(__builtin_popcount(differ));
    if (slow == 0) continue;
    alignas(64) float xs[16], rs[16], vs[16];
    _mm512_store_ps(xs, x);
    _mm512_store_ps(rs, ref);
    _mm512_store_ps(vs, v);
    for (int k = 0; k < 16; ++k) {
      if ((slow >> k) & 1u) t.differ(xs[k], s, rs[k], vs[k], sample);
    }
  }
  first = i;
#endif
  for (std::uint64_t i = first; i < (std::uint64_t{1} << 32); i += stride) {
    float const x = bits_float(static_cast<std::uint32_t>(i));
    t.add(x, s, d(x));
  }
  return t;
}

// The sweep of every scale in `scales`, split over the hardware threads.
tally sweep_all(std::vector<float> const& scales, std::uint64_t stride) {
  unsigned const n = std::max(1u, std::thread::hardware_concurrency());
  std::vector<tally> parts(n);
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < n; ++w) {
    pool.emplace_back([&, w] {
      for (std::size_t j; (j = next++) < scales.size();) {
        parts[w].add(sweep(scales[j], 0, stride, false));
      }
    });
  }
  for (std::thread& th : pool) th.join();
  tally t;
  for (tally const& p : parts) t.add(p);
  return t;
}

void report(char const* what, tally const& t) {
  MESSAGE(std::string(what) << ": " << t.pairs << " pairs, " << t.v_differ
                            << " quotients differ in bits (" << t.v_differ_inside
                            << " inside [2^-50, 2^17]), " << t.codes_differ << " codes differ");
}

}  // namespace

TEST_CASE("quotient: every rounding that Markstein's bound leaves open, for every scale") {
  // x = A 2^-23 and scale = B 2^-23 with 2^23 <= A, B < 2^24; the divisor moves the scale by 2^64.
  tally t;
  for (std::uint64_t b = (1u << 23) + 1u; b < (1u << 24); ++b) {
    int const tz = __builtin_ctzll(b);
    std::uint64_t const odd = b >> tz;
    std::uint64_t inv = odd;  // odd^-1 modulo 2^32 by Newton's iteration
    for (int it = 0; it < 5; ++it) inv = (inv * (2u - odd * inv)) & 0xffffffffu;
    float const s = static_cast<float>(b) * 0x1p-23f;
    numeric::scale_divisor const d(s);
    for (int c : {24, 25}) {  // the quotient in [1, 2) or in (1/2, 1)
      int const kmax = c == 24 ? 1 : 6;
      for (int k = 1; k <= kmax; ++k) {
        if (k % (1 << tz) != 0) continue;
        std::uint64_t const kodd = static_cast<std::uint64_t>(k) >> tz;
        std::uint64_t const period = std::uint64_t{1} << (c - tz);
        for (int sigma : {-1, 1}) {
          // A 2^c - B N = sigma k, so N = -sigma (k >> tz) odd^-1 modulo 2^(c - tz).
          std::uint64_t n = (sigma > 0 ? period - (kodd * inv) % period : (kodd * inv) % period);
          n %= period;
          for (n += (std::uint64_t{1} << 24) / period * period; n < (std::uint64_t{1} << 25);
               n += period) {
            if (n < (std::uint64_t{1} << 24)) continue;
            std::int64_t const num = static_cast<std::int64_t>(b * n) + sigma * k;
            if (num % (std::int64_t{1} << c) != 0) continue;
            std::int64_t const a = num >> c;
            if (a < (1 << 23) || a >= (1 << 24) ||
                (c == 24) != (a >= static_cast<std::int64_t>(b))) {
              continue;
            }
            float const x = static_cast<float>(a) * 0x1p-23f;
            t.add(x, s, d(x));
          }
        }
      }
    }
  }
  report("Markstein candidates", t);
  CHECK(t.pairs > 25'000'000u);
  CHECK(t.v_differ == 0u);
  CHECK(t.codes_differ == 0u);
}

TEST_CASE("quotient: every x / scale near 2^-150, where the quotient rounds to 0 or not") {
  // x over every significand of [2^-110, 2^-109), scale over the 9 floats nearest x 2^150.
  tally t;
  for (std::uint32_t m = 0; m < (1u << 23); ++m) {
    float const x = bits_float((127u - 110u) << 23 | m);
    float s = bits_float(float_bits(x) + (150u << 23));
    for (int j = 0; j < 4; ++j) s = std::nextafter(s, 0.0f);
    for (int j = 0; j < 9; ++j, s = std::nextafter(s, FLT_MAX)) {
      numeric::scale_divisor const d(s);
      t.add(x, s, d(x));
      t.add(-x, s, d(-x));
    }
  }
  report("quotients near 2^-150", t);
  CHECK(t.pairs == 9u * 2u * (1u << 23));
  CHECK(t.codes_differ == 0u);
}

TEST_CASE("quotient: x swept over bit patterns for scales of every family") {
  std::vector<float> const scales = {1.0f,
                                     0x1.555556p-2f,
                                     0x1.fffffep+0f,
                                     0x1.921fb6p+1f,
                                     0x1.4cp+3f /* bf16 */,
                                     0x1p-126f,
                                     0x1.fffffep-126f,
                                     0x1.000002p-126f,
                                     0x1p+127f,
                                     0x1.fffffep+127f,
                                     0x1.fep+127f /* bf16 max */,
                                     0x1.2492p+119f /* ~FLT_MAX / 448 */,
                                     0x1.3a7p-70f,
                                     0x1.0p+64f,
                                     0x1.fffffep+64f,
                                     0x1p-63f,
                                     0x1.fffffep-64f};
  // Every pattern for two scales (the first with the scalar divisor too), a stride for the rest.
  tally t = sweep(scales[1], 0, 1, false);
  t.add(sweep(scales[2], 0, 1, false));
  t.add(sweep(scales[3], 0, 4099, true));
  t.add(sweep_all(scales, 509));
  report("x sweeps", t);
  CHECK(t.v_differ_inside == 0u);
  CHECK(t.codes_differ == 0u);
}

TEST_CASE("quotient: random x and scales, codes compared directly") {
  std::mt19937_64 rng(20261130);
  std::uniform_real_distribution<float> in_range(-300.0f, 300.0f);
  tally t;
  std::uint64_t code_checks = 0, code_differ = 0;
  for (int i = 0; i < 24'000'000; ++i) {
    float const s = random_scale(rng);
    // Half the x anywhere, half a quotient where the codes are decided.
    float const x = i % 2 ? bits_float(static_cast<std::uint32_t>(rng())) : s * in_range(rng);
    numeric::scale_divisor const d(s);
    t.add(x, s, d(x));
    if (i % 16 == 0) {
      group_encoding const g(group_params{s, static_cast<std::int32_t>(rng() % 256u)});
      float const u = static_cast<float>(rng() % 4u == 0 ? 0u : rng() >> 40) * 0x1p-24f;
      float const ref = x / s;
      ++code_checks;
      code_differ += encode_nearest<int_sym<8>>(x, g) != numeric::nearest_code<int_sym<8>>(ref, {});
      code_differ += encode_stochastic<int_sym<4>>(x, g, u) !=
                     numeric::stochastic_code<int_sym<4>>(ref, {}, u);
      code_differ += encode_stochastic<uint_asym<8>>(x, g, u) !=
                     numeric::stochastic_code<uint_asym<8>>(ref, g.params, u);
      code_differ += encode_nearest<fp8_e4m3>(x, g) != numeric::nearest_code<fp8_e4m3>(ref, {});
      code_differ +=
          encode_stochastic<fp8_e5m2>(x, g, u) != numeric::stochastic_code<fp8_e5m2>(ref, {}, u);
    }
  }
  report("random pairs", t);
  CHECK(t.v_differ_inside == 0u);
  MESSAGE(code_checks << " pairs encoded in 5 formats, " << code_differ << " codes differ");
  CHECK(t.codes_differ == 0u);
  CHECK(code_differ == 0u);
}

TEST_CASE("quotient: zero, infinite and NaN x, extreme scales") {
  float const inf = INFINITY;
  std::vector<float> const xs = {0.0f,    -0.0f,     inf,        -inf,    NAN,
                                 -NAN,    0x1p-149f, -0x1p-149f, FLT_MIN, -FLT_MIN,
                                 FLT_MAX, -FLT_MAX,  0x1p-148f,  1.0f,    -1.0f};
  std::vector<float> const scales = {0x1p-126f, 0x1.fffffep-126f, 1.0f,    0x1.fffffep+0f,
                                     0x1p127f,  0x1.fe0000p+127f, FLT_MAX, 0x1.2492p+119f};
  tally t;
  for (float s : scales) {
    numeric::scale_divisor const d(s);
    for (float x : xs) {
      t.add(x, s, d(x));
      float const v = d(x);
      // The sign of a zero quotient is an FP8 code's sign bit.
      if (x == 0.0f) CHECK(float_bits(v) == float_bits(x / s));
      if (x == inf) CHECK(v == inf);
      if (x == -inf) CHECK(v == -inf);
      if (x != x) CHECK(v != v);
    }
  }
  CHECK(t.codes_differ == 0u);
  // A zero scale is never divided by: every code is that of zero.
  group_encoding const zero(group_params{0.0f, 3});
  CHECK(encode_nearest<uint_asym<4>>(5.0f, zero) == 3u);
  CHECK(encode_stochastic<fp8_e4m3>(-5.0f, zero, 0.5f) == 0u);
}

TEST_CASE("quotient: every x for 256 scales (long; run with --no-skip)" * doctest::skip()) {
  std::mt19937_64 rng(7);
  std::vector<float> scales;
  for (int i = 0; i < 256; ++i) scales.push_back(random_scale(rng));
  tally const t = sweep_all(scales, 1);
  report("every x, 256 scales", t);
  CHECK(t.v_differ_inside == 0u);
  CHECK(t.codes_differ == 0u);
}
