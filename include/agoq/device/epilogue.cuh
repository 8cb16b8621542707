/// \file
/// The quantizing epilogue: what a custom GEMM (or any kernel producing a row-major tile) calls to
/// write its output straight into a quantized view (codes plus scales), without a bf16 copy.
/// Device only; needs nvcc.
#pragma once

#include <cstdint>

#include "../layout/params.hpp"
#include "../layout/view.hpp"
#include "../scheme/scheme.hpp"
#include "partition.hpp"
#include "thread.hpp"
#include "warp.cuh"

namespace agoq::device {

/// Stores the packed codes of `count` codes of `Bits` bits (in the low bytes of w) at dst, with a
/// single aligned store when the run is whole and dst is aligned.
template <int Bits, int N>
__device__ inline void store_packed(std::uint8_t* dst, int count, std::uint64_t w) noexcept {
  constexpr int full_bytes = N * Bits / 8;
  auto const addr = reinterpret_cast<std::uintptr_t>(dst);
  if (count == N && (addr & (full_bytes - 1)) == 0) {
    if constexpr (full_bytes == 8) {
      *reinterpret_cast<std::uint64_t*>(dst) = w;
      return;
    } else if constexpr (full_bytes == 4) {
      *reinterpret_cast<std::uint32_t*>(dst) = static_cast<std::uint32_t>(w);
      return;
    } else if constexpr (full_bytes == 2) {
      *reinterpret_cast<std::uint16_t*>(dst) = static_cast<std::uint16_t>(w);
      return;
    }
  }
  int const bytes = (count * Bits + 7) / 8;
  for (int i = 0; i < bytes; ++i) dst[i] = static_cast<std::uint8_t>(w >> (8 * i));
}

/// quantize_member_fragment where `members` (every value finite, all in the group `p` was made
/// for), else quantize_fragment: the same codes. Only symmetric integer codes have a shorter
/// member form, so other codes compile one encoder. Device only.
template <code_format Code, rounding_mode Rounding, int N>
__device__ inline void quantize_lane_fragment(bool members, float const (&v)[N], group_params p,
                                              std::uint64_t seed, std::uint64_t first,
                                              std::uint8_t (&q)[N]) noexcept {
  if constexpr (Code::kind == code_kind::int_sym) {
    if (members) {
      quantize_member_fragment<Code, Rounding>(v, p, seed, first, q);
      return;
    }
  }
  quantize_fragment<Code, Rounding>(v, p, seed, first, q);
}

/// Quantizes one group of a per-group scheme held by `lanes` consecutive lanes (a power of two of
/// at most 32, group_allreduce's condition): this lane, lane `lane` of the group, holds
/// v[0, count) = elements [col, col + count) of row `row` (count may be 0 past the row's end) and
/// `group` is the group's index in the view's group grid. The lanes reduce the group's
/// statistics, lane 0 stores the scale (and zero point), every lane stores its own packed codes.
/// Returns this lane's count of non-finite values. Every lane of the warp must call it together.
/// The codes equal the CPU executor's. Device only.
template <code_format Code, rounding_mode Rounding, int N>
__device__ inline int quantize_group_lanes(quantized_view const& out, std::int64_t row,
                                           std::int64_t col, int count, std::int64_t group,
                                           unsigned lane, int lanes, float const (&v)[N],
                                           std::uint64_t seed, std::uint64_t offset) noexcept {
  group_stats st;
  bool any = false;
  int const bad = fragment_stats(v, count, st, any);
  st = group_allreduce<Code>(st, any, lanes);
  group_params const p = make_group_params<Code>(out.spec.scale, st);
  if (count > 0) {
    if (lane == 0) store_group_params(out, group, p);
    std::uint8_t q[N];
    std::uint64_t const first = offset + static_cast<std::uint64_t>(row * out.cols + col);
    quantize_lane_fragment<Code, Rounding>(bad == 0, v, p, seed, first, q);
    std::int64_t const row_bytes = (out.cols * Code::bits + 7) / 8;
    store_packed<Code::bits, N>(out.codes + row * row_bytes + col * Code::bits / 8, count,
                                pack_fragment<Code::bits>(q, count));
  }
  return bad;
}

/// Quantizes the `Runs` runs of N elements that this lane holds of one group of a per-group scheme
/// whose whole groups tile the view's rows (cols a multiple of G = N * Runs * slot.lanes): runs
/// slot.first + k * slot.lanes of the flat row-major tensor (device::linear_group_slot), with
/// values v[k]. The group's slot.lanes consecutive lanes (a power of two of at most 32, aligned in
/// the warp) reduce its statistics once for all their runs, the first stores its parameters, and
/// every lane encodes its runs (quantize_member_fragment where all its values are finite, else
/// quantize_fragment) and stores their packed codes. A lane of a group past the end passes
/// active = false: it takes part in the shuffles and stores nothing. Returns this lane's count of
/// non-finite values (0 when inactive). Every lane of the warp must call it together. The codes
/// equal the CPU executor's. Device only.
template <code_format Code, rounding_mode Rounding, int Runs, int N>
__device__ inline int quantize_group_slot(quantized_view const& out, linear_slot const& slot,
                                          bool active, float const (&v)[Runs][N],
                                          std::uint64_t seed, std::uint64_t offset) noexcept {
  group_stats st;
  bool any = false;
  int bad = 0;
  // Symmetric and FP8 codes: the absolute maximum as an unsigned maximum of magnitude bits (which
  // orders non-negative floats as the floats), the per-element finite test only where it fails.
  std::uint32_t m = Code::has_zero_point ? 0x7f800000u : 0u;
  if constexpr (!Code::has_zero_point) {
    AGOQ_UNROLL
    for (int k = 0; k < Runs; ++k) {
      AGOQ_UNROLL
      for (int i = 0; i < N; ++i) {
        std::uint32_t const a = numeric::float_bits(v[k][i]) & 0x7fffffffu;
        m = a > m ? a : m;
      }
    }
    st.absmax = numeric::bits_float(m);
  }
  if (m >= 0x7f800000u) {
    st = group_stats{};
    AGOQ_UNROLL
    for (int k = 0; k < Runs; ++k) bad += fragment_stats(v[k], N, st, any);
  }
  st = group_allreduce<Code>(st, any, static_cast<int>(slot.lanes));
  group_params const p = make_group_params<Code>(out.spec.scale, st);
  if (!active) return 0;
  if (slot.place == 0) store_group_params(out, slot.group, p);
  AGOQ_UNROLL
  for (int k = 0; k < Runs; ++k) {
    std::int64_t const u = slot.first + k * slot.lanes;
    std::uint64_t const first = offset + static_cast<std::uint64_t>(u * N);
    std::uint8_t q[N];
    quantize_lane_fragment<Code, Rounding>(bad == 0, v[k], p, seed, first, q);
    store_packed<Code::bits, N>(out.codes + u * (N * Code::bits / 8), N,
                                pack_fragment<Code::bits>(q));
  }
  return bad;
}

/// The epilogue functor of a per-group `Scheme` for threads that each hold `N` consecutive
/// columns of one row: `Scheme::grouping::group_cols / N` consecutive lanes (a power of two of at
/// most 32) hold one group. Construct it on the host with the destination view (device memory,
/// spec equal to Scheme::to_spec()) and pass it to the kernel by value.
template <quant_scheme Scheme, int N = elements_per_thread>
struct quantize_epilogue {
  static_assert(Scheme::grouping::kind == grouping_kind::group,
                "quantize_epilogue: the epilogue computes a group's scale from the lanes that "
                "hold it, so it needs a per_group<G> scheme");
  static constexpr int lanes_per_group = static_cast<int>(Scheme::grouping::group_cols / N);
  static_assert(lanes_per_group * N == Scheme::grouping::group_cols && lanes_per_group >= 1 &&
                    lanes_per_group <= 32 && (lanes_per_group & (lanes_per_group - 1)) == 0,
                "quantize_epilogue: G / N must be a power of two of at most 32");
  static_assert(N * Scheme::code::bits <= 64, "quantize_epilogue: N codes must fit 64 bits");

  quantized_view out;        ///< destination, device memory
  std::uint64_t seed = 0;    ///< stochastic rounding seed
  std::uint64_t offset = 0;  ///< stochastic rounding stream offset

  /// Writes acc[0, N), the values of columns [col, col + N) of row `row` (col a multiple of N;
  /// columns past the tensor's end are ignored), as codes and, from the group's first lane, its
  /// scale. Lanes holding one group must be consecutive and aligned to lanes_per_group in the
  /// warp, and every lane of the warp must call it (lanes without data pass a row or column past
  /// the end). Returns this lane's count of non-finite values. Device only.
  __device__ int operator()(std::int64_t row, std::int64_t col, float const (&acc)[N]) const {
    std::int64_t const left = row < out.rows ? out.cols - col : 0;
    int const count = static_cast<int>(left <= 0 ? 0 : left < N ? left : N);
    std::int64_t const group =
        row * ((out.cols + Scheme::grouping::group_cols - 1) / Scheme::grouping::group_cols) +
        col / Scheme::grouping::group_cols;
    return quantize_group_lanes<typename Scheme::code, typename Scheme::rounding>(
        out, row, col, count, group, static_cast<unsigned>((col / N) % lanes_per_group),
        lanes_per_group, acc, seed, offset);
  }
};

}  // namespace agoq::device
