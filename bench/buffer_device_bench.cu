// Device benchmark of device_gradient_buffer::accumulate_async (one pass: read the gradient, the
// int8 codes and the fp32 scales, write codes and scales) beside a device-to-device copy of the
// same bytes, timed with CUDA events (manual time). Bytes processed: the gradient and the buffer
// read plus the buffer written. Buckets of 32 and 128 Mi elements, past the 50 MiB L2 of an H100 /
// H200. Where no CUDA device exists every benchmark is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <agoq/gradient/buffer.cuh>

#include "device_timing.cuh"

namespace {

using agoq::bench::have_device;
using agoq::bench::time_copy;
using agoq::bench::time_events;

// Bytes one accumulate of n bf16 elements moves with groups of 128: 2 n read (the gradient), the
// buffer read and written.
std::int64_t accumulate_bytes(std::int64_t n, std::int64_t buffer_bytes) {
  return 2 * n + 2 * buffer_bytes;
}

void bm_accumulate(benchmark::State& state, agoq::rounding_kind rounding) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  cudaStream_t const stream{};
  agoq::gradient::device_gradient_buffer buf(n, {128, rounding, 1}, ::cuda::stream_ref(stream));
  void* g = nullptr;
  AGOQ_CUDA_TRY(cudaMalloc(&g, static_cast<std::size_t>(n) * 2));
  // bf16 0x3c3c (about 0.0115) everywhere: finite, like a real gradient.
  AGOQ_CUDA_TRY(cudaMemset(g, 0x3c, static_cast<std::size_t>(n) * 2));
  std::span<agoq::bfloat16 const> const gs(static_cast<agoq::bfloat16 const*>(g),
                                           static_cast<std::size_t>(n));
  agoq::cuda_executor const ex{::cuda::stream_ref(stream)};
  buf.accumulate_async(ex, gs);  // later calls take the dequantize-add path
  time_events(state, [&](int) { buf.accumulate_async(ex, gs); });
  state.SetBytesProcessed(state.iterations() * accumulate_bytes(n, buf.bytes()));
  cudaFree(g);
}

// A device-to-device copy moving as many bytes as the accumulate reads and writes.
void bm_copy_same_bytes(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const n = state.range(0);
  agoq::gradient::device_gradient_buffer buf(n, {128}, ::cuda::stream_ref(cudaStream_t{}));
  time_copy(state, accumulate_bytes(n, buf.bytes()));
}

void sizes(benchmark::internal::Benchmark* b) {
  b->Arg(std::int64_t{1} << 25)->Arg(std::int64_t{1} << 27);
  b->ArgNames({"elements"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_copy_same_bytes)->Apply(sizes);
BENCHMARK_CAPTURE(bm_accumulate, sr, agoq::rounding_kind::stochastic)->Apply(sizes);
BENCHMARK_CAPTURE(bm_accumulate, rne, agoq::rounding_kind::nearest)->Apply(sizes);

BENCHMARK_MAIN();
