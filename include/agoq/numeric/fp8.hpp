/// \file
/// FP8 E4M3 and E5M2 (OCP 8-bit floating point) encoding and decoding on the bits, shared by the
/// host and the device so both produce identical codes.
#pragma once

#include <cstdint>

#include "bits.hpp"

namespace agoq::numeric {

/// The parameters of an OCP FP8 format. `max_code` is the magnitude code of the largest finite
/// value (0x7e for E4M3, whose 0x7f is NaN; 0x7b for E5M2, whose larger codes are Inf/NaN).
struct fp8_format {
  int mantissa_bits;
  int exponent_bias;
  std::uint8_t max_code;
  float max_value;

  /// Float bits of the smallest normal FP8 value, 2^(1 - bias): below it the code is subnormal.
  AGOQ_HOST_DEVICE constexpr std::uint32_t min_normal_bits() const noexcept {
    return (127u + 1u - static_cast<std::uint32_t>(exponent_bias)) << 23;
  }
  /// Float bits of the subnormal step (the smallest positive value), 2^(1 - bias - mantissa_bits).
  AGOQ_HOST_DEVICE constexpr std::uint32_t step_bits() const noexcept {
    return (127u + 1u - static_cast<std::uint32_t>(exponent_bias) -
            static_cast<std::uint32_t>(mantissa_bits))
           << 23;
  }
  /// Float bits of 1 / (subnormal step) = 2^(bias - 1 + mantissa_bits); multiplying by it is
  /// exact, and gives a subnormal magnitude in units of the step.
  AGOQ_HOST_DEVICE constexpr std::uint32_t inv_step_bits() const noexcept {
    return (127u + static_cast<std::uint32_t>(exponent_bias) - 1u +
            static_cast<std::uint32_t>(mantissa_bits))
           << 23;
  }
  /// Float mantissa bits an FP8 normal value drops.
  AGOQ_HOST_DEVICE constexpr std::uint32_t drop() const noexcept {
    return 23u - static_cast<std::uint32_t>(mantissa_bits);
  }
  /// What to subtract from (float bits >> drop()) to get the FP8 magnitude code of a normal value.
  AGOQ_HOST_DEVICE constexpr std::uint32_t rebias() const noexcept {
    return (127u - static_cast<std::uint32_t>(exponent_bias)) << mantissa_bits;
  }
};

/// E4M3: 4 exponent bits, 3 mantissa bits, bias 7, largest finite 448, no infinities.
inline constexpr fp8_format fp8_e4m3_format{3, 7, 0x7e, 448.0f};
/// E5M2: 5 exponent bits, 2 mantissa bits, bias 15, largest finite 57344.
inline constexpr fp8_format fp8_e5m2_format{2, 15, 0x7b, 57344.0f};

/// Decodes the magnitude bits (the low 7 bits) of an FP8 code into a non-negative float. Exact.
AGOQ_HOST_DEVICE constexpr float fp8_magnitude_to_float(std::uint32_t mag, fp8_format f) noexcept {
  std::uint32_t const man_mask = (1u << f.mantissa_bits) - 1u;
  std::uint32_t const exp = mag >> f.mantissa_bits;
  std::uint32_t const man = mag & man_mask;
  if (exp == 0) {
    // Subnormal: man * 2^(1 - bias - mantissa_bits); a power-of-two multiply, exact.
    return static_cast<float>(man) * bits_float(f.step_bits());
  }
  std::uint32_t const exp32 = exp + 127u - static_cast<std::uint32_t>(f.exponent_bias);
  return bits_float((exp32 << 23) | (man << (23 - f.mantissa_bits)));
}

/// Decodes an FP8 code (sign bit 7) into a float. Codes agoq never writes (NaN, Inf) decode to
/// what the OCP format says they are. Exact. Without a branch (the device kernels' decode): the
/// code's sign, exponent and mantissa bits moved into a float's, whose value is then the FP8 value
/// times 2^(bias - 127) (an FP8 subnormal lands on a float subnormal with the same significand),
/// times 2^(127 - bias), exact; the codes past max_code (NaN, and E5M2's ±Inf) by a mask. Host
/// and device.
AGOQ_HOST_DEVICE constexpr float fp8_to_float(std::uint8_t code, fp8_format f) noexcept {
  auto const bias = static_cast<std::uint32_t>(f.exponent_bias);
  std::uint32_t const sign = (std::uint32_t{code} & 0x80u) << 24;
  std::uint32_t const mag = std::uint32_t{code} & 0x7fu;
  float const moved =
      bits_float(sign | (mag << (23 - f.mantissa_bits))) * bits_float((254u - bias) << 23);
  bool const is_inf = f.mantissa_bits == 2 && mag == 0x7cu;
  std::uint32_t const special = sign | (is_inf ? 0x7f800000u : 0x7fc00000u);
  std::uint32_t const is_special = all_ones_if(mag > f.max_code);
  return bits_float(select_bits(is_special, special, float_bits(moved)));
}

/// The magnitude code of FP8 stochastic rounding of the magnitude with float bits `a` (not NaN)
/// under the draw u in [0, 1): the magnitude lo truncated toward zero (saturating at the largest
/// finite value), plus one when lo is below the largest finite value and
/// (1 - u) * gap <= a - lo, where gap is the distance from lo to the next FP8 magnitude. Both sides
/// are exact (1 - u has 24 bits and gap is a power of two; a - lo is a Sterbenz difference), so
/// the comparison is the real one: the magnitude rounds up with probability
/// floor(2^24 (a - lo) / gap) / 2^24. Written without a branch or a select of floats (host and
/// device; the ranges selected by masks, so that loops calling it vectorize): lo and gap come
/// from a's bits in the normal range (the dropped mantissa bits cleared; gap = 2^(e - mantissa
/// bits) for a's exponent e, which is also the gap below the next binade) and from the exact
/// power-of-two multiply trunc(a / step) in the subnormal range (gap = the subnormal step), and the
/// result is clamped to max_code, which covers every a at or past the largest finite value, +Inf
/// included (whose a - lo is NaN, so it never rounds up). Host and device.
AGOQ_HOST_DEVICE constexpr std::uint32_t fp8_stochastic_magnitude(std::uint32_t a, float u,
                                                                  fp8_format f) noexcept {
  float const af = bits_float(a);
  std::uint32_t const min_normal = f.min_normal_bits();
  std::uint32_t const is_normal = all_ones_if(a >= min_normal);
  // Subnormal range: trunc(a / step), on a capped at the smallest normal value so that the
  // conversion stays in range for every a.
  float const below = bits_float(a < min_normal ? a : min_normal);
  auto const sub =
      static_cast<std::uint32_t>(static_cast<std::int32_t>(below * bits_float(f.inv_step_bits())));
  std::uint32_t const step = f.step_bits();
  std::uint32_t const lo = select_bits(
      is_normal, a & ~((1u << f.drop()) - 1u),
      float_bits(static_cast<float>(static_cast<std::int32_t>(sub)) * bits_float(step)));
  std::uint32_t const gap = select_bits(
      is_normal, (a & 0x7f800000u) - (static_cast<std::uint32_t>(f.mantissa_bits) << 23), step);
  std::uint32_t mag = select_bits(is_normal, (a >> f.drop()) - f.rebias(), sub);
  mag += (1.0f - u) * bits_float(gap) <= af - bits_float(lo) ? 1u : 0u;
  return mag < f.max_code ? mag : f.max_code;
}

/// float -> FP8 code, round to nearest even, saturating to the largest finite value (±Inf too);
/// NaN encodes to +0 (the code of real zero, DESIGN §4). Host and device. Branch-free, the
/// ranges selected by masks (so that loops calling it vectorize): in the normal range the dropped
/// mantissa bits are rounded to even on the integer bits; in the subnormal range the magnitude
/// times 1 / step (exact; a is capped at the smallest normal value, so the product is at most
/// 2^mantissa_bits) is rounded to an integer (rne_small_bits); both then saturate at max_code,
/// which covers every value at or past the largest finite one, +Inf included.
AGOQ_HOST_DEVICE constexpr std::uint8_t float_to_fp8_rne_sat(float x, fp8_format f) noexcept {
  std::uint32_t const u = float_bits(x);
  std::uint32_t const sign = (u >> 24) & 0x80u;
  std::uint32_t const a = u & 0x7fffffffu;
  std::uint32_t const min_normal = f.min_normal_bits();
  std::uint32_t const rounded = a + ((1u << (f.drop() - 1u)) - 1u) + ((a >> f.drop()) & 1u);
  std::uint32_t const normal = (rounded >> f.drop()) - f.rebias();
  float const capped = bits_float(a < min_normal ? a : min_normal);
  std::uint32_t const sub = rne_small_bits(capped * bits_float(f.inv_step_bits()));
  std::uint32_t mag = select_bits(all_ones_if(a < min_normal), sub, normal);
  mag = mag < f.max_code ? mag : f.max_code;
  return static_cast<std::uint8_t>((sign | mag) & all_ones_if(a <= 0x7f800000u));
}

}  // namespace agoq::numeric
