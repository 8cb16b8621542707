#include <agoq/gradient/all_reduce.hpp>

#include <agoq/comm/counting.hpp>
#include <agoq/comm/in_process.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include "gradient/support.hpp"

using namespace agoq;
using namespace agoq::gradient;
using namespace gradient_test;
using comm::in_process_group;

namespace {

/// Runs the flat all-reduce (float in, float out) on P ranks; returns each rank's output and
/// result, and, through `sent`, each rank's bytes sent (comm::counting).
struct run_result {
  std::vector<std::vector<float>> out;
  std::vector<all_reduce_result> res;
  std::vector<std::uint64_t> sent;
  std::vector<std::uint64_t> received;
};

run_result run_flat(std::vector<std::vector<float>> const& in, all_reduce_options const& opt) {
  int const p = static_cast<int>(in.size());
  run_result rr;
  rr.out.assign(in.size(), std::vector<float>(in[0].size()));
  rr.res.resize(in.size());
  rr.sent.resize(in.size());
  rr.received.resize(in.size());
  in_process_group::run(p, [&](auto c) {
    comm::counting counted(c);
    auto const r = static_cast<std::size_t>(c.rank());
    rr.res[r] = all_reduce_8bit(host, counted, std::span<float const>(in[r]),
                                std::span<float>(rr.out[r]), opt);
    rr.sent[r] = counted.sent();
    rr.received[r] = counted.received();
  });
  return rr;
}

/// Every rank's output has the same bits as rank 0's.
void check_identical(std::vector<std::vector<float>> const& out) {
  for (std::size_t r = 1; r < out.size(); ++r) {
    REQUIRE(out[r].size() == out[0].size());
    CHECK(std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)) == 0);
  }
}

/// The reduced result kept 8-bit on every rank (for its output scales).
std::vector<quantized_tensor> run_flat_8bit(std::vector<std::vector<float>> const& in,
                                            all_reduce_options const& opt) {
  int const p = static_cast<int>(in.size());
  auto const n = static_cast<std::int64_t>(in[0].size());
  std::vector<quantized_tensor> out;
  for (int r = 0; r < p; ++r) out.emplace_back(payload_spec(opt.group_size, opt.rounding), 1, n);
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    all_reduce_8bit(host, c, std::span<float const>(in[r]), out[r].view(), opt);
  });
  return out;
}

struct error_stats {
  double max_ratio = 0;  ///< max over elements of |error| / bound
  double rel_rms = 0;    ///< rms(error) / rms(exact sum)
};

/// The flat all-reduce's error against the fp64 sum, element by element against flat_bound.
error_stats flat_error(std::vector<std::vector<float>> const& in, all_reduce_options const& opt) {
  int const p = static_cast<int>(in.size());
  int const g = opt.group_size;
  run_result const rr = run_flat(in, opt);
  check_identical(rr.out);
  std::vector<quantized_tensor> const q = run_flat_8bit(in, opt);
  std::vector<float> deq(in[0].size());
  dequantize(host, q[0].view(), as_row(deq.data(), static_cast<std::int64_t>(deq.size())));
  CHECK(std::memcmp(deq.data(), rr.out[0].data(), deq.size() * sizeof(float)) == 0);
  std::vector<std::vector<double>> s;
  for (auto const& x : in) s.push_back(scales_of(x, g));
  std::vector<double> const ref = reference_sum(in);
  error_stats st;
  double e2 = 0, r2 = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    std::size_t const k = i / static_cast<std::size_t>(g);
    double sum_s = 0;
    for (int r = 0; r < p; ++r) sum_s += s[static_cast<std::size_t>(r)][k];
    double const bound = flat_bound(sum_s, scale_at(q[0].view(), static_cast<std::int64_t>(k)), p);
    double const e = static_cast<double>(rr.out[0][i]) - ref[i];
    st.max_ratio = std::max(st.max_ratio, std::abs(e) / bound);
    e2 += e * e;
    r2 += ref[i] * ref[i];
  }
  st.rel_rms = std::sqrt(e2 / r2);
  return st;
}

/// The naive ring: rank 0's int8 chunk goes round the ring, each rank dequantizes it, adds its
/// own values in fp32 and requantizes (fresh scales) before passing it on: P quantizations of a
/// growing partial sum. Returns rms(error) / rms(exact sum).
double ring_requantize_error(std::vector<std::vector<float>> const& in, int g) {
  spec const s = payload_spec(g, rounding_kind::nearest);
  auto const n = static_cast<std::int64_t>(in[0].size());
  std::vector<float> partial(in[0]);
  fake_quantize(host, s, as_row(partial.data(), n), as_row(partial.data(), n));
  for (std::size_t r = 1; r < in.size(); ++r) {
    for (std::int64_t i = 0; i < n; ++i) partial[i] = partial[i] + in[r][i];
    fake_quantize(host, s, as_row(partial.data(), n), as_row(partial.data(), n));
  }
  std::vector<double> const ref = reference_sum(in);
  double e2 = 0, r2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double const e = partial[i] - ref[i];
    e2 += e * e;
    r2 += ref[i] * ref[i];
  }
  return std::sqrt(e2 / r2);
}

/// int8 summed in place under a shared scale: every rank quantizes its group with the largest
/// scale of all ranks (agreed beforehand), and the int8 codes are added in int8 as they arrive.
/// Returns the fraction of elements whose sum left [-127, 127] (wrapped) and the rel. rms error.
std::pair<double, double> shared_scale_int8_sum(std::vector<std::vector<float>> const& in, int g) {
  auto const n = static_cast<std::int64_t>(in[0].size());
  std::vector<std::vector<double>> s;
  for (auto const& x : in) s.push_back(scales_of(x, g));
  std::vector<double> const ref = reference_sum(in);
  std::int64_t overflow = 0;
  double e2 = 0, r2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::size_t const k = static_cast<std::size_t>(i / g);
    double shared = 0;
    for (auto const& sr : s) shared = std::max(shared, sr[k]);
    std::int8_t acc = 0;
    int wide = 0;
    for (auto const& x : in) {
      int const q = static_cast<int>(std::nearbyint(x[i] / shared));
      wide += q;
      acc = static_cast<std::int8_t>(static_cast<std::uint8_t>(acc + q));  // int8 wraps
    }
    overflow += wide < -127 || wide > 127 ? 1 : 0;
    double const e = acc * shared - ref[i];
    e2 += e * e;
    r2 += ref[i] * ref[i];
  }
  return {static_cast<double>(overflow) / static_cast<double>(n), std::sqrt(e2 / r2)};
}

}  // namespace

TEST_CASE("bytes sent per rank equal the formula exactly") {
  int const g = 128;
  for (int p : {1, 2, 3, 4, 8, 16}) {
    CAPTURE(p);
    // N a multiple of P G: 2 (P-1)/P N (1 + 4/G) + 64 (P - 1) header bytes, in integers.
    std::int64_t const n = std::int64_t{p} * g * 3;
    auto const in = rank_inputs(p, n, 11);
    run_result const rr = run_flat(in, {});
    std::int64_t const payload = 2 * (p - 1) * (n / p + 4 * n / (std::int64_t{p} * g));
    std::int64_t const headers = (p - 1) * (32 + 2 * 16);
    for (int r = 0; r < p; ++r) {
      CHECK(rr.sent[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(payload + headers));
      CHECK(rr.received[static_cast<std::size_t>(r)] ==
            static_cast<std::uint64_t>(payload + headers));
    }
    CHECK(all_reduce_bytes_sent(n, p, g) == payload + headers);
    // Ragged lengths: (P - 1) (32 + 2 (16 + ceil(ceil(N / G) / P) (G + 4))).
    for (std::int64_t m :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{1009}, std::int64_t{65537}}) {
      CAPTURE(m);
      std::int64_t const groups = (m + g - 1) / g;
      std::int64_t const per = (groups + p - 1) / p;
      std::int64_t const want = (p - 1) * (32 + 2 * (16 + per * (g + 4)));
      run_result const r2 = run_flat(rank_inputs(p, m, 12), {});
      for (int r = 0; r < p; ++r)
        CHECK(r2.sent[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(want));
      check_identical(r2.out);
    }
  }
}

TEST_CASE("bytes sent are at most 0.52x a bf16 ring all-reduce at G = 128 for large N") {
  std::int64_t const n = std::int64_t{1} << 18;
  for (int p : {2, 4, 8, 16}) {
    CAPTURE(p);
    auto const in = rank_inputs(p, n, 13);
    run_result const rr = run_flat(in, {});
    double const ring_bf16 = 2.0 * (p - 1) / p * static_cast<double>(n) * 2.0;
    double const ratio = static_cast<double>(rr.sent[0]) / ring_bf16;
    MESSAGE("P = " << p << ": " << rr.sent[0] << " bytes, " << ratio << " x bf16 ring");
    CHECK(ratio <= 0.52);
    CHECK(ratio >= 0.515625);  // (1 + 4/128) / 2, the payload alone
  }
}

TEST_CASE("error against the fp64 sum stays within the two-quantization bound, flat in P") {
  std::int64_t const n = 16384 + 77;  // ragged: the last group is short
  double rel2 = 0;
  std::printf("  P   max|err|/bound   rel.rms(8-bit)   rel.rms(ring requant)\n");
  for (int p : {2, 3, 4, 5, 8, 16}) {
    CAPTURE(p);
    auto const in = rank_inputs(p, n, 21);
    error_stats const st = flat_error(in, {});
    double const ring = ring_requantize_error(in, 128);
    std::printf("  %-3d %-16.4f %-16.6f %.6f\n", p, st.max_ratio, st.rel_rms, ring);
    CHECK(st.max_ratio <= 1.0);
    if (p == 2) rel2 = st.rel_rms;
    // Gaussian inputs: Q1 adds P errors of variance s^2/12, Q2 one of P s^2/12 (the sum's scale
    // is sqrt(P) s), over a sum of variance P: rel. rms sqrt(2 s^2 / 12) whatever P. The estimate
    // averages 16k elements (sampling error < 2%); 5% separates "flat" from growth (ring: +41%
    // from P = 2 to 4).
    CHECK(st.rel_rms <= rel2 * 1.05);
    CHECK(st.rel_rms >= rel2 * 0.95);
    // The ring requantizes a partial sum of growing spread at every hop: error variance
    // s^2/12 (1 + 2 + ... + P) over P, rel. rms sqrt((P + 1) / 4) times the 8-bit all-reduce's.
    if (p >= 8) CHECK(ring > 1.4 * st.rel_rms);
  }
  auto const in2 = rank_inputs(2, n, 21);
  auto const in16 = rank_inputs(16, n, 21);
  // Theory: sqrt(17 / 3) = 2.38 from P = 2 to P = 16.
  CHECK(ring_requantize_error(in16, 128) > 2.0 * ring_requantize_error(in2, 128));
}

TEST_CASE("int8 summed under a shared scale overflows; the fp32 reduction cannot") {
  std::int64_t const n = 16384;
  std::printf("  P   int8-overflow fraction   rel.rms(shared-scale int8)\n");
  double last = 0;
  for (int p : {2, 4, 8, 16}) {
    auto const in = rank_inputs(p, n, 31);
    auto const [overflow, err] = shared_scale_int8_sum(in, 128);
    std::printf("  %-3d %-24.4f %.4f\n", p, overflow, err);
    CHECK(overflow >= last);
    last = overflow;
    if (p >= 8) {
      // Codes of spread 127 / 2.9 (absmax of 128 normals ~ 2.9 sigma) summed over P ranks have
      // spread 44 sqrt(P) > 127 at P = 8: most sums wrap, and the error is of the order of the
      // values themselves.
      CHECK(overflow > 0.2);
      CHECK(err > 0.5);
    }
  }
  CHECK(flat_error(rank_inputs(16, n, 31), {}).max_ratio <= 1.0);
}

TEST_CASE("lengths 0, 1 and primes, any P, identical bits and the bound") {
  for (int p : {1, 2, 3, 7}) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{127},
                           std::int64_t{131}, std::int64_t{1009}, std::int64_t{4099}}) {
      CAPTURE(p);
      CAPTURE(n);
      auto const in = rank_inputs(p, n, 41);
      if (n == 0) {
        run_result const rr = run_flat(in, {});
        CHECK(!rr.res[0].nonfinite);
        continue;
      }
      CHECK(flat_error(in, {}).max_ratio <= 1.0);
    }
  }
}

TEST_CASE("P = 1 is quantize, dequantize, quantize, dequantize") {
  std::int64_t const n = 5000;
  auto const in = rank_inputs(1, n, 51);
  run_result const rr = run_flat(in, {});
  std::vector<float> want(in[0]);
  spec const s = payload_spec(128, rounding_kind::nearest);
  fake_quantize(host, s, as_row(want.data(), n), as_row(want.data(), n));
  fake_quantize(host, s, as_row(want.data(), n), as_row(want.data(), n));
  CHECK(std::memcmp(want.data(), rr.out[0].data(), want.size() * 4) == 0);
  CHECK(rr.sent[0] == 0);
}

TEST_CASE("group sizes 32..256, average, in place, half and bfloat16 outputs") {
  std::int64_t const n = 3001;
  int const p = 3;
  auto const in = rank_inputs(p, n, 61);
  for (int g : {32, 64, 100, 256}) {
    all_reduce_options opt;
    opt.group_size = g;
    CAPTURE(g);
    CHECK(flat_error(in, opt).max_ratio <= 1.0);
  }
  // Average: the sum divided by P in fp32 (one more rounding, u |mean|).
  all_reduce_options avg;
  avg.average = true;
  run_result const a = run_flat(in, avg);
  run_result const s = run_flat(in, {});
  check_identical(a.out);
  std::vector<double> const ref = reference_sum(in);
  std::vector<std::vector<double>> sc;
  for (auto const& x : in) sc.push_back(scales_of(x, 128));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double sum_s = 0;
    for (auto const& v : sc) sum_s += v[i / 128];
    // The mean's output scale is at most (sum_r s_r)(1 + P u) / P.
    double const bound = flat_bound(sum_s, sum_s * (1 + p * unit_roundoff), p) / p +
                         unit_roundoff * std::abs(ref[i]) / p;
    REQUIRE(std::abs(a.out[0][i] - ref[i] / p) <= bound);
  }
  CHECK(std::memcmp(a.out[0].data(), s.out[0].data(), n * 4) != 0);

  // In place: the output is the input buffer.
  std::vector<std::vector<float>> inplace(in);
  in_process_group::run(p, [&](auto c) {
    auto& v = inplace[static_cast<std::size_t>(c.rank())];
    all_reduce_8bit(host, c, std::span<float>(v), std::span<float>(v));
  });
  for (auto const& v : inplace) CHECK(std::memcmp(v.data(), s.out[0].data(), n * 4) == 0);

  // half and bfloat16 outputs are the float result rounded to nearest.
  std::vector<std::vector<half>> h(p, std::vector<half>(n));
  std::vector<std::vector<bfloat16>> b(p, std::vector<bfloat16>(n));
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    all_reduce_8bit(host, c, std::span<float const>(in[r]), std::span<half>(h[r]));
    all_reduce_8bit(host, c, std::span<float const>(in[r]), std::span<bfloat16>(b[r]));
  });
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(numeric::raw_bits(h[2][i]) ==
            numeric::raw_bits(numeric::from_float<half>(s.out[0][i])));
    REQUIRE(numeric::raw_bits(b[1][i]) ==
            numeric::raw_bits(numeric::from_float<bfloat16>(s.out[0][i])));
  }
}

TEST_CASE("bfloat16 and half inputs are quantized directly") {
  std::int64_t const n = 2000;
  int const p = 4;
  auto const f = rank_inputs(p, n, 71);
  std::vector<std::vector<bfloat16>> b(p);
  std::vector<std::vector<float>> widened(p);
  for (int r = 0; r < p; ++r) {
    for (float x : f[r]) {
      b[r].push_back(numeric::from_float<bfloat16>(x));
      widened[r].push_back(numeric::to_float(b[r].back()));
    }
  }
  run_result const want = run_flat(widened, {});
  std::vector<std::vector<float>> out(p, std::vector<float>(n));
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    all_reduce_8bit(host, c, std::span<bfloat16 const>(b[r]), std::span<float>(out[r]));
  });
  for (auto const& o : out) CHECK(std::memcmp(o.data(), want.out[0].data(), n * 4) == 0);
}

TEST_CASE("stochastic rounding: identical bits on every rank, a fresh stream per step") {
  std::int64_t const n = 4096;
  int const p = 5;
  auto const in = rank_inputs(p, n, 81);
  all_reduce_options opt;
  opt.rounding = rounding_kind::stochastic;
  opt.seed = 7;
  run_result const a = run_flat(in, opt);
  check_identical(a.out);
  opt.step = 1;
  run_result const b = run_flat(in, opt);
  check_identical(b.out);
  CHECK(std::memcmp(a.out[0].data(), b.out[0].data(), n * 4) != 0);
  // Unbiased: the mean error over n elements is ~0. Each element's error has variance at most
  // (sum_r s_r^2 + s_out^2) / 4 (a stochastic rounding error is below one step and has variance
  // <= s^2 / 4); s_out <= sum_r s_r. The mean of n such independent errors: 4 standard
  // deviations.
  std::vector<double> const ref = reference_sum(in);
  std::vector<std::vector<double>> sc;
  for (auto const& x : in) sc.push_back(scales_of(x, 128));
  double mean = 0, var = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double s1 = 0, s2 = 0;
    for (auto const& v : sc) {
      s1 += v[i / 128];
      s2 += v[i / 128] * v[i / 128];
    }
    var += (s2 + s1 * s1) / 4;
    mean += a.out[0][i] - ref[i];
  }
  mean /= static_cast<double>(n);
  CHECK(std::abs(mean) <= 4 * std::sqrt(var) / static_cast<double>(n));
}

TEST_CASE("mismatched lengths and bad arguments throw on every rank, without a hang") {
  int const p = 4;
  auto expect_all_throw = [&](auto&& body) {
    std::atomic<int> thrown{0};
    in_process_group::run(p, [&](auto c) {
      try {
        body(c);
      } catch (agoq::invalid_argument const&) {
        ++thrown;
      }
    });
    CHECK(thrown.load() == p);
  };
  // Rank 2 has one element more.
  expect_all_throw([](auto& c) {
    std::vector<float> x(c.rank() == 2 ? 1001 : 1000, 1.0f), y(x.size());
    all_reduce_8bit(host, c, std::span<float const>(x), std::span<float>(y));
  });
  // Rank 1's output is too small.
  expect_all_throw([](auto& c) {
    std::vector<float> x(1000, 1.0f), y(c.rank() == 1 ? 999 : 1000);
    all_reduce_8bit(host, c, std::span<float const>(x), std::span<float>(y));
  });
  // A group size outside [32, 256].
  expect_all_throw([](auto& c) {
    std::vector<float> x(1000, 1.0f), y(1000);
    all_reduce_options opt;
    opt.group_size = c.rank() == 3 ? 512 : 128;
    all_reduce_8bit(host, c, std::span<float const>(x), std::span<float>(y), opt);
  });
  // Different averaging.
  expect_all_throw([](auto& c) {
    std::vector<float> x(1000, 1.0f), y(1000);
    all_reduce_options opt;
    opt.average = c.rank() == 0;
    all_reduce_8bit(host, c, std::span<float const>(x), std::span<float>(y), opt);
  });
  // A too-small reduce-scatter shard on rank 0.
  expect_all_throw([](auto& c) {
    std::vector<float> x(1000, 1.0f), y(c.rank() == 0 ? 10 : 256);
    reduce_scatter_8bit(host, c, std::span<float const>(x), std::span<float>(y));
  });
  // A quantized output of another group size on rank 3.
  expect_all_throw([](auto& c) {
    std::vector<float> x(1000, 1.0f);
    quantized_tensor t(payload_spec(c.rank() == 3 ? 64 : 128, rounding_kind::nearest), 1, 1000);
    all_reduce_8bit(host, c, std::span<float const>(x), t.view());
  });
  // The messages name the rank and the lengths.
  std::string message;
  std::mutex m;
  in_process_group::run(2, [&](auto c) {
    std::vector<float> x(c.rank() == 1 ? 7 : 5, 1.0f), y(x.size());
    try {
      all_reduce_8bit(host, c, std::span<float const>(x), std::span<float>(y));
    } catch (agoq::invalid_argument const& e) {
      std::lock_guard<std::mutex> lock(m);
      message = e.what();
    }
  });
  CHECK(message.find("rank 1 has 7 elements but rank 0 has 5") != std::string::npos);
}

TEST_CASE("a non-finite input on one rank raises the flag on every rank") {
  std::int64_t const n = 3000;
  int const p = 6;
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto in = rank_inputs(p, n, 91);
    in[2][1234] = bad;
    run_result const rr = run_flat(in, {});
    for (int r = 0; r < p; ++r) {
      CHECK(rr.res[static_cast<std::size_t>(r)].nonfinite);
      CHECK(rr.res[static_cast<std::size_t>(r)].local_nonfinite == (r == 2 ? 1 : 0));
    }
    check_identical(rr.out);
  }
  // fp32 overflow of the sum of finite values.
  std::vector<std::vector<float>> big(p, std::vector<float>(n, 1.0f));
  for (auto& v : big) v[5] = 3e38f;
  run_result const ov = run_flat(big, {});
  for (auto const& r : ov.res) {
    CHECK(r.nonfinite);
    CHECK(r.local_nonfinite == 0);
  }
  run_result const ok = run_flat(rank_inputs(p, n, 92), {});
  for (auto const& r : ok.res) CHECK(!r.nonfinite);
}

TEST_CASE("reduce-scatter: each rank's fp32 shard within the one-quantization bound") {
  for (int p : {1, 3, 4, 8}) {
    for (std::int64_t n :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{1009}, std::int64_t{20000}}) {
      CAPTURE(p);
      CAPTURE(n);
      auto const in = rank_inputs(p, n, 101);
      std::vector<double> const ref = reference_sum(in);
      std::vector<std::vector<double>> sc;
      for (auto const& x : in) sc.push_back(scales_of(x, 128));
      std::vector<std::vector<float>> shard(p);
      std::vector<reduce_scatter_result> res(p);
      std::vector<std::uint64_t> sent(p);
      in_process_group::run(p, [&](auto c) {
        comm::counting counted(c);
        auto const r = static_cast<std::size_t>(c.rank());
        auto const range = shard_range(n, p, c.rank(), 128);
        shard[r].resize(static_cast<std::size_t>(range.end - range.begin));
        res[r] = reduce_scatter_8bit(host, counted, std::span<float const>(in[r]),
                                     std::span<float>(shard[r]));
        sent[r] = counted.sent();
      });
      std::int64_t covered = 0;
      for (int r = 0; r < p; ++r) {
        auto const& rs = res[static_cast<std::size_t>(r)];
        CHECK(rs.begin == covered);
        covered = rs.end;
        CHECK(sent[static_cast<std::size_t>(r)] ==
              static_cast<std::uint64_t>(reduce_scatter_bytes_sent(n, p, 128)));
        for (std::int64_t i = rs.begin; i < rs.end; ++i) {
          double sum_s = 0;
          for (auto const& v : sc) sum_s += v[static_cast<std::size_t>(i / 128)];
          double const bound =
              (0.5 + 256 * unit_roundoff) * sum_s + (p + 1) * unit_roundoff * 127 * sum_s;
          REQUIRE(std::abs(shard[static_cast<std::size_t>(r)][i - rs.begin] - ref[i]) <= bound);
        }
      }
      CHECK(covered == n);
    }
  }
}

TEST_CASE("hierarchical: 2 nodes x 3 ranks, identical bits, three-quantization bound") {
  int const nodes = 2;
  int const per_node = 3;
  int const p = nodes * per_node;
  for (std::int64_t n :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{1009}, std::int64_t{40000}}) {
    CAPTURE(n);
    auto in = rank_inputs(p, n, 111);
    std::vector<std::vector<float>> out(p, std::vector<float>(n));
    std::vector<all_reduce_result> res(p);
    std::vector<std::uint64_t> inter_sent(p);
    node_world world(nodes, per_node);
    world.run([&](int w, auto& intra, auto& inter) {
      comm::counting counted(inter);
      auto const r = static_cast<std::size_t>(w);
      res[r] = all_reduce_8bit_hierarchical(host, intra, counted, std::span<float const>(in[r]),
                                            std::span<float>(out[r]));
      inter_sent[r] = counted.sent();
    });
    check_identical(out);
    // Inter-node bytes: the flat formula on the node's shard, so about 1/3 of a flat all-reduce.
    for (int w = 0; w < p; ++w) {
      auto const shard = shard_range(n, per_node, w % per_node, 128);
      CHECK(inter_sent[static_cast<std::size_t>(w)] ==
            static_cast<std::uint64_t>(all_reduce_bytes_sent(shard.end - shard.begin, nodes, 128)));
    }
    // Three roundings of at most half a step each: Q1 (scale s_r per rank), Q2 of a node's fp32
    // sum (scale <= (sum over the node's s_r)(1 + P u)), Q3 of the total (<= (sum_r s_r)(1 + P u)),
    // plus the fp32 products and additions.
    std::vector<double> const ref = reference_sum(in);
    std::vector<std::vector<double>> sc;
    for (auto const& x : in) sc.push_back(scales_of(x, 128));
    for (std::int64_t i = 0; i < n; ++i) {
      double sum_s = 0;
      for (auto const& v : sc) sum_s += v[static_cast<std::size_t>(i / 128)];
      double const u = unit_roundoff;
      double const bound =
          (0.5 + 256 * u) * 3 * sum_s * (1 + 2 * p * u) + (2 * p + 2) * u * 127 * sum_s;
      REQUIRE(std::abs(out[0][i] - ref[i]) <= bound);
    }
    if (n > 0) {
      // Non-finite on one rank of node 1: every rank of both nodes sees the flag.
      in[4][n / 2] = std::numeric_limits<float>::quiet_NaN();
      node_world w2(nodes, per_node);
      w2.run([&](int w, auto& intra, auto& inter) {
        auto const r = static_cast<std::size_t>(w);
        res[r] = all_reduce_8bit_hierarchical(host, intra, inter, std::span<float const>(in[r]),
                                              std::span<float>(out[r]));
      });
      for (int w = 0; w < p; ++w) {
        CHECK(res[static_cast<std::size_t>(w)].nonfinite);
        CHECK(res[static_cast<std::size_t>(w)].local_nonfinite == (w == 4 ? 1 : 0));
      }
    }
  }
  // A length mismatch on one rank throws on all six.
  std::atomic<int> thrown{0};
  node_world w3(nodes, per_node);
  w3.run([&](int w, auto& intra, auto& inter) {
    std::vector<float> x(w == 5 ? 300 : 301, 1.0f), y(x.size());
    try {
      all_reduce_8bit_hierarchical(host, intra, inter, std::span<float const>(x),
                                   std::span<float>(y));
    } catch (agoq::invalid_argument const&) {
      ++thrown;
    }
  });
  CHECK(thrown.load() == p);
}

TEST_CASE("a gradient_buffer travels as it is: 8-bit in, 8-bit or float out") {
  std::int64_t const n = 5000;
  int const p = 4;
  auto const in = rank_inputs(p, n, 121);
  run_result const want = run_flat(in, {});
  std::vector<std::vector<float>> out(p, std::vector<float>(n));
  std::vector<std::uint64_t> sent(p);
  std::vector<std::vector<float>> from_buffer_out(p, std::vector<float>(n));
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    // With nearest rounding the first accumulate quantizes exactly like the all-reduce's first
    // stage, so the results are the same bits.
    gradient_buffer b(n, {128, rounding_kind::nearest, 0});
    b.accumulate(std::span<float const>(in[r]));
    comm::counting counted(c);
    all_reduce_8bit(host, counted, b, std::span<float>(out[r]));
    sent[r] = counted.sent();
    // In place, 8-bit to 8-bit.
    all_reduce_8bit(host, c, b, b);
    dequantize(host, b.view(), as_row(from_buffer_out[r].data(), n));
  });
  for (int r = 0; r < p; ++r) {
    CHECK(std::memcmp(out[static_cast<std::size_t>(r)].data(), want.out[0].data(), n * 4) == 0);
    CHECK(std::memcmp(from_buffer_out[static_cast<std::size_t>(r)].data(), want.out[0].data(),
                      n * 4) == 0);
    CHECK(sent[static_cast<std::size_t>(r)] == want.sent[0]);
  }
}

// The fused reduce step on the vector loop (host) and the portable one (host_executor{false})
// against dequantizing every block and adding in rank order, bit for bit: random codes, scales
// over the whole float range (zero, subnormal, values whose products saturate at ±FLT_MAX and
// sums overflow to ±Inf, +Inf), chunks with a partial last group, several pieces, divisors.
TEST_CASE("the reduce step's vector and portable loops equal dequantize-then-add bit for bit") {
  std::mt19937 gen(17);
  constexpr host_executor portable{false};
  for (int p : {1, 2, 3, 8}) {
    for (std::int64_t g : {32, 128, 100}) {
      for (std::int64_t n : {std::int64_t{1}, std::int64_t{37}, 3 * g * p + 5, 20000 + g / 2}) {
        CAPTURE(p);
        CAPTURE(g);
        CAPTURE(n);
        chunk_plan const plan(n, g, p);
        spec const s = payload_spec(static_cast<int>(g), rounding_kind::nearest);
        std::int64_t const j = p - 1 > 0 ? 1 : 0;
        std::int64_t const count = plan.count(j);
        std::int64_t const bb = plan.block_bytes();
        std::vector<std::byte> recv(static_cast<std::size_t>(bb * p));
        for (int r = 0; r < p; ++r) {
          std::byte* block = recv.data() + r * bb;
          write_payload_header(block, 0, g, count);
          quantized_view const v = payload_view(s, plan, block, count);
          for (std::int64_t i = 0; i < count; ++i) v.codes[i] = static_cast<std::uint8_t>(gen());
          for (std::int64_t k = 0; k < (count + g - 1) / g; ++k) {
            float sc;
            switch (gen() % 8) {
              case 0:
                sc = 0.0f;
                break;
              case 1:
                sc = std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 100);
                break;
              case 2:
                sc = std::numeric_limits<float>::max() / static_cast<float>(gen() % 200 + 1);
                break;
              case 3:
                sc = gen() % 4 == 0 ? HUGE_VALF : 1.0f;
                break;
              default:
                sc = std::ldexp(static_cast<float>(gen() % 1000 + 1),
                                static_cast<int>(gen() % 60) - 40);
                break;
            }
            std::memcpy(v.scales + 4 * k, &sc, 4);
          }
        }
        for (float divisor : {1.0f, 3.0f}) {
          CAPTURE(divisor);
          // Reference: each block dequantized whole, added in rank order, then divided.
          std::vector<float> want(static_cast<std::size_t>(count)), x(want.size());
          for (int r = 0; r < p; ++r) {
            dequantize(portable, payload_view(s, plan, std::as_const(recv).data() + r * bb, count),
                       as_row(x.data(), count));
            for (std::size_t i = 0; i < x.size(); ++i) want[i] = r == 0 ? x[i] : want[i] + x[i];
          }
          if (divisor != 1.0f) {
            for (float& w : want) w = w / divisor;
          }
          // On one thread (portable and AVX-512 loops) and with the pieces split among threads.
          for (host_executor ex :
               {portable, host, host_executor{.threads = 3, .min_elements_per_thread = 1}}) {
            std::vector<float> got(want.size(), -1.0f), scratch;
            gradient::detail::reduce_blocks(
                ex, plan, j, recv.data(), s, divisor, scratch,
                [&](host_executor, std::int64_t b, float const* sum, std::int64_t m) {
                  std::copy(sum, sum + m, got.begin() + b);
                  return std::int64_t{0};
                });
            for (std::size_t i = 0; i < want.size(); ++i) {
              REQUIRE(numeric::float_bits(got[i]) == numeric::float_bits(want[i]));
            }
          }
        }
      }
    }
  }
}
