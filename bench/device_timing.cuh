// Shared by the device benchmarks: whether a CUDA device exists, CUDA-event timing of one
// enqueued operation per benchmark iteration (manual time), and the copy baseline.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <agoq/cuda_check.hpp>

namespace agoq::bench {

/// True when a CUDA device is usable.
inline bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// Times `op(i)` (enqueued on the default stream) with CUDA events, one iteration per sample; a
/// first call warms up (first touch of the buffers, the kernel's module load).
template <class Op>
void time_events(benchmark::State& state, Op&& op) {
  cudaEvent_t start, stop;
  AGOQ_CUDA_TRY(cudaEventCreate(&start));
  AGOQ_CUDA_TRY(cudaEventCreate(&stop));
  op(0);
  int i = 1;
  for (auto _ : state) {
    AGOQ_CUDA_TRY(cudaEventRecord(start));
    op(i++);
    AGOQ_CUDA_TRY(cudaEventRecord(stop));
    AGOQ_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    AGOQ_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

/// Times a device-to-device copy of bytes_moved / 2 bytes (so it reads and writes bytes_moved in
/// all, the bytes of the kernel it is the baseline of) and reports bytes_moved per iteration.
inline void time_copy(benchmark::State& state, std::int64_t bytes_moved) {
  auto const half = static_cast<std::size_t>(bytes_moved / 2);
  void* a = nullptr;
  void* b = nullptr;
  AGOQ_CUDA_TRY(cudaMalloc(&a, half));
  AGOQ_CUDA_TRY(cudaMalloc(&b, half));
  time_events(state,
              [&](int) { AGOQ_CUDA_TRY(cudaMemcpyAsync(b, a, half, cudaMemcpyDeviceToDevice)); });
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<std::int64_t>(half));
  cudaFree(a);
  cudaFree(b);
}

}  // namespace agoq::bench
