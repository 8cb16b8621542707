// Device benchmarks of the fused ops (activation/fused.cuh): each fused forward op beside its
// plain op on the same bf16 [rows, 4096] tensors (target: fused <= 1.15x plain), each op's memory
// floor (bm_floor: its bytes moved with and without the saved copies, none of its arithmetic), and
// the backward ops, timed with CUDA events (manual time). Inputs of >= 256 MiB rotate between two
// sets of buffers so that no iteration finds them in the L2. Saved schemes: the default policy's
// (int8_g128 for the RMSNorm input and the residual sum, int4_g128 for SwiGLU's gate and up and
// GeLU's input). Where no CUDA device exists every benchmark is skipped with a message.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <agoq/activation/fused.cuh>
#include <agoq/agoq.hpp>

#include "device_timing.cuh"

namespace {

using agoq::bfloat16;
using agoq::bench::have_device;
using agoq::bench::time_events;
namespace act = agoq::activation;

constexpr std::int64_t cols = 4096;

/// Two sets of device buffers, each of `n` bf16 elements per tensor plus a saved buffer.
struct buffers {
  buffers(std::int64_t n, int tensors, std::int64_t saved_bytes) : n(n), tensors(tensors) {
    for (int k = 0; k < 2; ++k) {
      for (int t = 0; t < tensors; ++t) {
        AGOQ_CUDA_TRY(cudaMalloc(&data[k][t], static_cast<std::size_t>(n) * 2));
        AGOQ_CUDA_TRY(cudaMemset(data[k][t], 0x3c, static_cast<std::size_t>(n) * 2));
      }
      for (int t = 0; t < 2; ++t) {
        AGOQ_CUDA_TRY(cudaMalloc(&saved[k][t], static_cast<std::size_t>(saved_bytes) + 1));
      }
    }
  }
  ~buffers() {
    for (int k = 0; k < 2; ++k) {
      for (int t = 0; t < tensors; ++t) cudaFree(data[k][t]);
      for (int t = 0; t < 2; ++t) cudaFree(saved[k][t]);
    }
  }
  bfloat16* at(int i, int t) const { return static_cast<bfloat16*>(data[i & 1][t]); }
  std::uint8_t* save(int i, int t) const { return static_cast<std::uint8_t*>(saved[i & 1][t]); }
  std::int64_t n;
  int tensors;
  void* data[2][4] = {};
  void* saved[2][2] = {};
};

agoq::matrix_view<bfloat16 const> in(bfloat16 const* p, std::int64_t rows) {
  return agoq::matrix_view<bfloat16 const>(p, rows, cols);
}
agoq::matrix_view<bfloat16> out(bfloat16* p, std::int64_t rows) {
  return agoq::matrix_view<bfloat16>(p, rows, cols);
}

/// RMSNorm forward, plain (state.range(1) == 0) or fused saving x as int8_g128.
void bm_rmsnorm_forward(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  bool const fused = state.range(1) != 0;
  agoq::spec const s = agoq::spec::parse("int8_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 2, l.total_bytes);
  float* rstd = nullptr;
  bfloat16* w = nullptr;
  AGOQ_CUDA_TRY(cudaMalloc(&rstd, static_cast<std::size_t>(rows) * 4));
  AGOQ_CUDA_TRY(cudaMalloc(&w, cols * 2));
  AGOQ_CUDA_TRY(cudaMemset(w, 0x3c, cols * 2));
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    auto const ws = std::span<bfloat16 const>(w, cols);
    auto const rs = std::span<float>(rstd, static_cast<std::size_t>(rows));
    if (fused) {
      act::rmsnorm_forward_async(ex, in(b.at(i, 0), rows), ws, 1e-5f, out(b.at(i, 1), rows),
                                 agoq::view_of_buffer(s, rows, cols, b.save(i, 0)), rs);
    } else {
      act::rmsnorm_forward_async(ex, in(b.at(i, 0), rows), ws, 1e-5f, out(b.at(i, 1), rows), rs);
    }
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 4 + (fused ? l.total_bytes : 0)));
  cudaFree(rstd);
  cudaFree(w);
}

/// SwiGLU forward, plain or fused saving gate and up as int4_g128.
void bm_swiglu_forward(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  bool const fused = state.range(1) != 0;
  agoq::spec const s = agoq::spec::parse("int4_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 3, l.total_bytes);
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    if (fused) {
      act::swiglu_forward_async(ex, in(b.at(i, 0), rows), in(b.at(i, 1), rows),
                                out(b.at(i, 2), rows),
                                agoq::view_of_buffer(s, rows, cols, b.save(i, 0)),
                                agoq::view_of_buffer(s, rows, cols, b.save(i, 1)));
    } else {
      act::swiglu_forward_async(ex, in(b.at(i, 0), rows), in(b.at(i, 1), rows),
                                out(b.at(i, 2), rows));
    }
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 6 + (fused ? 2 * l.total_bytes : 0)));
}

/// GeLU forward, plain or fused saving x as int4_g128.
void bm_gelu_forward(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  bool const fused = state.range(1) != 0;
  agoq::spec const s = agoq::spec::parse("int4_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 2, l.total_bytes);
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    if (fused) {
      act::gelu_forward_async(ex, in(b.at(i, 0), rows), out(b.at(i, 1), rows),
                              agoq::view_of_buffer(s, rows, cols, b.save(i, 0)));
    } else {
      act::gelu_forward_async(ex, in(b.at(i, 0), rows), out(b.at(i, 1), rows));
    }
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 4 + (fused ? l.total_bytes : 0)));
}

/// Residual add, plain or fused saving the sum as int8_g128.
void bm_residual_add(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  bool const fused = state.range(1) != 0;
  agoq::spec const s = agoq::spec::parse("int8_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 3, l.total_bytes);
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    if (fused) {
      act::residual_add_async(ex, in(b.at(i, 0), rows), in(b.at(i, 1), rows), out(b.at(i, 2), rows),
                              agoq::view_of_buffer(s, rows, cols, b.save(i, 0)));
    } else {
      act::residual_add_async(ex, in(b.at(i, 0), rows), in(b.at(i, 1), rows),
                              out(b.at(i, 2), rows));
    }
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 6 + (fused ? l.total_bytes : 0)));
}

/// GeLU backward from an int4_g128 saved input.
void bm_gelu_backward(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  agoq::spec const s = agoq::spec::parse("int4_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 2, l.total_bytes);
  for (int k = 0; k < 2; ++k) AGOQ_CUDA_TRY(cudaMemset(b.save(k, 0), 0, l.total_bytes));
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    act::gelu_backward_async(
        ex, in(b.at(i, 0), rows),
        agoq::const_quantized_view(agoq::view_of_buffer(s, rows, cols, b.save(i, 0))),
        out(b.at(i, 1), rows));
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 4 + l.total_bytes));
}

/// RMSNorm backward (dx and dweight) from an int8_g128 saved input.
void bm_rmsnorm_backward(benchmark::State& state) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  agoq::spec const s = agoq::spec::parse("int8_g128_sym_rne_f32");
  agoq::quantized_layout const l = agoq::make_layout(s, rows, cols);
  buffers b(rows * cols, 2, l.total_bytes);
  for (int k = 0; k < 2; ++k) AGOQ_CUDA_TRY(cudaMemset(b.save(k, 0), 0, l.total_bytes));
  float* rstd = nullptr;
  float* dw = nullptr;
  bfloat16* w = nullptr;
  AGOQ_CUDA_TRY(cudaMalloc(&rstd, static_cast<std::size_t>(rows) * 4));
  AGOQ_CUDA_TRY(cudaMemset(rstd, 0, static_cast<std::size_t>(rows) * 4));
  AGOQ_CUDA_TRY(cudaMalloc(&dw, cols * 4));
  AGOQ_CUDA_TRY(cudaMemset(dw, 0, cols * 4));
  AGOQ_CUDA_TRY(cudaMalloc(&w, cols * 2));
  AGOQ_CUDA_TRY(cudaMemset(w, 0x3c, cols * 2));
  agoq::cuda_executor const ex{cudaStream_t{}};
  time_events(state, [&](int i) {
    act::rmsnorm_backward_async(
        ex, in(b.at(i, 0), rows),
        agoq::const_quantized_view(agoq::view_of_buffer(s, rows, cols, b.save(i, 0))),
        std::span<float const>(rstd, static_cast<std::size_t>(rows)),
        std::span<bfloat16 const>(w, cols), out(b.at(i, 1), rows), std::span<float>(dw, cols));
  });
  state.SetBytesProcessed(state.iterations() * (rows * cols * 4 + l.total_bytes));
  cudaFree(rstd);
  cudaFree(dw);
  cudaFree(w);
}

/// The memory traffic of an op with `inputs` (1 or 2) bf16 input tensors of n16 16-byte words
/// each, one output of as many words and, where s0 is not null, saved copies s0 (and s1) of
/// saved16 words each; none of the op's arithmetic (the output is the inputs' xor, the saved
/// words their indices).
template <int Inputs>
__global__ void traffic_kernel(uint4 const* a, uint4 const* b, uint4* y, std::int64_t n16,
                               uint4* s0, uint4* s1, std::int64_t saved16) {
  std::int64_t const stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t const end = n16 > saved16 ? n16 : saved16;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < end; i += stride) {
    if (i < n16) {
      uint4 v = a[i];
      if constexpr (Inputs == 2) {
        uint4 const w = b[i];
        v = make_uint4(v.x ^ w.x, v.y ^ w.y, v.z ^ w.z, v.w ^ w.w);
      }
      y[i] = v;
    }
    if (i < saved16) {
      auto const k = static_cast<unsigned>(i);
      s0[i] = make_uint4(k, k, k, k);
      if (s1 != nullptr) s1[i] = make_uint4(k, k, k, k);
    }
  }
}

/// The memory floor of an op (state.range(1): 0 the plain op's bytes, 1 the fused op's): the
/// bytes it moves with none of its arithmetic, `inputs` bf16 tensors of state.range(0) bytes
/// read, one written and, fused, `saved` copies of `spec` written. The fused form's time over
/// the plain form's is the least the fused op's can be over the plain op's where memory bounds
/// both (bench/summarize_device.py prints it beside each op).
void bm_floor(benchmark::State& state, int inputs, int saved, char const* spec) {
  if (!have_device()) return state.SkipWithError("no CUDA device");
  std::int64_t const rows = state.range(0) / 2 / cols;
  bool const fused = state.range(1) != 0;
  agoq::quantized_layout const l = agoq::make_layout(agoq::spec::parse(spec), rows, cols);
  buffers b(rows * cols, inputs + 1, l.total_bytes);
  std::int64_t const n16 = rows * cols * 2 / 16;
  std::int64_t const saved16 = fused ? l.total_bytes / 16 : 0;
  int const threads = 256;
  int const blocks = static_cast<int>(std::min<std::int64_t>((n16 + threads - 1) / threads, 65536));
  time_events(state, [&](int i) {
    auto const word = [&](int t) { return reinterpret_cast<uint4*>(b.at(i, t)); };
    auto* s0 = reinterpret_cast<uint4*>(b.save(i, 0));
    auto* s1 = saved == 2 ? reinterpret_cast<uint4*>(b.save(i, 1)) : nullptr;
    if (inputs == 2) {
      traffic_kernel<2><<<blocks, threads>>>(word(0), word(1), word(2), n16, s0, s1, saved16);
    } else {
      traffic_kernel<1><<<blocks, threads>>>(word(0), word(0), word(1), n16, s0, s1, saved16);
    }
    AGOQ_CUDA_TRY(cudaGetLastError());
  });
  state.SetBytesProcessed(state.iterations() *
                          (rows * cols * 2 * (inputs + 1) + saved * saved16 * 16));
}

constexpr std::int64_t mib = 1 << 20;

/// Input sizes 16 MiB and 256 MiB (bf16 bytes of one input tensor), plain (0) and fused (1).
void forward_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {16, 256}) {
    b->Args({m * mib, 0});
    b->Args({m * mib, 1});
  }
  b->ArgNames({"bytes", "fused"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void backward_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {16, 256}) b->Args({m * mib});
  b->ArgNames({"bytes"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_rmsnorm_forward)->Apply(forward_sizes);
BENCHMARK(bm_swiglu_forward)->Apply(forward_sizes);
BENCHMARK(bm_gelu_forward)->Apply(forward_sizes);
BENCHMARK(bm_residual_add)->Apply(forward_sizes);
BENCHMARK_CAPTURE(bm_floor, rmsnorm_forward, 1, 1, "int8_g128_sym_rne_f32")->Apply(forward_sizes);
BENCHMARK_CAPTURE(bm_floor, swiglu_forward, 2, 2, "int4_g128_sym_rne_f32")->Apply(forward_sizes);
BENCHMARK_CAPTURE(bm_floor, gelu_forward, 1, 1, "int4_g128_sym_rne_f32")->Apply(forward_sizes);
BENCHMARK_CAPTURE(bm_floor, residual_add, 2, 1, "int8_g128_sym_rne_f32")->Apply(forward_sizes);
BENCHMARK(bm_rmsnorm_backward)->Apply(backward_sizes);
BENCHMARK(bm_gelu_backward)->Apply(backward_sizes);

BENCHMARK_MAIN();
