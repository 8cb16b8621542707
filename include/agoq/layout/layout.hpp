/// \file
/// Byte sizes and offsets of a quantized tensor's codes, scales and zero points, from its spec and
/// extents (docs/formats.md).
#pragma once

#include <cstdint>

#include "../error.hpp"
#include "../scheme/spec.hpp"

namespace agoq {

/// Alignment, in bytes, of each section (codes, scales, zero points) inside one allocation.
inline constexpr std::int64_t section_alignment = 128;

/// The largest element or byte count agoq's size arithmetic accepts, 2^62: make_layout and the
/// memory model (activation/memory_model.hpp) refuse tensors and configurations whose counts
/// could exceed it (agoq::invalid_argument), so that no count or sum of a few of them wraps around
/// std::int64_t.
inline constexpr std::int64_t max_size_count = std::int64_t{1} << 62;

/// Where the parts of a quantized [rows, cols] tensor live in one buffer:
/// codes row by row (each row starting on a byte boundary, sub-byte codes packed least
/// significant bits first), then the scales of the group grid in row-major order, then (for
/// asymmetric codes) one zero-point byte per group. Every section starts at a multiple of
/// section_alignment. Host and device.
struct quantized_layout {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  int bits = 8;
  tile_shape tile;                      ///< the rectangle one group covers
  std::int64_t group_grid_rows = 0;     ///< groups along the rows: ceil(rows / tile.rows)
  std::int64_t group_grid_cols = 0;     ///< groups along a row: ceil(cols / tile.cols)
  std::int64_t code_row_bytes = 0;      ///< ceil(cols * bits / 8)
  std::int64_t codes_bytes = 0;         ///< rows * code_row_bytes
  std::int64_t scale_bytes_each = 4;    ///< bytes of one stored scale
  std::int64_t scales_offset = 0;       ///< byte offset of the scales
  std::int64_t scales_bytes = 0;        ///< groups * scale_bytes_each
  std::int64_t zero_points_offset = 0;  ///< byte offset of the zero points
  std::int64_t zero_points_bytes = 0;   ///< groups (asymmetric codes) or 0
  std::int64_t total_bytes = 0;         ///< the whole buffer

  /// Number of groups (scales).
  AGOQ_HOST_DEVICE constexpr std::int64_t groups() const noexcept {
    return group_grid_rows * group_grid_cols;
  }
  /// Number of elements.
  AGOQ_HOST_DEVICE constexpr std::int64_t elements() const noexcept { return rows * cols; }
  /// Index of the group holding element (r, c) in the row-major group grid.
  AGOQ_HOST_DEVICE constexpr std::int64_t group_of(std::int64_t r, std::int64_t c) const noexcept {
    return (r / tile.rows) * group_grid_cols + c / tile.cols;
  }
};

namespace detail {
AGOQ_HOST_DEVICE constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return (a + b - 1) / b;
}
constexpr std::int64_t align_up(std::int64_t a, std::int64_t b) noexcept {
  return ceil_div(a, b) * b;
}
}  // namespace detail

/// The layout of a [rows, cols] tensor quantized with `s`. Throws agoq::invalid_argument for an
/// invalid spec, negative extents, or more than max_size_count / 8 (2^59) elements, so that every
/// size (at most 6 bytes per element: a code, a 4-byte scale and a zero point) stays under
/// max_size_count. An empty tensor has no codes and no groups.
inline quantized_layout make_layout(spec const& s, std::int64_t rows, std::int64_t cols) {
  s.validate();
  AGOQ_EXPECTS(rows >= 0 && cols >= 0, "layout: extents must be non-negative, got " +
                                           std::to_string(rows) + "x" + std::to_string(cols));
  AGOQ_EXPECTS(cols == 0 || rows <= (max_size_count / 8) / cols,
               "layout: a " + std::to_string(rows) + "x" + std::to_string(cols) +
                   " tensor is too large: its sizes could exceed 2^62 bytes");
  quantized_layout l;
  l.rows = rows;
  l.cols = cols;
  l.bits = s.bits;
  l.tile = s.tile(rows, cols);
  bool const empty = rows == 0 || cols == 0;
  l.group_grid_rows = empty ? 0 : detail::ceil_div(rows, l.tile.rows);
  l.group_grid_cols = empty ? 0 : detail::ceil_div(cols, l.tile.cols);
  l.code_row_bytes = detail::ceil_div(cols * s.bits, 8);
  l.codes_bytes = rows * l.code_row_bytes;
  l.scale_bytes_each = scale_bytes(s.scale);
  l.scales_offset = detail::align_up(l.codes_bytes, section_alignment);
  l.scales_bytes = l.groups() * l.scale_bytes_each;
  l.zero_points_offset = detail::align_up(l.scales_offset + l.scales_bytes, section_alignment);
  l.zero_points_bytes = s.has_zero_point() ? l.groups() : 0;
  l.total_bytes = s.has_zero_point() ? l.zero_points_offset + l.zero_points_bytes
                                     : l.scales_offset + l.scales_bytes;
  return l;
}

}  // namespace agoq
