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

/// floor(v + u) computed without rounding the sum: floor(v), plus one when 1 - u <= v - floor(v).
/// Every comparison is exact (|v| < 2^22, u a multiple of 2^-24): v - floor(v) is a Sterbenz
/// difference except for v in (-1, 0), where the equivalent u >= -v is compared instead. So the
/// result rounds up with probability floor(2^24 f) / 2^24 for the fraction f of v (unbiased to
/// within 2^-24 of a step), never moves an integer v (so a clamped v stays in range), and is v's
/// floor at u = 0.
AGOQ_HOST_DEVICE inline float floor_stochastic(float v, float u) noexcept {
  float const q = cuda::std::floor(v);
  bool const up = q == -1.0f ? u >= -v : 1.0f - u <= v - q;
  return up ? q + 1.0f : q;
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

namespace numeric {

/// x / scale of an integer code with NaN replaced by 0, clamped to the code's range in units of
/// the scale: [-qmax, qmax] (symmetric) or [-z, 2^b - 1 - z] (asymmetric). The bounds are
/// integers, so clamping before rounding equals clamping the rounded code.
template <code_format Code>
AGOQ_HOST_DEVICE inline float clamped_quotient(float x, group_params p) noexcept {
  float lo, hi;
  if constexpr (Code::has_zero_point) {
    lo = static_cast<float>(-p.zero_point);
    hi = static_cast<float>(Code::levels - p.zero_point);
  } else {
    hi = static_cast<float>(Code::qmax);
    lo = -hi;
  }
  float v = x / p.scale;
  v = v != v ? 0.0f : v;
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

/// The stored code of an integer-valued quantization step q: q + z (asymmetric) or q's low
/// bits in two's complement (symmetric).
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t integer_code(float q, group_params p) noexcept {
  auto const i = static_cast<std::int32_t>(q);
  if constexpr (Code::has_zero_point) {
    return static_cast<std::uint8_t>(i + p.zero_point);
  } else {
    return static_cast<std::uint8_t>(static_cast<std::uint32_t>(i) & code_mask(Code::bits));
  }
}

}  // namespace numeric

/// Encodes one value with round-half-to-even (DESIGN §4). NaN encodes to the code of real zero,
/// +Inf / -Inf to the largest / smallest code; a zero-scale group encodes everything to the code
/// of zero. The code is returned in the low `Code::bits` bits. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_nearest(float x, group_params p) noexcept {
  if constexpr (is_fp8_code<Code>) {
    if (p.scale == 0.0f) return 0;
    return numeric::float_to_fp8_rne_sat(x / p.scale, Code::format);
  } else {
    if (p.scale == 0.0f) return numeric::integer_code<Code>(0.0f, p);
    return numeric::integer_code<Code>(numeric::rne_small(numeric::clamped_quotient<Code>(x, p)),
                                       p);
  }
}

/// Encodes one value with stochastic rounding: `u` is the element's uniform draw in [0, 1)
/// (numeric::uniform_at). Integer codes take floor(v + u) (numeric::floor_stochastic, exact), so
/// E[decode] = x inside the range; FP8 codes round the magnitude up to the next FP8 value when
/// (1 - u) * gap <= distance from the value below, i.e. with probability distance / gap, and
/// like floor(v + u) never round up at u = 0. Non-finite values and zero-scale groups encode as
/// in encode_nearest. Host and device.
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
  } else {
    if (p.scale == 0.0f) return numeric::integer_code<Code>(0.0f, p);
    return numeric::integer_code<Code>(
        numeric::floor_stochastic(numeric::clamped_quotient<Code>(x, p), u), p);
  }
}

/// Decodes one code (in its low `Code::bits` bits) to a float: q * scale, (q - z) * scale, or
/// fp8(q) * scale, saturated at ±FLT_MAX. A grid point past FLT_MAX (a scale rounded up, or an
/// asymmetric range at the ends of the float range) is the nearest point only of values near
/// ±FLT_MAX, which so decode to ±FLT_MAX (closer to them still) instead of ±Inf. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline float decode(std::uint8_t code, group_params p) noexcept {
  float y;
  if constexpr (is_fp8_code<Code>) {
    y = numeric::fp8_to_float(code, Code::format) * p.scale;
  } else if constexpr (Code::has_zero_point) {
    y = static_cast<float>(static_cast<std::int32_t>(code) - p.zero_point) * p.scale;
  } else {
    y = static_cast<float>(numeric::sign_extend(code, Code::bits)) * p.scale;
  }
  y = y > numeric::max_finite_float ? numeric::max_finite_float : y;  // NaN passes
  return y < -numeric::max_finite_float ? -numeric::max_finite_float : y;
}

}  // namespace agoq
