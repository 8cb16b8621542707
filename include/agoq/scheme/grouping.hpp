/// \file
/// Groupings: which elements of a row-major [rows, cols] tensor share one scale. Every grouping
/// is a tiling of the matrix by rectangles of one shape, clipped at the last row and column
/// (DESIGN §4): per-tensor, per-row (per-token), per-column (per-channel), per-group of G along
/// rows, and 2-D blocks.
#pragma once

#include <concepts>
#include <cstdint>

#include "../config.hpp"

namespace agoq {

/// The grouping of a scheme, as kept in a runtime spec.
enum class grouping_kind : std::uint8_t {
  tensor,  ///< one group for the whole tensor
  row,     ///< one group per row (per token)
  column,  ///< one group per column (per channel)
  group,   ///< groups of G consecutive elements of a row; a row may end in a shorter group
  block,   ///< R x C blocks (e.g. 128 x 128 for weights), clipped at the edges
};

/// The shape of the rectangle one group covers in a given tensor.
struct tile_shape {
  std::int64_t rows = 1;
  std::int64_t cols = 1;
  friend constexpr bool operator==(tile_shape const&, tile_shape const&) = default;
};

namespace detail {
AGOQ_HOST_DEVICE constexpr std::int64_t at_least_one(std::int64_t n) noexcept {
  return n > 0 ? n : 1;
}
}  // namespace detail

/// One group for the whole tensor.
struct per_tensor {
  static constexpr grouping_kind kind = grouping_kind::tensor;
  static constexpr std::int64_t group_rows = 0;  ///< 0: the tensor's extent
  static constexpr std::int64_t group_cols = 0;
  AGOQ_HOST_DEVICE static constexpr tile_shape tile(std::int64_t rows, std::int64_t cols) noexcept {
    return {detail::at_least_one(rows), detail::at_least_one(cols)};
  }
};

/// One group per row: per-token scales for activations.
struct per_row {
  static constexpr grouping_kind kind = grouping_kind::row;
  static constexpr std::int64_t group_rows = 1;
  static constexpr std::int64_t group_cols = 0;
  AGOQ_HOST_DEVICE static constexpr tile_shape tile(std::int64_t, std::int64_t cols) noexcept {
    return {1, detail::at_least_one(cols)};
  }
};

/// One group per column: per-channel scales for weights.
struct per_column {
  static constexpr grouping_kind kind = grouping_kind::column;
  static constexpr std::int64_t group_rows = 0;
  static constexpr std::int64_t group_cols = 1;
  AGOQ_HOST_DEVICE static constexpr tile_shape tile(std::int64_t rows, std::int64_t) noexcept {
    return {detail::at_least_one(rows), 1};
  }
};

/// Groups of `G` consecutive elements along a row; groups never cross rows.
template <std::int64_t G>
requires(G > 0) struct per_group {
  static constexpr grouping_kind kind = grouping_kind::group;
  static constexpr std::int64_t group_rows = 1;
  static constexpr std::int64_t group_cols = G;
  AGOQ_HOST_DEVICE static constexpr tile_shape tile(std::int64_t, std::int64_t) noexcept {
    return {1, G};
  }
};

/// `R` x `C` blocks.
template <std::int64_t R, std::int64_t C>
requires(R > 0 && C > 0) struct per_block {
  static constexpr grouping_kind kind = grouping_kind::block;
  static constexpr std::int64_t group_rows = R;
  static constexpr std::int64_t group_cols = C;
  AGOQ_HOST_DEVICE static constexpr tile_shape tile(std::int64_t, std::int64_t) noexcept {
    return {R, C};
  }
};

/// What a grouping type provides.
template <class G>
concept grouping = requires(std::int64_t n) {
  { G::kind } -> std::convertible_to<grouping_kind>;
  { G::group_rows } -> std::convertible_to<std::int64_t>;
  { G::group_cols } -> std::convertible_to<std::int64_t>;
  { G::tile(n, n) } -> std::same_as<tile_shape>;
};

}  // namespace agoq
