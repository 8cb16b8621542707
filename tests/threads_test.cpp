// The host executor's threads in the AdamW step and the gradient buffer's accumulate: the same
// bits and counts as on one thread (chunks and pieces split among the threads).
#include <agoq/gradient/buffer.hpp>
#include <agoq/optim/adamw.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;
using namespace agoq::optim;
using agoq::gradient::gradient_buffer;

namespace {

std::vector<float> normal(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = d(gen);
  return x;
}

}  // namespace

TEST_CASE("adamw: the step gives the same bits on any number of threads") {
  std::int64_t const n = 50021;  // prime: a short last block and chunk
  std::vector<float> const w0 = normal(n, 3);
  std::vector<float> g = normal(n, 4);
  for (float& x : g) x *= 1e-2f;
  g[5] = std::numeric_limits<float>::quiet_NaN();
  quantized_tensor gq(spec::parse("int8_g128_sym_rne_f32"), 1, n);
  quantize(host, as_row(g.data(), n), gq.view());
  adamw_state_options other;
  other.m = moment_format::bf16;
  other.v = moment_format::uint8_sqrt;
  for (adamw_state_options const& o : {adamw_state_options{}, other}) {
    for (bool quantized : {false, true}) {
      auto const run = [&](host_executor ex) {
        adamw_state s(n, o);
        std::vector<float> w = w0;
        std::vector<std::int64_t> skipped;
        for (int t = 0; t < 3; ++t) {
          skipped.push_back(quantized ? adamw_step(ex, s, adamw_hyper{}, std::span<float>(w),
                                                   std::as_const(gq).view())
                                      : adamw_step(ex, s, adamw_hyper{}, std::span<float>(w),
                                                   std::span<float const>(g)));
        }
        return std::make_tuple(w, s.m().values(), s.v().values(), skipped);
      };
      auto const [w1, m1, v1, s1] = run(host);
      CHECK(s1 == std::vector<std::int64_t>(3, quantized ? 0 : 1));
      for (int threads : {2, 3, 7}) {
        INFO(format_name(o.m) << "/" << format_name(o.v) << " quantized " << quantized << ", "
                              << threads << " threads");
        auto const [w, m, v, skipped] =
            run(host_executor{.threads = threads, .min_elements_per_thread = 1});
        CHECK(skipped == s1);
        CHECK(std::memcmp(w.data(), w1.data(), w.size() * 4) == 0);
        CHECK(std::memcmp(m.data(), m1.data(), m.size() * 4) == 0);
        CHECK(std::memcmp(v.data(), v1.data(), v.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("gradient_buffer: accumulate gives the same bits on any number of threads") {
  std::int64_t const n = 100003;  // prime: a short last group and piece
  std::vector<std::vector<float>> g = {normal(n, 1), normal(n, 2), normal(n, 3)};
  g[1][17] = std::numeric_limits<float>::quiet_NaN();
  g[2][n - 1] = -std::numeric_limits<float>::infinity();
  gradient_buffer one(n, {64, rounding_kind::stochastic, 5});
  std::vector<std::int64_t> counts;
  for (auto const& x : g) counts.push_back(one.accumulate(host, std::span<float const>(x)));
  CHECK(counts == std::vector<std::int64_t>{0, 1, 1});
  for (int threads : {2, 3, 8}) {
    INFO(threads << " threads");
    host_executor const ex{.threads = threads, .min_elements_per_thread = 1};
    gradient_buffer b(n, {64, rounding_kind::stochastic, 5});
    for (std::size_t k = 0; k < g.size(); ++k) {
      CHECK(b.accumulate(ex, std::span<float const>(g[k])) == counts[k]);
    }
    CHECK(std::memcmp(b.view().codes, one.view().codes, static_cast<std::size_t>(b.bytes())) == 0);
    CHECK(b.nonfinite_count() == one.nonfinite_count());
  }
}
