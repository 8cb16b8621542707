/// \file
/// Scale storage: fp32, bf16 and power-of-two E8M0. A scale computed in fp32 is rounded *up* to
/// the storage type (so no value of its group clips), and the stored value is the one every
/// executor divides and multiplies by.
#pragma once

#include <concepts>
#include <cstdint>

#include "bits.hpp"

namespace agoq {

/// How a group's scale is stored, as kept in a runtime spec.
enum class scale_format : std::uint8_t {
  f32,   ///< IEEE binary32, 4 bytes
  bf16,  ///< bfloat16, 2 bytes
  e8m0,  ///< OCP E8M0 power of two, 1 byte (biased exponent)
};

/// fp32 scales: stored as computed.
struct scale_f32 {
  static constexpr scale_format format = scale_format::f32;
  using storage = float;
  /// The smallest storable value >= s (s finite, non-negative). Host and device.
  AGOQ_HOST_DEVICE static constexpr float round_up(float s) noexcept { return s; }
  /// Encodes a value returned by round_up.
  AGOQ_HOST_DEVICE static constexpr storage store(float s) noexcept { return s; }
  /// Decodes a stored scale.
  AGOQ_HOST_DEVICE static constexpr float load(storage s) noexcept { return s; }
};

/// bf16 scales: the fp32 scale rounded up to bfloat16 (to the largest finite bfloat16 where that
/// would overflow).
struct scale_bf16 {
  static constexpr scale_format format = scale_format::bf16;
  using storage = std::uint16_t;
  AGOQ_HOST_DEVICE static constexpr float round_up(float s) noexcept {
    std::uint32_t u = numeric::float_bits(s);
    if (u & 0xffffu) u = (u & 0xffff0000u) + 0x10000u;
    if (u >= 0x7f800000u) u = 0x7f7f0000u;
    return numeric::bits_float(u);
  }
  AGOQ_HOST_DEVICE static constexpr storage store(float s) noexcept {
    return static_cast<storage>(numeric::float_bits(s) >> 16);
  }
  AGOQ_HOST_DEVICE static constexpr float load(storage s) noexcept {
    return numeric::bits_float(std::uint32_t{s} << 16);
  }
};

/// E8M0 scales (OCP MX): a power of two 2^(e - 127) stored as the byte e. The fp32 scale rounds up
/// to the next power of two, at most 2^127. agoq stores a zero scale (an all-zero or underflowing
/// group, whose codes are all zero) as the byte 0 and reads it as 0; an OCP reader sees 2^-127
/// there, which decodes the same zero codes to the same zeros.
struct scale_e8m0 {
  static constexpr scale_format format = scale_format::e8m0;
  using storage = std::uint8_t;
  AGOQ_HOST_DEVICE static constexpr float round_up(float s) noexcept {
    std::uint32_t u = numeric::float_bits(s);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x800000u;
    if (u > 0x7f000000u) u = 0x7f000000u;
    return numeric::bits_float(u);
  }
  AGOQ_HOST_DEVICE static constexpr storage store(float s) noexcept {
    return static_cast<storage>(numeric::float_bits(s) >> 23);
  }
  AGOQ_HOST_DEVICE static constexpr float load(storage s) noexcept {
    return numeric::bits_float(std::uint32_t{s} << 23);
  }
};

/// What a scale storage type provides.
template <class S>
concept scale_storage = requires(float f, typename S::storage st) {
  { S::format } -> std::convertible_to<scale_format>;
  { S::round_up(f) } -> std::same_as<float>;
  { S::store(f) } -> std::same_as<typename S::storage>;
  { S::load(st) } -> std::same_as<float>;
};

/// Bytes of one stored scale.
constexpr int scale_bytes(scale_format f) noexcept {
  return f == scale_format::f32 ? 4 : f == scale_format::bf16 ? 2 : 1;
}

}  // namespace agoq
