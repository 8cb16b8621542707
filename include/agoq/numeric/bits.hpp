/// \file
/// Bit-level views of floats shared by every numeric step (host and device).
#pragma once

#include <cstdint>

#include <cuda/std/bit>

#include "../config.hpp"

namespace agoq::numeric {

/// The IEEE-754 bits of a float. Host and device.
AGOQ_HOST_DEVICE constexpr std::uint32_t float_bits(float x) noexcept {
  return cuda::std::bit_cast<std::uint32_t>(x);
}

/// The float whose IEEE-754 bits are `u`. Host and device.
AGOQ_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept {
  return cuda::std::bit_cast<float>(u);
}

/// Smallest positive normal float, 2^-126. Scales below it are treated as zero (DESIGN §4).
inline constexpr float min_normal_float = 1.17549435e-38f;
/// Largest finite float.
inline constexpr float max_finite_float = 3.40282347e+38f;

/// True when `x` is neither NaN nor infinite; exact and independent of compiler flags.
AGOQ_HOST_DEVICE constexpr bool is_finite(float x) noexcept {
  return (float_bits(x) & 0x7fffffffu) < 0x7f800000u;
}

/// Round-half-to-even of a float whose magnitude is at most 2^22, by the magic-number method.
/// Exact, branch-free, and vectorizable; the caller clamps the argument first.
AGOQ_HOST_DEVICE inline float rne_small(float v) noexcept {
  // 1.5 * 2^23: adding it leaves no fraction bits, so the addition itself rounds to even.
  constexpr float magic = 12582912.0f;
  float const t = v + magic;
  return t - magic;
}

}  // namespace agoq::numeric
