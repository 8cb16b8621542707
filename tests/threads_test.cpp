// The host executor's threads in the AdamW step, the gradient buffer's accumulate and the 8-bit
// collectives' host steps: the same bits and counts as on one thread (chunks and pieces split
// among the threads).
#include <agoq/comm/in_process.hpp>
#include <agoq/gradient/all_reduce.hpp>
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

#include "gradient/support.hpp"

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

TEST_CASE("the 8-bit collectives give the same bits on any number of threads") {
  // Each rank packs, reduces and unpacks its chunks in pieces of whole groups on its executor's
  // threads: 3 ranks (flat, reduce-scatter) and 2 nodes of 2 (hierarchical), 20000 elements
  // with NaN and Inf, nearest and stochastic rounding.
  using namespace agoq::gradient;
  std::int64_t const n = 20000;
  std::vector<std::vector<float>> in;
  for (unsigned r = 0; r < 4; ++r) {
    in.push_back(normal(n, 40 + r));
    in[r][17 * r + 5] =
        r == 1 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  }
  for (rounding_kind rounding : {rounding_kind::nearest, rounding_kind::stochastic}) {
    all_reduce_options const opt{.group_size = 64, .rounding = rounding, .seed = 7};
    // Every rank's outputs (all-reduce, reduce-scatter shard, hierarchical) and reports.
    auto const run = [&](host_executor ex) {
      std::vector<std::vector<float>> out(10, std::vector<float>(static_cast<std::size_t>(n)));
      std::vector<std::int64_t> reports(12);
      comm::in_process_group::run(3, [&](auto c) {
        auto const r = static_cast<std::size_t>(c.rank());
        all_reduce_result const a =
            all_reduce_8bit(ex, c, std::span<float const>(in[r]), std::span<float>(out[r]), opt);
        reduce_scatter_result const b = reduce_scatter_8bit(ex, c, std::span<float const>(in[r]),
                                                            std::span<float>(out[3 + r]), opt);
        reports[4 * r] = a.nonfinite;
        reports[4 * r + 1] = a.local_nonfinite;
        reports[4 * r + 2] = b.nonfinite;
        reports[4 * r + 3] = b.local_nonfinite;
      });
      gradient_test::node_world world(2, 2);
      world.run([&](int w, auto& intra, auto& inter) {
        auto const r = static_cast<std::size_t>(w);
        all_reduce_8bit_hierarchical(ex, intra, inter, std::span<float const>(in[r]),
                                     std::span<float>(out[6 + r]), opt);
      });
      return std::pair{out, reports};
    };
    auto const [one, one_flags] = run(host_executor{});
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      auto const [many, many_flags] =
          run(host_executor{.threads = threads, .min_elements_per_thread = 1});
      for (std::size_t k = 0; k < one.size(); ++k) {
        CAPTURE(k);
        CHECK(std::memcmp(many[k].data(), one[k].data(), one[k].size() * sizeof(float)) == 0);
      }
      CHECK(many_flags == one_flags);
    }
  }
}
