// The device tier of the fused ops (activation/fused.cuh) against the CPU executor
// (activation/fused.hpp): saved codes, scales and zero points, non-finite counts and every output
// bit for bit, and agoq's e^x (numeric/exp.hpp, which SwiGLU and GeLU go through) on the device
// against the host over every third float. Built once per element type (AGOQ_TEST_ELEMENT), every
// operand of that type.
#include "device_support.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <agoq/activation/fused.cuh>

// The suite's names, apart from the other suites of tests/device/device_tests.cu.
namespace fused_device_test {

using namespace agoq;
using namespace agoq::activation;
using agoq::test::device_bytes;

using element = AGOQ_TEST_ELEMENT;

namespace {

// One-pass groupings (saved inside the op's kernel) and the others (saved by a second pass).
std::vector<std::string> const specs = {
    "int8_g128_sym_rne_f32", "int4_g128_sym_sr_f32",    "int4_g32_asym_rne_bf16",
    "fp8e4m3_g64_rne_e8m0",  "fp8e5m2_g256_sr_bf16",    "int2_g32_sym_rne_f32",
    "int8_g64_asym_sr_f32",  "int8_row_sym_rne_f32",    "int4_g7_sym_rne_f32",
    "int8_col_sym_rne_f32",  "int8_tensor_asym_sr_f32", "int4_b3x5_sym_rne_bf16",
    "int8_g48_sym_rne_f32"};

// Ragged shapes; 256 and 2048 columns are whole groups of every one-pass G (the forward ops' slots
// of two runs, fused_gpu::for_each_run_or_slot); 13000 columns exceed the row kernels'
// shared-memory buffers; 16421 rows make RMSNorm backward's dweight blocks 33 rows long
// (fused_detail::dweight_block_rows).
std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
    {1, 1}, {3, 5}, {7, 300}, {33, 129}, {2, 4097}, {130, 256}, {9, 2048}, {3, 13000}, {16421, 3}};

quantize_options const opt{0x5eedULL, 977};

/// A device copy of a host vector.
template <class T>
struct dvec {
  device_bytes bytes;
  std::int64_t n;
  explicit dvec(std::vector<T> const& h)
      : bytes(h.size() * sizeof(T) + 1), n(static_cast<std::int64_t>(h.size())) {
    if (!h.empty()) bytes.upload(h.data(), h.size() * sizeof(T));
  }
  T* get() const { return reinterpret_cast<T*>(bytes.get()); }
  std::vector<T> download() const {
    std::vector<T> h(static_cast<std::size_t>(n));
    if (n) bytes.download(h.data(), h.size() * sizeof(T));
    return h;
  }
};

/// A device quantized buffer of a spec and shape.
struct dsaved {
  quantized_layout l;
  device_bytes codes, scales, zero;
  quantized_view v;
  dsaved(spec const& s, std::int64_t rows, std::int64_t cols)
      : l(make_layout(s, rows, cols)),
        codes(l.codes_bytes + 1),
        scales(l.scales_bytes + 1),
        zero(l.zero_points_bytes + 1),
        v{s, rows, cols, codes.get(), scales.get(), s.has_zero_point() ? zero.get() : nullptr} {}
};

void check_same_saved(quantized_view d, quantized_tensor const& h) {
  test::sections const got = test::download(d);
  test::sections const want = test::host_sections(h.view());
  CHECK(test::first_difference(got.codes, want.codes) == -1);
  CHECK(test::first_difference(got.scales, want.scales) == -1);
  CHECK(test::first_difference(got.zero_points, want.zero_points) == -1);
}

/// Equal bits element by element, except that a NaN equals any NaN: IEEE 754 leaves the payload
/// of a NaN result open and the executors differ there (x86 passes an input NaN's payload on, or
/// returns the negative default NaN for Inf - Inf; CUDA returns 0x7fffffff), as the first device
/// run showed for the residual add of NaN and Inf inputs.
template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
    if (std::isnan(numeric::to_float(a[i])) && std::isnan(numeric::to_float(b[i]))) continue;
    return false;
  }
  return true;
}

std::int64_t count_of(device_bytes const& c) {
  std::int64_t n = -1;
  c.download(&n, sizeof(n));
  return n;
}

cuda_executor const ex{cudaStream_t{}};

template <class T>
matrix_view<T const> cview(std::vector<T> const& v, std::int64_t r, std::int64_t c) {
  return matrix_view<T const>(v.data(), r, c);
}

/// out[i] = exp_fp32 of the float with bits first + 3 i, i < n.
__global__ void exp_kernel(std::uint32_t first, std::int64_t n, float* out) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    out[i] = numeric::exp_fp32(numeric::bits_float(first + 3u * static_cast<std::uint32_t>(i)));
  }
}

}  // namespace

// Emulated, the kernel is the host's exp_fp32 compiled by the same compiler: skipped.
TEST_CASE("exp_fp32 on the device equals the host's on every third float" *
          doctest::skip(agoq::test::emulated)) {
  if (!std::is_same_v<element, float>) return;  // element-independent: run once
  constexpr std::int64_t chunk = std::int64_t{1} << 26;
  device_bytes out(chunk * sizeof(float));
  std::vector<float> got(static_cast<std::size_t>(chunk));
  std::int64_t const total = ((std::int64_t{1} << 32) + 2) / 3;
  std::int64_t differ = 0;
  for (std::int64_t first = 0; first < total; first += chunk) {
    std::int64_t const n = std::min(chunk, total - first);
    auto const base = static_cast<std::uint32_t>(3 * first);
    ::agoq::detail::gpu::launch(exp_kernel, 1024, 256, 0, 0, base, n,
                                reinterpret_cast<float*>(out.get()));
    AGOQ_CUDA_TRY(cudaGetLastError());
    out.download(got.data(), static_cast<std::size_t>(n) * sizeof(float));
    for (std::int64_t i = 0; i < n; ++i) {
      float const x = numeric::bits_float(base + 3u * static_cast<std::uint32_t>(i));
      float const want = numeric::exp_fp32(x);
      if (std::isnan(want) && std::isnan(got[i])) continue;
      if (numeric::float_bits(want) != numeric::float_bits(got[i])) ++differ;
    }
  }
  CHECK(differ == 0);
}

TEST_CASE("rmsnorm_forward_async / rmsnorm_backward_async equal the CPU executor bit for bit") {
  for (auto const& [rows, cols] : shapes) {
    std::int64_t const n = rows * cols;
    auto const x = test::random_input<element>(n, 11 + rows, true);
    auto const w = test::random_input<element>(cols, 12, false);
    auto const dy = test::random_input<element>(n, 13 + cols, true);
    std::vector<float> dw0(static_cast<std::size_t>(cols));
    for (std::int64_t i = 0; i < cols; ++i) dw0[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    float const eps = 1e-5f;
    dvec<element> dx_in(x), dw_in(w), ddy(dy);
    // The plain op.
    std::vector<element> y(static_cast<std::size_t>(n));
    std::vector<float> rstd(static_cast<std::size_t>(rows));
    rmsnorm_forward(host, cview(x, rows, cols), std::span<element const>(w), eps,
                    matrix_view<element>(y.data(), rows, cols), std::span<float>(rstd));
    dvec<element> dy_out(y);
    dvec<float> drstd(rstd);
    rmsnorm_forward_async(ex, matrix_view<element const>(dx_in.get(), rows, cols),
                          std::span<element const>(dw_in.get(), cols), eps,
                          matrix_view<element>(dy_out.get(), rows, cols),
                          std::span<float>(drstd.get(), rows));
    CHECK(same_bits(dy_out.download(), y));
    CHECK(same_bits(drstd.download(), rstd));
    for (auto const& name : specs) {
      CAPTURE(name);
      CAPTURE(rows);
      CAPTURE(cols);
      spec const s = spec::parse(name);
      quantized_tensor ref(s, rows, cols);
      std::int64_t const bad = rmsnorm_forward(
          host, cview(x, rows, cols), std::span<element const>(w), eps,
          matrix_view<element>(y.data(), rows, cols), ref.view(), std::span<float>(rstd), opt);
      dsaved sv(s, rows, cols);
      device_bytes count(sizeof(std::int64_t));
      rmsnorm_forward_async(ex, matrix_view<element const>(dx_in.get(), rows, cols),
                            std::span<element const>(dw_in.get(), cols), eps,
                            matrix_view<element>(dy_out.get(), rows, cols), sv.v,
                            std::span<float>(drstd.get(), rows), opt,
                            reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bad);
      CHECK(same_bits(dy_out.download(), y));
      CHECK(same_bits(drstd.download(), rstd));
      check_same_saved(sv.v, ref);

      // Backward from the saved copy.
      std::vector<element> dxh(static_cast<std::size_t>(n));
      std::vector<float> dwh = dw0;
      std::int64_t const bbad =
          rmsnorm_backward(host, cview(dy, rows, cols), ref.view(), std::span<float const>(rstd),
                           std::span<element const>(w),
                           matrix_view<element>(dxh.data(), rows, cols), std::span<float>(dwh));
      dvec<element> ddx(dxh);
      dvec<float> ddw(dw0);
      rmsnorm_backward_async(
          ex, matrix_view<element const>(ddy.get(), rows, cols), const_quantized_view(sv.v),
          std::span<float const>(drstd.get(), rows), std::span<element const>(dw_in.get(), cols),
          matrix_view<element>(ddx.get(), rows, cols), std::span<float>(ddw.get(), cols),
          reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bbad);
      CHECK(same_bits(ddx.download(), dxh));
      CHECK(same_bits(ddw.download(), dwh));
    }
  }
}

TEST_CASE("residual_add_async equals the CPU executor bit for bit, in place too") {
  for (auto const& [rows, cols] : shapes) {
    std::int64_t const n = rows * cols;
    auto const a = test::random_input<element>(n, 21 + rows, true);
    auto const b = test::random_input<element>(n, 22 + cols, true);
    dvec<element> da(a), db(b);
    std::vector<element> sum(static_cast<std::size_t>(n));
    residual_add(host, cview(a, rows, cols), cview(b, rows, cols),
                 matrix_view<element>(sum.data(), rows, cols));
    dvec<element> dsum(sum);
    residual_add_async(ex, matrix_view<element const>(da.get(), rows, cols),
                       matrix_view<element const>(db.get(), rows, cols),
                       matrix_view<element>(dsum.get(), rows, cols));
    CHECK(same_bits(dsum.download(), sum));
    for (auto const& name : specs) {
      CAPTURE(name);
      spec const s = spec::parse(name);
      quantized_tensor ref(s, rows, cols);
      std::int64_t const bad =
          residual_add(host, cview(a, rows, cols), cview(b, rows, cols),
                       matrix_view<element>(sum.data(), rows, cols), ref.view(), opt);
      dsaved sv(s, rows, cols);
      device_bytes count(sizeof(std::int64_t));
      dvec<element> inplace(a);  // sum written over a
      residual_add_async(ex, matrix_view<element const>(inplace.get(), rows, cols),
                         matrix_view<element const>(db.get(), rows, cols),
                         matrix_view<element>(inplace.get(), rows, cols), sv.v, opt,
                         reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bad);
      CHECK(same_bits(inplace.download(), sum));
      check_same_saved(sv.v, ref);
    }
  }
}

TEST_CASE("swiglu_forward_async / swiglu_backward_async equal the CPU executor bit for bit") {
  for (auto const& [rows, cols] : shapes) {
    std::int64_t const n = rows * cols;
    auto const g = test::random_input<element>(n, 31 + rows, true);
    auto const u = test::random_input<element>(n, 32 + cols, true);
    auto const d = test::random_input<element>(n, 33, true);
    dvec<element> dg(g), du(u), dd(d);
    std::vector<element> out(static_cast<std::size_t>(n));
    swiglu_forward(host, cview(g, rows, cols), cview(u, rows, cols),
                   matrix_view<element>(out.data(), rows, cols));
    dvec<element> dout(out);
    swiglu_forward_async(ex, matrix_view<element const>(dg.get(), rows, cols),
                         matrix_view<element const>(du.get(), rows, cols),
                         matrix_view<element>(dout.get(), rows, cols));
    CHECK(same_bits(dout.download(), out));
    for (std::size_t k = 0; k < specs.size(); ++k) {
      // Same spec for both (one kernel) and different ones (second passes).
      spec const sg = spec::parse(specs[k]);
      spec const su = spec::parse(specs[k % 2 == 0 ? k : (k + 1) % specs.size()]);
      CAPTURE(specs[k]);
      quantized_tensor rg(sg, rows, cols), ru(su, rows, cols);
      std::int64_t const bad =
          swiglu_forward(host, cview(g, rows, cols), cview(u, rows, cols),
                         matrix_view<element>(out.data(), rows, cols), rg.view(), ru.view(), opt);
      dsaved vg(sg, rows, cols), vu(su, rows, cols);
      device_bytes count(sizeof(std::int64_t));
      swiglu_forward_async(ex, matrix_view<element const>(dg.get(), rows, cols),
                           matrix_view<element const>(du.get(), rows, cols),
                           matrix_view<element>(dout.get(), rows, cols), vg.v, vu.v, opt,
                           reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bad);
      CHECK(same_bits(dout.download(), out));
      check_same_saved(vg.v, rg);
      check_same_saved(vu.v, ru);

      std::vector<element> hg(static_cast<std::size_t>(n)), hu(static_cast<std::size_t>(n));
      std::int64_t const bbad = swiglu_backward(host, cview(d, rows, cols), rg.view(), ru.view(),
                                                matrix_view<element>(hg.data(), rows, cols),
                                                matrix_view<element>(hu.data(), rows, cols));
      dvec<element> og(hg), ou(hu);
      swiglu_backward_async(
          ex, matrix_view<element const>(dd.get(), rows, cols), const_quantized_view(vg.v),
          const_quantized_view(vu.v), matrix_view<element>(og.get(), rows, cols),
          matrix_view<element>(ou.get(), rows, cols), reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bbad);
      CHECK(same_bits(og.download(), hg));
      CHECK(same_bits(ou.download(), hu));
    }
  }
}

TEST_CASE("gelu_forward_async / gelu_backward_async equal the CPU executor bit for bit") {
  for (auto const& [rows, cols] : shapes) {
    std::int64_t const n = rows * cols;
    auto const x = test::random_input<element>(n, 41 + rows, true);
    auto const dy = test::random_input<element>(n, 42 + cols, true);
    dvec<element> dx_in(x), ddy(dy);
    std::vector<element> y(static_cast<std::size_t>(n));
    gelu_forward(host, cview(x, rows, cols), matrix_view<element>(y.data(), rows, cols));
    dvec<element> dyo(y);
    gelu_forward_async(ex, matrix_view<element const>(dx_in.get(), rows, cols),
                       matrix_view<element>(dyo.get(), rows, cols));
    CHECK(same_bits(dyo.download(), y));
    for (auto const& name : specs) {
      CAPTURE(name);
      spec const s = spec::parse(name);
      quantized_tensor ref(s, rows, cols);
      std::int64_t const bad = gelu_forward(
          host, cview(x, rows, cols), matrix_view<element>(y.data(), rows, cols), ref.view(), opt);
      dsaved sv(s, rows, cols);
      device_bytes count(sizeof(std::int64_t));
      gelu_forward_async(ex, matrix_view<element const>(dx_in.get(), rows, cols),
                         matrix_view<element>(dyo.get(), rows, cols), sv.v, opt,
                         reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bad);
      CHECK(same_bits(dyo.download(), y));
      check_same_saved(sv.v, ref);

      std::vector<element> dxh(static_cast<std::size_t>(n));
      std::int64_t const bbad = gelu_backward(host, cview(dy, rows, cols), ref.view(),
                                              matrix_view<element>(dxh.data(), rows, cols));
      dvec<element> ddx(dxh);
      gelu_backward_async(ex, matrix_view<element const>(ddy.get(), rows, cols),
                          const_quantized_view(sv.v), matrix_view<element>(ddx.get(), rows, cols),
                          reinterpret_cast<std::int64_t*>(count.get()));
      CHECK(count_of(count) == bbad);
      CHECK(same_bits(ddx.download(), dxh));
    }
  }
}

TEST_CASE("fused ops compiled for a code list give the same bits and refuse other families") {
  using listed = type_list<int_sym<4>, int_sym<8>>;
  // In-kernel saves (G = 128) and second passes (per row, G = 48).
  for (char const* name :
       {"int4_g128_sym_sr_f32", "int8_row_sym_rne_f32", "int8_g48_sym_rne_f32"}) {
    for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{7, 300}, {9, 2048}}) {
      CAPTURE(name);
      CAPTURE(cols);
      spec const s = spec::parse(name);
      std::int64_t const n = rows * cols;
      auto const x = test::random_input<element>(n, 31 + cols, true);
      auto const u = test::random_input<element>(n, 32 + cols, true);
      auto const w = test::random_input<element>(cols, 33, false);
      dvec<element> dx(x), du(u), dw(w), dy(x);
      dvec<float> drstd{std::vector<float>(static_cast<std::size_t>(rows))};
      auto const xv = matrix_view<element const>(dx.get(), rows, cols);
      auto const uv = matrix_view<element const>(du.get(), rows, cols);
      auto const yv = matrix_view<element>(dy.get(), rows, cols);
      std::vector<element> y(static_cast<std::size_t>(n));
      std::vector<float> rstd(static_cast<std::size_t>(rows));
      auto const hy = matrix_view<element>(y.data(), rows, cols);
      quantized_tensor r1(s, rows, cols), r2(s, rows, cols);
      dsaved v1(s, rows, cols), v2(s, rows, cols);

      rmsnorm_forward(host, cview(x, rows, cols), std::span<element const>(w), 1e-5f, hy, r1.view(),
                      std::span<float>(rstd), opt);
      rmsnorm_forward_async<listed>(ex, xv, std::span<element const>(dw.get(), cols), 1e-5f, yv,
                                    v1.v, std::span<float>(drstd.get(), rows), opt);
      CHECK(same_bits(dy.download(), y));
      CHECK(same_bits(drstd.download(), rstd));
      check_same_saved(v1.v, r1);

      swiglu_forward(host, cview(x, rows, cols), cview(u, rows, cols), hy, r1.view(), r2.view(),
                     opt);
      swiglu_forward_async<listed>(ex, xv, uv, yv, v1.v, v2.v, opt);
      CHECK(same_bits(dy.download(), y));
      check_same_saved(v1.v, r1);
      check_same_saved(v2.v, r2);

      gelu_forward(host, cview(x, rows, cols), hy, r1.view(), opt);
      gelu_forward_async<listed>(ex, xv, yv, v1.v, opt);
      CHECK(same_bits(dy.download(), y));
      check_same_saved(v1.v, r1);

      residual_add(host, cview(x, rows, cols), cview(u, rows, cols), hy, r1.view(), opt);
      residual_add_async<listed>(ex, xv, uv, yv, v1.v, opt);
      CHECK(same_bits(dy.download(), y));
      check_same_saved(v1.v, r1);

      // The backward ops under the list, from the saved copies (v1 and r1 the residual sum's,
      // v2 and r2 SwiGLU's up): the CPU executor's bits. u plays the incoming gradient.
      std::vector<element> g1(static_cast<std::size_t>(n)), g2(g1);
      std::vector<float> dwh(static_cast<std::size_t>(cols), 0.5f);
      dvec<element> dg1(g1), dg2(g1);
      dvec<float> ddw(dwh);
      auto const g1v = matrix_view<element>(dg1.get(), rows, cols);
      auto const g2v = matrix_view<element>(dg2.get(), rows, cols);
      rmsnorm_backward(host, cview(u, rows, cols), r1.view(), std::span<float const>(rstd),
                       std::span<element const>(w), matrix_view<element>(g1.data(), rows, cols),
                       std::span<float>(dwh));
      rmsnorm_backward_async<listed>(
          ex, uv, const_quantized_view(v1.v), std::span<float const>(drstd.get(), rows),
          std::span<element const>(dw.get(), cols), g1v, std::span<float>(ddw.get(), cols));
      CHECK(same_bits(dg1.download(), g1));
      CHECK(same_bits(ddw.download(), dwh));
      swiglu_backward(host, cview(u, rows, cols), r1.view(), r2.view(),
                      matrix_view<element>(g1.data(), rows, cols),
                      matrix_view<element>(g2.data(), rows, cols));
      swiglu_backward_async<listed>(ex, uv, const_quantized_view(v1.v), const_quantized_view(v2.v),
                                    g1v, g2v);
      CHECK(same_bits(dg1.download(), g1));
      CHECK(same_bits(dg2.download(), g2));
      gelu_backward(host, cview(u, rows, cols), r2.view(),
                    matrix_view<element>(g1.data(), rows, cols));
      gelu_backward_async<listed>(ex, uv, const_quantized_view(v2.v), g1v);
      CHECK(same_bits(dg1.download(), g1));
    }
  }
  // Another family: refused on the calling thread before anything is enqueued (the count and the
  // output keep their bytes).
  std::int64_t const rows = 2, cols = 128;
  spec const fp8 = spec::parse("fp8e4m3_g128_rne_f32");
  dsaved sv(fp8, rows, cols);
  std::vector<element> const ones(static_cast<std::size_t>(rows * cols),
                                  numeric::from_float<element>(1.0f));
  dvec<element> x(ones), y(ones), w{std::vector<element>(static_cast<std::size_t>(cols))};
  dvec<float> rstd{std::vector<float>(static_cast<std::size_t>(rows))};
  auto const xv = matrix_view<element const>(x.get(), rows, cols);
  auto const yv = matrix_view<element>(y.get(), rows, cols);
  std::int64_t const sentinel = 0x3c3c3c3c3c3c3c3c;
  device_bytes count(sizeof(std::int64_t));
  count.upload(&sentinel, sizeof(sentinel));
  auto* c = reinterpret_cast<std::int64_t*>(count.get());
  char const* const why = "outside the code list the call was compiled for";
  CHECK_THROWS_WITH_AS(
      rmsnorm_forward_async<listed>(ex, xv, std::span<element const>(w.get(), cols), 1e-5f, yv,
                                    sv.v, std::span<float>(rstd.get(), rows), opt, c),
      doctest::Contains(why), agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(swiglu_forward_async<listed>(ex, xv, xv, yv, sv.v, sv.v, opt, c),
                       doctest::Contains(why), agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(gelu_forward_async<listed>(ex, xv, yv, sv.v, opt, c), doctest::Contains(why),
                       agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(residual_add_async<listed>(ex, xv, xv, yv, sv.v, opt, c),
                       doctest::Contains(why), agoq::unsupported_scheme);
  dvec<element> y2(ones);
  dvec<float> dweight{std::vector<float>(static_cast<std::size_t>(cols), 1.0f)};
  auto const y2v = matrix_view<element>(y2.get(), rows, cols);
  const_quantized_view const saved(sv.v);
  CHECK_THROWS_WITH_AS(
      rmsnorm_backward_async<listed>(ex, xv, saved, std::span<float const>(rstd.get(), rows),
                                     std::span<element const>(w.get(), cols), yv,
                                     std::span<float>(dweight.get(), cols), c),
      doctest::Contains(why), agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(swiglu_backward_async<listed>(ex, xv, saved, saved, yv, y2v, c),
                       doctest::Contains(why), agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(gelu_backward_async<listed>(ex, xv, saved, yv, c), doctest::Contains(why),
                       agoq::unsupported_scheme);
  CHECK(count_of(count) == sentinel);
  CHECK(same_bits(y.download(), ones));
  CHECK(same_bits(y2.download(), ones));
  CHECK(same_bits(dweight.download(), std::vector<float>(static_cast<std::size_t>(cols), 1.0f)));
}

/// The same statistics, bit for bit.
bool same_stats(tensor_stats const& a, tensor_stats const& b) {
  return a.tile == b.tile && a.elements == b.elements && a.sum_squares == b.sum_squares &&
         a.sum_group_absmax_sq == b.sum_group_absmax_sq &&
         a.sum_group_range_sq == b.sum_group_range_sq && a.has_dead_zones == b.has_dead_zones &&
         a.dead_energy == b.dead_energy && a.live_absmax_sq == b.live_absmax_sq &&
         a.live_error_2bit == b.live_error_2bit;
}

TEST_CASE("the measured forms on the device equal the host's, in place") {
  // Row-wise groups (measured beside the op on the host), groups spanning rows and long rows.
  for (auto const& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {3, 5}, {33, 129}, {2, 4097}, {3, 13000}}) {
    std::int64_t const n = rows * cols;
    auto const x = test::random_input<element>(n, 41 + rows, true);
    auto const u = test::random_input<element>(n, 42 + cols, true);
    auto const w = test::random_input<element>(cols, 43, false);
    dvec<element> dw(w), du(u);
    auto const uv = matrix_view<element const>(du.get(), rows, cols);
    for (char const* name : {"int8_g128_sym_rne_f32", "int4_g128_sym_sr_f32",
                             "int8_row_sym_rne_f32", "int8_col_sym_rne_f32"}) {
      CAPTURE(name);
      CAPTURE(rows);
      CAPTURE(cols);
      spec const s = spec::parse(name);
      // The host's measured forms, in place.
      std::vector<element> hy = x;
      std::vector<float> hr(static_cast<std::size_t>(rows));
      quantized_tensor ha(s, rows, cols), hb(s, rows, cols);
      tensor_stats h1, h2;
      auto const hv = matrix_view<element>(hy.data(), rows, cols);
      std::int64_t const bad = rmsnorm_forward_measured(host, matrix_view<element const>(hv),
                                                        std::span<element const>(w), 1e-5f, hv,
                                                        ha.view(), std::span<float>(hr), h1, opt);
      // The device's.
      dvec<element> dy(x);
      dvec<float> dr(hr);
      dsaved sa(s, rows, cols), sb(s, rows, cols);
      device_bytes count(sizeof(std::int64_t));
      auto* nonfinite = reinterpret_cast<std::int64_t*>(count.get());
      auto const dv = matrix_view<element>(dy.get(), rows, cols);
      tensor_stats d1, d2;
      rmsnorm_forward_measured(ex, matrix_view<element const>(dv),
                               std::span<element const>(dw.get(), cols), 1e-5f, dv, sa.v,
                               std::span<float>(dr.get(), rows), d1, opt, nonfinite);
      CHECK(count_of(count) == bad);
      CHECK(same_bits(dy.download(), hy));
      CHECK(same_bits(dr.download(), hr));
      check_same_saved(sa.v, ha);
      CHECK(same_stats(d1, h1));
      CHECK(same_stats(d1, measure(host, cview(x, rows, cols), s)));

      hy = x;
      dvec<element> dg(x);
      auto const gv = matrix_view<element>(dg.get(), rows, cols);
      CHECK(gelu_forward_measured(host, matrix_view<element const>(hv), hv, ha.view(), h1, opt) ==
            bad);
      gelu_forward_measured(ex, matrix_view<element const>(gv), gv, sa.v, d1, opt, nonfinite);
      CHECK(count_of(count) == bad);
      CHECK(same_bits(dg.download(), hy));
      check_same_saved(sa.v, ha);
      CHECK(same_stats(d1, h1));

      hy = x;  // gate, and the output
      dvec<element> ds(x);
      auto const sv = matrix_view<element>(ds.get(), rows, cols);
      std::int64_t const bad2 =
          swiglu_forward_measured(host, matrix_view<element const>(hv), cview(u, rows, cols), hv,
                                  ha.view(), hb.view(), h1, h2, opt);
      swiglu_forward_measured(ex, matrix_view<element const>(sv), uv, sv, sa.v, sb.v, d1, d2, opt,
                              nonfinite);
      CHECK(count_of(count) == bad2);
      CHECK(same_bits(ds.download(), hy));
      check_same_saved(sa.v, ha);
      check_same_saved(sb.v, hb);
      CHECK((same_stats(d1, h1) && same_stats(d2, h2)));

      hy = x;  // the residual stream, and the sum
      dvec<element> dsum(x);
      auto const rv = matrix_view<element>(dsum.get(), rows, cols);
      std::int64_t const bad3 = residual_add_measured(host, matrix_view<element const>(hv),
                                                      cview(u, rows, cols), hv, ha.view(), h1, opt);
      residual_add_measured(ex, matrix_view<element const>(rv), uv, rv, sa.v, d1, opt, nonfinite);
      CHECK(count_of(count) == bad3);
      CHECK(same_bits(dsum.download(), hy));
      check_same_saved(sa.v, ha);
      CHECK(same_stats(d1, h1));
    }
  }
  // Empty tensors: the empty statistics; a refused call writes none.
  spec const s = spec::parse("int4_g128_sym_rne_f32");
  quantized_view const none{s, 0, 128, nullptr, nullptr, nullptr};
  tensor_stats st;
  st.elements = 99;
  gelu_forward_measured(ex, matrix_view<element const>(nullptr, 0, 128),
                        matrix_view<element>(nullptr, 0, 128), none, st);
  CHECK(same_stats(st, measure(host, matrix_view<element const>(nullptr, 0, 128), s)));
  st.elements = 99;
  dsaved sv(s, 4, 128);
  dvec<element> x{std::vector<element>(4 * 128)};
  CHECK_THROWS_AS(gelu_forward_measured(ex, matrix_view<element const>(x.get(), 4, 128),
                                        matrix_view<element>(x.get() + 1, 4, 127), sv.v, st),
                  invalid_argument);
  CHECK(st.elements == 99);
}

TEST_CASE("the device fused ops validate like the CPU ops") {
  std::int64_t const rows = 4, cols = 64;
  spec const s = spec::parse("int8_g32_sym_rne_f32");
  dsaved sv(s, rows, cols);
  std::vector<element> const zeros(static_cast<std::size_t>(rows * cols));
  dvec<element> x(zeros), y(zeros);
  dvec<element> w{std::vector<element>(static_cast<std::size_t>(cols))};
  dvec<float> rstd{std::vector<float>(static_cast<std::size_t>(rows))};
  auto const xv = matrix_view<element const>(x.get(), rows, cols);
  auto const yv = matrix_view<element>(y.get(), rows, cols);
  auto const ws = std::span<element const>(w.get(), cols);
  CHECK_THROWS_AS(rmsnorm_forward_async(ex, xv, ws.first(cols - 1), 1e-5f, yv, sv.v,
                                        std::span<float>(rstd.get(), rows)),
                  invalid_argument);
  CHECK_THROWS_AS(
      rmsnorm_forward_async(ex, xv, ws, -1.0f, yv, sv.v, std::span<float>(rstd.get(), rows)),
      invalid_argument);
  CHECK_THROWS_AS(
      rmsnorm_forward_async(ex, xv, ws, 1e-5f, matrix_view<element>(y.get() + 1, rows - 1, cols),
                            sv.v, std::span<float>(rstd.get(), rows)),
      invalid_argument);
  std::vector<element> host_x(static_cast<std::size_t>(rows * cols));
  CHECK_THROWS_AS(gelu_forward_async(ex, cview(host_x, rows, cols), yv, sv.v), invalid_argument);
  CHECK_THROWS_AS(residual_add_async(ex, xv, xv, matrix_view<element>(x.get() + 1, rows, cols - 1)),
                  invalid_argument);
  // Empty tensors are no-ops.
  gelu_forward_async(ex, matrix_view<element const>(nullptr, 0, cols),
                     matrix_view<element>(nullptr, 0, cols));
  AGOQ_CUDA_TRY(cudaDeviceSynchronize());
}

}  // namespace fused_device_test
