/// \file
/// AVX-512 segment loops of the CPU executor for the hot schemes (symmetric integer codes from
/// and to float, bfloat16 and half; 4-bit packing). Each computes exactly what the portable loop
/// of segment.hpp computes: the same division, the same clamp, round-half-to-even (roundscale is
/// exact like numeric::rne_small), the same bit-level bfloat16 rounding. Where AVX-512 (F, BW,
/// VL) is not enabled at compile time, or for other schemes, they forward to the portable loops.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 headers (GCC bug 105593, the
// _mm512_undefined_* idiom); the diagnostic is located in the header, so it is silenced there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#define AGOQ_HOST_AVX512 1
#endif

#include "segment.hpp"

namespace agoq::detail::host {

/// True when the CPU executor was compiled with its AVX-512 loops.
#if defined(AGOQ_HOST_AVX512)
inline constexpr bool simd_available = true;
#else
inline constexpr bool simd_available = false;
#endif

#if defined(AGOQ_HOST_AVX512)

/// 16 elements (or the first `m` lanes of them) widened to floats.
template <class T>
inline __m512 load16(T const* x, __mmask16 m) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, x);
  } else {
    __m256i const h = _mm256_maskz_loadu_epi16(m, x);
    if constexpr (std::is_same_v<T, bfloat16>) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

/// Narrows 16 floats to T with round-half-to-even and stores the first `m` lanes.
template <class T>
inline void store16(T* y, __m512 v, __mmask16 m) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_mask_storeu_ps(y, m, v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    __m512i const u = _mm512_castps_si512(v);
    __m512i const lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i const r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 const nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    __m512i const q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(y, m, _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q)));
  } else {
    _mm256_mask_storeu_epi16(y, m,
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

inline __mmask16 tail_mask16(std::int64_t left) noexcept {
  return left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

/// Absolute maximum on the magnitude bits; 16-bit types 32 lanes at a time.
template <class T>
inline segment_stats absmax_simd(T const* x, std::int64_t n) noexcept {
  std::int64_t nonfinite = 0;
  std::uint32_t m;
  if constexpr (std::is_same_v<T, float>) {
    __m512i acc = _mm512_setzero_si512();
    __m512i const mag = _mm512_set1_epi32(0x7fffffff);
    __m512i const inf = _mm512_set1_epi32(0x7f800000);
    for (std::int64_t i = 0; i < n; i += 16) {
      __mmask16 const t = tail_mask16(n - i);
      __m512i const a = _mm512_and_si512(_mm512_maskz_loadu_epi32(t, x + i), mag);
      __mmask16 const fin = _mm512_cmplt_epu32_mask(a, inf);
      nonfinite += __builtin_popcount(static_cast<unsigned>(t & ~fin));
      acc = _mm512_mask_max_epu32(acc, fin, acc, a);
    }
    m = static_cast<std::uint32_t>(_mm512_reduce_max_epu32(acc));
  } else {
    __m512i acc = _mm512_setzero_si512();
    __m512i const mag = _mm512_set1_epi16(0x7fff);
    __m512i const inf = _mm512_set1_epi16(static_cast<short>(element_bits<T>::inf));
    for (std::int64_t i = 0; i < n; i += 32) {
      std::int64_t const left = n - i;
      __mmask32 const t = left >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << left) - 1u);
      __m512i const a = _mm512_and_si512(_mm512_maskz_loadu_epi16(t, x + i), mag);
      __mmask32 const fin = _mm512_cmplt_epu16_mask(a, inf);
      nonfinite += __builtin_popcount(static_cast<unsigned>(t & ~fin));
      acc = _mm512_mask_max_epu16(acc, fin, acc, a);
    }
    __m512i const lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(acc));
    __m512i const hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(acc, 1));
    m = static_cast<std::uint32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)));
  }
  segment_stats s;
  s.nonfinite = nonfinite;
  s.any_finite = nonfinite < n;
  s.stats.absmax =
      numeric::to_float(element_from_bits<T>(static_cast<typename element_bits<T>::type>(m)));
  return s;
}

/// Symmetric integer encoding, 16 lanes at a time.
template <int Qmax, class T>
inline void encode_sym_simd(T const* x, std::int64_t n, float scale, std::uint32_t mask,
                            std::uint8_t* q) noexcept {
  __m512 const s = _mm512_set1_ps(scale);
  __m512 const hi = _mm512_set1_ps(static_cast<float>(Qmax));
  __m512 const lo = _mm512_set1_ps(-static_cast<float>(Qmax));
  __m512i const bits = _mm512_set1_epi32(static_cast<int>(mask));
  for (std::int64_t i = 0; i < n; i += 16) {
    __mmask16 const t = tail_mask16(n - i);
    __m512 v = _mm512_div_ps(load16(x + i, t), s);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_setzero_ps());
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    __m512i const c =
        _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_mask_cvtepi32_storeu_epi8(q + i, t, _mm512_and_si512(c, bits));
  }
}

/// Symmetric integer decoding, 16 lanes at a time.
template <int Bits, class T>
inline void decode_sym_simd(std::uint8_t const* q, std::int64_t n, float scale, T* y) noexcept {
  __m512 const s = _mm512_set1_ps(scale);
  for (std::int64_t i = 0; i < n; i += 16) {
    __mmask16 const t = tail_mask16(n - i);
    __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(t, q + i));
    c = _mm512_srai_epi32(_mm512_slli_epi32(c, 32 - Bits), 32 - Bits);
    store16(y + i, _mm512_mul_ps(_mm512_cvtepi32_ps(c), s), t);
  }
}

#endif  // AGOQ_HOST_AVX512

/// stats_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline segment_stats stats_segment_simd(T const* x, std::int64_t n) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if constexpr (!Code::has_zero_point) return absmax_simd(x, n);
#endif
  return stats_segment<Code>(x, n);
}

/// encode_nearest_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline void encode_nearest_segment_simd(T const* x, std::int64_t n, group_params p,
                                        std::uint8_t* q) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if constexpr (Code::kind == code_kind::int_sym) {
    if (p.scale != 0.0f) {
      encode_sym_simd<Code::qmax>(x, n, p.scale, numeric::code_mask(Code::bits), q);
      return;
    }
  }
#endif
  encode_nearest_segment<Code>(x, n, p, q);
}

/// decode_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline void decode_segment_simd(std::uint8_t const* q, std::int64_t n, group_params p,
                                T* y) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if constexpr (Code::kind == code_kind::int_sym) {
    decode_sym_simd<Code::bits>(q, n, p.scale, y);
    return;
  }
#endif
  decode_segment<Code>(q, n, p, y);
}

/// pack_codes, vectorized for 4-bit codes where compiled.
inline void pack_codes_simd(std::uint8_t const* q, std::int64_t n, int bits,
                            std::uint8_t* dst) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (bits == 4) {
    std::int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m512i const w = _mm512_loadu_si512(q + i);
      __m512i const b =
          _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0x0f)), _mm512_srli_epi16(w, 4));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i / 2), _mm512_cvtepi16_epi8(b));
    }
    pack_codes(q + i, n - i, bits, dst + i / 2);
    return;
  }
#endif
  pack_codes(q, n, bits, dst);
}

/// unpack_codes, vectorized for 4-bit codes where compiled.
inline void unpack_codes_simd(std::uint8_t const* src, std::int64_t n, int bits,
                              std::uint8_t* q) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (bits == 4) {
    std::int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m512i const w =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(src + i / 2)));
      __m512i const lo = _mm512_and_si512(w, _mm512_set1_epi16(0x0f));
      __m512i const hi = _mm512_and_si512(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f00));
      _mm512_storeu_si512(q + i, _mm512_or_si512(lo, hi));
    }
    unpack_codes(src + i / 2, n - i, bits, q + i);
    return;
  }
#endif
  unpack_codes(src, n, bits, q);
}

}  // namespace agoq::detail::host
