#include <agoq/activation/memory_model.hpp>

#include <doctest/doctest.h>

#include <cstdint>
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
  // Per chunk maxima of the replayed schedule (chunk 0 keeps filling while chunk 1 drains):
  // device 0: chunk 0 reaches 8 (4 warm-up + 4 steady forwards), chunk 1 4.
  CHECK(in_flight_micro_batches(4, 2, 0, 0) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 2, 3, 0) == std::vector<std::int64_t>{5, 1});
  CHECK(in_flight_micro_batches(4, 2, 0, 8) == std::vector<std::int64_t>{8, 4});
  CHECK(in_flight_micro_batches(4, 3, 0, 0) == std::vector<std::int64_t>{8, 7, 4});
  // m == p: every forward runs before any backward.
  CHECK(in_flight_micro_batches(4, 2, 2, 4) == std::vector<std::int64_t>{4, 4});
  CHECK(peak_in_flight_units(4, 2, 2, 4) == 8);
  // Every per-chunk maximum sum is at least the peak.
  for (std::int64_t s = 0; s < 4; ++s) {
    auto const c = in_flight_micro_batches(4, 2, s, 0);
    CHECK(c[0] + c[1] >= peak_in_flight_units(4, 2, s, 0));
  }
  CHECK_THROWS_AS(in_flight_micro_batches(4, 2, 0, 6), agoq::invalid_argument);
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
