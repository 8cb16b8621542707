/// \file
/// Portable segment loops of the CPU executor: statistics, encoding and decoding of a run of
/// consecutive elements that share one group. They call the shared math of numeric/codec.hpp
/// element by element and are written so that g++ vectorizes them for whatever vector unit the
/// target has (AVX2, SSE2, NEON): elements loaded as integers (load_bits: copying the element
/// struct would keep the loop scalar), integer-domain reductions, and statistics taken in one pass
/// of plain extrema, the rare segment holding NaN or ±Inf redone by a counting loop.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../../numeric/codec.hpp"
#include "../../numeric/element.hpp"
#include "../../numeric/philox.hpp"

namespace agoq::detail::host {

/// Statistics of a segment plus the number of non-finite values it held.
struct segment_stats {
  group_stats stats;
  bool any_finite = false;
  std::int64_t nonfinite = 0;
};

/// Folds one segment's statistics into a group's.
inline void combine(segment_stats& acc, segment_stats const& s) noexcept {
  acc.nonfinite += s.nonfinite;
  if (!s.any_finite) return;
  if (!acc.any_finite) {
    acc.stats = s.stats;
    acc.any_finite = true;
    return;
  }
  acc.stats.absmax = s.stats.absmax > acc.stats.absmax ? s.stats.absmax : acc.stats.absmax;
  acc.stats.min = s.stats.min < acc.stats.min ? s.stats.min : acc.stats.min;
  acc.stats.max = s.stats.max > acc.stats.max ? s.stats.max : acc.stats.max;
}

/// Folds one value into a group's statistics (counting it if it is not finite); the per-column
/// path uses it where every group of a row is a single element.
inline void fold_value(segment_stats& acc, float v) noexcept {
  if (!numeric::is_finite(v)) {
    ++acc.nonfinite;
    return;
  }
  float const a = v < 0.0f ? -v : v;
  if (!acc.any_finite) {
    acc.stats = group_stats{a, v, v};
    acc.any_finite = true;
    return;
  }
  acc.stats.absmax = a > acc.stats.absmax ? a : acc.stats.absmax;
  acc.stats.min = v < acc.stats.min ? v : acc.stats.min;
  acc.stats.max = v > acc.stats.max ? v : acc.stats.max;
}

/// The unsigned integer holding an element's bits (and its signed twin), the bits of its +Inf and
/// the mask of its magnitude bits.
template <class Bits, class SignedBits, Bits Inf, Bits Magnitude>
struct bits_layout {
  using type = Bits;
  using signed_type = SignedBits;
  static constexpr type inf = Inf;
  static constexpr type magnitude = Magnitude;
};

/// The bits_layout of each element type.
template <class T>
struct element_bits;
template <>
struct element_bits<float> : bits_layout<std::uint32_t, std::int32_t, 0x7f800000u, 0x7fffffffu> {};
template <>
struct element_bits<bfloat16> : bits_layout<std::uint16_t, std::int16_t, 0x7f80u, 0x7fffu> {};
template <>
struct element_bits<half> : bits_layout<std::uint16_t, std::int16_t, 0x7c00u, 0x7fffu> {};

template <class T>
inline typename element_bits<T>::type bits_of(T x) noexcept {
  return cuda::std::bit_cast<typename element_bits<T>::type>(x);
}

/// The bits of *p, loaded as an integer: a load g++ vectorizes (a copy of the element struct, as
/// bits_of(*p) makes, keeps the loop scalar).
template <class T>
inline typename element_bits<T>::type load_bits(T const* p) noexcept {
  typename element_bits<T>::type b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

/// *p widened to float (numeric::to_float), through load_bits.
template <element_type T>
inline float load_float(T const* p) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return numeric::bits_float(load_bits(p));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return numeric::bf16_bits_to_float(load_bits(p));
  } else {
    return numeric::half_bits_to_float(load_bits(p));
  }
}

template <class T>
inline T element_from_bits(typename element_bits<T>::type b) noexcept {
  return cuda::std::bit_cast<T>(b);
}

/// Absolute maximum over the finite values of x[0, n), computed on the magnitude bits (which order
/// like the values), and the count of non-finite values: the loop that leaves them out.
template <element_type T>
inline segment_stats absmax_counting(T const* x, std::int64_t n) noexcept {
  using B = typename element_bits<T>::type;
  B m = 0;
  std::int64_t nonfinite = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    B const a = load_bits(x + i) & element_bits<T>::magnitude;
    bool const finite = a < element_bits<T>::inf;
    nonfinite += finite ? 0 : 1;
    B const v = finite ? a : B{0};
    m = v > m ? v : m;
  }
  segment_stats s;
  s.nonfinite = nonfinite;
  s.any_finite = nonfinite < n;
  s.stats.absmax = numeric::to_float(element_from_bits<T>(m));
  return s;
}

/// absmax_counting in one pass of the largest magnitude bits, which vectorizes: non-finite
/// magnitudes are the largest, so the pass detects them, and only a segment holding one is redone
/// by absmax_counting.
template <element_type T>
inline segment_stats absmax_segment(T const* x, std::int64_t n) noexcept {
  using B = typename element_bits<T>::type;
  B m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    B const a = load_bits(x + i) & element_bits<T>::magnitude;
    m = a > m ? a : m;
  }
  if (m >= element_bits<T>::inf) return absmax_counting(x, n);
  segment_stats s;
  s.any_finite = n > 0;
  s.stats.absmax = numeric::to_float(element_from_bits<T>(m));
  return s;
}

/// Maps an element's bits to a signed integer that orders like the value (-0 just below +0).
template <class T>
inline typename element_bits<T>::signed_type ordered(typename element_bits<T>::type b) noexcept {
  using S = typename element_bits<T>::signed_type;
  auto const s = static_cast<S>(b);
  constexpr int shift = static_cast<int>(sizeof(S) * 8 - 1);
  return static_cast<S>(s ^
                        static_cast<S>((s >> shift) & static_cast<S>(element_bits<T>::magnitude)));
}

/// True when ordered images in [lo, hi] are all of finite values: a finite value's image lies
/// strictly between those of -Inf and +Inf, NaNs' beyond them.
template <element_type T>
inline bool ordered_finite(typename element_bits<T>::signed_type lo,
                           typename element_bits<T>::signed_type hi) noexcept {
  using B = typename element_bits<T>::type;
  constexpr B inf = element_bits<T>::inf;
  constexpr auto minus_inf = static_cast<B>(inf | (element_bits<T>::magnitude + 1u));
  return lo > ordered<T>(minus_inf) && hi < ordered<T>(inf);
}

/// The statistics of a segment of n elements, nonfinite of them not finite, whose finite values'
/// ordered images range over [lo, hi].
template <element_type T>
inline segment_stats ordered_stats(typename element_bits<T>::signed_type lo,
                                   typename element_bits<T>::signed_type hi, std::int64_t n,
                                   std::int64_t nonfinite) noexcept {
  using B = typename element_bits<T>::type;
  segment_stats s;
  s.nonfinite = nonfinite;
  s.any_finite = nonfinite < n;
  if (s.any_finite) {
    // ordered() is an involution, so it maps the extreme back to the element's bits.
    s.stats.min =
        numeric::to_float(element_from_bits<T>(static_cast<B>(ordered<T>(static_cast<B>(lo)))));
    s.stats.max =
        numeric::to_float(element_from_bits<T>(static_cast<B>(ordered<T>(static_cast<B>(hi)))));
  }
  return s;
}

/// Minimum and maximum over the finite values of x[0, n), in the ordered-integer domain, and the
/// count of non-finite values: the loop that leaves them out.
template <element_type T>
inline segment_stats minmax_counting(T const* x, std::int64_t n) noexcept {
  using B = typename element_bits<T>::type;
  using S = typename element_bits<T>::signed_type;
  S lo = std::numeric_limits<S>::max();
  S hi = std::numeric_limits<S>::min();
  std::int64_t nonfinite = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    B const b = load_bits(x + i);
    bool const finite = (b & element_bits<T>::magnitude) < element_bits<T>::inf;
    nonfinite += finite ? 0 : 1;
    S const o = ordered<T>(b);
    S const olo = finite ? o : std::numeric_limits<S>::max();
    S const ohi = finite ? o : std::numeric_limits<S>::min();
    lo = olo < lo ? olo : lo;
    hi = ohi > hi ? ohi : hi;
  }
  return ordered_stats<T>(lo, hi, n, nonfinite);
}

/// minmax_counting in one pass of plain extrema of the ordered images, which vectorizes: the pass
/// detects non-finite values (ordered_finite), and only a segment holding one is redone by
/// minmax_counting.
template <element_type T>
inline segment_stats minmax_segment(T const* x, std::int64_t n) noexcept {
  using S = typename element_bits<T>::signed_type;
  S lo = std::numeric_limits<S>::max();
  S hi = std::numeric_limits<S>::min();
  for (std::int64_t i = 0; i < n; ++i) {
    S const o = ordered<T>(load_bits(x + i));
    lo = o < lo ? o : lo;
    hi = o > hi ? o : hi;
  }
  if (n == 0 || !ordered_finite<T>(lo, hi)) return minmax_counting(x, n);
  return ordered_stats<T>(lo, hi, n, 0);
}

/// Statistics of a segment as the code family needs them.
template <code_format Code, element_type T>
inline segment_stats stats_segment(T const* x, std::int64_t n) noexcept {
  if constexpr (Code::has_zero_point) {
    return minmax_segment(x, n);
  } else {
    return absmax_segment(x, n);
  }
}

/// How far ahead of a group the row path prefetches (prefetch_ahead), in bytes.
inline constexpr std::int64_t prefetch_distance = 4096;

/// Whether prefetch_ahead asks for lines: on x86 processors but AMD's, read once (cpuid), and
/// elsewhere. On an AMD EPYC Zen 4 the hints cost and won nothing (paired runs on [4096, 4096]
/// bf16, 2026-12-07: the plain SwiGLU 14.0-14.3 ms with them, 10.3-11.0 without; the plain GeLU,
/// the fused GeLU and the SwiGLU and GeLU backward 4-5% slower with them; quantize's row path
/// within the noise either way), its hardware prefetchers keeping ahead of these streams, where
/// on a Sapphire Rapids Xeon they made the plain GeLU twice as fast. Other AMD cores are taken
/// to be alike (not measured).
inline bool prefetch_hints() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static bool const on = [] {
    __builtin_cpu_init();
    return !__builtin_cpu_is("amd");
  }();
  return on;
#else
  return true;
#endif
}

/// Asks the caches for the lines of [p + prefetch_distance, p + prefetch_distance + bytes), for
/// reading (a hint: it never faults, past the end of the buffer included). The row path reads a
/// short run of memory per group between runs of arithmetic; the hardware prefetchers alone leave
/// most of those loads to miss the L1 cache. The element loops of the fused SwiGLU and GeLU
/// (forward and backward), about 4 cycles per element, ask the same way for the inputs 4 KiB
/// ahead of each piece of a row they take, wherever no lighter pass (a save's statistics) reads
/// the piece first: the plain GeLU on a Sapphire Rapids Xeon waited on its loads (28 -> 14 ms on
/// [4096, 4096] bf16). Not on AMD processors (prefetch_hints).
inline void prefetch_ahead(void const* p, std::int64_t bytes) noexcept {
  if (!prefetch_hints()) return;
  auto const a =
      reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(prefetch_distance);
  for (std::int64_t j = 0; j < bytes; j += 64) {
    __builtin_prefetch(reinterpret_cast<char const*>(a + static_cast<std::uintptr_t>(j)), 0, 3);
  }
}

/// Fills u[0, n) with the uniform draws of stream positions first, first + 1, ... under `seed`,
/// one Philox block per four positions.
inline void uniforms(std::uint64_t seed, std::uint64_t first, std::int64_t n, float* u) noexcept {
  std::int64_t i = 0;
  while (i < n) {
    std::uint64_t const pos = first + static_cast<std::uint64_t>(i);
    numeric::philox_block const b = numeric::philox_block_at(seed, pos);
    for (std::uint32_t w = static_cast<std::uint32_t>(pos & 3u); w < 4u && i < n; ++w, ++i) {
      u[i] = numeric::uniform24(b[w]);
    }
  }
}

/// Encodes x[0, n) with round-half-to-even into one code per byte (encode_nearest, its zero-scale
/// test made once for the segment).
template <code_format Code, element_type T>
inline void encode_nearest_segment(T const* x, std::int64_t n, group_params p,
                                   std::uint8_t* q) noexcept {
  if (p.scale == 0.0f) {
    std::memset(q, numeric::zero_scale_code<Code>(p), static_cast<std::size_t>(n));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    q[i] = numeric::nearest_code<Code>(load_float(x + i) / p.scale, p);
  }
}

/// Encodes x[0, n) with stochastic rounding, u[i] being element i's draw (encode_stochastic, its
/// zero-scale test made once for the segment).
template <code_format Code, element_type T>
inline void encode_stochastic_segment(T const* x, std::int64_t n, group_params p, float const* u,
                                      std::uint8_t* q) noexcept {
  if (p.scale == 0.0f) {
    std::memset(q, numeric::zero_scale_code<Code>(p), static_cast<std::size_t>(n));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    q[i] = numeric::stochastic_code<Code>(load_float(x + i) / p.scale, p, u[i]);
  }
}

/// Writes the codes of the n elements of a group whose scale is 0 as `Width`-bit fields at dst:
/// every code is that of zero (FP8: +0, whatever the zero point field holds).
template <code_format Code, int Width>
inline void encode_zero_scale(std::int64_t n, group_params p, std::uint8_t* dst) noexcept {
  auto const z = static_cast<std::uint8_t>(is_fp8_code<Code> ? 0 : p.zero_point);
  if constexpr (Width == 8) {
    std::memset(dst, z, static_cast<std::size_t>(n));
  } else {
    std::memset(dst, z | (z << 4), static_cast<std::size_t>(n / 2));
    if (n & 1) dst[n / 2] = z;
  }
}

/// Decodes q[0, n) (one code per byte) into y.
template <code_format Code, element_type T>
inline void decode_segment(std::uint8_t const* q, std::int64_t n, group_params p, T* y) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = numeric::from_float<T>(decode<Code>(q[i], p));
}

/// Packs n codes of `bits` bits (one per byte, already masked) into dst, least significant bits
/// first; the last byte's unused high bits are zero.
inline void pack_codes(std::uint8_t const* q, std::int64_t n, int bits,
                       std::uint8_t* dst) noexcept {
  if (bits == 8) {
    std::memcpy(dst, q, static_cast<std::size_t>(n));
  } else if (bits == 4) {
    std::int64_t const pairs = n / 2;
    for (std::int64_t j = 0; j < pairs; ++j) {
      dst[j] = static_cast<std::uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
    }
    if (n & 1) dst[pairs] = q[n - 1];
  } else {
    std::int64_t const quads = n / 4;
    for (std::int64_t j = 0; j < quads; ++j) {
      dst[j] = static_cast<std::uint8_t>(q[4 * j] | (q[4 * j + 1] << 2) | (q[4 * j + 2] << 4) |
                                         (q[4 * j + 3] << 6));
    }
    std::uint8_t last = 0;
    for (std::int64_t i = quads * 4; i < n; ++i)
      last |= static_cast<std::uint8_t>(q[i] << (2 * (i & 3)));
    if (n & 3) dst[quads] = last;
  }
}

/// Unpacks n codes of `bits` bits from src into one code per byte (a loop over whole source bytes,
/// which vectorizes, then the last byte's codes).
inline void unpack_codes(std::uint8_t const* src, std::int64_t n, int bits,
                         std::uint8_t* q) noexcept {
  if (bits == 8) {
    std::memcpy(q, src, static_cast<std::size_t>(n));
    return;
  }
  std::uint32_t const mask = numeric::code_mask(bits);
  std::int64_t const per_byte = 8 / bits;
  std::int64_t const whole = n / per_byte;
  if (bits == 4) {
    for (std::int64_t j = 0; j < whole; ++j) {
      q[2 * j] = static_cast<std::uint8_t>(src[j] & 0x0fu);
      q[2 * j + 1] = static_cast<std::uint8_t>(src[j] >> 4);
    }
  } else {
    for (std::int64_t j = 0; j < whole; ++j) {
      q[4 * j] = static_cast<std::uint8_t>(src[j] & 3u);
      q[4 * j + 1] = static_cast<std::uint8_t>((src[j] >> 2) & 3u);
      q[4 * j + 2] = static_cast<std::uint8_t>((src[j] >> 4) & 3u);
      q[4 * j + 3] = static_cast<std::uint8_t>(src[j] >> 6);
    }
  }
  for (std::int64_t i = whole * per_byte; i < n; ++i) {
    q[i] = static_cast<std::uint8_t>((src[whole] >> (bits * (i - whole * per_byte))) & mask);
  }
}

}  // namespace agoq::detail::host
