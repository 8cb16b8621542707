// The quantizing epilogue (device/epilogue.cuh) called from a kernel of the test's own, as a GEMM
// epilogue would call it, against the CPU executor's quantize of the same values, bit for bit:
// codes, scales, zero points and non-finite counts, for several codes, group sizes, roundings,
// scale formats and lanes per group, on ragged shapes with NaN and ±Inf among the values.
#include "device_support.cuh"

#include <cstdint>
#include <vector>

#include <agoq/device/epilogue.cuh>

using namespace agoq;
using agoq::test::device_bytes;

namespace {

// Thread t holds N consecutive columns of one row of x ([rows, cols] floats): the row's groups
// side by side, Epilogue::lanes_per_group lanes each, the lanes past the row's end and the threads
// past the last row holding nothing. It hands its values to the epilogue, as a GEMM's thread hands
// its accumulators, and adds the non-finite count it returns into *bad.
template <class Epilogue, int N>
__global__ void epilogue_kernel(float const* x, std::int64_t rows, std::int64_t cols,
                                std::int64_t threads, Epilogue out, unsigned long long* bad) {
  constexpr std::int64_t group = Epilogue::lanes_per_group * N;
  std::int64_t const per_row = (cols + group - 1) / group * Epilogue::lanes_per_group;
  std::int64_t const t = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t const row = t < threads ? t / per_row : rows;
  std::int64_t const col = t < threads ? t % per_row * N : 0;
  float acc[N];
  for (int i = 0; i < N; ++i) {
    acc[i] = row < rows && col + i < cols ? x[row * cols + col + i] : 0.0f;
  }
  int const n_bad = out(row, col, acc);
  if (n_bad != 0) atomicAdd(bad, static_cast<unsigned long long>(n_bad));
}

// Runs the epilogue of Scheme (N columns per thread) over x on the device and compares it with
// quantize(host, x) under the same seed and offset.
template <class Scheme, int N>
void compare(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  using epilogue = device::quantize_epilogue<Scheme, N>;
  spec const s = Scheme::to_spec();
  INFO(s.name() << " N " << N << " " << rows << "x" << cols);
  std::int64_t const n = rows * cols;
  std::vector<float> const x = test::random_input<float>(n, seed, true);
  quantize_options const opt{seed * 7 + 1, seed * 1000};
  quantized_tensor want(s, rows, cols);
  std::int64_t const want_bad =
      quantize(host, matrix_view<float const>(x.data(), rows, cols), want.view(), opt);

  quantized_layout const l = make_layout(s, rows, cols);
  device_bytes dx(n * sizeof(float)), dq(l.total_bytes), dbad(sizeof(unsigned long long));
  dx.upload(x.data(), n * sizeof(float));
  unsigned long long const zero = 0;
  dbad.upload(&zero, sizeof(zero));
  epilogue const out{view_of_buffer(s, rows, cols, dq.get()), opt.seed, opt.offset};
  std::int64_t const per_row = (cols + s.group_cols - 1) / s.group_cols * epilogue::lanes_per_group;
  std::int64_t const threads = rows * per_row;
  auto const blocks = static_cast<unsigned>((threads + 255) / 256);
  ::agoq::detail::gpu::launch(epilogue_kernel<epilogue, N>, blocks, 256, 0, 0,
                              reinterpret_cast<float const*>(dx.get()), rows, cols, threads, out,
                              reinterpret_cast<unsigned long long*>(dbad.get()));
  AGOQ_CUDA_TRY(cudaGetLastError());
  unsigned long long got_bad = 0;
  dbad.download(&got_bad, sizeof(got_bad));
  CHECK(static_cast<std::int64_t>(got_bad) == want_bad);

  test::sections const got = test::download(const_quantized_view(out.out));
  test::sections const ref = test::host_sections(want.view());
  CHECK(test::first_difference(got.codes, ref.codes) == -1);
  CHECK(test::first_difference(got.scales, ref.scales) == -1);
  CHECK(test::first_difference(got.zero_points, ref.zero_points) == -1);
}

template <class Scheme, int N>
void sweep(std::uint64_t seed) {
  for (auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 5}, {7, 300}, {33, 129}, {2, 4097}, {130, 256}}) {
    compare<Scheme, N>(rows, cols, seed++);
  }
}

}  // namespace

TEST_CASE("the quantizing epilogue writes what the CPU executor writes, bit for bit") {
  // 16, 8, 4, 32 and 32 lanes per group; symmetric, asymmetric and FP8 codes; both roundings;
  // fp32, bf16 and e8m0 scales.
  sweep<scheme<int_sym<8>, per_group<128>>, 8>(1);
  sweep<scheme<int_sym<4>, per_group<64>, round_stochastic>, 8>(11);
  sweep<scheme<uint_asym<8>, per_group<32>, round_nearest, scale_bf16>, 8>(21);
  sweep<mxfp8_e4m3, 8>(31);
  sweep<scheme<int_sym<2>, per_group<256>, round_stochastic, scale_e8m0>, 8>(41);
  sweep<scheme<int_sym<8>, per_group<128>, round_stochastic>, 4>(51);
}
