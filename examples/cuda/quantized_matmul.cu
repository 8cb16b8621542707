// A custom CUDA kernel that writes its output quantized: a tiled matmul C = A * B (bf16 inputs,
// fp32 accumulation) whose epilogue stores C as int8 codes with one fp32 scale per 128 columns
// through agoq::device::quantize_epilogue, instead of writing a bf16 C and quantizing it later.
// The host checks the result against the CPU executor applied to the same fp32 accumulators.
#include <agoq/agoq.hpp>
#include <agoq/cuda_check.hpp>
#include <agoq/device/epilogue.cuh>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

namespace {

using scheme = agoq::scheme<agoq::int_sym<8>, agoq::per_group<128>>;
using epilogue = agoq::device::quantize_epilogue<scheme, 8>;

constexpr int tile_rows = 16;   // rows of C per block
constexpr int tile_cols = 128;  // columns of C per block: 16 threads x 8 columns
constexpr int tile_k = 32;

// Each of the 256 threads computes 8 consecutive columns of one row of a 16 x 128 tile of C.
// 16 consecutive lanes hold the 128 columns of one group, as the epilogue requires.
__global__ void matmul_quantized(agoq::bfloat16 const* a, agoq::bfloat16 const* b, int m, int n,
                                 int k, epilogue out) {
  __shared__ float as[tile_rows][tile_k];
  __shared__ float bs[tile_k][tile_cols];
  int const tx = static_cast<int>(threadIdx.x) % 16;
  int const ty = static_cast<int>(threadIdx.x) / 16;
  int const row = static_cast<int>(blockIdx.y) * tile_rows + ty;
  int const col = static_cast<int>(blockIdx.x) * tile_cols + tx * 8;
  float acc[8] = {};
  for (int k0 = 0; k0 < k; k0 += tile_k) {
    for (int i = static_cast<int>(threadIdx.x); i < tile_rows * tile_k; i += blockDim.x) {
      int const r = static_cast<int>(blockIdx.y) * tile_rows + i / tile_k, c = k0 + i % tile_k;
      as[i / tile_k][i % tile_k] = r < m && c < k ? __bfloat162float(a[r * k + c]) : 0.0f;
    }
    for (int i = static_cast<int>(threadIdx.x); i < tile_k * tile_cols; i += blockDim.x) {
      int const r = k0 + i / tile_cols,
                c = static_cast<int>(blockIdx.x) * tile_cols + i % tile_cols;
      bs[i / tile_cols][i % tile_cols] = r < k && c < n ? __bfloat162float(b[r * n + c]) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < tile_k; ++kk) {
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(as[ty][kk], bs[kk][tx * 8 + j], acc[j]);
    }
    __syncthreads();
  }
  out(row, col, acc);  // codes and the group's scale, straight from the accumulators
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("quantized_matmul: no CUDA device, nothing to run\n");
    return 0;
  }
  int const m = 100, n = 300, k = 70;  // ragged in every dimension
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<agoq::bfloat16> a(m * k), b(k * n);
  for (auto& v : a) v = agoq::numeric::from_float<agoq::bfloat16>(normal(gen));
  for (auto& v : b) v = agoq::numeric::from_float<agoq::bfloat16>(normal(gen));

  agoq::bfloat16 *da = nullptr, *db = nullptr;
  std::uint8_t* dq = nullptr;
  agoq::spec const s = scheme::to_spec();
  agoq::quantized_layout const l = agoq::make_layout(s, m, n);
  AGOQ_CUDA_TRY(cudaMalloc(&da, a.size() * sizeof(a[0])));
  AGOQ_CUDA_TRY(cudaMalloc(&db, b.size() * sizeof(b[0])));
  AGOQ_CUDA_TRY(cudaMalloc(&dq, l.total_bytes));
  AGOQ_CUDA_TRY(cudaMemcpy(da, a.data(), a.size() * sizeof(a[0]), cudaMemcpyHostToDevice));
  AGOQ_CUDA_TRY(cudaMemcpy(db, b.data(), b.size() * sizeof(b[0]), cudaMemcpyHostToDevice));
  epilogue const out{agoq::view_of_buffer(s, m, n, dq)};
  dim3 const grid((n + tile_cols - 1) / tile_cols, (m + tile_rows - 1) / tile_rows);
  matmul_quantized<<<grid, 256>>>(da, db, m, n, k, out);
  AGOQ_CUDA_TRY(cudaGetLastError());
  agoq::quantized_tensor got(s, m, n);
  AGOQ_CUDA_TRY(cudaMemcpy(got.data(), dq, l.total_bytes, cudaMemcpyDeviceToHost));

  // The same accumulators on the host (same order, explicit fma), quantized by the CPU executor.
  std::vector<float> c(m * n, 0.0f);
  for (int i = 0; i < m; ++i) {
    for (int kk = 0; kk < k; ++kk) {
      float const av = agoq::numeric::to_float(a[i * k + kk]);
      for (int j = 0; j < n; ++j) {
        c[i * n + j] = std::fma(av, agoq::numeric::to_float(b[kk * n + j]), c[i * n + j]);
      }
    }
  }
  agoq::quantized_tensor want(s, m, n);
  agoq::quantize(agoq::host, agoq::matrix_view<float const>(c.data(), m, n), want.view());
  bool const same =
      std::memcmp(got.data(), want.data(), l.codes_bytes) == 0 &&
      std::memcmp(got.data() + l.scales_offset, want.data() + l.scales_offset, l.scales_bytes) == 0;
  std::printf("quantized_matmul: %dx%d int8 g128 output, %lld bytes instead of %d (bf16): %s\n", m,
              n, static_cast<long long>(l.codes_bytes + l.scales_bytes), m * n * 2,
              same ? "bit-identical to the CPU executor" : "MISMATCH");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dq);
  return same ? 0 : 1;
}
