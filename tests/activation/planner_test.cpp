#include <agoq/activation/planner.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

using namespace agoq::activation;

namespace {

/// 4 layers on 2 stages (2 in flight on stage 0, 1 on stage 1).
planner_input small_input() {
  planner_input in;
  in.model = {block_style::llama, 4, 256, 512, 4, 2, 0, 1000, false};
  in.parallel.pp = 2;
  in.step = {1, 128, 0};
  in.policy = policy_table::all_precise();
  return in;
}

/// Memory of every stage with every tensor at its smallest candidate (but those of recomputed
/// layers, which the planner keeps precise).
std::vector<std::int64_t> minimum(planner_input const& in) {
  auto const s = estimate_memory(
      in.model, in.parallel, in.step, in.states, [&](std::int64_t l, tensor_kind k) -> storage {
        if (is_recomputed(in.model, in.parallel, in.step, l)) return storage::precise();
        auto const& c = in.policy.candidates(k);
        auto const sh = shape_of(k, in.model, shard_of(in.parallel, in.step));
        return *std::min_element(c.begin(), c.end(), [&](storage const& a, storage const& b) {
          return a.bytes(sh) < b.bytes(sh);
        });
      });
  std::vector<std::int64_t> out;
  for (auto const& x : s) out.push_back(x.total());
  return out;
}

/// Checks that every stage of `plan` (made for `in`) has the memory estimate_memory gives the
/// storage it chose.
void check_plan_is_the_model(planner_input const& in, activation_plan const& plan) {
  auto const check =
      estimate_memory(in.model, in.parallel, in.step, in.states,
                      [&](std::int64_t l, tensor_kind k) { return plan.storage_of(l, k); });
  REQUIRE(check.size() == plan.stages().size());
  for (std::size_t s = 0; s < check.size(); ++s) {
    CAPTURE(s);
    stage_memory const& m = plan.stages()[s].memory;
    CHECK(m.total() == check[s].total());
    CHECK(m.activations == check[s].activations);
    CHECK(m.working == check[s].working);
    CHECK(m.recompute == check[s].recompute);
    CHECK(m.transient() == check[s].transient());
    CHECK(m.in_flight == check[s].in_flight);
  }
}

int bits_of(activation_plan const& p, std::int64_t layer, tensor_kind k) {
  return p.storage_of(layer, k).bits();
}

/// The brute-force cases' three options, int4 g128, int8 g128 and bf16, of the two kinds they
/// plan.
std::vector<storage> const three = {storage::with(int4_g128), storage::with(int8_g128),
                                    storage::precise()};
tensor_kind const kinds[2] = {tensor_kind::mlp_input, tensor_kind::swiglu_output};

/// The least error over the 81 plans of 1F1B stage s of small_input() (2 - s micro-batches in
/// flight, layers 2s and 2s + 1) that give each of the two kinds `planned` one of `three` and fit
/// in.budget_bytes, `need` being the stage's memory with both at int4; error(l, k, shape, o) is
/// layer l's kind k's error at option o.
template <class Error>
double brute_force(planner_input const& in, std::int64_t s, std::int64_t need,
                   tensor_kind const (&planned)[2], Error&& error) {
  shard_shape const sh = shard_of(in.parallel, in.step);
  std::int64_t const n = 2 - s;
  double best = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 81; ++code) {
    std::int64_t bytes = 0;
    double err = 0;
    int c = code;
    for (std::int64_t l = 2 * s; l < 2 * s + 2; ++l)
      for (tensor_kind k : planned) {
        storage const& o = three[static_cast<std::size_t>(c % 3)];
        c /= 3;
        saved_shape const shape = shape_of(k, in.model, sh);
        bytes += n * (o.bytes(shape) - storage::with(int4_g128).bytes(shape));
        err += error(l, k, shape, o);
      }
    if (need + bytes <= in.budget_bytes) best = std::min(best, err);
  }
  return best;
}

/// p = 2, v = 2, m = 4, one layer per chunk: device 0 holds layers 0 and 2, device 1 layers 1
/// and 3; device 0 peaks at (3,2) and (4,1) chunk micro-batches, device 1 at (2,1) and (3,0).
/// `kinds` take `three`, everything else bf16.
planner_input interleaved_input() {
  planner_input in = small_input();
  in.parallel.virtual_stages = 2;
  in.step.micro_batches = 4;
  for (tensor_kind const k : kinds) in.policy.set(k, storage::with(int4_g128), three);
  in.errors.set_outlier(tensor_kind::swiglu_output, 5.0);
  return in;
}

}  // namespace

TEST_CASE("2 stages, 4 layers, one choice per layer: by hand") {
  planner_input in = small_input();
  in.policy.set(tensor_kind::gate_output, storage::with(int4_g128),
                {storage::with(int4_g128), storage::precise()});
  auto const need = minimum(in);
  saved_shape const gate{128, 512, 2};
  std::int64_t const delta = gate.bytes() - storage::with(int4_g128).bytes(gate);
  CHECK(delta == 128 * 512 * 2 - (128 * 256 + 128 * 4 * 4));
  // Stage s holds 2 - s micro-batches, so one upgrade costs (2 - s) delta there; with budget
  // need_s + j (2 - s) delta stage s raises exactly j layers (the lower ones first).
  for (std::int64_t s = 0; s < 2; ++s) {
    for (std::int64_t j = 0; j <= 2; ++j) {
      std::int64_t const step = (2 - s) * delta;
      for (std::int64_t extra : {std::int64_t{0}, step - 1}) {
        if (j == 2 && extra > 0) continue;
        in.budget_bytes = need[static_cast<std::size_t>(s)] + j * step + extra;
        if (in.budget_bytes < std::max(need[0], need[1])) continue;  // the other stage fails
        auto const plan = make_plan(in);
        auto const& st = plan.stages()[static_cast<std::size_t>(s)];
        std::int64_t raised = 0;
        for (auto const& t : st.tensors)
          if (t.kind == tensor_kind::gate_output && t.choice.is_precise()) ++raised;
        CHECK(raised == j);
        CHECK(st.unused_bytes == extra);
        CHECK(st.memory.total() <= in.budget_bytes);
        if (j >= 1) CHECK(plan.storage_of(2 * s, tensor_kind::gate_output).is_precise());
      }
    }
  }
}

TEST_CASE("the planner matches brute force within its own bound") {
  planner_input in = small_input();
  for (tensor_kind const k : kinds) in.policy.set(k, storage::with(int4_g128), three);
  in.errors.set_outlier(tensor_kind::swiglu_output, 5.0);
  auto const need = minimum(in);
  for (std::int64_t extra = 0; extra <= 600000; extra += 25000) {
    in.budget_bytes = std::max(need[0], need[1]) + extra;
    auto const plan = make_plan(in);
    for (std::int64_t s = 0; s < 2; ++s) {
      auto const& st = plan.stages()[static_cast<std::size_t>(s)];
      double const best =
          brute_force(in, s, need[static_cast<std::size_t>(s)], kinds,
                      [&](std::int64_t l, tensor_kind k, saved_shape const& shape,
                          storage const& o) { return in.errors.weighted(l, k, shape, o); });
      CHECK(st.error >= best * (1 - 1e-12));
      CHECK(st.error_lower_bound <= best * (1 + 1e-12));
      CHECK(st.memory.total() <= in.budget_bytes);
    }
  }
}

TEST_CASE("interleaved: the planner fits every peak moment and matches brute force") {
  planner_input in = interleaved_input();
  auto const need = minimum(in);
  activation_plan previous;
  for (std::int64_t extra = 0; extra <= 900000; extra += 25000) {
    in.budget_bytes = std::max(need[0], need[1]) + extra;
    auto const plan = make_plan(in);
    for (std::int64_t s = 0; s < 2; ++s) {
      auto const& st = plan.stages()[static_cast<std::size_t>(s)];
      std::int64_t const layers[2] = {s, s + 2};
      // 2 layers x 2 kinds x 3 options = 81 plans, their memory from the memory model.
      double best = std::numeric_limits<double>::infinity();
      for (int code = 0; code < 81; ++code) {
        auto option = [&](std::int64_t l, tensor_kind k) -> storage {
          int c = code;
          for (std::int64_t const x : layers)
            for (tensor_kind const y : kinds) {
              if (x == l && y == k) return three[static_cast<std::size_t>(c % 3)];
              c /= 3;
            }
          return in.policy.candidates(k).front();
        };
        auto const mem = estimate_memory(in.model, in.parallel, in.step, in.states, option);
        if (mem[static_cast<std::size_t>(s)].total() > in.budget_bytes) continue;
        double err = 0;
        for (std::int64_t const l : layers)
          for (tensor_kind const k : kinds)
            err += in.errors.weighted(l, k, shape_of(k, in.model, shard_of(in.parallel, in.step)),
                                      option(l, k));
        best = std::min(best, err);
      }
      CHECK(st.error >= best * (1 - 1e-12));
      CHECK(st.error_lower_bound <= best * (1 + 1e-12));
      CHECK(st.memory.total() <= in.budget_bytes);
    }
    if (extra > 0) {
      for (std::int64_t l = 0; l < 4; ++l)
        for (tensor_kind const k : kinds) CHECK(bits_of(plan, l, k) >= bits_of(previous, l, k));
    }
    previous = plan;
  }
  // With room for everything, everything is precise.
  CHECK(previous.total_error() == 0.0);
}

TEST_CASE("interleaved: the LP with a row per moment tightens the summed relaxation's bound") {
  // interleaved_input(). Here every one of a device's 81 plans is taken through the planner's own
  // constraints: its activation bytes at each peak moment j (in_flight_peaks; one layer per chunk,
  // the output head's n_j,last copies on the last device) plus the states and the reserved
  // transient memory, `held`, at most the budget. Against them: the exact optimum, and the
  // summed relaxation's bound, max over one price t >= 0 of min over plans of
  // err + t sum_j (bytes_j - room_j), exact at a crossing of two plans' lines.
  planner_input in = interleaved_input();
  shard_shape const sh = shard_of(in.parallel, in.step);
  auto const need = minimum(in);
  int gaps = 0;  // devices where the summed bound is below the optimum
  int tighter = 0;
  double closed = 0;  // the share of the summed bound's gap to the optimum closed, summed
  for (std::int64_t extra = 0; extra <= 900000; extra += 25000) {
    in.budget_bytes = std::max(need[0], need[1]) + extra;
    auto const plan = make_plan(in);
    for (std::int64_t s = 0; s < 2; ++s) {
      auto const& st = plan.stages()[static_cast<std::size_t>(s)];
      auto const peaks = in_flight_peaks(schedule_of(in.parallel, in.step), s);
      std::int64_t const head = s == 1 ? head_activation_bytes(in.model, sh) : 0;
      std::int64_t const layers[2] = {s, s + 2};
      // Per plan: its error and its activation bytes at each moment.
      std::vector<double> err;
      std::vector<std::vector<std::int64_t>> at;
      for (int code = 0; code < 81; ++code) {
        int c = code;
        double e = 0;
        std::int64_t chunk[2] = {0, 0};
        for (std::size_t ci = 0; ci < 2; ++ci)
          for (tensor_kind const k : block_tensors(in.model.style)) {
            if (is_alias(k)) continue;
            saved_shape const shape = shape_of(k, in.model, sh);
            storage o = in.policy.candidates(k).front();
            if (k == kinds[0] || k == kinds[1]) {
              o = three[static_cast<std::size_t>(c % 3)];
              c /= 3;
              e += in.errors.weighted(layers[ci], k, shape, o);
            }
            chunk[ci] += o.bytes(shape);
          }
        err.push_back(e);
        std::vector<std::int64_t> bytes;
        for (auto const& n : peaks)
          bytes.push_back(n.back() * head + n[0] * chunk[0] + n[1] * chunk[1]);
        at.push_back(bytes);
      }
      // Plan 0 stores everything at its smallest candidate, which minimum() measured.
      std::int64_t const held =
          need[static_cast<std::size_t>(s)] - *std::max_element(at[0].begin(), at[0].end());
      double best = std::numeric_limits<double>::infinity();
      for (std::size_t q = 0; q < err.size(); ++q)
        if (held + *std::max_element(at[q].begin(), at[q].end()) <= in.budget_bytes)
          best = std::min(best, err[q]);
      // Plan q's line in the price t: err + t * over(q).
      auto const over = [&](std::size_t q) {
        double o = 0;
        for (std::int64_t const b : at[q]) o += static_cast<double>(b - (in.budget_bytes - held));
        return o;
      };
      auto const dual = [&](double t) {
        double l = std::numeric_limits<double>::infinity();
        for (std::size_t q = 0; q < err.size(); ++q) l = std::min(l, err[q] + t * over(q));
        return l;
      };
      double summed = dual(0);
      for (std::size_t a = 0; a < err.size(); ++a)
        for (std::size_t b = a + 1; b < err.size(); ++b)
          if (over(a) != over(b)) {
            double const t = (err[b] - err[a]) / (over(a) - over(b));
            if (t > 0) summed = std::max(summed, dual(t));
          }
      CHECK(st.error_lower_bound >= summed - 1e-12 * best);
      if (summed < best * (1 - 1e-9)) ++gaps;
      CHECK(st.error_lower_bound <= best * (1 + 1e-12));
      if (st.error_lower_bound > summed + 1e-9 * best) {
        ++tighter;
        closed += (st.error_lower_bound - summed) / (best - summed);
      }
    }
  }
  CHECK(tighter > 0);
  MESSAGE("of 74 devices, " << gaps << " with a gap; tighter on " << tighter << ", closing "
                            << closed / std::max(tighter, 1) << " of the gap on average");
}

TEST_CASE("the LP with a row per moment: a certified optimum, below every plan that fits") {
  // Random devices: chunks, moments with random in-flight counts, items with random options (their
  // lower hulls, bytes weighted by w_c as make_plan builds them) and rooms. The simplex's
  // fractional plan is checked here to fit every moment; its error, less the bound, certifies both
  // optimal (the bound is L at the simplex's prices, at most the LP optimum, at most the plan's
  // error). The bound is also at least L at other prices, and at most the best whole plan.
  std::uint64_t seed = 12345;
  auto const next = [&](std::int64_t n) {  // uniform in [0, n)
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::int64_t>((seed >> 33) % static_cast<std::uint64_t>(n));
  };
  int brute_forced = 0;
  int most_iterations = 0;
  double worst_gap = 0;
  for (int trial = 0; trial < 400; ++trial) {
    CAPTURE(trial);
    std::size_t const chunks = static_cast<std::size_t>(1 + next(4));
    std::size_t const moments = static_cast<std::size_t>(1 + next(6));
    std::vector<std::vector<std::int64_t>> peaks(moments, std::vector<std::int64_t>(chunks));
    std::vector<std::int64_t> weight(chunks, 0);
    for (auto& n : peaks)
      for (std::size_t c = 0; c < chunks; ++c) weight[c] += n[c] = next(9);
    for (std::size_t c = 0; c < chunks; ++c)
      if (weight[c] == 0) weight[c] = peaks[0][c] = 1;  // every chunk in flight somewhere
    // Bytes of one copy: small, or like a real tensor's (2^20 to 2^28).
    std::int64_t const unit = trial % 2 == 0 ? 1 : std::int64_t{1} << (20 + next(9));
    std::size_t const items = static_cast<std::size_t>(1 + next(trial < 200 ? 6 : 40));
    std::vector<std::vector<detail::plan_option>> hulls;
    std::vector<std::size_t> chunk_of;
    for (std::size_t i = 0; i < items; ++i) {
      std::size_t const c = static_cast<std::size_t>(next(static_cast<std::int64_t>(chunks)));
      std::vector<detail::plan_option> opts;
      std::size_t const options = static_cast<std::size_t>(1 + next(4));
      for (std::size_t o = 0; o < options; ++o)
        opts.push_back({(1 + next(50)) * unit * weight[c], static_cast<double>(next(1000)) / 7, o});
      hulls.push_back(detail::lower_hull(std::move(opts)));
      chunk_of.push_back(c);
    }
    // Rooms from 0 to the bytes every last hull point would add.
    std::vector<std::int64_t> room(moments, 0);
    for (std::size_t j = 0; j < moments; ++j) {
      std::int64_t most = 0;
      for (std::size_t i = 0; i < items; ++i)
        most += peaks[j][chunk_of[i]] * (hulls[i].back().bytes - hulls[i].front().bytes) /
                weight[chunk_of[i]];
      room[j] = most == 0 ? 0 : next(most + 1);
    }
    auto const lp = detail::moment_lp_bound(hulls, chunk_of, weight, peaks, room);
    std::size_t steps = 0;
    for (auto const& h : hulls) steps += h.size() - 1;
    CHECK(lp.iterations < static_cast<int>(50 * (steps + moments)));  // ended optimal, not capped
    most_iterations = std::max(most_iterations, lp.iterations);
    // The fractional plan: shares in [0, 1] that fit every moment, and its error.
    double primal = 0;
    std::vector<double> used(moments, 0);
    REQUIRE(lp.taken.size() == items);
    for (std::size_t i = 0; i < items; ++i) {
      primal += hulls[i][0].error;
      REQUIRE(lp.taken[i].size() + 1 == hulls[i].size());
      for (std::size_t s = 0; s + 1 < hulls[i].size(); ++s) {
        double const x = lp.taken[i][s];
        CHECK(x >= -1e-9);
        CHECK(x <= 1 + 1e-9);
        primal -= (hulls[i][s].error - hulls[i][s + 1].error) * x;
        double const copy =
            static_cast<double>((hulls[i][s + 1].bytes - hulls[i][s].bytes) / weight[chunk_of[i]]);
        for (std::size_t j = 0; j < moments; ++j)
          used[j] += static_cast<double>(peaks[j][chunk_of[i]]) * copy * x;
      }
    }
    double scale = 1;  // the errors' size
    for (auto const& h : hulls) scale = std::max(scale, h.front().error);
    for (std::size_t j = 0; j < moments; ++j)
      CHECK(used[j] <=
            static_cast<double>(room[j]) * (1 + 1e-9) + 1e-6 * static_cast<double>(unit));
    CHECK(primal == doctest::Approx(lp.primal).epsilon(1e-12).scale(scale));
    CHECK(lp.bound <= lp.primal + 1e-9 * scale);
    CHECK(lp.primal - lp.bound <= 1e-9 * scale);
    worst_gap = std::max(worst_gap, (lp.primal - lp.bound) / scale);
    CHECK(lp.bound ==
          doctest::Approx(detail::moment_lagrangian(hulls, chunk_of, weight, peaks, room, lp.mu)));
    // Other prices give no more: the simplex's scaled up and down, a single price, random ones.
    for (int t = 0; t < 8; ++t) {
      std::vector<double> mu = lp.mu;
      for (std::size_t j = 0; j < moments; ++j) {
        double const f = t < 2 ? (t == 0 ? 0.5 : 2.0) : static_cast<double>(next(2001)) / 1000;
        mu[j] = t == 2 ? lp.mu[0] : mu[j] * f + (t > 4 ? static_cast<double>(next(3)) / 1e6 : 0);
      }
      CHECK(detail::moment_lagrangian(hulls, chunk_of, weight, peaks, room, mu) <=
            lp.bound + 1e-9 * scale);
    }
    // Every whole plan that fits, for the small devices: none below the bound.
    std::int64_t plans = 1;
    for (auto const& h : hulls) plans *= static_cast<std::int64_t>(h.size());
    if (plans > 5000) continue;
    ++brute_forced;
    double best = std::numeric_limits<double>::infinity();
    for (std::int64_t code = 0; code < plans; ++code) {
      std::int64_t c = code;
      double e = 0;
      std::vector<std::int64_t> at(moments, 0);
      for (std::size_t i = 0; i < items; ++i) {
        auto const o = static_cast<std::size_t>(c % static_cast<std::int64_t>(hulls[i].size()));
        c /= static_cast<std::int64_t>(hulls[i].size());
        e += hulls[i][o].error;
        for (std::size_t j = 0; j < moments; ++j)
          at[j] +=
              peaks[j][chunk_of[i]] * (hulls[i][o].bytes - hulls[i][0].bytes) / weight[chunk_of[i]];
      }
      bool fits = true;
      for (std::size_t j = 0; j < moments; ++j) fits = fits && at[j] <= room[j];
      if (fits) best = std::min(best, e);
    }
    CHECK(lp.bound <= best + 1e-9 * scale);
  }
  CHECK(brute_forced > 150);
  MESSAGE("largest primal - bound, relative to the largest error: "
          << worst_gap << "; most simplex iterations " << most_iterations);
}

TEST_CASE("more memory never lowers a bit width, and stages with fewer micro-batches get more") {
  // A vocabulary of 8000: with 32000 the last stage's output head, whose backward holds the bf16
  // logits, its input gradient and (8-bit gradients) the head weight's bf16 gradient, 99 MB at
  // seq 512, needs more than its fewer micro-batches spare it, and the last stage gets fewer bits
  // than the first.
  planner_input in;
  in.model = {block_style::llama, 16, 1024, 3584, 8, 2, 0, 8000, false};
  in.parallel.pp = 4;
  SUBCASE("1F1B") { in.parallel.virtual_stages = 1; }
  SUBCASE("interleaved, v = 2") { in.parallel.virtual_stages = 2; }
  in.step = {1, 512, 0};
  in.states.gradients = gradient_format::int8_g128;
  auto const need = minimum(in);
  std::int64_t const low = *std::max_element(need.begin(), need.end());
  auto const full =
      estimate_memory(in.model, in.parallel, in.step, in.states, policy_table::all_precise());
  std::int64_t const high = peak_total(full);
  activation_plan previous;
  bool first = true;
  bool saw_stage_order = false;
  for (int i = 0; i <= 40; ++i) {
    in.budget_bytes = low + (high - low) * i / 40;
    auto const plan = make_plan(in);
    if (!first) {
      for (std::int64_t l = 0; l < in.model.layers; ++l)
        for (tensor_kind k : llama_block_tensors)
          CHECK(bits_of(plan, l, k) >= bits_of(previous, l, k));
      CHECK(plan.total_error() <= previous.total_error());
    }
    // Compare the first and last stage's average bits.
    auto avg = [&](std::int64_t s) {
      double b = 0;
      for (auto const& t : plan.stages()[static_cast<std::size_t>(s)].tensors) b += t.choice.bits();
      return b;
    };
    CHECK(avg(3) >= avg(0));
    if (avg(3) > avg(0)) saw_stage_order = true;
    previous = plan;
    first = false;
  }
  CHECK(saw_stage_order);
  // At the bf16 peak everything is precise.
  in.budget_bytes = high;
  auto const top = make_plan(in);
  for (auto const& s : top.stages()) {
    CHECK(s.error == 0.0);
    for (auto const& t : s.tensors) CHECK(t.choice.is_precise());
  }
}

TEST_CASE("plan memory equals the memory model, and in-flight counts come from the schedule") {
  planner_input in;
  in.model = {block_style::llama, 16, 1024, 3584, 8, 2, 0, 32000, false};
  in.parallel.pp = 2;
  in.parallel.virtual_stages = 2;
  in.parallel.tp = 2;
  in.parallel.sp = true;
  // Context parallelism too: 256 tokens of each sequence a rank; the embedding and the loss
  // counted in the split of 14 layers (chunks of 3 and 4 on the first device, 4 and 3 on the
  // second); and uneven stages, 4 layers on the first device (2 chunks of 2) and 12 on the second
  // (2 of 6), whose budget the even split below fits in; and Qwen3's block (the QK-norm's inputs
  // kept precise, as attention core, under the default policy).
  struct layout {
    int cp;
    std::int64_t first;
    bool counted;
    block_style style = block_style::llama;
  };
  for (auto const& [cp, first, counted, style] :
       {layout{1, 0, false}, layout{2, 0, false}, layout{1, 0, true}, layout{1, 4, false},
        layout{1, 0, false, block_style::qwen3}}) {
    CAPTURE(cp);
    CAPTURE(first);
    CAPTURE(counted);
    CAPTURE(name_of(style));
    in.model.style = style;
    in.parallel.cp = cp;
    in.parallel.first_stage_layers = first;
    in.parallel.account_for_embedding = in.parallel.account_for_loss = counted;
    in.model.layers = counted ? 14 : 16;
    in.step = {1, 512, 8};
    auto const need = minimum(in);
    in.budget_bytes = std::max(need[0], need[1]) + (std::int64_t{32} << 20);
    auto const plan = make_plan(in);
    CHECK(plan.total_error() > 0.0);
    check_plan_is_the_model(in, plan);
    for (std::size_t s = 0; s < 2; ++s) {
      auto const& st = plan.stages()[s];
      auto const peaks = in_flight_peaks(2, 2, static_cast<std::int64_t>(s), 8);
      CHECK(std::find(peaks.begin(), peaks.end(), st.memory.in_flight) != peaks.end());
      std::int64_t activations = 0;
      for (auto const& t : st.tensors) {
        layer_place const where = place_of(t.layer, in.model, in.parallel);
        CHECK(where.stage == static_cast<std::int64_t>(s));
        CHECK(t.in_flight == st.memory.in_flight[static_cast<std::size_t>(where.chunk)]);
        activations += t.bytes * t.in_flight;
      }
      CHECK(activations == st.memory.activations);
      CHECK(static_cast<std::int64_t>(st.tensors.size()) ==
            st.memory.layers * static_cast<std::int64_t>(plan.stages()[0].tensors.size()) /
                plan.stages()[0].memory.layers);
    }
    CHECK(static_cast<std::int64_t>(plan.stages()[0].tensors.size()) ==
          plan.stages()[0].memory.layers *
              std::ranges::count_if(block_tensors(style),
                                    [](tensor_kind k) { return !is_alias(k); }));
    if (style == block_style::qwen3) {
      for (std::int64_t l = 0; l < in.model.layers; ++l) {
        CHECK(plan.storage_of(l, tensor_kind::query_norm_input) == storage::precise());
        CHECK(plan.storage_of(l, tensor_kind::key_norm_input) == storage::precise());
      }
    }
  }
  in.model.style = block_style::llama;
  in.parallel.first_stage_layers = 0;
  auto const plan = make_plan(in);
  CHECK(plan.storage_of(5, tensor_kind::o_proj_input) ==
        plan.storage_of(5, tensor_kind::attention_output));
  CHECK_THROWS_AS(plan.storage_of(16, tensor_kind::query), agoq::invalid_argument);
  CHECK_THROWS_AS(plan.storage_of(0, tensor_kind::gelu_input), agoq::invalid_argument);
}

TEST_CASE("observed statistics move bits to the layers that need them") {
  planner_input in = small_input();
  in.policy.set(tensor_kind::qkv_input, storage::with(int4_g128),
                {storage::with(int4_g128), storage::with(int8_g128)});
  auto const need = minimum(in);
  // The stage that needs more memory; its two layers differ only in their statistics.
  std::int64_t const s = need[0] >= need[1] ? 0 : 1;
  tensor_stats st;
  st.elements = 128 * 256;
  st.sum_squares = 128 * 256;
  st.add_group(128 * 256, 4.0);
  in.errors.set_statistics(2 * s, tensor_kind::qkv_input, st);
  st.sum_group_absmax_sq = 0;
  st.add_group(128 * 256, 40.0);  // the second layer has ten times the group absmax
  in.errors.set_statistics(2 * s + 1, tensor_kind::qkv_input, st);
  saved_shape const sh{128, 256, 2};
  std::int64_t const delta =
      storage::with(int8_g128).bytes(sh) - storage::with(int4_g128).bytes(sh);
  in.budget_bytes = need[static_cast<std::size_t>(s)] + (2 - s) * delta;
  auto const plan = make_plan(in);
  CHECK(plan.storage_of(2 * s + 1, tensor_kind::qkv_input).bits() == 8);
  CHECK(plan.storage_of(2 * s, tensor_kind::qkv_input).bits() == 4);
}

TEST_CASE("a sensitivity per layer moves bits to the layer weighted more") {
  planner_input in = small_input();
  in.policy.set(tensor_kind::gate_output, storage::with(int4_g128),
                {storage::with(int4_g128), storage::with(int8_g128)});
  auto const need = minimum(in);
  std::int64_t const s = need[0] >= need[1] ? 0 : 1;
  shard_shape const sh = shard_of(in.parallel, in.step);
  saved_shape const shape = shape_of(tensor_kind::gate_output, in.model, sh);
  std::int64_t const delta =
      storage::with(int8_g128).bytes(shape) - storage::with(int4_g128).bytes(shape);
  // Room for one of the stage's two layers at int8 (the last stage holds one micro-batch, the
  // first two); the layers are alike but for their weights.
  in.budget_bytes = need[static_cast<std::size_t>(s)] + (2 - s) * delta;
  for (std::int64_t const heavy : {2 * s, 2 * s + 1}) {
    in.errors.clear_layer_sensitivities();
    in.errors.set_sensitivity(heavy, tensor_kind::gate_output, 3.0);
    auto const plan = make_plan(in);
    CHECK(plan.storage_of(heavy, tensor_kind::gate_output).bits() == 8);
    CHECK(plan.storage_of(4 * s + 1 - heavy, tensor_kind::gate_output).bits() == 4);
  }
  // An entry for a layer the model does not have is refused, not ignored.
  in.errors.set_sensitivity(in.model.layers, tensor_kind::gate_output, 3.0);
  CHECK_THROWS_WITH_AS(make_plan(in),
                       doctest::Contains("per-layer sensitivity or statistics for layer 4, past "
                                         "the model's 4 layers"),
                       agoq::invalid_argument);
  in.errors.clear_layer_sensitivities();
  tensor_stats st;
  st.elements = 1;
  st.sum_squares = 1;
  st.add_group(1, 1.0);
  in.errors.set_statistics(7, tensor_kind::qkv_input, st);
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("for layer 7, past the model's 4 layers"),
                       agoq::invalid_argument);
}

TEST_CASE("recomputed layers are not planned: precise, held only while recomputed") {
  // 16 layers on 8 stages, each recomputing the first of its 2 (block, N = 1): the even layers.
  planner_input in = small_input();
  in.model.layers = 16;
  in.parallel.pp = 8;
  in.step.seq = 4096;
  in.policy = policy_table{};
  in.step.recompute = recompute_method::block;
  in.step.recompute_layers = 1;
  auto const need = minimum(in);
  planner_input plain = in;
  plain.step.recompute = recompute_method::none;
  plain.step.recompute_layers = 0;
  auto const need_plain = minimum(plain);
  // Stage 0 holds 8 micro-batches of a layer and a checkpoint's input instead of 2 layers, and
  // one layer in bf16 while it is recomputed: less than the smallest plan without recomputation.
  CHECK(need[0] < need_plain[0]);
  CHECK(need[7] > need_plain[7]);  // the last stage, 1 micro-batch in flight: more
  in.budget_bytes = std::max(need[0], need[1]) + (std::int64_t{1} << 20);
  plain.budget_bytes = in.budget_bytes;
  CHECK(in.budget_bytes < need_plain[0]);
  CHECK_THROWS_AS(make_plan(plain), agoq::invalid_argument);
  auto const plan = make_plan(in);
  CHECK(plan.total_error() > 0.0);
  check_plan_is_the_model(in, plan);
  shard_shape const sh = shard_of(in.parallel, in.step);
  for (std::size_t s = 0; s < 8; ++s) {
    auto const& st = plan.stages()[s];
    CHECK(st.unused_bytes == in.budget_bytes - st.memory.total());
    std::int64_t recomputed = 0;
    double error = 0;
    for (auto const& t : st.tensors) {
      CAPTURE(t.layer);
      CAPTURE(name_of(t.kind));
      CHECK(t.recomputed == (t.layer % 2 == 0));
      error += t.error;
      if (t.recomputed) {
        CHECK(t.choice.is_precise());
        CHECK(t.error == 0.0);
        CHECK(t.in_flight == 0);
        CHECK(t.bytes == storage::precise().bytes(shape_of(t.kind, in.model, sh)));
        recomputed += t.bytes;
      } else {
        CHECK(t.in_flight == st.memory.in_flight[0]);
      }
    }
    CHECK(st.memory.recompute == recomputed);  // one layer a checkpoint, held in bf16
    CHECK(st.error == error);
  }
  // At the smallest budget that fits, the planner finds the minimum.
  in.budget_bytes = std::max(need[0], need[1]);
  CHECK_NOTHROW(make_plan(in));
  in.budget_bytes -= 1000;
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("falls short by 1000 bytes"),
                       agoq::invalid_argument);
}

TEST_CASE(
    "selective recomputation: recomputed kinds are not planned and inherit their sources' "
    "error") {
  // 4 layers on 2 stages; the norms recomputed (layernorm): qkv_input and mlp_input are computed
  // again from the residual stream, whose two kinds take int4, int8 or bf16.
  planner_input in = small_input();
  in.step.selective = {.layernorm = true};
  tensor_kind const sources[2] = {tensor_kind::attn_norm_input, tensor_kind::mlp_norm_input};
  tensor_kind const heirs[2] = {tensor_kind::qkv_input, tensor_kind::mlp_input};
  for (tensor_kind const k : sources) in.policy.set(k, storage::with(int4_g128), three);
  shard_shape const sh = shard_of(in.parallel, in.step);
  saved_shape const shape = shape_of(tensor_kind::attn_norm_input, in.model, sh);
  auto const need = minimum(in);
  SUBCASE("brute force, with each source weighted by its own and its heir's sensitivity") {
    in.errors.set_sensitivity(tensor_kind::mlp_input, 3.0);
    for (std::int64_t extra = 0; extra <= 300000; extra += 12500) {
      in.budget_bytes = std::max(need[0], need[1]) + extra;
      auto const plan = make_plan(in);
      for (std::int64_t s = 0; s < 2; ++s) {
        auto const& st = plan.stages()[static_cast<std::size_t>(s)];
        double const best =
            brute_force(in, s, need[static_cast<std::size_t>(s)], sources,
                        [&](std::int64_t l, tensor_kind k, saved_shape const& x, storage const& o) {
                          tensor_kind const heir = k == sources[0] ? heirs[0] : heirs[1];
                          return (in.errors.sensitivity(k) + in.errors.sensitivity(heir)) *
                                 in.errors.relative(l, k, x, o);
                        });
        CHECK(st.error >= best * (1 - 1e-12));
        CHECK(st.error_lower_bound <= best * (1 + 1e-12));
        CHECK(st.memory.total() <= in.budget_bytes);
        // Each heir: not held, bf16 in the backward, its source's relative error times its own
        // sensitivity; the stage's error is the sum of its tensors'.
        double error = 0;
        for (auto const& t : st.tensors) {
          error += t.error;
          for (std::size_t i = 0; i < 2; ++i) {
            if (t.kind != heirs[i]) continue;
            CAPTURE(t.layer);
            CHECK(t.recomputed);
            CHECK(t.in_flight == 0);
            CHECK(t.choice.is_precise());
            CHECK(t.bytes == shape.bytes());
            CHECK(t.error == in.errors.sensitivity(heirs[i]) *
                                 in.errors.relative(t.layer, sources[i], shape,
                                                    plan.storage_of(t.layer, sources[i])));
            CHECK((t.error > 0.0) == !plan.storage_of(t.layer, sources[i]).is_precise());
          }
        }
        CHECK(st.error == error);
      }
    }
  }
  SUBCASE("brute force under mlp: the SwiGLU output inherits twice its source's error") {
    // mlp recomputes gate, up and SwiGLU outputs from mlp_input (factor 1, 1, 2); the attention
    // norm's input inherits nothing here.
    in.step.selective = {.mlp = true};
    in.policy.set(tensor_kind::mlp_input, storage::with(int4_g128), three);
    in.policy.set(tensor_kind::mlp_norm_input, storage::precise(), {storage::precise()});
    tensor_kind const planned[2] = {tensor_kind::attn_norm_input, tensor_kind::mlp_input};
    CHECK(sources_of(tensor_kind::swiglu_output, block_style::llama, in.step.selective).factor ==
          2.0);
    auto const base = minimum(in);
    error_model const& e = in.errors;
    double const heirs_weight = e.sensitivity(tensor_kind::gate_output) +
                                e.sensitivity(tensor_kind::up_output) +
                                2 * e.sensitivity(tensor_kind::swiglu_output);
    for (std::int64_t extra = 0; extra <= 300000; extra += 12500) {
      in.budget_bytes = std::max(base[0], base[1]) + extra;
      auto const plan = make_plan(in);
      for (std::int64_t s = 0; s < 2; ++s) {
        auto const& st = plan.stages()[static_cast<std::size_t>(s)];
        double const best = brute_force(
            in, s, base[static_cast<std::size_t>(s)], planned,
            [&](std::int64_t l, tensor_kind k, saved_shape const& x, storage const& o) {
              double const w = e.sensitivity(k) + (k == tensor_kind::mlp_input ? heirs_weight : 0);
              return w * e.relative(l, k, x, o);
            });
        CHECK(st.error >= best * (1 - 1e-12));
        CHECK(st.error_lower_bound <= best * (1 + 1e-12));
        for (auto const& t : st.tensors) {
          if (!t.recomputed) continue;
          CAPTURE(name_of(t.kind));
          double const factor = t.kind == tensor_kind::swiglu_output ? 2.0 : 1.0;
          CHECK(t.error ==
                e.sensitivity(t.kind) *
                    (factor * e.relative(t.layer, tensor_kind::mlp_input, shape,
                                         plan.storage_of(t.layer, tensor_kind::mlp_input))));
        }
      }
    }
    // The factor decides here: attn_norm_input weighs 6.5, mlp_input 1 + 2 + 2 + 2 x 1 = 7 (6
    // with a factor of 1 for the SwiGLU output). With the same statistics, the one int4 -> int8
    // step the tighter stage has room for goes to mlp_input.
    in.errors = error_model{};
    in.errors.set_outlier(tensor_kind::attn_norm_input, e.outlier(tensor_kind::mlp_input));
    in.errors.set_sensitivity(tensor_kind::attn_norm_input, 6.5);
    std::int64_t const step =
        storage::with(int8_g128).bytes(shape) - storage::with(int4_g128).bytes(shape);
    in.budget_bytes = std::max(base[0] + 2 * step, base[1] + step);
    std::size_t const tight = base[0] + 2 * step >= base[1] + step ? 0 : 1;
    int raised = 0;
    for (auto const& t : make_plan(in).stages()[tight].tensors)
      if (!t.recomputed && t.choice.bits() == 8) {
        ++raised;
        CHECK(t.kind == tensor_kind::mlp_input);
      }
    CHECK(raised == 1);
  }
  SUBCASE("a sensitive heir moves bits to its source") {
    // Room for one int4 -> int8 step of a residual-stream tensor on the tighter stage. Both
    // sources have the same sensitivity and statistics, so without heirs the tie goes to the
    // first in block order, attn_norm_input; a sensitive mlp_input (inherited by
    // mlp_norm_input) takes it instead.
    std::int64_t const step =
        storage::with(int8_g128).bytes(shape) - storage::with(int4_g128).bytes(shape);
    in.budget_bytes = std::max(need[0] + 2 * step, need[1] + step);
    std::size_t const tight = need[0] + 2 * step >= need[1] + step ? 0 : 1;
    for (tensor_kind const favoured : heirs) {
      CAPTURE(name_of(favoured));
      in.errors = error_model{};
      in.errors.set_sensitivity(favoured, 100.0);
      tensor_kind const source = favoured == heirs[0] ? sources[0] : sources[1];
      auto const plan = make_plan(in);
      int raised = 0;
      for (auto const& t : plan.stages()[tight].tensors)
        if (!t.recomputed && t.choice.bits() == 8) {
          ++raised;
          CHECK(t.kind == source);
        }
      CHECK(raised == 1);
      auto const first = static_cast<std::int64_t>(2 * tight);  // the tight stage's layers
      for (std::int64_t l = first; l < first + 2; ++l)
        for (std::int64_t j = first; j < first + 2; ++j)
          CHECK(bits_of(plan, l, source) >=
                bits_of(plan, j, source == sources[0] ? sources[1] : sources[0]));
    }
  }
  SUBCASE("plan memory equals the memory model, for every module") {
    for (recompute_modules const r :
         {recompute_modules{.core_attn = true}, recompute_modules{.mlp = true},
          recompute_modules{true, true, true}}) {
      CAPTURE(name_of(r));
      planner_input x = small_input();
      x.policy = policy_table{};
      x.step.selective = r;
      for (std::int64_t extra : {std::int64_t{0}, std::int64_t{200000}, std::int64_t{1} << 40}) {
        x.budget_bytes = peak_total(smallest_memory(x)) + extra;
        auto const plan = make_plan(x);
        check_plan_is_the_model(x, plan);
        for (std::size_t s = 0; s < 2; ++s) {
          auto const& st = plan.stages()[s];
          for (auto const& t : st.tensors) {
            CAPTURE(name_of(t.kind));
            CHECK(t.recomputed == recomputes(r, t.kind));
            if (t.recomputed) CHECK(t.in_flight == 0);
          }
        }
        // The recomputed kinds cost nothing held: the plan holds less than without them.
        planner_input y = x;
        y.step.selective = {};
        y.budget_bytes = std::int64_t{1} << 40;
        x.budget_bytes = std::int64_t{1} << 40;
        CHECK(make_plan(x).stages()[0].memory.activations <
              make_plan(y).stages()[0].memory.activations);
      }
    }
  }
}

TEST_CASE("smallest_memory is make_plan's boundary, and the fewest layers to recompute") {
  planner_input a = small_input();
  a.policy = policy_table{};
  planner_input b = interleaved_input();
  planner_input c = small_input();
  c.model.layers = 16;
  c.parallel.pp = 8;
  c.step.seq = 4096;
  c.policy = policy_table{};
  planner_input d = c;
  d.step.recompute = recompute_method::block;
  d.step.recompute_layers = 1;
  planner_input e = d;
  e.step.recompute = recompute_method::uniform;
  e.step.recompute_layers = 2;
  planner_input f = c;  // context parallelism: 2048 tokens a rank, ZeRO-1 over dp x cp = 4
  f.parallel.cp = 2;
  f.parallel.dp = 2;
  f.parallel.zero_stage = 1;
  planner_input g = c;  // selective recomputation
  g.step.selective = {.layernorm = true, .mlp = true};
  planner_input h = d;  // uneven stages: 1, 6 x 2, 3 layers, each chunk's first 2 recomputed
  h.parallel.first_stage_layers = 1;
  h.parallel.last_stage_layers = 3;
  h.step.recompute_layers = 2;
  planner_input i = b;  // the embedding and the loss counted: 6 layers in chunks of 1, 2 / 2, 1
  i.model.layers = 6;
  i.parallel.account_for_embedding = true;
  i.parallel.account_for_loss = true;
  i.step.recompute = recompute_method::block;
  i.step.recompute_layers = 1;
  planner_input j = b;  // 2 layers, 4 units: the first and the last chunk hold none
  j.model.layers = 2;
  j.parallel.account_for_embedding = true;
  j.parallel.account_for_loss = true;
  planner_input k = b;  // a pipeline layout: chunks of 1 and 0 on device 0, 3 and 0 on device 1
  k.parallel.pipeline_layout = parse_pipeline_layout("Et|ttt||L");
  k.step.recompute = recompute_method::uniform;
  k.step.recompute_layers = 2;
  for (planner_input in : {a, b, c, d, e, f, g, h, i, j, k}) {
    in.budget_bytes = peak_total(smallest_memory(in));
    CHECK_NOTHROW(make_plan(in));
    CHECK(!find_shortfall(in).has_value());
    in.budget_bytes -= 1;
    CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("falls short by 1 bytes"),
                         agoq::invalid_argument);
    REQUIRE(find_shortfall(in).has_value());
    CHECK(find_shortfall(in)->bytes() == 1);
  }
  // 16 layers on 8 stages (chunks of 2): stage 0 holds 8 micro-batches.
  auto const fits = [](planner_input in, std::int64_t n) {
    in.step.recompute = n == 0 ? recompute_method::none : recompute_method::block;
    in.step.recompute_layers = n;
    return peak_total(smallest_memory(in)) <= in.budget_bytes;
  };
  std::int64_t const none = peak_total(smallest_memory(c));
  std::int64_t const one = peak_total(smallest_memory(d));
  CHECK(one < none);
  c.budget_bytes = none;
  CHECK(least_block_recompute(c) == 0);
  c.budget_bytes = one;
  CHECK(least_block_recompute(c) == 1);
  d.budget_bytes = one;
  CHECK_NOTHROW(make_plan(d));
  CHECK(!fits(c, 0));
  c.budget_bytes = one - 1;
  CHECK(least_block_recompute(c) == 2);
  CHECK(fits(c, 2));
  c.budget_bytes = 1;
  CHECK(!least_block_recompute(c).has_value());
  // The baseline (every tensor bf16, fp32 states) needs more recomputation for the same budget.
  planner_input base = c;
  base.policy = policy_table::all_precise();
  base.budget_bytes = one;
  auto const n = least_block_recompute(base);
  REQUIRE(n.has_value());
  CHECK(*n == 2);
  CHECK(fits(base, *n));
  CHECK(!fits(base, *n - 1));
  // in.step's own recomputation, full or selective, is ignored.
  base.step.recompute = recompute_method::uniform;
  base.step.recompute_layers = 1;
  CHECK(least_block_recompute(base) == n);
  base.step.selective = {true, true, true};
  CHECK(least_block_recompute(base) == n);
  base.step.recompute = recompute_method::none;
  base.step.recompute_layers = 0;
  CHECK(least_block_recompute(base) == n);
  base.budget_bytes = 0;
  CHECK_THROWS_AS(least_block_recompute(base), agoq::invalid_argument);
}

TEST_CASE("layer_forward_flops and recompute_overhead, by hand") {
  // T = 2 x 128 / cp 2 = 128 tokens a rank, tp 2; q = 4 x 64 = 256, k = 2 x 64 = 128.
  model_shape m{block_style::llama, 4, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.tp = 2;
  p.cp = 2;
  p.pp = 2;
  step_config st{2, 128, 0};
  layer_flops const fl = layer_forward_flops(m, p, st);
  // 2 T h (q + 2k) / tp + 2 T q h / tp; 2 q b s (s + 1) / (cp tp); 6 T h f / tp.
  CHECK(fl.projections == 25165824.0);
  CHECK(fl.core_attention == 4227072.0);
  CHECK(fl.mlp == 50331648.0);
  CHECK(fl.forward() == 25165824.0 + 4227072.0 + 50331648.0);
  CHECK(recompute_flops(fl, {}) == 0.0);
  CHECK(recompute_flops(fl, {.layernorm = true}) == 0.0);
  CHECK(recompute_flops(fl, {.core_attn = true}) == 4227072.0);
  CHECK(recompute_flops(fl, {true, true, true}) == 4227072.0 + 50331648.0);
  // L R / (3 (L F + H)), H = 2 T h vocab / tp = 32768000.
  auto const overhead = [&](model_shape const& model, recompute_modules r) {
    step_config s = st;
    s.selective = r;
    return recompute_overhead(model, p, s);
  };
  CHECK(overhead(m, {}) == 0.0);
  CHECK(overhead(m, {.layernorm = true}) == 0.0);
  CHECK(overhead(m, {.core_attn = true}) == doctest::Approx(0.0160268356317555).epsilon(1e-12));
  CHECK(overhead(m, {.mlp = true}) == doctest::Approx(0.190831159150205).epsilon(1e-12));
  CHECK(overhead(m, {true, true, true}) == doctest::Approx(0.20685799478196049).epsilon(1e-12));
  // Full recomputation: n F / (3 (L F + H)), n the layers recomputed; 2 model chunks of 2 layers.
  step_config full = st;
  full.recompute = recompute_method::block;
  full.recompute_layers = 1;  // n = 2
  CHECK(recompute_overhead(m, p, full) == doctest::Approx(0.1511367871785315).epsilon(1e-12));
  full.recompute_layers = 5;  // n = 4: every layer, as uniform
  CHECK(recompute_overhead(m, p, full) == doctest::Approx(0.302273574357063).epsilon(1e-12));
  full.recompute = recompute_method::uniform;
  for (std::int64_t const n : {1, 2, 3}) {
    full.recompute_layers = n;
    CHECK(recompute_overhead(m, p, full) == doctest::Approx(0.302273574357063).epsilon(1e-12));
  }
  // Uneven stages: 1 layer on the first device, 3 on the second; block 2 recomputes 1 + 2.
  parallel_config uneven = p;
  uneven.first_stage_layers = 1;
  full.recompute = recompute_method::block;
  full.recompute_layers = 1;  // n = 2
  CHECK(recompute_overhead(m, uneven, full) == doctest::Approx(0.1511367871785315).epsilon(1e-12));
  full.recompute_layers = 2;  // n = 3
  CHECK(recompute_overhead(m, uneven, full) ==
        doctest::Approx(0.1511367871785315 * 1.5).epsilon(1e-12));
  full.selective = {.mlp = true};  // full and selective exclude each other
  CHECK_THROWS_AS(recompute_overhead(m, p, full), agoq::invalid_argument);
  // GPT: fc1 and fc2, 4 T h f / tp; q = k = 256.
  model_shape const g{block_style::gpt, 4, 256, 512, 4, 4, 0, 1000, false};
  layer_flops const gl = layer_forward_flops(g, p, st);
  CHECK(gl.projections == 33554432.0);
  CHECK(gl.core_attention == 4227072.0);
  CHECK(gl.mlp == 33554432.0);
  CHECK(overhead(g, {.core_attn = true, .mlp = true}) ==
        doctest::Approx(0.15835736849333884).epsilon(1e-12));
  // Sequence parallelism changes no product.
  p.sp = true;
  CHECK(layer_forward_flops(m, p, st).forward() == fl.forward());
  st.seq = 0;
  CHECK_THROWS_AS(layer_forward_flops(m, p, st), agoq::invalid_argument);
  st.seq = 128;
  p.tp = 0;
  CHECK_THROWS_AS(layer_forward_flops(m, p, st), agoq::invalid_argument);
}

TEST_CASE("layer_forward_flops of a mixture-of-experts layer, by hand") {
  // Mixtral-8x7B, TP 2 + SP, 4096 tokens: the router 2 T h e / tp; the experts over R = 2048
  // tokens x 2 experts x etp 2 = 8192 pairs of 14336 / 2: 6 R h f_e / etp = 6 T h k f_e / tp.
  model_shape const m = preset_model("mixtral-8x7b");
  parallel_config p;
  p.tp = 2;
  p.sp = true;
  p.dp = 2;
  p.ep = 2;
  step_config st{1, 4096, 0};
  double const router = 2.0 * 4096 * 4096 * 8 / 2;
  double const experts = 6.0 * 8192 * 4096 * 7168;
  CHECK(experts == 6.0 * 4096 * 4096 * 2 * 14336 / 2);
  layer_flops const fl = layer_forward_flops(m, p, st);
  CHECK(fl.mlp == router + experts);
  // The attention's: 2 T h (q + 2k) / tp + 2 T q h / tp, q = 4096, k = 1024.
  CHECK(fl.projections == (2.0 * 4096 * 4096 * (4096 + 2048) + 2.0 * 4096 * 4096 * 4096) / 2);
  // etp 1 changes no product; a capacity factor counts its padding: each of the 8 experts takes
  // ceil(4096 / 8 x 1.25) = 640 of a rank's pairs, R = 2 x 8 x 640 = 10240.
  p.etp = 1;
  CHECK(layer_forward_flops(m, p, st).mlp == router + experts);
  p.etp = 0;
  st.expert_capacity_factor = 1.25;
  CHECK(layer_forward_flops(m, p, st).mlp == router + 6.0 * 10240 * 4096 * 7168);
  st.expert_capacity_factor = -1;
  CHECK_THROWS_WITH_AS(layer_forward_flops(m, p, st),
                       doctest::Contains("capacity factor must be finite and >= 0"),
                       agoq::invalid_argument);
  // Gated shared experts (Qwen2-57B-A14B, TP 2 + SP, EP 2): theirs as a dense SwiGLU MLP's,
  // 6 T h f_s / tp, and their gate's 2 T h / tp beside the router's 2 T h e / tp; the routed
  // experts over R = 2048 x 8 x 2 pairs of 2560 / 2.
  model_shape const q = preset_model("qwen2-57b-a14b");
  st.expert_capacity_factor = 0;
  double const shared = 6.0 * 4096 * 3584 * 20480 / 2;
  double const gates = 2.0 * 4096 * 3584 * (64 + 1) / 2;
  double const routed = 6.0 * 32768 * 3584 * 1280;
  CHECK(layer_forward_flops(q, p, st).mlp == shared + gates + routed);
  model_shape ungated = q;
  ungated.shared_expert_gate = false;
  CHECK(layer_forward_flops(ungated, p, st).mlp == shared + gates - 2.0 * 4096 * 3584 / 2 + routed);
}

/// Checks each of `options` against make_plan for `in` with its recomputation (overhead, fit,
/// error, peak or shortfall), their order by overhead, that no two are the same recomputation, and
/// least_error_recompute of them against a brute force for caps between none and all.
void check_options(planner_input const& in, std::vector<recompute_option> const& options) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < options.size(); ++i) {
    recompute_option const& o = options[i];
    CAPTURE(name_of(o));
    names.push_back(name_of(o));
    if (i > 0) CHECK(options[i - 1].overhead <= o.overhead);
    CHECK((o.method == recompute_method::none) == (o.layers == 0));
    CHECK((o.method == recompute_method::none || !o.modules.any()));
    planner_input one = in;
    one.step = o.applied_to(in.step);
    CHECK(o.overhead == recompute_overhead(in.model, in.parallel, one.step));
    if (o.fits) {
      activation_plan const plan = make_plan(one);
      CHECK(o.error == plan.total_error());
      std::int64_t peak = 0;
      for (auto const& st : plan.stages()) peak = std::max(peak, st.memory.total());
      CHECK(o.peak_bytes == peak);
      CHECK(o.peak_bytes <= in.budget_bytes);
    } else {
      CHECK_THROWS_AS(make_plan(one), agoq::invalid_argument);
      CHECK(o.peak_bytes == peak_total(smallest_memory(one)));
      CHECK(o.peak_bytes > in.budget_bytes);
      CHECK(o.error == 0.0);
    }
  }
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  for (double const cap : {0.0, options[options.size() / 2].overhead, 1.0}) {
    CAPTURE(cap);
    std::optional<recompute_option> want;
    for (recompute_option const& o : options)
      if (o.fits && o.overhead <= cap && (!want || o.error < want->error)) want = o;
    auto const got = least_error_recompute(options, cap);
    REQUIRE(got.has_value() == want.has_value());
    if (got) {
      CHECK(name_of(*got) == name_of(*want));
      CHECK(got->error == want->error);
    }
  }
}

TEST_CASE("selective_options: every set of modules planned as make_plan plans it") {
  planner_input in = small_input();
  in.policy = policy_table{};
  // Between the least and the most any set of modules needs: some sets fit, some do not.
  std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
  for (bool const core_attn : {false, true})
    for (bool const layernorm : {false, true})
      for (bool const mlp : {false, true}) {
        planner_input one = in;
        one.step.selective = {core_attn, layernorm, mlp};
        lo = std::min(lo, peak_total(smallest_memory(one)));
        hi = std::max(hi, peak_total(smallest_memory(one)));
      }
  REQUIRE(lo < hi);
  for (std::int64_t const budget : {lo, (lo + hi) / 2, hi, 2 * hi}) {
    CAPTURE(budget);
    in.budget_bytes = budget;
    std::vector<recompute_option> const options = selective_options(in);
    REQUIRE(options.size() == 8);
    CHECK(name_of(options.front()) == "none");
    CHECK(options.front().overhead == 0.0);
    for (recompute_option const& o : options) CHECK(o.method == recompute_method::none);
    check_options(in, options);
  }
  // At the least any set needs, some set fits and some does not; below it, none; at the most,
  // every one.
  in.budget_bytes = lo;
  auto const at_lo = selective_options(in);
  CHECK(std::any_of(at_lo.begin(), at_lo.end(), [](auto const& o) { return o.fits; }));
  CHECK(!std::all_of(at_lo.begin(), at_lo.end(), [](auto const& o) { return o.fits; }));
  in.budget_bytes = lo - 1;
  for (recompute_option const& o : selective_options(in)) CHECK(!o.fits);
  in.budget_bytes = hi;
  for (recompute_option const& o : selective_options(in)) CHECK(o.fits);
  // in.step's own recomputation, full or selective, is ignored.
  auto const plain = least_error_recompute(selective_options(in), 1.0);
  REQUIRE(plain.has_value());
  in.step.selective = {.mlp = true};
  CHECK(name_of(*least_error_recompute(selective_options(in), 1.0)) == name_of(*plain));
  in.step.selective = {};
  in.step.recompute = recompute_method::uniform;
  in.step.recompute_layers = 1;
  CHECK(name_of(*least_error_recompute(selective_options(in), 1.0)) == name_of(*plain));
  CHECK_THROWS_AS(least_error_recompute(selective_options(in), -0.1), agoq::invalid_argument);
  CHECK_THROWS_AS(
      least_error_recompute(selective_options(in), std::numeric_limits<double>::quiet_NaN()),
      agoq::invalid_argument);
  in.budget_bytes = 0;
  CHECK_THROWS_AS(selective_options(in), agoq::invalid_argument);
}

TEST_CASE("selective_options of a mixture-of-experts model: its modules' sets") {
  // 4 experts of 128, 2 a token, on 4 layers over 2 stages; the default policy.
  planner_input in = small_input();
  in.model = {block_style::llama, 4, 256, 0, 4, 2, 0, 1000, false, 4, 2, 128};
  in.policy = policy_table{};
  in.budget_bytes = std::int64_t{1} << 40;
  std::vector<recompute_option> options = selective_options(in);
  // core_attn and layernorm with none, moe_act or moe: 12 sets, no mlp.
  REQUIRE(options.size() == 12);
  std::vector<std::string> names;
  for (recompute_option const& o : options) names.push_back(name_of(o));
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{
                     "core_attn", "core_attn,layernorm", "core_attn,layernorm,moe",
                     "core_attn,layernorm,moe_act", "core_attn,moe", "core_attn,moe_act",
                     "layernorm", "layernorm,moe", "layernorm,moe_act", "moe", "moe_act", "none"});
  check_options(in, options);
  // moe_act adds no products (an elementwise SwiGLU); moe the whole MLP's forward.
  layer_flops const fl = layer_forward_flops(in.model, in.parallel, in.step);
  CHECK(recompute_flops(fl, {.moe_act = true}) == 0.0);
  CHECK(recompute_flops(fl, {.moe = true}) == fl.mlp);
  CHECK(recompute_flops(fl, {.core_attn = true, .moe = true}) == fl.core_attention + fl.mlp);
  // With gated shared experts of 256: 20 sets (shared_experts, alone or with moe_act, and not
  // with moe, which recomputes them too); shared_experts adds their products and their gate's,
  // 6 T h f + 2 T h.
  in.model.shared_expert_ffn = 256;
  in.model.shared_expert_gate = true;
  options = selective_options(in);
  REQUIRE(options.size() == 20);
  check_options(in, options);
  layer_flops const sf = layer_forward_flops(in.model, in.parallel, in.step);
  CHECK(sf.shared_experts == 6.0 * 128 * 256 * 256 + 2.0 * 128 * 256);
  CHECK(recompute_flops(sf, {.shared_experts = true}) == sf.shared_experts);
  CHECK(recompute_flops(sf, {.moe = true, .shared_experts = true}) == sf.mlp);
  CHECK(layer_forward_flops(small_input().model, {}, small_input().step).shared_experts == 0.0);
  // recompute_options: the 20 sets, block 1 and uniform 1 .. 2 (2 layers a stage).
  CHECK(recompute_options(in).size() == 23);
}

TEST_CASE("recompute_options: the sets of modules and every full recomputation") {
  // 16 layers on 4 stages, chunks of 4: 8 sets, block 1 .. 3, uniform 1 .. 4.
  planner_input in = small_input();
  in.model.layers = 16;
  in.parallel.pp = 4;
  in.policy = policy_table{};
  std::vector<std::int64_t> needs;
  for (recompute_option const& o : [&] {
         planner_input big = in;
         big.budget_bytes = agoq::max_size_count;
         return recompute_options(big);
       }())
    needs.push_back(o.peak_bytes);
  std::sort(needs.begin(), needs.end());
  REQUIRE(needs.front() < needs.back());
  for (std::int64_t const budget : {needs.front(), needs[needs.size() / 2], needs.back()}) {
    CAPTURE(budget);
    in.budget_bytes = budget;
    std::vector<recompute_option> const options = recompute_options(in);
    REQUIRE(options.size() == 7 + 2 * 4);
    check_options(in, options);
    // The sets are selective_options' own, with the same figures.
    std::vector<recompute_option> const sets = selective_options(in);
    for (recompute_option const& s : sets) {
      CAPTURE(name_of(s));
      auto const it = std::find_if(options.begin(), options.end(),
                                   [&](auto const& o) { return name_of(o) == name_of(s); });
      REQUIRE(it != options.end());
      CHECK(it->overhead == s.overhead);
      CHECK(it->fits == s.fits);
      CHECK(it->error == s.error);
      CHECK(it->peak_bytes == s.peak_bytes);
    }
    std::vector<std::string> full;
    for (recompute_option const& o : options) {
      if (o.method == recompute_method::none) continue;
      full.push_back(name_of(o));
      // Every layer recomputed leaves nothing to quantize.
      if (o.method == recompute_method::uniform && o.fits) CHECK(o.error == 0.0);
    }
    // Ordered by overhead: block N grows with N, then uniform's are tied, in order of N.
    CHECK(full == std::vector<std::string>{"block 1", "block 2", "block 3", "uniform 1",
                                           "uniform 2", "uniform 3", "uniform 4"});
    // The least error within every cap is found among all of them.
    auto const best = least_error_recompute(in, 1.0);
    auto const want = least_error_recompute(options, 1.0);
    REQUIRE(best.has_value() == want.has_value());
    if (best) CHECK(name_of(*best) == name_of(*want));
  }
  // Where only full recomputation fits, the least error is a full one.
  in.budget_bytes = needs.front();
  auto const best = least_error_recompute(in, 1.0);
  REQUIRE(best.has_value());
  CHECK(best->method != recompute_method::none);
  in.budget_bytes = needs.front() - 1;
  CHECK(!least_error_recompute(in, 1.0).has_value());
  // in.step's own recomputation is ignored.
  in.budget_bytes = needs.back();
  auto const plain = least_error_recompute(in, 0.2);
  REQUIRE(plain.has_value());
  in.step.recompute = recompute_method::block;
  in.step.recompute_layers = 2;
  CHECK(name_of(*least_error_recompute(in, 0.2)) == name_of(*plain));
  // Uneven stages, 2 layers on the first and the last device, 6 on each other: block 1 .. 5 and
  // uniform 1 .. 6, N up to the largest chunk (the small chunks recompute all of theirs).
  in.step.recompute = recompute_method::none;
  in.step.recompute_layers = 0;
  in.parallel.first_stage_layers = 2;
  in.parallel.last_stage_layers = 2;
  std::vector<recompute_option> const uneven = recompute_options(in);
  REQUIRE(uneven.size() == 7 + 2 * 6);
  check_options(in, uneven);
  // The embedding and the loss counted in the split of 14 layers: 3, 4, 4, 3; block 1 .. 3 and
  // uniform 1 .. 4.
  in.parallel.first_stage_layers = in.parallel.last_stage_layers = 0;
  in.parallel.account_for_embedding = in.parallel.account_for_loss = true;
  in.model.layers = 14;
  std::vector<recompute_option> const counted = recompute_options(in);
  REQUIRE(counted.size() == 7 + 2 * 4);
  check_options(in, counted);
  in.budget_bytes = agoq::max_size_count + 1;
  CHECK_THROWS_AS(recompute_options(in), agoq::invalid_argument);
}

TEST_CASE("ZeRO-3's gathered weights count against the budget") {
  planner_input in = small_input();
  in.policy = policy_table{};
  in.parallel.dp = 2;
  in.parallel.zero_stage = 3;
  auto const need = minimum(in);
  std::int64_t const worst = std::max(need[0], need[1]);
  in.budget_bytes = worst;
  auto const plan = make_plan(in);
  for (auto const& sp : plan.stages()) {
    CHECK(sp.memory.gathered_weights > 0);
    CHECK(sp.memory.total() <= in.budget_bytes);
  }
  // One byte less than the gathered weights need fails, naming the shortfall.
  in.budget_bytes = worst - 1;
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("falls short by 1 bytes"),
                       agoq::invalid_argument);
}

TEST_CASE("an infeasible budget says by how much it falls short") {
  planner_input in = small_input();
  in.policy = policy_table{};
  auto const need = minimum(in);
  std::int64_t const worst = std::max(need[0], need[1]);
  std::int64_t const stage = need[0] >= need[1] ? 0 : 1;
  in.budget_bytes = worst - 1000;
  std::string const expected =
      "falls short by 1000 bytes on pipeline stage " + std::to_string(stage);
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains(expected.c_str()), agoq::invalid_argument);
  // The same figures, as data: the device, what it needs (smallest_memory's) and the message.
  auto const short_of = find_shortfall(in);
  REQUIRE(short_of.has_value());
  CHECK(short_of->stage == stage);
  CHECK(short_of->bytes() == 1000);
  CHECK(short_of->budget_bytes == worst - 1000);
  stage_memory const least = smallest_memory(in)[static_cast<std::size_t>(stage)];
  CHECK(short_of->need.total() == least.total());
  CHECK(short_of->need.activations == least.activations);
  CHECK(short_of->need.states() == least.states());
  CHECK(short_of->message() ==
        "the budget of " + std::to_string(worst - 1000) +
            " bytes falls short by 1000 bytes on "
            "pipeline stage " +
            std::to_string(stage) + " (it needs " + std::to_string(worst) + " bytes: " +
            std::to_string(least.states()) + " of weights, gradients and optimizer states, " +
            std::to_string(least.transient()) + " of transient working memory and " +
            std::to_string(least.activations + least.head_activations) +
            " of activations with every saved tensor at its smallest candidate)");
  std::string const thrown = "agoq: planner: " + short_of->message();
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains(thrown.c_str()), agoq::invalid_argument);
  in.budget_bytes = worst;
  CHECK(!find_shortfall(in).has_value());
  CHECK_NOTHROW(make_plan(in));
  in.budget_bytes = 0;
  CHECK_THROWS_AS(make_plan(in), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(find_shortfall(in), doctest::Contains("budget must be positive"),
                       agoq::invalid_argument);
}

TEST_CASE("a budget that holds the activations but not the transient memory is refused") {
  // small_input's layers: the flash-attention phase of the backward is their largest working set,
  // 526,336 bytes on both stages whatever the storage (memory_model_test, "transient working
  // memory of a layer, by hand"); the head's, 321,536, is smaller. fp32 gradients need no
  // buffers, and no allowance is reserved here.
  planner_input in = small_input();
  in.policy = policy_table{};
  in.step.reserved_bytes = 0;
  auto const need = minimum(in);
  std::int64_t const stage = need[0] >= need[1] ? 0 : 1;
  std::int64_t const worst = need[static_cast<std::size_t>(stage)];
  std::int64_t const transient = 526336;
  auto const m = estimate_memory(in.model, in.parallel, in.step, in.states, in.policy);
  CHECK(m[static_cast<std::size_t>(stage)].transient() == transient);
  std::int64_t const states = m[static_cast<std::size_t>(stage)].states();
  // Room for the states and the smallest activations, none for the working memory.
  in.budget_bytes = worst - transient;
  std::string const expected = "falls short by " + std::to_string(transient) +
                               " bytes on pipeline stage " + std::to_string(stage) + " (it needs " +
                               std::to_string(worst) + " bytes: " + std::to_string(states) +
                               " of weights, gradients and optimizer states, " +
                               std::to_string(transient) + " of transient working memory and " +
                               std::to_string(worst - states - transient) + " of activations";
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains(expected.c_str()), agoq::invalid_argument);
  in.budget_bytes = worst;
  auto const plan = make_plan(in);
  CHECK(plan.stages()[static_cast<std::size_t>(stage)].memory.transient() == transient);
  CHECK(plan.stages()[static_cast<std::size_t>(stage)].unused_bytes == 0);
  // The allowance counts against the budget like the rest.
  in.step.reserved_bytes = 1000;
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("falls short by 1000 bytes"),
                       agoq::invalid_argument);
}

TEST_CASE("the planner reserves the dequantized buffers its candidates may need") {
  // One stage, four layers; TP 2 with SP, where the gate/up phase is the largest working set
  // and mlp_input's bf16 copy, 2 T h = 2 x 32 x 128 = 8,192 bytes, adds to it when that tensor is
  // quantized (memory_model_test: 8,192 + 90,112, or + 8,192 more). Only mlp_input may be int8.
  planner_input in;
  in.model = {block_style::llama, 4, 128, 448, 4, 2, 32, 1000, false};
  in.parallel.tp = 2;
  in.parallel.sp = true;
  in.step = {1, 64, 0};
  in.step.reserved_bytes = 0;
  in.policy = policy_table::all_precise();
  in.policy.set(tensor_kind::mlp_input, storage::with(int8_g128),
                {storage::with(int8_g128), storage::precise()});
  std::int64_t const precise = peak_total(
      estimate_memory(in.model, in.parallel, in.step, in.states, policy_table::all_precise()));
  auto const quantized = estimate_memory(in.model, in.parallel, in.step, in.states, in.policy);
  CHECK(quantized[0].working == 8192 + 90112 + 8192);
  // The all-precise plan would fit this budget exactly, but the planner holds back the buffer
  // the int8 candidate would need: each upgrade costs 8,192 - 4,224 = 3,968 bytes, and of the
  // 4 x 3,968 = 15,872 bytes between the smallest and the all-precise activations the
  // reservation leaves 7,680, room for one.
  in.budget_bytes = precise;
  auto const short_plan = make_plan(in);
  int int8 = 0;
  for (auto const& t : short_plan.stages()[0].tensors)
    if (!t.choice.is_precise()) ++int8;
  CHECK(int8 == 3);
  CHECK(short_plan.stages()[0].memory.working == 8192 + 90112 + 8192);
  // 8,192 bytes more and every tensor is precise; the plan reports the working memory it needs,
  // which leaves the reservation unused.
  in.budget_bytes = precise + 8192;
  auto const full = make_plan(in);
  for (auto const& t : full.stages()[0].tensors) CHECK(t.choice.is_precise());
  CHECK(full.stages()[0].memory.working == 8192 + 90112);
  CHECK(full.stages()[0].unused_bytes == 8192);
}

TEST_CASE("the planner is deterministic") {
  planner_input in;
  in.model = preset_model("llama3-8b");
  in.parallel = {2, 4, 4, 1, 1, true};
  in.step = {1, 8192, 0};
  in.states.gradients = gradient_format::int8_g128;
  in.budget_bytes = std::int64_t{16} << 30;
  auto const a = make_plan(in);
  auto const b = make_plan(in);
  REQUIRE(a.stages().size() == b.stages().size());
  for (std::size_t s = 0; s < a.stages().size(); ++s) {
    auto const& x = a.stages()[s];
    auto const& y = b.stages()[s];
    CHECK(x.memory.total() == y.memory.total());
    CHECK(x.error == y.error);
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (std::size_t i = 0; i < x.tensors.size(); ++i) {
      CHECK(x.tensors[i].choice == y.tensors[i].choice);
      CHECK(x.tensors[i].layer == y.tensors[i].layer);
    }
  }
}

TEST_CASE("128 layers on 16 stages completes") {
  planner_input in;
  in.model = {block_style::llama, 128, 8192, 28672, 64, 8, 128, 128256, false};
  in.parallel = {8, 16, 4, 1, 1, true};
  in.step = {1, 8192, 64};
  in.states.gradients = gradient_format::int8_g128;
  in.budget_bytes = std::int64_t{40} << 30;
  auto const plan = make_plan(in);
  CHECK(plan.stages().size() == 16);
  std::size_t tensors = 0;
  for (auto const& s : plan.stages()) {
    tensors += s.tensors.size();
    CHECK(s.memory.total() <= in.budget_bytes);
  }
  CHECK(tensors == 128 * 12);
}

TEST_CASE("budgets and weighted bytes past 64-bit counts: refused or counted, never wrapped") {
  planner_input in;
  in.model = preset_model("llama3-8b");
  in.parallel.pp = 4;
  in.parallel.virtual_stages = 2;
  in.step = {1, 8192, 0};
  // The largest budget: every tensor fits in bf16 on every stage, error 0. The rooms of a
  // device's several peak moments, summed for the relaxation, used to wrap around 2^64 and stop
  // the plan early: stages 1 and 2 came out quantized (error 7.676) with exabytes unused.
  in.budget_bytes = agoq::max_size_count;
  auto const plan = make_plan(in);
  for (auto const& s : plan.stages()) {
    CHECK(s.error == 0);
    CHECK(s.error_lower_bound == 0);
    for (auto const& t : s.tensors) CHECK(t.choice.is_precise());
  }
  in.budget_bytes = agoq::max_size_count + 1;
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("at most 2^62 bytes"),
                       agoq::invalid_argument);
  in.budget_bytes = std::numeric_limits<std::int64_t>::max();
  CHECK_THROWS_AS(make_plan(in), agoq::invalid_argument);
  // 96 peak moments a device (128 layers over 2 x 64 chunks, groups of 10^6 of 1.5 x 10^6
  // micro-batches, up to 63 x 10^6 in flight): each tensor's bytes times its copies over them
  // could reach 6.9 x 10^18 > 2^62. Estimated (about 2^54.7 bytes a device), refused by the
  // planner.
  in.model.layers = 128;
  in.parallel.pp = 2;
  in.parallel.virtual_stages = 64;
  in.parallel.vp_group = 1'000'000;
  in.step.micro_batches = 1'500'000;
  in.budget_bytes = agoq::max_size_count;
  CHECK_NOTHROW(estimate_memory(in.model, in.parallel, in.step, in.states, in.policy));
  CHECK_THROWS_WITH_AS(make_plan(in), doctest::Contains("96 peak moments"), agoq::invalid_argument);
}
