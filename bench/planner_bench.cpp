/// \file
/// The activation planner on 128 layers x 16 pipeline stages (a 405B-like LLaMA shape, TP 8,
/// SP, 64 micro-batches; and with 1000 or 4000 micro-batches in Megatron-Core's groups; and every
/// set of recompute modules planned), on LLaMA-3-8B with 4 stages, and on the mixture-of-experts
/// Qwen3-235B-A22B with 8 (expert parallel); single thread, host only.
#include <benchmark/benchmark.h>

#include <cstdint>

#include <agoq/activation/planner.hpp>

namespace {

namespace act = agoq::activation;

act::planner_input input_128x16(std::int64_t virtual_stages) {
  act::planner_input in;
  in.model = {act::block_style::llama, 128, 16384, 53248, 128, 8, 128, 128256, false};
  in.parallel = {8, 16, 8, virtual_stages, 1, true};
  in.step = {1, 8192, 64};
  in.states.gradients = act::gradient_format::int8_g128;
  // 64 GiB: with the transient working memory (2.6 GiB here) m = 1000 in groups of 24 needs 60.4.
  in.budget_bytes = std::int64_t{64} << 30;
  return in;
}

void plan_128_layers_16_stages(benchmark::State& state) {
  act::planner_input const in = input_128x16(state.range(0));
  for (auto _ : state) {
    auto plan = act::make_plan(in);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(plan_128_layers_16_stages)
    ->Arg(1)
    ->Arg(2)
    ->Arg(8)
    ->ArgName("v")
    ->Unit(benchmark::kMillisecond);

// Megatron-Core's interleaved schedule (v = 2) with many micro-batches: m = 1000 in groups of 24
// and m = 4016 in groups of 20 (the last groups hold 16).
void plan_128_layers_16_stages_ragged(benchmark::State& state) {
  act::planner_input in = input_128x16(2);
  in.step.micro_batches = state.range(0);
  in.parallel.vp_group = state.range(1);
  for (auto _ : state) {
    auto plan = act::make_plan(in);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(plan_128_layers_16_stages_ragged)
    ->Args({1000, 24})
    ->Args({4016, 20})
    ->ArgNames({"m", "g"})
    ->Unit(benchmark::kMillisecond);

// in_flight_peaks alone, all 16 devices: v chunks, two groups of 2^30 micro-batches and a last
// one of 20 (the steps it once walked: about (g + r) v, here more than 2^32).
void in_flight_peaks_huge_groups(benchmark::State& state) {
  std::int64_t const g = std::int64_t{1} << 30;
  act::pipeline_schedule const sc{16, state.range(0), 2 * g + 20, g};
  for (auto _ : state)
    for (std::int64_t s = 0; s < sc.pp; ++s) {
      auto peaks = act::in_flight_peaks(sc, s);
      benchmark::DoNotOptimize(peaks);
    }
}
BENCHMARK(in_flight_peaks_huge_groups)
    ->Arg(4)
    ->Arg(16)
    ->ArgName("v")
    ->Unit(benchmark::kMicrosecond);

void plan_llama3_8b(benchmark::State& state) {
  act::planner_input in;
  in.model = {act::block_style::llama, 32, 4096, 14336, 32, 8, 128, 128256, false};
  in.parallel = {2, 4, 4, 1, 1, true};
  in.step = {1, 8192, 0};
  in.states.gradients = act::gradient_format::int8_g128;
  in.budget_bytes = std::int64_t{16} << 30;
  for (auto _ : state) {
    auto plan = act::make_plan(in);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(plan_llama3_8b)->Unit(benchmark::kMillisecond);

// Qwen3-235B-A22B (94 layers: 11, 6 x 12, 11 on 8 stages; 128 experts, 8 a token): TP 4 + SP,
// EP 16, etp 1, DP 8, ZeRO-1, 4096 tokens, under 32 GiB (its default policy needs 25.9).
void plan_qwen3_235b_a22b(benchmark::State& state) {
  act::planner_input in;
  in.model = act::preset_model("qwen3-235b-a22b");
  in.parallel.tp = 4;
  in.parallel.sp = true;
  in.parallel.pp = 8;
  in.parallel.dp = 8;
  in.parallel.zero_stage = 1;
  in.parallel.first_stage_layers = 11;
  in.parallel.last_stage_layers = 11;
  in.parallel.ep = 16;
  in.parallel.etp = 1;
  in.step = {1, 4096, 0};
  in.states.gradients = act::gradient_format::int8_g128;
  in.budget_bytes = std::int64_t{32} << 30;
  for (auto _ : state) {
    auto plan = act::make_plan(in);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(plan_qwen3_235b_a22b)->Unit(benchmark::kMillisecond);

// selective_options: the 8 sets of recompute modules, each planned (v = 1), against one plan
// above (plan_128_layers_16_stages/v:1).
void selective_options_128_layers_16_stages(benchmark::State& state) {
  act::planner_input const in = input_128x16(1);
  for (auto _ : state) {
    auto options = act::selective_options(in);
    benchmark::DoNotOptimize(options);
  }
}
BENCHMARK(selective_options_128_layers_16_stages)->Unit(benchmark::kMillisecond);

// recompute_options: the 8 sets and the 15 full recomputations of chunks of 8 layers (block 1 ..
// 7, uniform 1 .. 8), each planned (v = 1).
void recompute_options_128_layers_16_stages(benchmark::State& state) {
  act::planner_input const in = input_128x16(1);
  for (auto _ : state) {
    auto options = act::recompute_options(in);
    benchmark::DoNotOptimize(options);
  }
}
BENCHMARK(recompute_options_128_layers_16_stages)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
