// Shared by the device benchmarks: whether a CUDA device exists, and CUDA-event timing of one
// enqueued operation per benchmark iteration (manual time).
#pragma once

#include <benchmark/benchmark.h>

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

}  // namespace agoq::bench
