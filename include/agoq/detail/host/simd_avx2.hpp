/// \file
/// The AVX2 loops of the CPU executor's row path, compiled where AVX2 is and AVX-512 is not (AMD
/// Zen 2-3, Intel client parts, x86-64-v3 builds such as the device build's host code): encoding
/// with nearest and stochastic rounding and decoding of the integer codes, from and to float,
/// bfloat16 and half, one code per byte or 4-bit packed, 16 elements per step. Each computes
/// exactly what the portable loop of segment.hpp computes: the same division x / scale, the same
/// clamp, round-half-to-even (vroundps with its rounding in the instruction, exact on clamped
/// values like numeric::rne_small, whatever MXCSR says), the same bit-level bfloat16 rounding.
/// FP8 codes take the portable loops. Included by simd.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../numeric/bits.hpp"
#include "../../numeric/codec.hpp"
#include "../../numeric/rounding.hpp"
#include "segment.hpp"

#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))

#include <immintrin.h>

namespace agoq::detail::host {

namespace avx2 {

/// Elements per step: two vectors of 8 floats.
inline constexpr std::int64_t step = 16;

/// How a step's 16 elements sit in its two vectors: bfloat16 splits into even and odd elements
/// (one shift or mask of the loaded bits), float and half into the first and second 8. The codes
/// and the output follow the same split.
template <class T>
inline constexpr bool interleaved = std::is_same_v<T, bfloat16>;

/// A step's two float vectors.
struct step_values {
  __m256 v0, v1;
};

/// Loads the 16 elements at x widened to floats.
template <class T>
[[gnu::always_inline]] inline step_values load_step(T const* x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
  } else {
    __m256i const w = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(x));
    if constexpr (interleaved<T>) {
      return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
              _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536)))};
    } else {
      return {_mm256_cvtph_ps(_mm256_castsi256_si128(w)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1))};
    }
  }
}

/// The draws u[0, 16) arranged like a step of T.
template <class T>
[[gnu::always_inline]] inline step_values load_draws(float const* u) noexcept {
  __m256 const a = _mm256_loadu_ps(u);
  __m256 const b = _mm256_loadu_ps(u + 8);
  if constexpr (interleaved<T>) {
    // Even (odd) lanes of a and b per 128-bit lane, then the 64-bit quarters in order.
    __m256 const e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    __m256 const o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    return {_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0))),
            _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)))};
  } else {
    return {a, b};
  }
}

/// Per-group constants of an integer encoder: the divisor and the clamp range of x / scale.
template <code_format Code>
struct encoder {
  __m256 scale, lo, hi;
  __m256i zero_point;

  explicit encoder(group_params p) noexcept : encoder(p, numeric::integer_range<Code>(p)) {}
  encoder(group_params p, numeric::quotient_range r) noexcept
      : scale(_mm256_set1_ps(p.scale)),
        lo(_mm256_set1_ps(r.lo)),
        hi(_mm256_set1_ps(r.hi)),
        zero_point(_mm256_set1_epi32(p.zero_point)) {}

  /// Clamps x / scale to the code's range. NaN survives (vmaxps and vminps return their second
  /// operand when it is NaN) and converts to 0x80000000, whose low bits are the code of zero's.
  __m256 clamped(__m256 x) const noexcept {
    return _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_div_ps(x, scale)));
  }

  __m256i with_zero_point(__m256i c) const noexcept {
    if constexpr (Code::has_zero_point) return _mm256_add_epi32(c, zero_point);
    return c;
  }

  /// Codes (in the low Code::bits bits of each lane) of round-half-to-even.
  __m256i nearest(__m256 x) const noexcept {
    return with_zero_point(_mm256_cvttps_epi32(
        _mm256_round_ps(clamped(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }

  /// Codes of stochastic rounding: numeric::floor_stochastic of the clamped x / scale, floor(v)
  /// plus one where 1 - u <= v - floor(v) (u >= -v where floor(v) = -1).
  __m256i stochastic(__m256 x, __m256 u) const noexcept {
    __m256 const v = clamped(x);
    __m256 const down = _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 const minus_one = _mm256_cmp_ps(down, _mm256_set1_ps(-1.0f), _CMP_EQ_OQ);
    __m256 const up_near_zero = _mm256_cmp_ps(u, _mm256_sub_ps(_mm256_setzero_ps(), v), _CMP_GE_OQ);
    __m256 const up_elsewhere =
        _mm256_cmp_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), u), _mm256_sub_ps(v, down), _CMP_LE_OQ);
    __m256 const up = _mm256_blendv_ps(up_elsewhere, up_near_zero, minus_one);
    // NaN lanes compare false and convert to 0x80000000; an up lane is all ones, minus one.
    return with_zero_point(_mm256_sub_epi32(_mm256_cvttps_epi32(down), _mm256_castps_si256(up)));
  }
};

/// A step's codes (low Bits bits of each lane of c0 and c1, split like a step of T) as 16 bytes
/// in element order.
template <int Bits, class T>
[[gnu::always_inline]] inline __m128i code_bytes(__m256i c0, __m256i c1) noexcept {
  __m256i const m = _mm256_set1_epi32(static_cast<int>(numeric::code_mask(Bits)));
  c0 = _mm256_and_si256(c0, m);
  c1 = _mm256_and_si256(c1, m);
  if constexpr (interleaved<T>) {
    // Lane k: element 2k in its low byte, 2k + 1 in the next; narrowed to 16 bits (exact).
    __m256i const w = _mm256_or_si256(c0, _mm256_slli_epi32(c1, 8));
    __m256i const p = _mm256_packus_epi32(w, w);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  } else {
    // Per 128-bit lane: c0[0-3] c1[0-3] (low half), c0[4-7] c1[4-7] (high), as bytes.
    __m256i const p = _mm256_packus_epi32(c0, c1);
    __m256i const b = _mm256_packus_epi16(p, p);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  }
}

/// Writes a step's 16 codes, bytes in element order, as `Width`-bit fields at dst: the bytes
/// themselves (Width 8) or two codes per byte, least significant first (Width 4, codes < 16).
template <int Width>
[[gnu::always_inline]] inline void store_codes(std::uint8_t* dst, __m128i bytes) noexcept {
  if constexpr (Width == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bytes);
  } else {
    // Each pair of bytes (a, b) to a + 16 b, then narrowed to bytes.
    __m128i const w = _mm_maddubs_epi16(bytes, _mm_set1_epi16(0x1001));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(w, w));
  }
}

/// Encodes the 16 elements x[0, 16) (u[0, 16) their draws under stochastic rounding) into
/// `Width`-bit fields at dst.
template <code_format Code, rounding_kind Rounding, int Width, class T>
[[gnu::always_inline, gnu::flatten]] inline void encode_step(encoder<Code> const& e, T const* x,
                                                             float const* u,
                                                             std::uint8_t* dst) noexcept {
  step_values const v = load_step(x);
  __m256i c0, c1;
  if constexpr (Rounding == rounding_kind::stochastic) {
    step_values const d = load_draws<T>(u);
    c0 = e.stochastic(v.v0, d.v0);
    c1 = e.stochastic(v.v1, d.v1);
  } else {
    c0 = e.nearest(v.v0);
    c1 = e.nearest(v.v1);
  }
  store_codes<Width>(dst, code_bytes<Code::bits, T>(c0, c1));
}

/// Loads a step of `Width`-bit fields at src as 32-bit lanes holding each code in their top Bits
/// bits, split like a step of T.
template <int Width, int Bits, class T>
[[gnu::always_inline]] inline void load_codes(std::uint8_t const* src, __m256i& c0,
                                              __m256i& c1) noexcept {
  if constexpr (Width == 8) {
    __m128i const b = _mm_loadu_si128(reinterpret_cast<__m128i const*>(src));
    if constexpr (interleaved<T>) {
      __m256i const w = _mm256_cvtepu8_epi16(b);
      c0 = _mm256_slli_epi32(w, 32 - Bits);
      c1 = _mm256_slli_epi32(w, 16 - Bits);
    } else {
      c0 = _mm256_slli_epi32(_mm256_cvtepu8_epi32(b), 32 - Bits);
      c1 = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), 32 - Bits);
    }
  } else {
    __m128i const b = _mm_loadl_epi64(reinterpret_cast<__m128i const*>(src));
    if constexpr (interleaved<T>) {
      __m256i const w = _mm256_cvtepu8_epi32(b);
      c0 = _mm256_slli_epi32(w, 28);
      c1 = _mm256_slli_epi32(w, 24);
    } else {
      // Byte k of 4 in its own 64-bit lane; the high nibble moves to the upper 32-bit half.
      __m256i const lo = _mm256_cvtepu8_epi64(b);
      __m256i const hi = _mm256_cvtepu8_epi64(_mm_srli_si128(b, 4));
      c0 = _mm256_slli_epi32(_mm256_or_si256(lo, _mm256_slli_epi64(lo, 28)), 28);
      c1 = _mm256_slli_epi32(_mm256_or_si256(hi, _mm256_slli_epi64(hi, 28)), 28);
    }
  }
}

/// decode of integer codes held in the top Code::bits bits of each lane, saturated at ±FLT_MAX
/// (vmaxps and vminps return their second operand, y, where it is NaN).
template <code_format Code>
[[gnu::always_inline]] inline __m256 decode_vec(__m256i c, __m256 scale,
                                                __m256i zero_point) noexcept {
  __m256i q;
  if constexpr (Code::has_zero_point) {
    q = _mm256_sub_epi32(_mm256_srli_epi32(c, 32 - Code::bits), zero_point);
  } else {
    q = _mm256_srai_epi32(c, 32 - Code::bits);
  }
  __m256 const y = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
  __m256 const m = _mm256_set1_ps(numeric::max_finite_float);
  return _mm256_min_ps(m, _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), m), y));
}

/// numeric::float_to_bf16_bits of each lane, left in the lane's top 16 bits (low bits garbage).
[[gnu::always_inline]] inline __m256i bf16_rounded_high(__m256 v) noexcept {
  __m256i const u = _mm256_castps_si256(v);
  __m256i const lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i const r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  __m256i const nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

/// Narrows a step's two float vectors (split like a step of T) to T (round half to even) and
/// stores its 16 elements at y.
template <class T>
[[gnu::always_inline]] inline void store_step(T* y, __m256 v0, __m256 v1) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(y, v0);
    _mm256_storeu_ps(y + 8, v1);
  } else if constexpr (interleaved<T>) {
    // Even element in the low 16 bits, odd element in the high 16 bits of each 32-bit lane.
    __m256i const w = _mm256_blend_epi16(_mm256_srli_epi32(bf16_rounded_high(v0), 16),
                                         bf16_rounded_high(v1), 0xaa);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), w);
  } else {
    auto* p = reinterpret_cast<__m128i*>(y);
    _mm_storeu_si128(p, _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(p + 1, _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

/// Decodes the 16 codes at src (`Width`-bit fields) into y[0, 16).
template <code_format Code, int Width, class T>
[[gnu::always_inline, gnu::flatten]] inline void decode_step(std::uint8_t const* src, __m256 scale,
                                                             __m256i zero_point, T* y) noexcept {
  __m256i c0, c1;
  load_codes<Width, Code::bits, T>(src, c0, c1);
  store_step(y, decode_vec<Code>(c0, scale, zero_point), decode_vec<Code>(c1, scale, zero_point));
}

}  // namespace avx2

/// Encodes x[0, n) of one group into `Width`-bit fields at dst (numeric::encode_nearest or
/// encode_stochastic per element; u[i] is element i's draw for stochastic rounding); FP8 codes
/// (Width 8) by the portable loops. The last step of a group not a multiple of 16 runs on copies.
template <code_format Code, rounding_kind Rounding, int Width, element_type T>
inline void encode_simd(T const* x, std::int64_t n, group_params p, float const* u,
                        std::uint8_t* dst) noexcept {
  static_assert(Width == 8 || (Width == 4 && Code::bits == 4));
  constexpr bool stochastic = Rounding == rounding_kind::stochastic;
  if constexpr (is_fp8_code<Code>) {
    if constexpr (stochastic) {
      encode_stochastic_segment<Code>(x, n, p, u, dst);
    } else {
      encode_nearest_segment<Code>(x, n, p, dst);
    }
  } else {
    if (p.scale == 0.0f) {
      encode_zero_scale<Code, Width>(n, p, dst);
      return;
    }
    avx2::encoder<Code> const e(p);
    std::int64_t i = 0;
    for (; i + avx2::step <= n; i += avx2::step) {
      avx2::encode_step<Code, Rounding, Width>(e, x + i, stochastic ? u + i : nullptr,
                                               dst + i * Width / 8);
    }
    if (i < n) {
      // The tail's codes from copies padded with +0 (draws 0); the padding's codes are then
      // cleared, as the last byte of 4-bit fields holds one of them where the tail is odd, and
      // the step's fields written by store_codes to a copy, of which the tail's bytes are kept.
      std::int64_t const left = n - i;
      alignas(32) unsigned char xs[avx2::step * sizeof(T)] = {};
      float us[avx2::step] = {};
      std::memcpy(xs, x + i, static_cast<std::size_t>(left) * sizeof(T));
      if constexpr (stochastic) {
        std::memcpy(us, u + i, static_cast<std::size_t>(left) * sizeof(float));
      }
      alignas(16) std::uint8_t codes[avx2::step];
      avx2::encode_step<Code, Rounding, 8>(e, reinterpret_cast<T const*>(xs), us, codes);
      std::memset(codes + left, 0, static_cast<std::size_t>(avx2::step - left));
      std::uint8_t fields[avx2::step];
      avx2::store_codes<Width>(fields, _mm_load_si128(reinterpret_cast<__m128i const*>(codes)));
      std::memcpy(dst + i * Width / 8, fields, static_cast<std::size_t>((left * Width + 7) / 8));
    }
  }
}

/// Decodes n codes of one group, `Width`-bit fields at src, into y; FP8 codes (Width 8) by the
/// portable loop. The last step of a group not a multiple of 16 runs on copies.
template <code_format Code, int Width, element_type T>
inline void decode_simd(std::uint8_t const* src, std::int64_t n, group_params p, T* y) noexcept {
  static_assert(Width == 8 || (Width == 4 && Code::bits == 4));
  if constexpr (is_fp8_code<Code>) {
    decode_segment<Code>(src, n, p, y);
  } else {
    __m256 const scale = _mm256_set1_ps(p.scale);
    __m256i const zero_point = _mm256_set1_epi32(p.zero_point);
    std::int64_t i = 0;
    for (; i + avx2::step <= n; i += avx2::step) {
      avx2::decode_step<Code, Width>(src + i * Width / 8, scale, zero_point, y + i);
    }
    if (i < n) {
      std::int64_t const left = n - i;
      std::uint8_t codes[avx2::step] = {};
      std::memcpy(codes, src + i * Width / 8, static_cast<std::size_t>((left * Width + 7) / 8));
      alignas(32) unsigned char ys[avx2::step * sizeof(T)];
      avx2::decode_step<Code, Width>(codes, scale, zero_point, reinterpret_cast<T*>(ys));
      std::memcpy(y + i, ys, static_cast<std::size_t>(left) * sizeof(T));
    }
  }
}

}  // namespace agoq::detail::host

#endif
