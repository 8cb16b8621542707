// The CPU executor's threads: parallel_sum's ranges and errors, the thread-count rule, and
// quantize, dequantize and fake_quantize giving the same bits and counts on any number of threads.
#include <agoq/agoq.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "reverse_pool.hpp"

using namespace agoq;
using agoq::host_pool;
using agoq::host_task;
using agoq::detail::host::parallel_sum;
using agoq::detail::host::thread_count;
using host_test::reverse_pool;

TEST_CASE("parallel_sum covers every unit once, on as many threads as asked") {
  for (int threads : {1, 2, 3, 7, 64}) {
    for (std::int64_t units : {0, 1, 2, 5, 7, 100, 1001}) {
      INFO(threads << " threads, " << units << " units");
      std::vector<int> hits(static_cast<std::size_t>(units), 0);
      std::mutex m;
      std::set<std::thread::id> ids;
      std::int64_t const sum =
          parallel_sum(host_pool{}, threads, units, [&](std::int64_t u0, std::int64_t u1) {
            REQUIRE(u0 < u1);
            {
              std::lock_guard<std::mutex> lock(m);
              ids.insert(std::this_thread::get_id());
            }
            for (std::int64_t u = u0; u < u1; ++u) ++hits[static_cast<std::size_t>(u)];
            return u1 - u0 + 1000 * u0;  // depends on where the range starts
          });
      for (int h : hits) REQUIRE(h == 1);
      std::int64_t const n = std::min<std::int64_t>(threads, units);
      CHECK(ids.size() == static_cast<std::size_t>(units == 0 ? 0 : std::max<std::int64_t>(n, 1)));
      if (n > 1 || units == 1) CHECK(ids.count(std::this_thread::get_id()) == 1);
      // The ranges are i * units / n: the same split for the same thread count.
      std::int64_t expected = units;
      for (std::int64_t i = 0; i < std::max<std::int64_t>(n, 1) && units > 0; ++i) {
        expected += 1000 * (i * units / std::max<std::int64_t>(n, 1));
      }
      CHECK(sum == (units == 0 ? 0 : expected));
    }
  }
}

TEST_CASE("parallel_sum rethrows the lowest range's exception after joining every thread") {
  std::atomic<int> finished{0};
  auto const f = [&](std::int64_t u0, std::int64_t) -> std::int64_t {
    if (u0 >= 2) throw std::runtime_error("range at " + std::to_string(u0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++finished;
    return 1;
  };
  try {
    parallel_sum(host_pool{}, 4, 4, f);
    FAIL("no exception");
  } catch (std::runtime_error const& e) {
    CHECK(std::string(e.what()) == "range at 2");
  }
  CHECK(finished == 2);  // the ranges that did not throw ran to their end before the rethrow
}

TEST_CASE("parallel_sum hands a caller's pool one task per range, and rethrows from it") {
  reverse_pool p;
  std::vector<int> hits(100, 0);
  CHECK(parallel_sum(p.pool(), 7, 100, [&](std::int64_t u0, std::int64_t u1) {
          for (std::int64_t u = u0; u < u1; ++u) ++hits[static_cast<std::size_t>(u)];
          return u1 - u0;
        }) == 100);
  for (int h : hits) REQUIRE(h == 1);
  CHECK(p.calls == 1);
  CHECK(p.tasks == 7);
  CHECK(parallel_sum(p.pool(), 1, 100, [](std::int64_t, std::int64_t) { return 1; }) == 1);
  CHECK(p.calls == 1);  // one thread: no task for the pool
  CHECK_THROWS_WITH_AS(parallel_sum(p.pool(), 3, 3,
                                    [](std::int64_t u0, std::int64_t) -> std::int64_t {
                                      if (u0 > 0)
                                        throw std::runtime_error("range " + std::to_string(u0));
                                      return 0;
                                    }),
                       "range 1", std::runtime_error);
}

TEST_CASE("a call uses the threads asked for, fewer where its work is small") {
  CHECK(thread_count(1, 1000, 1) == 1);
  CHECK(thread_count(4, 1000, 1) == 4);
  CHECK(thread_count(4, 1000, 300) == 3);
  CHECK(thread_count(4, 1000, 2000) == 1);
  CHECK(thread_count(4, 0, 1) == 1);
  CHECK(thread_count(-3, 1000, 1) == std::max<int>(1, std::thread::hardware_concurrency()));
  CHECK(thread_count(0, 1000, 1) == std::max<int>(1, std::thread::hardware_concurrency()));
  // The default: a thread per 65536 elements at the least.
  CHECK(host.threads == 1);
  CHECK(host.min_elements_per_thread == 65536);
}

namespace {

// bf16 data with outliers, zeros, NaN and +-Inf.
std::vector<bfloat16> data(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<bfloat16> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float v = d(gen);
    if (i % 97 == 5) v *= 40.0f;
    if (i % 1013 == 7) v = 0.0f;
    if (i % 4099 == 11) v = std::nanf("");
    if (i % 5003 == 13) v = i % 2 ? HUGE_VALF : -HUGE_VALF;
    x[static_cast<std::size_t>(i)] = numeric::from_float<bfloat16>(v);
  }
  return x;
}

bool same_bytes(std::vector<bfloat16> const& a, std::vector<bfloat16> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0;
}

}  // namespace

TEST_CASE("quantize, dequantize and fake_quantize give the same bits on any number of threads") {
  // (also as the tasks of a caller's pool)
  std::vector<std::string> const specs = {
      "int8_g128_sym_rne_f32",   "int4_g128_sym_sr_f32",    "int4_g32_asym_rne_bf16",
      "int2_g7_sym_sr_f32",      "int8_row_sym_rne_f32",    "int4_col_asym_sr_f32",
      "int8_tensor_sym_rne_f32", "int4_b16x16_sym_rne_f32", "fp8e4m3_g32_sr_e8m0",
      "fp8e5m2_row_rne_f32",     "int4_g5000_sym_rne_f32",  "int8_g1_sym_sr_f32"};
  std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
      {1, 1}, {3, 5}, {37, 1000}, {1, 20011}, {130, 129}, {9, 8200}};
  quantize_options const opt{.seed = 11, .offset = 1u << 20};
  for (auto const& name : specs) {
    spec const s = spec::parse(name);
    for (auto [rows, cols] : shapes) {
      std::vector<bfloat16> const x = data(rows * cols, static_cast<unsigned>(rows + cols));
      matrix_view<bfloat16 const> const in(x.data(), rows, cols);
      for (bool simd : {true, false}) {
        host_executor const one{.simd = simd};
        // Quantized twice, into buffers filled with 0x00 and 0xff: the bytes that differ are
        // those quantize leaves alone (alignment padding).
        quantized_tensor ref(s, rows, cols);
        quantized_tensor ref_ff(s, rows, cols);
        std::memset(ref.data(), 0x00, static_cast<std::size_t>(ref.bytes()));
        std::memset(ref_ff.data(), 0xff, static_cast<std::size_t>(ref.bytes()));
        std::int64_t const ref_count = quantize(one, in, ref.view(), opt);
        CHECK(quantize(one, in, ref_ff.view(), opt) == ref_count);
        std::vector<bfloat16> ref_y(x.size());
        std::int64_t const ref_dq =
            dequantize(one, ref.view(), matrix_view<bfloat16>(ref_y.data(), rows, cols));
        std::vector<bfloat16> ref_fq(x.size());
        CHECK(fake_quantize(one, s, in, matrix_view<bfloat16>(ref_fq.data(), rows, cols), opt) ==
              ref_count);
        reverse_pool pool;
        for (int threads : {2, 3, 7, -4}) {
          // -4: four tasks of a caller's pool
          INFO(name << " " << rows << "x" << cols << " simd " << simd << ", " << threads
                    << " threads");
          host_executor const ex{.simd = simd,
                                 .threads = threads > 0 ? threads : -threads,
                                 .min_elements_per_thread = 1,
                                 .pool = threads > 0 ? host_pool{} : pool.pool()};
          quantized_tensor q(s, rows, cols);
          std::memset(q.data(), 0x5a, static_cast<std::size_t>(q.bytes()));
          CHECK(quantize(ex, in, q.view(), opt) == ref_count);
          std::int64_t differ = 0;
          for (std::int64_t i = 0; i < q.bytes(); ++i) {
            std::uint8_t const want = ref.data()[i] == ref_ff.data()[i] ? ref.data()[i] : 0x5a;
            differ += q.data()[i] != want ? 1 : 0;
          }
          CHECK(differ == 0);
          std::vector<bfloat16> y(x.size());
          CHECK(dequantize(ex, ref.view(), matrix_view<bfloat16>(y.data(), rows, cols)) == ref_dq);
          CHECK(same_bytes(y, ref_y));
          std::vector<bfloat16> fq = x;  // in place
          CHECK(fake_quantize(ex, s, matrix_view<bfloat16 const>(fq.data(), rows, cols),
                              matrix_view<bfloat16>(fq.data(), rows, cols), opt) == ref_count);
          CHECK(same_bytes(fq, ref_fq));
        }
        // The pool took the three calls, except where the tensor is one unit of work (one group,
        // or per-column groups of at most one chunk of columns). One row of groups (a flat
        // tensor) is split too: by groups on the AVX-512 row path, by chunks elsewhere.
        if ((rows == 37 && s.grouping != grouping_kind::tensor &&
             s.grouping != grouping_kind::column) ||
            (rows == 1 && cols > 1 && s.grouping == grouping_kind::group)) {
          CHECK(pool.calls == 3);
        }
      }
    }
  }
}

TEST_CASE("quantize: groups of one step count their non-finite values exactly, in any lane") {
  // MX-style groups (32 elements, no zero point) take their statistics 16 groups at a time on the
  // AVX-512 row path; the groups holding NaN or ±Inf are then visited one by one from a 16-bit
  // mask. Built at -O1 (threads_tsan_test), g++ 12 once reloaded that mask with a 32-bit read and
  // visited lanes past the 16th, writing past a stack array and miscounting.
  std::int64_t const rows = 64, cols = 700;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  std::int64_t nonfinite = 0;
  for (float& v : x) {
    v = normal(gen);
    if (gen() % 40 == 0) {
      v = gen() % 2 ? std::numeric_limits<float>::quiet_NaN()
                    : std::numeric_limits<float>::infinity();
      ++nonfinite;
    }
  }
  matrix_view<float const> const in(x.data(), rows, cols);
  for (char const* name :
       {"int8_g32_sym_rne_e8m0", "fp8e4m3_g32_rne_e8m0", "int4_g16_sym_rne_f32"}) {
    INFO(name);
    spec const s = spec::parse(name);
    quantized_tensor fast(s, rows, cols), portable(s, rows, cols);
    std::memset(fast.data(), 0, static_cast<std::size_t>(fast.bytes()));
    std::memset(portable.data(), 0, static_cast<std::size_t>(portable.bytes()));
    CHECK(quantize(host_executor{.simd = true}, in, fast.view()) == nonfinite);
    CHECK(quantize(host_executor{.simd = false}, in, portable.view()) == nonfinite);
    CHECK(std::memcmp(fast.data(), portable.data(), static_cast<std::size_t>(fast.bytes())) == 0);
  }
}
