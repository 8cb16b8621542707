/// \file
/// The one quantization math (DESIGN §2, §4): a group's scale and zero point from its statistics,
/// and the encoding and decoding of one value. The CPU executor and the CUDA kernels both call
/// these functions, which is what makes their codes identical bit for bit.
///
/// Every formula is one operation per step (one division to encode, one multiply to decode,
/// integer zero points), so no compiler can contract it into a fused multiply-add differently
/// on the two sides.
#pragma once

#include <cstdint>

#include <cuda/std/cmath>

#include "bits.hpp"
#include "codes.hpp"
#include "fp8.hpp"
#include "scale.hpp"

namespace agoq {

/// The statistics of a group over its finite values. Symmetric codes read `absmax`; asymmetric
/// codes read `min` and `max`. An empty or all-non-finite group has absmax 0 and min = max = 0.
struct group_stats {
  float absmax = 0.0f;
  float min = 0.0f;
  float max = 0.0f;
};

/// A group's quantization parameters: the stored scale (as a float) and the zero point.
struct group_params {
  float scale = 0.0f;
  std::int32_t zero_point = 0;
};

namespace numeric {

/// Mask of the low `bits` bits.
AGOQ_HOST_DEVICE constexpr std::uint32_t code_mask(int bits) noexcept {
  return bits == 8 ? 0xffu : (1u << bits) - 1u;
}

/// Sign-extends a b-bit two's complement field.
AGOQ_HOST_DEVICE constexpr std::int32_t sign_extend(std::uint32_t q, int bits) noexcept {
  std::uint32_t const m = 1u << (bits - 1);
  return static_cast<std::int32_t>((q ^ m) - m);
}

}  // namespace numeric

/// A group's parameters from its statistics (DESIGN §4). The scale is computed in fp32, rounded up
/// to the storage type, and set to 0 when it is zero or below 2^-126 (an all-zero, constant-zero
/// or underflowing group: every code then decodes to 0). Host and device.
template <code_format Code, scale_storage Scale>
AGOQ_HOST_DEVICE constexpr group_params make_group_params(group_stats const& st) noexcept {
  group_params p;
  if constexpr (Code::has_zero_point) {
    float const lo = st.min < 0.0f ? st.min : 0.0f;
    float const hi = st.max > 0.0f ? st.max : 0.0f;
    float s = (hi - lo) / Code::range_divisor;
    // hi - lo overflows only for ranges wider than the float range; split the division then.
    if (!numeric::is_finite(s)) s = hi / Code::range_divisor - lo / Code::range_divisor;
    s = Scale::round_up(s);
    if (!(s >= numeric::min_normal_float)) return p;
    float z = numeric::rne_small(-lo / s);
    z = z > static_cast<float>(Code::levels) ? static_cast<float>(Code::levels) : z;
    p.scale = s;
    p.zero_point = static_cast<std::int32_t>(z);
  } else {
    float const s = Scale::round_up(st.absmax / Code::range_divisor);
    if (s >= numeric::min_normal_float) p.scale = s;
  }
  return p;
}

/// Encodes one value with round-half-to-even (DESIGN §4). NaN encodes to the code of real zero,
/// +Inf / -Inf to the largest / smallest code. The code is returned in the low `Code::bits` bits.
/// Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_nearest(float x, group_params p) noexcept {
  if constexpr (is_fp8_code<Code>) {
    if (p.scale == 0.0f) return 0;
    return numeric::float_to_fp8_rne_sat(x / p.scale, Code::format);
  } else if constexpr (Code::has_zero_point) {
    if (p.scale == 0.0f) return static_cast<std::uint8_t>(p.zero_point);
    float v = x / p.scale;
    float const lo = static_cast<float>(-p.zero_point);
    float const hi = static_cast<float>(Code::levels - p.zero_point);
    v = v != v ? 0.0f : v;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return static_cast<std::uint8_t>(static_cast<std::int32_t>(numeric::rne_small(v)) +
                                     p.zero_point);
  } else {
    if (p.scale == 0.0f) return 0;
    constexpr float qmax = static_cast<float>(Code::qmax);
    float v = x / p.scale;
    v = v != v ? 0.0f : v;
    v = v < -qmax ? -qmax : v;
    v = v > qmax ? qmax : v;
    return static_cast<std::uint8_t>(
        static_cast<std::uint32_t>(static_cast<std::int32_t>(numeric::rne_small(v))) &
        numeric::code_mask(Code::bits));
  }
}

/// Encodes one value with stochastic rounding: `u` is the element's uniform draw in [0, 1)
/// (numeric::uniform_at). Integer codes take floor(v + u), so E[decode] = x inside the range;
/// FP8 codes round the magnitude up to the next FP8 value when (1 - u) * gap <= distance from the
/// value below, i.e. with probability distance / gap, and like floor(v + u) never round up at
/// u = 0. Non-finite values encode as in encode_nearest. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_stochastic(float x, group_params p, float u) noexcept {
  if constexpr (is_fp8_code<Code>) {
    if (p.scale == 0.0f) return 0;
    float const v = x / p.scale;
    std::uint32_t const u32 = numeric::float_bits(v);
    if ((u32 & 0x7fffffffu) > 0x7f800000u) return 0;
    float const a = numeric::bits_float(u32 & 0x7fffffffu);
    std::uint32_t mag = numeric::fp8_magnitude_truncate(a, Code::format);
    if (mag < Code::format.max_code) {
      float const lo = numeric::fp8_magnitude_to_float(mag, Code::format);
      float const hi = numeric::fp8_magnitude_to_float(mag + 1u, Code::format);
      // Both sides are exact: 1 - u has 24 bits, hi - lo is a power of two, and a - lo is a
      // Sterbenz difference.
      if ((1.0f - u) * (hi - lo) <= a - lo) ++mag;
    }
    return static_cast<std::uint8_t>(((u32 >> 24) & 0x80u) | mag);
  } else if constexpr (Code::has_zero_point) {
    if (p.scale == 0.0f) return static_cast<std::uint8_t>(p.zero_point);
    float v = x / p.scale;
    float const lo = static_cast<float>(-p.zero_point);
    float const hi = static_cast<float>(Code::levels - p.zero_point);
    v = v != v ? 0.0f : v;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    float q = cuda::std::floor(v + u);
    q = q > hi ? hi : q;  // v + u can round up to hi + 1
    return static_cast<std::uint8_t>(static_cast<std::int32_t>(q) + p.zero_point);
  } else {
    if (p.scale == 0.0f) return 0;
    constexpr float qmax = static_cast<float>(Code::qmax);
    float v = x / p.scale;
    v = v != v ? 0.0f : v;
    v = v < -qmax ? -qmax : v;
    v = v > qmax ? qmax : v;
    float q = cuda::std::floor(v + u);
    q = q > qmax ? qmax : q;
    return static_cast<std::uint8_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(q)) &
                                     numeric::code_mask(Code::bits));
  }
}

/// Decodes one code (in its low `Code::bits` bits) to a float: q * scale, (q - z) * scale, or
/// fp8(q) * scale. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline float decode(std::uint8_t code, group_params p) noexcept {
  if constexpr (is_fp8_code<Code>) {
    return numeric::fp8_to_float(code, Code::format) * p.scale;
  } else if constexpr (Code::has_zero_point) {
    return static_cast<float>(static_cast<std::int32_t>(code) - p.zero_point) * p.scale;
  } else {
    return static_cast<float>(numeric::sign_extend(code, Code::bits)) * p.scale;
  }
}

}  // namespace agoq
