// The vector fast paths of the CPU executor against its portable loops, byte for byte: the row
// path (groups of one row, codes packed in registers), the unmasked statistics with their
// non-finite fallback, the vector Philox (AVX-512 and AVX2), and every code family's encoder and
// decoder. Also built for x86-64-v3 (quantize_avx2_isa_test), where the same cases check the
// AVX2 row path (simd_avx2.hpp) and the AVX2 draws against the portable loops.
#include <agoq/agoq.hpp>
#include <agoq/detail/host/simd.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "quantized_fields.hpp"

using namespace agoq;
namespace h = agoq::detail::host;

namespace {

using agoq::test::portable;

// Values spread over many binades with ties at step 0.25, signed zeros, subnormals, values at
// the fp8 saturation edge and, with probability `special`, NaN and ±Inf. Some 32-element runs
// are all zero or constant, so that whole groups have a zero range.
template <class T>
std::vector<T> values(std::int64_t n, std::uint64_t seed, bool special) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(n));
  int run = 0;
  float spread = 1.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) {
      run = static_cast<int>(gen() % 8);
      spread = std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20);
    }
    float f = normal(gen) * spread;
    if (run == 0) f = 0.0f;
    if (run == 1) f = 1.5f;
    switch (gen() % 24) {
      case 0:
        f = (static_cast<float>(gen() % 17) - 8.0f + 0.5f) * 0.25f;
        break;
      case 1:
        f = special ? std::numeric_limits<float>::quiet_NaN() : f;
        break;
      case 2:
        f = special ? (gen() & 1 ? 1.0f : -1.0f) * HUGE_VALF : f;
        break;
      case 3:
        f = (gen() & 1) ? 0.0f : -0.0f;
        break;
      case 4:
        f = std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 1000);
        break;
      case 5:
        f = (gen() & 1 ? 448.0f : -57344.0f) * spread;
        break;
      default:
        break;
    }
    x[static_cast<std::size_t>(i)] = numeric::from_float<T>(f);
  }
  return x;
}

template <class T>
std::vector<std::uint16_t> raw(std::vector<T> const& y) {
  std::vector<std::uint16_t> r;
  for (T const& v : y) {
    auto const b = h::bits_of(v);
    r.push_back(static_cast<std::uint16_t>(b));
    if constexpr (sizeof(T) == 4) r.push_back(static_cast<std::uint16_t>(b >> 16));
  }
  return r;
}

// Quantize with both executors (same bytes, same count), then dequantize and fake-quantize into
// every element type with both (same bits).
template <class T>
void check_scheme(std::string const& name, std::int64_t rows, std::int64_t cols, bool special,
                  std::uint64_t offset) {
  CAPTURE(name);
  CAPTURE(rows);
  CAPTURE(cols);
  CAPTURE(offset);
  spec const s = spec::parse(name);
  std::vector<T> const x =
      values<T>(rows * cols, static_cast<std::uint64_t>(rows * 131 + cols), special);
  auto const in = matrix_view<T const>(x.data(), rows, cols);
  quantized_tensor a(s, rows, cols);
  quantized_tensor b(s, rows, cols);
  std::memset(a.data(), 0xa5, static_cast<std::size_t>(a.bytes()));
  std::memset(b.data(), 0x5a, static_cast<std::size_t>(b.bytes()));
  quantize_options const opt{0x1234abcd9876ull, offset};
  std::int64_t const na = quantize(portable, in, a.view(), opt);
  std::int64_t const nb = quantize(host, in, b.view(), opt);
  REQUIRE(na == nb);
  quantized_layout const l = a.layout();
  REQUIRE(std::memcmp(a.data(), b.data(), static_cast<std::size_t>(l.codes_bytes)) == 0);
  REQUIRE(std::memcmp(a.data() + l.scales_offset, b.data() + l.scales_offset,
                      static_cast<std::size_t>(l.scales_bytes)) == 0);
  REQUIRE(std::memcmp(a.data() + l.zero_points_offset, b.data() + l.zero_points_offset,
                      static_cast<std::size_t>(l.zero_points_bytes)) == 0);

  auto const decode_both = [&](auto tag) {
    using Out = decltype(tag);
    std::vector<Out> ya(x.size()), yb(x.size());
    REQUIRE(
        dequantize(portable, std::as_const(a).view(), matrix_view<Out>(ya.data(), rows, cols)) ==
        dequantize(host, std::as_const(a).view(), matrix_view<Out>(yb.data(), rows, cols)));
    REQUIRE(raw(ya) == raw(yb));
    REQUIRE(fake_quantize(portable, s, in, matrix_view<Out>(ya.data(), rows, cols), opt) ==
            fake_quantize(host, s, in, matrix_view<Out>(yb.data(), rows, cols), opt));
    REQUIRE(raw(ya) == raw(yb));
  };
  decode_both(float{});
  decode_both(bfloat16{});
  decode_both(half{});
}

std::vector<std::string> const& codes() {
  static std::vector<std::string> const c = {"int8", "int4", "int2"};
  return c;
}

template <class T>
void sweep(std::vector<std::string> const& groupings,
           std::vector<std::pair<std::int64_t, std::int64_t>> const& shapes) {
  std::vector<std::string> names;
  for (std::string const& g : groupings) {
    for (char const* r : {"rne", "sr"}) {
      for (char const* sc : {"f32", "bf16", "e8m0"}) {
        for (std::string const& c : codes()) {
          names.push_back(c + "_" + g + "_sym_" + r + "_" + std::string(sc));
          names.push_back(c + "_" + g + "_asym_" + r + "_" + std::string(sc));
        }
        names.push_back("fp8e4m3_" + g + "_" + r + "_" + std::string(sc));
        names.push_back("fp8e5m2_" + g + "_" + r + "_" + std::string(sc));
      }
    }
  }
  for (std::string const& name : names) {
    for (auto [rows, cols] : shapes) {
      check_scheme<T>(name, rows, cols, true, 3);
      check_scheme<T>(name, rows, cols, false, 0);
    }
  }
}

}  // namespace

// Row path: group sizes that are and are not multiples of the 32-element step, odd groups (whose
// 4-bit codes start mid-byte, so the chunk path takes them), a group wider than the row.
TEST_CASE_TEMPLATE("row-path quantize and dequantize equal the portable executor", T, float,
                   bfloat16, half) {
  sweep<T>({"g128", "g32", "g48", "g7", "g20", "row", "g5000"},
           {{1, 1}, {1, 33}, {3, 128}, {2, 257}, {5, 300}, {1, 4099}});
}

// Chunk path (groups spanning rows) with the vector segment loops.
TEST_CASE_TEMPLATE("chunk-path quantize and dequantize equal the portable executor", T, float,
                   bfloat16) {
  sweep<T>({"b3x5", "col", "tensor"}, {{7, 13}, {4, 129}});
}

TEST_CASE("the benchmarked schemes equal the portable executor on a large tensor") {
  for (char const* name :
       {"int8_g128_sym_rne_f32", "int4_g128_sym_rne_f32", "int8_g128_sym_sr_f32",
        "int8_g128_asym_rne_f32", "int4_g128_asym_rne_f32", "fp8e4m3_g32_rne_e8m0"}) {
    check_scheme<bfloat16>(name, 16, 8192, true, 0);
    check_scheme<float>(name, 16, 8192, false, 5);
  }
}

TEST_CASE("vector Philox draws equal the portable ones at any start, across counter wraps") {
  std::vector<std::uint64_t> const firsts = {0,
                                             1,
                                             2,
                                             3,
                                             61,
                                             (std::uint64_t{1} << 34) - 4 * 10 - 3,
                                             (std::uint64_t{1} << 34) - 4 * 16,
                                             (std::uint64_t{1} << 34) - 4 * 8,
                                             (std::uint64_t{5} << 34) - 1,
                                             0xfffffffffffffff0ull};
  for (std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{0x0123456789abcdefull}}) {
    for (std::uint64_t first : firsts) {
      for (std::int64_t n : {1, 3, 4, 31, 32, 33, 63, 64, 65, 130, 300}) {
        CAPTURE(first);
        CAPTURE(n);
        std::vector<float> a(static_cast<std::size_t>(n));
        h::uniforms(seed, first, n, a.data());
        // The draws the executor takes, and each vector width compiled here (an AVX-512 build
        // checks its AVX2 draws too).
        auto const check = [&](auto draw) {
          std::vector<float> b(static_cast<std::size_t>(n));
          draw(b.data());
          for (std::int64_t i = 0; i < n; ++i) {
            CAPTURE(i);
            REQUIRE(numeric::float_bits(a[static_cast<std::size_t>(i)]) ==
                    numeric::float_bits(b[static_cast<std::size_t>(i)]));
          }
        };
        check([&](float* u) { h::uniforms_simd(seed, first, n, u); });
#if defined(AGOQ_HOST_AVX512)
        check([&](float* u) { h::uniforms_lanes<16>(seed, first, n, u); });
#endif
#if defined(AGOQ_HOST_AVX2)
        check([&](float* u) { h::uniforms_lanes<8>(seed, first, n, u); });
#endif
      }
    }
  }
}

TEST_CASE_TEMPLATE("vector statistics equal the portable ones with a non-finite value anywhere", T,
                   float, bfloat16, half) {
  for (std::int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 64, 100}) {
    std::vector<T> const base = values<T>(n, static_cast<std::uint64_t>(n), false);
    for (float special : {std::numeric_limits<float>::quiet_NaN(), HUGE_VALF, -HUGE_VALF, 0.0f}) {
      for (std::int64_t at = 0; at < n; at += (n > 20 ? 7 : 1)) {
        std::vector<T> x = base;
        x[static_cast<std::size_t>(at)] = numeric::from_float<T>(special);
        for (int asym = 0; asym < 2; ++asym) {
          h::segment_stats const a = asym ? h::stats_segment<uint_asym<8>>(x.data(), n)
                                          : h::stats_segment<int_sym<8>>(x.data(), n);
          h::segment_stats const b = asym ? h::stats_segment_simd<uint_asym<8>>(x.data(), n)
                                          : h::stats_segment_simd<int_sym<8>>(x.data(), n);
          REQUIRE(a.nonfinite == b.nonfinite);
          REQUIRE(a.any_finite == b.any_finite);
          REQUIRE(numeric::float_bits(a.stats.absmax) == numeric::float_bits(b.stats.absmax));
          REQUIRE(numeric::float_bits(a.stats.min) == numeric::float_bits(b.stats.min));
          REQUIRE(numeric::float_bits(a.stats.max) == numeric::float_bits(b.stats.max));
        }
      }
    }
  }
}

// Decoders on bytes quantize never writes (FP8 NaN codes, E5M2 infinities, asymmetric codes off
// the zero point) and on arbitrary scales: zero, finite, huge (2^108 to 2^127, either side of
// FLT_MAX / 256, above which the vector decoders saturate integer codes at ±FLT_MAX as the
// portable ones do, and below which they skip it), infinite and NaN.
TEST_CASE("vector decoders equal the portable ones on arbitrary stored bytes") {
  std::mt19937 gen(11);
  for (char const* name : {"fp8e4m3_g32_rne_f32", "fp8e5m2_g32_rne_f32", "int8_g64_asym_rne_f32",
                           "int4_g64_asym_rne_f32", "int4_g64_sym_rne_f32", "int8_g64_sym_rne_f32",
                           "fp8e4m3_g7_rne_f32"}) {
    CAPTURE(name);
    std::int64_t const rows = 3;
    std::int64_t const cols = 515;
    quantized_tensor q(spec::parse(name), rows, cols);
    quantized_layout const l = q.layout();
    for (std::int64_t i = 0; i < l.total_bytes; ++i) {
      q.data()[i] = static_cast<std::uint8_t>(gen());
    }
    float const edge = numeric::max_finite_float / 256.0f;
    for (std::int64_t g = 0; g < l.groups(); ++g) {
      float s =
          std::ldexp(static_cast<float>(gen() % 1000 + 1), static_cast<int>(gen() % 200) - 140);
      if (g % 5 == 0) s = 0.0f;
      if (g % 7 == 1)
        s = std::ldexp(static_cast<float>(gen() % 1000 + 1), 98 + static_cast<int>(gen() % 20));
      if (g % 7 == 2) s = g % 2 ? edge : std::nextafter(edge, HUGE_VALF);
      if (g % 11 == 3) s = g % 2 ? HUGE_VALF : std::numeric_limits<float>::quiet_NaN();
      std::memcpy(q.data() + l.scales_offset + 4 * g, &s, 4);
    }
    std::vector<float> a(static_cast<std::size_t>(rows * cols)), b(a.size());
    std::vector<bfloat16> c(a.size()), d(a.size());
    dequantize(portable, std::as_const(q).view(), matrix_view<float>(a.data(), rows, cols));
    dequantize(host, std::as_const(q).view(), matrix_view<float>(b.data(), rows, cols));
    REQUIRE(raw(a) == raw(b));
    dequantize(portable, std::as_const(q).view(), matrix_view<bfloat16>(c.data(), rows, cols));
    dequantize(host, std::as_const(q).view(), matrix_view<bfloat16>(d.data(), rows, cols));
    REQUIRE(raw(c) == raw(d));
  }
}

namespace {

// FP8 stochastic rounding inputs aimed at every branch of numeric::encode_stochastic: values at
// and between neighbouring FP8 points (fractions of a gap in eighths, so that (1 - u) * gap equals
// |v| - lo exactly for some draws), subnormal and float-subnormal magnitudes, the largest finite
// value and beyond, ±Inf, NaN and signed zeros, each with a draw from {0, k / 8, 1 - 2^-24}.
template <class Code, class T>
void fp8_stochastic_inputs(std::int64_t n, float scale, std::uint64_t seed, std::vector<T>& x,
                           std::vector<float>& u) {
  constexpr numeric::fp8_format f = Code::format;
  std::mt19937_64 gen(seed);
  x.resize(static_cast<std::size_t>(n));
  u.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    auto const mag = static_cast<std::uint32_t>(gen() % (f.max_code + 1u));
    float const lo = numeric::fp8_magnitude_to_float(mag, f);
    float const hi = numeric::fp8_magnitude_to_float(mag + 1u, f);
    float a = lo + (hi - lo) * static_cast<float>(gen() % 9) / 8.0f;
    switch (gen() % 16) {
      case 0:
        a = std::numeric_limits<float>::quiet_NaN();
        break;
      case 1:
        a = HUGE_VALF;
        break;
      case 2:
        a = f.max_value * (gen() & 1 ? 1.0f : 1.0625f);
        break;
      case 3:
        a = 0.0f;
        break;
      case 4:
        a = std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 1000);
        break;
      case 5:
        a = std::ldexp(static_cast<float>(gen() % 64), -static_cast<int>(gen() % 30));
        break;
      default:
        break;
    }
    float const v = (gen() & 1) ? -a : a;
    x[static_cast<std::size_t>(i)] = numeric::from_float<T>(v * scale);
    std::uint64_t const d = gen() % 10;
    u[static_cast<std::size_t>(i)] =
        d == 9 ? 1.0f - 5.9604644775390625e-8f : static_cast<float>(d % 9) / 8.0f;
  }
}

template <class Code, class T>
void check_fp8_stochastic() {
  std::vector<float> const scales = {
      0.0f, 1.0f, 0.5f, 1.0f / 448.0f, 0.37f, 3.0e-39f, 1e30f, std::ldexp(1.0f, -126), HUGE_VALF};
  for (float scale : scales) {
    for (std::int64_t n : {1, 15, 16, 17, 31, 32, 33, 100, 1000}) {
      CAPTURE(scale);
      CAPTURE(n);
      std::vector<T> x;
      std::vector<float> u;
      fp8_stochastic_inputs<Code, T>(n, scale, static_cast<std::uint64_t>(n) * 7 + 1, x, u);
      for (std::int32_t zero_point : {0, 3}) {
        group_params const p{scale, zero_point};
        std::vector<std::uint8_t> a(static_cast<std::size_t>(n), 0xa5);
        std::vector<std::uint8_t> b(static_cast<std::size_t>(n), 0x5a);
        h::encode_stochastic_segment<Code>(x.data(), n, p, u.data(), a.data());
        h::encode_stochastic_segment_simd<Code>(x.data(), n, p, u.data(), b.data());
        REQUIRE(a == b);
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("vector FP8 stochastic rounding equals the portable loop on adversarial values",
                   T, float, bfloat16, half) {
  check_fp8_stochastic<fp8_e4m3, T>();
  check_fp8_stochastic<fp8_e5m2, T>();
}

TEST_CASE("vector FP8 stochastic rounding rounds up exactly where the scalar comparison does") {
  // Every E4M3 magnitude, every eighth of its gap, every draw k / 8 (the equality cases) and
  // u = 1 - 2^-24: the vector codes equal numeric::encode_stochastic's.
  std::vector<float> x, u;
  for (std::uint32_t mag = 0; mag < 0x7e; ++mag) {
    float const lo = numeric::fp8_magnitude_to_float(mag, numeric::fp8_e4m3_format);
    float const hi = numeric::fp8_magnitude_to_float(mag + 1u, numeric::fp8_e4m3_format);
    for (int j = 0; j <= 8; ++j) {
      for (int k = 0; k <= 8; ++k) {
        x.push_back(lo + (hi - lo) * static_cast<float>(j) / 8.0f);
        u.push_back(k == 8 ? 1.0f - 5.9604644775390625e-8f : static_cast<float>(k) / 8.0f);
      }
    }
  }
  auto const n = static_cast<std::int64_t>(x.size());
  group_params const p{1.0f, 0};
  std::vector<std::uint8_t> q(x.size());
  h::encode_stochastic_segment_simd<fp8_e4m3>(x.data(), n, p, u.data(), q.data());
  std::int64_t ups = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(q[i] == encode_stochastic<fp8_e4m3>(x[i], p, u[i]));
    ups += q[i] != encode_stochastic<fp8_e4m3>(x[i], p, 0.0f) ? 1 : 0;
  }
  CHECK(ups > 0);
}
