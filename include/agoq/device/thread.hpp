/// \file
/// Thread-level building blocks for users' own kernels: the statistics, quantization,
/// dequantization and packing of a register fragment of N consecutive elements of one group.
/// Host and device (the CPU tests drive them with plain loops).
#pragma once

#include <cstdint>

#include "../numeric/codec.hpp"
#include "../numeric/philox.hpp"
#include "../numeric/rounding.hpp"

namespace agoq::device {

/// Folds the finite values of v[0, count) into `st` (absmax, min, max) and returns how many were
/// not finite. `any` tracks whether a finite value was seen (min/max are meaningless before).
/// Host and device. Branch-free: every element is tested and selected (no early exit), and the
/// absolute maximum is an integer maximum of magnitude bits, which orders finite non-negative
/// floats as the float comparison does (|-0| is +0, which never raises it).
template <int N>
AGOQ_HOST_DEVICE inline int fragment_stats(float const (&v)[N], int count, group_stats& st,
                                           bool& any) noexcept {
  int nonfinite = 0;
  std::uint32_t absmax = numeric::float_bits(st.absmax);
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) {
    std::uint32_t const magnitude = numeric::float_bits(v[i]) & 0x7fffffffu;
    bool const in = i < count;
    bool const finite = magnitude < 0x7f800000u;
    nonfinite += in && !finite ? 1 : 0;
    bool const ok = in && finite;
    std::uint32_t const a = ok ? magnitude : 0u;
    absmax = a > absmax ? a : absmax;
    float const lo = any ? (v[i] < st.min ? v[i] : st.min) : v[i];
    float const hi = any ? (v[i] > st.max ? v[i] : st.max) : v[i];
    st.min = ok ? lo : st.min;
    st.max = ok ? hi : st.max;
    any = any || ok;
  }
  st.absmax = numeric::bits_float(absmax);
  return nonfinite;
}

namespace fragment_detail {

/// u[i] = the draw of word (Phase + i) of the Philox blocks `b` (block j holding words 4j to
/// 4j + 3), every index a constant, so the blocks stay in registers.
template <int Phase, int N, int B>
AGOQ_HOST_DEVICE inline void draws_from(numeric::philox_block const (&b)[B],
                                        float (&u)[N]) noexcept {
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) u[i] = numeric::uniform24(b[(Phase + i) / 4][(Phase + i) % 4]);
}

}  // namespace fragment_detail

/// The uniform draws of stream positions first, first + 1, ..., first + N - 1 under `seed`: the
/// Philox blocks that hold them are computed once each (at most N / 4 + 1; the last only when the
/// positions reach it), and each draw is picked from them by a constant index under a switch on
/// first mod 4 (uniform across a warp whose lanes' first positions share it), so that no block is
/// indexed at run time (which would put it in local memory on the GPU). Host and device.
template <int N>
AGOQ_HOST_DEVICE inline void fragment_draws(std::uint64_t seed, std::uint64_t first,
                                            float (&u)[N]) noexcept {
  constexpr int blocks = (N + 3) / 4 + 1;
  auto const phase = static_cast<int>(first & 3u);
  std::uint64_t const base = first & ~std::uint64_t{3};
  numeric::philox_block b[blocks];
  AGOQ_UNROLL
  for (int j = 0; j + 1 < blocks; ++j) b[j] = numeric::philox_block_at(seed, base + 4u * j);
  // The last block only when the positions reach it (never for N % 4 == 0 at phase 0).
  if (phase + N > 4 * (blocks - 1)) {
    b[blocks - 1] = numeric::philox_block_at(seed, base + 4u * (blocks - 1));
  } else {
    b[blocks - 1] = {};
  }
  switch (phase) {
    case 0:
      fragment_detail::draws_from<0>(b, u);
      break;
    case 1:
      fragment_detail::draws_from<1>(b, u);
      break;
    case 2:
      fragment_detail::draws_from<2>(b, u);
      break;
    default:
      fragment_detail::draws_from<3>(b, u);
      break;
  }
}

/// Quantizes v[0, N) of one group into one code per byte. Stochastic rounding draws stream
/// positions `first_position + i` under `seed` (the element's row-major index plus the caller's
/// offset); nearest rounding ignores both. The group's divisor (numeric::scale_divisor) is made
/// once and the zero-scale test made once for the fragment, so the per-element work is the
/// quotient's two multiplies and two fused multiply-adds, the rounding and the clamp, without a
/// branch. The codes are encode_nearest's / encode_stochastic's. Host and device.
template <code_format Code, rounding_mode Rounding, int N>
AGOQ_HOST_DEVICE inline void quantize_fragment(float const (&v)[N], group_params p,
                                               std::uint64_t seed, std::uint64_t first_position,
                                               std::uint8_t (&q)[N]) noexcept {
  if (p.scale == 0.0f) {
    AGOQ_UNROLL
    for (int i = 0; i < N; ++i) q[i] = numeric::zero_scale_code<Code>(p);
    return;
  }
  numeric::scale_divisor const divide(p.scale);
  if constexpr (Rounding::kind == rounding_kind::stochastic) {
    float u[N];
    fragment_draws(seed, first_position, u);
    AGOQ_UNROLL
    for (int i = 0; i < N; ++i) q[i] = numeric::stochastic_code<Code>(divide(v[i]), p, u[i]);
  } else {
    AGOQ_UNROLL
    for (int i = 0; i < N; ++i) q[i] = numeric::nearest_code<Code>(divide(v[i]), p);
  }
}

/// quantize_fragment for a fragment of finite values of the group that `p` was made for
/// (make_group_params of statistics that include every v[i] the caller stores): the same codes for
/// those values. A symmetric integer code rounded to nearest then needs no NaN test, clamp or
/// choice of quotient: |v[i]| <= absmax and the scale is at least RN(absmax / qmax), so
/// |v[i] / scale| <= qmax (1 + 2^-23) < qmax + 1/2, and each code is
/// numeric::nearest_code_in_range of the divisor's corrected quotient: two multiplies, two fused
/// multiply-adds and an add per element. Stochastic rounding keeps the clamp (its floor may step
/// past qmax) but not the NaN test (numeric::stochastic_code_in_range); other codes take
/// quantize_fragment. Host and device.
template <code_format Code, rounding_mode Rounding, int N>
AGOQ_HOST_DEVICE inline void quantize_member_fragment(float const (&v)[N], group_params p,
                                                      std::uint64_t seed,
                                                      std::uint64_t first_position,
                                                      std::uint8_t (&q)[N]) noexcept {
  if constexpr (Code::kind == code_kind::int_sym) {
    if (p.scale == 0.0f) {
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) q[i] = numeric::zero_scale_code<Code>(p);
      return;
    }
    numeric::scale_divisor const divide(p.scale);
    if constexpr (Rounding::kind == rounding_kind::nearest) {
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        q[i] = numeric::nearest_code_in_range<Code>(divide.corrected(v[i]));
      }
    } else {
      float u[N];
      fragment_draws(seed, first_position, u);
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        q[i] = numeric::stochastic_code_in_range<Code>(divide.corrected(v[i]), u[i]);
      }
    }
  } else {
    quantize_fragment<Code, Rounding>(v, p, seed, first_position, q);
  }
}

namespace fragment_detail {

/// True when no finite code of a symmetric integer or FP8 Code decodes past ±FLT_MAX under
/// `scale`: |m scale| <= FLT_MAX for the largest magnitude m, 2^(b-1) (the code -2^(b-1)) or the
/// FP8 format's largest finite value. Rounding is monotonic, so no smaller magnitude's product
/// overflows either. False for a NaN scale.
template <code_format Code>
AGOQ_HOST_DEVICE constexpr bool unsaturated(float scale) noexcept {
  float largest = 0.0f;
  if constexpr (is_fp8_code<Code>) {
    largest = Code::format.max_value;
  } else {
    largest = static_cast<float>(Code::qmax + 1);
  }
  float const extreme = largest * scale;
  return extreme <= numeric::max_finite_float && extreme >= -numeric::max_finite_float;
}

}  // namespace fragment_detail

/// Dequantizes N codes (one per byte) of one group: decode's values. For symmetric integer and
/// FP8 codes under a scale that no finite code's product can take past ±FLT_MAX
/// (fragment_detail::unsaturated) the products are taken without decode's saturation and without
/// a branch (a multiply per element; FP8 values by numeric::fp8_to_float, itself branch-free),
/// E5M2's ±Inf codes still saturated. Host and device.
template <code_format Code, int N>
AGOQ_HOST_DEVICE inline void dequantize_fragment(std::uint8_t const (&q)[N], group_params p,
                                                 float (&v)[N]) noexcept {
  if constexpr (Code::kind == code_kind::int_sym) {
    if (fragment_detail::unsaturated<Code>(p.scale)) {
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        v[i] = static_cast<float>(numeric::sign_extend(q[i], Code::bits)) * p.scale;
      }
      return;
    }
  } else if constexpr (is_fp8_code<Code>) {
    if (fragment_detail::unsaturated<Code>(p.scale)) {
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        float const y = numeric::fp8_to_float(q[i], Code::format) * p.scale;
        if constexpr (Code::format.mantissa_bits == 2) {
          float const c = y > numeric::max_finite_float ? numeric::max_finite_float : y;
          v[i] = c < -numeric::max_finite_float ? -numeric::max_finite_float : c;
        } else {
          v[i] = y;
        }
      }
      return;
    }
  }
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) v[i] = decode<Code>(q[i], p);
}

/// Packs the first `count` of N codes of `Bits` bits, least significant bits first, into the low
/// bytes of a 64-bit word (N * Bits <= 64); unused bits are zero. Built as two 32-bit words,
/// which the GPU assembles with byte permutes and 32-bit shifts. Host and device.
template <int Bits, int N>
AGOQ_HOST_DEVICE constexpr std::uint64_t pack_fragment(std::uint8_t const (&q)[N],
                                                       int count = N) noexcept {
  static_assert(N * Bits <= 64, "pack_fragment: the fragment does not fit 64 bits");
  constexpr int per_word = 32 / Bits;
  std::uint32_t w[2] = {0u, 0u};
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) {
    std::uint32_t const c = i < count ? std::uint32_t{q[i]} : 0u;
    w[i / per_word] |= c << (Bits * (i % per_word));
  }
  return std::uint64_t{w[0]} | (std::uint64_t{w[1]} << 32);
}

/// Unpacks N codes of `Bits` bits from the low bytes of a 64-bit word. Host and device.
template <int Bits, int N>
AGOQ_HOST_DEVICE constexpr void unpack_fragment(std::uint64_t w, std::uint8_t (&q)[N]) noexcept {
  static_assert(N * Bits <= 64, "unpack_fragment: the fragment does not fit 64 bits");
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) {
    q[i] = static_cast<std::uint8_t>((w >> (Bits * i)) & numeric::code_mask(Bits));
  }
}

/// dequantize_fragment of the N codes packed in w (unpack_fragment's layout, N * Bits <= 64): the
/// same values. Symmetric 2- and 4-bit codes under a scale that cannot saturate are sign-extended
/// in place by a pair of shifts of the 32-bit half that holds them (no unpacking into bytes and no
/// xor-subtract; 8-bit codes convert from their byte, which the GPU's conversion selects itself).
/// Host and device.
template <code_format Code, int N>
AGOQ_HOST_DEVICE inline void dequantize_packed(std::uint64_t w, group_params p,
                                               float (&v)[N]) noexcept {
  static_assert(N * Code::bits <= 64, "dequantize_packed: the fragment does not fit 64 bits");
  if constexpr (Code::kind == code_kind::int_sym && Code::bits < 8) {
    if (fragment_detail::unsaturated<Code>(p.scale)) {
      constexpr int per_word = 32 / Code::bits;
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        auto const half = static_cast<std::uint32_t>(w >> (32 * (i / per_word)));
        int const shift = 32 - Code::bits * (i % per_word + 1);
        auto const q = static_cast<std::int32_t>(half << shift) >> (32 - Code::bits);
        v[i] = static_cast<float>(q) * p.scale;
      }
      return;
    }
  }
  std::uint8_t q[N];
  unpack_fragment<Code::bits>(w, q);
  dequantize_fragment<Code>(q, p, v);
}

}  // namespace agoq::device
