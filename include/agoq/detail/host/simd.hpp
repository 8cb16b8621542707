/// \file
/// AVX-512 loops of the CPU executor. Each computes exactly what the portable loop of segment.hpp
/// computes: the same division x / scale, the same clamp, round-half-to-even (the conversion's
/// embedded rounding is exact like numeric::rne_small on clamped values), the same bit-level
/// bfloat16 rounding, the same Philox words. Covered: statistics (absolute maximum, ordered
/// min/max), encoding with nearest and stochastic rounding and decoding of every integer code and
/// both FP8 formats, from and to float, bfloat16 and half, one code per byte or 4-bit packed.
/// Where AVX-512 (F, BW, VL) is not enabled at compile time but AVX2 is, simd_avx2.hpp supplies
/// the row path's encoder and decoder of the integer codes and this file the AVX2 Philox draws;
/// everything else forwards to the portable loops.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)) || defined(__AVX2__)
// GCC 12 reports -Wmaybe-uninitialized and -Wuninitialized inside its own AVX-512 headers (GCC bug
// 105593, the _mm512_undefined_* idiom); the diagnostic is located in the header, so it is
// silenced there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define AGOQ_HOST_AVX512 1
#endif
#if defined(__AVX2__)
#define AGOQ_HOST_AVX2 1
#endif
/// Defined where the row path's vector encoder and decoder (encode_simd, decode_simd) are
/// compiled: AVX-512 (this file) or AVX2 (simd_avx2.hpp).
#if defined(AGOQ_HOST_AVX512) || defined(AGOQ_HOST_AVX2)
#define AGOQ_HOST_ROW_SIMD 1
#endif
/// Placed on a host function whose loops the compiler vectorizes on its own (the fused ops' element
/// math: e^x and a division per element), so that GCC gives them 512-bit vectors where AVX-512 is
/// enabled. GCC's tuning for Intel's AVX-512 machines prefers 256-bit vectors, which left those
/// loops bound by their arithmetic at half the throughput (`fused_bench` on a Sapphire Rapids
/// Xeon: the plain GeLU forward 1.4x and the fused one 2x slower); on an AMD EPYC (Zen 5), where
/// g++ takes 512-bit vectors already, only the fused GeLU's call per step shows (5-7% slower:
/// docs/performance.md). Only the vector width changes, not the operations, so every bit stays
/// the same. A function with it is never inlined (a call per row or per piece of a row): g++
/// does inline a small one into a caller without it, whose loops then take 256-bit vectors
/// (swiglu_grads_span did once it became a call to fused_detail::counting_loop). Empty on other
/// compilers and without AVX-512.
#if defined(AGOQ_HOST_AVX512) && defined(__GNUC__) && !defined(__clang__)
#define AGOQ_HOST_WIDE_VECTORS [[gnu::target("prefer-vector-width=512"), gnu::noinline]]
#else
#define AGOQ_HOST_WIDE_VECTORS
#endif
/// Placed before a loop whose iterations depend on none other through memory, even where its
/// outputs are its inputs themselves (each element read before it is written): `#pragma GCC
/// ivdep` under g++, which then drops the overlap test it would make at run time; empty on other
/// compilers (clang warns on the pragma, `-Wunknown-pragmas`).
#if defined(__GNUC__) && !defined(__clang__)
#define AGOQ_HOST_IVDEP _Pragma("GCC ivdep")
#else
#define AGOQ_HOST_IVDEP
#endif

#include "../../numeric/rounding.hpp"
#include "segment.hpp"
#include "simd_avx2.hpp"

namespace agoq::detail::host {

/// True when the CPU executor was compiled with its AVX-512 loops.
#if defined(AGOQ_HOST_AVX512)
inline constexpr bool simd_available = true;
#else
inline constexpr bool simd_available = false;
#endif

/// The vector loops compiled here, by name: "AVX-512" (every loop of this file), "AVX2" (the
/// integer codes' row path of simd_avx2.hpp and the Philox draws) or "portable" (none: the loops
/// of segment.hpp as the compiler vectorizes them).
#if defined(AGOQ_HOST_AVX512)
inline constexpr char const* simd_isa = "AVX-512";
#elif defined(AGOQ_HOST_AVX2)
inline constexpr char const* simd_isa = "AVX2";
#else
inline constexpr char const* simd_isa = "portable";
#endif

#if defined(AGOQ_HOST_ROW_SIMD)
/// True where the row path (whole groups of one row, codes packed in registers: encode_simd,
/// decode_simd) takes Code: 8- and 4-bit codes with AVX-512, 8- and 4-bit integer codes with
/// AVX2, whose FP8 codes are left to the chunk path and g++'s vectorization of the portable loops
/// (faster there than the row path's per-group calls of them).
template <code_format Code>
inline constexpr bool row_simd = (Code::bits == 8 || Code::bits == 4) &&
                                 (simd_available || !is_fp8_code<Code>);
#endif

#if defined(AGOQ_HOST_AVX512)

/// Elements handled per step of the encoding and decoding loops: two vectors of 16 floats.
inline constexpr std::int64_t simd_step = 32;

inline __mmask16 tail_mask16(std::int64_t left) noexcept {
  return left >= 16  ? __mmask16(0xffff)
         : left <= 0 ? __mmask16(0)
                     : static_cast<__mmask16>((1u << left) - 1u);
}

inline __mmask32 tail_mask32(std::int64_t left) noexcept {
  return left >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << left) - 1u);
}

/// Statistics in the element's own lane width (16 bits for bfloat16 and half, 32 for float): a
/// pass without any masking, which is exact whenever every value is finite (non-finite magnitudes
/// are the largest, so the pass detects them); the rare segment holding NaN or ±Inf is redone by
/// the portable loop, which leaves them out and counts them.
template <class T>
struct lanes;
template <>
struct lanes<float> {
  static constexpr int per_vector = 16;
  static __m512i load(float const* x, std::int64_t left) noexcept {
    return left >= 16 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi32(tail_mask16(left), x);
  }
  static __m512i set1(std::uint32_t v) noexcept { return _mm512_set1_epi32(static_cast<int>(v)); }
  static __m512i max_u(__m512i a, __m512i b) noexcept { return _mm512_max_epu32(a, b); }
  static __m512i min_s(__m512i a, __m512i b) noexcept { return _mm512_min_epi32(a, b); }
  static __m512i max_s(__m512i a, __m512i b) noexcept { return _mm512_max_epi32(a, b); }
  static __m512i sign_fill(__m512i a) noexcept { return _mm512_srai_epi32(a, 31); }
  static std::uint32_t reduce_max_u(__m512i a) noexcept {
    return static_cast<std::uint32_t>(_mm512_reduce_max_epu32(a));
  }
  static std::int32_t reduce_min_s(__m512i a) noexcept { return _mm512_reduce_min_epi32(a); }
  static std::int32_t reduce_max_s(__m512i a) noexcept { return _mm512_reduce_max_epi32(a); }
};
template <class T>
requires(sizeof(T) == 2) struct lanes<T> {
  static constexpr int per_vector = 32;
  static __m512i load(T const* x, std::int64_t left) noexcept {
    return left >= 32 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi16(tail_mask32(left), x);
  }
  static __m512i set1(std::uint32_t v) noexcept { return _mm512_set1_epi16(static_cast<short>(v)); }
  static __m512i max_u(__m512i a, __m512i b) noexcept { return _mm512_max_epu16(a, b); }
  static __m512i min_s(__m512i a, __m512i b) noexcept { return _mm512_min_epi16(a, b); }
  static __m512i max_s(__m512i a, __m512i b) noexcept { return _mm512_max_epi16(a, b); }
  static __m512i sign_fill(__m512i a) noexcept { return _mm512_srai_epi16(a, 15); }
  // Reductions fold 32 lanes to 8 and finish with phminposuw (the horizontal unsigned minimum of
  // 8 lanes); x ^ k maps each order onto a decreasing or increasing unsigned one.
  template <class Fold>
  static std::uint32_t fold_min_u(__m512i a, Fold fold, std::uint16_t k) noexcept {
    __m256i const h = fold(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m128i const q = _mm_xor_si128(fold(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)),
                                    _mm_set1_epi16(static_cast<short>(k)));
    return (static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(q))) & 0xffffu) ^ k;
  }
  static std::uint32_t reduce_max_u(__m512i a) noexcept {
    return fold_min_u(
        a, [](auto x, auto y) { return max16(x, y); }, 0xffff);
  }
  static std::int32_t reduce_min_s(__m512i a) noexcept {
    return static_cast<std::int16_t>(fold_min_u(
        a, [](auto x, auto y) { return min16s(x, y); }, 0x8000));
  }
  static std::int32_t reduce_max_s(__m512i a) noexcept {
    return static_cast<std::int16_t>(fold_min_u(
        a, [](auto x, auto y) { return max16s(x, y); }, 0x7fff));
  }
  static __m256i max16(__m256i x, __m256i y) noexcept { return _mm256_max_epu16(x, y); }
  static __m128i max16(__m128i x, __m128i y) noexcept { return _mm_max_epu16(x, y); }
  static __m256i min16s(__m256i x, __m256i y) noexcept { return _mm256_min_epi16(x, y); }
  static __m128i min16s(__m128i x, __m128i y) noexcept { return _mm_min_epi16(x, y); }
  static __m256i max16s(__m256i x, __m256i y) noexcept { return _mm256_max_epi16(x, y); }
  static __m128i max16s(__m128i x, __m128i y) noexcept { return _mm_max_epi16(x, y); }
};

/// Absolute maximum on the magnitude bits (a masked-off tail lane reads +0, which changes
/// nothing).
template <element_type T>
inline segment_stats absmax_simd(T const* x, std::int64_t n) noexcept {
  using L = lanes<T>;
  using B = typename element_bits<T>::type;
  __m512i const mag = L::set1(element_bits<T>::magnitude);
  __m512i acc = _mm512_setzero_si512();
  for (std::int64_t i = 0; i < n; i += L::per_vector) {
    acc = L::max_u(acc, _mm512_and_si512(L::load(x + i, n - i), mag));
  }
  std::uint32_t const m = L::reduce_max_u(acc);
  if (m >= element_bits<T>::inf) return absmax_counting(x, n);
  segment_stats s;
  s.any_finite = n > 0;
  s.stats.absmax = numeric::to_float(element_from_bits<T>(static_cast<B>(m)));
  return s;
}

/// Minimum and maximum in the ordered-integer domain of segment.hpp's minmax_segment: one unmasked
/// pass decides whether the segment is all finite (ordered_finite). Tail lanes are masked to the
/// first element's image.
template <element_type T>
inline segment_stats minmax_simd(T const* x, std::int64_t n) noexcept {
  using L = lanes<T>;
  using S = typename element_bits<T>::signed_type;
  __m512i const mag = L::set1(element_bits<T>::magnitude);
  auto const ordered_vec = [&](__m512i b) {
    // b ^ ((b >> sign) & magnitude), as in ordered().
    return _mm512_ternarylogic_epi32(b, L::sign_fill(b), mag, 0x78);
  };
  __m512i const first = ordered_vec(L::set1(bits_of(x[0])));
  __m512i lo = first;
  __m512i hi = first;
  for (std::int64_t i = 0; i < n; i += L::per_vector) {
    std::int64_t const left = n - i;
    __m512i o;
    if (left >= L::per_vector) {
      o = ordered_vec(_mm512_loadu_si512(x + i));
    } else if constexpr (L::per_vector == 16) {
      o = _mm512_mask_mov_epi32(first, tail_mask16(left),
                                ordered_vec(_mm512_maskz_loadu_epi32(tail_mask16(left), x + i)));
    } else {
      o = _mm512_mask_mov_epi16(first, tail_mask32(left),
                                ordered_vec(_mm512_maskz_loadu_epi16(tail_mask32(left), x + i)));
    }
    lo = L::min_s(lo, o);
    hi = L::max_s(hi, o);
  }
  auto const lo_s = static_cast<S>(L::reduce_min_s(lo));
  auto const hi_s = static_cast<S>(L::reduce_max_s(hi));
  if (!ordered_finite<T>(lo_s, hi_s)) return minmax_counting(x, n);
  return ordered_stats<T>(lo_s, hi_s, n, 0);
}

/// The statistics of one group accumulated from float vectors that hold its elements widened
/// from T (exact), in any order and lane by lane under a mask: the largest magnitude (codes
/// without a zero point) or the minimum and maximum in the ordered-integer domain (codes with
/// one), taken on the floats' bits as absmax_simd and minmax_simd take them on T's bits.
/// Widening keeps the order of magnitudes and of ordered images and keeps NaN and ±Inf apart
/// from finite values, so stats() equals stats_segment_simd of the group. The op loops use it to
/// take a group's statistics from the registers of their own pass over the group.
template <code_format Code>
class value_stats {
 public:
  /// The accumulated statistics reduced to two words: the largest magnitude's bits (hi) or the
  /// least and greatest ordered images (lo, hi).
  struct reduced {
    std::int32_t lo, hi;
  };

  /// Folds in the lanes of m of v.
  [[gnu::always_inline]] void add(__m512 v, __mmask16 m) noexcept {
    __m512i const b = _mm512_castps_si512(v);
    if constexpr (Code::has_zero_point) {
      // b ^ ((b >> 31) & 0x7fffffff), as ordered<float>.
      __m512i const o = _mm512_ternarylogic_epi32(b, _mm512_srai_epi32(b, 31),
                                                  _mm512_set1_epi32(0x7fffffff), 0x78);
      lo_ = _mm512_mask_min_epi32(lo_, m, lo_, o);
      hi_ = _mm512_mask_max_epi32(hi_, m, hi_, o);
    } else {
      hi_ = _mm512_mask_max_epu32(hi_, m, hi_, _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)));
    }
  }

  reduced reduce() const noexcept {
    if constexpr (Code::has_zero_point) {
      return {_mm512_reduce_min_epi32(lo_), _mm512_reduce_max_epi32(hi_)};
    } else {
      return {0, static_cast<std::int32_t>(_mm512_reduce_max_epu32(hi_))};
    }
  }

  /// stats_segment_simd of the group x[0, n) (n > 0) whose values gave r: from r where they are
  /// all finite, else from the portable loop, which leaves NaN and ±Inf out and counts them.
  template <element_type T>
  static segment_stats stats(reduced r, T const* x, std::int64_t n) noexcept {
    if constexpr (Code::has_zero_point) {
      if (!ordered_finite<float>(r.lo, r.hi)) return minmax_counting(x, n);
      return ordered_stats<float>(r.lo, r.hi, n, 0);
    } else {
      if (static_cast<std::uint32_t>(r.hi) >= 0x7f800000u) return absmax_counting(x, n);
      segment_stats s;
      s.stats.absmax = numeric::bits_float(static_cast<std::uint32_t>(r.hi));
      s.any_finite = true;
      return s;
    }
  }

 private:
  __m512i lo_ = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::max());
  __m512i hi_ = Code::has_zero_point ? _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min())
                                     : _mm512_setzero_si512();
};

/// How a step's 32 elements sit in its two vectors of 16 floats. bfloat16 splits into even and
/// odd elements (one shift or mask of the loaded bits), float and half into the first and second
/// 16. The code packing and the output narrowing follow the same split.
template <class T>
inline constexpr bool interleaved = std::is_same_v<T, bfloat16>;

/// A step's two float vectors, and which of their lanes hold elements.
struct step_values {
  __m512 v0, v1;
  __mmask16 m0, m1;
};

/// The valid lanes of the two vectors of a step with `left` elements. Always inlined: every step
/// of the encoding loops computes them, and g++ stops inlining them into those loops once a
/// translation unit holds many of them.
template <class T>
[[gnu::always_inline]] inline void step_masks(std::int64_t left, __mmask16& m0,
                                              __mmask16& m1) noexcept {
  if constexpr (interleaved<T>) {
    m0 = tail_mask16((left + 1) / 2);
    m1 = tail_mask16(left / 2);
  } else {
    m0 = tail_mask16(left);
    m1 = tail_mask16(left - 16);
  }
}

/// Loads a step (at most `left` elements; absent ones read as +0) widened to floats.
template <class T>
[[gnu::always_inline]] inline step_values load_step(T const* x, std::int64_t left) noexcept {
  step_values s;
  step_masks<T>(left, s.m0, s.m1);
  if constexpr (std::is_same_v<T, float>) {
    if (left >= simd_step) {
      s.v0 = _mm512_loadu_ps(x);
      s.v1 = _mm512_loadu_ps(x + 16);
    } else {
      s.v0 = _mm512_maskz_loadu_ps(s.m0, x);
      s.v1 = _mm512_maskz_loadu_ps(s.m1, x + 16);
    }
  } else {
    __m512i const w = lanes<T>::load(x, left);
    if constexpr (interleaved<T>) {
      s.v0 = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      s.v1 = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536)));
    } else {
      s.v0 = _mm512_cvtph_ps(_mm512_castsi512_si256(w));
      s.v1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1));
    }
  }
  return s;
}

/// Rearranges a step's two vectors from element order (v0: elements 0-15, v1: 16-31) to the
/// arrangement of a step of A.
template <class A>
inline void arrange(__m512& v0, __m512& v1) noexcept {
  if constexpr (interleaved<A>) {
    __m512i const even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512 const e = _mm512_permutex2var_ps(v0, even, v1);
    v1 = _mm512_permutex2var_ps(v0, _mm512_add_epi32(even, _mm512_set1_epi32(1)), v1);
    v0 = e;
  }
}

/// Rearranges a step's two vectors from the arrangement of a step of A to element order.
template <class A>
inline void unarrange(__m512& v0, __m512& v1) noexcept {
  if constexpr (interleaved<A>) {
    __m512i const low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    __m512 const first = _mm512_permutex2var_ps(v0, low, v1);
    v1 = _mm512_permutex2var_ps(v0, _mm512_add_epi32(low, _mm512_set1_epi32(8)), v1);
    v0 = first;
  }
}

/// Loads a step of T (at most `left` elements; absent ones read as +0) widened to floats and
/// arranged like a step of A (the op loops keep one arrangement for operands of mixed types).
template <class A, class T>
[[gnu::always_inline]] inline step_values load_step_as(T const* x, std::int64_t left) noexcept {
  step_values s = load_step(x, left);
  if constexpr (interleaved<A> != interleaved<T>) {
    unarrange<T>(s.v0, s.v1);
    arrange<A>(s.v0, s.v1);
    step_masks<A>(left, s.m0, s.m1);
  }
  return s;
}

/// The float lanes of u[0, 32) arranged like a step of T.
template <class T>
inline void load_draws(float const* u, __m512& u0, __m512& u1) noexcept {
  u0 = _mm512_loadu_ps(u);
  u1 = _mm512_loadu_ps(u + 16);
  arrange<T>(u0, u1);
}

/// Per-group constants of an encoder: the divisor and the clamp range of x / scale.
template <code_format Code>
struct encoder {
  __m512 scale;
  __m512 inverse;
  bool power_of_two;
  __m512 lo = _mm512_setzero_ps();
  __m512 hi = _mm512_setzero_ps();
  __m512i zero_point;

  explicit encoder(group_params p) noexcept
      : scale(_mm512_set1_ps(p.scale)), zero_point(_mm512_set1_epi32(p.zero_point)) {
    // A power-of-two scale (every e8m0 one) up to 2^126 has a normal power-of-two reciprocal, and
    // x * (1 / scale) is then x / scale bit for bit: both round the same real number once (and
    // flush it alike where the result is subnormal). The divider is what bounds the encoding of
    // 32-element groups, one division per 16 elements.
    std::uint32_t const b = numeric::float_bits(p.scale);
    power_of_two = (b & 0x7fffffu) == 0 && b >= 0x00800000u && b <= 0x7e800000u;
    inverse = _mm512_set1_ps(power_of_two ? 1.0f / p.scale : 0.0f);
    if constexpr (!is_fp8_code<Code>) {
      numeric::quotient_range const r = numeric::integer_range<Code>(p);
      lo = _mm512_set1_ps(r.lo);
      hi = _mm512_set1_ps(r.hi);
    }
  }

  /// x / scale.
  [[gnu::always_inline]] __m512 quotient(__m512 x) const noexcept {
    return power_of_two ? _mm512_mul_ps(x, inverse) : _mm512_div_ps(x, scale);
  }

  /// Clamps x / scale to the code's range. NaN survives (max and min return their second operand
  /// when it is NaN), and converts to 0x80000000, whose low bits are those of the code of zero.
  __m512 clamped(__m512 x) const noexcept {
    return _mm512_min_ps(hi, _mm512_max_ps(lo, quotient(x)));
  }

  /// Codes (in the low Code::bits bits of each lane) of round-half-to-even.
  __m512i nearest(__m512 x) const noexcept {
    if constexpr (is_fp8_code<Code>) {
      return fp8_nearest(quotient(x));
    } else {
      __m512i const c =
          _mm512_cvt_roundps_epi32(clamped(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if constexpr (Code::has_zero_point) return _mm512_add_epi32(c, zero_point);
      return c;
    }
  }

  /// Codes of stochastic rounding. Integer codes: numeric::floor_stochastic of the clamped
  /// x / scale, floor(v) plus one where 1 - u <= v - floor(v) (u >= -v where floor(v) = -1).
  /// FP8 codes: fp8_stochastic of x / scale.
  __m512i stochastic(__m512 x, __m512 u) const noexcept {
    if constexpr (is_fp8_code<Code>) {
      return fp8_stochastic(quotient(x), u);
    } else {
      __m512 const v = clamped(x);
      __m512 const down = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      __mmask16 const minus_one = _mm512_cmp_ps_mask(down, _mm512_set1_ps(-1.0f), _CMP_EQ_OQ);
      __mmask16 const up_near_zero =
          _mm512_cmp_ps_mask(u, _mm512_sub_ps(_mm512_setzero_ps(), v), _CMP_GE_OQ);
      __mmask16 const up_elsewhere = _mm512_cmp_ps_mask(_mm512_sub_ps(_mm512_set1_ps(1.0f), u),
                                                        _mm512_sub_ps(v, down), _CMP_LE_OQ);
      __mmask16 const up = (minus_one & up_near_zero) | (~minus_one & up_elsewhere);
      // NaN lanes compare false and convert to 0x80000000, whose low bits are the code of zero.
      __m512i c = _mm512_cvttps_epi32(down);
      c = _mm512_mask_add_epi32(c, up, c, _mm512_set1_epi32(1));
      if constexpr (Code::has_zero_point) return _mm512_add_epi32(c, zero_point);
      return c;
    }
  }

  /// numeric::fp8_magnitude_to_float of magnitude codes up to 0x7f, lane by lane (exact).
  static __m512 fp8_magnitude_values(__m512i mag) noexcept {
    constexpr numeric::fp8_format f = Code::format;
    constexpr int mbits = f.mantissa_bits;
    // Normal: the exponent rebiased into the float's, the mantissa moved to the top of the float's.
    __m512 const normal = _mm512_castsi512_ps(_mm512_add_epi32(
        _mm512_slli_epi32(mag, 23 - mbits),
        _mm512_set1_epi32(
            static_cast<int>((127u - static_cast<std::uint32_t>(f.exponent_bias)) << 23))));
    // Subnormal: the mantissa times the subnormal step (a power of two), exact.
    __m512 const sub =
        _mm512_mul_ps(_mm512_cvtepi32_ps(mag),
                      _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(f.step_bits()))));
    return _mm512_mask_mov_ps(normal, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(1 << mbits)),
                              sub);
  }

  /// numeric::encode_stochastic of an FP8 code on v = x / scale, lane by lane: the magnitude
  /// truncated toward zero (saturating at the largest finite value, ±Inf and NaN included), then
  /// one up where (1 - u) * (hi - lo) <= |v| - lo for its neighbours lo and hi. Both sides are
  /// exact (a 24-bit 1 - u times a power of two, a Sterbenz difference), so the comparison decides
  /// exactly as the scalar one; NaN encodes to 0.
  static __m512i fp8_stochastic(__m512 v, __m512 u) noexcept {
    constexpr numeric::fp8_format f = Code::format;
    constexpr std::uint32_t min_normal_bits = f.min_normal_bits();
    constexpr std::uint32_t inv_step_bits = f.inv_step_bits();
    constexpr unsigned drop = f.drop();
    constexpr std::uint32_t rebias = f.rebias();
    __m512i const bits = _mm512_castps_si512(v);
    __m512i const a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    __m512 const af = _mm512_castsi512_ps(a);
    __m512i const sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    // Truncation: the dropped bits cut off (normal range), or an exact power-of-two multiply
    // converted toward zero (subnormal range).
    __m512i mag =
        _mm512_sub_epi32(_mm512_srli_epi32(a, drop), _mm512_set1_epi32(static_cast<int>(rebias)));
    __mmask16 const sub =
        _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(static_cast<int>(min_normal_bits)));
    mag = _mm512_mask_mov_epi32(
        mag, sub,
        _mm512_cvttps_epi32(_mm512_mul_ps(
            af, _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(inv_step_bits))))));
    __m512i const max_code = _mm512_set1_epi32(f.max_code);
    mag = _mm512_mask_mov_epi32(
        mag, _mm512_cmp_ps_mask(af, _mm512_set1_ps(f.max_value), _CMP_NLT_UQ), max_code);
    // Below the largest finite value: round up with probability (|v| - lo) / (hi - lo).
    __mmask16 const below = _mm512_cmplt_epu32_mask(mag, max_code);
    __m512 const lo = fp8_magnitude_values(mag);
    __m512 const hi = fp8_magnitude_values(_mm512_add_epi32(mag, _mm512_set1_epi32(1)));
    __mmask16 const up = _mm512_mask_cmp_ps_mask(
        below, _mm512_mul_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), u), _mm512_sub_ps(hi, lo)),
        _mm512_sub_ps(af, lo), _CMP_LE_OQ);
    mag = _mm512_mask_add_epi32(mag, up, mag, _mm512_set1_epi32(1));
    __mmask16 const nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    return _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), _mm512_or_si512(sign, mag));
  }

  /// numeric::float_to_fp8_rne_sat, lane by lane.
  static __m512i fp8_nearest(__m512 v) noexcept {
    constexpr numeric::fp8_format f = Code::format;
    constexpr std::uint32_t min_normal_bits = f.min_normal_bits();
    constexpr std::uint32_t inv_step_bits = f.inv_step_bits();
    constexpr unsigned drop = f.drop();
    constexpr std::uint32_t rebias = f.rebias();
    __m512i const u = _mm512_castps_si512(v);
    __m512i const a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __m512i const sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    // Normal range: round the dropped bits to even on the integer bits.
    __m512i const rounded = _mm512_add_epi32(
        _mm512_add_epi32(a, _mm512_set1_epi32(static_cast<int>((1u << (drop - 1u)) - 1u))),
        _mm512_and_si512(_mm512_srli_epi32(a, drop), _mm512_set1_epi32(1)));
    __m512i mag = _mm512_sub_epi32(_mm512_srli_epi32(rounded, drop),
                                   _mm512_set1_epi32(static_cast<int>(rebias)));
    // Subnormal range: an exact power-of-two multiply, then round half to even.
    __mmask16 const sub =
        _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(static_cast<int>(min_normal_bits)));
    __m512i const sub_mag = _mm512_cvt_roundps_epi32(
        _mm512_mul_ps(_mm512_castsi512_ps(a),
                      _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(inv_step_bits)))),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    mag = _mm512_mask_mov_epi32(mag, sub, sub_mag);
    // At or above the largest finite value (Inf included) saturate; rounding may also reach it.
    __mmask16 const big =
        _mm512_cmp_ps_mask(_mm512_castsi512_ps(a), _mm512_set1_ps(f.max_value), _CMP_NLT_UQ);
    __m512i const max_code = _mm512_set1_epi32(f.max_code);
    mag = _mm512_mask_mov_epi32(_mm512_min_epu32(mag, max_code), big, max_code);
    __m512i const code = _mm512_or_si512(sign, mag);
    __mmask16 const nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    return _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), code);
  }
};

/// Writes a step's codes (low Code::bits bits of each lane) as `Width`-bit fields: one per byte
/// (Width 8) or two per byte, least significant first (Width 4). `left` elements are written;
/// lanes past them must hold 0 for Width 4, where they share the last byte.
template <int Width, int Bits, class T>
inline void store_codes(std::uint8_t* dst, __m512i c0, __m512i c1, std::int64_t left) noexcept {
  static_assert(Width == 8 || (Width == 4 && Bits == 4));
  if constexpr (Width == 8 && Bits < 8) {
    __m512i const m = _mm512_set1_epi32(static_cast<int>(numeric::code_mask(Bits)));
    c0 = _mm512_and_si512(c0, m);
    c1 = _mm512_and_si512(c1, m);
  }
  if constexpr (Width == 8) {
    __m256i bytes;
    if constexpr (interleaved<T>) {
      // (c0 & 0xff) | (c1 << 8) per 32-bit lane, narrowed to 16 bits: even byte, odd byte.
      bytes = _mm512_cvtepi32_epi16(
          _mm512_ternarylogic_epi32(c0, _mm512_set1_epi32(0xff), _mm512_slli_epi32(c1, 8), 0xea));
    } else {
      bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(c0)),
                                      _mm512_cvtepi32_epi8(c1), 1);
    }
    if (left >= simd_step) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bytes);
    } else {
      _mm256_mask_storeu_epi8(dst, tail_mask32(left), bytes);
    }
  } else {
    __m128i bytes;
    if constexpr (interleaved<T>) {
      // (c0 & 0x0f) | ((c1 << 4) & 0xf0) per 32-bit lane, narrowed to 8 bits.
      bytes = _mm512_cvtepi32_epi8(
          _mm512_ternarylogic_epi32(c0, _mm512_set1_epi32(0x0f), _mm512_slli_epi32(c1, 4), 0xe2));
    } else {
      // Within each 64-bit lane, the odd element's nibble joins the even one's at bit 4.
      __m512i const m = _mm512_set1_epi32(0x0f);
      __m512i const a = _mm512_and_si512(c0, m);
      __m512i const b = _mm512_and_si512(c1, m);
      bytes =
          _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(_mm512_or_si512(a, _mm512_srli_epi64(a, 28))),
                             _mm512_cvtepi64_epi8(_mm512_or_si512(b, _mm512_srli_epi64(b, 28))));
    }
    if (left >= simd_step) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bytes);
    } else {
      _mm_mask_storeu_epi8(dst, static_cast<__mmask16>(tail_mask32((left + 1) / 2)), bytes);
    }
  }
}

/// Encodes one step of a group whose scale is not 0: the values v0, v1 arranged like a step of A,
/// the first `left` elements of which are written as `Width`-bit fields at dst. u: the step's
/// draws in element order (stochastic rounding; `left` of them are read), else unused.
template <code_format Code, rounding_kind Rounding, int Width, class A>
[[gnu::always_inline, gnu::flatten]] inline void encode_step(encoder<Code> const& e, __m512 v0,
                                                             __m512 v1, float const* u,
                                                             std::int64_t left,
                                                             std::uint8_t* dst) noexcept {
  __m512i c0, c1;
  if constexpr (Rounding == rounding_kind::stochastic) {
    __m512 u0, u1;
    if (left >= simd_step) {
      load_draws<A>(u, u0, u1);
    } else {
      float tail[simd_step] = {};
      std::memcpy(tail, u, static_cast<std::size_t>(left) * sizeof(float));
      load_draws<A>(tail, u0, u1);
    }
    c0 = e.stochastic(v0, u0);
    c1 = e.stochastic(v1, u1);
  } else {
    c0 = e.nearest(v0);
    c1 = e.nearest(v1);
  }
  if (left < simd_step) {
    __mmask16 m0, m1;
    step_masks<A>(left, m0, m1);
    c0 = _mm512_maskz_mov_epi32(m0, c0);
    c1 = _mm512_maskz_mov_epi32(m1, c1);
  }
  store_codes<Width, Code::bits, A>(dst, c0, c1, left);
}

/// Encodes x[0, n) of one group into `Width`-bit fields at dst (numeric::encode_nearest or
/// encode_stochastic per element; u[i] is element i's draw for stochastic rounding).
template <code_format Code, rounding_kind Rounding, int Width, element_type T>
inline void encode_simd(T const* x, std::int64_t n, group_params p, float const* u,
                        std::uint8_t* dst) noexcept {
  if (p.scale == 0.0f) {
    encode_zero_scale<Code, Width>(n, p, dst);
    return;
  }
  encoder<Code> const e(p);
  for (std::int64_t i = 0; i < n; i += simd_step) {
    step_values const s = load_step(x + i, n - i);
    encode_step<Code, Rounding, Width, T>(e, s.v0, s.v1,
                                          Rounding == rounding_kind::stochastic ? u + i : nullptr,
                                          n - i, dst + i * Width / 8);
  }
}

/// Groups whose statistics and parameters small_group_params takes together: one per lane.
inline constexpr int small_group_batch = 16;

/// One level of lane_maxima: v[i] = the lane-wise maxima of the two halves (first and second W
/// lanes of each run of 2W) of the pair (v[2i], v[2i + 1]), whose runs of 2W lanes each hold one
/// group's partial maxima; the result's runs of W lanes hold the pair's groups in order.
template <int W>
[[gnu::always_inline]] inline void fold_level(__m512i (&v)[small_group_batch]) noexcept {
  constexpr auto at = [](int i) { return (i / W) * 2 * W + i % W; };
  __m512i const lo =
      _mm512_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9),
                        at(10), at(11), at(12), at(13), at(14), at(15));
  __m512i const hi = _mm512_add_epi32(lo, _mm512_set1_epi32(W));
  [&]<int... I>(std::integer_sequence<int, I...>) {  // the W pairs, unrolled
    ((v[I] = _mm512_max_epu32(_mm512_permutex2var_epi32(v[2 * I], lo, v[2 * I + 1]),
                              _mm512_permutex2var_epi32(v[2 * I], hi, v[2 * I + 1]))),
     ...);
  }
  (std::make_integer_sequence<int, W>{});
}

/// Lane j of the result: the largest (unsigned) of the 16 lanes of v[j]. A transposing reduction
/// (fold_level with runs of 8, 4, 2 and 1 lanes): 15 maxima and 30 permutes for 16 groups, where a
/// reduction per group takes 4 maxima and 4 shuffles. Clobbers v.
[[gnu::always_inline]] inline __m512i lane_maxima(__m512i (&v)[small_group_batch]) noexcept {
  fold_level<8>(v);
  fold_level<4>(v);
  fold_level<2>(v);
  fold_level<1>(v);
  return v[0];
}

/// Statistics and parameters of `m` <= small_group_batch groups of at most simd_step elements
/// each, for codes without a zero point: group j is the n elements at x given by group(j) -> {x,
/// n}. Its largest magnitude is taken as absmax_simd takes it (on the widened floats' magnitude
/// bits, which order like T's), the 16 groups' reduced together (lane_maxima), and its scale is
/// make_group_params' (absmax / range_divisor rounded up to the scale format, 0 below the
/// smallest normal float) for the 16 groups in one vector, stored at `scales` (the first group's
/// stored scale) in one masked store. A group holding NaN or ±Inf takes the portable counting
/// loop, as absmax_simd's does. params[j] receives group j's parameters. Returns the non-finite
/// count. Equal, bit for bit, to stats_segment_simd, make_group_params and store_group_params of
/// each group.
template <code_format Code, element_type T, class Group>
requires(!Code::has_zero_point) std::int64_t
    small_group_params(int m, Group&& group, scale_format f, std::uint8_t* scales,
                       group_params* params)
noexcept {
  __m512i v[small_group_batch];
  __m512i const magnitude = _mm512_set1_epi32(0x7fffffff);
  for (int j = 0; j < small_group_batch; ++j) {
    if (j >= m) {
      v[j] = _mm512_setzero_si512();
      continue;
    }
    auto const [x, n] = group(j);
    prefetch_ahead(x, n * static_cast<std::int64_t>(sizeof(T)));
    step_values const st = load_step(x, n);
    v[j] = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(st.v0), magnitude),
                            _mm512_and_si512(_mm512_castps_si512(st.v1), magnitude));
  }
  __m512i absmax = lane_maxima(v);
  std::int64_t nonfinite = 0;
  // A 16-bit mask, tested and cleared as one: g++ 12 at -O1 spilled a mask converted to unsigned
  // with a 16-bit store and reloaded it with a 32-bit read, so the loop met lanes past 15.
  __mmask16 bad = _mm512_cmpge_epu32_mask(absmax, _mm512_set1_epi32(0x7f800000));
  if (bad != 0) {
    alignas(64) std::uint32_t bits[small_group_batch];
    _mm512_store_si512(bits, absmax);
    for (; bad != 0; bad = static_cast<__mmask16>(bad & (bad - 1))) {
      int const j = std::countr_zero(static_cast<std::uint16_t>(bad));
      auto const [x, n] = group(j);
      segment_stats const c = absmax_counting(x, n);
      nonfinite += c.nonfinite;
      bits[j] = numeric::float_bits(c.stats.absmax);
    }
    absmax = _mm512_load_si512(bits);
  }
  __m512i u = _mm512_castps_si512(
      _mm512_div_ps(_mm512_castsi512_ps(absmax), _mm512_set1_ps(Code::range_divisor)));
  if (f == scale_format::bf16) {  // scale_bf16::round_up
    __mmask16 const up = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0xffff));
    u = _mm512_mask_add_epi32(u, up, _mm512_and_si512(u, _mm512_set1_epi32(-65536)),
                              _mm512_set1_epi32(0x10000));
    u = _mm512_mask_mov_epi32(u, _mm512_cmpge_epu32_mask(u, _mm512_set1_epi32(0x7f800000)),
                              _mm512_set1_epi32(0x7f7f0000));
  } else if (f == scale_format::e8m0) {  // scale_e8m0::round_up
    __mmask16 const up = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffff));
    u = _mm512_mask_add_epi32(u, up, _mm512_and_si512(u, _mm512_set1_epi32(0x7f800000)),
                              _mm512_set1_epi32(0x800000));
    u = _mm512_mask_mov_epi32(u, _mm512_cmpgt_epu32_mask(u, _mm512_set1_epi32(0x7f000000)),
                              _mm512_set1_epi32(0x7f000000));
  }
  __m512 const scale =
      _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_castsi512_ps(u),
                                             _mm512_set1_ps(numeric::min_normal_float), _CMP_GE_OQ),
                          _mm512_castsi512_ps(u));
  __mmask16 const lanes = tail_mask16(m);
  __m512i const b = _mm512_castps_si512(scale);
  switch (f) {
    case scale_format::f32:
      _mm512_mask_storeu_ps(scales, lanes, scale);
      break;
    case scale_format::bf16:
      _mm256_mask_storeu_epi16(scales, lanes, _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16)));
      break;
    case scale_format::e8m0:
      _mm_mask_storeu_epi8(scales, lanes, _mm512_cvtepi32_epi8(_mm512_srli_epi32(b, 23)));
      break;
  }
  alignas(64) float s[small_group_batch];
  _mm512_store_ps(s, scale);
  for (int j = 0; j < m; ++j) params[j] = group_params{s[j], 0};
  return nonfinite;
}

/// Loads a step of `Width`-bit fields as 32-bit lanes holding each code in their top Bits bits,
/// split like a step of T (absent codes read as 0).
template <int Width, int Bits, class T>
inline void load_codes(std::uint8_t const* src, std::int64_t left, __m512i& c0,
                       __m512i& c1) noexcept {
  if constexpr (Width == 8) {
    __m256i const b = left >= simd_step ? _mm256_loadu_si256(reinterpret_cast<__m256i const*>(src))
                                        : _mm256_maskz_loadu_epi8(tail_mask32(left), src);
    if constexpr (interleaved<T>) {
      __m512i const w = _mm512_cvtepu8_epi16(b);
      c0 = _mm512_slli_epi32(w, 32 - Bits);
      c1 = _mm512_slli_epi32(w, 16 - Bits);
    } else {
      c0 = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)), 32 - Bits);
      c1 = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)), 32 - Bits);
    }
  } else {
    __m128i const b =
        left >= simd_step
            ? _mm_loadu_si128(reinterpret_cast<__m128i const*>(src))
            : _mm_maskz_loadu_epi8(static_cast<__mmask16>(tail_mask32((left + 1) / 2)), src);
    if constexpr (interleaved<T>) {
      __m512i const w = _mm512_cvtepu8_epi32(b);
      c0 = _mm512_slli_epi32(w, 28);
      c1 = _mm512_slli_epi32(w, 24);
    } else {
      // Byte k of 8 in its own 64-bit lane; the high nibble moves to the upper 32-bit half.
      __m512i const lo = _mm512_cvtepu8_epi64(b);
      __m512i const hi = _mm512_cvtepu8_epi64(_mm_unpackhi_epi64(b, b));
      c0 = _mm512_slli_epi32(_mm512_or_si512(lo, _mm512_slli_epi64(lo, 28)), 28);
      c1 = _mm512_slli_epi32(_mm512_or_si512(hi, _mm512_slli_epi64(hi, 28)), 28);
    }
  }
}

/// numeric::fp8_to_float of codes held in the top 8 bits of each lane.
template <code_format Code>
inline __m512 fp8_values(__m512i c) noexcept {
  constexpr numeric::fp8_format f = Code::format;
  constexpr int mbits = f.mantissa_bits;
  __m512i const mag = _mm512_srli_epi32(_mm512_slli_epi32(c, 1), 25);
  // Normal: exponent rebiased into the float's, mantissa moved to the top of the float's.
  __m512i v = _mm512_add_epi32(_mm512_slli_epi32(mag, 23 - mbits),
                               _mm512_set1_epi32(static_cast<int>(
                                   (127u - static_cast<std::uint32_t>(f.exponent_bias)) << 23)));
  // Subnormal: mantissa times the subnormal step (a power of two), exact.
  __mmask16 const sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(1 << mbits));
  std::uint32_t const step_exp =
      127u + 1u - static_cast<std::uint32_t>(f.exponent_bias) - static_cast<std::uint32_t>(mbits);
  v = _mm512_mask_mov_epi32(
      v, sub,
      _mm512_castps_si512(
          _mm512_mul_ps(_mm512_cvtepi32_ps(mag),
                        _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(step_exp << 23))))));
  v = _mm512_mask_mov_epi32(v, _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(f.max_code)),
                            _mm512_set1_epi32(0x7fc00000));
  if constexpr (mbits == 2) {
    v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7c)),
                              _mm512_set1_epi32(0x7f800000));
  }
  return _mm512_castsi512_ps(
      _mm512_or_si512(v, _mm512_and_si512(c, _mm512_set1_epi32(static_cast<int>(0x80000000u)))));
}

/// numeric::decode of codes held in the top Code::bits bits of each lane, before its saturation
/// at ±FLT_MAX: the same values wherever that cannot bind (decode_saturates false).
template <code_format Code>
[[gnu::always_inline]] inline __m512 decode_product(__m512i c, __m512 scale,
                                                    __m512i zero_point) noexcept {
  if constexpr (is_fp8_code<Code>) {
    return _mm512_mul_ps(fp8_values<Code>(c), scale);
  } else if constexpr (Code::has_zero_point) {
    return _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(c, 32 - Code::bits), zero_point)),
        scale);
  } else {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(c, 32 - Code::bits)), scale);
  }
}

/// Whether decode_vec's saturation at ±FLT_MAX can change a decode_product under `scale`: for FP8
/// codes (which hold infinities, or values up to 57344), and for integer codes (step counts, code
/// minus zero point, at most 255 in magnitude) under a scale that is not finite or above
/// FLT_MAX / 256 (about 2^120).
template <code_format Code>
inline bool decode_saturates(float scale) noexcept {
  return is_fp8_code<Code> || !(std::abs(scale) <= numeric::max_finite_float / 256.0f);
}

/// numeric::decode of codes held in the top Code::bits bits of each lane.
template <code_format Code>
inline __m512 decode_vec(__m512i c, __m512 scale, __m512i zero_point) noexcept {
  __m512 const y = decode_product<Code>(c, scale, zero_point);
  // Saturate at ±FLT_MAX like numeric's decode; max/min return their second operand (y) for NaN.
  __m512 const m = _mm512_set1_ps(numeric::max_finite_float);
  return _mm512_min_ps(m, _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), m), y));
}

/// numeric::float_to_bf16_bits of each lane, left in the lane's top 16 bits (low bits garbage).
inline __m512i bf16_rounded_high(__m512 v) noexcept {
  __m512i const u = _mm512_castps_si512(v);
  __m512i const lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i const r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  __mmask16 const nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
}

/// Narrows a step's two float vectors to T (round half to even) and stores `left` elements.
template <class T>
[[gnu::always_inline]] inline void store_step(T* y, __m512 v0, __m512 v1,
                                              std::int64_t left) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    if (left >= simd_step) {
      _mm512_storeu_ps(y, v0);
      _mm512_storeu_ps(y + 16, v1);
    } else {
      _mm512_mask_storeu_ps(y, tail_mask16(left), v0);
      _mm512_mask_storeu_ps(y + 16, tail_mask16(left - 16), v1);
    }
  } else {
    __m512i w;
    if constexpr (interleaved<T>) {
      // Even element in the low 16 bits, odd element in the high 16 bits of each 32-bit lane.
      w = _mm512_ternarylogic_epi32(_mm512_srli_epi32(bf16_rounded_high(v0), 16),
                                    _mm512_set1_epi32(-65536), bf16_rounded_high(v1), 0xf8);
    } else {
      w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(
                                 v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                             _mm512_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 1);
    }
    if (left >= simd_step) {
      _mm512_storeu_si512(y, w);
    } else {
      _mm512_mask_storeu_epi16(y, tail_mask32(left), w);
    }
  }
}

/// Stores a step's two float vectors, arranged like a step of A, as `left` elements of T.
template <class A, class T>
[[gnu::always_inline]] inline void store_step_as(T* y, __m512 v0, __m512 v1,
                                                 std::int64_t left) noexcept {
  if constexpr (interleaved<A> != interleaved<T>) {
    unarrange<A>(v0, v1);
    arrange<T>(v0, v1);
  }
  store_step(y, v0, v1, left);
}

/// The lanes of m of x[0, 16) widened to floats in element order (lane j: x[j]); the other
/// lanes read as +0. A whole vector (m all ones) takes a plain load: a masked load is slow to
/// miss the cache.
template <element_type T>
[[gnu::always_inline]] inline __m512 load16(T const* x, __mmask16 m) noexcept {
  bool const whole = m == __mmask16(0xffff);
  if constexpr (std::is_same_v<T, float>) {
    return whole ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(m, x);
  } else {
    __m256i const w = whole ? _mm256_loadu_si256(reinterpret_cast<__m256i const*>(x))
                            : _mm256_maskz_loadu_epi16(m, x);
    if constexpr (std::is_same_v<T, bfloat16>) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16));
    } else {
      return _mm512_cvtph_ps(w);
    }
  }
}

/// Decodes a step of `Width`-bit fields at src (at most `left` codes; absent ones decode from code
/// 0) into x0 and x1, split like a step of T: decode_vec, or decode_product where Saturate is false
/// (decode_saturates is false for the group's scale).
template <code_format Code, int Width, class T, bool Saturate>
[[gnu::always_inline]] inline void decode_step(std::uint8_t const* src, std::int64_t left,
                                               __m512 scale, __m512i zero_point, __m512& x0,
                                               __m512& x1) noexcept {
  __m512i c0, c1;
  load_codes<Width, Code::bits, T>(src, left, c0, c1);
  if constexpr (Saturate) {
    x0 = decode_vec<Code>(c0, scale, zero_point);
    x1 = decode_vec<Code>(c1, scale, zero_point);
  } else {
    x0 = decode_product<Code>(c0, scale, zero_point);
    x1 = decode_product<Code>(c1, scale, zero_point);
  }
}

/// Decodes n codes of one group, `Width`-bit fields at src, into y (without decode_vec's
/// saturation where it cannot bind).
template <code_format Code, int Width, element_type T>
inline void decode_simd(std::uint8_t const* src, std::int64_t n, group_params p, T* y) noexcept {
  __m512 const scale = _mm512_set1_ps(p.scale);
  __m512i const zero_point = _mm512_set1_epi32(p.zero_point);
  auto const decode = [&](auto saturate) {
    for (std::int64_t i = 0; i < n; i += simd_step) {
      __m512 x0, x1;
      decode_step<Code, Width, T, decltype(saturate)::value>(src + i * Width / 8, n - i, scale,
                                                             zero_point, x0, x1);
      store_step(y + i, x0, x1, n - i);
    }
  };
  if (decode_saturates<Code>(p.scale)) {
    decode(std::true_type{});
  } else {
    decode(std::false_type{});
  }
}

#endif  // AGOQ_HOST_AVX512

/// The vector operations of philox_draws on Lanes 32-bit lanes: 16 (AVX-512) or 8 (AVX2), each
/// specialized where its instructions are compiled.
template <int Lanes>
struct philox_vector;

#if defined(AGOQ_HOST_AVX512)
template <>
struct philox_vector<16> {
  using type = __m512i;
  static type set1(std::uint32_t v) noexcept { return _mm512_set1_epi32(static_cast<int>(v)); }
  /// Lane k runs block b + 4 * (k % 4) + k / 4.
  static type counters(std::uint32_t b) noexcept {
    return _mm512_add_epi32(
        set1(b), _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  }
  static type zero() noexcept { return _mm512_setzero_si512(); }
  /// The low and high halves of each lane's product with m.
  static void mul_wide(type a, std::uint32_t m, type& lo, type& hi) noexcept {
    type const mv = set1(m);
    type const even = _mm512_mul_epu32(a, mv);
    type const odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), mv);
    lo = _mm512_mullo_epi32(a, mv);
    hi = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(even, 32), odd);
  }
  static type xor3(type a, type b, type c) noexcept {
    return _mm512_ternarylogic_epi32(a, b, c, 0x96);
  }
  static type unpacklo32(type a, type b) noexcept { return _mm512_unpacklo_epi32(a, b); }
  static type unpackhi32(type a, type b) noexcept { return _mm512_unpackhi_epi32(a, b); }
  static type unpacklo64(type a, type b) noexcept { return _mm512_unpacklo_epi64(a, b); }
  static type unpackhi64(type a, type b) noexcept { return _mm512_unpackhi_epi64(a, b); }
  /// The draws of a vector of words, as numeric::uniform24 makes them: (w >> 8) * 2^-24.
  static void store_draws(float* u, type w) noexcept {
    _mm512_storeu_ps(u, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 8)),
                                      _mm512_set1_ps(5.9604644775390625e-8f)));
  }
};
#endif

#if defined(AGOQ_HOST_AVX2)
template <>
struct philox_vector<8> {
  using type = __m256i;
  static type set1(std::uint32_t v) noexcept { return _mm256_set1_epi32(static_cast<int>(v)); }
  /// Lane k runs block b + 2 * (k % 4) + k / 4.
  static type counters(std::uint32_t b) noexcept {
    return _mm256_add_epi32(set1(b), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  }
  static type zero() noexcept { return _mm256_setzero_si256(); }
  /// The low and high halves of each lane's product with m (vpmuludq on the even and odd words).
  static void mul_wide(type a, std::uint32_t m, type& lo, type& hi) noexcept {
    type const mv = set1(m);
    type const even = _mm256_mul_epu32(a, mv);
    type const odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), mv);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xaa);
  }
  static type xor3(type a, type b, type c) noexcept {
    return _mm256_xor_si256(_mm256_xor_si256(a, b), c);
  }
  static type unpacklo32(type a, type b) noexcept { return _mm256_unpacklo_epi32(a, b); }
  static type unpackhi32(type a, type b) noexcept { return _mm256_unpackhi_epi32(a, b); }
  static type unpacklo64(type a, type b) noexcept { return _mm256_unpacklo_epi64(a, b); }
  static type unpackhi64(type a, type b) noexcept { return _mm256_unpackhi_epi64(a, b); }
  static void store_draws(float* u, type w) noexcept {
    _mm256_storeu_ps(u, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)),
                                      _mm256_set1_ps(5.9604644775390625e-8f)));
  }
};
#endif

/// The draws of stream positions 4 * block .. 4 * block + 4 * Lanes - 1 (Lanes Philox blocks)
/// into u[0, 4 * Lanes), Philox4x32-10 on Lanes lanes at once: the lanes run their blocks in an
/// order (philox_vector::counters) that a transpose of 4x4 words within each 128-bit lane leaves
/// in position order. Requires the 32-bit block counter not to wrap inside the Lanes blocks.
template <int Lanes>
inline void philox_draws(std::uint64_t seed, std::uint64_t block, float* u) noexcept {
  using V = philox_vector<Lanes>;
  constexpr std::uint32_t m0 = 0xD2511F53u;
  constexpr std::uint32_t m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u;
  constexpr std::uint32_t w1 = 0xBB67AE85u;
  typename V::type c0 = V::counters(static_cast<std::uint32_t>(block));
  typename V::type c1 = V::set1(static_cast<std::uint32_t>(block >> 32));
  typename V::type c2 = V::zero();
  typename V::type c3 = V::zero();
  auto key0 = static_cast<std::uint32_t>(seed);
  auto key1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    typename V::type lo0, hi0, lo1, hi1;
    V::mul_wide(c0, m0, lo0, hi0);
    V::mul_wide(c2, m1, lo1, hi1);
    c0 = V::xor3(hi1, c1, V::set1(key0));
    c1 = lo1;
    c2 = V::xor3(hi0, c3, V::set1(key1));
    c3 = lo0;
    key0 += w0;
    key1 += w1;
  }
  typename V::type const t0 = V::unpacklo32(c0, c1);
  typename V::type const t1 = V::unpackhi32(c0, c1);
  typename V::type const t2 = V::unpacklo32(c2, c3);
  typename V::type const t3 = V::unpackhi32(c2, c3);
  V::store_draws(u, V::unpacklo64(t0, t2));
  V::store_draws(u + Lanes, V::unpackhi64(t0, t2));
  V::store_draws(u + 2 * Lanes, V::unpacklo64(t1, t3));
  V::store_draws(u + 3 * Lanes, V::unpackhi64(t1, t3));
}

/// Philox blocks per call of the vector draws compiled here: 16 with AVX-512, 8 with AVX2, 0
/// where neither is.
#if defined(AGOQ_HOST_AVX512)
inline constexpr int philox_lanes = 16;
#elif defined(AGOQ_HOST_AVX2)
inline constexpr int philox_lanes = 8;
#else
inline constexpr int philox_lanes = 0;
#endif

/// uniforms, Lanes Philox blocks at a time (philox_draws, whose philox_vector<Lanes> must be
/// compiled); the positions before the first block boundary, and the blocks across which the low
/// counter word wraps, come from the portable loop.
template <int Lanes>
inline void uniforms_lanes(std::uint64_t seed, std::uint64_t first, std::int64_t n,
                           float* u) noexcept {
  constexpr std::int64_t per_call = 4 * Lanes;
  std::int64_t i = std::min<std::int64_t>(n, static_cast<std::int64_t>((4u - (first & 3u)) & 3u));
  uniforms(seed, first, i, u);
  while (i < n) {
    std::uint64_t const block = (first + static_cast<std::uint64_t>(i)) >> 2;
    if (static_cast<std::uint32_t>(block) > 0xffffffffu - (Lanes - 1)) {
      std::int64_t const m = std::min<std::int64_t>(n - i, per_call);
      uniforms(seed, first + static_cast<std::uint64_t>(i), m, u + i);
      i += m;
    } else if (n - i >= per_call) {
      philox_draws<Lanes>(seed, block, u + i);
      i += per_call;
    } else {
      float tail[per_call];
      philox_draws<Lanes>(seed, block, tail);
      std::memcpy(u + i, tail, static_cast<std::size_t>(n - i) * sizeof(float));
      i = n;
    }
  }
}

/// uniforms, vectorized where compiled (AVX-512 or AVX2): philox_lanes Philox blocks at a time.
inline void uniforms_simd(std::uint64_t seed, std::uint64_t first, std::int64_t n,
                          float* u) noexcept {
#if defined(AGOQ_HOST_AVX512) || defined(AGOQ_HOST_AVX2)
  uniforms_lanes<philox_lanes>(seed, first, n, u);
#else
  uniforms(seed, first, n, u);
#endif
}

/// stats_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline segment_stats stats_segment_simd(T const* x, std::int64_t n) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (n > 0) {
    if constexpr (Code::has_zero_point) {
      return minmax_simd(x, n);
    } else {
      return absmax_simd(x, n);
    }
  }
#endif
  return stats_segment<Code>(x, n);
}

/// encode_nearest_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline void encode_nearest_segment_simd(T const* x, std::int64_t n, group_params p,
                                        std::uint8_t* q) noexcept {
#if defined(AGOQ_HOST_ROW_SIMD)
  encode_simd<Code, rounding_kind::nearest, 8>(x, n, p, nullptr, q);
#else
  encode_nearest_segment<Code>(x, n, p, q);
#endif
}

/// encode_stochastic_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline void encode_stochastic_segment_simd(T const* x, std::int64_t n, group_params p,
                                           float const* u, std::uint8_t* q) noexcept {
#if defined(AGOQ_HOST_ROW_SIMD)
  encode_simd<Code, rounding_kind::stochastic, 8>(x, n, p, u, q);
#else
  encode_stochastic_segment<Code>(x, n, p, u, q);
#endif
}

/// decode_segment, vectorized where compiled.
template <code_format Code, element_type T>
inline void decode_segment_simd(std::uint8_t const* q, std::int64_t n, group_params p,
                                T* y) noexcept {
#if defined(AGOQ_HOST_ROW_SIMD)
  decode_simd<Code, 8>(q, n, p, y);
#else
  decode_segment<Code>(q, n, p, y);
#endif
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
