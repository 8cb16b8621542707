// Device benchmark of the CUDA AdamW step (optim/adamw.cuh) beside a device-to-device copy that
// moves the same number of bytes, timed with CUDA events (manual time); the ratio of the two
// bytes-per-second figures is the step's share of copy bandwidth (target >= 80%). range(1) picks
// the state: 0 the default 8-bit moments, 1 fp32 moments (plain AdamW through the formats kernel,
// for comparison). Two problems are rotated so that small sizes do not find their state in the
// L2. Where no CUDA device exists every benchmark is skipped with a message.
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

/// The state options of range(1): adamw_state's defaults, or fp32 moments.
agoq::optim::adamw_state_options formats(std::int64_t k) {
  agoq::optim::adamw_state_options o;
  if (k == 1) o.m = o.v = agoq::optim::moment_format::f32;
  return o;
}

/// Bytes one step on n parameters moves: fp32 parameters read and written, the bf16 gradient
/// read, both moments read and written.
std::int64_t step_bytes(std::int64_t n, agoq::optim::adamw_state_options const& o) {
  return n * 4 * 2 + n * 2 + 2 * agoq::optim::moment_bytes(o.m, n, o.block) +
         2 * agoq::optim::moment_bytes(o.v, n, o.block);
}

/// One AdamW problem of n fp32 parameters with a bf16 gradient, in device memory.
struct problem {
  problem(std::int64_t n, agoq::optim::adamw_state_options const& o) : n(n) {
    std::int64_t const m_bytes = agoq::optim::moment_bytes(o.m, n, o.block);
    std::int64_t const v_bytes = agoq::optim::moment_bytes(o.v, n, o.block);
    AGOQ_CUDA_TRY(cudaMalloc(&params, static_cast<std::size_t>(n) * 4));
    AGOQ_CUDA_TRY(cudaMalloc(&grads, static_cast<std::size_t>(n) * 2));
    AGOQ_CUDA_TRY(cudaMalloc(&m, static_cast<std::size_t>(m_bytes)));
    AGOQ_CUDA_TRY(cudaMalloc(&v, static_cast<std::size_t>(v_bytes)));
    AGOQ_CUDA_TRY(cudaMemset(params, 0x3c, static_cast<std::size_t>(n) * 4));  // finite values
    AGOQ_CUDA_TRY(cudaMemset(grads, 0x3c, static_cast<std::size_t>(n) * 2));
    AGOQ_CUDA_TRY(cudaMemset(m, 0, static_cast<std::size_t>(m_bytes)));
    AGOQ_CUDA_TRY(cudaMemset(v, 0, static_cast<std::size_t>(v_bytes)));
    state = agoq::optim::adamw_device_state_of_buffers(n, o, m, v);
    bytes = step_bytes(n, o);
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
  void* m = nullptr;
  void* v = nullptr;
  agoq::optim::adamw_device_state state;
  std::int64_t bytes = 0;
};

/// One AdamW step on range(0) parameters of the state range(1); bytes processed are
/// problem::bytes.
void bm_adamw_step(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  agoq::optim::adamw_state_options const o = formats(state.range(1));
  problem a(n, o), b(n, o);
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

/// A device-to-device copy moving as many bytes as one step on range(0) parameters of the state
/// range(1) (half read, half written): the bandwidth the step is compared with.
void bm_adamw_copy(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  std::int64_t const bytes = step_bytes(n, formats(state.range(1)));
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
  for (std::int64_t k : {0, 1}) {
    for (std::int64_t m : {1, 16, 64, 256}) b->Args({m << 20, k});
  }
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_adamw_copy)->Apply(sizes);
BENCHMARK(bm_adamw_step)->Apply(sizes);

BENCHMARK_MAIN();
