/// \file
/// The small deterministic problem of the optimizer tests: least squares y = A w + noise with
/// features whose scales span three decades, so that the gradients inside one 128-element block
/// of the optimizer state differ by up to 1000x (the situation in which a linear 8-bit second
/// moment rounds the small ones to zero).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <agoq/optim/adamw.hpp>

namespace agoq_test {

/// The optimizer tests' hyperparameters: lr 1e-2, weight decay 0.01, the default betas and eps.
inline agoq::optim::adamw_hyper test_hyper() {
  agoq::optim::adamw_hyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.01f;
  return h;
}

/// min over w of L(w) = ||A w - y||^2 / (2 M), A = [M, D] with column j scaled by 10^(-3 u_j).
struct least_squares {
  static constexpr std::int64_t samples = 512;
  static constexpr std::int64_t params = 384;  // three blocks of 128
  std::vector<float> a;                        // [samples, params], row-major
  std::vector<float> y;                        // [samples]

  /// Feature scales 10^(-decades u), u uniform in [0, 1).
  explicit least_squares(float decades = 3.0f, std::uint32_t seed = 7)
      : a(samples * params), y(samples) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> scale(params);
    std::vector<float> w_true(params);
    for (std::int64_t j = 0; j < params; ++j) {
      scale[j] = std::pow(10.0f, -decades * unit(gen));
      w_true[j] = normal(gen);
    }
    for (std::int64_t i = 0; i < samples; ++i) {
      double dot = 0.0;
      for (std::int64_t j = 0; j < params; ++j) {
        a[i * params + j] = normal(gen) * scale[j];
        dot += static_cast<double>(a[i * params + j]) * w_true[j];
      }
      y[i] = static_cast<float>(dot) + 0.01f * normal(gen);
    }
  }

  /// The loss at w (double accumulation).
  double loss(std::span<float const> w) const {
    double sum = 0.0;
    for (std::int64_t i = 0; i < samples; ++i) {
      double r = -static_cast<double>(y[i]);
      for (std::int64_t j = 0; j < params; ++j) r += static_cast<double>(a[i * params + j]) * w[j];
      sum += r * r;
    }
    return sum / (2.0 * samples);
  }

  /// The distance of the predictions, ||A (w - ref)|| / ||A ref||: the part of a parameter
  /// difference that the loss can see.
  double prediction_distance(std::span<float const> w, std::span<float const> ref) const {
    double num = 0.0;
    double den = 0.0;
    for (std::int64_t i = 0; i < samples; ++i) {
      double d = 0.0;
      double r = 0.0;
      for (std::int64_t j = 0; j < params; ++j) {
        d += static_cast<double>(a[i * params + j]) * (static_cast<double>(w[j]) - ref[j]);
        r += static_cast<double>(a[i * params + j]) * ref[j];
      }
      num += d * d;
      den += r * r;
    }
    return std::sqrt(num / den);
  }

  /// The gradient A^T (A w - y) / M into g (fp32 accumulation in a fixed order: deterministic).
  void gradient(std::span<float const> w, std::span<float> g) const {
    std::vector<float> r(samples);
    for (std::int64_t i = 0; i < samples; ++i) {
      float s = -y[i];
      for (std::int64_t j = 0; j < params; ++j) s += a[i * params + j] * w[j];
      r[i] = s / static_cast<float>(samples);
    }
    for (std::int64_t j = 0; j < params; ++j) g[j] = 0.0f;
    for (std::int64_t i = 0; i < samples; ++i) {
      for (std::int64_t j = 0; j < params; ++j) g[j] += a[i * params + j] * r[i];
    }
  }
};

/// The outcome of a training run.
struct run_result {
  std::vector<float> w;     ///< the parameters after the last step
  double final_loss = 0.0;  ///< L(w) at the end
  double max_loss = 0.0;    ///< the largest loss met along the way (after each step)
  bool finite = true;       ///< every parameter stayed finite
};

/// `steps` AdamW steps from w = 0 with the given state options, the learning rate decaying
/// linearly from h.lr to h.lr / steps (so that the runs settle and their end points compare).
inline run_result train(least_squares const& p, agoq::optim::adamw_state_options const& opt,
                        agoq::optim::adamw_hyper const& h, int steps) {
  run_result out;
  out.w.assign(least_squares::params, 0.0f);
  std::vector<float> g(least_squares::params);
  agoq::optim::adamw_state s(least_squares::params, opt);
  for (int t = 0; t < steps; ++t) {
    p.gradient(out.w, g);
    agoq::optim::adamw_hyper ht = h;
    ht.lr = h.lr * static_cast<float>(steps - t) / static_cast<float>(steps);
    agoq::optim::adamw_step(agoq::host, s, ht, std::span<float>(out.w), std::span<float const>(g));
    double const l = p.loss(out.w);
    out.max_loss = std::isfinite(l) && l > out.max_loss ? l : out.max_loss;
    if (!std::isfinite(l)) out.max_loss = INFINITY;
  }
  for (float x : out.w) out.finite = out.finite && std::isfinite(x);
  out.final_loss = p.loss(out.w);
  return out;
}

/// ||a - b|| / ||b||.
inline double relative_distance(std::span<float const> a, std::span<float const> b) {
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace agoq_test
