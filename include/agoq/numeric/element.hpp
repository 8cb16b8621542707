/// \file
/// The element types agoq reads and writes (float, half, bfloat16) and their conversions.
///
/// Conversions to narrower types round to nearest even. On the host they are computed on the
/// bits, so they vectorize and need no hardware support; on the device they use the conversion
/// instructions, which round the same way.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bits.hpp"

namespace agoq {

/// IEEE binary16.
using half = __half;
/// bfloat16 (the upper half of an IEEE binary32).
using bfloat16 = __nv_bfloat16;

/// The element types agoq quantizes from and dequantizes to.
template <class T>
concept element_type =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

namespace numeric {

/// bfloat16 bits -> float (exact). Host and device.
AGOQ_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(std::uint32_t{b} << 16);
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN. Host and device.
AGOQ_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float x) noexcept {
  std::uint32_t const u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  std::uint32_t const rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

/// binary16 bits -> float (exact, subnormals included). Host and device. Branch-free (the three
/// cases selected by masks), so that loops widening halves vectorize.
AGOQ_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t const sign = std::uint32_t{h & 0x8000u} << 16;
  std::uint32_t const a = h & 0x7fffu;
  // Normal: the exponent rebiased (15 -> 127) and the mantissa moved to the float's fields.
  std::uint32_t const normal = (a << 13) + (112u << 23);
  // Inf and NaN: the float's all-ones exponent, the same mantissa.
  std::uint32_t const inf_nan = (a << 13) | 0x7f800000u;
  // Subnormal or zero: a * 2^-24, exact in binary32.
  std::uint32_t const sub = float_bits(static_cast<float>(a & 0x3ffu) * 5.9604644775390625e-8f);
  std::uint32_t const is_sub = all_ones_if(a < 0x400u);
  std::uint32_t const is_big = all_ones_if(a >= 0x7c00u);
  std::uint32_t const mag = select_bits(is_sub, sub, select_bits(is_big, inf_nan, normal));
  return bits_float(sign | mag);
}

/// float -> binary16 bits, round to nearest even, overflow to infinity, NaN to a quiet NaN.
/// Host and device. Branch-free (the cases selected by masks), so that loops narrowing to half
/// vectorize.
AGOQ_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float x) noexcept {
  std::uint32_t const u = float_bits(x);
  std::uint32_t const sign = (u >> 16) & 0x8000u;
  std::uint32_t const a = u & 0x7fffffffu;
  std::uint32_t const nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Normal result: the 13 dropped bits rounded to even on the integer bits, rebiased (127 -> 15).
  std::uint32_t const normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  // Subnormal result (or zero): a * 2^24 rounded to an integer, exactly (the product is at most
  // 2^10 once a is capped at the subnormal bound).
  std::uint32_t const sub =
      rne_small_bits(bits_float(a < 0x38800000u ? a : 0x38800000u) * 16777216.0f);
  std::uint32_t const is_nan = all_ones_if(a > 0x7f800000u);
  std::uint32_t const is_inf = all_ones_if(a >= 0x477ff000u) & ~is_nan;  // rounds past 65504
  std::uint32_t const is_sub = all_ones_if(a < 0x38800000u);
  std::uint32_t const mag =
      select_bits(is_nan, nan, select_bits(is_inf, 0x7c00u, select_bits(is_sub, sub, normal)));
  return static_cast<std::uint16_t>(sign | mag);
}

/// The raw 16 bits of a half or bfloat16 value. Host and device.
template <class T>
AGOQ_HOST_DEVICE inline std::uint16_t raw_bits(T x) noexcept {
  return cuda::std::bit_cast<std::uint16_t>(x);
}

/// Widens an element to float (exact). Host and device.
template <element_type T>
AGOQ_HOST_DEVICE inline float to_float(T x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bf16_bits_to_float(raw_bits(x));
  } else {
    return half_bits_to_float(raw_bits(x));
  }
}

/// Narrows a float to an element type, rounding to nearest even. Host and device.
template <element_type T>
AGOQ_HOST_DEVICE inline T from_float(float x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, bfloat16>) {
      return __float2bfloat16_rn(x);
    } else {
      return __float2half_rn(x);
    }
#else
    if constexpr (std::is_same_v<T, bfloat16>) {
      return cuda::std::bit_cast<bfloat16>(float_to_bf16_bits(x));
    } else {
      return cuda::std::bit_cast<half>(float_to_half_bits(x));
    }
#endif
  }
}

}  // namespace numeric

/// The short name of an element type ("f32", "f16", "bf16"), for messages and benchmarks.
template <element_type T>
constexpr char const* element_name() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return "f32";
  } else if constexpr (std::is_same_v<T, half>) {
    return "f16";
  } else {
    return "bf16";
  }
}

}  // namespace agoq
