// The bit-level conversions against the CUDA toolkit's own host conversions.
#include <agoq/numeric/element.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include <doctest/doctest.h>

using namespace agoq;
using namespace agoq::numeric;

namespace {

bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Every 4093rd float bit pattern plus the neighbourhoods of the rounding boundaries.
template <class F>
void for_sampled_floats(F&& f) {
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093) f(static_cast<std::uint32_t>(u));
  for (std::uint32_t base : {0x477fe000u, 0x477ff000u, 0x38800000u, 0x33000000u, 0x7f7f8000u}) {
    for (std::uint32_t d = 0; d < 4096; ++d) {
      f(base - 2048 + d);
      f((base - 2048 + d) | 0x80000000u);
    }
  }
}

}  // namespace

TEST_CASE("16-bit to float is exact for every bit pattern") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    float const bf = bf16_bits_to_float(h);
    float const hf = half_bits_to_float(h);
    float const bf_ref = __bfloat162float(cuda::std::bit_cast<bfloat16>(h));
    float const hf_ref = __half2float(cuda::std::bit_cast<half>(h));
    if (is_nan_bits(float_bits(bf_ref))) {
      REQUIRE(is_nan_bits(float_bits(bf)));
    } else {
      REQUIRE(float_bits(bf) == float_bits(bf_ref));
    }
    if (is_nan_bits(float_bits(hf_ref))) {
      REQUIRE(is_nan_bits(float_bits(hf)));
    } else {
      REQUIRE(float_bits(hf) == float_bits(hf_ref));
    }
  }
}

TEST_CASE("float to bfloat16 and half round to nearest even like the toolkit") {
  for_sampled_floats([](std::uint32_t u) {
    float const x = bits_float(u);
    std::uint16_t const bf = float_to_bf16_bits(x);
    std::uint16_t const hf = float_to_half_bits(x);
    std::uint16_t const bf_ref = raw_bits(__float2bfloat16_rn(x));
    std::uint16_t const hf_ref = raw_bits(__float2half_rn(x));
    if (is_nan_bits(u)) {
      REQUIRE((bf & 0x7fffu) > 0x7f80u);
      REQUIRE((hf & 0x7fffu) > 0x7c00u);
    } else {
      INFO("float bits " << u);
      REQUIRE(bf == bf_ref);
      REQUIRE(hf == hf_ref);
    }
  });
}

TEST_CASE("to_float and from_float round-trip every element type") {
  CHECK(to_float(from_float<bfloat16>(1.0f)) == 1.0f);
  CHECK(to_float(from_float<half>(-2.5f)) == -2.5f);
  CHECK(to_float(from_float<float>(0.1f)) == 0.1f);
  // Ties to even: 1 + 2^-8 lies halfway between two bfloat16 values.
  CHECK(to_float(from_float<bfloat16>(1.00390625f)) == 1.0f);
  CHECK(to_float(from_float<bfloat16>(1.01171875f)) == 1.015625f);
  CHECK(to_float(from_float<half>(65520.0f)) == std::numeric_limits<float>::infinity());
  CHECK(std::string(element_name<float>()) == "f32");
  CHECK(std::string(element_name<half>()) == "f16");
  CHECK(std::string(element_name<bfloat16>()) == "bf16");
}
