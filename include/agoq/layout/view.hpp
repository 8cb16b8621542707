/// \file
/// The non-owning view of a quantized tensor: spec, extents and the three pointers. Trivially
/// copyable, so it is passed by value to kernels.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "../error.hpp"
#include "../scheme/spec.hpp"
#include "layout.hpp"

namespace agoq {

/// A quantized [rows, cols] tensor that someone else owns. `Byte` is `std::uint8_t` (writable)
/// or `std::uint8_t const` (read-only). `codes` holds the packed codes row by row, `scales` the
/// stored scales of the group grid (format `spec.scale`), `zero_points` one byte per group for
/// asymmetric codes (null otherwise). The three may point into one buffer laid out by
/// make_layout, or into separate ones.
template <class Byte>
struct basic_quantized_view {
  static_assert(std::is_same_v<std::remove_const_t<Byte>, std::uint8_t>);
  agoq::spec spec;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  Byte* codes = nullptr;
  Byte* scales = nullptr;
  Byte* zero_points = nullptr;

  /// The read-only view of the same tensor.
  template <class To>
  requires(!std::is_const_v<Byte> &&
           std::is_same_v<To, basic_quantized_view<std::uint8_t const>>) AGOQ_HOST_DEVICE constexpr
  operator To() const noexcept {
    return {spec, rows, cols, codes, scales, zero_points};
  }

  /// Number of elements.
  AGOQ_HOST_DEVICE constexpr std::int64_t size() const noexcept { return rows * cols; }

  /// The layout of this tensor (sizes of each part).
  quantized_layout layout() const { return make_layout(spec, rows, cols); }

  /// Throws agoq::invalid_argument when the spec is invalid, an extent is negative, or a part
  /// that the tensor needs is null.
  void validate() const {
    quantized_layout const l = layout();
    if (l.elements() == 0) return;
    AGOQ_EXPECTS(codes != nullptr, "quantized view: null codes pointer for " +
                                       std::to_string(l.codes_bytes) + " bytes of codes");
    AGOQ_EXPECTS(scales != nullptr, "quantized view: null scales pointer for " +
                                        std::to_string(l.groups()) + " scales");
    AGOQ_EXPECTS(!spec.has_zero_point() || zero_points != nullptr,
                 "quantized view: asymmetric codes need zero points, got a null pointer");
  }
};

/// A writable quantized view.
using quantized_view = basic_quantized_view<std::uint8_t>;
/// A read-only quantized view.
using const_quantized_view = basic_quantized_view<std::uint8_t const>;

/// A view over one buffer of `make_layout(s, rows, cols).total_bytes` bytes.
template <class Byte>
basic_quantized_view<Byte> view_of_buffer(spec const& s, std::int64_t rows, std::int64_t cols,
                                          Byte* buffer) {
  quantized_layout const l = make_layout(s, rows, cols);
  AGOQ_EXPECTS(buffer != nullptr || l.total_bytes == 0, "view_of_buffer: null buffer");
  return {s,
          rows,
          cols,
          buffer,
          buffer + l.scales_offset,
          s.has_zero_point() ? buffer + l.zero_points_offset : nullptr};
}

}  // namespace agoq
