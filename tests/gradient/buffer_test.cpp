#include <agoq/gradient/buffer.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include "gradient/support.hpp"

using namespace agoq;
using namespace agoq::gradient;
using namespace gradient_test;

TEST_CASE("gradient_buffer bytes: 1 + 4/G per element plus alignment padding") {
  std::int64_t const n = std::int64_t{1} << 20;
  gradient_buffer b(n);
  CHECK(b.bytes() == n + 4 * n / 128);
  CHECK(static_cast<double>(b.bytes()) / static_cast<double>(n) == 1.03125);
  CHECK(static_cast<double>(b.bytes()) <= 1.04 * static_cast<double>(n));
  // Ragged: 1000 codes padded to 1024, then 8 scales.
  CHECK(gradient_buffer(1000).bytes() == 1024 + 4 * 8);
  CHECK(gradient_buffer(1000, {32}).bytes() == 1024 + 4 * 32);
  CHECK(gradient_buffer(0).bytes() == 0);
  CHECK(b.spec().name() == "int8_g128_sym_sr_f32");
  CHECK_THROWS_AS(gradient_buffer(10, {16}), agoq::invalid_argument);
  CHECK_THROWS_AS(gradient_buffer(10, {512}), agoq::invalid_argument);
  CHECK_THROWS_AS(gradient_buffer(-1), agoq::invalid_argument);
}

TEST_CASE("gradient_buffer: the first accumulate is quantize, the next ones add in fp32") {
  std::int64_t const n = 10007;  // prime: a short last group and a short last piece
  auto const g1 = normal(n, 1);
  auto const g2 = normal(n, 2);
  gradient_buffer b(n, {64, rounding_kind::nearest, 0});
  CHECK(b.accumulate(std::span<float const>(g1)) == 0);
  quantized_tensor want(payload_spec(64, rounding_kind::nearest), 1, n);
  quantize(host, as_row(g1.data(), n), want.view());
  CHECK(std::memcmp(b.view().codes, want.data(), static_cast<std::size_t>(want.bytes())) == 0);
  // Second: dequantize, add in fp32, requantize with fresh scales.
  std::vector<float> sum(static_cast<std::size_t>(n));
  dequantize(host, want.view(), as_row(sum.data(), n));
  for (std::int64_t i = 0; i < n; ++i) sum[i] = sum[i] + g2[i];
  quantize(host, as_row(sum.data(), n), want.view());
  CHECK(b.accumulate(std::span<float const>(g2)) == 0);
  CHECK(std::memcmp(b.view().codes, want.data(), static_cast<std::size_t>(want.bytes())) == 0);
  CHECK(b.counter() == 2);
  b.zero();
  std::vector<float> y(static_cast<std::size_t>(n), 1.0f);
  dequantize(host, b.view(), as_row(y.data(), n));
  for (float v : y) REQUIRE(v == 0.0f);
  CHECK(b.counter() == 2);
  CHECK_THROWS_AS(b.accumulate(std::span<float const>(g1.data(), 5)), agoq::invalid_argument);
}

TEST_CASE("gradient_buffer takes bfloat16, half and matrix views") {
  std::int64_t const n = 3000;
  auto const f = normal(n, 3);
  std::vector<bfloat16> bf;
  std::vector<half> hf;
  std::vector<float> wb, wh;
  for (float x : f) {
    bf.push_back(numeric::from_float<bfloat16>(x));
    hf.push_back(numeric::from_float<half>(x));
    wb.push_back(numeric::to_float(bf.back()));
    wh.push_back(numeric::to_float(hf.back()));
  }
  for (int twice = 0; twice < 2; ++twice) {
    gradient_buffer a(n, {128, rounding_kind::stochastic, 9});
    gradient_buffer b(n, {128, rounding_kind::stochastic, 9});
    gradient_buffer c(n, {128, rounding_kind::stochastic, 9});
    gradient_buffer d(n, {128, rounding_kind::stochastic, 9});
    for (int k = 0; k <= twice; ++k) {
      a.accumulate(std::span<bfloat16 const>(bf));
      b.accumulate(std::span<float const>(wb));
      c.accumulate(matrix_view<half const>(hf.data(), std::int64_t{30}, std::int64_t{100}));
      d.accumulate(std::span<float const>(wh));
    }
    CHECK(std::memcmp(a.view().codes, b.view().codes, static_cast<std::size_t>(a.bytes())) == 0);
    CHECK(std::memcmp(c.view().codes, d.view().codes, static_cast<std::size_t>(c.bytes())) == 0);
  }
}

TEST_CASE("gradient_buffer counts non-finite sums") {
  std::int64_t const n = 1000;
  auto g = normal(n, 4);
  gradient_buffer b(n);
  g[10] = std::numeric_limits<float>::quiet_NaN();
  g[20] = -std::numeric_limits<float>::infinity();
  CHECK(b.accumulate(std::span<float const>(g)) == 2);
  g[10] = 1.0f;
  g[20] = 1.0f;
  CHECK(b.accumulate(std::span<float const>(g)) == 0);
  CHECK(b.nonfinite_count() == 2);
  b.zero();
  CHECK(b.nonfinite_count() == 0);
}

TEST_CASE("accumulation over K micro-batches: unbiased, RMS within the sqrt(K) bound") {
  // K zero-mean gradients added with stochastic rounding. Step k's rounding error of element i
  // is zero-mean given the past (unbiased rounding) and below its group step D_k (the scale after
  // step k) in magnitude, with variance f (1 - f) D_k^2 <= D_k^2 / 4. The errors are martingale
  // differences, so E[err_K^2] <= sum_k D_k^2 / 4 <= K D_max^2 / 4: the RMS bound grows like
  // sqrt(K). The mean error over n elements has standard deviation <= sqrt(sum_i B_i) / n
  // (B_i the element's bound); it is checked at 4 standard deviations. The fp32 additions and
  // x / s divisions add relative errors of 2^-24, far below these.
  std::int64_t const n = 32768;
  int const g = 128;
  gradient_buffer b(n, {g, rounding_kind::stochastic, 2024});
  std::vector<double> exact(static_cast<std::size_t>(n), 0.0);
  std::vector<double> bound_sq(static_cast<std::size_t>(n / g), 0.0);  // sum_k D_k^2 / 4 per group
  std::vector<double> dmax(static_cast<std::size_t>(n / g), 0.0);
  std::vector<float> y(static_cast<std::size_t>(n));
  std::printf("  K    mean err      4 sd(mean)    rms err       rms bound     sqrt(K) Dmax/2\n");
  for (int k = 1; k <= 64; ++k) {
    auto const gk = normal(n, 5000 + static_cast<unsigned>(k));
    for (std::int64_t i = 0; i < n; ++i) exact[i] += gk[i];
    b.accumulate(std::span<float const>(gk));
    for (std::int64_t q = 0; q < n / g; ++q) {
      double const d = scale_at(b.view(), q);
      bound_sq[q] += d * d / 4;
      dmax[q] = std::max(dmax[q], d);
    }
    if ((k & (k - 1)) != 0) continue;  // report and check at K = 1, 2, 4, ..., 64
    dequantize(host, b.view(), as_row(y.data(), n));
    double mean = 0, e2 = 0, b2 = 0, worst = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const e = y[i] - exact[i];
      mean += e;
      e2 += e * e;
      b2 += bound_sq[i / g];
      worst += k * dmax[i / g] * dmax[i / g] / 4;
    }
    mean /= static_cast<double>(n);
    double const rms = std::sqrt(e2 / static_cast<double>(n));
    double const rms_bound = std::sqrt(b2 / static_cast<double>(n));
    double const sd_mean = std::sqrt(b2) / static_cast<double>(n);
    std::printf("  %-4d %-13.3e %-13.3e %-13.3e %-13.3e %.3e\n", k, mean, 4 * sd_mean, rms,
                rms_bound, std::sqrt(worst / static_cast<double>(n)));
    CHECK(std::abs(mean) <= 4 * sd_mean);
    CHECK(rms <= rms_bound);
    CHECK(rms_bound <= std::sqrt(worst / static_cast<double>(n)));
  }
}

TEST_CASE("nearest rounding accumulates a bias that stochastic rounding avoids") {
  // Adding a value below half a step to a large one: nearest rounding drops it every time.
  std::int64_t const n = 4096;
  std::vector<float> big(static_cast<std::size_t>(n), 0.0f),
      small(static_cast<std::size_t>(n), 0.002f);
  for (std::int64_t i = 0; i < n; i += 128) big[i] = 127.0f;  // scale 1 in every group
  gradient_buffer rne(n, {128, rounding_kind::nearest, 0});
  gradient_buffer sr(n, {128, rounding_kind::stochastic, 3});
  rne.accumulate(std::span<float const>(big));
  sr.accumulate(std::span<float const>(big));
  int const k = 64;
  for (int i = 0; i < k; ++i) {
    rne.accumulate(std::span<float const>(small));
    sr.accumulate(std::span<float const>(small));
  }
  std::vector<float> yr(static_cast<std::size_t>(n)), ys(static_cast<std::size_t>(n));
  dequantize(host, rne.view(), as_row(yr.data(), n));
  dequantize(host, sr.view(), as_row(ys.data(), n));
  double mr = 0, ms = 0;
  std::int64_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 128 == 0) continue;
    mr += yr[i];
    ms += ys[i];
    ++m;
  }
  mr /= static_cast<double>(m);
  ms /= static_cast<double>(m);
  double const exact = k * 0.002;  // 0.128
  CHECK(mr == 0.0);
  // Each element's error has variance <= k / 4 (steps of 1); the mean over m elements, 4 sd.
  CHECK(std::abs(ms - exact) <= 4 * std::sqrt(k / 4.0 / static_cast<double>(m)));
}
