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

/// All ones where `c` holds, else 0: a mask to select bits with, where a select of floats would
/// keep g++ (under its default -ftrapping-math) from vectorizing the loop around it. Host and
/// device.
AGOQ_HOST_DEVICE constexpr std::uint32_t all_ones_if(bool c) noexcept {
  return 0u - static_cast<std::uint32_t>(c);
}

/// The bits of a where the mask m is set, those of b elsewhere. Host and device.
AGOQ_HOST_DEVICE constexpr std::uint32_t select_bits(std::uint32_t m, std::uint32_t a,
                                                     std::uint32_t b) noexcept {
  return (a & m) | (b & ~m);
}

/// c ? a : b on the bits, through a mask: both sides are computed, and no select of floats is
/// left for g++'s -ftrapping-math to keep a loop around it scalar. Host and device.
AGOQ_HOST_DEVICE constexpr float select_float(bool c, float a, float b) noexcept {
  return bits_float(select_bits(all_ones_if(c), float_bits(a), float_bits(b)));
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

/// rne_small(v) as an unsigned integer, for 0 <= v <= 2^22: the low bits of v + 1.5 * 2^23, whose
/// sum rounds v half to even, with no float-to-integer conversion. Host and device.
AGOQ_HOST_DEVICE constexpr std::uint32_t rne_small_bits(float v) noexcept {
  return float_bits(v + 12582912.0f) - 0x4b400000u;  // the bits of 1.5 * 2^23
}

/// floor(v) of a float whose magnitude is at most 2^22: the nearest integer (rne_small), less one
/// where that lies above v. Exact and vectorizable (floorf is not, under g++'s -ftrapping-math);
/// floor_small(-0) is +0. Host and device.
AGOQ_HOST_DEVICE inline float floor_small(float v) noexcept {
  float const r = rne_small(v);
  return select_float(r > v, r - 1.0f, r);
}

}  // namespace agoq::numeric
