#include <agoq/activation/memory_model.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <numeric>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

using namespace agoq::activation;

namespace {
/// What one layer of the by-hand tests' LLaMA shape (hidden 256, ffn 512, 4 heads, 2 KV heads of
/// 64) saves in bf16 for one micro-batch of 128 tokens: six [128, 256] and three [128, 512]
/// tensors, two [128, 128] (K and V) and the fp32 logsumexp of 4 heads ("activations of a whole
/// pipeline, by hand" checks it against layer_activation_bytes).
constexpr std::int64_t small_layer_bytes =
    128 * (6 * 256 * 2 + 2 * 128 * 2 + 3 * 512 * 2) + 4 * 128 * 4;

/// Checks that `p` is refused for `m` with a message containing `why`.
void check_refused(parallel_config const& p, model_shape const& m, char const* why) {
  CAPTURE(why);
  CHECK_THROWS_WITH_AS(p.validate(m), doctest::Contains(why), agoq::invalid_argument);
}

/// Where place_of puts each layer of `m` under `p` (with v = 2 chunks a device), as 2 x stage +
/// chunk.
std::vector<std::int64_t> places(model_shape const& m, parallel_config const& p) {
  std::vector<std::int64_t> where;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    layer_place const at = place_of(l, m, p);
    where.push_back(at.stage * 2 + at.chunk);
  }
  return where;
}

std::int64_t total_parameters(std::vector<stage_memory> const& s) {
  std::int64_t n = 0;
  for (auto const& x : s) n += x.parameters;
  return n;
}

/// What a unit-by-unit replay of one device's schedule finds.
struct replayed {
  std::int64_t peak = 0;                         ///< the most chunk units alive at once
  std::vector<std::int64_t> chunk_max;           ///< the most each chunk holds at once
  std::vector<std::vector<std::int64_t>> peaks;  ///< counts per chunk of the moments no other
                                                 ///< moment matches or exceeds in every chunk
};

/// Megatron-Core's schedule table (get_schedule_table): the (micro-batch, chunk) of each forward
/// unit of a device. Groups of g micro-batches start at 0, g, 2g, ...; each goes through chunk 0,
/// then chunk 1, ...; the group that reaches m is the last and takes all that is left.
std::vector<std::pair<std::int64_t, std::int64_t>> schedule_table(std::int64_t m, std::int64_t v,
                                                                  std::int64_t g) {
  std::vector<std::pair<std::int64_t, std::int64_t>> table;
  for (std::int64_t first = 0; first < m; first += g) {
    std::int64_t const end = first + g >= m ? m : first + g;
    for (std::int64_t c = 0; c < v; ++c)
      for (std::int64_t mb = first; mb < end; ++mb) table.emplace_back(mb, c);
  }
  return table;
}

/// Replays device `s` of Megatron's schedule for m micro-batches (p devices, v chunks each,
/// groups of g) as forward_backward_pipelining_{without,with}_interleaving runs it: `warmup`
/// forward units (get_pp_rank_microbatches), then one forward and one backward unit per step,
/// then the remaining backward units. Forward unit k runs the table's (micro-batch, chunk) k;
/// backward unit k runs chunk v - 1 - table chunk k and pops that chunk's oldest saved
/// micro-batch, which must exist and be the table's micro-batch k. Counts the chunk units alive
/// (forward done, backward not yet) after every unit.
replayed replay(std::int64_t p, std::int64_t v, std::int64_t s, std::int64_t m, std::int64_t g,
                interleaved_rules rules = interleaved_rules::megatron_core) {
  auto const table = schedule_table(m, v, v == 1 ? 1 : g);
  std::int64_t const total = m * v;
  REQUIRE(static_cast<std::int64_t>(table.size()) == total);
  std::int64_t warmup = v == 1 ? p - s - 1 : 2 * (p - s - 1) + (v - 1) * g;
  if (v > 1 && rules == interleaved_rules::megatron_legacy && m == p) warmup = total;
  warmup = std::min(warmup, total);
  std::vector<std::deque<std::int64_t>> saved(static_cast<std::size_t>(v));
  std::vector<std::int64_t> alive(static_cast<std::size_t>(v), 0);
  std::set<std::vector<std::int64_t>> moments;
  auto forward = [&](std::int64_t k) {
    auto const [mb, c] = table[static_cast<std::size_t>(k)];
    saved[static_cast<std::size_t>(c)].push_back(mb);
    ++alive[static_cast<std::size_t>(c)];
    moments.insert(alive);
  };
  auto backward = [&](std::int64_t k) {
    auto const [mb, c] = table[static_cast<std::size_t>(k)];
    auto const chunk = static_cast<std::size_t>(v - 1 - c);
    REQUIRE(!saved[chunk].empty());  // a backward never runs before its forward
    CHECK(saved[chunk].front() == mb);
    saved[chunk].pop_front();
    --alive[chunk];
    moments.insert(alive);
  };
  for (std::int64_t k = 0; k < warmup; ++k) forward(k);
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (std::int64_t i = total - warmup; i < total; ++i) backward(i);
  CHECK(std::all_of(alive.begin(), alive.end(), [](std::int64_t n) { return n == 0; }));

  replayed r;
  r.chunk_max.assign(static_cast<std::size_t>(v), 0);
  for (auto const& x : moments) {
    r.peak = std::max(r.peak, std::accumulate(x.begin(), x.end(), std::int64_t{0}));
    for (std::size_t c = 0; c < x.size(); ++c) r.chunk_max[c] = std::max(r.chunk_max[c], x[c]);
    bool const covered = std::any_of(moments.begin(), moments.end(), [&](auto const& y) {
      return y != x && std::equal(x.begin(), x.end(), y.begin(), std::less_equal<>());
    });
    if (!covered) r.peaks.push_back(x);  // in sorted order, as the set holds them
  }
  return r;
}

/// Whether Megatron-Core accepts m micro-batches in groups of g on p devices (v > 1).
bool core_accepts(std::int64_t p, std::int64_t m, std::int64_t g) {
  return g >= p && g <= m && (m % g == 0 || m % g >= p);
}

std::vector<std::vector<std::int64_t>> sorted(std::vector<std::vector<std::int64_t>> x) {
  std::sort(x.begin(), x.end());
  return x;
}

/// Whether counts q lie on the segment from a to b: q = a + t (b - a) for a t in [0, 1].
bool on_segment(std::vector<std::int64_t> const& q, std::vector<std::int64_t> const& a,
                std::vector<std::int64_t> const& b) {
  // t = num / den from the first chunk where a and b differ; every chunk must agree with it.
  std::int64_t num = 0;
  std::int64_t den = 0;
  for (std::size_t c = 0; c < q.size() && den == 0; ++c)
    if (b[c] != a[c]) {
      num = q[c] - a[c];
      den = b[c] - a[c];
    }
  if (den == 0) return q == a;
  if (den < 0) {
    num = -num;
    den = -den;
  }
  if (num < 0 || num > den) return false;
  for (std::size_t c = 0; c < q.size(); ++c)
    if ((q[c] - a[c]) * den != num * (b[c] - a[c])) return false;
  return true;
}
}  // namespace

TEST_CASE("parameter counts match the published models") {
  step_config const st{1, 4096, 0};
  auto const l8 = estimate_memory(preset_model("llama3-8b"), {}, st, {}, policy_table{});
  CHECK(total_parameters(l8) == 8030261248);  // LLaMA-3-8B
  auto const l70 = estimate_memory(preset_model("llama3-70b"), {}, st, {}, policy_table{});
  CHECK(total_parameters(l70) == 70553706496);  // LLaMA-3-70B
  // LLaMA-3.1-405B, also on Meta's 16 uneven pipeline stages (7, 14 x 8, 7 layers).
  model_shape const l405 = preset_model("llama3-405b");
  CHECK(total_parameters(estimate_memory(l405, {}, st, {}, policy_table{})) == 405853388800);
  parallel_config meta;
  meta.pp = 16;
  meta.first_stage_layers = 7;
  meta.last_stage_layers = 7;
  auto const stages = estimate_memory(l405, meta, st, {}, policy_table{});
  CHECK(total_parameters(stages) == 405853388800);
  CHECK(stages[0].layers == 7);
  CHECK(stages[1].layers == 8);
  CHECK(stages[15].layers == 7);
  // Qwen-2.5-32B has 32,763,876,352 with its QKV biases (64 x 7168), which agoq does not model.
  auto const q = estimate_memory(preset_model("qwen2.5-32b"), {}, st, {}, policy_table{});
  CHECK(total_parameters(q) == 32763876352 - 64 * 7168);
  // Qwen3-8B and Qwen3-32B (8.19 B and 32.76 B; 6.95 B and 31.21 B without the embeddings), the
  // QK-norm's weights (2 x 128) in each layer.
  auto const q8 = estimate_memory(preset_model("qwen3-8b"), {}, st, {}, policy_table{});
  CHECK(total_parameters(q8) == 8190735360);
  CHECK(total_parameters(q8) - 2 * 151936 * 4096 == 6946075648);
  auto const q32 = estimate_memory(preset_model("qwen3-32b"), {}, st, {}, policy_table{});
  CHECK(total_parameters(q32) == 32762123264);
  CHECK(layer_parameters(preset_model("qwen3-8b"), 1) == 192946432);
  CHECK(layer_parameters(preset_model("qwen3-8b"), 8) ==
        (4096 * 512 * 2 + 4096 * 128 * 2 + 3 * 4096 * 1536 + 2 * 4096 + 2 * 128));
  CHECK(layer_parameters(preset_model("llama3-8b"), 1) == 218112000);
  CHECK(layer_parameters(preset_model("llama3-8b"), 4) ==
        (4096 * 1024 * 2 + 4096 * 256 * 2 + 3 * 4096 * 3584 + 2 * 4096));
}

TEST_CASE("Qwen3: LLaMA's memory and the QK-norm's, by hand") {
  // The same shape as a LLaMA-style and as a Qwen3-style block, 4 stages of 9 layers, TP 2 + SP:
  // each layer also keeps Q and K before the QK-norm, bf16 (attention core) under the default
  // policy, [T, 4096 / 2] and [T, 1024 / 2], and its weights (replicated over TP) 2 x 128 more.
  model_shape const q = preset_model("qwen3-8b");
  model_shape l = q;
  l.style = block_style::llama;
  parallel_config p;
  p.pp = 4;
  p.tp = 2;
  p.sp = true;
  step_config const st{1, 4096, 0};
  for (bool const baseline : {true, false}) {
    policy_table const policy = baseline ? policy_table::all_precise() : policy_table{};
    auto const a = estimate_memory(q, p, st, {}, policy);
    auto const b = estimate_memory(l, p, st, {}, policy);
    for (std::size_t s = 0; s < a.size(); ++s) {
      CAPTURE(s);
      std::int64_t const in_flight = 4 - static_cast<std::int64_t>(s);  // 1F1B, full pipeline
      CHECK(a[s].activations - b[s].activations == in_flight * 9 * 2 * 4096 * (2048 + 512));
      CHECK(a[s].parameters - b[s].parameters == 9 * 2 * 128);
      // The QK-norm's backward phase, 2 T (q + 2k) + 2 T (q + k) = 2 T (2q + 3k), is below the
      // flash attention's.
      CHECK(a[s].working == b[s].working);
    }
  }
  // Quantized (a policy may allow it), they are read dequantized in the QK-norm's backward,
  // whose phase is then the largest where K is as wide as Q (no grouped-query attention) and the
  // MLP narrow: T0 = 4096, q = k = h = f = 1024, no SP; R = 2 T0 h; flash attention 2 T0 q +
  // 2 T0 (q + 2k) + 4 T0 q + L (L = 8 heads x 4096 x 4 bytes); QK-norm 2 T0 (q + 2k) +
  // 2 T0 (q + k) + 2 T0 q + 2 T0 k.
  model_shape const mha{block_style::qwen3, 2, 1024, 1024, 8, 8, 128, 1000};
  shard_shape const sh{1, 4096, 1, false};
  auto const qk_inputs = [](tensor_kind k) {
    return k == tensor_kind::query_norm_input || k == tensor_kind::key_norm_input;
  };
  std::int64_t const t0 = 4096;
  std::int64_t const flash = 12 * t0 * 1024 + 8 * 4096 * 4;
  CHECK(layer_working_bytes(mha, sh, qk_inputs) == 2 * t0 * 1024 + 14 * t0 * 1024);
  CHECK(layer_working_bytes(mha, sh, [](tensor_kind) { return false; }) == 2 * t0 * 1024 + flash);
  model_shape mha_llama = mha;
  mha_llama.style = block_style::llama;
  CHECK(layer_working_bytes(mha_llama, sh, [](tensor_kind) { return false; }) ==
        2 * t0 * 1024 + flash);
}

TEST_CASE("mixture-of-experts models: parameters, states, activations and working memory") {
  step_config const st{1, 4096, 0};
  // Total parameters as published (46.7 B, 30.5 B, 235 B; with shared experts 14.3 B and 57.4 B,
  // QKV biases not counted), and the active ones: the dense part (shared experts included) and
  // k / e of the routed experts (12.9 B, 3.3 B, 22 B; 2.7 B, 2.0 B of them outside the
  // embeddings, and 14 B).
  struct published {
    char const* name;
    std::int64_t total;
    std::int64_t active;
  };
  for (published const& x : {published{"mixtral-8x7b", 46702792704, 12879925248},
                             published{"qwen3-30b-a3b", 30532122624, 3353032704},
                             published{"qwen3-235b-a22b", 235093634560, 22190763520},
                             published{"qwen1.5-moe-a2.7b", 14315636736, 2689026048},
                             published{"qwen2-57b-a14b", 57408529920, 14249141760}}) {
    CAPTURE(x.name);
    model_shape const m = preset_model(x.name);
    auto const s = estimate_memory(m, {}, st, {}, policy_table{})[0];
    CHECK(s.parameters == x.total);
    CHECK(s.parameters - s.expert_parameters +
              s.expert_parameters / m.experts * m.experts_per_token ==
          x.active);
  }
  // Mixtral's layer: attention 2 x 4096^2 + 2 x 4096 x 1024, two norms, the router 4096 x 8, and
  // 8 experts of 3 x 4096 x 14336.
  model_shape const m = preset_model("mixtral-8x7b");
  std::int64_t const attention = 2 * 4096 * 4096 + 2 * 4096 * 1024;
  CHECK(layer_parameters(m, 1) == attention + 2 * 4096 + 4096 * 8);
  CHECK(expert_layer_parameters(m, {}) == 8 * 3 * std::int64_t{4096} * 14336);

  // TP 2 + SP, EP 4, ETP 1, DP 4, PP 4, ZeRO-1: 8 ranks a stage, expert data parallelism 2. A rank
  // holds half the attention, the router and both norms whole, and 2 whole experts.
  parallel_config p;
  p.tp = 2;
  p.sp = true;
  p.pp = 4;
  p.dp = 4;
  p.ep = 4;
  p.etp = 1;
  p.zero_stage = 1;
  CHECK(p.expert_gradient_ranks() == 2);
  std::int64_t const dense_layer = attention / 2 + 2 * 4096 + 4096 * 8;
  std::int64_t const expert_layer = 2 * 3 * std::int64_t{4096} * 14336;
  CHECK(layer_parameters(m, 2) == dense_layer);
  CHECK(expert_layer_parameters(m, p) == expert_layer);
  auto const stages = estimate_memory(m, p, st, {}, policy_table{});
  std::int64_t const embedding = 16000 * 4096;  // 32000 rows over TP 2
  auto const ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    stage_memory const& s = stages[r];
    std::int64_t const dense =
        8 * dense_layer + (r == 0 ? embedding : 0) + (r == 3 ? embedding + 4096 : 0);
    CHECK(s.expert_parameters == 8 * expert_layer);
    CHECK(s.parameters == dense + 8 * expert_layer);
    // ZeRO-1: master weights and moments over dp x cp = 4 (dense), over 2 (experts).
    std::int64_t const shard = ceil_div(dense, 4) + 8 * expert_layer / 2;
    CHECK(s.weights == 2 * s.parameters);
    CHECK(s.master_weights == 4 * shard);
    CHECK(s.optimizer == 8 * shard);
    CHECK(s.gradients == 4 * s.parameters);
  }
  // A capacity factor of 1.25 (Megatron-Core's, padded): each of the 8 experts takes
  // ceil(4096 / 8 x 1.25) = 640 of a rank's 2048 x 2 pairs, R = 5120 against the mean's 4096, in
  // each of a stage's 8 layers and in-flight micro-batches (1F1B: 4 - r).
  step_config capped = st;
  capped.expert_capacity_factor = 1.25;
  policy_table const bf16 = policy_table::all_precise();
  auto const padded = estimate_memory(m, p, capped, {}, bf16);
  auto const mean = estimate_memory(m, p, st, {}, bf16);
  for (std::size_t r = 0; r < 4; ++r)
    CHECK(padded[r].activations - mean[r].activations ==
          static_cast<std::int64_t>(4 - r) * 8 * (5120 - 4096) * (4096 + 3 * 14336) * 2);
  // ZeRO-3 gathers a whole layer, its experts included, on a middle stage.
  p.zero_stage = 3;
  CHECK(estimate_memory(m, p, st, {}, policy_table{})[1].gathered_weights ==
        2 * 2 * (dense_layer + expert_layer));
  p.zero_stage = 1;

  // 8-bit gradients: each group stages a bucket and runs its own collective. The experts' largest
  // weight is an expert's gate and up, 2 x 14336 x 4096, larger than the default bucket.
  CHECK(largest_expert_matrix(m, p) == 2 * 14336 * 4096);
  state_formats const agoq{gradient_format::int8_g128, optimizer_format::int8_g128};
  step_config big = st;
  big.bucket_parameters = 200'000'000;
  auto const eight = estimate_memory(m, p, big, agoq, policy_table{});
  std::int64_t const dense1 = eight[1].parameters - eight[1].expert_parameters;
  CHECK(eight[1].gradient_buffers == gradient_buffer_bytes(m, p, big, agoq.gradients, dense1) +
                                         gradient_buffer_bytes(m, p, big, agoq.gradients,
                                                               eight[1].expert_parameters,
                                                               parameter_group::experts));
  // The experts' bucket is reduced over the 2 ranks of their data-parallel group, the dense one's
  // over dp = 4 (reduce-scatters under ZeRO-1).
  std::int64_t const n = 200'000'000;
  CHECK(
      gradient_buffer_bytes(m, p, big, agoq.gradients, 400'000'000, parameter_group::experts) ==
      2 * n +
          agoq::gradient::collective_workspace(agoq::gradient::chunk_plan(n, 128, 2), false).total);
  CHECK(
      gradient_buffer_bytes(m, p, big, agoq.gradients, 400'000'000) ==
      2 * n +
          agoq::gradient::collective_workspace(agoq::gradient::chunk_plan(n, 128, 4), false).total);
  CHECK(bucket_parameters(m, p, st, 400'000'000, parameter_group::experts) == 2 * 14336 * 4096);

  // Saved tensors per token of one layer in bf16, TP 1: the attention's as LLaMA-3-8B's (2
  // residual, 2 norm outputs, Q, O of 4096 and K, V of 1024, bf16, and 32 heads' fp32
  // logsumexp), the router's 8 fp32 probabilities, and for each of the 2 experts of the token its
  // input (4096) and gate, up and SwiGLU outputs (3 x 14336).
  shard_shape const one{1, 4096, 1, false};
  auto const precise = [](tensor_kind) { return storage::precise(); };
  std::int64_t const per_token =
      6 * 4096 * 2 + 2 * 1024 * 2 + 32 * 4 + 8 * 4 + 2 * (4096 + 3 * 14336) * 2;
  CHECK(per_token == 241824);
  CHECK(layer_activation_bytes(m, one, precise) == 4096 * per_token);
  // Under TP 2 + SP with etp = tp: each rank's 2048 tokens' pairs (4096) gathered over 2 ranks
  // (8192) at half the width; the experts' inner tensors weigh tokens k f_e / tp either way.
  shard_shape const sp2{1, 4096, 2, true};
  CHECK(layer_activation_bytes(m, sp2, precise) == 2048 * (4 * 4096 * 2 + 8 * 4) +
                                                       4096 * (2 * 4096 + 2 * 512 * 2 + 16 * 4) +
                                                       8192 * (4096 + 3 * 7168) * 2);

  // The working set, TP 1, every tensor precise: R = 8192 pairs of 14336; the experts' SwiGLU
  // backward, 6 R f_e, outweighs flash attention's 12 T q + 4 T q + L, the experts' gate and up
  // (4 R f_e + 2 R h), their down projection (2 R h + 2 R f_e) and the router's
  // (2 R h + 2 T h + 4 T e); plus the residual gradient 2 T h.
  std::int64_t const t = 4096;
  std::int64_t const r = 2 * t;
  auto const none = [](tensor_kind) { return false; };
  CHECK(layer_working_bytes(m, one, none) == 2 * t * 4096 + 6 * r * 14336);
  // Where the experts are narrow (Qwen3-30B-A3B, f_e 768 for 2048 hidden), the experts' gate and
  // up phase is the largest once their input is quantized: 4 R f_e + 2 R h + 2 R h (dequantized)
  // against the router's 2 R h + 2 T h + 4 T e + 2 T h (its input dequantized too); R = 8 T.
  model_shape const q = preset_model("qwen3-30b-a3b");
  auto const quantized = [](tensor_kind k) {
    return k == tensor_kind::expert_input || k == tensor_kind::mlp_input;
  };
  std::int64_t const rq = 8 * t;
  CHECK(layer_working_bytes(q, one, quantized) ==
        2 * t * 2048 + 4 * rq * 768 + 2 * rq * 2048 + 2 * rq * 2048);
  // The router's phase, largest with narrow heads and experts (h 256, q = k = 32, 64 experts of
  // 8, 2 a token; R = 2 T): 2 R h + 2 T h + 4 T e = 1792 T against the experts' gate and up,
  // 4 R f_e + 2 R h = 1088 T, flash attention's 12 T q + L = 392 T and the forward's combine,
  // 2 R h + 2 R h = 2048 T (without the residual gradient 512 T); with its probabilities (4 T e)
  // and input (2 T h) dequantized (a policy may allow it), 2560 T.
  model_shape narrow{block_style::llama, 2, 256, 0, 2, 2, 16, 1000, false, 64, 2, 8};
  CHECK(layer_working_bytes(narrow, one, none) == 512 * t + 1792 * t);
  auto const router = [](tensor_kind k) {
    return k == tensor_kind::router_probs || k == tensor_kind::mlp_input;
  };
  CHECK(layer_working_bytes(narrow, one, router) == 512 * t + 2560 * t);
  // 8 a token (R = 8 T): the forward's combine, the experts' output and the all-to-all's buffer,
  // 2 R h + 2 R h = 8192 T, outweighs the router's backward, 4864 T + 512 T.
  narrow.experts_per_token = 8;
  CHECK(layer_working_bytes(narrow, one, router) == 8192 * t);
  // Under expert tensor parallelism the all-to-all moves R / etp rows: TP 2 + SP, etp 2, R = T0 / 2
  // x 8 x 2 = 8 T0: 2 R h + R h = 6144 T0.
  CHECK(sp2.expert_rows(narrow) == 8 * t);
  CHECK(layer_working_bytes(narrow, sp2, none) == 6144 * t);
}

TEST_CASE("mixture-of-experts layouts Megatron-Core refuses, and what is not modelled") {
  model_shape const m = preset_model("mixtral-8x7b");
  parallel_config p;
  p.tp = 2;
  p.sp = true;
  p.dp = 4;
  p.ep = 3;
  check_refused(p, m, "ep (3) must divide the experts (8)");
  p.ep = 8;
  p.etp = 2;  // 16 ranks of experts on the 8 of a stage
  check_refused(p, m,
                "ep x etp (8 x 2) must divide the ranks of a pipeline stage, tp x cp x dp "
                "(2 x 1 x 4)");
  p.etp = 0;  // etp = tp = 2
  check_refused(p, m, "ep x etp (8 x 2) must divide");
  p.etp = -1;
  check_refused(p, m, "ep must be positive and etp >= 0");
  p.ep = 4;
  p.etp = 0;
  CHECK_NOTHROW(p.validate(m));
  CHECK(p.expert_tp() == 2);
  CHECK(p.expert_gradient_ranks() == 1);
  // A dense model has no experts to place.
  parallel_config d;
  d.ep = 2;
  check_refused(d, preset_model("llama3-8b"), "ep and etp are a mixture-of-experts model's");
  d.ep = 1;
  d.etp = 1;
  check_refused(d, preset_model("llama3-8b"), "ep and etp are a mixture-of-experts model's");
  // MoE under TP needs SP (Megatron-Core's rule).
  p.sp = false;
  CHECK_THROWS_WITH_AS(estimate_memory(m, p, {1, 4096, 0}, {}, policy_table{}),
                       doctest::Contains("with tp > 1 needs sequence parallelism"),
                       agoq::invalid_argument);
  p.sp = true;
  // Selective recomputation of `mlp` is a dense MLP's; the MoE modules are not modelled.
  step_config st{1, 4096, 0};
  st.selective.mlp = true;
  CHECK_THROWS_WITH_AS(estimate_memory(m, p, st, {}, policy_table{}),
                       doctest::Contains("mlp recomputes a dense MLP; a mixture-of-experts "
                                         "layer's are moe_act, moe and shared_experts"),
                       agoq::invalid_argument);
  // `layernorm` is: the MLP norm's output (the router's and the experts' input) computed again.
  st.selective = {};
  st.selective.layernorm = true;
  auto const a = estimate_memory(m, p, st, {}, policy_table{});
  auto const b = estimate_memory(m, p, {1, 4096, 0}, {}, policy_table{});
  shard_shape const sh{1, 4096, 2, true};
  CHECK(b[0].activations - a[0].activations ==
        32 * (policy_table{}
                  .default_storage(tensor_kind::qkv_input)
                  .bytes(shape_of(tensor_kind::qkv_input, m, sh)) +
              policy_table{}
                  .default_storage(tensor_kind::mlp_input)
                  .bytes(shape_of(tensor_kind::mlp_input, m, sh))));
}

TEST_CASE("shared experts: parameters, states, activations and working memory, by hand") {
  step_config const st{1, 4096, 0};
  // (The published totals: "mixture-of-experts models: parameters, ...".)
  // Qwen2-57B-A14B's layer: attention 2 x 3584^2 + 2 x 3584 x 512, two norms, the router
  // 3584 x 64, the shared experts 3 x 3584 x 20480 and their gate 3584; the routed experts
  // 64 x 3 x 3584 x 2560. Under TP 2 the attention and the shared experts are halved, the rest
  // replicated.
  model_shape const m = preset_model("qwen2-57b-a14b");
  std::int64_t const attention = 2 * 3584 * 3584 + 2 * 3584 * 512;
  std::int64_t const shared = 3 * 3584 * 20480;
  CHECK(layer_parameters(m, 1) == attention + 2 * 3584 + 3584 * 64 + shared + 3584);
  CHECK(layer_parameters(m, 2) == attention / 2 + 2 * 3584 + 3584 * 64 + shared / 2 + 3584);
  CHECK(expert_layer_parameters(m, {}) == 64 * 3 * std::int64_t{3584} * 2560);
  model_shape plain = m;
  plain.shared_expert_gate = false;
  CHECK(layer_parameters(plain, 1) == layer_parameters(m, 1) - 3584);
  // The largest dense weight is now the shared experts' gate and up, 2 x 20480 x 3584.
  CHECK(largest_layer_matrix(m, 1) == 2 * 20480 * 3584);
  CHECK(largest_layer_matrix(preset_model("mixtral-8x7b"), 1) == 4096 * 4096 + 2 * 4096 * 1024);

  // The working set of a layer with gated shared experts, TP 1, where their gate's backward is
  // the largest phase: hidden 1024, 2 heads of 64 (q = k = 128), 4 experts of 64, 1 a token, at
  // capacity factor 0.5 (R = 4 x ceil(4096 / 4 x 0.5) = T / 2), shared experts of 128 whose
  // output and gate score are quantized. Per token: the gate's 2 h + 2 h + 2 = 4098 against the
  // router's 2 R h + 2 T h + 4 T e = 3088, the shared experts' gate and up 4 f + 2 h = 2560, the
  // QKV projection's 2 (q + 2k) + 2 h = 2816 and the rest smaller; plus the residual gradient 2 h.
  model_shape const small{
      block_style::llama, 2, 1024, 0, 2, 2, 64, 1000, false, 4, 1, 64, 128, true};
  shard_shape sh{1, 4096, 1, false};
  sh.capacity_factor = 0.5;
  CHECK(sh.expert_rows(small) == 2048);
  std::int64_t const t = 4096;
  auto const gate_quantized = [](tensor_kind k) {
    return k == tensor_kind::shared_expert_output || k == tensor_kind::shared_gate_score;
  };
  CHECK(layer_working_bytes(small, sh, gate_quantized) == 2048 * t + 4098 * t);
  // Nothing quantized, the gate's phase is 2 h = 2048 a token and the router's the largest.
  auto const none = [](tensor_kind) { return false; };
  CHECK(layer_working_bytes(small, sh, none) == 2048 * t + 3088 * t);
  // Ungated, the same.
  model_shape ungated = small;
  ungated.shared_expert_gate = false;
  CHECK(layer_working_bytes(ungated, sh, gate_quantized) == 2048 * t + 3088 * t);
  // Wide shared experts (f = 4096): their SwiGLU's backward, 6 T f, is the largest.
  model_shape wide = small;
  wide.shared_expert_ffn = 4096;
  CHECK(layer_working_bytes(wide, sh, none) == 2048 * t + 6 * 4096 * t);

  // Stages: TP 2 + SP, EP 8, etp 1, DP 4, PP 4 (7 layers a stage), ZeRO-1: the shared experts'
  // states are dense ones, sharded over dp x cp = 4; the routed experts' over 8 / 8 = 1 rank.
  parallel_config p;
  p.tp = 2;
  p.sp = true;
  p.pp = 4;
  p.dp = 4;
  p.ep = 8;
  p.etp = 1;
  p.zero_stage = 1;
  auto const stages = estimate_memory(m, p, st, {}, policy_table{});
  std::int64_t const dense_layer = layer_parameters(m, 2);
  std::int64_t const expert_layer = 8 * 3 * std::int64_t{3584} * 2560;
  auto const ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  stage_memory const& s1 = stages[1];
  CHECK(s1.expert_parameters == 7 * expert_layer);
  CHECK(s1.parameters == 7 * (dense_layer + expert_layer));
  CHECK(s1.master_weights == 4 * (ceil_div(7 * dense_layer, 4) + 7 * expert_layer));
  // A middle stage's saved bytes in bf16: 4 - 1 = 3 micro-batches in flight of 7 layers; a layer
  // under TP 2 + SP: 2048 tokens a rank of residual, norm outputs, router probabilities, shared
  // output and gate score; 4096 of Q, O (1792), K, V (256), logsumexp (14 heads); the shared
  // experts' three at 10240 over 4096 tokens; 2048 x 8 pairs of the routed experts' four.
  std::int64_t const layer = 2048 * (4 * 3584 * 2 + 64 * 4 + 3584 * 2 + 2) +
                             4096 * (2 * 1792 * 2 + 2 * 256 * 2 + 14 * 4) + 4096 * 3 * 10240 * 2 +
                             2048 * 8 * (3584 + 3 * 2560) * 2;
  auto const bf16 = estimate_memory(m, p, st, {}, policy_table::all_precise());
  CHECK(bf16[1].activations == 3 * 7 * layer);
}

TEST_CASE("mixture-of-experts recompute modules (moe_act, moe, shared_experts), by hand") {
  recompute_modules const act{.moe_act = true};
  recompute_modules const moe{.moe = true};
  recompute_modules const shared{.shared_experts = true};
  CHECK(name_of(recompute_modules{.layernorm = true, .moe_act = true, .shared_experts = true}) ==
        "layernorm,moe_act,shared_experts");
  recompute_modules r;
  for (char const* name : {"shared_experts", "moe", "moe_act"}) add_recompute_module(r, name);
  CHECK(r == recompute_modules{.moe_act = true, .moe = true, .shared_experts = true});
  // What each recomputes: moe_act the routed experts' SwiGLU output; shared_experts the shared
  // experts' three and their gate's two; moe all of the MoE MLP's tensors.
  for (tensor_kind const k : all_tensor_kinds) {
    CAPTURE(name_of(k));
    bool const routed = k == tensor_kind::router_probs || k == tensor_kind::expert_input ||
                        k == tensor_kind::expert_gate_output ||
                        k == tensor_kind::expert_up_output ||
                        k == tensor_kind::expert_swiglu_output;
    bool const of_shared = k == tensor_kind::gate_output || k == tensor_kind::up_output ||
                           k == tensor_kind::swiglu_output ||
                           k == tensor_kind::shared_expert_output ||
                           k == tensor_kind::shared_gate_score;
    CHECK(recomputes(act, k) == (k == tensor_kind::expert_swiglu_output));
    CHECK(recomputes(shared, k) == of_shared);
    CHECK(recomputes(moe, k) == (routed || of_shared));
  }
  // Their sources: under moe_act the SwiGLU output from the experts' gate and up outputs, each
  // error entering once; under moe and shared_experts the MLP's input (its norm's input with
  // layernorm), the SwiGLU outputs and the gated output inheriting twice its error.
  auto const sources = [](tensor_kind k, recompute_modules const& m) {
    auto const src = sources_of(k, block_style::qwen3, m);
    return std::vector<tensor_kind>(src.begin(), src.end());
  };
  using v = std::vector<tensor_kind>;
  CHECK(sources(tensor_kind::expert_swiglu_output, act) ==
        v{tensor_kind::expert_gate_output, tensor_kind::expert_up_output});
  CHECK(sources_of(tensor_kind::expert_swiglu_output, block_style::llama, act).factor == 1.0);
  CHECK(sources(tensor_kind::expert_swiglu_output, moe) == v{tensor_kind::mlp_input});
  CHECK(sources(tensor_kind::expert_swiglu_output, r) == v{tensor_kind::mlp_input});
  CHECK(sources_of(tensor_kind::expert_swiglu_output, block_style::llama, moe).factor == 2.0);
  CHECK(sources(tensor_kind::router_probs, moe) == v{tensor_kind::mlp_input});
  CHECK(sources_of(tensor_kind::router_probs, block_style::llama, moe).factor == 1.0);
  CHECK(sources(tensor_kind::shared_gate_score,
                recompute_modules{.layernorm = true, .shared_experts = true}) ==
        v{tensor_kind::mlp_norm_input});
  CHECK(sources_of(tensor_kind::shared_expert_output, block_style::llama, shared).factor == 2.0);
  CHECK(sources_of(tensor_kind::up_output, block_style::llama, shared).factor == 1.0);
  CHECK(sources(tensor_kind::expert_input, shared).empty());  // kept

  // A module the model does not have is refused, with the ones it has.
  model_shape const q2 = preset_model("qwen2-57b-a14b");
  shard_shape const one{1, 4096, 1, false};
  auto const precise = [](tensor_kind) { return storage::precise(); };
  CHECK_THROWS_WITH_AS(layer_activation_bytes(preset_model("llama3-8b"), one, precise, act),
                       doctest::Contains("moe_act, moe and shared_experts recompute a "
                                         "mixture-of-experts MLP's tensors; a dense MLP's module "
                                         "is mlp"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(layer_activation_bytes(preset_model("mixtral-8x7b"), one, precise, shared),
                       doctest::Contains("shared_experts recomputes the shared experts' tensors; "
                                         "this model has none"),
                       agoq::invalid_argument);

  // Saved bytes of Qwen2-57B-A14B's layer without TP, bf16 (355,698 a token, layer_kind_test):
  // moe_act drops the routed experts' SwiGLU output, 8 x 2560 x 2 a token; shared_experts the
  // shared experts' 3 x 20480 x 2 and their output 3584 x 2 and gate score 2; moe every tensor
  // of the MLP but its input (the router's 64 x 4 and the routed experts' 8 x (3584 + 3 x 2560)
  // x 2 too).
  std::int64_t const t = 4096;
  std::int64_t const all = t * 355698;
  CHECK(layer_activation_bytes(q2, one, precise) == all);
  CHECK(layer_activation_bytes(q2, one, precise, act) == all - t * 8 * 2560 * 2);
  std::int64_t const shared_bytes = t * (3 * 20480 * 2 + 3584 * 2 + 2);
  CHECK(layer_activation_bytes(q2, one, precise, shared) == all - shared_bytes);
  CHECK(layer_activation_bytes(q2, one, precise, moe) ==
        all - shared_bytes - t * (64 * 4 + 8 * (3584 + 3 * 2560) * 2));
  CHECK(layer_activation_bytes(q2, one, precise, r) ==
        layer_activation_bytes(q2, one, precise, moe));

  // The working set. moe_act costs none: its down projection's phase, 2 R h + 2 R f_e + the
  // SwiGLU output again (2 R f_e), equals the experts' gate and up phase, 4 R f_e + 2 R h
  // (Qwen3-30B-A3B: R = 8 T pairs of 768 on hidden 2048, 57,344 T either way; the largest with
  // their input dequantized, 2 R h more, and the residual gradient; else the forward's combine,
  // 4 R h = 65,536 T).
  model_shape const q3 = preset_model("qwen3-30b-a3b");
  auto const none = [](tensor_kind) { return false; };
  CHECK(layer_working_bytes(q3, one, none) == 65536 * t);
  CHECK(layer_working_bytes(q3, one, none, act) == 65536 * t);
  auto const input = [](tensor_kind k) { return k == tensor_kind::expert_input; };
  CHECK(layer_working_bytes(q3, one, input) == 2 * t * 2048 + 57344 * t + 32768 * t);
  CHECK(layer_working_bytes(q3, one, input, act) == 2 * t * 2048 + 57344 * t + 32768 * t);
  // shared_experts on wide gated shared experts (hidden 1024, f = 4096, memory_model_test's
  // narrow routed experts at capacity factor 0.5): as mlp on a dense MLP, the SwiGLU phase holds
  // the gate and up outputs again beside its gradients, 6 T f + 4 T f = 40,960 T, the largest.
  model_shape const wide{
      block_style::llama, 2, 1024, 0, 2, 2, 64, 1000, false, 4, 1, 64, 4096, true};
  shard_shape sh = one;
  sh.capacity_factor = 0.5;
  CHECK(layer_working_bytes(wide, sh, none) == 2048 * t + 6 * 4096 * t);
  CHECK(layer_working_bytes(wide, sh, none, shared) == 2048 * t + 10 * 4096 * t);
  // moe on the same layout with shared experts of 128 (R = T / 2): the MoE MLP's forward again
  // holds the router's probabilities 16 T, the routed experts' input 1024 T, gate, up and SwiGLU
  // outputs 192 T and output 1024 T, the shared experts' three 768 T, output and gate score
  // 2050 T and output before the reduction 2048 T: 7122 T against the router's phase, 5922 T
  // (2 R h + 2 T h + 4 T e + 16 T of probabilities again + the shared experts' 2818 T alive).
  model_shape narrow = wide;
  narrow.shared_expert_ffn = 128;
  CHECK(layer_working_bytes(narrow, sh, none, moe) == 2048 * t + 7122 * t);
  // moe recomputes the shared experts too: moe with shared_experts is moe.
  CHECK(layer_working_bytes(narrow, sh, none,
                            recompute_modules{.moe = true, .shared_experts = true}) ==
        2048 * t + 7122 * t);
}

TEST_CASE("Gemma: parameters as published, and the post-norms in the working set, by hand") {
  // Gemma-2-2B, -9B, -27B and Gemma-3-1B as Google publishes them (2.61 B, 9.24 B, 27.2 B, 1.0 B;
  // tied embeddings): four norms a layer, Gemma 3 also the QK-norm's two of head_dim.
  step_config const st{1, 4096, 0};
  struct published {
    char const* name;
    std::int64_t total;
  };
  for (published const& x :
       {published{"gemma2-2b", 2614341888}, published{"gemma2-9b", 9241705984},
        published{"gemma2-27b", 27227128320}, published{"gemma3-1b", 999885952}}) {
    CAPTURE(x.name);
    CHECK(estimate_memory(preset_model(x.name), {}, st, {}, policy_table{})[0].parameters ==
          x.total);
  }
  model_shape const m = preset_model("gemma2-9b");
  CHECK(layer_parameters(m, 1) ==
        3584 * 4096 + 2 * 3584 * 2048 + 4096 * 3584 + 3 * 3584 * 14336 + 4 * 3584);
  model_shape const g3 = preset_model("gemma3-1b");
  CHECK(layer_parameters(g3, 1) ==
        1152 * 1024 + 2 * 1152 * 256 + 1024 * 1152 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256);
  // The working set: the post-norms' backward, 2 T h, never the largest; Gemma-2-9B without TP
  // as LLaMA's of its widths: the SwiGLU phase's 6 T f, plus the residual gradient 2 T h. Gemma 3
  // adds the QK-norm's phase: 2 T (q + 2k) + 2 T (q + k), with both inputs quantized their bf16
  // copies too; the largest with multi-head attention (4 heads of 256: q = k = 1024) and a narrow
  // MLP (f = 256): 6144 T + 4096 T + 2048 T + 2048 T = 14,336 T against flash attention's
  // 2 T q + 2 T (q + 2k) + 4 T q + 16 T = 12,304 T and the QKV projection's 8448 T.
  shard_shape const one{1, 4096, 1, false};
  std::int64_t const t = 4096;
  auto const none = [](tensor_kind) { return false; };
  CHECK(layer_working_bytes(m, one, none) == 2 * t * 3584 + 6 * t * 14336);
  model_shape narrow = g3;
  narrow.ffn = 256;
  narrow.kv_heads = 4;
  auto const qk = [](tensor_kind k) {
    return k == tensor_kind::query_norm_input || k == tensor_kind::key_norm_input;
  };
  CHECK(layer_working_bytes(narrow, one, qk) == 2 * t * 1152 + 14336 * t);
}

TEST_CASE("states under ZeRO stages, by hand") {
  model_shape const m = preset_model("llama3-8b");
  std::int64_t const n = 8030261248;
  step_config const st{1, 1024, 0};
  for (int zero = 0; zero <= 3; ++zero) {
    parallel_config p;
    p.dp = 8;
    p.zero_stage = zero;
    auto const s = estimate_memory(m, p, st, {}, policy_table{})[0];
    std::int64_t const shard = n / 8;  // n is a multiple of 8
    CHECK(s.weights == 2 * (zero >= 3 ? shard : n));
    CHECK(s.master_weights == 4 * (zero >= 1 ? shard : n));
    CHECK(s.gradients == 4 * (zero >= 2 ? shard : n));
    CHECK(s.optimizer == 8 * (zero >= 1 ? shard : n));
    // ZeRO-3 gathers two units: here the embedding (128256 x 4096 = 525,336,576 parameters)
    // outweighs a layer (218,112,000: Q, O 4096^2; K, V 4096 x 1024; MLP 3 x 4096 x 14336; two
    // norms).
    CHECK(s.gathered_weights == (zero == 3 ? 2 * 2 * std::int64_t{128256} * 4096 : 0));
    CHECK(s.states() ==
          s.weights + s.gathered_weights + s.master_weights + s.gradients + s.optimizer);
  }
  {
    // A middle pipeline stage holds no embedding: its unit is one layer.
    parallel_config p;
    p.dp = 2;
    p.pp = 4;
    p.zero_stage = 3;
    auto const stages = estimate_memory(m, p, st, {}, policy_table{});
    std::int64_t const layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
    CHECK(stages[1].gathered_weights == 2 * 2 * layer);
    CHECK(stages[0].gathered_weights == 2 * 2 * std::int64_t{128256} * 4096);
    CHECK(stages[3].gathered_weights == 2 * 2 * std::int64_t{128256} * 4096);
  }
  CHECK(gradient_bytes(gradient_format::int8_g128, 1024) == 1024 + 8 * 4);
  CHECK(gradient_bytes(gradient_format::int8_g128, 1000) == 1024 + 8 * 4);  // padded section
  CHECK(gradient_bytes(gradient_format::bf16, 1000) == 2000);
  CHECK(optimizer_bytes(optimizer_format::int8_g128, 1024) == 2 * (1024 + 32));
  CHECK(optimizer_bytes(optimizer_format::fp32, 1000) == 8000);
}

TEST_CASE("1F1B in-flight counts") {
  for (std::int64_t s = 0; s < 4; ++s) {
    CHECK(in_flight_micro_batches(4, 1, s, 0) == std::vector<std::int64_t>{4 - s});
    CHECK(in_flight_micro_batches(4, 1, s, 2) ==
          std::vector<std::int64_t>{std::min<std::int64_t>(4 - s, 2)});
    CHECK(peak_in_flight_units(4, 1, s, 0) == 4 - s);
  }
  CHECK_THROWS_AS(in_flight_micro_batches(4, 1, 4, 0), agoq::invalid_argument);
}

TEST_CASE("interleaved in-flight counts") {
  // p = 4, v = 2, first device: 2 (p - 1) + (v - 1) p = 10 warm-up units + 1 = 11 = p v + p - 1,
  // i.e. L (1 + (p - 1) / (p v)) layers' worth (Korthikanti et al. 2022, 4.2.3).
  std::int64_t const L = 32;
  CHECK(peak_in_flight_units(4, 2, 0, 0) == 11);
  CHECK(peak_in_flight_units(4, 2, 0, 0) * (L / 8) * 8 == L * (8 + 3));
  CHECK(peak_in_flight_units(4, 2, 1, 0) == 9);
  CHECK(peak_in_flight_units(4, 2, 3, 0) == 5);
  // The moments of the peak: chunk 0 keeps filling while chunk 1 drains. Device 1 goes (5,4)
  // (6,3) (7,2) (8,1), one unit a step; the two between the ends are not listed.
  using counts = std::vector<std::vector<std::int64_t>>;
  CHECK(in_flight_peaks(4, 2, 0, 0) == counts{{7, 4}, {8, 3}});
  CHECK(in_flight_peaks(4, 2, 1, 0) == counts{{5, 4}, {8, 1}});
  CHECK(in_flight_peaks(4, 2, 3, 8) == counts{{4, 1}, {5, 0}});
  // Per chunk maxima: device 0 chunk 0 reaches 8 (4 warm-up + 4 steady forwards), chunk 1 4, but
  // not at the same moment (8 + 4 = 12 > 11).
  CHECK(in_flight_micro_batches(4, 2, 0, 0) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 2, 3, 0) == std::vector<std::int64_t>{5, 1});
  CHECK(in_flight_micro_batches(4, 2, 0, 8) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 3, 0, 0) == std::vector<std::int64_t>{8, 7, 4});
  // m == p. Megatron-Core: every forward first only where w = 2 (p - s - 1) + (v - 1) p >= m v,
  // devices 0 and 1 here; device 2 warms up with 6 units to (4, 2), then its two steady forwards
  // run chunk 1: (4, 3).
  CHECK(peak_in_flight_units(4, 2, 1, 4) == 8);
  CHECK(in_flight_peaks(4, 2, 2, 4) == counts{{4, 3}});
  CHECK(peak_in_flight_units(4, 2, 2, 4) == 7);
  CHECK(in_flight_peaks(4, 2, 3, 4) == counts{{4, 1}});
  // The legacy rules run every forward first on every device.
  pipeline_schedule const legacy{4, 2, 4, 0, interleaved_rules::megatron_legacy};
  CHECK(in_flight_peaks(legacy, 2) == counts{{4, 4}});
  CHECK(peak_in_flight_units(legacy, 3) == 8);
  // Otherwise the two agree.
  pipeline_schedule const legacy8{4, 2, 8, 0, interleaved_rules::megatron_legacy};
  for (std::int64_t s = 0; s < 4; ++s)
    CHECK(in_flight_peaks(legacy8, s) == in_flight_peaks(4, 2, s, 8));
  CHECK_THROWS_AS(in_flight_micro_batches(4, 2, 0, 6), agoq::invalid_argument);
  CHECK_THROWS_AS(in_flight_peaks(4, 2, 0, 6), agoq::invalid_argument);
  CHECK_THROWS_AS(peak_in_flight_units(4, 2, 4, 8), agoq::invalid_argument);
}

TEST_CASE("interleaved schedule, p = 2, v = 2, m = 4, by hand") {
  // Forward units k = 0..7 run chunk (k mod 4) / 2: 0 0 1 1 0 0 1 1 (micro-batches 0 1 0 1 2 3 2
  // 3); backward units run 1 1 0 0 1 1 0 0. Counts (chunk 0, chunk 1) alive after each unit: device
  // 0, 2 (2 - 0 - 1) + (2 - 1) 2 = 4 warm-up forwards: (1,0) (2,0) (2,1) (2,2);
  //   steady F B pairs: F (3,2) B (3,1) | F (4,1) B (4,0) | F (4,1) B (3,1) | F (3,2) B (2,2);
  //   cool-down: (2,1) (2,0) (1,0) (0,0). Peak 5 units at (3,2) and (4,1); per chunk 4 and 2.
  // device 1, 2 warm-up forwards: (1,0) (2,0);
  //   steady: F (2,1) B (2,0) | F (2,1) B (2,0) | F (3,0) B (2,0) | F (3,0) B (2,0) |
  //           F (2,1) B (2,0) | F (2,1) B (2,0); cool-down (1,0) (0,0).
  //   Peak 3 units at (2,1) and (3,0); per chunk 3 and 1.
  using counts = std::vector<std::vector<std::int64_t>>;
  CHECK(in_flight_peaks(2, 2, 0, 4) == counts{{3, 2}, {4, 1}});
  CHECK(in_flight_peaks(2, 2, 1, 4) == counts{{2, 1}, {3, 0}});
  CHECK(peak_in_flight_units(2, 2, 0, 4) == 5);
  CHECK(peak_in_flight_units(2, 2, 1, 4) == 3);
  CHECK(in_flight_micro_batches(2, 2, 0, 4) == std::vector<std::int64_t>{4, 2});
  CHECK(in_flight_micro_batches(2, 2, 1, 4) == std::vector<std::int64_t>{3, 1});
  CHECK(sorted(in_flight_peaks(2, 2, 0, 4)) == replay(2, 2, 0, 4, 2).peaks);
  CHECK(sorted(in_flight_peaks(2, 2, 1, 4)) == replay(2, 2, 1, 4, 2).peaks);
}

TEST_CASE("interleaved schedule, p = 2, v = 2, m = 5, groups of 3, by hand") {
  // Megatron-Core's own example (ModelParallelConfig.microbatch_group_size_per_vp_stage): groups
  // {0 1 2} and {3 4}. Forward units k = 0..9 run (micro-batch, chunk) (0,0) (1,0) (2,0) (0,1)
  // (1,1) (2,1) (3,0) (4,0) (3,1) (4,1): chunks 0 0 0 1 1 1 0 0 1 1; backward units run chunks 1 1
  // 1 0 0 0 1 1 0 0. Counts (chunk 0, chunk 1) alive after each unit: device 0, 2 (2 - 0 - 1) + (2
  // - 1) 3 = 5 warm-up forwards: (1,0) (2,0) (3,0) (3,1) (3,2);
  //   steady F B pairs: F (3,3) B (3,2) | F (4,2) B (4,1) | F (5,1) B (5,0) | F (5,1) B (4,1) |
  //                     F (4,2) B (3,2);
  //   cool-down: (2,2) (2,1) (2,0) (1,0) (0,0). Peak 6 units at (3,3), (4,2) and (5,1); per chunk
  //   5 and 3. Listed: the turns (3,3) and (5,1), and the last step's (4,2), which lies between
  //   them.
  // device 1, 3 warm-up forwards: (1,0) (2,0) (3,0);
  //   steady: F (3,1) B (3,0) | F (3,1) B (3,0) | F (3,1) B (3,0) | F (4,0) B (3,0) |
  //           F (4,0) B (3,0) | F (3,1) B (2,1) | F (2,2) B (2,1); cool-down (2,0) (1,0) (0,0).
  //   Peak 4 units at (3,1), (4,0) and (2,2), each a turn; per chunk 4 and 2.
  // With groups of p = 2 Megatron-Core refuses m = 5 (a last group of 1 < p).
  using counts = std::vector<std::vector<std::int64_t>>;
  pipeline_schedule const sc{2, 2, 5, 3};
  CHECK(in_flight_peaks(sc, 0) == counts{{3, 3}, {5, 1}, {4, 2}});
  CHECK(in_flight_peaks(sc, 1) == counts{{3, 1}, {4, 0}, {2, 2}});
  CHECK(peak_in_flight_units(sc, 0) == 6);
  CHECK(peak_in_flight_units(sc, 1) == 4);
  CHECK(in_flight_micro_batches(sc, 0) == std::vector<std::int64_t>{5, 3});
  CHECK(in_flight_micro_batches(sc, 1) == std::vector<std::int64_t>{4, 2});
  CHECK(sorted(in_flight_peaks(sc, 0)) == replay(2, 2, 0, 5, 3).peaks);
  CHECK(sorted(in_flight_peaks(sc, 1)) == replay(2, 2, 1, 5, 3).peaks);
  CHECK_THROWS_AS(in_flight_peaks(2, 2, 0, 5), agoq::invalid_argument);
}

TEST_CASE("schedules Megatron refuses") {
  auto throws_with = [](pipeline_schedule const& sc, char const* what) {
    CAPTURE(what);
    CHECK_THROWS_WITH_AS(in_flight_peaks(sc, 0), doctest::Contains(what), agoq::invalid_argument);
    CHECK_THROWS_AS(peak_in_flight_units(sc, 0), agoq::invalid_argument);
    CHECK_THROWS_AS(in_flight_micro_batches(sc, 0), agoq::invalid_argument);
  };
  // Megatron-Core: p <= g <= m, and a last group of 0 or >= p micro-batches.
  throws_with({4, 2, 3}, ">= pp (4, the default group size)");  // m < p
  throws_with({4, 2, 6, 8}, ">= the group size vp_group (8)");  // g > m
  throws_with({4, 2, 8, 3}, "of at least pp (4), got 3");       // g < p
  throws_with({4, 2, 8, -1}, "must be >= 0");                   // g < 0
  throws_with({4, 2, 9, 4}, "last group of 1 micro-batches");   // 9 = 2 * 4 + 1
  throws_with({4, 2, 6}, "last group of 2 micro-batches");      // default g = p = 4
  throws_with({4, 2, 13, 5}, "last group of 3 micro-batches");
  throws_with({4, 2, -1}, "micro_batches must be >= 0");
  throws_with({1, 2, 4}, "at least 2 devices");
  // The legacy rules: m a multiple of p, groups of p.
  throws_with({4, 2, 6, 6, interleaved_rules::megatron_legacy}, "groups of pp (4)");
  throws_with({4, 2, 6, 0, interleaved_rules::megatron_legacy}, "a multiple of pp (4)");
  throws_with({4, 2, 8, 0, static_cast<interleaved_rules>(7)}, "unknown interleaved_rules");
  // Accepted: the group size is ignored by 1F1B; ragged m with a group that leaves >= p.
  CHECK(peak_in_flight_units({4, 1, 3, 7}, 0) == 3);
  CHECK(peak_in_flight_units({4, 2, 6, 6}, 0) == 12);  // w = 2 * 3 + 6 = m v: all forwards first
  CHECK(peak_in_flight_units({4, 2, 6, 6}, 2) == 2 + 6 + 1);
  CHECK(peak_in_flight_units({4, 2, 9, 5}, 3) == 5 + 1);
  CHECK_NOTHROW(in_flight_peaks({4, 2, 4, 4, interleaved_rules::megatron_legacy}, 0));
  // Through the configuration: a bad group size fails validate; micro-batches the schedule
  // refuses fail estimate_memory (and make_plan).
  model_shape const m = preset_model("llama3-8b");
  parallel_config p;
  p.pp = 4;
  p.virtual_stages = 2;
  p.vp_group = 3;
  CHECK_THROWS_WITH_AS(p.validate(m), doctest::Contains("at least pp (4)"), agoq::invalid_argument);
  p.vp_group = -2;
  CHECK_THROWS_AS(p.validate(m), agoq::invalid_argument);
  p.vp_group = 0;
  step_config st{1, 1024, 6};
  CHECK_THROWS_WITH_AS(estimate_memory(m, p, st, {}, policy_table{}),
                       doctest::Contains("last group of 2"), agoq::invalid_argument);
  p.vp_group = 6;
  auto const six = estimate_memory(m, p, st, {}, policy_table{});
  CHECK(six[0].in_flight == in_flight_peaks({4, 2, 6, 6}, 0).front());
  p.vp_rules = interleaved_rules::megatron_legacy;
  CHECK_THROWS_AS(p.validate(m), agoq::invalid_argument);
}

TEST_CASE("the schedule replayed unit by unit agrees with the closed forms") {
  auto check_device = [](pipeline_schedule const& sc, std::int64_t s) {
    std::int64_t const p = sc.pp;
    std::int64_t const v = sc.virtual_stages;
    std::int64_t const m = sc.micro_batches;
    std::int64_t const g = v == 1 || sc.group == 0 ? p : sc.group;
    CAPTURE(p);
    CAPTURE(v);
    CAPTURE(m);
    CAPTURE(g);
    CAPTURE(s);
    replayed const r = replay(p, v, s, m, g, sc.rules);
    auto const peaks = in_flight_peaks(sc, s);
    // The closed forms of the schedule table: each forward unit's chunk is the table's and the
    // one whose count it raises.
    if (m > 0) {
      auto const rs = agoq::activation::detail::resolve(sc, s);
      auto const table = schedule_table(m, v, v == 1 ? 1 : g);
      for (std::int64_t n = 0; n < m * v; ++n) {
        std::int64_t const c = agoq::activation::detail::chunk_of_unit(n, rs);
        CHECK(c == table[static_cast<std::size_t>(n)].second);
        for (std::int64_t k = 0; k < v; ++k)
          CHECK(agoq::activation::detail::units_on_chunk(n + 1, rs, k) -
                    agoq::activation::detail::units_on_chunk(n, rs, k) ==
                (k == c ? 1 : 0));
      }
    }
    // Moments of the replay's peak, none twice, at most 3 v - 2 of them; every peak moment of
    // the replay lies on the segment between two of them.
    for (auto const& n : peaks) {
      CHECK(std::binary_search(r.peaks.begin(), r.peaks.end(), n));
      CHECK(std::accumulate(n.begin(), n.end(), std::int64_t{0}) == r.peak);
    }
    auto const listed = sorted(peaks);
    CHECK(std::adjacent_find(listed.begin(), listed.end()) == listed.end());
    CHECK(peaks.size() <= static_cast<std::size_t>(3 * v - 2));
    for (auto const& q : r.peaks) {
      CAPTURE(q);
      CHECK(std::any_of(peaks.begin(), peaks.end(), [&](auto const& a) {
        return std::any_of(peaks.begin(), peaks.end(),
                           [&](auto const& b) { return on_segment(q, a, b); });
      }));
    }
    CHECK(peak_in_flight_units(sc, s) == r.peak);
    CHECK(in_flight_micro_batches(sc, s) == r.chunk_max);
    // The formulas of the documentation.
    if (v == 1) {
      CHECK(r.peak == std::min(p - s, m));
    } else if (sc.rules == interleaved_rules::megatron_legacy && m == p) {
      CHECK(r.peak == m * v);
    } else {
      std::int64_t const w = 2 * (p - s - 1) + (v - 1) * g;
      CHECK(r.peak == (w >= m * v ? m * v : w + 1));
      if (s == 0 && g == p && m >= 2 * p) CHECK(r.peak == p * v + p - 1);
    }
  };
  std::int64_t replays = 0;
  for (std::int64_t p = 2; p <= 16; ++p)
    for (std::int64_t v = 1; v <= 4; ++v)
      for (std::int64_t m :
           {std::int64_t{1}, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p, 3 * p + 2, 8 * p}) {
        if (v == 1) {
          for (std::int64_t s = 0; s < p; ++s, ++replays) check_device({p, v, m}, s);
          continue;
        }
        // Every group size Megatron-Core could be given: refused exactly where its checks
        // refuse.
        for (std::int64_t g = 0; g <= m + 1; ++g) {
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(g);
          bool const ok = core_accepts(p, m, g == 0 ? p : g);
          if (ok) CHECK_NOTHROW(peak_in_flight_units({p, v, m, g}, 0));
          if (!ok) CHECK_THROWS_AS(peak_in_flight_units({p, v, m, g}, 0), agoq::invalid_argument);
        }
        // Replayed: every group size accepted (the default p as 0); for m = 8p, whose groups are
        // many and long, p, 3p, 4p + 1 and 8p.
        for (std::int64_t g = p; g <= m; ++g) {
          bool const sampled = m < 8 * p || g == p || g == 3 * p || g == 4 * p + 1 || g == m;
          if (!core_accepts(p, m, g) || !sampled) continue;
          for (std::int64_t s = 0; s < p; ++s, ++replays)
            check_device({p, v, m, g == p ? 0 : g}, s);
        }
        if (m % p == 0)
          for (std::int64_t s = 0; s < p; ++s, ++replays)
            check_device({p, v, m, 0, interleaved_rules::megatron_legacy}, s);
      }
  CHECK(replays > 10000);  // the sweep ran
  // No cap: the steady state's moments, the same as for any m from 3 groups that is a multiple
  // of the group size.
  for (std::int64_t p = 2; p <= 8; ++p)
    for (std::int64_t v = 1; v <= 4; ++v)
      for (std::int64_t g : {p, p + 1, 2 * p + 1})
        for (std::int64_t s = 0; s < p; ++s) {
          if (v == 1 && g != p) continue;
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(g);
          CAPTURE(s);
          pipeline_schedule const no_cap{p, v, 0, g};
          CHECK(in_flight_peaks(no_cap, s) == in_flight_peaks({p, v, 3 * g, g}, s));
          CHECK(sorted(in_flight_peaks(no_cap, s)) == sorted(in_flight_peaks({p, v, 8 * g, g}, s)));
          CHECK(peak_in_flight_units(no_cap, s) == peak_in_flight_units({p, v, 8 * g, g}, s));
        }
  // A long ragged step: the jump over the repeating whole groups against the replay.
  for (std::int64_t s : {0, 3, 7}) check_device({8, 3, 12 * 27 + 10, 12}, s);
}

TEST_CASE("in-flight moments of huge groups, by hand, without walking them") {
  // p = 2, v = 2, groups of g, no cap (m = 3 g), device 0: w = 2 + g warm-up units leave
  // (g, 2). The steady forwards run chunk 1 (units g + 2 .. 2 g - 1) while the backwards run
  // chunk 1 too: (g, 3) after each forward, g - 2 steps; then forwards on chunk 0 of the next
  // group against backwards on chunk 1: (g + 1, 2), (g + 2, 1), (g + 3, 0); then both on chunk 0.
  // The walk visited about g v steps (minutes for g = 2^30); the turns are found directly.
  using counts = std::vector<std::vector<std::int64_t>>;
  for (std::int64_t const g : {std::int64_t{1} << 30, std::int64_t{1} << 40}) {
    CAPTURE(g);
    pipeline_schedule const sc{2, 2, 0, g};
    CHECK(in_flight_peaks(sc, 0) == counts{{g, 3}, {g + 3, 0}});
    CHECK(in_flight_micro_batches(sc, 0) == std::vector<std::int64_t>{g + 3, 3});
    CHECK(peak_in_flight_units(sc, 0) == g + 3);
    // Device 1: w = g, (g, 0); forwards on chunk 1 and backwards on chunk 1 leave (g, 1) after
    // each forward until the forwards reach chunk 0 of the next group: (g + 1, 0).
    CHECK(in_flight_peaks(sc, 1) == counts{{g, 1}, {g + 1, 0}});
  }
  // A ragged step of 2^50 micro-batches in groups of 2^20 over 4 chunks: each moment's total
  // is the closed form's, at most 3 v - 2 of them.
  pipeline_schedule const sc{8, 4, std::int64_t{1} << 50, std::int64_t{1} << 20};
  for (std::int64_t s = 0; s < 8; ++s) {
    auto const peaks = in_flight_peaks(sc, s);
    CHECK(peaks.size() <= 10);
    for (auto const& n : peaks)
      CHECK(std::accumulate(n.begin(), n.end(), std::int64_t{0}) == peak_in_flight_units(sc, s));
  }
}

TEST_CASE("bf16 activations reconcile with Megatron's formula") {
  // GPT block, ffn = 4h, MHA. Megatron = agoq (flash attention) - logsumexp + 2 dropout masks
  // (1 byte per element of [s b, h]) + the 5 a s^2 b bytes of materialized attention scores.
  model_shape const m{block_style::gpt, 24, 2048, 8192, 16, 16, 0, 50257, false};
  std::int64_t const s = 2048;
  std::int64_t const b = 2;
  std::int64_t const h = 2048;
  std::int64_t const a = 16;
  struct cfg {
    std::int64_t t;
    bool sp;
  };
  for (cfg const c : {cfg{1, false}, cfg{4, false}, cfg{4, true}, cfg{8, true}}) {
    shard_shape const sh{b, s, c.t, c.sp};
    std::int64_t const agoq =
        layer_activation_bytes(m, sh, [](tensor_kind) { return storage::precise(); });
    std::int64_t const lse = shape_of(tensor_kind::softmax_lse, m, sh).bytes();
    CHECK(lse == 4 * b * a * s / c.t);
    std::int64_t const masks = 2 * s * b * h / (c.sp ? c.t : 1);
    std::int64_t const scores = 5 * a * s * s * b / c.t;
    CHECK(agoq - lse + masks + scores == megatron_layer_activation_bytes(s, b, h, a, c.t, c.sp));
  }
  // The formula itself, no parallelism: s b h (34 + 5 a s / h).
  CHECK(megatron_layer_activation_bytes(s, b, h, a, 1, false) == s * b * h * (34 + 5 * a * s / h));
}

TEST_CASE("activations of a whole pipeline, by hand") {
  model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 2;
  step_config const st{1, 128, 0};
  shard_shape const sh{1, 128, 1, false};
  std::int64_t const layer = small_layer_bytes;
  CHECK(layer_activation_bytes(m, sh, [](tensor_kind) { return storage::precise(); }) == layer);
  auto const s = estimate_memory(m, p, st, {}, policy_table::all_precise());
  REQUIRE(s.size() == 2);
  CHECK(s[0].in_flight == std::vector<std::int64_t>{2});
  CHECK(s[0].activations == 4 * 2 * layer);
  CHECK(s[1].activations == 4 * 1 * layer);
  CHECK(s[0].head_activations == 0);
  CHECK(s[1].head_activations == 2 * 2 * 128 * 256 + 4 * 128 * 1000);
  // The default policy: int8 for the residual stream, int4 for the linear and activation inputs.
  auto const q = estimate_memory(m, p, st, {}, policy_table{});
  std::int64_t const i8 = 128 * 256 + 128 * 2 * 4;   // [128, 256] int8: codes + 2 scales a row
  std::int64_t const i4h = 128 * 128 + 128 * 2 * 4;  // [128, 256] int4
  std::int64_t const i4f = 128 * 256 + 128 * 4 * 4;  // [128, 512] int4
  std::int64_t const attn = 128 * 256 * 2 * 2 + 2 * 128 * 128 * 2 + 4 * 128 * 4;
  CHECK(q[0].activations == 4 * 2 * (2 * i8 + 2 * i4h + 3 * i4f + attn));
  CHECK(peak_total(q) < peak_total(s));
}

TEST_CASE("uneven pipeline stages, by hand") {
  // 8 layers on 4 devices under 1F1B, 1 on the first and the last: 1, 3, 3, 1 layers, with 4, 3,
  // 2 and 1 micro-batches in flight.
  model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 4;
  p.first_stage_layers = 1;
  p.last_stage_layers = 1;
  REQUIRE_NOTHROW(p.validate(m));
  CHECK(p.uneven());
  std::vector<std::int64_t> layers;
  for (std::int64_t s = 0; s < 4; ++s) layers.push_back(p.stage_layers(m, s));
  CHECK(layers == std::vector<std::int64_t>{1, 3, 3, 1});
  CHECK(p.chunk_layers(m, 1, 0) == 3);
  CHECK(p.max_chunk_layers(m) == 3);
  std::vector<std::int64_t> stage_of;
  for (std::int64_t l = 0; l < 8; ++l) {
    layer_place const at = place_of(l, m, p);
    CHECK(at.chunk == 0);
    stage_of.push_back(at.stage);
  }
  CHECK(stage_of == std::vector<std::int64_t>{0, 1, 1, 1, 2, 2, 2, 3});
  std::vector<std::int64_t> firsts;
  for (std::int64_t s = 0; s < 4; ++s) firsts.push_back(first_layer_of(m, p, s, 0));
  CHECK(firsts == std::vector<std::int64_t>{0, 1, 4, 7});

  step_config st{1, 128, 0};
  std::int64_t const layer = small_layer_bytes;
  std::int64_t const per_layer = layer_parameters(m, 1);
  std::int64_t const embedding = 1000 * 256;
  auto const s = estimate_memory(m, p, st, {}, policy_table::all_precise());
  REQUIRE(s.size() == 4);
  std::vector<std::int64_t> const in_flight{4, 3, 2, 1};
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(s[r].layers == layers[r]);
    CHECK(s[r].in_flight == std::vector<std::int64_t>{in_flight[r]});
    CHECK(s[r].activations == in_flight[r] * layers[r] * layer);
  }
  CHECK(s[0].parameters == per_layer + embedding);
  CHECK(s[1].parameters == 3 * per_layer);
  CHECK(s[3].parameters == per_layer + embedding + 256);  // the head and the final norm
  // The same parameters as the even split, placed differently.
  parallel_config even = p;
  even.first_stage_layers = even.last_stage_layers = 0;
  auto const e = estimate_memory(m, even, st, {}, policy_table::all_precise());
  CHECK(total_parameters(s) == total_parameters(e));
  CHECK(e[0].activations == 4 * 2 * layer);
  CHECK(s[0].total() < e[0].total());

  // Block recomputation of each chunk's first 2 layers: all of the 1-layer chunks.
  st.recompute = recompute_method::block;
  st.recompute_layers = 2;
  std::int64_t const input = 2 * 128 * 256;
  std::vector<bool> recomputed;
  for (std::int64_t l = 0; l < 8; ++l) recomputed.push_back(is_recomputed(m, p, st, l));
  CHECK(recomputed == std::vector<bool>{true, true, true, false, true, true, false, true});
  CHECK(checkpoint_input_bytes(m, p, st, 0, 0) == input);
  CHECK(checkpoint_input_bytes(m, p, st, 1, 0) == 2 * input);
  auto const b = estimate_memory(m, p, st, {}, policy_table::all_precise());
  CHECK(b[0].activations == 4 * input);
  CHECK(b[1].activations == 3 * (2 * input + layer));
  CHECK(b[3].activations == input);
  CHECK(b[0].recompute == layer);

  // Interleaved (v = 2, m = 4): the first device's 2 layers in chunks of 1, the second's 6 in
  // chunks of 3; round c runs chunk c of device 0, then of device 1 (Megatron-Core's offsets).
  parallel_config v;
  v.pp = 2;
  v.virtual_stages = 2;
  v.first_stage_layers = 2;
  CHECK(places(m, v) == std::vector<std::int64_t>{0, 2, 2, 2, 1, 3, 3, 3});
  CHECK(first_layer_of(m, v, 1, 1) == 5);
  step_config vs{1, 128, 4};
  auto const iv = estimate_memory(m, v, vs, {}, policy_table::all_precise());
  CHECK(iv[0].layers == 2);
  CHECK(iv[1].layers == 6);
  // Device 0's peak moments (3,2) and (4,1) hold 5 chunk units of 1 layer each.
  CHECK(iv[0].activations == 5 * layer);

  // Layouts Megatron-Core refuses.
  parallel_config q = p;
  q.pp = 1;
  q.last_stage_layers = 0;
  check_refused(q, m,
                "uneven pipeline stages (first_stage_layers, last_stage_layers) need at least 2");
  q = p;
  q.first_stage_layers = 3;  // 3 and 1: 2 for each of the other 2 devices
  CHECK_NOTHROW(q.validate(m));
  q.last_stage_layers = 2;  // 3 left for 2 devices
  check_refused(q, m,
                "the 3 layers left by first_stage_layers (3) and last_stage_layers (2) of 8 do not "
                "split evenly into the other 2 pipeline stages");
  q = p;
  q.first_stage_layers = 9;
  check_refused(q, m, "ask for more than the model's 8 layers");
  q = p;
  q.first_stage_layers = -1;
  check_refused(q, m, "must be >= 0");
  q.last_stage_layers = 0;  // no device set, but still refused
  check_refused(q, m, "must be >= 0");
  q.pp = 2;
  q.first_stage_layers = 3;
  q.last_stage_layers = 4;  // 1 layer for no device
  check_refused(q, m, "the 1 layers left by");
  q.last_stage_layers = 5;
  CHECK_NOTHROW(q.validate(m));
  q.virtual_stages = 2;
  check_refused(q, m, "pipeline stage 0's 3 layers do not split into 2 chunks");
  q.first_stage_layers = 7;
  q.last_stage_layers = 0;
  check_refused(q, m, "pipeline stage 0's 7 layers do not split into 2 chunks");
  q.pp = 3;
  q.first_stage_layers = 2;  // 2, then 3 on each of the others
  check_refused(q, m, "pipeline stage 1's 3 layers do not split into 2 chunks");
}

TEST_CASE("the embedding and the loss counted in the pipeline split, by hand") {
  // Megatron-Core's account_for_embedding_in_pipeline_split and
  // account_for_loss_in_pipeline_split. 6 layers on 2 devices x 2 chunks with both counted: 8
  // units in chunks of 2, the first device's first chunk and the last device's last holding one
  // layer each. Rounds: device 0 chunk 0 {0}, device 1 chunk 0 {1, 2}; device 0 chunk 1 {3, 4},
  // device 1 chunk 1 {5}.
  model_shape const m{block_style::llama, 6, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 2;
  p.virtual_stages = 2;
  p.account_for_embedding = true;
  p.account_for_loss = true;
  REQUIRE_NOTHROW(p.validate(m));
  CHECK_FALSE(p.uneven());
  CHECK(p.split_units(m) == 8);
  CHECK(p.chunk_layers(m, 0, 0) == 1);
  CHECK(p.chunk_layers(m, 0, 1) == 2);
  CHECK(p.chunk_layers(m, 1, 0) == 2);
  CHECK(p.chunk_layers(m, 1, 1) == 1);
  CHECK(p.stage_layers(m, 0) == 3);
  CHECK(p.stage_layers(m, 1) == 3);
  CHECK(p.max_chunk_layers(m) == 2);
  CHECK(places(m, p) == std::vector<std::int64_t>{0, 2, 2, 1, 1, 3});
  CHECK(first_layer_of(m, p, 0, 0) == 0);
  CHECK(first_layer_of(m, p, 1, 0) == 1);
  CHECK(first_layer_of(m, p, 0, 1) == 3);
  CHECK(first_layer_of(m, p, 1, 1) == 5);

  // Device 0's peak moments under the interleaved schedule with 4 micro-batches hold chunk units
  // (3, 2) and (4, 1): 3 + 4 and 4 + 2 layers.
  step_config st{1, 128, 4};
  std::int64_t const layer = small_layer_bytes;
  auto const s = estimate_memory(m, p, st, {}, policy_table::all_precise());
  REQUIRE(s.size() == 2);
  CHECK(s[0].layers == 3);
  CHECK(s[0].activations == 7 * layer);
  CHECK(s[0].parameters == 3 * layer_parameters(m, 1) + 1000 * 256);

  // Block recomputation of each chunk's first layer: layers 0, 1, 3 and 5; each chunk keeps one
  // checkpoint's input.
  st.recompute = recompute_method::block;
  st.recompute_layers = 1;
  std::vector<bool> recomputed;
  for (std::int64_t l = 0; l < 6; ++l) recomputed.push_back(is_recomputed(m, p, st, l));
  CHECK(recomputed == std::vector<bool>{true, true, false, true, false, true});
  std::int64_t const input = 2 * 128 * 256;
  for (std::int64_t c = 0; c < 2; ++c) CHECK(checkpoint_input_bytes(m, p, st, 0, c) == input);
  auto const b = estimate_memory(m, p, st, {}, policy_table::all_precise());
  CHECK(b[0].activations == std::max(3 * input + 2 * (input + layer), 4 * input + input + layer));

  // Without interleaving, the same as uneven stages one layer below the even share: LLaMA 3
  // 405B's 126 layers on 16 devices, 128 units of 8, as 7, 14 x 8, 7.
  model_shape const big = preset_model("llama3-405b");
  parallel_config counted;
  counted.tp = 8;
  counted.pp = 16;
  counted.account_for_embedding = true;
  counted.account_for_loss = true;
  parallel_config uneven = counted;
  uneven.account_for_embedding = uneven.account_for_loss = false;
  uneven.first_stage_layers = uneven.last_stage_layers = 7;
  step_config const big_step{1, 8192, 128};
  auto const a = estimate_memory(big, counted, big_step, {}, policy_table{});
  auto const u = estimate_memory(big, uneven, big_step, {}, policy_table{});
  REQUIRE(a.size() == u.size());
  for (std::size_t r = 0; r < a.size(); ++r) {
    CAPTURE(r);
    CHECK(a[r].layers == u[r].layers);
    CHECK(a[r].total() == u[r].total());
  }
  CHECK(a[0].layers == 7);
  CHECK(a[1].layers == 8);

  // One layer and the embedding on 2 devices: the first holds no transformer layer.
  model_shape const one{block_style::llama, 1, 256, 512, 4, 2, 0, 1000, false};
  parallel_config e;
  e.pp = 2;
  e.account_for_embedding = true;
  REQUIRE_NOTHROW(e.validate(one));
  CHECK(place_of(0, one, e).stage == 1);
  auto const o = estimate_memory(one, e, step_config{1, 128, 2}, {}, policy_table::all_precise());
  CHECK(o[0].layers == 0);
  CHECK(o[0].activations == 0);
  CHECK(o[0].parameters == 1000 * 256);
  CHECK(o[1].layers == 1);
  CHECK(o[1].activations == layer);

  // Refused: a count that does not split, and with uneven stages.
  parallel_config q = p;
  q.account_for_loss = false;  // 7 units on 4 chunks
  CHECK_THROWS_WITH_AS(q.validate(m),
                       doctest::Contains("parallel_config: 6 layers and the embedding do not "
                                         "split into 2 stages x 2 chunks evenly ("),
                       agoq::invalid_argument);
  q = p;
  q.virtual_stages = 1;
  q.first_stage_layers = 2;
  CHECK_THROWS_WITH_AS(q.validate(m), doctest::Contains("they exclude first_stage_layers"),
                       agoq::invalid_argument);
}

TEST_CASE("Megatron-Core's pipeline layout: read, placed and refused") {
  // Megatron-Core's examples and syntax: commas dropped, groups, then characters repeated.
  CHECK(parse_pipeline_layout("Et|tt|tt|tL") == std::vector<std::int64_t>{1, 2, 2, 1});
  CHECK(parse_pipeline_layout("E|tt|t,t|L") == std::vector<std::int64_t>{0, 2, 2, 0});
  CHECK(parse_pipeline_layout("Et*3|(tt|)*3,t*3L") == std::vector<std::int64_t>{3, 2, 2, 2, 3});
  CHECK(parse_pipeline_layout("(Et|)*1(t*2|)*2L") == std::vector<std::int64_t>{1, 2, 2, 0});
  CHECK(parse_pipeline_layout("EL") == std::vector<std::int64_t>{0});
  CHECK(parse_pipeline_layout("Et*1,2|L") == std::vector<std::int64_t>{12, 0});  // "t*12"
  std::vector<std::int64_t> const llama405 = parse_pipeline_layout("Et*7|(t*8|)*14,t*7L");
  REQUIRE(llama405.size() == 16);
  CHECK(llama405.front() == 7);
  CHECK(llama405[1] == 8);
  CHECK(llama405.back() == 7);
  for (auto const& [text, why] : std::vector<std::pair<char const*, char const*>>{
           {"tt|tL", "the embedding 'E' must open the first chunk"},
           {"t|EtL", "the embedding 'E' must open the first chunk"},
           {"EEt|tL", "the embedding 'E' must open the first chunk"},
           {"Et|tt", "the loss 'L' must close the last chunk"},
           {"EtL|t", "the loss 'L' must close the last chunk"},
           {"", "the embedding 'E' must open the first chunk"},
           {"Et|tm|L", "multi-token prediction layers ('m') are not modelled"},
           {"Et|tx|L", "'x' is not a layer"},
           {"E(t|t|L", "a '(' is not closed"},
           {"Et)|tL", "a ')' without its '('"},
           {"E((t|)*2)*2L", "parentheses do not nest"},
           {"E(t|)L", "a group in parentheses needs '*n'"},
           {"Et*|tL", "a '*' without a count"},
           {"E*2t|tL", "the embedding 'E' must open the first chunk, once"},  // "EEt|tL"
           {"*2Et|tL", "a '*' must follow"},
           {"Et*2*3|tL", "a '*' must follow"},
           {"Et*99999999|L", "a count past 2^24"},
           {"E(t*9999|)*9999L", "it expands past 2^24 characters"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse_pipeline_layout(text), doctest::Contains(why),
                         agoq::invalid_argument);
  }

  // As a parallel_config: the counted split of the test above, given; the same memory.
  model_shape const m{block_style::llama, 6, 256, 512, 4, 2, 0, 1000, false};
  parallel_config counted;
  counted.pp = 2;
  counted.virtual_stages = 2;
  counted.account_for_embedding = counted.account_for_loss = true;
  parallel_config given;
  given.pp = 2;
  given.virtual_stages = 2;
  given.pipeline_layout = parse_pipeline_layout("Et|tt|tt|tL");
  REQUIRE_NOTHROW(given.validate(m));
  // use_pipeline_layout: virtual_stages from the chunks where it is 1, else left to validate.
  parallel_config used;
  used.pp = 2;
  used.use_pipeline_layout("Et|tt|tt|tL");
  CHECK(used.virtual_stages == 2);
  CHECK(used.pipeline_layout == given.pipeline_layout);
  used.virtual_stages = 4;
  used.use_pipeline_layout("Et|tt|tt|tL");
  CHECK(used.virtual_stages == 4);
  CHECK_THROWS_WITH_AS(used.validate(m), doctest::Contains("are not pp (2) x virtual_stages (4)"),
                       agoq::invalid_argument);
  used.virtual_stages = 1;
  used.pp = 3;  // 4 chunks on 3 devices: left at 1, refused
  used.use_pipeline_layout("Et|tt|tt|tL");
  CHECK(used.virtual_stages == 1);
  CHECK_THROWS_AS(used.validate(m), agoq::invalid_argument);
  step_config const st{1, 128, 4};
  auto const a = estimate_memory(m, counted, st, {}, policy_table{});
  auto const b = estimate_memory(m, given, st, {}, policy_table{});
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(a[r].layers == b[r].layers);
    CHECK(a[r].total() == b[r].total());
  }
  // A split none of the other fields gives: 1, 3 on device 0 and 2, 0 on device 1 (v = 2).
  given.pipeline_layout = parse_pipeline_layout("Et|tt|ttt|L");
  REQUIRE_NOTHROW(given.validate(m));
  CHECK(given.stage_layers(m, 0) == 4);
  CHECK(given.stage_layers(m, 1) == 2);
  CHECK(given.max_chunk_layers(m) == 3);
  CHECK(places(m, given) == std::vector<std::int64_t>{0, 2, 2, 1, 1, 1});
  CHECK(first_layer_of(m, given, 1, 1) == 6);  // holds none: the first layer after it
  auto const c = estimate_memory(m, given, st, {}, policy_table::all_precise());
  std::int64_t const layer = small_layer_bytes;
  // Device 0's peak moments (3, 2) and (4, 1) of chunks of 1 and 3 layers: 9 and 7.
  CHECK(c[0].activations == 9 * layer);

  // Refused: chunks that are not pp x virtual_stages, other split fields beside it, layers that
  // are not the model's.
  parallel_config q = given;
  q.virtual_stages = 1;
  check_refused(q, m, "the pipeline layout's 4 model chunks are not pp (2) x virtual_stages (1)");
  q = given;
  q.pp = 3;
  check_refused(q, m, "the pipeline layout's 4 model chunks are not pp (3) x virtual_stages (2)");
  q = given;
  q.first_stage_layers = 4;
  check_refused(q, m, "it excludes first_stage_layers, last_stage_layers, account_for_embedding");
  q = given;
  q.account_for_loss = true;
  check_refused(q, m, "it excludes first_stage_layers");
  q = given;
  q.last_stage_layers = -1;  // not an uneven stage, but set
  check_refused(q, m, "it excludes first_stage_layers");
  q = given;
  q.pipeline_layout = parse_pipeline_layout("Et|tt|tt|L");
  check_refused(q, m, "the pipeline layout places 5 transformer layers, not the model's 6");
  q.pipeline_layout = {6, -1, 1, 0};
  check_refused(q, m, "holds -1 layers");
}

TEST_CASE("layer placement: every layout's chunks tile the layers in round order") {
  // Every split Megatron-Core accepts of up to 24 layers on 2-6 devices with 1-3 chunks each,
  // with and without uneven first and last stages, and with the embedding and the loss counted in
  // the even split or not: walking round by round, device by device, each chunk starts where the
  // one before ended (first_layer_of), and place_of maps each of its layers back to it; the same
  // split given as a pipeline layout places every layer alike.
  int layouts = 0;
  int counted = 0;  // layouts with the embedding or the loss counted
  for (std::int64_t layers = 1; layers <= 24; ++layers)
    for (std::int64_t pp = 2; pp <= 6; ++pp)
      for (std::int64_t v = 1; v <= 3; ++v)
        for (std::int64_t first = 0; first <= layers; ++first)
          for (std::int64_t last = 0; last <= layers; ++last)
            for (int units = 0; units < 4; ++units) {
              model_shape const m{block_style::llama, layers, 256, 512, 4, 2, 0, 1000, false};
              parallel_config p;
              p.pp = pp;
              p.virtual_stages = v;
              p.first_stage_layers = first;
              p.last_stage_layers = last;
              p.account_for_embedding = (units & 1) != 0;
              p.account_for_loss = (units & 2) != 0;
              try {
                p.validate(m);
              } catch (agoq::invalid_argument const&) {
                continue;
              }
              ++layouts;
              counted += units != 0;
              CAPTURE(layers);
              CAPTURE(pp);
              CAPTURE(v);
              CAPTURE(first);
              CAPTURE(last);
              CAPTURE(units);
              std::int64_t next = 0;
              std::vector<std::int64_t> total(static_cast<std::size_t>(pp), 0);
              for (std::int64_t c = 0; c < v; ++c)
                for (std::int64_t s = 0; s < pp; ++s) {
                  REQUIRE(first_layer_of(m, p, s, c) == next);
                  std::int64_t const n = p.chunk_layers(m, s, c);
                  // Only the chunk beside the embedding or the loss may hold none.
                  bool const lighter = (p.account_for_embedding && s == 0 && c == 0) ||
                                       (p.account_for_loss && s == pp - 1 && c == v - 1);
                  REQUIRE(n >= (lighter ? 0 : 1));
                  for (std::int64_t l = next; l < next + n; ++l) {
                    layer_place const at = place_of(l, m, p);
                    REQUIRE((at.stage == s && at.chunk == c));
                  }
                  next += n;
                  total[static_cast<std::size_t>(s)] += n;
                }
              CHECK(next == layers);
              for (std::int64_t s = 0; s < pp; ++s)
                CHECK(total[static_cast<std::size_t>(s)] == p.stage_layers(m, s));
              // The same split given as a pipeline layout places every layer alike.
              parallel_config given;
              given.pp = pp;
              given.virtual_stages = v;
              for (std::int64_t c = 0; c < v; ++c)
                for (std::int64_t s = 0; s < pp; ++s)
                  given.pipeline_layout.push_back(p.chunk_layers(m, s, c));
              REQUIRE_NOTHROW(given.validate(m));
              for (std::int64_t s = 0; s < pp; ++s) {
                REQUIRE(given.stage_layers(m, s) == p.stage_layers(m, s));
                for (std::int64_t c = 0; c < v; ++c)
                  REQUIRE(first_layer_of(m, given, s, c) == first_layer_of(m, p, s, c));
              }
              for (std::int64_t l = 0; l < layers; ++l) {
                layer_place const a = place_of(l, m, p);
                layer_place const b = place_of(l, m, given);
                REQUIRE((a.stage == b.stage && a.chunk == b.chunk));
              }
              CHECK(given.max_chunk_layers(m) == p.max_chunk_layers(m));
            }
  CHECK(layouts > 1000);
  CHECK(counted > 150);
}

TEST_CASE("activation recomputation, by hand") {
  // 8 layers on 2 devices under 1F1B: chunks of 4 layers, 2 and 1 micro-batches in flight.
  model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 2;
  std::int64_t const layer = small_layer_bytes;
  std::int64_t const input = 2 * 128 * 256;  // a checkpoint's input: [128, 256] bf16
  CHECK(residual_stream_bytes(m, {1, 128, 1, false}) == input);
  CHECK(residual_stream_bytes(m, {1, 128, 2, true}) == input / 2);  // [T / t, h] under SP
  auto const with = [](recompute_method r, std::int64_t n) {
    step_config st{1, 128, 0};
    st.recompute = r;
    st.recompute_layers = n;
    return st;
  };
  auto const base =
      estimate_memory(m, p, with(recompute_method::none, 0), {}, policy_table::all_precise());
  CHECK(base[0].activations == 2 * 4 * layer);
  CHECK(base[0].recompute == 0);
  // {method, N, checkpoints of a chunk, layers recomputed}
  struct expect {
    recompute_method method;
    std::int64_t n;
    std::vector<std::int64_t> checkpoints;
    std::int64_t recomputed;
  };
  for (auto const& [method, n, checkpoints, recomputed] : std::vector<expect>{
           {recompute_method::block, 1, {1}, 1},
           {recompute_method::block, 3, {1, 1, 1}, 3},
           {recompute_method::block, 6, {1, 1, 1, 1}, 4},  // more than the chunk holds: all
           {recompute_method::uniform, 1, {1, 1, 1, 1}, 4},
           {recompute_method::uniform, 3, {3, 1}, 4},  // the last checkpoint holds what is left
           {recompute_method::uniform, 4, {4}, 4},
           {recompute_method::uniform, 9, {4}, 4}}) {
    CAPTURE(name_of(method));
    CAPTURE(n);
    step_config const st = with(method, n);
    CHECK(recompute_checkpoints(st, 4) == checkpoints);
    CHECK(recomputed_layers(st, 4) == recomputed);
    CHECK(checkpoint_input_bytes(m, p, st, 1, 0) ==
          static_cast<std::int64_t>(checkpoints.size()) * input);
    for (std::int64_t l = 0; l < 8; ++l) CHECK(is_recomputed(m, p, st, l) == (l % 4 < recomputed));
    auto const b = estimate_memory(m, p, st, {}, policy_table::all_precise());
    std::int64_t const chunk =
        (4 - recomputed) * layer + static_cast<std::int64_t>(checkpoints.size()) * input;
    std::int64_t const largest = *std::max_element(checkpoints.begin(), checkpoints.end());
    for (std::size_t s = 0; s < 2; ++s) {
      CHECK(b[s].activations == (2 - static_cast<std::int64_t>(s)) * chunk);
      CHECK(b[s].recompute == largest * layer);
      CHECK(b[s].transient() == base[s].transient() + largest * layer);
      CHECK(b[s].total() ==
            base[s].total() - base[s].activations + b[s].activations + largest * layer);
    }
  }
  // Every layer its own checkpoint keeps 2 s b h a layer (Korthikanti et al. 2022, §5: full
  // recomputation stores only each layer's input).
  CHECK(
      estimate_memory(m, p, with(recompute_method::uniform, 1), {}, policy_table::all_precise())[1]
          .activations == 4 * 2 * 128 * 256);
  // The recomputed layers save their tensors again as `choose` stores them: the default policy's
  // quantized layer (as in "activations of a whole pipeline, by hand").
  std::int64_t const i8 = 128 * 256 + 128 * 2 * 4;
  std::int64_t const i4h = 128 * 128 + 128 * 2 * 4;
  std::int64_t const i4f = 128 * 256 + 128 * 4 * 4;
  std::int64_t const attn = 128 * 256 * 2 * 2 + 2 * 128 * 128 * 2 + 4 * 128 * 4;
  std::int64_t const q = 2 * i8 + 2 * i4h + 3 * i4f + attn;
  policy_table const policy;
  auto const d =
      estimate_memory(m, p, with(recompute_method::uniform, 2), {},
                      [&](std::int64_t, tensor_kind k) { return policy.default_storage(k); });
  CHECK(d[0].activations == 2 * 2 * input);
  CHECK(d[0].recompute == 2 * q);
  // The policy's overload keeps them in bf16, as the planner does.
  auto const e = estimate_memory(m, p, with(recompute_method::uniform, 2), {}, policy);
  CHECK(e[0].activations == 2 * 2 * input);
  CHECK(e[0].recompute == 2 * layer);
  CHECK(e[0].working == base[0].working);  // no dequantized buffer in a recomputed layer

  // Interleaved (v = 2, m = 4): chunks of 2 layers, each recomputing its first; device 0's
  // peak moments (3,2) and (4,1) hold 5 chunk units.
  p.virtual_stages = 2;
  step_config st = with(recompute_method::block, 1);
  st.micro_batches = 4;
  auto const v = estimate_memory(m, p, st, {}, policy_table::all_precise());
  CHECK(v[0].activations == 5 * (layer + input));
  CHECK(v[0].recompute == layer);
  for (std::int64_t l = 0; l < 8; ++l) CHECK(is_recomputed(m, p, st, l) == (l % 2 == 0));

  // Settings Megatron refuses: a method without N, N without a method.
  CHECK_THROWS_AS(estimate_memory(m, p, with(recompute_method::uniform, 0), {}, policy_table{}),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(estimate_memory(m, p, with(recompute_method::block, -1), {}, policy_table{}),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(estimate_memory(m, p, with(recompute_method::none, 2), {}, policy_table{}),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(recompute_checkpoints(with(recompute_method::none, 1), 4),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(is_recomputed(m, p, with(recompute_method::block, 1), 8), agoq::invalid_argument);
}

TEST_CASE("selective recomputation, by hand") {
  recompute_modules const none{};
  recompute_modules const norms{.layernorm = true};
  recompute_modules const mlp{.mlp = true};
  recompute_modules const core{.core_attn = true};
  recompute_modules const all{true, true, true};
  SUBCASE("names, recomputed kinds and their sources") {
    CHECK(name_of(none).empty());
    CHECK(name_of(recompute_modules{.core_attn = true, .mlp = true}) == "core_attn,mlp");
    CHECK(name_of(all) == "core_attn,layernorm,mlp");
    CHECK(names_of(none).empty());
    CHECK(names_of(recompute_modules{.layernorm = true, .mlp = true}) ==
          std::vector<std::string_view>{"layernorm", "mlp"});
    recompute_modules r;
    add_recompute_module(r, "mlp");
    add_recompute_module(r, "layernorm");
    add_recompute_module(r, "mlp");  // twice: still once
    CHECK(r == recompute_modules{.layernorm = true, .mlp = true});
    CHECK_THROWS_WITH_AS(add_recompute_module(r, "moe_layer"),
                         doctest::Contains("unknown module 'moe_layer' (modules: core_attn, "
                                           "layernorm, mlp, moe_act, moe, shared_experts)"),
                         agoq::invalid_argument);
    CHECK_THROWS_AS(add_recompute_module(r, ""), agoq::invalid_argument);
    CHECK(r == recompute_modules{.layernorm = true, .mlp = true});  // a refused name adds nothing
    auto const sources = [](tensor_kind k, block_style s, recompute_modules const& m) {
      auto const src = sources_of(k, s, m);
      return std::vector<tensor_kind>(src.begin(), src.end());
    };
    using v = std::vector<tensor_kind>;
    block_style const llama = block_style::llama;
    block_style const gpt = block_style::gpt;
    CHECK(sources(tensor_kind::qkv_input, llama, norms) == v{tensor_kind::attn_norm_input});
    CHECK(sources(tensor_kind::mlp_input, llama, norms) == v{tensor_kind::mlp_norm_input});
    CHECK(sources(tensor_kind::qkv_input, gpt, norms) == v{tensor_kind::ln1_input});
    CHECK(sources(tensor_kind::fc1_input, gpt, norms) == v{tensor_kind::ln2_input});
    CHECK(sources(tensor_kind::gate_output, llama, mlp) == v{tensor_kind::mlp_input});
    CHECK(sources(tensor_kind::swiglu_output, llama, all) == v{tensor_kind::mlp_norm_input});
    CHECK(sources(tensor_kind::fc2_input, gpt, mlp) == v{tensor_kind::fc1_input});
    CHECK(sources(tensor_kind::gelu_input, gpt, all) == v{tensor_kind::ln2_input});
    CHECK(sources(tensor_kind::softmax_lse, llama, core) ==
          v{tensor_kind::query, tensor_kind::key});
    // The SwiGLU output multiplies two tensors that each carry its source's error.
    CHECK(sources_of(tensor_kind::swiglu_output, llama, mlp).factor == 2.0);
    CHECK(sources_of(tensor_kind::swiglu_output, llama, all).factor == 2.0);
    CHECK(sources_of(tensor_kind::gate_output, llama, all).factor == 1.0);
    CHECK(sources_of(tensor_kind::fc2_input, gpt, mlp).factor == 1.0);
    CHECK(sources_of(tensor_kind::qkv_input, llama, norms).factor == 1.0);
    // Kept kinds have none, and no module recomputes Q, K, V, O or the residual stream.
    CHECK(sources(tensor_kind::qkv_input, llama, mlp).empty());
    CHECK(sources(tensor_kind::softmax_lse, llama, norms).empty());
    for (tensor_kind const k : all_tensor_kinds) {
      CAPTURE(name_of(k));
      CHECK_FALSE(recomputes(none, k));
      if (category_of(k) == tensor_category::residual_stream ||
          (category_of(k) == tensor_category::attention_core && k != tensor_kind::softmax_lse))
        CHECK_FALSE(recomputes(all, k));
      for (tensor_kind const s : sources_of(k, block_style::llama, all))
        CHECK_FALSE(recomputes(all, s));  // a source is kept
    }
  }
  SUBCASE("saved bytes of a layer") {
    // LLaMA, h 256, f 512, 4 heads of 64, 2 kv heads, 128 tokens: [128, 256] bf16 tensors 65,536
    // bytes (norm inputs and outputs, Q, O), K and V 32,768, the logsumexp 2,048, gate, up and
    // SwiGLU output 131,072: 854,016 in all.
    model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
    shard_shape const sh{1, 128, 1, false};
    std::vector<tensor_kind> asked;
    auto const bytes = [&](recompute_modules const& r) {
      asked.clear();
      return layer_activation_bytes(
          m, sh,
          [&](tensor_kind k) {
            asked.push_back(k);
            return storage::precise();
          },
          r);
    };
    CHECK(bytes(none) == 854016);
    CHECK(asked.size() == 12);  // every owned kind but the alias o_proj_input
    CHECK(bytes(norms) == 854016 - 2 * 65536);
    CHECK(asked.size() == 10);  // `choose` is not asked for the recomputed kinds
    CHECK(bytes(mlp) == 854016 - 3 * 131072);
    CHECK(bytes(core) == 854016 - 2048);
    CHECK(bytes(all) == 327680);
    CHECK(asked.size() == 6);
    // GPT, h 128, f 512, 4 heads, 64 tokens: eight [64, 128] tensors of 16,384, the logsumexp
    // 1,024, the GeLU input and output 65,536 each: 263,168.
    model_shape const g{block_style::gpt, 4, 128, 512, 4, 4, 0, 1000, false};
    shard_shape const gs{1, 64, 1, false};
    auto const gpt = [&](recompute_modules const& r) {
      return layer_activation_bytes(
          g, gs, [](tensor_kind) { return storage::precise(); }, r);
    };
    CHECK(gpt(none) == 263168);
    CHECK(gpt(norms) == 263168 - 2 * 16384);
    CHECK(gpt(mlp) == 263168 - 2 * 65536);
  }
  SUBCASE("working set of a layer") {
    auto const precise = [](tensor_kind) { return false; };
    // The first layer of "transient working memory of a layer, by hand": R = 65,536; phases down
    // 131,072, SwiGLU 393,216, gate/up 327,680, output projection 65,536, attention 460,800,
    // QKV 196,608.
    model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
    shard_shape const sh{1, 128, 1, false};
    CHECK(layer_working_bytes(m, sh, precise, none) == 65536 + 460800);
    // layernorm: the recomputed norm outputs (65,536 each) live from the start of their
    // sub-block's backward: attention 460,800 + 65,536 is the largest.
    CHECK(layer_working_bytes(m, sh, precise, norms) == 65536 + 526336);
    // mlp: M = 6 T0 f = 393,216 in bf16 again; SwiGLU 393,216 + the gate and up outputs
    // 262,144 = 655,360 (down 131,072 + 393,216; the forward again 393,216 + 2 T0 h 65,536).
    CHECK(layer_working_bytes(m, sh, precise, mlp) == 65536 + 655360);
    // core_attn: the attention phase holds the recomputed O (65,536) and logsumexp (2,048).
    CHECK(layer_working_bytes(m, sh, precise, core) == 65536 + 528384);
    // All three: SwiGLU 655,360 + the recomputed MLP input 65,536.
    CHECK(layer_working_bytes(m, sh, precise, all) == 65536 + 720896);
    // A quantized MLP input under mlp: its bf16 copy (65,536) lives from the MLP's forward again
    // to its GEMM: SwiGLU 720,896.
    CHECK(layer_working_bytes(
              m, sh, [](tensor_kind k) { return k == tensor_kind::mlp_input; }, mlp) ==
          65536 + 720896);
    // TP 4, h 256, ffn 384: f = 96, q = k = 64 (4 heads and kv heads), T0 = 128, R = 65,536.
    // Phases with mlp: down 2 T0 f + M = 24,576 + 73,728 = 98,304; SwiGLU 10 T0 f = 122,880;
    // gate/up 4 T0 f + 2 T0 h = 114,688; the MLP's forward again M + 2 T0 h = 139,264, the
    // largest; attention 16,384 + 49,152 + 32,768 + 512 = 98,816; QKV 114,688.
    model_shape const w{block_style::llama, 4, 256, 384, 4, 4, 0, 1000, false};
    shard_shape const t4{1, 128, 4, false};
    CHECK(layer_working_bytes(w, t4, precise, none) == 65536 + 114688);
    CHECK(layer_working_bytes(w, t4, precise, mlp) == 65536 + 139264);
    // GPT, h 128, f 512, 64 tokens: R = 16,384; FC2 65,536, GeLU 131,072, FC1 81,920, attention
    // 99,328. mlp: M = 4 T0 f = 131,072; FC2 65,536 + M = 196,608 ties GeLU 131,072 + 65,536.
    // layernorm: GeLU 131,072 + D(fc1_input) 16,384 = 147,456.
    model_shape const g{block_style::gpt, 4, 128, 512, 4, 4, 0, 1000, false};
    shard_shape const gs{1, 64, 1, false};
    CHECK(layer_working_bytes(g, gs, precise, mlp) == 16384 + 196608);
    CHECK(layer_working_bytes(g, gs, precise, norms) == 16384 + 147456);
  }
  SUBCASE("a whole pipeline, and what Megatron refuses") {
    // 8 layers on 2 devices under 1F1B (2 and 1 micro-batches in flight), 4 layers a chunk.
    model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
    parallel_config p;
    p.pp = 2;
    step_config st{1, 128, 0};
    auto const base = estimate_memory(m, p, st, {}, policy_table::all_precise());
    st.selective = all;
    auto const x = estimate_memory(m, p, st, {}, policy_table::all_precise());
    for (std::size_t s = 0; s < 2; ++s) {
      std::int64_t const n = 2 - static_cast<std::int64_t>(s);
      CHECK(x[s].activations == n * 4 * 327680);
      CHECK(x[s].recompute == 0);
      CHECK(x[s].states() == base[s].states());
    }
    CHECK(x[0].working == 65536 + 720896);
    CHECK(x[0].total() == base[0].total() - 2 * 4 * (854016 - 327680) + 720896 - 460800);
    // The default policy's storage: the kept kinds as it says, the recomputed ones not at all.
    policy_table const policy;
    st.selective = norms;
    auto const q = estimate_memory(m, p, st, {}, policy);
    shard_shape const sh{1, 128, 1, false};
    CHECK(q[0].activations ==
          2 * 4 *
              layer_activation_bytes(
                  m, sh, [&](tensor_kind k) { return policy.default_storage(k); }, norms));
    // Full and selective recomputation exclude each other (Megatron's granularity is one).
    st.recompute = recompute_method::block;
    st.recompute_layers = 1;
    CHECK_THROWS_WITH_AS(estimate_memory(m, p, st, {}, policy),
                         doctest::Contains("exclude each other"), agoq::invalid_argument);
  }
}

TEST_CASE("activations of an interleaved pipeline, by hand") {
  // 8 layers, p = 2, v = 2, m = 4: chunks of 2 layers; device 0 holds layers 0-1 (chunk 0) and
  // 4-5 (chunk 1), device 1 layers 2-3 and 6-7 with the output head. Peak moments (previous
  // test): device 0 (3,2) and (4,1); device 1 (2,1) and (3,0).
  model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 2;
  p.virtual_stages = 2;
  step_config const st{1, 128, 4};
  std::int64_t const layer = small_layer_bytes;
  std::int64_t const head = 2 * 2 * 128 * 256 + 4 * 128 * 1000;
  // Default policy, one layer (as in the 1F1B test above).
  std::int64_t const i8 = 128 * 256 + 128 * 2 * 4;
  std::int64_t const i4h = 128 * 128 + 128 * 2 * 4;
  std::int64_t const i4f = 128 * 256 + 128 * 4 * 4;
  std::int64_t const attn = 128 * 256 * 2 * 2 + 2 * 128 * 128 * 2 + 4 * 128 * 4;
  std::int64_t const q = 2 * i8 + 2 * i4h + 3 * i4f + attn;
  // Parameters: 4 layers of 256 * 256 (Q) + 2 * 256 * 128 (K, V) + 256 * 256 (O) + 3 * 256 * 512
  // (gate, up, down) + 2 * 256 (norms), plus the embedding on device 0 and the untied head and
  // final norm on device 1; 2 + 4 + 4 + 8 bytes each (bf16, master, fp32 gradient, Adam).
  std::int64_t const per_layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512 + 2 * 256;
  std::int64_t const states0 = 18 * (4 * per_layer + 1000 * 256);
  std::int64_t const states1 = 18 * (4 * per_layer + 1000 * 256 + 256);

  // The transient memory: the flash-attention phase of a layer's backward, the largest here
  // whatever the storage (see "transient working memory of a layer, by hand"), 526,336 bytes, and
  // the 1 GiB allowance; fp32 gradients need no buffers.
  std::int64_t const transient = 526336 + (std::int64_t{1} << 30);

  // bf16: equal chunks (2 layer bytes each); both of device 0's moments hold 5 chunks; on device
  // 1 the moment (2,1) also holds the head. The per-chunk maxima (4,2) and (3,1) would have
  // counted 12 and 8 layers (+ 1 head).
  auto const b = estimate_memory(m, p, st, {}, policy_table::all_precise());
  REQUIRE(b.size() == 2);
  CHECK(b[0].in_flight == std::vector<std::int64_t>{3, 2});
  CHECK(b[0].activations == 10 * layer);
  CHECK(b[0].transient() == transient);
  CHECK(b[0].total() == states0 + 10 * layer + transient);
  CHECK(b[1].in_flight == std::vector<std::int64_t>{2, 1});
  CHECK(b[1].activations == 6 * layer);
  CHECK(b[1].head_activations == head);
  CHECK(b[1].transient() == transient);
  CHECK(b[1].total() == states1 + 6 * layer + head + transient);

  // Layers 0-3 in bf16, 4-7 as the default policy: chunk 0 is the larger on both devices.
  // Device 0: (3,2) holds 6 layer + 4 q, (4,1) 8 layer + 2 q: the peak is (4,1).
  // Device 1: (2,1) holds 4 layer + 2 q + head = 4,870,144 bytes, (3,0) 6 layer = 5,124,096:
  // the peak is (3,0), when no micro-batch of the head is in flight.
  policy_table const policy;
  auto const x = estimate_memory(m, p, st, {}, [&](std::int64_t l, tensor_kind k) {
    return l < 4 ? storage::precise() : policy.default_storage(k);
  });
  CHECK(4 * layer + 2 * q + head == 4870144);
  CHECK(6 * layer == 5124096);
  CHECK(x[0].in_flight == std::vector<std::int64_t>{4, 1});
  CHECK(x[0].activations == 8 * layer + 2 * q);
  CHECK(x[0].total() == states0 + 8 * layer + 2 * q + transient);
  CHECK(x[0].total() == 54755328 + transient);
  CHECK(x[1].in_flight == std::vector<std::int64_t>{3, 0});
  CHECK(x[1].activations == 6 * layer);
  CHECK(x[1].head_activations == 0);
  CHECK(x[1].total() == states1 + 6 * layer + transient);
  CHECK(x[1].total() == 52240896 + transient);
}

TEST_CASE("transient working memory of a layer, by hand") {
  auto const precise = [](tensor_kind) { return false; };
  auto const all = [](tensor_kind) { return true; };
  SUBCASE("grouped-query attention dominates: h 256, f 512, 4 heads of 64, 2 kv heads") {
    // T0 = T = 128 tokens, q = 256, k = 128, f = 512, no SP (G = 0), L = 4 * 4 * 128 = 2048.
    // R = 2 T h = 65,536. Phases: down 2 T0 f = 131,072; SwiGLU 6 T0 f = 393,216; gate/up
    // 4 T0 f + 2 T0 h = 327,680; output projection 2 T0 q = 65,536; attention 2 T0 q (65,536) +
    // 2 T0 (q + 2k) (131,072) + 4 T0 q (131,072) + L (2,048) + 4 T0 q (k < q: 131,072) = 460,800;
    // QKV 2 T0 (q + 2k) + 2 T0 h = 196,608.
    model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
    shard_shape const sh{1, 128, 1, false};
    CHECK(layer_working_bytes(m, sh, precise) == 65536 + 460800);
    // Everything quantized adds the bf16 copies of Q (65,536), K and V (32,768 each), O (65,536)
    // and the logsumexp (2,048) to the attention phase: 659,456.
    CHECK(layer_working_bytes(m, sh, all) == 65536 + 659456);
    // The head: logits 2 T0 V = 256,000, input gradient 2 T0 h = 65,536; staged, the head
    // weight's bf16 gradient 2 V h = 512,000 more.
    CHECK(head_working_bytes(m, sh, false) == 321536);
    CHECK(head_working_bytes(m, sh, true) == 321536 + 512000);
  }
  SUBCASE("the MLP dominates: h 128, f 448, 4 heads of 32, 2 kv heads") {
    model_shape const m{block_style::llama, 4, 128, 448, 4, 2, 32, 1000, false};
    // TP 2 with SP: T0 = 64, T = 32, q = 64, k = 32, f = 224, G = 2 T0 h = 16,384, R = 2 T h =
    // 8,192. down G + 2 T0 f = 45,056 (+ 28,672 quantized); SwiGLU 6 T0 f = 86,016; gate/up
    // 4 T0 f + 2 T0 h + G = 90,112 (+ D(mlp_input) = 2 T h = 8,192 quantized); attention 2 T0 q
    // (8,192) + 2 T0 (q + 2k) (16,384) + 4 T0 q (16,384) + L (4 * 2 * 64 = 512) + 4 T0 q
    // (16,384) = 57,856 (+ 25,088 quantized); QKV 2 T0 (q + 2k) + 2 T0 h + G = 49,152.
    shard_shape const sp{1, 64, 2, true};
    CHECK(layer_working_bytes(m, sp, precise) == 8192 + 90112);
    CHECK(layer_working_bytes(m, sp, all) == 8192 + 90112 + 8192);
    // Only mlp_input's copy counts there: the others' phases stay below.
    CHECK(layer_working_bytes(m, sp, [](tensor_kind k) { return k == tensor_kind::mlp_input; }) ==
          8192 + 90112 + 8192);
    CHECK(layer_working_bytes(m, sp, [](tensor_kind k) { return k != tensor_kind::mlp_input; }) ==
          8192 + 90112);
    // Head, TP 2: logits 2 T0 V/2 = 64,000, input gradient 2 T0 h = 16,384, G = 16,384.
    CHECK(head_working_bytes(m, sp, false) == 96768);
    // TP 2 without SP: T = 64, G = 0, R = 16,384. SwiGLU 86,016 is the largest bf16 phase; with
    // D(mlp_input) = 2 T h = 16,384 gate/up reaches 57,344 + 16,384 + 16,384 = 90,112.
    shard_shape const tp{1, 64, 2, false};
    CHECK(layer_working_bytes(m, tp, precise) == 16384 + 86016);
    CHECK(layer_working_bytes(m, tp, all) == 16384 + 90112);
  }
  SUBCASE("GPT block: h 128, f 512, 4 heads (multi-head, no expansion)") {
    // T0 = T = 64, q = k = 128, f = 512, L = 4 * 4 * 64 = 1,024, R = 16,384. FC2 2 T0 f = 65,536
    // (+ 65,536 quantized); GeLU 4 T0 f = 131,072; FC1 2 T0 f + 2 T0 h = 81,920 (+ 16,384);
    // attention 16,384 + 49,152 + 32,768 + 1,024 = 99,328 (+ 4 x 16,384 + 1,024 quantized);
    // QKV 49,152 + 16,384 = 65,536 (+ 16,384).
    model_shape const m{block_style::gpt, 4, 128, 512, 4, 4, 0, 1000, false};
    shard_shape const sh{1, 64, 1, false};
    CHECK(layer_working_bytes(m, sh, precise) == 16384 + 131072);
    // The default policy keeps the attention core precise: FC2 then ties GeLU at 131,072.
    CHECK(layer_working_bytes(m, sh, [](tensor_kind k) {
            return category_of(k) != tensor_category::attention_core;
          }) == 16384 + 131072);
    CHECK(layer_working_bytes(m, sh, all) == 16384 + 99328 + 66560);
  }
}

TEST_CASE("gradient buffers, by hand") {
  model_shape const m = preset_model("llama3-8b");
  parallel_config p;
  p.tp = 2;
  p.dp = 4;
  p.zero_stage = 1;
  step_config st;
  std::int64_t const held = 2'000'000'000;  // parameters on the device: more than any bucket
  // The largest matrix of a layer on a TP-2 rank: gate and up together, 2 x 7168 x 4096, more than
  // Megatron-Core's default bucket of max(40,000,000, 4 x 1,000,000) parameters.
  CHECK(largest_layer_matrix(m, 2) == 58720256);
  CHECK(bucket_parameters(m, p, st, held) == 58720256);
  // fp32 and bf16 gradients accumulate in place and reduce in place.
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::fp32, held) == 0);
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::bf16, held) == 0);
  // 8-bit, ZeRO-1 (reduce-scatter): bf16 staging 2 n = 117,440,512; the workspace: 458,752 groups
  // of 128, 114,688 per rank, blocks of 16 + 114,688 x 132 = 15,138,832 bytes; 4 of them,
  // 60,555,328, padded to 60,555,520, sent and received; 8 x (4 + 3) bytes of counters.
  std::int64_t const rs = 2 * 60555520 + 56;
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::int8_g128, held) == 117440512 + rs);
  // ZeRO-0 (all-reduce) also holds the fp32 sums of one chunk, 4 x 114,688 x 128 bytes.
  p.zero_stage = 0;
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::int8_g128, held) ==
        117440512 + rs + 58720256);
  // Sharded fp32 gradients (ZeRO-2) are staged but reduced in place by NCCL.
  p.zero_stage = 2;
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::fp32, held) == 117440512);
  // A larger bucket of the user's; one rank: no collective, the 8-bit buffer still stages.
  st.bucket_parameters = 100'000'000;
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::fp32, held) == 200000000);
  p.dp = 1;
  p.zero_stage = 0;
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::fp32, held) == 0);
  CHECK(gradient_buffer_bytes(m, p, st, gradient_format::int8_g128, held) == 200000000);
  // A bucket never holds more than the device: stage 0 of the small model below, 4 layers of
  // 590,336 parameters and the 256,000 of the embedding, 2,617,344 in all.
  model_shape const small{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config q;
  q.pp = 2;
  auto const stages = estimate_memory(
      small, q, {1, 128, 0}, {gradient_format::int8_g128, optimizer_format::fp32}, policy_table{});
  CHECK(stages[0].parameters == 2617344);
  CHECK(stages[0].gradient_buffers == 2 * 2617344);
}

TEST_CASE("transient memory of a whole pipeline, by hand") {
  // LLaMA-3-8B, TP 2, PP 4, DP 4, ZeRO-1, SP, 1 x 8192 tokens: T0 = 8192, T = 4096, q = 2048,
  // k = 512, f = 7168, V/2 = 64,128. R = 2 T h = 33,554,432; gate/up 4 T0 f + 2 T0 h + G =
  // 234,881,024 + 67,108,864 + 67,108,864 = 369,098,752 is the largest phase; agoq's default
  // policy quantizes mlp_input, whose bf16 copy adds 2 T h = 33,554,432. Last stage: the head,
  // 2 T0 V/2 + 2 T0 h + G = 1,050,673,152 + 134,217,728 = 1,184,890,880, and with 8-bit gradients
  // the head weight's bf16 gradient 2 x 64,128 x 4096 = 525,336,576.
  model_shape const m = preset_model("llama3-8b");
  parallel_config const p{2, 4, 4, 1, 1, true};
  step_config const st{1, 8192, 0};
  auto const base = estimate_memory(m, p, st, {}, policy_table::all_precise());
  auto const agoq = estimate_memory(m, p, st, {gradient_format::int8_g128, optimizer_format::fp32},
                                    policy_table{});
  std::int64_t const gib = std::int64_t{1} << 30;
  for (std::size_t s = 0; s < 3; ++s) {
    CHECK(base[s].working == 33554432 + 369098752);
    CHECK(agoq[s].working == 33554432 + 369098752 + 33554432);
  }
  CHECK(base[3].working == 1184890880);
  CHECK(agoq[3].working == 1184890880 + 525336576);
  for (std::size_t s = 0; s < 4; ++s) {
    CHECK(base[s].gradient_buffers == 0);
    CHECK(agoq[s].gradient_buffers == 117440512 + 2 * 60555520 + 56);
    CHECK(base[s].reserved == gib);
    CHECK(agoq[s].transient() == agoq[s].working + agoq[s].gradient_buffers + gib);
    CHECK(agoq[s].total() ==
          agoq[s].states() + agoq[s].activations + agoq[s].head_activations + agoq[s].transient());
  }
  // The allowance is the user's: none at all leaves the working memory and the buffers.
  step_config bare = st;
  bare.reserved_bytes = 0;
  CHECK(estimate_memory(m, p, bare, {}, policy_table::all_precise())[0].transient() ==
        33554432 + 369098752);
  bare.reserved_bytes = -1;
  CHECK_THROWS_AS(estimate_memory(m, p, bare, {}, policy_table{}), agoq::invalid_argument);
}

TEST_CASE("context parallelism, by hand") {
  // LLaMA-3-8B, TP 2, PP 4, DP 4, ZeRO-1, SP. With CP 2 each rank holds 4096 of a sequence's
  // 8192 tokens: the activations of CP 1 with 4096-token sequences, the states of DP 8.
  model_shape const m = preset_model("llama3-8b");
  parallel_config p{2, 4, 4, 1, 1, true};
  p.cp = 2;
  CHECK(p.gradient_ranks() == 8);
  parallel_config half = p;
  half.cp = 1;
  parallel_config dp8 = half;
  dp8.dp = 8;
  state_formats const agoq8{gradient_format::int8_g128, optimizer_format::fp32};
  for (auto const f : {state_formats{}, agoq8}) {
    auto const cp = estimate_memory(m, p, {1, 8192, 0}, f, policy_table{});
    auto const short_seq = estimate_memory(m, half, {1, 4096, 0}, f, policy_table{});
    auto const wide = estimate_memory(m, dp8, {1, 4096, 0}, f, policy_table{});
    for (std::size_t s = 0; s < 4; ++s) {
      CHECK(cp[s].activations == short_seq[s].activations);
      CHECK(cp[s].head_activations == short_seq[s].head_activations);
      CHECK(cp[s].states() == wide[s].states());
      CHECK(cp[s].master_weights < short_seq[s].master_weights);
      CHECK(cp[s].gradient_buffers == wide[s].gradient_buffers);
      // The ring attention's buffers: 16 T0 k = 16 x 4096 x 512 on the attention phase, which
      // stays below the gate/up phase here, so the working memory is CP 1's at 4096 tokens.
      CHECK(cp[s].working == short_seq[s].working);
    }
  }
  // The split needs 2 cp equal chunks of each sequence; cp is positive.
  CHECK_THROWS_WITH_AS(estimate_memory(m, p, {1, 8190, 0}, {}, policy_table{}),
                       doctest::Contains("2 cp = 4 equal chunks"), agoq::invalid_argument);
  CHECK_NOTHROW(estimate_memory(m, p, {1, 8196, 0}, {}, policy_table{}));
  p.cp = 0;
  CHECK_THROWS_AS(estimate_memory(m, p, {1, 8192, 0}, {}, policy_table{}), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(shard_of(p, {1, 8192, 0}), doctest::Contains("cp must be positive, got 0"),
                       agoq::invalid_argument);
  CHECK_THROWS_AS(
      layer_working_bytes(m, shard_shape{1, 8192, 2, true, 0}, [](tensor_kind) { return false; }),
      agoq::invalid_argument);
  // The ring attention's working memory: h 256, f 512, 4 heads of 64, 2 kv heads, T0 = 128
  // tokens on the rank, q = 256, k = 128, L = 2,048, R = 65,536 (the first case of "transient
  // working memory of a layer"): attention 460,800 is the largest phase. CP adds the backward's
  // two KV-and-gradient buffers, 16 T0 k = 262,144, to it: 65,536 + 722,944 = 788,480. The
  // forward keeps cp KV chunks, outputs and logsumexps, cp (4 T0 k + 2 T0 q + L) = cp x 133,120:
  // 266,240 for cp 2, below the backward, 1,064,960 for cp 8, above it.
  model_shape const small{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  auto const precise = [](tensor_kind) { return false; };
  CHECK(layer_working_bytes(small, shard_shape{1, 128, 1, false}, precise) == 65536 + 460800);
  CHECK(layer_working_bytes(small, shard_shape{1, 128, 1, false, 2}, precise) == 788480);
  CHECK(layer_working_bytes(small, shard_shape{1, 128, 1, false, 8}, precise) == 1064960);
  // ... and estimate_memory passes the rank's part and cp on: 1 x 1024 tokens over CP 8 on one
  // pipeline device is that layer working set, or the head's if larger.
  parallel_config ring;
  ring.cp = 8;
  auto const one = estimate_memory(small, ring, {1, 1024, 0}, {}, policy_table{})[0];
  CHECK(one.working ==
        std::max<std::int64_t>(1064960,
                               head_working_bytes(small, shard_shape{1, 128, 1, false, 8}, false)));
}

TEST_CASE("configuration errors") {
  parallel_config p;
  p.pp = 3;
  CHECK_THROWS_WITH_AS(p.validate(preset_model("llama3-8b")), doctest::Contains("do not split"),
                       agoq::invalid_argument);
  p.pp = 1;
  p.virtual_stages = 2;
  CHECK_THROWS_AS(p.validate(preset_model("llama3-8b")), agoq::invalid_argument);
  p.virtual_stages = 1;
  p.zero_stage = 4;
  CHECK_THROWS_AS(p.validate(preset_model("llama3-8b")), agoq::invalid_argument);
}

TEST_CASE("sizes past 64-bit byte counts are refused, not wrapped") {
  model_shape m = preset_model("llama3-8b");
  parallel_config p;
  step_config st;
  state_formats const f;
  auto const estimate = [&] { return estimate_memory(m, p, st, f, policy_table{}); };
  // A model of more than 2^56 parameters (hidden 10^14: 4 h f alone is 5.7e27).
  m.hidden = 100'000'000'000'000;
  CHECK_THROWS_WITH_AS(m.validate(), doctest::Contains("more than 2^56"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(estimate(), doctest::Contains("more than 2^56"), agoq::invalid_argument);
  m.hidden = 4096;
  m.vocab = 4'000'000'000'000'000;
  CHECK_THROWS_AS(estimate(), agoq::invalid_argument);
  m.vocab = 128256;
  // Tokens: 4 x 10^12 a micro-batch make one layer's tensors about 10^20 bytes.
  st.seq = 4'000'000'000'000;
  CHECK_THROWS_WITH_AS(estimate(), doctest::Contains("tokens are too many"),
                       agoq::invalid_argument);
  CHECK_THROWS_AS(shape_of(tensor_kind::query, m, shard_of(p, st)), agoq::invalid_argument);
  CHECK_THROWS_AS(head_activation_bytes(m, shard_of(p, st)), agoq::invalid_argument);
  CHECK_THROWS_AS(head_working_bytes(m, shard_of(p, st), false), agoq::invalid_argument);
  // Each tensor fits, the pipeline's in-flight copies do not: 2^22 groups of 2^30 micro-batches
  // (g = 2^40) in flight at once on 2 chunks, 8 layers each of about 2^24 bytes.
  st.seq = 8192;
  p.pp = 2;
  p.virtual_stages = 2;
  p.vp_group = std::int64_t{1} << 40;
  CHECK_THROWS_WITH_AS(estimate(), doctest::Contains("the step is too large"),
                       agoq::invalid_argument);
  // 2^22 micro-batches a group, g + 3 chunk units in flight on device 0 (its warm-up, 2 (p - 1)
  // + (v - 1) g, plus one): counted, about 2^53.8 bytes.
  p.vp_group = std::int64_t{1} << 22;
  auto const many = estimate();
  CHECK(peak_total(many) > std::int64_t{1} << 53);
  CHECK(many[0].in_flight[0] + many[0].in_flight[1] == p.vp_group + 3);
  // A group size whose 3 g and v g overflow: refused by the schedule itself.
  p.vp_group = std::int64_t{4'000'000'000'000'000'000};
  CHECK_THROWS_WITH_AS(in_flight_peaks(schedule_of(p, st), 0),
                       doctest::Contains("too large to count"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(peak_in_flight_units(schedule_of(p, st), 0),
                       doctest::Contains("too large to count"), agoq::invalid_argument);
  p.vp_group = 0;
  st.micro_batches = std::int64_t{3} << 61;  // v m = 3 x 2^62
  CHECK_THROWS_WITH_AS(peak_in_flight_units(schedule_of(p, st), 0),
                       doctest::Contains("too large to count"), agoq::invalid_argument);
  // 1F1B holds at most pp micro-batches, whatever m: counted (v m = m <= 2^62).
  p.virtual_stages = 1;
  st.micro_batches = std::int64_t{1} << 62;
  CHECK(peak_in_flight_units(schedule_of(p, st), 0) == 2);
  CHECK_NOTHROW(estimate());
  // A reserved allowance near 2^63 would wrap the total.
  st.reserved_bytes = std::int64_t{1} << 62;
  CHECK_THROWS_WITH_AS(estimate(), doctest::Contains("the step is too large"),
                       agoq::invalid_argument);
  st.reserved_bytes = default_reserved_bytes;
  // pp x virtual_stages past 2^63 must not wrap into a divisor of the layers.
  p.pp = std::int64_t{1} << 32;
  p.virtual_stages = std::int64_t{1} << 32;
  CHECK_THROWS_WITH_AS(p.validate(m), doctest::Contains("do not split"), agoq::invalid_argument);
  p.virtual_stages = 1;
  p.pp = 1;
  // ZeRO-3 over 4 x 10^18 ranks: the 8-bit collective's workspace (about 148 bytes a rank)
  // cannot be counted.
  p.dp = 4'000'000'000'000'000'000;
  p.zero_stage = 3;
  CHECK_THROWS_WITH_AS(estimate(), doctest::Contains("the step is too large"),
                       agoq::invalid_argument);
  // Over 2^40 ranks it can: each rank shards one of the 8 billion parameters, and
  // Megatron-Core's default bucket, 10^6 dp parameters (which would overflow), is capped at what
  // the device holds.
  p.dp = std::int64_t{1} << 40;
  auto const huge_dp = estimate_memory(
      m, p, st, {gradient_format::int8_g128, optimizer_format::fp32}, policy_table{});
  CHECK(huge_dp[0].weights == 2);
  CHECK(huge_dp[0].master_weights == 4);
  CHECK(huge_dp[0].gradient_buffers > 0);
  CHECK(bucket_parameters(m, p, st, huge_dp[0].parameters) == huge_dp[0].parameters);
  // Megatron's reference formula refuses what it cannot count.
  CHECK_THROWS_AS(megatron_layer_activation_bytes(std::int64_t{1} << 40, 1, 4096, 32, 1, false),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(megatron_layer_activation_bytes(0, 1, 4096, 32, 1, false),
                  agoq::invalid_argument);
}
