/// \file
/// The activation planner on 128 layers x 16 pipeline stages (a 405B-like LLaMA shape, TP 8,
/// SP, 64 micro-batches), and on LLaMA-3-8B with 4 stages; single thread, host only.
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
  in.budget_bytes = std::int64_t{60} << 30;
  return in;
}

void plan_128_layers_16_stages(benchmark::State& state) {
  act::planner_input const in = input_128x16(state.range(0));
  for (auto _ : state) {
    auto plan = act::make_plan(in);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(plan_128_layers_16_stages)->Arg(1)->Arg(2)->ArgName("v")->Unit(benchmark::kMillisecond);

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

}  // namespace

BENCHMARK_MAIN();
