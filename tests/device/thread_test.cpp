// The thread-level building blocks equal the shared math and the CPU executor's packing.
#include <agoq/device/thread.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include <agoq/detail/host/segment.hpp>
#include <agoq/scheme/dispatch.hpp>

using namespace agoq;
using namespace agoq::device;

namespace {

template <int N>
void check_draws() {
  std::uint64_t const firsts[] = {
      0, 1, 2, 3, 4, 5, 1021, (std::uint64_t{1} << 33) + 3, ~std::uint64_t{0} - 40};
  for (std::uint64_t const first : firsts) {
    float u[N];
    fragment_draws(99, first, u);
    for (int i = 0; i < N; ++i) REQUIRE(u[i] == numeric::uniform_at(99, first + i));
  }
}

}  // namespace

TEST_CASE("fragment_draws equals uniform_at at every starting phase, for any fragment size") {
  check_draws<8>();
  check_draws<1>();
  check_draws<3>();
  check_draws<4>();
  check_draws<5>();
  check_draws<16>();
}

TEST_CASE("fragment_stats skips non-finite values and past-the-end lanes") {
  float const inf = std::numeric_limits<float>::infinity();
  float const v[8] = {1.0f, -3.0f, std::nanf(""), inf, 2.0f, -inf, 100.0f, 100.0f};
  group_stats st;
  bool any = false;
  CHECK(fragment_stats(v, 6, st, any) == 3);
  CHECK(any);
  CHECK(st.absmax == 3.0f);
  CHECK(st.min == -3.0f);
  CHECK(st.max == 2.0f);
  group_stats none;
  bool any2 = false;
  float const w[2] = {std::nanf(""), inf};
  CHECK(fragment_stats(w, 2, none, any2) == 2);
  CHECK_FALSE(any2);
}

TEST_CASE("quantize_fragment and pack_fragment equal the CPU executor's segment loops") {
  std::mt19937 gen(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto check = [&](auto code) {
    using Code = decltype(code);
    for (int trial = 0; trial < 200; ++trial) {
      float v[8];
      for (float& f : v) f = normal(gen);
      group_stats st;
      bool any = false;
      fragment_stats(v, 8, st, any);
      group_params const p = make_group_params<Code, scale_bf16>(st);
      std::uint8_t q[8];
      quantize_fragment<Code, round_nearest>(v, p, 0, 0, q);
      std::uint8_t ref[8];
      detail::host::encode_nearest_segment<Code>(v, 8, p, ref);
      for (int i = 0; i < 8; ++i) REQUIRE(q[i] == ref[i]);
      std::uint8_t qs[8];
      quantize_fragment<Code, round_stochastic>(v, p, 5, 77 + trial, qs);
      float u[8];
      detail::host::uniforms(5, 77 + trial, 8, u);
      std::uint8_t rs[8];
      detail::host::encode_stochastic_segment<Code>(v, 8, p, u, rs);
      for (int i = 0; i < 8; ++i) REQUIRE(qs[i] == rs[i]);
      for (int count : {8, 7, 3, 1}) {
        std::uint64_t const w = pack_fragment<Code::bits>(q, count);
        std::uint8_t bytes[64] = {};  // roomy: g++ 12 warns about its own vector stores
        detail::host::pack_codes(q, count, Code::bits, bytes);
        for (int b = 0; b < 8; ++b) REQUIRE(static_cast<std::uint8_t>(w >> (8 * b)) == bytes[b]);
      }
      std::uint8_t back[8];
      unpack_fragment<Code::bits>(pack_fragment<Code::bits>(q), back);
      for (int i = 0; i < 8; ++i) REQUIRE(back[i] == q[i]);
      float d[8];
      dequantize_fragment<Code>(q, p, d);
      for (int i = 0; i < 8; ++i) REQUIRE(d[i] == decode<Code>(q[i], p));
    }
  };
  check(int_sym<2>{});
  check(int_sym<4>{});
  check(int_sym<8>{});
  check(uint_asym<2>{});
  check(uint_asym<4>{});
  check(uint_asym<8>{});
  check(fp8_e4m3{});
  check(fp8_e5m2{});
}

namespace {

/// fragment_stats as first written (a branch per element, a float comparison for the absmax): the
/// reference of the branch-free form.
template <int N>
int fragment_stats_reference(float const (&v)[N], int count, group_stats& st, bool& any) {
  int nonfinite = 0;
  for (int i = 0; i < N && i < count; ++i) {
    if (!std::isfinite(v[i])) {
      ++nonfinite;
      continue;
    }
    float const a = v[i] < 0.0f ? -v[i] : v[i];
    st.absmax = a > st.absmax ? a : st.absmax;
    st.min = any ? (v[i] < st.min ? v[i] : st.min) : v[i];
    st.max = any ? (v[i] > st.max ? v[i] : st.max) : v[i];
    any = true;
  }
  return nonfinite;
}

/// A value for the adversarial fragments: normal, zeros of both signs, subnormals, NaN, ±Inf,
/// huge and tiny magnitudes.
float adversarial(std::mt19937& gen) {
  float const inf = std::numeric_limits<float>::infinity();
  std::normal_distribution<float> normal(0.0f, 3.0f);
  switch (gen() % 12) {
    case 0:
      return 0.0f;
    case 1:
      return -0.0f;
    case 2:
      return std::nanf("");
    case 3:
      return (gen() & 1) ? inf : -inf;
    case 4:
      return std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 100);
    case 5:
      return std::numeric_limits<float>::max() * ((gen() & 1) ? 0.5f : -1.0f);
    default:
      return normal(gen);
  }
}

bool same_bits(float a, float b) { return numeric::float_bits(a) == numeric::float_bits(b); }

}  // namespace

TEST_CASE("fragment_stats equals the branch-per-element fold, bit for bit, with state carried") {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 20000; ++trial) {
    group_stats st, ref;
    bool any = false, any_ref = false;
    for (int part = 0; part < 2; ++part) {  // two fragments into one state, as a group's lanes do
      float v[8];
      for (float& f : v) f = adversarial(gen);
      int const count = static_cast<int>(gen() % 9);
      CAPTURE(count);
      REQUIRE(fragment_stats(v, count, st, any) ==
              fragment_stats_reference(v, count, ref, any_ref));
      REQUIRE(any == any_ref);
      REQUIRE(same_bits(st.absmax, ref.absmax));
      if (any) {
        REQUIRE(same_bits(st.min, ref.min));
        REQUIRE(same_bits(st.max, ref.max));
      }
    }
  }
}

TEST_CASE("quantize_fragment's divisor gives encode_nearest's and encode_stochastic's codes") {
  // The division-free quotient (numeric::scale_divisor) against the IEEE division of the host
  // loops, on adversarial values, exact ties of the scale, zero and extreme scales.
  std::mt19937 gen(12);
  auto check = [&](auto code) {
    using Code = decltype(code);
    for (int trial = 0; trial < 3000; ++trial) {
      float v[8];
      for (float& f : v) f = adversarial(gen);
      group_stats st;
      bool any = false;
      fragment_stats(v, 8, st, any);
      group_params p = trial % 3 == 0   ? make_group_params<Code, scale_f32>(st)
                       : trial % 3 == 1 ? make_group_params<Code, scale_bf16>(st)
                                        : make_group_params<Code, scale_e8m0>(st);
      if (trial % 50 == 0) p.scale = 0.0f;
      if (trial % 7 == 0 &&
          p.scale != 0.0f) {  // ties: (k + 1/2) scale, exactly where representable
        for (int i = 0; i < 8; ++i) v[i] = (static_cast<float>(i) - 3.5f) * p.scale;
      }
      std::uint8_t q[8], qs[8];
      quantize_fragment<Code, round_nearest>(v, p, 0, 0, q);
      quantize_fragment<Code, round_stochastic>(v, p, 3, 1000 + trial, qs);
      float u[8];
      fragment_draws(3, 1000 + trial, u);
      for (int i = 0; i < 8; ++i) {
        CAPTURE(v[i]);
        CAPTURE(p.scale);
        REQUIRE(q[i] == encode_nearest<Code>(v[i], p));
        REQUIRE(qs[i] == encode_stochastic<Code>(v[i], p, u[i]));
      }
    }
  };
  check(int_sym<2>{});
  check(int_sym<4>{});
  check(int_sym<8>{});
  check(uint_asym<4>{});
  check(uint_asym<8>{});
  check(fp8_e4m3{});
  check(fp8_e5m2{});
}

namespace {

/// nearest_code_in_range against nearest_code for every float of magnitude below qmax + 1/2 (a
/// stride through them, plus a few ulps around every half-integer and integer exactly).
template <class Code>
void check_nearest_code_in_range() {
  group_params const p{1.0f, 0};
  float const limit = static_cast<float>(Code::qmax) + 0.5f;
  std::int64_t differ = 0, checked = 0;
  auto same = [&](float v) {
    for (float s : {v, -v}) {
      if (!(std::fabs(s) < limit)) continue;
      ++checked;
      if (numeric::nearest_code_in_range<Code>(s) != numeric::nearest_code<Code>(s, p)) ++differ;
    }
  };
  std::uint32_t const end = numeric::float_bits(limit);
  for (std::uint32_t b = 0; b < end; b += 5) same(numeric::bits_float(b));
  for (int k = 0; k <= 2 * Code::qmax + 1; ++k) {
    float const center = 0.5f * static_cast<float>(k);  // every integer and half-integer
    float lo = center, hi = center;
    for (int j = 0; j < 4; ++j, lo = std::nextafter(lo, 0.0f), hi = std::nextafter(hi, 1e9f)) {
      same(lo);
      same(hi);
    }
  }
  CHECK(checked > 2 * static_cast<std::int64_t>(end / 5));
  CHECK(differ == 0);
}

/// A group of finite values of one magnitude class, scaled by 2^e (e from the subnormal range to
/// near the float maximum), with exact ties of its scale where they exist.
template <class Code, class Scale>
void check_member_fragments(std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 4000; ++trial) {
    int const e = static_cast<int>(gen() % 270) - 149;
    float v[4][8];
    for (auto& run : v) {
      for (float& f : run) {
        f = std::ldexp(normal(gen), e);
        if (!std::isfinite(f)) f = std::numeric_limits<float>::max();
        if (gen() % 16 == 0) f = (gen() & 1) ? 0.0f : -0.0f;
      }
    }
    group_stats st;
    bool any = false;
    for (auto const& run : v) fragment_stats(run, 8, st, any);
    group_params const p = make_group_params<Code, Scale>(st);
    if (trial % 5 == 0 && p.scale != 0.0f) {  // ties (k + 1/2) scale inside the group's range
      for (int i = 0; i < 8; ++i) {
        int k = i - 4;
        if constexpr (Code::kind == code_kind::int_sym) k = i % (2 * Code::qmax + 1) - Code::qmax;
        float const t = (static_cast<float>(k) + 0.5f) * p.scale;
        if (std::fabs(t) <= st.absmax) v[1][i] = t;
      }
    }
    v[2][0] = st.absmax;  // the extremes
    v[2][1] = -st.absmax;
    for (int r = 0; r < 4; ++r) {
      std::uint8_t q[8], qs[8];
      quantize_member_fragment<Code, round_nearest>(v[r], p, 0, 0, q);
      quantize_member_fragment<Code, round_stochastic>(v[r], p, 5, 64u * trial + 8u * r, qs);
      float u[8];
      fragment_draws(5, 64u * trial + 8u * r, u);
      for (int i = 0; i < 8; ++i) {
        CAPTURE(v[r][i]);
        CAPTURE(p.scale);
        REQUIRE(q[i] == encode_nearest<Code>(v[r][i], p));
        REQUIRE(qs[i] == encode_stochastic<Code>(v[r][i], p, u[i]));
      }
    }
  }
}

template <class Code>
void check_member_fragments_all_scales(std::mt19937& gen) {
  check_member_fragments<Code, scale_f32>(gen);
  check_member_fragments<Code, scale_bf16>(gen);
  check_member_fragments<Code, scale_e8m0>(gen);
}

}  // namespace

/// stochastic_code_in_range against stochastic_code for floats of magnitude up to a little past
/// qmax (a stride through them, and a few ulps around every integer), under draws at the ends of
/// [0, 1) and random ones.
template <class Code>
void check_stochastic_code_in_range() {
  group_params const p{1.0f, 0};
  std::mt19937 gen(16);
  float const top = std::nextafter(static_cast<float>(Code::qmax), 1e9f) * 1.0001f;
  std::int64_t differ = 0, checked = 0;
  auto same = [&](float v, float u) {
    for (float s : {v, -v}) {
      ++checked;
      if (numeric::stochastic_code_in_range<Code>(s, u) !=
          numeric::stochastic_code<Code>(s, p, u)) {
        ++differ;
      }
    }
  };
  float const draws[] = {0.0f, 5.9604644775390625e-8f, 0.5f, 1.0f - 5.9604644775390625e-8f};
  std::uint32_t const end = numeric::float_bits(top);
  for (std::uint32_t b = 0; b < end; b += 211) {
    same(numeric::bits_float(b), draws[b % 4]);
    same(numeric::bits_float(b), numeric::uniform24(static_cast<std::uint32_t>(gen())));
  }
  for (int k = 0; k <= Code::qmax + 1; ++k) {
    float lo = static_cast<float>(k), hi = lo;
    for (int j = 0; j < 4; ++j, lo = std::nextafter(lo, 0.0f), hi = std::nextafter(hi, 1e9f)) {
      for (float u : draws) {
        same(lo, u);
        same(hi, u);
      }
    }
  }
  CHECK(checked > 2 * static_cast<std::int64_t>(end / 211));
  CHECK(differ == 0);
}

TEST_CASE("nearest_code_in_range equals nearest_code below qmax + 1/2") {
  check_nearest_code_in_range<int_sym<2>>();
  check_nearest_code_in_range<int_sym<4>>();
  check_nearest_code_in_range<int_sym<8>>();
}

TEST_CASE("stochastic_code_in_range equals stochastic_code for quotients that are not NaN") {
  check_stochastic_code_in_range<int_sym<2>>();
  check_stochastic_code_in_range<int_sym<4>>();
  check_stochastic_code_in_range<int_sym<8>>();
}

TEST_CASE("quantize_member_fragment gives the division's codes for a group's own values") {
  // Group members only (finite, at most the group's absmax): symmetric codes rounded to nearest
  // skip the NaN test and the clamp; at every scale exponent and scale format, with ties and the
  // group's extremes.
  std::mt19937 gen(13);
  check_member_fragments_all_scales<int_sym<2>>(gen);
  check_member_fragments_all_scales<int_sym<4>>(gen);
  check_member_fragments_all_scales<int_sym<8>>(gen);
  check_member_fragments_all_scales<uint_asym<4>>(gen);
  check_member_fragments_all_scales<fp8_e4m3>(gen);
}

namespace {

template <class Code>
void check_dequantize_fragment(std::mt19937& gen) {
  // The largest scale whose products with every finite code (-2^(b-1) included) stay finite.
  float largest = 0.0f;
  if constexpr (is_fp8_code<Code>) {
    largest = Code::format.max_value;
  } else {
    largest = static_cast<float>(Code::qmax + 1);
  }
  float const big = std::numeric_limits<float>::max() / largest;
  std::vector<float> scales = {0.0f,
                               1.0f,
                               0.5f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::infinity(),
                               std::nanf(""),
                               big};
  for (int j = 0; j < 6; ++j) {  // around the largest scale whose products stay finite
    scales.push_back(std::nextafter(scales.back(), std::numeric_limits<float>::max()));
  }
  for (float s = big; scales.size() < 20;) scales.push_back(s = std::nextafter(s, 0.0f));
  for (std::size_t i = 0, n = scales.size(); i < n; ++i) scales.push_back(-scales[i]);
  for (int i = 0; i < 200; ++i) {
    scales.push_back(
        std::ldexp(static_cast<float>(gen() % 1000 + 1), static_cast<int>(gen() % 250) - 140));
  }
  // Every code (NaN and Inf codes of FP8, and -2^(b-1), which quantize never writes, included),
  // eight to a fragment.
  constexpr std::uint32_t codes = 1u << Code::bits;
  for (float s : scales) {
    for (std::uint32_t c0 = 0; c0 < codes; c0 += 8) {
      std::uint8_t q[8];
      for (std::uint32_t i = 0; i < 8; ++i) q[i] = static_cast<std::uint8_t>((c0 + i) % codes);
      float v[8];
      dequantize_fragment<Code>(q, group_params{s, 0}, v);
      for (int i = 0; i < 8; ++i) {
        CAPTURE(s);
        CAPTURE(int{q[i]});
        float const ref = decode<Code>(q[i], group_params{s, 0});
        REQUIRE((same_bits(v[i], ref) || (std::isnan(v[i]) && std::isnan(ref))));
      }
    }
  }
}

}  // namespace

TEST_CASE("dequantize_fragment equals decode, saturation included") {
  std::mt19937 gen(14);
  check_dequantize_fragment<int_sym<2>>(gen);
  check_dequantize_fragment<int_sym<4>>(gen);
  check_dequantize_fragment<int_sym<8>>(gen);
  check_dequantize_fragment<fp8_e4m3>(gen);
  check_dequantize_fragment<fp8_e5m2>(gen);
}

TEST_CASE("dequantize_packed equals unpack_fragment then dequantize_fragment") {
  std::mt19937_64 gen(15);
  auto check = [&](auto code) {
    using Code = decltype(code);
    constexpr int n = 64 / Code::bits < 8 ? 64 / Code::bits : 8;
    for (float s : {1.0f, 0.75f, 3e-20f, std::numeric_limits<float>::max() / 128.0f,
                    std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                    std::nanf(""), 0.0f, -0.75f, -std::numeric_limits<float>::max(),
                    -std::numeric_limits<float>::infinity()}) {
      for (int trial = 0; trial < 2000; ++trial) {
        std::uint64_t const w = gen();
        std::uint8_t q[n];
        unpack_fragment<Code::bits>(w, q);
        float ref[n], v[n];
        dequantize_fragment<Code>(q, group_params{s, 0}, ref);
        dequantize_packed<Code>(w, group_params{s, 0}, v);
        for (int i = 0; i < n; ++i) {
          CAPTURE(s);
          CAPTURE(w);
          REQUIRE((same_bits(v[i], ref[i]) || (std::isnan(v[i]) && std::isnan(ref[i]))));
        }
      }
    }
  };
  check(int_sym<2>{});
  check(int_sym<4>{});
  check(int_sym<8>{});
  check(uint_asym<4>{});
  check(fp8_e4m3{});
}
