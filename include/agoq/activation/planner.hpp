/// \file
/// The activation planner: given the model, its parallel layout and schedule, a per-GPU memory
/// budget, a policy table and an error model, choose the storage of every saved tensor of every
/// layer so each pipeline device fits the budget with the least modelled error. Host only,
/// deterministic. The algorithm and its optimality argument are in docs/activations.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "error_model.hpp"
#include "layer_kind.hpp"
#include "memory_model.hpp"
#include "policy.hpp"

namespace agoq::activation {

/// What the planner is asked.
struct planner_input {
  model_shape model;
  parallel_config parallel;
  step_config step;
  state_formats states;
  std::int64_t budget_bytes = 0;  ///< memory one GPU may use for everything counted, the
                                  ///< transient working memory included (stage_memory::total);
                                  ///< at most 2^62 (max_size_count)
  policy_table policy;            ///< candidates per kind
  error_model errors;             ///< sensitivities, outlier factors, observed statistics
};

/// The choice for one saved tensor of one layer.
struct planned_tensor {
  std::int64_t layer = 0;
  tensor_kind kind = tensor_kind::qkv_input;
  storage choice;
  std::int64_t bytes = 0;      ///< one micro-batch's copy on one GPU
  std::int64_t in_flight = 0;  ///< copies held at its device's activation peak (micro-batches of
                               ///< its chunk then in flight, stage_memory::in_flight)
  double error = 0;            ///< weighted modelled error (sensitivity x relative error)
  /// Its layer is recomputed (step_config::recompute), or its kind (step_config::selective): not
  /// held between its forward and its backward, so in_flight 0; held precise (`choice`,
  /// `bytes`) in the backward only (stage_memory::recompute, or the layer's working set). Error
  /// 0 under full recomputation (its checkpoint's input is bf16); under selective recomputation
  /// the error it inherits: its sensitivity times recompute_sources::factor times the sum of its
  /// sources' relative errors (as planned).
  bool recomputed = false;
};

/// The plan of one pipeline device.
struct stage_plan {
  stage_memory memory;                  ///< with the planned storage
  std::vector<planned_tensor> tensors;  ///< every owned saved tensor, by layer then block order
  double error = 0;                     ///< sum of the tensors' weighted errors
  double error_lower_bound = 0;         ///< no plan within the budget less the reserved transient
                                        ///< memory has less modelled error (see make_plan)
  std::int64_t unused_bytes = 0;        ///< budget - memory.total(): with the working memory of
                                        ///< the storage chosen, which may be less than reserved
};

/// A plan: one stage_plan per pipeline device.
class activation_plan {
 public:
  activation_plan() = default;
  activation_plan(std::vector<stage_plan> stages, std::int64_t budget, std::int64_t layers)
      : stages_(std::move(stages)), budget_(budget), layers_(layers) {
    index_.assign(static_cast<std::size_t>(layers_ * tensor_kind_count), -1);
    for (std::size_t s = 0; s < stages_.size(); ++s)
      for (std::size_t i = 0; i < stages_[s].tensors.size(); ++i) {
        auto const& t = stages_[s].tensors[i];
        index_[static_cast<std::size_t>(t.layer * tensor_kind_count + index_of(t.kind))] =
            static_cast<std::int64_t>(s << 32 | i);
      }
  }

  /// One entry per pipeline device.
  std::vector<stage_plan> const& stages() const noexcept { return stages_; }
  /// The budget it was planned for.
  std::int64_t budget_bytes() const noexcept { return budget_; }
  /// The storage of layer `layer`'s tensor `k` (an alias: its buffer's). Throws
  /// agoq::invalid_argument for a layer out of range or a kind the block does not save.
  storage const& storage_of(std::int64_t layer, tensor_kind k) const {
    return entry(layer, k).choice;
  }
  /// The planned entry of layer `layer`'s tensor `k` (an alias: its buffer's).
  planned_tensor const& entry(std::int64_t layer, tensor_kind k) const {
    AGOQ_EXPECTS(
        layer >= 0 && layer < layers_,
        "plan: layer " + std::to_string(layer) + " outside [0, " + std::to_string(layers_) + ")");
    std::int64_t const at =
        index_[static_cast<std::size_t>(layer * tensor_kind_count + index_of(storage_kind(k)))];
    AGOQ_EXPECTS(at >= 0, "plan: the block does not save " + std::string(name_of(k)));
    return stages_[static_cast<std::size_t>(at >> 32)]
        .tensors[static_cast<std::size_t>(at & 0xffffffff)];
  }
  /// Sum of every stage's modelled error.
  double total_error() const noexcept {
    double e = 0;
    for (auto const& s : stages_) e += s.error;
    return e;
  }

 private:
  std::vector<stage_plan> stages_;
  std::int64_t budget_ = 0;
  std::int64_t layers_ = 0;
  std::vector<std::int64_t> index_;
};

namespace detail {

/// One option of one planner item: its bytes (one copy times the item's chunk weight, see
/// make_plan), weighted error, candidate.
struct plan_option {
  std::int64_t bytes = 0;
  double error = 0;
  std::size_t candidate = 0;
};

/// The lower convex hull of an item's options in the (bytes, error) plane: options sorted by
/// bytes, each with strictly less error than the one before, with non-increasing error decrease
/// per byte from one to the next (collinear points kept). The first is the cheapest option.
inline std::vector<plan_option> lower_hull(std::vector<plan_option> options) {
  std::sort(options.begin(), options.end(), [](plan_option const& a, plan_option const& b) {
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    if (a.error != b.error) return a.error < b.error;
    return a.candidate < b.candidate;
  });
  std::vector<plan_option> hull;
  for (plan_option const& o : options) {
    if (!hull.empty() && (o.bytes == hull.back().bytes || o.error >= hull.back().error)) continue;
    // Drop the last point while it lies strictly above the segment from its predecessor to o:
    // slope(prev, last) < slope(last, o), cross-multiplied (all byte differences positive).
    while (hull.size() >= 2) {
      plan_option const& a = hull[hull.size() - 2];
      plan_option const& b = hull.back();
      double const lhs = (a.error - b.error) * static_cast<double>(o.bytes - b.bytes);
      double const rhs = (b.error - o.error) * static_cast<double>(b.bytes - a.bytes);
      if (lhs < rhs) {
        hull.pop_back();
      } else {
        break;
      }
    }
    hull.push_back(o);
  }
  return hull;
}

/// One step up an item's hull.
struct plan_upgrade {
  double gain = 0;         ///< error removed per byte added
  std::int64_t bytes = 0;  ///< bytes added (weighted as plan_option's)
  double error = 0;        ///< error removed
  std::size_t item = 0;
  std::size_t step = 0;  ///< from hull[step] to hull[step + 1]
};

/// The Lagrangian of a device with several peak moments (make_plan's items: their hulls, chunks
/// and chunk weights w_c; the moments' in-flight counts n_jc and their room with every item at its
/// cheapest option) at prices mu_j >= 0 of the moments' bytes:
///   L(mu) = sum_i min_o (e_io + pi_c(i) beta_io) - sum_j mu_j room_j,  pi_c = sum_j mu_j n_jc,
/// with beta_io the bytes of one copy of option o above the cheapest. By weak duality it is at most
/// the error of any plan that fits every moment, whatever the prices.
inline double moment_lagrangian(std::vector<std::vector<plan_option>> const& hulls,
                                std::vector<std::size_t> const& chunk_of,
                                std::vector<std::int64_t> const& weight,
                                std::vector<std::vector<std::int64_t>> const& peaks,
                                std::vector<std::int64_t> const& room,
                                std::vector<double> const& mu) {
  std::vector<double> pi(weight.size(), 0);
  for (std::size_t c = 0; c < pi.size(); ++c)
    for (std::size_t j = 0; j < peaks.size(); ++j)
      pi[c] += mu[j] * static_cast<double>(peaks[j][c]);
  double l = 0;
  for (std::size_t i = 0; i < hulls.size(); ++i) {
    std::int64_t const w = weight[chunk_of[i]];
    double best = hulls[i][0].error;
    for (std::size_t o = 1; o < hulls[i].size(); ++o)
      best = std::min(best, hulls[i][o].error +
                                pi[chunk_of[i]] * static_cast<double>(
                                                      (hulls[i][o].bytes - hulls[i][0].bytes) / w));
    l += best;
  }
  for (std::size_t j = 0; j < peaks.size(); ++j) l -= mu[j] * static_cast<double>(room[j]);
  return l;
}

/// What moment_lp_bound finds.
struct moment_lp {
  double bound = 0;        ///< moment_lagrangian at `mu`: at most the error of any fitting plan
  double primal = 0;       ///< the error of the fractional plan `taken`
  std::vector<double> mu;  ///< a price per moment, from the simplex's last basis
  std::vector<std::vector<double>> taken;  ///< per item, the share of each hull step taken
  int iterations = 0;  ///< simplex iterations (at the cap, 50 (steps + moments), not optimal)
};

/// The LP relaxation of a device's plan with several peak moments (arguments as
/// moment_lagrangian): take a share x_is in [0, 1] of each hull step s of each item i, which
/// removes its error de_is and adds n_jc(i) db_is bytes at moment j (db_is: one copy), so that
/// every moment fits its room. An item's steps all add bytes in the proportions n_jc(i) and remove
/// less error per byte one after the other, so an optimum takes them in order: the relaxation of
/// the item's options' convex hull, whose optimum equals max over mu >= 0 of L(mu) (LP duality).
/// Solved by a bounded-variable primal simplex (one row per moment, rows and costs scaled to at
/// most 1, Dantzig's rule, at most 50 (steps + moments) iterations); the bound is L at the last
/// basis's dual prices, so it holds whatever the arithmetic's rounding, and equals the LP optimum
/// where the simplex ends optimal (then `primal` - `bound` is rounding: tested). Needs every room
/// >= 0 (the plan with every item at its cheapest option fits). Deterministic.
inline moment_lp moment_lp_bound(std::vector<std::vector<plan_option>> const& hulls,
                                 std::vector<std::size_t> const& chunk_of,
                                 std::vector<std::int64_t> const& weight,
                                 std::vector<std::vector<std::int64_t>> const& peaks,
                                 std::vector<std::int64_t> const& room) {
  std::size_t const rows = peaks.size();
  struct column {
    std::size_t item;
    std::size_t step;
    std::size_t chunk;
    double gain;   // de_is
    double bytes;  // db_is, one copy
  };
  std::vector<column> cols;
  for (std::size_t i = 0; i < hulls.size(); ++i)
    for (std::size_t s = 0; s + 1 < hulls[i].size(); ++s)
      cols.push_back(
          {i, s, chunk_of[i], hulls[i][s].error - hulls[i][s + 1].error,
           static_cast<double>((hulls[i][s + 1].bytes - hulls[i][s].bytes) / weight[chunk_of[i]])});
  std::size_t const n = cols.size();
  std::size_t const chunks = weight.size();
  // Row j of column k is n_jc db_k / scale_j; costs -de_k / cost_scale.
  std::vector<double> scale(rows, 0);
  double cost_scale = 0;
  for (column const& k : cols) {
    cost_scale = std::max(cost_scale, k.gain);
    for (std::size_t j = 0; j < rows; ++j)
      scale[j] = std::max(scale[j], static_cast<double>(peaks[j][k.chunk]) * k.bytes);
  }
  for (double& x : scale) x = x > 0 ? x : 1;
  cost_scale = cost_scale > 0 ? cost_scale : 1;
  auto const cost = [&](std::size_t v) { return v < n ? -cols[v].gain / cost_scale : 0.0; };
  auto const entry = [&](std::size_t j, std::size_t v) {  // row j of variable v (v >= n: slacks)
    if (v >= n) return v - n == j ? 1.0 : 0.0;
    return static_cast<double>(peaks[j][cols[v].chunk]) * cols[v].bytes / scale[j];
  };

  // The basis: a variable per row (slacks first), its inverse, and the basic values. Nonbasic
  // variables sit at 0, or at 1 for a step marked `full`.
  std::vector<std::size_t> basis(rows);
  std::vector<char> basic(n + rows, 0);
  std::vector<char> full(n, 0);
  std::vector<double> inverse(rows * rows, 0);
  std::vector<double> value(rows);
  for (std::size_t j = 0; j < rows; ++j) {
    basis[j] = n + j;
    basic[n + j] = 1;
    inverse[j * rows + j] = 1;
    value[j] = static_cast<double>(room[j]) / scale[j];
  }
  std::vector<double> dual(rows);
  std::vector<double> per_chunk(chunks);
  std::vector<double> alpha(rows);
  auto const set_duals = [&] {  // dual = c_B B^-1
    for (std::size_t j = 0; j < rows; ++j) {
      dual[j] = 0;
      for (std::size_t r = 0; r < rows; ++r) dual[j] += cost(basis[r]) * inverse[r * rows + j];
    }
  };
  double constexpr eps = 1e-12;
  moment_lp lp;
  int const cap = static_cast<int>(50 * (n + rows));
  for (; lp.iterations < cap; ++lp.iterations) {
    set_duals();
    for (std::size_t c = 0; c < chunks; ++c) {
      per_chunk[c] = 0;
      for (std::size_t j = 0; j < rows; ++j)
        per_chunk[c] += dual[j] * static_cast<double>(peaks[j][c]) / scale[j];
    }
    // The entering variable: the largest reduced cost against its direction.
    std::size_t in = n + rows;
    double most = eps;
    for (std::size_t v = 0; v < n + rows; ++v) {
      if (basic[v]) continue;
      double const reduced =
          v < n ? cost(v) - per_chunk[cols[v].chunk] * cols[v].bytes : -dual[v - n];
      double const gain = v < n && full[v] ? reduced : -reduced;
      if (gain > most) {
        most = gain;
        in = v;
      }
    }
    if (in == n + rows) break;  // optimal
    double const dir = in < n && full[in] ? -1.0 : 1.0;
    for (std::size_t r = 0; r < rows; ++r) {
      alpha[r] = 0;
      for (std::size_t j = 0; j < rows; ++j) alpha[r] += inverse[r * rows + j] * entry(j, in);
    }
    // Ratio test: the entering variable moves by dir t, basic r by -dir t alpha_r.
    double step = in < n ? 1.0 : std::numeric_limits<double>::infinity();
    std::size_t out = rows;  // rows: the entering step goes to its other bound
    bool out_full = false;
    for (std::size_t r = 0; r < rows; ++r) {
      double const a = dir * alpha[r];
      if (a > eps && value[r] / a < step) {
        step = std::max(0.0, value[r] / a);
        out = r;
        out_full = false;
      } else if (a < -eps && basis[r] < n && (1 - value[r]) / -a < step) {
        step = std::max(0.0, (1 - value[r]) / -a);
        out = r;
        out_full = true;
      }
    }
    if (!(step < std::numeric_limits<double>::infinity())) break;  // cannot happen: bounded
    for (std::size_t r = 0; r < rows; ++r) value[r] -= dir * step * alpha[r];
    if (out == rows) {
      full[in] = !full[in];
      continue;
    }
    std::size_t const left = basis[out];
    basic[left] = 0;
    if (left < n) full[left] = out_full;
    basic[in] = 1;
    basis[out] = in;
    value[out] = (in < n && full[in] ? 1.0 : 0.0) + dir * step;
    double const pivot = alpha[out];
    for (std::size_t j = 0; j < rows; ++j) inverse[out * rows + j] /= pivot;
    for (std::size_t r = 0; r < rows; ++r) {
      if (r == out || alpha[r] == 0) continue;
      for (std::size_t j = 0; j < rows; ++j)
        inverse[r * rows + j] -= alpha[r] * inverse[out * rows + j];
    }
  }
  set_duals();
  lp.mu.resize(rows);
  for (std::size_t j = 0; j < rows; ++j) lp.mu[j] = std::max(0.0, -dual[j]) * cost_scale / scale[j];
  lp.bound = moment_lagrangian(hulls, chunk_of, weight, peaks, room, lp.mu);
  lp.taken.resize(hulls.size());
  for (std::size_t i = 0; i < hulls.size(); ++i) {
    lp.taken[i].assign(hulls[i].size() - 1, 0.0);
    lp.primal += hulls[i][0].error;
  }
  std::vector<double> x(n);
  for (std::size_t v = 0; v < n; ++v) x[v] = full[v] ? 1.0 : 0.0;
  for (std::size_t r = 0; r < rows; ++r)
    if (basis[r] < n) x[basis[r]] = value[r];
  for (std::size_t v = 0; v < n; ++v) {
    lp.taken[cols[v].item][cols[v].step] = x[v];
    lp.primal -= cols[v].gain * x[v];
  }
  return lp;
}

}  // namespace detail

namespace detail {

/// The memory make_plan holds fixed on each pipeline device before it plans: the states, and the
/// transient memory reserved as if every kind with a quantized candidate were stored quantized
/// (the dequantized buffers any plan may need), but in the recomputed layers, kept in bf16 (their
/// largest checkpoint's tensors are stage_memory::recompute). Its activations are those of that
/// storage, which make_plan replaces. Throws as estimate_memory.
inline std::vector<stage_memory> reserved_memory(planner_input const& in) {
  return estimate_memory(
      in.model, in.parallel, in.step, in.states, [&](std::int64_t l, tensor_kind k) -> storage {
        if (is_recomputed(in.model, in.parallel, in.step, l)) return storage::precise();
        auto const& c = in.policy.candidates(k);
        auto const q =
            std::find_if(c.begin(), c.end(), [](storage const& x) { return !x.is_precise(); });
        return q == c.end() ? storage::precise() : *q;
      });
}

/// smallest_memory with its states and transient memory `reserved` (reserved_memory(in)) given.
inline std::vector<stage_memory> smallest_memory(planner_input const& in,
                                                 std::vector<stage_memory> reserved) {
  shard_shape const sh = shard_of(in.parallel, in.step);
  std::array<storage, tensor_kind_count> smallest{};  // each kind's smallest candidate
  for (tensor_kind const k : in.model.saved_tensors()) {
    auto const& c = in.policy.candidates(k);
    saved_shape const s = shape_of(k, in.model, sh);
    smallest[static_cast<std::size_t>(index_of(k))] = *std::min_element(
        c.begin(), c.end(),
        [&](storage const& a, storage const& b) { return a.bytes(s) < b.bytes(s); });
  }
  auto const least = estimate_memory(in.model, in.parallel, in.step, in.states,
                                     [&](std::int64_t l, tensor_kind k) -> storage {
                                       if (is_recomputed(in.model, in.parallel, in.step, l))
                                         return storage::precise();
                                       return smallest[static_cast<std::size_t>(index_of(k))];
                                     });
  for (std::size_t r = 0; r < reserved.size(); ++r) {
    reserved[r].activations = least[r].activations;
    reserved[r].head_activations = least[r].head_activations;
    reserved[r].in_flight = least[r].in_flight;
  }
  return reserved;
}

}  // namespace detail

/// The memory of every pipeline device with every planned tensor at its smallest candidate: the
/// least any plan needs, as make_plan counts it (the states and its reserved transient memory,
/// detail::reserved_memory; the recomputed layers in bf16). make_plan(in) throws for its budget
/// exactly when a device's total here exceeds it (find_shortfall). Throws agoq::invalid_argument as
/// estimate_memory.
inline std::vector<stage_memory> smallest_memory(planner_input const& in) {
  return detail::smallest_memory(in, detail::reserved_memory(in));
}

/// Where a budget falls short of the least any plan needs (smallest_memory): the device short by
/// the most, the budget and what that device needs.
struct budget_shortfall {
  std::int64_t stage = 0;         ///< the pipeline device short by the most (the first of them)
  std::int64_t budget_bytes = 0;  ///< the budget per device
  stage_memory need;              ///< that device's memory with every planned tensor at its
                                  ///< smallest candidate (smallest_memory)

  /// By how many bytes the budget falls short.
  std::int64_t bytes() const noexcept { return need.total() - budget_bytes; }

  /// The shortfall in words, in bytes: "the budget of B bytes falls short by S bytes on pipeline
  /// stage N (it needs T bytes: ... of weights, gradients and optimizer states, ... of transient
  /// working memory and ... of activations with every saved tensor at its smallest candidate)".
  std::string message() const {
    return "the budget of " + std::to_string(budget_bytes) + " bytes falls short by " +
           std::to_string(bytes()) + " bytes on pipeline stage " + std::to_string(stage) +
           " (it needs " + std::to_string(need.total()) +
           " bytes: " + std::to_string(need.states()) +
           " of weights, gradients and optimizer states, " + std::to_string(need.transient()) +
           " of transient working memory and " +
           std::to_string(need.activations + need.head_activations) +
           " of activations with every saved tensor at its smallest candidate)";
  }
};

namespace detail {

/// The shortfall of `budget` against the least each device needs, `least` (smallest_memory).
inline std::optional<budget_shortfall> shortfall_of(std::vector<stage_memory> const& least,
                                                    std::int64_t budget) {
  std::size_t worst = 0;
  for (std::size_t r = 1; r < least.size(); ++r)
    if (least[r].total() > least[worst].total()) worst = r;
  if (least[worst].total() <= budget) return std::nullopt;
  return budget_shortfall{static_cast<std::int64_t>(worst), budget, least[worst]};
}

}  // namespace detail

/// Where in.budget_bytes cannot hold some device even with every planned tensor at its smallest
/// candidate (smallest_memory), the device short by the most; none where every device fits,
/// which is exactly where make_plan finds a plan. Throws agoq::invalid_argument for a budget
/// outside (0, 2^62] or as estimate_memory.
inline std::optional<budget_shortfall> find_shortfall(planner_input const& in) {
  AGOQ_EXPECTS(in.budget_bytes > 0 && in.budget_bytes <= max_size_count,
               "find_shortfall: the budget must be positive and at most 2^62 bytes, got " +
                   std::to_string(in.budget_bytes));
  return detail::shortfall_of(smallest_memory(in), in.budget_bytes);
}

/// Plans every saved tensor (see the file comment). Per pipeline device the problem is a
/// multiple-choice knapsack: each (layer, kind) takes one candidate, its cost the weighted
/// modelled error; the device must fit the budget at each moment in_flight_peaks lists (and so at
/// every peak moment, each on a segment between two listed), where a tensor of local chunk c
/// counts n_c times its stored size. Under 1F1B there is one
/// such moment. The planner takes each item's cheapest hull option, then applies hull upgrades in
/// one fixed order while they fit at every peak moment, stopping at the first that does not. The
/// order is by error removed per byte weighted by w_c, the sum of n_c over those moments (ties
/// by layer, kind, step): the order that solves the relaxation in which the moments share one
/// budget. Besides the states, each device's budget holds its transient working memory
/// (stage_memory::transient), reserved before the plan is made as if every kind with a quantized
/// candidate were stored quantized (its dequantized buffer in the backward counted), the most any
/// plan needs; the plan's stage_memory then reports the working memory of the storage chosen.
/// Consequences (docs/activations.md): the plan is deterministic; a larger budget never lowers
/// any tensor's choice; `error_lower_bound` (that relaxation's optimum; with several peak moments
/// the best of it and of the LP with a row per moment, detail::moment_lp_bound) bounds from below
/// the exact optimum of the budget less the reservation, and under 1F1B the plan is exact whenever
/// it stops on a hull point. Stages holding fewer micro-batches pay less per upgrade, so they get
/// more bits. Under recomputation (step_config::recompute) the recomputed layers are not planned:
/// their tensors are kept precise (planned_tensor::recomputed; error 0), held only in the
/// transient memory of their checkpoint's backward, and their chunks hold the checkpoints'
/// inputs. Under selective recomputation (step_config::selective) the kinds it recomputes are not
/// planned either (planned_tensor::recomputed: held in bf16 in the layer's working set only),
/// and each inherits its sources' quantization error (recompute_sources, factor times their
/// relative errors' sum): a source's options cost its own sensitivity plus theirs (each times
/// its factor), times its relative error, so the plan weighs what a quantized source does to the
/// tensors computed from it.
///
/// Throws agoq::invalid_argument for an invalid configuration, a budget outside (0, 2^62], one
/// too large to count in 64-bit bytes (estimate_memory; a device whose tensors' bytes weighted by
/// their copies over its peak moments could pass 2^62), and when the budget cannot hold
/// some device even with every tensor at its smallest candidate: the message is "planner: " and
/// find_shortfall's budget_shortfall::message() (that device, by how many bytes the budget falls
/// short, and what the device needs: states, transient working memory and activations).
inline activation_plan make_plan(planner_input const& in) {
  model_shape const& m = in.model;
  parallel_config const& p = in.parallel;
  p.validate(m);
  AGOQ_EXPECTS(in.budget_bytes > 0 && in.budget_bytes <= max_size_count,
               "planner: the budget must be positive and at most 2^62 bytes, got " +
                   std::to_string(in.budget_bytes));
  AGOQ_EXPECTS(in.errors.last_layer() < m.layers,
               "planner: the error model holds a per-layer sensitivity or statistics for layer " +
                   std::to_string(in.errors.last_layer()) + ", past the model's " +
                   std::to_string(m.layers) + " layers");
  shard_shape const sh = shard_of(p, in.step);
  // Memory that does not depend on the plan, per device: the states and the transient memory.
  auto const fixed = detail::reserved_memory(in);
  if (auto const s = detail::shortfall_of(detail::smallest_memory(in, fixed), in.budget_bytes))
    agoq::detail::throw_invalid(__FILE__, __LINE__, "planner: " + s->message());
  // Recomputed layers are not planned: kept precise, they cost transient memory only, and their
  // checkpoints' inputs are fixed.
  auto const recomputed = [&](std::int64_t l) { return is_recomputed(m, p, in.step, l); };
  std::int64_t const head = head_activation_bytes(m, sh);
  bool const staged = stages_gradients(p, in.states.gradients);
  std::vector<char> quantized(static_cast<std::size_t>(m.layers * tensor_kind_count), 0);

  std::vector<tensor_kind> owned;
  for (tensor_kind const k : m.saved_tensors())
    if (!is_alias(k)) owned.push_back(k);
  std::vector<saved_shape> shapes;
  std::array<saved_shape, tensor_kind_count> shape_by_kind{};
  for (tensor_kind const k : owned) {
    shapes.push_back(shape_of(k, m, sh));
    shape_by_kind[static_cast<std::size_t>(index_of(k))] = shapes.back();
  }

  // Selective recomputation: the recomputed kinds are not planned; each source's options carry
  // the sensitivities of the kinds recomputed from it (`heirs`), which inherit its error.
  recompute_modules const& selective = in.step.selective;
  std::vector<std::vector<std::pair<tensor_kind, double>>> heirs(owned.size());  // kind, factor
  for (std::size_t ki = 0; ki < owned.size(); ++ki)
    for (tensor_kind const j : owned) {
      recompute_sources const from = sources_of(j, m.style, selective);
      for (tensor_kind const src : from)
        if (src == owned[ki]) heirs[ki].push_back({j, from.factor});
    }

  std::vector<stage_plan> stages;
  for (std::int64_t r = 0; r < p.pp; ++r) {
    stage_plan sp;
    sp.memory = fixed[static_cast<std::size_t>(r)];
    std::int64_t const held = sp.memory.states() + sp.memory.transient();
    std::int64_t const head_bytes = r == p.pp - 1 ? head : 0;
    auto const peaks = in_flight_peaks(schedule_of(p, in.step), r);
    // w_c: the copies of chunk c summed over the peak moments (n_c under 1F1B).
    std::vector<std::int64_t> weight(static_cast<std::size_t>(p.virtual_stages), 0);
    for (auto const& n : peaks)
      for (std::size_t c = 0; c < weight.size(); ++c) weight[c] += n[c];
    // Every weighted byte count below (a candidate's bytes times w_c), and their sum over the
    // stage's upgrades, is at most the chunks' largest candidates weighted.
    long double most = 0;
    for (std::size_t ki = 0; ki < owned.size(); ++ki) {
      std::int64_t largest = 0;
      for (storage const& c : in.policy.candidates(owned[ki]))
        largest = std::max(largest, c.bytes(shapes[ki]));
      for (std::size_t c = 0; c < weight.size(); ++c)
        most += static_cast<long double>(largest) *
                static_cast<long double>(p.chunk_layers(m, r, static_cast<std::int64_t>(c))) *
                static_cast<long double>(weight[c]);
    }
    AGOQ_EXPECTS(most <= static_cast<long double>(max_size_count),
                 "planner: pipeline stage " + std::to_string(r) + " has " +
                     std::to_string(peaks.size()) +
                     " peak moments; its tensors' bytes weighted by their copies over them could "
                     "reach " +
                     detail::approx(most) + ", more than 2^62");

    std::vector<planned_tensor> items;
    std::vector<std::size_t> chunk_of;
    std::vector<std::vector<detail::plan_option>> hulls;
    std::vector<std::int64_t> checkpoint_bytes;  // of each chunk
    for (std::int64_t c = 0; c < p.virtual_stages; ++c)
      checkpoint_bytes.push_back(checkpoint_input_bytes(m, p, in.step, r, c));
    std::vector<std::int64_t> chunk_bytes = checkpoint_bytes;
    for (std::size_t c = 0; c < weight.size(); ++c) {
      auto const chunk = static_cast<std::int64_t>(c);
      std::int64_t const first = first_layer_of(m, p, r, chunk);
      for (std::int64_t l = first; l < first + p.chunk_layers(m, r, chunk); ++l) {
        for (std::size_t ki = 0; ki < owned.size(); ++ki) {
          tensor_kind const k = owned[ki];
          if (recomputed(l) || recomputes(selective, k)) {  // one option: nothing held
            hulls.push_back({{0, 0.0, 0}});
            items.push_back(
                {l, k, storage::precise(), storage::precise().bytes(shapes[ki]), 0, 0.0, true});
            chunk_of.push_back(c);
            continue;
          }
          auto const& cands = in.policy.candidates(k);
          std::vector<detail::plan_option> opts;
          double inherited = 0;  // the sensitivities of the kinds recomputed from it, weighted
          for (auto const& [j, factor] : heirs[ki])
            inherited += factor * in.errors.sensitivity(l, j);
          for (std::size_t i = 0; i < cands.size(); ++i) {
            double const rel = in.errors.relative(l, k, shapes[ki], cands[i]);
            opts.push_back({cands[i].bytes(shapes[ki]) * weight[c],
                            in.errors.sensitivity(l, k) * rel + inherited * rel, i});
          }
          hulls.push_back(detail::lower_hull(std::move(opts)));
          detail::plan_option const& start = hulls.back().front();
          items.push_back({l, k, cands[start.candidate], start.bytes / weight[c], 0, start.error});
          chunk_of.push_back(c);
          chunk_bytes[c] += items.back().bytes;
        }
      }
    }
    auto const start = detail::bytes_at_peaks(peaks, chunk_bytes, head_bytes);
    std::vector<std::int64_t> room;  // left at each peak moment (none short: find_shortfall)
    for (std::int64_t const x : start) room.push_back(in.budget_bytes - held - x);
    std::vector<std::int64_t> const start_room = room;

    std::vector<detail::plan_upgrade> ups;
    for (std::size_t i = 0; i < hulls.size(); ++i)
      for (std::size_t j = 0; j + 1 < hulls[i].size(); ++j) {
        std::int64_t const db = hulls[i][j + 1].bytes - hulls[i][j].bytes;
        double const de = hulls[i][j].error - hulls[i][j + 1].error;
        ups.push_back({de / static_cast<double>(db), db, de, i, j});
      }
    std::sort(ups.begin(), ups.end(),
              [](detail::plan_upgrade const& a, detail::plan_upgrade const& b) {
                if (a.gain != b.gain) return a.gain > b.gain;
                if (a.item != b.item) return a.item < b.item;
                return a.step < b.step;
              });
    // The plan applies upgrades while they fit at every peak moment. The relaxation (the sum of
    // the moments' constraints: upgrade bytes are w_c per copy, room the sum of the rooms) goes
    // on from there, the first upgrade that does not fit taken fractionally; what it removes
    // beyond the plan is the gap to the lower bound.
    std::vector<std::size_t> at(hulls.size(), 0);
    std::int64_t relaxed_room = 0;
    // Summed over the moments the rooms may pass 2^62; every upgrade fits in 2^62 (above).
    for (std::int64_t const x : room) relaxed_room = std::min(relaxed_room + x, max_size_count);
    bool fits = true;
    double relaxed_gain = 0;
    for (detail::plan_upgrade const& u : ups) {
      if (u.bytes > relaxed_room) {
        relaxed_gain += u.error * static_cast<double>(relaxed_room) / static_cast<double>(u.bytes);
        break;
      }
      relaxed_room -= u.bytes;
      std::size_t const c = chunk_of[u.item];
      std::int64_t const copy = u.bytes / weight[c];
      for (std::size_t j = 0; fits && j < peaks.size(); ++j) fits = peaks[j][c] * copy <= room[j];
      if (!fits) {
        relaxed_gain += u.error;
        continue;
      }
      for (std::size_t j = 0; j < peaks.size(); ++j) room[j] -= peaks[j][c] * copy;
      at[u.item] = u.step + 1;
    }

    chunk_bytes = checkpoint_bytes;
    // The relative error of each kept kind of the layer at hand, as planned: a layer's sources
    // come before the kinds recomputed from them (block order).
    std::array<double, tensor_kind_count> relative{};
    for (std::size_t i = 0; i < items.size(); ++i) {
      planned_tensor& t = items[i];
      if (t.recomputed) {
        if (recomputed(t.layer)) continue;  // full recomputation: error 0
        recompute_sources const from = sources_of(t.kind, m.style, selective);
        double inherited = 0;
        for (tensor_kind const src : from)
          inherited += relative[static_cast<std::size_t>(index_of(src))];
        t.error = in.errors.sensitivity(t.layer, t.kind) * (from.factor * inherited);
        sp.error += t.error;
        continue;
      }
      detail::plan_option const& o = hulls[i][at[i]];
      t.choice = in.policy.candidates(t.kind)[o.candidate];
      t.bytes = o.bytes / weight[chunk_of[i]];
      double const rel = in.errors.relative(
          t.layer, t.kind, shape_by_kind[static_cast<std::size_t>(index_of(t.kind))], t.choice);
      relative[static_cast<std::size_t>(index_of(t.kind))] = rel;
      t.error = in.errors.sensitivity(t.layer, t.kind) * rel;
      chunk_bytes[chunk_of[i]] += t.bytes;
      sp.error += t.error;
    }
    detail::set_activation_peak(sp.memory, peaks, chunk_bytes, head_bytes);
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!items[i].recomputed) items[i].in_flight = sp.memory.in_flight[chunk_of[i]];
      quantized[static_cast<std::size_t>(items[i].layer * tensor_kind_count +
                                         index_of(items[i].kind))] = !items[i].choice.is_precise();
    }
    sp.memory.working = detail::device_working_bytes(
        m, p, sh, r, staged, selective, [&](std::int64_t l, tensor_kind k) {
          return quantized[static_cast<std::size_t>(l * tensor_kind_count + index_of(k))] != 0;
        });
    sp.error_lower_bound = std::max(0.0, sp.error - relaxed_gain);
    // Several peak moments (interleaving): the moments' rooms do not pool, so the LP with a row
    // per moment (detail::moment_lp_bound) tightens the summed relaxation's bound.
    if (peaks.size() > 1)
      sp.error_lower_bound = std::min(
          sp.error,
          std::max(sp.error_lower_bound,
                   detail::moment_lp_bound(hulls, chunk_of, weight, peaks, start_room).bound));
    sp.unused_bytes = in.budget_bytes - sp.memory.total();
    sp.tensors = std::move(items);
    stages.push_back(std::move(sp));
  }
  return activation_plan(std::move(stages), in.budget_bytes, m.layers);
}

/// The fewest layers of each model chunk that block recomputation must recompute
/// (step_config::recompute = recompute_method::block, recompute_layers = N) for make_plan to fit
/// in.budget_bytes on every device: 0 when it fits without recomputation, none when it does not
/// fit even with every layer recomputed (N up to max_chunk_layers; a chunk of fewer layers
/// recomputes all of its own). in.step's own recomputation (full or selective) is ignored. Every N
/// from 0 is tried (smallest_memory): from 0 to 1 the transient memory grows by a
/// layer in bf16, so the fit need not be monotone there. Throws agoq::invalid_argument for a budget
/// outside (0, 2^62] or as estimate_memory.
inline std::optional<std::int64_t> least_block_recompute(planner_input in) {
  in.parallel.validate(in.model);
  AGOQ_EXPECTS(in.budget_bytes > 0 && in.budget_bytes <= max_size_count,
               "least_block_recompute: the budget must be positive and at most 2^62 bytes, got " +
                   std::to_string(in.budget_bytes));
  std::int64_t const lc = in.parallel.max_chunk_layers(in.model);
  in.step.selective = {};
  for (std::int64_t n = 0; n <= lc; ++n) {
    in.step.recompute = n == 0 ? recompute_method::none : recompute_method::block;
    in.step.recompute_layers = n;
    if (peak_total(smallest_memory(in)) <= in.budget_bytes) return n;
  }
  return std::nullopt;
}

/// The matrix products of one layer's forward on one GPU for one micro-batch, in FLOPs (two per
/// multiply-add), split by what selective recomputation runs again. T = micro_batch x seq / cp
/// tokens, q = heads x head_size(), k = kv_heads x head_size(), h = hidden, f = mlp_width(); tensor
/// parallelism divides each by tp (sequence parallelism changes no product).
/// - projections: Q, K and V, 2 T h (q + 2k), and the output projection, 2 T q h;
/// - core_attention: Q K^T and P V under the causal mask, 2 q b s (s + 1) / cp (each of the two
///   2 d b s (s + 1) / 2 a head; a context-parallel rank holds 1 / cp of the causal pairs);
/// - mlp: LLaMA's gate, up and down projections, 6 T h f (a mixture-of-experts MLP's shared
///   experts'); GPT's fc1 and fc2, 4 T h f; a mixture-of-experts MLP's router, 2 T h e (and the
///   shared experts' gate, 2 T h), and its experts' products over the R pairs of a
///   rank (shard_shape::expert_rows), 6 R h f_e / etp, which is 6 T h k f_e / tp when routing is
///   balanced (e = experts, k = experts_per_token, f_e = expert_ffn; the products of a capacity
///   factor's padding counted).
/// The norms, activation functions and softmax are elementwise and not counted, as in the
/// FLOPs accounting of Megatron (Narayanan et al., SC'21), which these follow.
struct layer_flops {
  double projections = 0;
  double core_attention = 0;
  double mlp = 0;
  /// Of mlp, a mixture-of-experts MLP's shared experts' (and their gate's) products, 6 T h f / tp
  /// (+ 2 T h / tp); 0 for a dense model.
  double shared_experts = 0;

  /// The three together (projections, core_attention and mlp).
  double forward() const noexcept { return projections + core_attention + mlp; }
};

/// layer_flops of a layer of `m` under `p` and `st`. Throws agoq::invalid_argument as
/// parallel_config::validate.
inline layer_flops layer_forward_flops(model_shape const& m, parallel_config const& p,
                                       step_config const& st) {
  p.validate(m);
  AGOQ_EXPECTS(st.micro_batch >= 1 && st.seq >= 1,
               "layer_forward_flops: micro_batch and seq must be positive");
  auto const [h, q, k, f] = m.width_bounds();
  long double const b = static_cast<long double>(st.micro_batch);
  long double const s = static_cast<long double>(st.seq);
  long double const t = b * s / static_cast<long double>(p.cp);
  long double const tp = static_cast<long double>(p.tp);
  long double const mlp_products = llama_like(m.style) ? 3 : 2;
  // The router's products, and the experts' over this rank's pairs at their width on it; the
  // shared experts' gate's.
  long double const router = 2 * t * h * static_cast<long double>(m.experts);
  long double const gate = m.shared_expert_gate ? 2 * t * h : 0;
  long double experts = 0;
  if (m.moe()) {
    shard_shape const sh = shard_of(p, st);
    sh.validate(m);
    experts = 6 * static_cast<long double>(sh.expert_rows(m)) * h *
              static_cast<long double>(m.expert_ffn / sh.expert_tp());
  }
  layer_flops out;
  out.projections = static_cast<double>(2 * t * h * (q + 2 * k) / tp + 2 * t * q * h / tp);
  out.core_attention = static_cast<double>(2 * q * b * s * (s + 1) / (p.cp * tp));
  out.mlp = static_cast<double>((2 * mlp_products * t * h * f + router + gate) / tp + experts);
  if (m.moe()) out.shared_experts = static_cast<double>((2 * mlp_products * t * h * f + gate) / tp);
  return out;
}

/// The FLOPs of matrix products that the modules `r` run again in one layer's backward (as
/// layer_flops counts them): core_attention for core_attn, mlp for mlp and moe (a
/// mixture-of-experts MLP's, all of it), shared_experts for shared_experts. layernorm's norm and
/// moe_act's SwiGLU are elementwise and count none: the norm costs a read of its input, T x h bf16
/// elements a norm.
inline double recompute_flops(layer_flops const& fl, recompute_modules const& r) noexcept {
  return (r.core_attn ? fl.core_attention : 0) +
         (r.mlp || r.moe ? fl.mlp : (r.shared_experts ? fl.shared_experts : 0));
}

/// The share the recomputation of step `st` adds to a training step's matrix products: R / (3 (L
/// F + H)), with F the forward of a layer (layer_forward_flops), H the output head's 2 T h vocab /
/// tp, and 3 the forward plus a backward of twice its products; R what the recomputation runs
/// again: for full recomputation (st.recompute) n F, n the layers it recomputes (recomputed_layers
/// of each model chunk, summed over the pp x v chunks: the whole forward of each again), for
/// selective recomputation (st.selective) L recompute_flops(F, st.selective). The same for every
/// micro-batch, so for the whole step. Throws as layer_forward_flops and check_recompute.
inline double recompute_overhead(model_shape const& m, parallel_config const& p,
                                 step_config const& st) {
  layer_flops const fl = layer_forward_flops(m, p, st);
  double const layers = static_cast<double>(m.layers);
  std::int64_t chunks_layers = 0;  // recomputed_layers over every model chunk
  for (std::int64_t r = 0; r < p.pp; ++r)
    for (std::int64_t c = 0; c < p.virtual_stages; ++c)
      chunks_layers += recomputed_layers(st, p.chunk_layers(m, r, c));
  double const full = static_cast<double>(chunks_layers);
  double const head = 2.0 * static_cast<double>(st.micro_batch) * static_cast<double>(st.seq) /
                      static_cast<double>(p.cp) * static_cast<double>(m.hidden) *
                      static_cast<double>(m.vocab) / static_cast<double>(p.tp);
  double const again = full * fl.forward() + layers * recompute_flops(fl, st.selective);
  return again / (3.0 * (layers * fl.forward() + head));
}

/// One choice of recomputation planned (recompute_options, selective_options): Megatron's full
/// recomputation (`method` with `layers`, step_config::recompute and recompute_layers) or its
/// selective recomputation (`modules`), never both, or none.
struct recompute_option {
  recompute_method method = recompute_method::none;  ///< full recomputation's method
  std::int64_t layers = 0;                           ///< its recompute_layers (0 without)
  recompute_modules modules;    ///< the modules recomputed in every layer (none with `method`)
  double overhead = 0;          ///< recompute_overhead: the step's matrix products it adds
  bool fits = false;            ///< make_plan fits the budget with it
  double error = 0;             ///< the plan's total_error() where it fits (else 0)
  std::int64_t peak_bytes = 0;  ///< the plan's largest device total where it fits, else the
                                ///< least any plan needs (peak_total(smallest_memory))

  /// `st` with this recomputation in place of its own.
  step_config applied_to(step_config st) const noexcept {
    st.recompute = method;
    st.recompute_layers = layers;
    st.selective = modules;
    return st;
  }
};

/// The name of an option's recomputation: "none", the modules (name_of(recompute_modules), e.g.
/// "core_attn,mlp"), or the method and its layers ("block 2", "uniform 4").
inline std::string name_of(recompute_option const& o) {
  if (o.method != recompute_method::none) return name_of(o.method) + " " + std::to_string(o.layers);
  return o.modules.any() ? name_of(o.modules) : "none";
}

namespace detail {

/// Every option of `choices` (their recomputation; the rest is filled in) planned for `in` as
/// make_plan plans it, ordered by overhead, ties in the order of `choices`.
inline std::vector<recompute_option> plan_options(planner_input in,
                                                  std::vector<recompute_option> choices,
                                                  char const* what) {
  in.parallel.validate(in.model);
  AGOQ_EXPECTS(in.budget_bytes > 0 && in.budget_bytes <= max_size_count,
               std::string(what) + ": the budget must be positive and at most 2^62 bytes, got " +
                   std::to_string(in.budget_bytes));
  for (recompute_option& o : choices) {
    in.step = o.applied_to(in.step);
    o.overhead = recompute_overhead(in.model, in.parallel, in.step);
    o.peak_bytes = peak_total(smallest_memory(in));
    o.fits = o.peak_bytes <= in.budget_bytes;
    if (!o.fits) continue;
    activation_plan const plan = make_plan(in);
    o.error = plan.total_error();
    o.peak_bytes = 0;
    for (stage_plan const& s : plan.stages())
      o.peak_bytes = std::max(o.peak_bytes, s.memory.total());
  }
  std::stable_sort(
      choices.begin(), choices.end(),
      [](recompute_option const& a, recompute_option const& b) { return a.overhead < b.overhead; });
  return choices;
}

/// The sets of Megatron's recompute modules that model `m` has, as options, in the order the bits
/// of the set count them (core_attn 1, layernorm 2, mlp 4, moe_act 8, moe 16, shared_experts 32;
/// none first): a dense model's 8 of core_attn, layernorm and mlp; a mixture-of-experts model's of
/// core_attn, layernorm, moe_act, moe and, with shared experts, shared_experts, but those where
/// moe, which recomputes the whole MLP, comes with moe_act or shared_experts (12 sets; with shared
/// experts 20).
inline std::vector<recompute_option> module_sets(model_shape const& m) {
  std::vector<recompute_option> out;
  for (unsigned set = 0; set < 64; ++set) {
    recompute_modules const r{(set & 1) != 0, (set & 2) != 0,  (set & 4) != 0,
                              (set & 8) != 0, (set & 16) != 0, (set & 32) != 0};
    bool const has = m.moe() ? !r.mlp && (!r.shared_experts || m.shared_expert_ffn > 0) &&
                                   !(r.moe && (r.moe_act || r.shared_experts))
                             : !r.moe_act && !r.moe && !r.shared_experts;
    if (has) out.push_back({.modules = r});
  }
  return out;
}

}  // namespace detail

/// Every choice of Megatron's recompute modules the model has (detail::module_sets: the 8 sets of
/// core_attn, layernorm and mlp of a dense model; a mixture-of-experts model's 12 or 20 of
/// core_attn, layernorm, moe_act, moe, shared_experts), each planned for `in` as make_plan plans
/// it (in.step's own full or selective recomputation replaced by it): the trade between the
/// compute each adds and the quantization error the planner is left with. Ordered by overhead,
/// then as the bits of the set count (core_attn 1, layernorm 2, mlp 4, moe_act 8, moe 16,
/// shared_experts 32; none first). Throws agoq::invalid_argument for a budget outside (0, 2^62]
/// or as estimate_memory.
inline std::vector<recompute_option> selective_options(planner_input const& in) {
  return detail::plan_options(in, detail::module_sets(in.model), "selective_options");
}

/// selective_options' sets and every full recomputation of Megatron's, each planned for `in` as
/// make_plan plans it, n the most layers of a model chunk (max_chunk_layers; a chunk of fewer
/// recomputes all of its own where N passes them): block N for N = 1 .. n - 1 (the first N layers
/// of each model chunk, the rest planned; their share of the step's products grows with N) and
/// uniform N for N = 1 .. n (every layer, in checkpoints of N: the same products for every N, fewer
/// checkpoints kept but more layers' tensors alive at once in the backward as N grows; block n is
/// uniform 1). Ordered by overhead; on a tie the sets first (as selective_options orders them),
/// then block, then uniform, each by N. s - 1 + 2n plans (s the sets: 8 for a dense model).
/// Throws as selective_options.
inline std::vector<recompute_option> recompute_options(planner_input const& in) {
  in.parallel.validate(in.model);
  std::int64_t const lc = in.parallel.max_chunk_layers(in.model);
  std::vector<recompute_option> choices = detail::module_sets(in.model);
  for (recompute_method const method : {recompute_method::block, recompute_method::uniform})
    for (std::int64_t n = 1; n <= lc; ++n)
      if (method == recompute_method::uniform || n < lc) {
        recompute_option o;
        o.method = method;
        o.layers = n;
        choices.push_back(o);
      }
  return detail::plan_options(in, std::move(choices), "recompute_options");
}

/// Of `options` (recompute_options' or selective_options' answer), the one that fits with the
/// least modelled error among those adding at most `max_overhead` to the step's matrix products
/// (0.1: 10%), the first in their order on a tie (the least overhead); none when none fits within
/// it. Throws agoq::invalid_argument for a negative or NaN `max_overhead`.
inline std::optional<recompute_option> least_error_recompute(
    std::vector<recompute_option> const& options, double max_overhead) {
  AGOQ_EXPECTS(max_overhead >= 0,
               "least_error_recompute: max_overhead must be a non-negative share, got " +
                   std::to_string(max_overhead));
  std::optional<recompute_option> best;
  for (recompute_option const& o : options)
    if (o.fits && o.overhead <= max_overhead && (!best || o.error < best->error)) best = o;
  return best;
}

/// least_error_recompute of recompute_options(in): full or selective. Throws as either.
inline std::optional<recompute_option> least_error_recompute(planner_input const& in,
                                                             double max_overhead) {
  return least_error_recompute(recompute_options(in), max_overhead);
}

}  // namespace agoq::activation
