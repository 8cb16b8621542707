/// \file
/// Helpers of the tests of activation::measure: views of vectors, sample data holding what measure
/// must leave out or handle (NaN, ±Inf, zeros, subnormals, outliers), and the comparison of two
/// statistics bit for bit.
#pragma once

#include <agoq/activation/statistics.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace statistics_test {

using agoq::activation::tensor_stats;

inline float const nan_f = std::numeric_limits<float>::quiet_NaN();
inline float const inf_f = std::numeric_limits<float>::infinity();

/// The [rows, cols] view of x.
template <class T>
agoq::matrix_view<T const> view(std::vector<T> const& x, std::int64_t rows, std::int64_t cols) {
  return agoq::matrix_view<T const>(x.data(), rows, cols);
}

/// n normal values (fixed seed) with outliers, zeros, subnormals and non-finite values.
template <class T>
std::vector<T> sample(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (T& v : x) {
    float f = normal(gen) * ((gen() % 50 == 0) ? 40.0f : 1.0f);
    switch (gen() % 30) {
      case 0:
        f = 0.0f;
        break;
      case 1:
        f = std::numeric_limits<float>::denorm_min() * 5.0f;
        break;
      case 2:
        f = nan_f;
        break;
      case 3:
        f = (gen() & 1) ? inf_f : -inf_f;
        break;
      default:
        break;
    }
    v = agoq::numeric::from_float<T>(f);
  }
  return x;
}

/// The group tiles the tests measure a [rows, cols] tensor under: groups in rows (narrower than,
/// as wide as and wider than a slice; one per row), the whole tensor, columns, small and large
/// blocks, and tiles two rows tall.
inline std::vector<agoq::tile_shape> groupings(std::int64_t rows, std::int64_t cols) {
  using agoq::tile_shape;
  return {tile_shape{1, 128},  tile_shape{1, 32},      tile_shape{1, 1000},
          tile_shape{1, cols}, tile_shape{rows, cols}, tile_shape{rows, 1},
          tile_shape{3, 4},    tile_shape{128, 128},   tile_shape{2, 700}};
}

/// The bytes quantize writes for x under scheme `s` (codes, scales, zero points and their
/// padding, which starts zeroed) and the statistics quantize_measured gathers, next to quantize's
/// bytes and measure's statistics on the same executor.
struct fused_result {
  std::vector<std::uint8_t> bytes;
  std::int64_t nonfinite = 0;
  tensor_stats stats;
};

/// quantize_measured (fused) or quantize then measure (not fused) of x under `s` on `ex`.
template <class T>
fused_result quantize_and_measure(agoq::host_executor ex, agoq::spec const& s,
                                  std::vector<T> const& x, std::int64_t rows, std::int64_t cols,
                                  bool fused, agoq::quantize_options opt = {}) {
  fused_result r;
  r.bytes.assign(static_cast<std::size_t>(agoq::make_layout(s, rows, cols).total_bytes), 0);
  auto const out = agoq::view_of_buffer(s, rows, cols, r.bytes.data());
  if (fused) {
    r.nonfinite = agoq::activation::quantize_measured(ex, view(x, rows, cols), out, r.stats, opt);
  } else {
    r.nonfinite = agoq::quantize(ex, view(x, rows, cols), out, opt);
    r.stats = agoq::activation::measure(ex, view(x, rows, cols), s);
  }
  return r;
}

/// True when a and b hold the same statistics, bit for bit.
inline bool same_bits(tensor_stats const& a, tensor_stats const& b) {
  return a.tile == b.tile && a.elements == b.elements && a.sum_squares == b.sum_squares &&
         a.sum_group_absmax_sq == b.sum_group_absmax_sq &&
         a.sum_group_range_sq == b.sum_group_range_sq && a.has_dead_zones == b.has_dead_zones &&
         a.dead_energy == b.dead_energy && a.live_absmax_sq == b.live_absmax_sq &&
         a.live_error_2bit == b.live_error_2bit;
}

/// True when two fused_results hold the same bytes, count and statistics.
inline bool same_result(fused_result const& a, fused_result const& b) {
  return a.bytes == b.bytes && a.nonfinite == b.nonfinite && same_bits(a.stats, b.stats);
}

}  // namespace statistics_test
