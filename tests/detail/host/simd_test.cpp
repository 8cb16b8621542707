// The AVX-512 segment loops against the portable ones, byte for byte, on adversarial data.
#include <agoq/detail/host/simd.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;
namespace h = agoq::detail::host;

namespace {

// Normal values, ties at the chosen scale, zeros of both signs, subnormals, NaN and ±Inf.
template <class T>
std::vector<T> adversarial(std::int64_t n, float scale, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) {
    float f = normal(gen);
    switch (gen() % 16) {
      case 0:
        f = (static_cast<float>(gen() % 17) - 8.0f + 0.5f) * scale;
        break;  // ties
      case 1:
        f = std::numeric_limits<float>::quiet_NaN();
        break;
      case 2:
        f = (gen() & 1 ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
        break;
      case 3:
        f = (gen() & 1) ? 0.0f : -0.0f;
        break;
      case 4:
        f = std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 1000);
        break;
      default:
        break;
    }
    v = numeric::from_float<T>(f);
  }
  return x;
}

template <class Code, class T>
void check_code() {
  for (std::int64_t n : {1, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 1000}) {
    std::vector<T> const x = adversarial<T>(n, 0.25f, static_cast<std::uint64_t>(n));
    h::segment_stats const a = h::stats_segment<Code>(x.data(), n);
    h::segment_stats const b = h::stats_segment_simd<Code>(x.data(), n);
    REQUIRE(a.nonfinite == b.nonfinite);
    REQUIRE(a.any_finite == b.any_finite);
    REQUIRE(numeric::float_bits(a.stats.absmax) == numeric::float_bits(b.stats.absmax));
    REQUIRE(numeric::float_bits(a.stats.min) == numeric::float_bits(b.stats.min));
    REQUIRE(numeric::float_bits(a.stats.max) == numeric::float_bits(b.stats.max));
    for (group_params const p :
         {group_params{0.25f, 0}, make_group_params<Code, scale_f32>(a.stats),
          group_params{0.0f, 0}, group_params{1e-30f, 0}}) {
      std::vector<std::uint8_t> qa(x.size()), qb(x.size());
      h::encode_nearest_segment<Code>(x.data(), n, p, qa.data());
      h::encode_nearest_segment_simd<Code>(x.data(), n, p, qb.data());
      REQUIRE(qa == qb);
      std::vector<T> ya(x.size()), yb(x.size());
      h::decode_segment<Code>(qa.data(), n, p, ya.data());
      h::decode_segment_simd<Code>(qa.data(), n, p, yb.data());
      for (std::int64_t i = 0; i < n; ++i) REQUIRE(h::bits_of(ya[i]) == h::bits_of(yb[i]));
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("SIMD segment loops equal the portable ones (float)", Code, int_sym<2>,
                   int_sym<4>, int_sym<8>, uint_asym<4>, uint_asym<8>, fp8_e4m3, fp8_e5m2) {
  check_code<Code, float>();
}

TEST_CASE_TEMPLATE("SIMD segment loops equal the portable ones (bfloat16)", Code, int_sym<2>,
                   int_sym<4>, int_sym<8>, uint_asym<4>, fp8_e4m3) {
  check_code<Code, bfloat16>();
}

TEST_CASE_TEMPLATE("SIMD segment loops equal the portable ones (half)", Code, int_sym<4>,
                   int_sym<8>, uint_asym<8>, fp8_e5m2) {
  check_code<Code, half>();
}

TEST_CASE("SIMD decoding of corrupted scales matches too") {
  std::vector<std::uint8_t> q(40);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::uint8_t>(i * 7);
  float const inf = std::numeric_limits<float>::infinity();
  for (float s : {inf, std::numeric_limits<float>::quiet_NaN(), 3e38f}) {
    std::vector<bfloat16> a(q.size()), b(q.size());
    h::decode_segment<int_sym<8>>(q.data(), 40, group_params{s, 0}, a.data());
    h::decode_segment_simd<int_sym<8>>(q.data(), 40, group_params{s, 0}, b.data());
    for (std::size_t i = 0; i < q.size(); ++i) REQUIRE(h::bits_of(a[i]) == h::bits_of(b[i]));
    std::vector<half> c(q.size()), d(q.size());
    h::decode_segment<int_sym<8>>(q.data(), 40, group_params{s, 0}, c.data());
    h::decode_segment_simd<int_sym<8>>(q.data(), 40, group_params{s, 0}, d.data());
    for (std::size_t i = 0; i < q.size(); ++i) REQUIRE(h::bits_of(c[i]) == h::bits_of(d[i]));
  }
}

TEST_CASE("SIMD packing equals the portable packing") {
  std::mt19937 gen(5);
  for (int bits : {2, 4, 8}) {
    for (std::int64_t n : {1, 63, 64, 65, 128, 129, 4096, 4099}) {
      std::vector<std::uint8_t> q(static_cast<std::size_t>(n));
      for (auto& v : q) v = static_cast<std::uint8_t>(gen() & numeric::code_mask(bits));
      std::size_t const bytes = static_cast<std::size_t>((n * bits + 7) / 8);
      std::vector<std::uint8_t> a(bytes), b(bytes);
      h::pack_codes(q.data(), n, bits, a.data());
      h::pack_codes_simd(q.data(), n, bits, b.data());
      REQUIRE(a == b);
      std::vector<std::uint8_t> ua(q.size()), ub(q.size());
      h::unpack_codes(a.data(), n, bits, ua.data());
      h::unpack_codes_simd(a.data(), n, bits, ub.data());
      REQUIRE(ua == ub);
      REQUIRE(ua == q);
    }
  }
}

TEST_CASE("prefetch hints: off on AMD processors, on elsewhere") {
  // The vendor as Linux reports it, against prefetch_hints' own cpuid.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string vendor;
  while (vendor.empty() && std::getline(cpuinfo, line))
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 1);
  if (vendor.empty()) {
    MESSAGE("no vendor_id in /proc/cpuinfo: prefetch_hints() is " << h::prefetch_hints());
    return;
  }
  CAPTURE(vendor);
  CHECK(h::prefetch_hints() == (vendor.find("AuthenticAMD") == std::string::npos));
}

TEST_CASE("the SIMD loops are compiled where AVX-512 is enabled, the AVX2 ones where AVX2 is") {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  CHECK(h::simd_available);
  CHECK(std::string(h::simd_isa) == "AVX-512");
#else
  CHECK_FALSE(h::simd_available);
  MESSAGE("AVX-512 not enabled at compile time: the SIMD loops forward to the portable ones");
#if defined(__AVX2__)
  CHECK(std::string(h::simd_isa) == "AVX2");
#else
  CHECK(std::string(h::simd_isa) == "portable");
#endif
#endif
}
