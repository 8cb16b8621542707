// Device benchmarks of the CUDA executor beside a device-to-device copy of the same bytes, timed
// with CUDA events (manual time). Large inputs (>= 256 MiB) rotate between two buffers so that
// no iteration finds its input in the L2; small inputs (1-16 MiB) measure launch-bound sizes.
// Where no CUDA device exists every benchmark is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include <agoq/activation/statistics.cuh>
#include <agoq/agoq.hpp>
#include <agoq/quantize.cuh>

#include "device_timing.cuh"

namespace {

using agoq::bfloat16;

using agoq::bench::have_device;
using agoq::bench::time_events;

/// Two input buffers of `bytes` each, two outputs, rotated per iteration.
struct rotating {
  explicit rotating(std::size_t in_bytes, std::size_t out_bytes) {
    for (int k = 0; k < 2; ++k) {
      AGOQ_CUDA_TRY(cudaMalloc(&in[k], in_bytes));
      AGOQ_CUDA_TRY(cudaMalloc(&out[k], out_bytes));
      AGOQ_CUDA_TRY(cudaMemset(in[k], 0x3c, in_bytes));  // bf16 1.0-ish pattern, finite
      AGOQ_CUDA_TRY(cudaMemset(out[k], 0, out_bytes));
    }
  }
  ~rotating() {
    for (int k = 0; k < 2; ++k) {
      cudaFree(in[k]);
      cudaFree(out[k]);
    }
  }
  void* in[2] = {};
  void* out[2] = {};
};

/// A device-to-device copy of `bytes`: the bandwidth every kernel is compared with. Bytes
/// processed count the read and the write.
void bm_copy(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  auto const bytes = static_cast<std::size_t>(state.range(0));
  rotating buf(bytes, bytes);
  time_events(state, [&](int i) {
    AGOQ_CUDA_TRY(cudaMemcpyAsync(buf.out[i & 1], buf.in[i & 1], bytes, cudaMemcpyDeviceToDevice));
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}

/// Quantize of a bf16 tensor of range(0) bytes ([rows, 4096]) with `name`; bytes processed are the
/// input read plus the codes, scales and zero points written.
void bm_quantize(benchmark::State& state, std::string const& name) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const cols = 4096;
  std::int64_t const rows = state.range(0) / 2 / cols;
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  rotating buf(static_cast<std::size_t>(rows * cols * 2), static_cast<std::size_t>(l.total_bytes));
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    agoq::quantize_async(
        ex,
        agoq::matrix_view<bfloat16 const>(static_cast<bfloat16 const*>(buf.in[i & 1]), rows, cols),
        agoq::view_of_buffer(s, rows, cols, static_cast<std::uint8_t*>(buf.out[i & 1])),
        agoq::quantize_options{1, static_cast<std::uint64_t>(i)});
  });
  std::int64_t const moved = rows * cols * 2 + l.codes_bytes + l.scales_bytes + l.zero_points_bytes;
  state.SetBytesProcessed(state.iterations() * moved);
}

/// Dequantize into bf16; bytes processed are the codes, scales and zero points read plus the bf16
/// output written.
void bm_dequantize(benchmark::State& state, std::string const& name) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const cols = 4096;
  std::int64_t const rows = state.range(0) / 2 / cols;
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  rotating buf(static_cast<std::size_t>(l.total_bytes), static_cast<std::size_t>(rows * cols * 2));
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    agoq::dequantize_async(
        ex,
        agoq::const_quantized_view(
            agoq::view_of_buffer(s, rows, cols, static_cast<std::uint8_t*>(buf.in[i & 1]))),
        agoq::matrix_view<bfloat16>(static_cast<bfloat16*>(buf.out[i & 1]), rows, cols));
  });
  std::int64_t const moved = rows * cols * 2 + l.codes_bytes + l.scales_bytes + l.zero_points_bytes;
  state.SetBytesProcessed(state.iterations() * moved);
}

/// activation::measure (the error model's statistics) of a bf16 tensor under the groups of
/// `name`; bytes processed are the input read. It synchronizes (it returns the statistics) and
/// folds the slices on the host, which the events' time includes.
void bm_measure(benchmark::State& state, std::string const& name) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const cols = 4096;
  std::int64_t const rows = state.range(0) / 2 / cols;
  rotating buf(static_cast<std::size_t>(rows * cols * 2), 1);
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    benchmark::DoNotOptimize(agoq::activation::measure(
        ex,
        agoq::matrix_view<bfloat16 const>(static_cast<bfloat16 const*>(buf.in[i & 1]), rows, cols),
        s));
  });
  state.SetBytesProcessed(state.iterations() * rows * cols * 2);
}

constexpr std::int64_t mib = 1 << 20;

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {1, 4, 16, 256, 1024}) b->Arg(m * mib);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_copy)->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, int8_g128_rne, std::string("int8_g128_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, int8_g128_sr, std::string("int8_g128_sym_sr_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, int4_g128_rne, std::string("int4_g128_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, int4_g128_sr, std::string("int4_g128_sym_sr_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, mxfp8, std::string("mxfp8"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_quantize, int8_row_rne, std::string("int8_row_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_dequantize, int8_g128, std::string("int8_g128_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_dequantize, int4_g128, std::string("int4_g128_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_dequantize, mxfp8, std::string("mxfp8"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_measure, int4_g128, std::string("int4_g128_sym_rne_f32"))->Apply(sizes);
BENCHMARK_CAPTURE(bm_measure, int4_row, std::string("int4_row_sym_rne_f32"))->Apply(sizes);

BENCHMARK_MAIN();
