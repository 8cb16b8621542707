#include <agoq/activation/memory_model.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

using namespace agoq::activation;

namespace {
model_shape llama3_8b() { return {block_style::llama, 32, 4096, 14336, 32, 8, 128, 128256, false}; }
model_shape qwen_32b() { return {block_style::llama, 64, 5120, 27648, 40, 8, 128, 152064, false}; }
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

/// Replays device `s` of Megatron-LM's schedule for m micro-batches (p stages, v chunks each) as
/// forward_backward_pipelining_{without,with}_interleaving runs it: `warmup` forward units, then
/// one forward and one backward unit per step, then the remaining backward units. Forward unit k
/// runs chunk (k mod p v) / p (get_model_chunk_id), backward unit k the chunk v - 1 - that.
/// Counts the chunk units alive (forward done, backward not yet) after every unit.
replayed replay(std::int64_t p, std::int64_t v, std::int64_t s, std::int64_t m) {
  std::int64_t const total = m * v;
  std::int64_t const warmup =
      std::min(v == 1 ? p - s - 1 : (m == p ? total : 2 * (p - s - 1) + (v - 1) * p), total);
  std::vector<std::int64_t> alive(static_cast<std::size_t>(v), 0);
  std::set<std::vector<std::int64_t>> moments;
  auto chunk = [&](std::int64_t k, bool forward) {
    std::int64_t const c = k % (p * v) / p;
    return static_cast<std::size_t>(forward ? c : v - 1 - c);
  };
  auto forward = [&](std::int64_t k) {
    ++alive[chunk(k, true)];
    moments.insert(alive);
  };
  auto backward = [&](std::int64_t k) {
    REQUIRE(alive[chunk(k, false)] > 0);  // a backward never runs before its forward
    --alive[chunk(k, false)];
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

std::vector<std::vector<std::int64_t>> sorted(std::vector<std::vector<std::int64_t>> x) {
  std::sort(x.begin(), x.end());
  return x;
}
}  // namespace

TEST_CASE("parameter counts match the published models") {
  step_config const st{1, 4096, 0};
  auto const l8 = estimate_memory(llama3_8b(), {}, st, {}, policy_table{});
  CHECK(total_parameters(l8) == 8030261248);  // LLaMA-3-8B
  // Qwen-2.5-32B has 32,763,876,352 with its QKV biases (64 x 7168), which agoq does not model.
  auto const q = estimate_memory(qwen_32b(), {}, st, {}, policy_table{});
  CHECK(total_parameters(q) == 32763876352 - 64 * 7168);
  CHECK(layer_parameters(llama3_8b(), 1) == 218112000);
  CHECK(layer_parameters(llama3_8b(), 4) ==
        (4096 * 1024 * 2 + 4096 * 256 * 2 + 3 * 4096 * 3584 + 2 * 4096));
}

TEST_CASE("states under ZeRO stages, by hand") {
  model_shape const m = llama3_8b();
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
  // The moments of the peak: chunk 0 keeps filling while chunk 1 drains.
  using counts = std::vector<std::vector<std::int64_t>>;
  CHECK(in_flight_peaks(4, 2, 0, 0) == counts{{7, 4}, {8, 3}});
  CHECK(in_flight_peaks(4, 2, 1, 0) == counts{{5, 4}, {6, 3}, {7, 2}, {8, 1}});
  CHECK(in_flight_peaks(4, 2, 3, 8) == counts{{4, 1}, {5, 0}});
  // Per chunk maxima: device 0 chunk 0 reaches 8 (4 warm-up + 4 steady forwards), chunk 1 4, but
  // not at the same moment (8 + 4 = 12 > 11).
  CHECK(in_flight_micro_batches(4, 2, 0, 0) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 2, 3, 0) == std::vector<std::int64_t>{5, 1});
  CHECK(in_flight_micro_batches(4, 2, 0, 8) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 3, 0, 0) == std::vector<std::int64_t>{8, 7, 4});
  // m == p: every forward runs before any backward.
  CHECK(in_flight_peaks(4, 2, 2, 4) == counts{{4, 4}});
  CHECK(peak_in_flight_units(4, 2, 2, 4) == 8);
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
  CHECK(sorted(in_flight_peaks(2, 2, 0, 4)) == replay(2, 2, 0, 4).peaks);
  CHECK(sorted(in_flight_peaks(2, 2, 1, 4)) == replay(2, 2, 1, 4).peaks);
}

TEST_CASE("the schedule replayed unit by unit agrees with the closed forms") {
  for (std::int64_t p = 2; p <= 16; ++p)
    for (std::int64_t v = 1; v <= 4; ++v)
      for (std::int64_t m : {p, 2 * p, 3 * p, 8 * p, std::int64_t{1}, p - 1}) {
        if (v > 1 && m % p != 0) continue;
        for (std::int64_t s = 0; s < p; ++s) {
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          CAPTURE(s);
          replayed const r = replay(p, v, s, m);
          auto const peaks = in_flight_peaks(p, v, s, m);
          CHECK(sorted(peaks) == r.peaks);
          CHECK(peaks.size() == r.peaks.size());  // no moment twice
          for (auto const& n : peaks)
            CHECK(std::accumulate(n.begin(), n.end(), std::int64_t{0}) == r.peak);
          CHECK(peak_in_flight_units(p, v, s, m) == r.peak);
          CHECK(in_flight_micro_batches(p, v, s, m) == r.chunk_max);
          // The formulas of the documentation.
          if (v == 1) {
            CHECK(r.peak == std::min(p - s, m));
          } else if (m == p) {
            CHECK(r.peak == m * v);
          } else {
            CHECK(r.peak == 2 * (p - s - 1) + (v - 1) * p + 1);
            if (s == 0) CHECK(r.peak == p * v + p - 1);
          }
        }
      }
  // No cap: the steady state's moments, the same as for any m >= 3p.
  for (std::int64_t p = 2; p <= 8; ++p)
    for (std::int64_t v = 1; v <= 4; ++v)
      for (std::int64_t s = 0; s < p; ++s) {
        CHECK(in_flight_peaks(p, v, s, 0) == in_flight_peaks(p, v, s, 8 * p));
        CHECK(peak_in_flight_units(p, v, s, 0) == peak_in_flight_units(p, v, s, 8 * p));
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
  std::int64_t const layer = 128 * (6 * 256 * 2 + 2 * 128 * 2 + 3 * 512 * 2) + 4 * 128 * 4;
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

TEST_CASE("activations of an interleaved pipeline, by hand") {
  // 8 layers, p = 2, v = 2, m = 4: chunks of 2 layers; device 0 holds layers 0-1 (chunk 0) and
  // 4-5 (chunk 1), device 1 layers 2-3 and 6-7 with the output head. Peak moments (previous
  // test): device 0 (3,2) and (4,1); device 1 (2,1) and (3,0).
  model_shape const m{block_style::llama, 8, 256, 512, 4, 2, 0, 1000, false};
  parallel_config p;
  p.pp = 2;
  p.virtual_stages = 2;
  step_config const st{1, 128, 4};
  std::int64_t const layer = 128 * (6 * 256 * 2 + 2 * 128 * 2 + 3 * 512 * 2) + 4 * 128 * 4;
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

  // bf16: equal chunks (2 layer bytes each); both of device 0's moments hold 5 chunks; on device
  // 1 the moment (2,1) also holds the head. The per-chunk maxima (4,2) and (3,1) would have
  // counted 12 and 8 layers (+ 1 head).
  auto const b = estimate_memory(m, p, st, {}, policy_table::all_precise());
  REQUIRE(b.size() == 2);
  CHECK(b[0].in_flight == std::vector<std::int64_t>{3, 2});
  CHECK(b[0].activations == 10 * layer);
  CHECK(b[0].total() == states0 + 10 * layer);
  CHECK(b[1].in_flight == std::vector<std::int64_t>{2, 1});
  CHECK(b[1].activations == 6 * layer);
  CHECK(b[1].head_activations == head);
  CHECK(b[1].total() == states1 + 6 * layer + head);

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
  CHECK(x[0].total() == states0 + 8 * layer + 2 * q);
  CHECK(x[0].total() == 54755328);
  CHECK(x[1].in_flight == std::vector<std::int64_t>{3, 0});
  CHECK(x[1].activations == 6 * layer);
  CHECK(x[1].head_activations == 0);
  CHECK(x[1].total() == states1 + 6 * layer);
  CHECK(x[1].total() == 52240896);
}

TEST_CASE("configuration errors") {
  parallel_config p;
  p.pp = 3;
  CHECK_THROWS_WITH_AS(p.validate(llama3_8b()), doctest::Contains("do not split"),
                       agoq::invalid_argument);
  p.pp = 1;
  p.virtual_stages = 2;
  CHECK_THROWS_AS(p.validate(llama3_8b()), agoq::invalid_argument);
  p.virtual_stages = 1;
  p.zero_stage = 4;
  CHECK_THROWS_AS(p.validate(llama3_8b()), agoq::invalid_argument);
}
