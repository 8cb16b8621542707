/// \file
/// A model of the error quantizing a saved activation introduces, relative to the tensor's mean
/// square, computed either from statistics the quantize kernels produce as a by-product (group
/// absmax) or, before training starts, from a distribution assumption (Gaussian elements times an
/// outlier factor). Weighted per tensor kind (or per layer's tensor) by a sensitivity, so a
/// planner can compare schemes and kinds on one scale. Host only. Assumptions are listed in
/// docs/activations.md.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "../config.hpp"
#include "../error.hpp"
#include "../numeric/fp8.hpp"
#include "../numeric/scale.hpp"
#include "../scheme/spec.hpp"
#include "layer_kind.hpp"
#include "policy.hpp"

namespace agoq::activation {

/// Mean squared rounding error per element in units of step^2, where step is the distance
/// between neighbouring codes (the scale of an integer code):
/// - nearest: 1/12, the uniform-noise model (the hard bound is 1/4: |error| <= step / 2);
/// - stochastic: 1/4, a hard bound (the variance is p (1 - p) step^2 <= step^2 / 4; ActNN's
///   bound, Chen et al. 2021).
inline constexpr double rounding_noise_factor(rounding_kind r) noexcept {
  return r == rounding_kind::nearest ? 1.0 / 12.0 : 1.0 / 4.0;
}

/// Largest factor by which storing a scale rounds it up (DESIGN §4), squared (noise grows with
/// scale^2): f32 1; bf16 (1 + 2^-7)^2 (8 significant bits); e8m0 4 (up to the next power of two).
inline constexpr double scale_storage_factor(scale_format f) noexcept {
  switch (f) {
    case scale_format::f32:
      return 1.0;
    case scale_format::bf16:
      return (1.0 + 1.0 / 128.0) * (1.0 + 1.0 / 128.0);
    default:
      return 4.0;
  }
}

/// Statistics of one saved tensor that a quantize kernel produces as a by-product, gathered for
/// one grouping (the tile they were measured with).
struct tensor_stats {
  tile_shape tile{1, 128};         ///< the group rectangle the sums were gathered over
  std::int64_t elements = 0;       ///< finite elements
  double sum_squares = 0;          ///< sum of x^2 over the finite elements
  double sum_group_absmax_sq = 0;  ///< sum over groups of (elements of the group) * absmax^2
  double sum_group_range_sq = 0;   ///< same with (hi - lo)^2, lo = min(min, 0), hi = max(max, 0);
                                   ///< 0: unknown, (2 absmax)^2 is used as its bound

  /// Symmetric bit widths with dead-zone statistics: 2, 4 and 8 (index 0, 1, 2).
  static constexpr int dead_zone_widths = 3;
  /// The bit width of dead-zone index w (2 << w). Host and device.
  AGOQ_HOST_DEVICE static constexpr int dead_zone_bits(int w) noexcept { return 2 << w; }
  /// True when dead_energy, live_absmax_sq and live_error_2bit hold every group's (measure()
  /// gathers them for any grouping).
  bool has_dead_zones = false;
  /// Per width: sum of x^2 over the finite elements under half a step, |x| < absmax_g / (2 qmax),
  /// which nearest rounding sends to 0 (error -x).
  std::array<double, dead_zone_widths> dead_energy{};
  /// Per width: sum over groups of (finite elements not under half a step) * absmax_g^2.
  std::array<double, dead_zone_widths> live_absmax_sq{};
  /// At 2 bits, per scale format (indexed by scale_format: f32, bf16, e8m0), the squared error of
  /// the finite elements not under half a step, |x| >= absmax_g / 2, which nearest rounding sends
  /// to ±scale_g (add_live_gap): with f32 scales (scale_g = absmax_g) exactly
  /// sum_g sum (absmax_g - |x|)^2 (a tie at half a step rounds to 0 with the same error);
  /// with bf16 and e8m0 scales, rounded up from absmax_g, an upper bound.
  std::array<double, 3> live_error_2bit{};

  /// Adds one group of `n` finite elements with absolute maximum `absmax` and widened range
  /// `range` (pass 0 when unknown): each sum += (n absmax) absmax as one fused multiply-add, so
  /// no compiler setting changes the result (measure() relies on it). Host only.
  void add_group(std::int64_t n, double absmax, double range = 0) noexcept {
    sum_group_absmax_sq = std::fma(static_cast<double>(n) * absmax, absmax, sum_group_absmax_sq);
    sum_group_range_sq = std::fma(static_cast<double>(n) * range, range, sum_group_range_sq);
  }

  /// Adds one group's dead zone of width index w: `energy` (sum of x^2 under half a step) and
  /// `live` elements above it, with the group's absmax (live_absmax_sq as one fused
  /// multiply-add). Host only.
  void add_dead_zone(int w, double energy, std::int64_t live, double absmax) noexcept {
    auto const i = static_cast<std::size_t>(w);
    dead_energy[i] += energy;
    live_absmax_sq[i] = std::fma(static_cast<double>(live) * absmax, absmax, live_absmax_sq[i]);
  }

  /// Adds one group's 2-bit live elements to live_error_2bit: `live` finite elements not under
  /// half a step of absolute maximum `absmax`, and `gap_sq`, the sum of their (absmax - |x|)^2. Per
  /// scale format, the group's scale is absmax rounded up by e = scale - absmax (0 for f32), and
  /// each |scale - |x|| <= (absmax - |x|) + e, so by Minkowski's inequality the group's error is
  /// at most (sqrt(gap_sq) + e sqrt(live))^2 = gap_sq + e (2 sqrt(gap_sq live) + e live), which
  /// is added (fused multiply-adds, so no compiler setting changes the result). Elements that a
  /// scale's wider dead zone, |x| < scale / 2, sends to 0 have the smaller error
  /// x^2 < (scale - |x|)^2. Host only.
  void add_live_gap(double gap_sq, std::int64_t live, float absmax) noexcept {
    double const n = static_cast<double>(live);
    auto const add = [&](scale_format f, float scale) {
      double const e = static_cast<double>(scale) - absmax;
      double const cross = std::fma(e, n, 2.0 * std::sqrt(gap_sq * n));
      live_error_2bit[static_cast<std::size_t>(f)] += std::fma(e, cross, gap_sq);
    };
    add(scale_f32::format, scale_f32::round_up(absmax));
    add(scale_bf16::format, scale_bf16::round_up(absmax));
    add(scale_e8m0::format, scale_e8m0::round_up(absmax));
  }
};

/// Relative mean squared quantization error (noise power / signal power) of storing a tensor
/// with the given statistics in scheme `s`:
/// - symmetric integer: c_r * f_s * sum_g n_g (absmax_g / qmax)^2 / sum x^2; for nearest
///   rounding of 2, 4 or 8 bits with dead-zone statistics (has_dead_zones), the elements under
///   half a step count their own x^2 (they round to 0) and only the others the uniform noise:
///   (dead_energy + c_r f_s live_absmax_sq / qmax^2) / sum x^2; at 2 bits the others round to
///   ±scale, and their error is tensor_stats::live_error_2bit of the scale format (exact for f32,
///   an upper bound for bf16 and e8m0): (dead_energy + live_error_2bit) / sum x^2;
/// - asymmetric integer: the same with range_g / (2^b - 1) (range_g <= 2 absmax_g when unknown);
/// - fp8 with m mantissa bits: c_r * (2^-2m + f_s * sum_g n_g (absmax_g * sub)^2 / sum x^2), the
///   relative ulp of normal numbers plus the absolute step of the subnormals, sub = (smallest
///   subnormal) / (largest finite).
/// Throws agoq::invalid_argument when the statistics were gathered over a different tile than
/// `s` uses on a [rows, cols] tensor, or are empty. A tensor of zeros (sum x^2 = 0) has error 0.
inline double relative_error(spec const& s, tensor_stats const& st, std::int64_t rows,
                             std::int64_t cols) {
  s.validate();
  AGOQ_EXPECTS(st.tile == s.tile(rows, cols),
               "error model: statistics gathered over " + std::to_string(st.tile.rows) + "x" +
                   std::to_string(st.tile.cols) + " groups cannot predict " + s.name());
  if (st.sum_squares <= 0) return 0.0;
  double const c = rounding_noise_factor(s.rounding) * scale_storage_factor(s.scale);
  switch (s.code) {
    case code_kind::int_sym: {
      double const qmax = static_cast<double>((1 << (s.bits - 1)) - 1);
      int w = 0;
      while (w < tensor_stats::dead_zone_widths && tensor_stats::dead_zone_bits(w) != s.bits) ++w;
      if (st.has_dead_zones && s.rounding == rounding_kind::nearest &&
          w < tensor_stats::dead_zone_widths) {
        auto const i = static_cast<std::size_t>(w);
        double const live = s.bits == 2 ? st.live_error_2bit[static_cast<std::size_t>(s.scale)]
                                        : c * st.live_absmax_sq[i] / (qmax * qmax);
        return (st.dead_energy[i] + live) / st.sum_squares;
      }
      return c * st.sum_group_absmax_sq / (qmax * qmax) / st.sum_squares;
    }
    case code_kind::uint_asym: {
      double const levels = static_cast<double>((1 << s.bits) - 1);
      double const range_sq =
          st.sum_group_range_sq > 0 ? st.sum_group_range_sq : 4.0 * st.sum_group_absmax_sq;
      return c * range_sq / (levels * levels) / st.sum_squares;
    }
    default: {
      numeric::fp8_format const f =
          s.code == code_kind::fp8_e4m3 ? numeric::fp8_e4m3_format : numeric::fp8_e5m2_format;
      double const ulp = std::ldexp(1.0, -f.mantissa_bits);
      double const sub = std::ldexp(1.0, 1 - f.exponent_bias - f.mantissa_bits) / f.max_value;
      return rounding_noise_factor(s.rounding) *
             (ulp * ulp +
              scale_storage_factor(s.scale) * sub * sub * st.sum_group_absmax_sq / st.sum_squares);
    }
  }
}

/// The distribution assumption used before any statistics exist: elements are i.i.d.
/// N(0, sigma^2), and a group's absmax is `outlier` times the Gaussian estimate
/// sigma * sqrt(2 ln(2 n)) for a group of n elements (an upper bound on E[max |x_i|] of n Gaussian
/// samples). Returns the relative error of relative_error() with sum x^2 = N sigma^2 and every
/// group's absmax^2 = outlier^2 sigma^2 2 ln(2 n); asymmetric ranges are taken as 2 absmax.
/// Throws agoq::invalid_argument for an invalid spec, a non-positive shape or outlier < 1.
inline double relative_error_gaussian(spec const& s, std::int64_t rows, std::int64_t cols,
                                      double outlier) {
  AGOQ_EXPECTS(rows >= 1 && cols >= 1, "error model: the tensor shape must be positive");
  AGOQ_EXPECTS(outlier >= 1.0,
               "error model: outlier factor must be at least 1, got " + std::to_string(outlier));
  tile_shape const tile = s.tile(rows, cols);
  double const n = static_cast<double>(std::min(tile.rows, rows) * std::min(tile.cols, cols));
  tensor_stats st;
  st.tile = tile;
  st.elements = rows * cols;
  st.sum_squares = static_cast<double>(st.elements);
  st.sum_group_absmax_sq = st.sum_squares * outlier * outlier * 2.0 * std::log(2.0 * n);
  return relative_error(s, st, rows, cols);
}

/// The documented default sensitivity of a category: how strongly a relative error in a saved
/// tensor of that category perturbs the gradients (see docs/activations.md):
/// - linear_input 1: the error enters only that layer's weight gradient dW = X^T dY;
/// - activation_input 2: the error enters f'(x) and with it the input gradient, which flows
///   into every earlier layer;
/// - residual_stream 4: the norm backward divides by the row RMS and feeds the residual
///   gradient of every earlier layer; its outlier channels set the group scales;
/// - attention_core 8: softmax exponentiates errors in Q K^T; logsumexp errors rescale whole
///   rows;
/// - routing 8: a router probability's error scales an expert's whole output for that token (and
///   the router's gradient).
inline constexpr double default_sensitivity(tensor_category c) noexcept {
  switch (c) {
    case tensor_category::linear_input:
      return 1.0;
    case tensor_category::activation_input:
      return 2.0;
    case tensor_category::residual_stream:
      return 4.0;
    default:
      return 8.0;
  }
}

/// The documented default outlier factor of a kind (ratio of a group's absmax to the Gaussian
/// estimate): residual stream 6 (massive activations in a few channels; the gated shared experts'
/// output and Gemma's post-norms' inputs too, contributions to it that the output and down
/// projections write), norm outputs 3 (the norm
/// weight re-scales channels; the experts' input is the MLP norm's output routed), SwiGLU / GeLU
/// outputs 4 (products of two projections are heavy-tailed; the experts' too), gate / up / GeLU
/// inputs 2 (the experts' too), attention core and routing 2.
inline constexpr double default_outlier(tensor_kind k) noexcept {
  switch (storage_kind(k)) {
    case tensor_kind::attn_norm_input:
    case tensor_kind::mlp_norm_input:
    case tensor_kind::ln1_input:
    case tensor_kind::ln2_input:
    case tensor_kind::shared_expert_output:
    case tensor_kind::post_attn_norm_input:
    case tensor_kind::post_mlp_norm_input:
      return 6.0;
    case tensor_kind::qkv_input:
    case tensor_kind::mlp_input:
    case tensor_kind::fc1_input:
    case tensor_kind::expert_input:
      return 3.0;
    case tensor_kind::swiglu_output:
    case tensor_kind::fc2_input:
    case tensor_kind::expert_swiglu_output:
      return 4.0;
    default:
      return 2.0;
  }
}

/// The error model a planner uses: per-kind sensitivities and outlier factors, optional
/// sensitivities per (layer, kind) that replace their kind's for that tensor, and optional
/// observed statistics per (layer, kind) that replace the distribution assumption for that
/// tensor. Host only.
class error_model {
 public:
  /// The documented defaults.
  error_model() {
    for (tensor_kind const k : all_tensor_kinds) {
      sensitivity_[static_cast<std::size_t>(index_of(k))] = default_sensitivity(category_of(k));
      outlier_[static_cast<std::size_t>(index_of(k))] = default_outlier(k);
    }
  }

  /// Weight of kind `k`'s relative error in the planner's objective.
  double sensitivity(tensor_kind k) const noexcept {
    return sensitivity_[static_cast<std::size_t>(index_of(storage_kind(k)))];
  }
  /// Sets kind `k`'s sensitivity. Throws agoq::invalid_argument unless it is finite and >= 0.
  void set_sensitivity(tensor_kind k, double w) {
    check_sensitivity(w);
    sensitivity_[static_cast<std::size_t>(index_of(storage_kind(k)))] = w;
  }
  /// Weight of layer `layer`'s tensor `k`: the one set for that layer, else the kind's.
  double sensitivity(std::int64_t layer, tensor_kind k) const {
    auto const it = layer_sensitivity_.find({layer, storage_kind(k)});
    return it != layer_sensitivity_.end() ? it->second : sensitivity(k);
  }
  /// Sets the sensitivity of layer `layer`'s tensor `k` alone (e.g. measured per layer; it
  /// replaces the kind's there, whatever the kind's is set to later). Throws
  /// agoq::invalid_argument for a negative layer or a weight that is not finite and >= 0.
  void set_sensitivity(std::int64_t layer, tensor_kind k, double w) {
    AGOQ_EXPECTS(layer >= 0, "error model: the layer must be >= 0, got " + std::to_string(layer));
    check_sensitivity(w);
    layer_sensitivity_[{layer, storage_kind(k)}] = w;
  }
  /// The per-layer sensitivities set, keyed by (layer, kind), in that order.
  std::map<std::pair<std::int64_t, tensor_kind>, double> const& layer_sensitivities()
      const noexcept {
    return layer_sensitivity_;
  }
  /// Forgets every per-layer sensitivity.
  void clear_layer_sensitivities() noexcept { layer_sensitivity_.clear(); }
  /// Outlier factor of kind `k` under the distribution assumption.
  double outlier(tensor_kind k) const noexcept {
    return outlier_[static_cast<std::size_t>(index_of(storage_kind(k)))];
  }
  /// Sets kind `k`'s outlier factor. Throws agoq::invalid_argument unless it is finite and >= 1.
  void set_outlier(tensor_kind k, double f) {
    AGOQ_EXPECTS(std::isfinite(f) && f >= 1, "error model: outlier factor must be >= 1");
    outlier_[static_cast<std::size_t>(index_of(storage_kind(k)))] = f;
  }

  /// Records observed statistics of layer `layer`'s tensor `k` (replacing earlier ones). Throws
  /// agoq::invalid_argument for a negative layer.
  void set_statistics(std::int64_t layer, tensor_kind k, tensor_stats const& st) {
    AGOQ_EXPECTS(layer >= 0, "error model: the layer must be >= 0, got " + std::to_string(layer));
    stats_[{layer, storage_kind(k)}] = st;
  }
  /// Forgets every recorded statistic.
  void clear_statistics() noexcept { stats_.clear(); }

  /// The largest layer a per-layer sensitivity or a statistic is recorded for, -1 if none (a
  /// planner refuses one past the model's layers).
  std::int64_t last_layer() const noexcept {
    std::int64_t last = -1;
    if (!layer_sensitivity_.empty()) last = layer_sensitivity_.rbegin()->first.first;
    if (!stats_.empty()) last = std::max(last, stats_.rbegin()->first.first);
    return last;
  }

  /// Relative error of storing layer `layer`'s tensor `k` of shape `shape` as `s`: 0 when kept
  /// precise, from recorded statistics when there are some, else from the distribution
  /// assumption. Throws as relative_error does.
  double relative(std::int64_t layer, tensor_kind k, saved_shape const& shape,
                  storage const& s) const {
    if (s.is_precise()) return 0.0;
    auto const it = stats_.find({layer, storage_kind(k)});
    if (it != stats_.end()) return relative_error(*s.quantized, it->second, shape.rows, shape.cols);
    return relative_error_gaussian(*s.quantized, shape.rows, shape.cols, outlier(k));
  }
  /// sensitivity(layer, k) * relative(...): the planner's objective term.
  double weighted(std::int64_t layer, tensor_kind k, saved_shape const& shape,
                  storage const& s) const {
    return sensitivity(layer, k) * relative(layer, k, shape, s);
  }

 private:
  static void check_sensitivity(double w) {
    AGOQ_EXPECTS(std::isfinite(w) && w >= 0, "error model: sensitivity must be finite and >= 0");
  }

  std::array<double, tensor_kind_count> sensitivity_{};
  std::array<double, tensor_kind_count> outlier_{};
  std::map<std::pair<std::int64_t, tensor_kind>, double> layer_sensitivity_;
  std::map<std::pair<std::int64_t, tensor_kind>, tensor_stats> stats_;
};

}  // namespace agoq::activation
