/// \file
/// Helpers of the gradient tests: inputs, fp64 references, stage scales, the per-element error
/// bound of the 8-bit all-reduce, and a world of in-process ranks split into nodes.
#pragma once

#include <agoq/agoq.hpp>
#include <agoq/comm/in_process.hpp>
#include <agoq/gradient/all_reduce.hpp>
#include <agoq/gradient/buffer.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

namespace gradient_test {

/// fp32 unit roundoff, 2^-24.
inline constexpr double unit_roundoff = 5.9604644775390625e-8;

/// n normal values of standard deviation sigma, fixed seed.
inline std::vector<float> normal(std::int64_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

/// P inputs of n values each; rank r's spread varies by rank and by group so scales differ.
inline std::vector<std::vector<float>> rank_inputs(int ranks, std::int64_t n, std::uint64_t seed) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < ranks; ++r) in.push_back(normal(n, seed * 1000 + static_cast<unsigned>(r)));
  return in;
}

/// The fp64 sum over ranks.
inline std::vector<double> reference_sum(std::vector<std::vector<float>> const& in) {
  std::vector<double> s(in.empty() ? 0 : in[0].size(), 0.0);
  for (auto const& x : in)
    for (std::size_t i = 0; i < x.size(); ++i) s[i] += static_cast<double>(x[i]);
  return s;
}

/// The fp32 group scales agoq's quantize gives x (int8, groups of g, f32 scales): absmax / 127.
inline std::vector<double> scales_of(std::span<float const> x, int g) {
  agoq::quantized_tensor t(agoq::gradient::payload_spec(g, agoq::rounding_kind::nearest), 1,
                           static_cast<std::int64_t>(x.size()));
  agoq::quantize(agoq::host, agoq::as_row(x.data(), static_cast<std::int64_t>(x.size())), t.view());
  std::vector<double> s(static_cast<std::size_t>(t.layout().groups()));
  for (std::size_t k = 0; k < s.size(); ++k) {
    float f;
    std::memcpy(&f, t.view().scales + 4 * k, 4);
    s[k] = f;
  }
  return s;
}

/// Reads group k's fp32 scale of a view.
inline double scale_at(agoq::const_quantized_view const& v, std::int64_t k) {
  float f;
  std::memcpy(&f, v.scales + 4 * k, 4);
  return f;
}

/// The per-element bound of the flat 8-bit all-reduce (nearest rounding) against the exact sum
/// (docs/gradients.md): with s_r the stage-1 scale of rank r's group and s_o the output scale,
///   |y - sum| <= (1/2 + 256 u) (sum_r s_r + s_o) + (P + 1) u 127 sum_r s_r,
/// the first term the two roundings to the int8 grid (half a step each, widened by the fp32
/// division x / s), the second the fp32 products q s and the P - 1 fp32 additions.
inline double flat_bound(double sum_s, double s_out, int ranks) {
  double const u = unit_roundoff;
  return (0.5 + 256 * u) * (sum_s + s_out) + (ranks + 1) * u * 127 * sum_s;
}

/// The ranks of `nodes` x `per_node`: world rank w is rank w % per_node of node w / per_node.
/// intra(a) groups node a's ranks; inter(i) groups rank i of every node.
struct node_world {
  int nodes;
  int per_node;
  std::vector<std::unique_ptr<agoq::comm::in_process_group>> intra_groups;
  std::vector<std::unique_ptr<agoq::comm::in_process_group>> inter_groups;

  node_world(int n, int l) : nodes(n), per_node(l) {
    for (int a = 0; a < n; ++a)
      intra_groups.push_back(std::make_unique<agoq::comm::in_process_group>(l));
    for (int i = 0; i < l; ++i)
      inter_groups.push_back(std::make_unique<agoq::comm::in_process_group>(n));
  }

  /// Runs f(world_rank, intra communicator, inter communicator) on every rank.
  template <class F>
  void run(F&& f) {
    agoq::comm::in_process_group::run(nodes * per_node, [&](auto world) {
      int const w = world.rank();
      int const a = w / per_node;
      int const i = w % per_node;
      auto intra = intra_groups[static_cast<std::size_t>(a)]->at(i);
      auto inter = inter_groups[static_cast<std::size_t>(i)]->at(a);
      try {
        f(w, intra, inter);
      } catch (...) {
        // A failing rank must not leave its peers waiting in the sub-groups.
        for (auto& g : intra_groups) g->abort();
        for (auto& g : inter_groups) g->abort();
        throw;
      }
    });
  }
};

}  // namespace gradient_test
