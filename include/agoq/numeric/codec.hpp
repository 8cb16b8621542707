/// \file
/// The one quantization math (DESIGN §2, §4): a group's scale and zero point from its statistics,
/// and the encoding and decoding of one value. The CPU executor and the CUDA kernels both call
/// these functions, which is what makes their codes identical bit for bit.
///
/// Every formula is one rounded operation per step, the fused multiply-adds written as explicit fma
/// calls (one multiply to decode; integer zero points), so no compiler can contract anything
/// differently on the two sides. The encoders' quotient x / scale is the IEEE division in the host
/// executor's loops and, in the device kernels, numeric::scale_divisor (one reciprocal per group
/// and Markstein's correction per element), which gives the same codes for every input
/// (tests/numeric/quotient_test.cpp) without a division per element.
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

/// The quotient x / scale of a group's encoder without a division per element: one division per
/// group, then per element two multiplies and two fused multiply-adds that give the same codes as
/// the IEEE division x / scale for every x (docs/formats.md, "The quotient"; proven by
/// tests/numeric/quotient_test.cpp). The scale is first moved by an exact power of two 2^k into
/// [2, 2^65) (into [2^64, 2^65) unless it is below 2^-63), where 1 / scale is a normal float and
/// every remainder that matters is exact; x is moved by the same 2^k. Then, with r = RN(1 / scale),
/// q = RN(x r) is within 1.5 ulp of x / scale, the remainder e = fma(q, scale, -x) is exact (or
/// rounds harmlessly), and v = fma(-e, r, q) = RN(x / scale) wherever the codes depend on v's bits
/// (Markstein's correction). Where q is not a finite non-zero float the result is q itself: ±Inf
/// where x * 2^k or x r overflows (v would be NaN), which clamps to the extreme code as the
/// division's huge or infinite quotient does; NaN for NaN; and a zero whose sign is that of x,
/// which no rewriting of the negations into the fma calls (which move a zero's sign) can change.
/// Host and device.
struct scale_divisor {
  float factor;      ///< 2^k
  float scale;       ///< scale * 2^k
  float reciprocal;  ///< RN(1 / (scale * 2^k))

  /// The divisor of a scale that is 0 (never divided by) or a normal float. Host and device.
  AGOQ_HOST_DEVICE explicit scale_divisor(float s) noexcept
      : factor(power_for(s)), scale(s * factor), reciprocal(1.0f / scale) {}

  /// 2^k = 2^(191 - e) for the scale's biased exponent e, at most 2^127. Host and device.
  AGOQ_HOST_DEVICE static float power_for(float s) noexcept {
    std::uint32_t const biased = 318u - ((float_bits(s) >> 23) & 0xffu);
    return bits_float((biased < 254u ? biased : 254u) << 23);
  }

  /// x / scale as the codes see it (see above). Host and device.
  AGOQ_HOST_DEVICE float operator()(float x) const noexcept {
    float const q = x * factor * reciprocal;
    float const v = corrected(x);
    return v != v || q == 0.0f ? q : v;
  }

  /// Markstein's corrected quotient v itself, without operator()'s choice of q: the same value
  /// where q is a finite non-zero float, and a zero (perhaps of the other sign) where q is zero;
  /// so the same integer code for every finite x whose quotient |x / scale| is at most 2^17. Host
  /// and device.
  AGOQ_HOST_DEVICE float corrected(float x) const noexcept {
    float const xs = x * factor;
    float const q = xs * reciprocal;
    float const e = cuda::std::fma(q, scale, -xs);
    return cuda::std::fma(-e, reciprocal, q);
  }
};

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
  float const q = floor_small(v);
  bool const near_zero = q == -1.0f;
  bool const up = (near_zero & (u >= -v)) | (!near_zero & (1.0f - u <= v - q));
  return select_float(up, q + 1.0f, q);
}

/// Sign-extends a b-bit two's complement field.
AGOQ_HOST_DEVICE constexpr std::int32_t sign_extend(std::uint32_t q, int bits) noexcept {
  std::uint32_t const m = 1u << (bits - 1);
  return static_cast<std::int32_t>((q ^ m) - m);
}

}  // namespace numeric

/// A group's parameters with the divisor of its scale, made once per group: what the device
/// kernels encode with (encode_nearest / encode_stochastic overloads). Made only from a
/// group_params (no default constructor), so that `encode_nearest<Code>(x, {})` still means
/// group_params. Host and device.
struct group_encoding {
  group_params params;
  numeric::scale_divisor divisor;

  AGOQ_HOST_DEVICE explicit group_encoding(group_params p) noexcept : params(p), divisor(p.scale) {}
};

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

/// The range [lo, hi] of an integer code's quotient x / scale, in units of the scale: [-z, 2^b - 1
/// - z] with a zero point z, else [-qmax, qmax]. clamped_quotient clamps to it on the bits, the
/// host's vector encoders with vector min and max. Host and device.
struct quotient_range {
  float lo, hi;
};

template <code_format Code>
requires(!is_fp8_code<Code>) AGOQ_HOST_DEVICE constexpr quotient_range
    integer_range(group_params p) noexcept {
  if constexpr (Code::has_zero_point) {
    return {static_cast<float>(-p.zero_point), static_cast<float>(Code::levels - p.zero_point)};
  } else {
    return {-static_cast<float>(Code::qmax), static_cast<float>(Code::qmax)};
  }
}

/// The quotient v = x / scale of an integer code with NaN replaced by 0, clamped to the code's
/// range in units of the scale: [-qmax, qmax] (symmetric) or [-z, 2^b - 1 - z] (asymmetric). The
/// bounds are integers, so clamping before rounding equals clamping the rounded code.
///
/// Computed on the bits, with no branch and no select of a float: a NaN's magnitude bits are
/// masked to 0 (leaving ±0), and the magnitude is clamped as an unsigned integer (which orders
/// like the value for non-negative floats, +Inf included) to the bound on its sign's side, z
/// being in [0, 2^b - 1] as make_group_params makes it. (A value clamped to a zero bound keeps
/// its sign, -0, which every code derived from it reads as 0.) A float select would let g++
/// (whose -ftrapping-math keeps it from speculating a float operation) split a loop calling this
/// into paths and leave it scalar; this form vectorizes.
template <code_format Code>
AGOQ_HOST_DEVICE inline float clamped_quotient(float v, group_params p) noexcept {
  std::uint32_t const b = float_bits(v);
  std::uint32_t const sign = b & 0x80000000u;
  std::uint32_t a = b & 0x7fffffffu;
  a &= all_ones_if(a <= 0x7f800000u);  // NaN -> 0
  quotient_range const r = integer_range<Code>(p);
  std::uint32_t limit;
  if constexpr (Code::has_zero_point) {
    // sign ? z : 2^b - 1 - z, z the magnitude bits of lo = -z (+0 when z is 0)
    limit = select_bits(all_ones_if(sign != 0), float_bits(r.lo) & 0x7fffffffu, float_bits(r.hi));
  } else {
    limit = float_bits(r.hi);
  }
  a = a < limit ? a : limit;
  return bits_float(sign | a);
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

/// The code of every value of a group whose scale is 0: that of real zero (+0 for FP8). Host and
/// device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t zero_scale_code(group_params p) noexcept {
  if constexpr (is_fp8_code<Code>) {
    return 0;
  } else {
    return integer_code<Code>(0.0f, p);
  }
}

/// The code of round-half-to-even of the quotient v = x / scale of a group whose scale is not 0.
/// Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t nearest_code(float v, group_params p) noexcept {
  if constexpr (is_fp8_code<Code>) {
    return float_to_fp8_rne_sat(v, Code::format);
  } else {
    return integer_code<Code>(rne_small(clamped_quotient<Code>(v, p)), p);
  }
}

/// nearest_code for a symmetric integer code and a quotient |v| < qmax + 1/2 (so not NaN, and no
/// clamp binds): the low bits of v + 1.5 * 2^23, whose sum rounds v half to even (as rne_small)
/// and holds the result in its low bits in two's complement, without the NaN test, the clamp and
/// the conversions. Host and device.
template <code_format Code>
requires(Code::kind == code_kind::int_sym) AGOQ_HOST_DEVICE inline std::uint8_t
    nearest_code_in_range(float v) noexcept {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  return static_cast<std::uint8_t>(float_bits(v + magic) & code_mask(Code::bits));
}

/// stochastic_code for a symmetric integer code and a quotient that is not NaN: the clamp to
/// [-qmax, qmax], floor_stochastic, and the code read from the low bits of the result + 1.5 * 2^23
/// (as nearest_code_in_range), without the NaN test and the conversion. Host and device.
template <code_format Code>
requires(Code::kind == code_kind::int_sym) AGOQ_HOST_DEVICE inline std::uint8_t
    stochastic_code_in_range(float v, float u) noexcept {
  constexpr float hi = static_cast<float>(Code::qmax);
  float const c = v < -hi ? -hi : (v > hi ? hi : v);
  return nearest_code_in_range<Code>(floor_stochastic(c, u));
}

/// The code of stochastic rounding of the quotient v = x / scale of a group whose scale is not 0,
/// under the draw u (see encode_stochastic). Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t stochastic_code(float v, group_params p, float u) noexcept {
  if constexpr (is_fp8_code<Code>) {
    std::uint32_t const u32 = float_bits(v);
    std::uint32_t const a = u32 & 0x7fffffffu;
    std::uint32_t const code = ((u32 >> 24) & 0x80u) | fp8_stochastic_magnitude(a, u, Code::format);
    return static_cast<std::uint8_t>(code & all_ones_if(a <= 0x7f800000u));  // NaN -> 0
  } else {
    return integer_code<Code>(floor_stochastic(clamped_quotient<Code>(v, p), u), p);
  }
}

}  // namespace numeric

/// Encodes one value with round-half-to-even (DESIGN §4). NaN encodes to the code of real zero,
/// +Inf / -Inf to the largest / smallest code; a zero-scale group encodes everything to the code
/// of zero. The code is returned in the low `Code::bits` bits. The quotient is the IEEE division
/// x / scale (what the host executor's loops compute). Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_nearest(float x, group_params p) noexcept {
  if (p.scale == 0.0f) return numeric::zero_scale_code<Code>(p);
  return numeric::nearest_code<Code>(x / p.scale, p);
}

/// encode_nearest with the quotient by the group's divisor (numeric::scale_divisor: the same
/// codes without a division per element; the device kernels' form). Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_nearest(float x, group_encoding const& g) noexcept {
  if (g.params.scale == 0.0f) return numeric::zero_scale_code<Code>(g.params);
  return numeric::nearest_code<Code>(g.divisor(x), g.params);
}

/// Encodes one value with stochastic rounding: `u` is the element's uniform draw in [0, 1)
/// (numeric::uniform_at). Integer codes take floor(v + u) (numeric::floor_stochastic, exact), so
/// E[decode] = x inside the range; FP8 codes round the magnitude up to the next FP8 value when
/// (1 - u) * gap <= distance from the value below, i.e. with probability distance / gap, and
/// like floor(v + u) never round up at u = 0. Non-finite values and zero-scale groups encode as
/// in encode_nearest. The quotient is the IEEE division x / scale. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_stochastic(float x, group_params p, float u) noexcept {
  if (p.scale == 0.0f) return numeric::zero_scale_code<Code>(p);
  return numeric::stochastic_code<Code>(x / p.scale, p, u);
}

/// encode_stochastic with the quotient by the group's divisor (the same codes; the device
/// kernels' form). Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline std::uint8_t encode_stochastic(float x, group_encoding const& g,
                                                       float u) noexcept {
  if (g.params.scale == 0.0f) return numeric::zero_scale_code<Code>(g.params);
  return numeric::stochastic_code<Code>(g.divisor(x), g.params, u);
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
  // Only ±Inf lies past ±FLT_MAX (NaN passes): their bits less one are those of ±FLT_MAX. On the
  // bits, so that loops decoding into half (whose narrowing is float arithmetic) vectorize.
  std::uint32_t const b = numeric::float_bits(y);
  return numeric::bits_float(b - static_cast<std::uint32_t>((b & 0x7fffffffu) == 0x7f800000u));
}

}  // namespace agoq
