// Device benchmark of the CUDA AdamW step (optim/adamw.cuh) beside a device-to-device copy that
// moves the same number of bytes, timed with CUDA events (manual time); the ratio of the two
// bytes-per-second figures is the step's share of copy bandwidth (target >= 80%). Two problems
// are rotated so that small sizes do not find their state in the L2. Where no CUDA device exists
// every benchmark is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>

#include <agoq/agoq.hpp>
#include <agoq/optim/adamw.cuh>

#include "device_timing.cuh"

namespace {

using agoq::bfloat16;

using agoq::bench::have_device;
using agoq::bench::time_events;

/// Bytes one step on n parameters moves: fp32 parameters read and written, the bf16 gradient
/// read, both moments' codes and scales read and written.
std::int64_t step_bytes(std::int64_t n) {
  agoq::quantized_layout const lm = agoq::make_layout(agoq::optim::adamw_device_m_spec(), 1, n);
  agoq::quantized_layout const lv = agoq::make_layout(agoq::optim::adamw_device_v_spec(), 1, n);
  return n * 4 * 2 + n * 2 + 2 * (lm.codes_bytes + lm.scales_bytes) +
         2 * (lv.codes_bytes + lv.scales_bytes);
}

/// One AdamW problem of n fp32 parameters with a bf16 gradient, in device memory.
struct problem {
  explicit problem(std::int64_t n) : n(n) {
    agoq::quantized_layout const lm = agoq::make_layout(agoq::optim::adamw_device_m_spec(), 1, n);
    agoq::quantized_layout const lv = agoq::make_layout(agoq::optim::adamw_device_v_spec(), 1, n);
    AGOQ_CUDA_TRY(cudaMalloc(&params, static_cast<std::size_t>(n) * 4));
    AGOQ_CUDA_TRY(cudaMalloc(&grads, static_cast<std::size_t>(n) * 2));
    AGOQ_CUDA_TRY(cudaMalloc(&m, static_cast<std::size_t>(lm.total_bytes)));
    AGOQ_CUDA_TRY(cudaMalloc(&v, static_cast<std::size_t>(lv.total_bytes)));
    AGOQ_CUDA_TRY(cudaMemset(params, 0x3c, static_cast<std::size_t>(n) * 4));  // finite values
    AGOQ_CUDA_TRY(cudaMemset(grads, 0x3c, static_cast<std::size_t>(n) * 2));
    AGOQ_CUDA_TRY(cudaMemset(m, 0, static_cast<std::size_t>(lm.total_bytes)));
    AGOQ_CUDA_TRY(cudaMemset(v, 0, static_cast<std::size_t>(lv.total_bytes)));
    state.m = agoq::view_of_buffer(agoq::optim::adamw_device_m_spec(), 1, n, m);
    state.v = agoq::view_of_buffer(agoq::optim::adamw_device_v_spec(), 1, n, v);
    bytes = step_bytes(n);
  }
  ~problem() {
    cudaFree(params);
    cudaFree(grads);
    cudaFree(m);
    cudaFree(v);
  }
  problem(problem const&) = delete;
  problem& operator=(problem const&) = delete;

  std::int64_t n = 0;
  float* params = nullptr;
  bfloat16* grads = nullptr;
  std::uint8_t* m = nullptr;
  std::uint8_t* v = nullptr;
  agoq::optim::adamw_device_state state;
  std::int64_t bytes = 0;
};

/// One AdamW step on range(0) parameters; bytes processed are problem::bytes.
void bm_adamw_step(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  problem a(n), b(n);
  problem* const p[2] = {&a, &b};
  agoq::cuda_executor const ex{cudaStream_t{}};
  agoq::optim::adamw_hyper const h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  time_events(state, [&](int i) {
    problem& q = *p[i & 1];
    agoq::optim::adamw_step_async(ex, q.state, h, std::span<float>(q.params, q.n),
                                  std::span<bfloat16 const>(q.grads, q.n));
  });
  state.SetBytesProcessed(state.iterations() * a.bytes);
}

/// A device-to-device copy moving as many bytes as one step on range(0) parameters (half read,
/// half written): the bandwidth the step is compared with.
void bm_adamw_copy(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  std::int64_t const bytes = step_bytes(n);
  auto const half_bytes = static_cast<std::size_t>(bytes / 2);
  void* in[2] = {};
  void* out[2] = {};
  for (int k = 0; k < 2; ++k) {
    AGOQ_CUDA_TRY(cudaMalloc(&in[k], half_bytes));
    AGOQ_CUDA_TRY(cudaMalloc(&out[k], half_bytes));
    AGOQ_CUDA_TRY(cudaMemset(in[k], 0, half_bytes));
  }
  time_events(state, [&](int i) {
    AGOQ_CUDA_TRY(cudaMemcpyAsync(out[i & 1], in[i & 1], half_bytes, cudaMemcpyDeviceToDevice));
  });
  for (int k = 0; k < 2; ++k) {
    cudaFree(in[k]);
    cudaFree(out[k]);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * half_bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {1, 16, 64, 256}) b->Arg(m << 20);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_adamw_copy)->Apply(sizes);
BENCHMARK(bm_adamw_step)->Apply(sizes);

BENCHMARK_MAIN();
