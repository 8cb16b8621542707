/// \file
/// Which CUDA thread covers which elements. The kernels call these functions and the host tests
/// check, for many shapes, that every element is covered exactly once.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../scheme/grouping.hpp"

namespace agoq::device {

/// q = a / b and r = a % b for 0 <= a, 0 < b, through 32-bit division when both fit (GPUs emulate
/// 64-bit division in dozens of instructions). Host and device.
AGOQ_HOST_DEVICE constexpr void divmod(std::int64_t a, std::int64_t b, std::int64_t& q,
                                       std::int64_t& r) noexcept {
  if (((a | b) >> 32) == 0) {
    q = static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b);
  } else {
    q = a / b;
  }
  r = a - q * b;
}

/// Elements one thread handles in the CUDA kernels (16 bytes of bf16, one 8-byte int8 store), and
/// its log2.
inline constexpr int elements_per_thread_log2 = 3;
inline constexpr int elements_per_thread = 1 << elements_per_thread_log2;

/// A run of consecutive elements of one row: [col, col + count) of row `row`; count may be 0
/// for threads past the end.
struct element_run {
  std::int64_t row = 0;
  std::int64_t col = 0;
  int count = 0;
};

/// The run of unit `u` when every row is cut into units of elements_per_thread elements (the last
/// unit of a row is shorter; units never cross rows, so packed codes never straddle two rows).
/// Units are numbered row by row. Host and device.
AGOQ_HOST_DEVICE constexpr element_run unit_run(std::int64_t u, std::int64_t rows,
                                                std::int64_t cols) noexcept {
  std::int64_t const per_row = (cols + elements_per_thread - 1) / elements_per_thread;
  element_run r;
  if (per_row == 0 || u >= rows * per_row) return r;
  std::int64_t unit_in_row = 0;
  divmod(u, per_row, r.row, unit_in_row);
  r.col = unit_in_row * elements_per_thread;
  std::int64_t const left = cols - r.col;
  r.count = static_cast<int>(left < elements_per_thread ? left : elements_per_thread);
  return r;
}

/// Number of units of a [rows, cols] tensor.
AGOQ_HOST_DEVICE constexpr std::int64_t unit_count(std::int64_t rows, std::int64_t cols) noexcept {
  return rows * ((cols + elements_per_thread - 1) / elements_per_thread);
}

/// The lanes that share a group of `group_size` columns in the one-pass per-group kernels, as a
/// power of two: log2 of the smallest power of two holding ceil(G / elements_per_thread) runs (2,
/// 3, 4, 5 for G = 32, 64, 128, 256, where the runs fill the lanes). Host and device.
AGOQ_HOST_DEVICE constexpr int group_lanes_log2(std::int64_t group_size) noexcept {
  std::int64_t const runs = (group_size + elements_per_thread - 1) / elements_per_thread;
  int log2 = 0;
  while ((std::int64_t{1} << log2) < runs) ++log2;
  return log2;
}

/// In a one-pass per-group kernel, lanes = 2^lanes_log2 consecutive threads share a group of G
/// columns (lanes * elements_per_thread >= G), `per_row` = ceil(cols / G) groups in each row:
/// thread t covers lane t % lanes of group t / lanes (shifts, as the kernels take the group size
/// at run time), the run of up to elements_per_thread columns from group_in_row * G + lane *
/// elements_per_thread, cut at the group's and the row's end (count 0 for a lane past either).
/// Returns that run and the group index in `group`. Host and device.
AGOQ_HOST_DEVICE constexpr element_run padded_group_lane_run(std::int64_t t,
                                                             std::int64_t group_size,
                                                             std::int64_t per_row, int lanes_log2,
                                                             std::int64_t rows, std::int64_t cols,
                                                             std::int64_t& group) noexcept {
  group = t >> lanes_log2;
  std::int64_t const lane = t & ((std::int64_t{1} << lanes_log2) - 1);
  element_run r;
  if (per_row == 0 || group >= rows * per_row) return r;
  std::int64_t group_in_row = 0;
  divmod(group, per_row, r.row, group_in_row);
  std::int64_t const in_group = lane * elements_per_thread;
  r.col = group_in_row * group_size + in_group;
  std::int64_t const to_group_end = group_size - in_group;
  std::int64_t const to_row_end = cols - r.col;
  std::int64_t const left = to_group_end < to_row_end ? to_group_end : to_row_end;
  r.count = static_cast<int>(left <= 0                    ? 0
                             : left < elements_per_thread ? left
                                                          : elements_per_thread);
  return r;
}

/// Groups of G = elements_per_thread * 2^lanes_log2 columns in a row of `cols`: ceil(cols / G),
/// by shifts. Host and device.
AGOQ_HOST_DEVICE constexpr std::int64_t lane_groups_per_row(std::int64_t cols,
                                                            int lanes_log2) noexcept {
  int const group_log2 = lanes_log2 + elements_per_thread_log2;
  return (cols + (std::int64_t{1} << group_log2) - 1) >> group_log2;
}

/// Threads of a one-pass per-group walk over a [rows, cols] tensor with 2^lanes_log2 lanes per
/// group of G = elements_per_thread * 2^lanes_log2 columns (group_lane_run's t in [0, threads)).
/// Host and device.
AGOQ_HOST_DEVICE constexpr std::int64_t group_lane_threads(std::int64_t rows, std::int64_t cols,
                                                           int lanes_log2) noexcept {
  return (rows * lane_groups_per_row(cols, lanes_log2)) << lanes_log2;
}

/// In the one-pass per-group kernel, 2^lanes_log2 consecutive threads share a group of
/// G = elements_per_thread * 2^lanes_log2 columns: thread t covers lane t % lanes of group
/// t / lanes. Returns that run (count 0 past the end of the row or of the tensor) and the group
/// index in `group`. Host and device.
AGOQ_HOST_DEVICE constexpr element_run group_lane_run(std::int64_t t, int lanes_log2,
                                                      std::int64_t rows, std::int64_t cols,
                                                      std::int64_t& group) noexcept {
  return padded_group_lane_run(t, std::int64_t{elements_per_thread} << lanes_log2,
                               lane_groups_per_row(cols, lanes_log2), lanes_log2, rows, cols,
                               group);
}

/// The runs of one thread (slot) of the linear per-group kernels, where whole groups tile the
/// tensor in row-major order (cols a multiple of G): group g is runs [g R, (g + 1) R) of
/// elements_per_thread elements each, R = 2^runs_per_group_log2, and R / S consecutive slots
/// share it (S = 2^slot_runs_log2 runs per slot): slot t holds runs first + k * lanes (k < S) of
/// group t / lanes, lanes = R / S, first = group * R + place. So each of a group's loads k is one
/// contiguous piece across its lanes. Shifts only. Host and device.
struct linear_slot {
  std::int64_t group = 0;  ///< the group's index (row-major)
  std::int64_t first = 0;  ///< the slot's first run
  std::int64_t lanes = 1;  ///< slots per group, the stride between the slot's runs
  int place = 0;           ///< the slot's place among its group's slots
};

AGOQ_HOST_DEVICE constexpr linear_slot linear_group_slot(std::int64_t t, int runs_per_group_log2,
                                                         int slot_runs_log2) noexcept {
  int const lanes_log2 = runs_per_group_log2 - slot_runs_log2;
  linear_slot s;
  s.lanes = std::int64_t{1} << lanes_log2;
  s.group = t >> lanes_log2;
  s.place = static_cast<int>(t & (s.lanes - 1));
  s.first = (s.group << runs_per_group_log2) + s.place;
  return s;
}

/// Walks the groups of consecutive columns of one row with one division up front: `group` is the
/// group-grid index of the current column. Host and device.
struct group_cursor {
  std::int64_t group = 0;     ///< group of the current column
  std::int64_t boundary = 0;  ///< first column of the next group along the row
  std::int64_t tile_cols = 1;

  /// Starts at (row, col) of a tensor tiled by `t` with `grid_cols` groups per grid row.
  AGOQ_HOST_DEVICE constexpr group_cursor(std::int64_t row, std::int64_t col, tile_shape t,
                                          std::int64_t grid_cols) noexcept
      : tile_cols(t.cols) {
    std::int64_t tile_row = 0, row_in_tile = 0, tile_col = 0, col_in_tile = 0;
    divmod(row, t.rows, tile_row, row_in_tile);
    divmod(col, t.cols, tile_col, col_in_tile);
    group = tile_row * grid_cols + tile_col;
    boundary = col - col_in_tile + t.cols;
  }

  /// Moves to column `col` of the same row (not before the current one). Host and device.
  AGOQ_HOST_DEVICE constexpr void advance(std::int64_t col) noexcept {
    while (col >= boundary) {
      ++group;
      boundary += tile_cols;
    }
  }
};

/// Threads per block and blocks per SM of agoq's elementwise kernels for a compute capability
/// (major * 10 + minor). Plain values, so the host tests check them.
struct launch_policy {
  int block_threads;
  int blocks_per_sm;
};

/// The launch policy for compute capability `cc`: one policy for sm_80 and sm_90 until the
/// device benchmarks (bench/device_check.sh) show a reason to differ; 8 blocks of 256 threads fill
/// the 2048 resident threads of an Ampere or Hopper SM.
constexpr launch_policy policy_for(int /*cc*/) noexcept { return launch_policy{256, 8}; }

}  // namespace agoq::device
