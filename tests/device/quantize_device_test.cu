// The device tier of quantize.cuh: every CUDA kernel against the CPU executor, bit for bit. Built
// once per input element type (AGOQ_TEST_ELEMENT), with the other suites of that type
// (device_tests.cu).
#include "device_support.cuh"

#include <cstdint>
#include <string>
#include <vector>

// The suite's names, apart from the other suites of tests/device/device_tests.cu.
namespace quantize_device_test {

using namespace agoq;
using agoq::test::device_bytes;

using element = AGOQ_TEST_ELEMENT;

namespace {

std::vector<std::string> const specs = {
    "int8_g128_sym_rne_f32",   "int4_g128_sym_rne_f32",    "int2_g32_sym_rne_bf16",
    "int8_g64_asym_rne_f32",   "int4_g256_asym_sr_e8m0",   "int8_g128_sym_sr_f32",
    "fp8e4m3_g32_rne_e8m0",    "fp8e5m2_g128_sr_bf16",     "int8_row_sym_rne_f32",
    "int4_row_asym_rne_bf16",  "int8_col_sym_rne_f32",     "int4_col_asym_sr_f32",
    "int8_tensor_sym_rne_f32", "int2_tensor_asym_rne_f32", "int4_b128x128_sym_rne_bf16",
    "int8_b3x5_asym_sr_e8m0",  "int4_g7_sym_rne_f32",      "fp8e4m3_b128x128_rne_f32",
    "int8_g48_sym_rne_f32"};

std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
    {1, 1}, {3, 5}, {7, 300}, {2, 4097}, {33, 129}, {1, 100003}, {130, 256}, {9, 2048}};

// Quantizes x on the CPU and on the device (input at element offset `shift`, codes at byte offset
// `code_shift`) and compares every section, the non-finite count, and dequantization into Out.
// The device calls are compiled for the code families of Codes.
template <class Out, class Codes = dispatch_codes>
void compare(spec const& s, std::int64_t rows, std::int64_t cols, std::vector<element> const& x,
             int shift, int code_shift, quantize_options opt) {
  std::int64_t const n = rows * cols;
  quantized_tensor ref(s, rows, cols);
  std::int64_t const ref_bad =
      quantize(host, matrix_view<element const>(x.data(), rows, cols), ref.view(), opt);

  device_bytes dx((n + shift) * sizeof(element));
  dx.upload(x.data(), n * sizeof(element), shift * sizeof(element));
  quantized_layout const l = make_layout(s, rows, cols);
  device_bytes dcodes(l.codes_bytes + code_shift), dscales(l.scales_bytes + 1),
      dzero(l.zero_points_bytes + 1);
  quantized_view const dq{s,
                          rows,
                          cols,
                          dcodes.get() + code_shift,
                          dscales.get(),
                          s.has_zero_point() ? dzero.get() : nullptr};
  device_bytes dcount(sizeof(std::int64_t));
  auto* count = reinterpret_cast<std::int64_t*>(dcount.get());
  cuda_executor const ex{cudaStream_t{}};
  auto const* xin = reinterpret_cast<element const*>(dx.get()) + shift;
  quantize_async<Codes>(ex, matrix_view<element const>(xin, rows, cols), dq, opt, count);
  std::int64_t bad = -1;
  dcount.download(&bad, sizeof(bad));
  CHECK(bad == ref_bad);

  test::sections const got = test::download(dq);
  test::sections const want = test::host_sections(ref.view());
  CHECK(test::first_difference(got.codes, want.codes) == -1);
  CHECK(test::first_difference(got.scales, want.scales) == -1);
  CHECK(test::first_difference(got.zero_points, want.zero_points) == -1);

  std::vector<Out> yref(static_cast<std::size_t>(n));
  dequantize(host, ref.view(), matrix_view<Out>(yref.data(), rows, cols));
  device_bytes dy((n + shift) * sizeof(Out));
  auto* yout = reinterpret_cast<Out*>(dy.get()) + shift;
  dequantize_async<Codes>(ex, const_quantized_view(dq), matrix_view<Out>(yout, rows, cols));
  std::vector<Out> y(static_cast<std::size_t>(n));
  dy.download(y.data(), n * sizeof(Out), shift * sizeof(Out));
  CHECK(std::memcmp(y.data(), yref.data(), n * sizeof(Out)) == 0);

  // fake_quantize: the same bits as the two calls.
  fake_quantize_async<Codes>(ex, s, matrix_view<element const>(xin, rows, cols),
                             matrix_view<Out>(yout, rows, cols), opt);
  std::vector<Out> f(static_cast<std::size_t>(n));
  dy.download(f.data(), n * sizeof(Out), shift * sizeof(Out));
  CHECK(std::memcmp(f.data(), yref.data(), n * sizeof(Out)) == 0);
}

}  // namespace

TEST_CASE("device quantize/dequantize/fake_quantize equal the CPU executor bit for bit") {
  std::uint64_t seed = 1;
  for (auto const& name : specs) {
    spec const s = spec::parse(name);
    for (auto [rows, cols] : shapes) {
      std::vector<element> const x = test::random_input<element>(rows * cols, seed++, true);
      quantize_options const opt{seed * 7919, seed * 104729};
      INFO(name << " " << rows << "x" << cols << " in " << element_name<element>());
      compare<float>(s, rows, cols, x, 0, 0, opt);
      compare<bfloat16>(s, rows, cols, x, 0, 0, opt);
      compare<half>(s, rows, cols, x, 0, 0, opt);
    }
  }
}

TEST_CASE("misaligned inputs, outputs and codes take the element-wise path with the same bits") {
  for (auto const& name :
       {"int8_g128_sym_rne_f32", "int4_g128_sym_sr_bf16", "int2_row_asym_rne_f32"}) {
    spec const s = spec::parse(name);
    std::vector<element> const x = test::random_input<element>(5 * 1031, 17, true);
    for (int shift : {1, 3}) {
      for (int code_shift : {1, 2, 5}) {
        INFO(name << " shift " << shift << " code shift " << code_shift);
        compare<float>(s, 5, 1031, x, shift, code_shift, {3, 9});
        compare<bfloat16>(s, 5, 1031, x, shift, code_shift, {3, 9});
      }
    }
  }
}

TEST_CASE("calls compiled for a code list give the same bits and refuse other families") {
  using listed = type_list<int_sym<4>, fp8_e4m3>;
  std::vector<element> const x = test::random_input<element>(9 * 2048, 41, true);
  for (auto const& name :
       {"int4_g128_sym_sr_f32", "fp8e4m3_g32_rne_e8m0", "int4_row_sym_rne_f32"}) {
    INFO(name);
    compare<float, listed>(spec::parse(name), 9, 2048, x, 0, 0, {11, 13});
  }
  // A refused call throws on the calling thread before it enqueues anything (the count keeps its
  // bytes) or allocates fake_quantize_async's temporary.
  spec const s = spec::parse("int8_g128_sym_rne_f32");
  cuda_executor const ex{cudaStream_t{}};
  device_bytes dx(256 * sizeof(element)), dy(256 * sizeof(float)), dcount(sizeof(std::int64_t));
  quantized_layout const l = make_layout(s, 1, 256);
  device_bytes dbuf(static_cast<std::size_t>(l.total_bytes));
  quantized_view const q = view_of_buffer(s, 1, 256, dbuf.get());
  std::int64_t const sentinel = 0x5a5a5a5a5a5a5a5a;
  dcount.upload(&sentinel, sizeof(sentinel));
  auto* count = reinterpret_cast<std::int64_t*>(dcount.get());
  matrix_view<element const> const in(reinterpret_cast<element const*>(dx.get()), 1, 256);
  matrix_view<float> const out(reinterpret_cast<float*>(dy.get()), 1, 256);
  char const* const why = "outside the code list the call was compiled for";
  CHECK_THROWS_WITH_AS(quantize_async<listed>(ex, in, q, {}, count), doctest::Contains(why),
                       agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(dequantize_async<listed>(ex, const_quantized_view(q), out, count),
                       doctest::Contains(why), agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(fake_quantize_async<listed>(ex, s, in, out, {}, count),
                       doctest::Contains(why), agoq::unsupported_scheme);
  std::int64_t after = 0;
  dcount.download(&after, sizeof(after));
  CHECK(after == sentinel);
}

TEST_CASE("empty tensors are no-ops and bad arguments throw before any launch") {
  spec const s = spec::parse("int8_g128_sym_rne_f32");
  cuda_executor const ex{cudaStream_t{}};
  device_bytes dcount(sizeof(std::int64_t));
  auto* count = reinterpret_cast<std::int64_t*>(dcount.get());
  quantized_view const empty{s, 0, 16, nullptr, nullptr, nullptr};
  quantize_async(ex, matrix_view<element const>(nullptr, 0, 16), empty, {}, count);
  std::int64_t bad = -1;
  dcount.download(&bad, sizeof(bad));
  CHECK(bad == 0);
  std::vector<element> host_x(64);
  quantized_tensor host_q(s, 1, 64);
  CHECK_THROWS_WITH_AS(
      quantize_async(ex, matrix_view<element const>(host_x.data(), 1, 64), host_q.view()),
      doctest::Contains("pageable host pointer"), agoq::invalid_argument);
  device_bytes dx(64 * sizeof(element));
  CHECK_THROWS_WITH_AS(
      quantize_async(ex, matrix_view<element const>(reinterpret_cast<element*>(dx.get()), 2, 32),
                     host_q.view()),
      doctest::Contains("quantize_async: the tensor is 2x32"), agoq::invalid_argument);
}

__global__ void fill_kernel(element* x, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h =
        static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ static_cast<std::uint32_t>(i >> 32) ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    x[i] = numeric::from_float<element>((static_cast<float>(h & 0xffffu) - 32768.0f) / 4096.0f);
  }
}

TEST_CASE("more than 2^31 elements: 64-bit indexing end to end") {
  std::int64_t const rows = 2, cols = (std::int64_t{1} << 30) + 77;  // 2^31 + 154 elements
  std::int64_t const n = rows * cols;
  std::size_t free_bytes = 0, total = 0;
  AGOQ_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));
  spec const s = spec::parse("int8_g128_sym_rne_f32");
  quantized_layout const l = make_layout(s, rows, cols);
  std::size_t const need = n * sizeof(element) * 2 + l.total_bytes + (64 << 20);
  if (free_bytes < need) {
    MESSAGE("skipping: needs " << need / (1 << 20) << " MiB of device memory");
    return;
  }
  device_bytes dx(n * sizeof(element)), dq(l.total_bytes), dy(n * sizeof(element));
  auto* x = reinterpret_cast<element*>(dx.get());
  ::agoq::detail::gpu::launch(fill_kernel, 1024, 256, 0, 0, x, n, 12345u);
  AGOQ_CUDA_TRY(cudaGetLastError());
  cuda_executor const ex{cudaStream_t{}};
  quantized_view const q = view_of_buffer(s, rows, cols, dq.get());
  quantize_async(ex, matrix_view<element const>(x, rows, cols), q);
  dequantize_async(ex, const_quantized_view(q),
                   matrix_view<element>(reinterpret_cast<element*>(dy.get()), rows, cols));
  AGOQ_CUDA_TRY(cudaDeviceSynchronize());
  // The CPU executor on the whole tensor, compared byte for byte.
  std::vector<element> hx(static_cast<std::size_t>(n));
  dx.download(hx.data(), n * sizeof(element));
  quantized_tensor ref(s, rows, cols);
  quantize(host, matrix_view<element const>(hx.data(), rows, cols), ref.view());
  test::sections const got = test::download(q);
  test::sections const want = test::host_sections(ref.view());
  CHECK(test::first_difference(got.codes, want.codes) == -1);
  CHECK(test::first_difference(got.scales, want.scales) == -1);
  std::vector<element> hy(static_cast<std::size_t>(n)), ry(static_cast<std::size_t>(n));
  dy.download(hy.data(), n * sizeof(element));
  dequantize(host, ref.view(), matrix_view<element>(ry.data(), rows, cols));
  CHECK(std::memcmp(hy.data(), ry.data(), n * sizeof(element)) == 0);
}

}  // namespace quantize_device_test
