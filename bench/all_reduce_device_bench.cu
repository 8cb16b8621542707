// Device benchmark of the fused dequantize-sum kernel of the CUDA 8-bit all-reduce (step 4: the
// owner of a chunk decodes the P received int8 blocks and sums them in fp32) beside a
// device-to-device copy of the same bytes, timed with CUDA events (manual time). Bytes processed
// are the P blocks read plus the fp32 sums written. Where no CUDA device exists every benchmark
// is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>

#include <agoq/gradient/all_reduce.cuh>

#include "device_timing.cuh"

namespace {

using agoq::bench::have_device;
using agoq::bench::time_copy;
using agoq::bench::time_events;
using agoq::gradient::chunk_plan;

// A bucket whose one chunk (this rank's) has range(0) elements, over range(1) ranks.
struct reduce_setup {
  chunk_plan plan;
  std::int64_t bytes_in = 0, bytes_out = 0;
  void* recv = nullptr;
  void* sums = nullptr;

  reduce_setup(std::int64_t chunk, std::int64_t ranks) : plan(chunk * ranks, 128, ranks) {
    bytes_in = ranks * plan.block_bytes();
    bytes_out = 4 * chunk;
    AGOQ_CUDA_TRY(cudaMalloc(&recv, static_cast<std::size_t>(bytes_in)));
    AGOQ_CUDA_TRY(cudaMalloc(&sums, static_cast<std::size_t>(bytes_out)));
    // Codes 0x3c and scales 0x3c3c3c3c (about 0.0115): finite, like a real payload.
    AGOQ_CUDA_TRY(cudaMemset(recv, 0x3c, static_cast<std::size_t>(bytes_in)));
  }
  ~reduce_setup() {
    cudaFree(recv);
    cudaFree(sums);
  }
  reduce_setup(reduce_setup const&) = delete;
  reduce_setup& operator=(reduce_setup const&) = delete;
};

void bm_reduce_blocks(benchmark::State& state, bool average) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  reduce_setup s(state.range(0), state.range(1));
  float const divisor = average ? static_cast<float>(state.range(1)) : 1.0f;
  time_events(state, [&](int) {
    agoq::gradient::detail::launch_reduce(cudaStream_t{}, s.plan, 0,
                                          static_cast<std::byte const*>(s.recv), divisor,
                                          static_cast<float*>(s.sums));
  });
  state.SetBytesProcessed(state.iterations() * (s.bytes_in + s.bytes_out));
}

// A device-to-device copy moving as many bytes as the reduction reads and writes (half read, half
// written).
void bm_copy_same_bytes(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  reduce_setup s(state.range(0), state.range(1));
  time_copy(state, s.bytes_in + s.bytes_out);
}

void shapes(benchmark::internal::Benchmark* b) {
  // A 64 Mi-element bucket (128 MiB of bf16) and a 4 Mi one, on 2, 8 and 64 ranks.
  for (std::int64_t bucket : {std::int64_t{1} << 22, std::int64_t{1} << 26}) {
    for (std::int64_t ranks : {2, 8, 64}) b->Args({bucket / ranks, ranks});
  }
  b->ArgNames({"chunk", "ranks"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_copy_same_bytes)->Apply(shapes);
BENCHMARK_CAPTURE(bm_reduce_blocks, sum, false)->Apply(shapes);
BENCHMARK_CAPTURE(bm_reduce_blocks, average, true)->Apply(shapes);

BENCHMARK_MAIN();
