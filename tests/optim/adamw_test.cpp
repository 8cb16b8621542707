#include <agoq/optim/adamw.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>

#include "optim/problem.hpp"

using namespace agoq;
using namespace agoq::optim;

namespace {

using agoq_test::test_hyper;

adamw_state_options fp32_options() {
  adamw_state_options o;
  o.m = moment_format::f32;
  o.v = moment_format::f32;
  return o;
}

/// The trajectory problem: features over two decades, seed 7, 500 steps.
agoq_test::least_squares const& problem() {
  static agoq_test::least_squares const p(2.0f, 7);
  return p;
}

agoq_test::run_result const& fp32_run() {
  static agoq_test::run_result const r =
      agoq_test::train(problem(), fp32_options(), test_hyper(), 500);
  return r;
}

/// A double-precision AdamW step, written independently of adamw_update.
void reference_step(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                    std::vector<float> const& g, adamw_hyper const& h, int t) {
  double const bc1 = 1.0 - std::pow(double{h.beta1}, t);
  double const bc2 = 1.0 - std::pow(double{h.beta2}, t);
  for (std::size_t i = 0; i < p.size(); ++i) {
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * double{g[i]} * g[i];
    p[i] = p[i] * (1.0 - double{h.lr} * h.weight_decay) -
           h.lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + h.eps);
  }
}

}  // namespace

TEST_CASE("adamw: fp32 moments follow the AdamW update computed in double") {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::int64_t const n = 1000;  // not a multiple of the block
  std::vector<float> w(n);
  for (float& x : w) x = normal(gen);
  std::vector<double> pd(w.begin(), w.end()), md(n, 0.0), vd(n, 0.0);
  adamw_state s(n, fp32_options());
  adamw_hyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  std::vector<float> g(n);
  for (int t = 1; t <= 20; ++t) {
    for (float& x : g) x = normal(gen);
    CHECK(adamw_step(host, s, h, std::span<float>(w), std::span<float const>(g)) == 0);
    reference_step(pd, md, vd, g, h, t);
  }
  CHECK(s.step() == 20);
  // Each step's fp32 rounding moves a parameter by a few ulps of lr; 20 steps stay far below
  // 1e-3 * lr of the double reference.
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(std::abs(w[i] - pd[i]) < 1e-5);
}

TEST_CASE("adamw: bytes per parameter of the default state") {
  std::int64_t const n = std::int64_t{1} << 20;
  adamw_state const s(n);
  CHECK(s.options().m == moment_format::int8_linear);
  CHECK(s.options().v == moment_format::e4m3_sqrt);
  CHECK(s.m().quantized().spec().name() == "int8_g128_sym_sr_f32");
  CHECK(s.v().quantized().spec().name() == "fp8e4m3_g128_sr_f32");
  // n codes + n / 128 fp32 scales per moment; n is a multiple of 128, so no padding.
  CHECK(s.bytes() == 2 * (n + 4 * n / 128));
  CHECK(s.bytes_per_parameter() == doctest::Approx(2.0625).epsilon(1e-12));
  CHECK(s.bytes_per_parameter() <= 2.1);
  adamw_state const f(n, fp32_options());
  CHECK(f.bytes_per_parameter() == 8.0);
  adamw_state_options u;
  u.v = moment_format::uint8_sqrt;  // one zero-point byte per block more
  CHECK(adamw_state(n, u).bytes() == s.bytes() + n / 128 + 0);
}

TEST_CASE("adamw: moment_bytes is what a moment of each format holds") {
  using f = moment_format;
  for (f fmt : {f::f32, f::bf16, f::int8_linear, f::uint8_sqrt, f::e4m3_sqrt, f::e4m3}) {
    for (std::int64_t block : {1, 32, 100, 128}) {
      for (std::int64_t n : {0, 1, 127, 129, 4096}) {
        INFO(format_name(fmt) << " block " << block << " n " << n);
        moment_storage const m(fmt, n, block, rounding_kind::nearest);
        CHECK(moment_bytes(fmt, n, block) == m.bytes());
      }
    }
  }
  // By hand (docs/formats.md): 130 codes, the two fp32 scales at align(130) = 256, the two
  // zero points at align(264) = 384.
  CHECK(moment_bytes(f::uint8_sqrt, 130, 128) == 384 + 2);
  CHECK(moment_bytes(f::e4m3, 130, 128) == 256 + 8);
  CHECK(moment_bytes(f::bf16, 130, 128) == 260);
  CHECK_THROWS_AS(moment_bytes(f::f32, -1, 128), agoq::invalid_argument);
  CHECK_THROWS_AS(moment_bytes(f::e4m3, 10, 0), agoq::invalid_argument);
  CHECK_THROWS_AS(moment_bytes(f::bf16, 10, 0), agoq::invalid_argument);
}

TEST_CASE("adamw: the 8-bit state tracks fp32 AdamW on least squares over 500 steps") {
  // Metrics after N = 500 steps (lr 1e-2 decayed linearly, weight decay 0.01), w0 = 0:
  // - prediction distance ||A (w - w_fp32)|| / ||A w_fp32||: measured 0.018 (bf16 v: 0.012);
  // - loss ratio L(w) / L(w_fp32): measured 1.023.
  // The bounds (0.05, [0.9, 1.1]) leave about 2.5x the measured gap; the negative control below
  // misses them by orders of magnitude.
  agoq_test::least_squares const& p = problem();
  agoq_test::run_result const& ref = fp32_run();
  adamw_state_options o;
  o.seed = 99;
  agoq_test::run_result const r = agoq_test::train(p, o, test_hyper(), 500);
  REQUIRE(r.finite);
  double const pred = p.prediction_distance(r.w, ref.w);
  double const ratio = r.final_loss / ref.final_loss;
  MESSAGE("8-bit AdamW: prediction distance " << pred << ", parameter distance "
                                              << agoq_test::relative_distance(r.w, ref.w)
                                              << ", loss ratio " << ratio);
  CHECK(pred < 0.05);
  CHECK(ratio > 0.9);
  CHECK(ratio < 1.1);
  // Training made progress: the fp32 run ends far below the initial loss, and so does this one.
  double const l0 = p.loss(std::vector<float>(agoq_test::least_squares::params, 0.0f));
  CHECK(ref.final_loss < 0.05 * l0);
  CHECK(r.max_loss <= l0);
}

TEST_CASE("adamw: a plain linear 8-bit second moment blows up where e4m3_sqrt does not") {
  // int8_linear rounds every v below 1/254 of its block maximum to zero (gradients 16x smaller
  // than their block's largest), and such a parameter then moves by lr * m / eps.
  agoq_test::least_squares const& p = problem();
  agoq_test::run_result const& ref = fp32_run();
  double const l0 = p.loss(std::vector<float>(agoq_test::least_squares::params, 0.0f));
  for (rounding_kind const r : {rounding_kind::nearest, rounding_kind::stochastic}) {
    CAPTURE(static_cast<int>(r));
    adamw_state_options o;
    o.v = moment_format::int8_linear;
    o.v_rounding = r;
    o.seed = 99;
    agoq_test::run_result const bad = agoq_test::train(p, o, test_hyper(), 500);
    MESSAGE("linear 8-bit v: loss ratio " << bad.final_loss / ref.final_loss << ", largest loss "
                                          << bad.max_loss / l0 << " x the initial loss");
    // Blown up: the loss rose above where it started, and ends 100x above the fp32 run.
    CHECK(bad.max_loss > 2.0 * l0);
    CHECK(bad.final_loss > 100.0 * ref.final_loss);
    // The chosen code under the same rounding trains normally: loss ratio measured 1.02
    // (stochastic, the default) and 1.13 (nearest, which lets v stagnate: docs/optimizer.md);
    // the bound 1.5 separates that from the control's > 100 with room on both sides.
    o.v = moment_format::e4m3_sqrt;
    agoq_test::run_result const good = agoq_test::train(p, o, test_hyper(), 500);
    CHECK(good.max_loss <= l0);
    CHECK(good.final_loss < 1.5 * ref.final_loss);
  }
}

TEST_CASE("adamw: zero states and tiny, denormal or zero gradients stay finite") {
  std::int64_t const n = 3 * 128 + 17;
  float const denormal = std::numeric_limits<float>::denorm_min();
  std::vector<float> const specials = {0.0f,      -0.0f,  1e-30f, -1e-30f, denormal,
                                       -denormal, 1e-38f, 1e-20f, 1.0f,    -3e4f};
  for (moment_format const vf :
       {moment_format::int8_linear, moment_format::uint8_sqrt, moment_format::e4m3_sqrt,
        moment_format::e4m3, moment_format::bf16, moment_format::f32}) {
    for (rounding_kind const r : {rounding_kind::nearest, rounding_kind::stochastic}) {
      CAPTURE(format_name(vf));
      adamw_state_options o;
      o.v = vf;
      o.m_rounding = r;
      o.v_rounding = r;
      adamw_state s(n, o);
      std::vector<float> w(n, 0.5f);
      std::vector<float> g(n);
      adamw_hyper h;
      h.weight_decay = 0.1f;
      for (int t = 0; t < 30; ++t) {
        for (std::int64_t i = 0; i < n; ++i) {
          // Blocks of all zeros, all tiny, and mixed magnitudes; every 7th step all zero.
          std::int64_t const blk = i / 128;
          float const x = specials[static_cast<std::size_t>((i * 7 + t) % specials.size())];
          g[i] = t % 7 == 6 || blk == 0 ? 0.0f : blk == 1 ? (i % 2 ? 1e-30f : denormal) : x;
        }
        REQUIRE(adamw_step(host, s, h, std::span<float>(w), std::span<float const>(g)) == 0);
        for (float x : w) REQUIRE(std::isfinite(x));
      }
      for (float x : s.m().values()) REQUIRE(std::isfinite(x));
      for (float x : s.v().values()) REQUIRE(std::isfinite(x));
      // A block that only ever saw zero gradients moved by weight decay alone.
      float const only_decay = w[0];
      for (std::int64_t i = 0; i < 128; ++i) REQUIRE(w[i] == only_decay);
      CHECK(only_decay < 0.5f);
    }
  }
}

TEST_CASE("adamw: a non-finite gradient element is skipped and counted") {
  std::int64_t const n = 256;
  adamw_state s(n);
  std::vector<float> w(n, 1.0f);
  std::vector<float> g(n, 0.25f);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  g[200] = -std::numeric_limits<float>::infinity();
  adamw_hyper h;
  CHECK(adamw_step(host, s, h, std::span<float>(w), std::span<float const>(g)) == 2);
  CHECK(w[3] == 1.0f);
  CHECK(w[200] == 1.0f);
  CHECK(w[4] < 1.0f);
  std::vector<float> const m = s.m().values();
  CHECK(m[3] == 0.0f);
  for (float x : w) CHECK(std::isfinite(x));
}

TEST_CASE("adamw: reading an 8-bit gradient view equals passing its dequantized floats") {
  std::int64_t const n = 5 * 128 + 40;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (char const* name :
       {"int8_g128_sym_sr_f32", "int8_g64_asym_rne_bf16", "fp8e4m3_g32_rne_e8m0"}) {
    CAPTURE(name);
    spec const gs = spec::parse(name);
    adamw_state a(n);
    adamw_state b(n);
    std::vector<float> wa(n), wb;
    for (float& x : wa) x = normal(gen);
    wb = wa;
    quantized_tensor q(gs, 1, n);
    std::vector<float> g(n), deq(n);
    for (int t = 0; t < 5; ++t) {
      for (std::int64_t i = 0; i < n; ++i)
        g[i] = normal(gen) * std::exp2(static_cast<float>(i % 9));
      quantize(host, as_row(static_cast<float const*>(g.data()), n), q.view(), {17, 0});
      dequantize(host, std::as_const(q).view(), as_row(deq.data(), n));
      adamw_step(host, a, adamw_hyper{}, std::span<float>(wa), std::as_const(q).view());
      adamw_step(host, b, adamw_hyper{}, std::span<float>(wb), std::span<float const>(deq));
    }
    REQUIRE(std::memcmp(wa.data(), wb.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(a.m().quantized().data(), b.m().quantized().data(),
                        a.m().quantized().bytes()) == 0);
    REQUIRE(std::memcmp(a.v().quantized().data(), b.v().quantized().data(),
                        a.v().quantized().bytes()) == 0);
  }
  // A [rows, cols] view with per-row groups is read in row-major order, like its floats.
  quantized_tensor q(spec::parse("int8_row_sym_rne_f32"), 6, 50);
  std::vector<float> g(300), deq(300);
  for (float& x : g) x = normal(gen);
  quantize(host, matrix_view<float const>(g.data(), 6, 50), q.view());
  dequantize(host, std::as_const(q).view(), matrix_view<float>(deq.data(), 6, 50));
  adamw_state a(300), b(300);
  std::vector<float> wa(300, 1.0f), wb(300, 1.0f);
  adamw_step(host, a, adamw_hyper{}, std::span<float>(wa), std::as_const(q).view());
  adamw_step(host, b, adamw_hyper{}, std::span<float>(wb), std::span<float const>(deq));
  CHECK(std::memcmp(wa.data(), wb.data(), 300 * sizeof(float)) == 0);
  // Codes narrower than 8 bits are refused.
  quantized_tensor q4(spec::parse("int4_g128_sym_rne_f32"), 1, 300);
  CHECK_THROWS_AS(
      adamw_step(host, a, adamw_hyper{}, std::span<float>(wa), std::as_const(q4).view()),
      agoq::invalid_argument);
}

TEST_CASE("adamw: the step is deterministic and the seed changes the stochastic rounding") {
  std::int64_t const n = 20000;  // several chunks
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads(4, std::vector<float>(n));
  for (auto& g : grads)
    for (float& x : g) x = normal(gen);
  auto run = [&](std::uint64_t seed) {
    adamw_state_options o;
    o.seed = seed;
    adamw_state s(n, o);
    std::vector<float> w(n, 0.1f);
    for (auto const& g : grads)
      adamw_step(host, s, adamw_hyper{}, std::span<float>(w), std::span<float const>(g));
    return std::pair{w, s.m().values()};
  };
  auto const [w1, m1] = run(1);
  auto const [w2, m2] = run(1);
  auto const [w3, m3] = run(2);
  CHECK(w1 == w2);
  CHECK(m1 == m2);
  CHECK(m1 != m3);
}

TEST_CASE("adamw: bfloat16 weights with and without an fp32 master copy") {
  std::int64_t const n = 300;
  std::vector<float> g(n);
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : g) x = normal(gen);
  std::vector<float> master(n, 1.0f), ref(n, 1.0f);
  std::vector<bfloat16> wm(n, numeric::from_float<bfloat16>(1.0f));
  std::vector<bfloat16> wn = wm;
  adamw_state a(n), b(n), c(n);
  adamw_hyper h;
  h.lr = 1e-4f;  // below half a bfloat16 ulp of 1.0 (2^-8 / 2)
  for (int t = 0; t < 10; ++t) {
    adamw_step(host, a, h, std::span<bfloat16>(wm), std::span<float>(master),
               std::span<float const>(g));
    adamw_step(host, b, h, std::span<bfloat16>(wn), std::span<float>(), std::span<float const>(g));
    adamw_step(host, c, h, std::span<float>(ref), std::span<float const>(g));
  }
  // The master copy follows the fp32 step exactly; the weights are its rounding.
  CHECK(master == ref);
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(numeric::raw_bits(wm[i]) == numeric::raw_bits(numeric::from_float<bfloat16>(ref[i])));
    // Without a master copy each update (<= lr ~ 1e-4) is below half an ulp and is lost.
    REQUIRE(numeric::to_float(wn[i]) == 1.0f);
  }
}

TEST_CASE("adamw: bad arguments throw before anything changes") {
  adamw_state s(10);
  std::vector<float> w(10, 1.0f), g(10, 1.0f), short_g(9, 1.0f);
  CHECK_THROWS_AS(
      adamw_step(host, s, adamw_hyper{}, std::span<float>(w), std::span<float const>(short_g)),
      agoq::invalid_argument);
  adamw_hyper h;
  h.eps = 0.0f;
  CHECK_THROWS_AS(adamw_step(host, s, h, std::span<float>(w), std::span<float const>(g)),
                  agoq::invalid_argument);
  h = adamw_hyper{};
  h.beta2 = 1.0f;
  CHECK_THROWS_AS(adamw_step(host, s, h, std::span<float>(w), std::span<float const>(g)),
                  agoq::invalid_argument);
  CHECK(s.step() == 0);
  CHECK(w == std::vector<float>(10, 1.0f));
  adamw_state_options o;
  o.m = moment_format::e4m3_sqrt;
  CHECK_THROWS_AS(adamw_state(10, o), agoq::invalid_argument);
  CHECK_THROWS_AS(adamw_state(-1), agoq::invalid_argument);
  // The block size sets the step's chunk for every format, fp32 moments included.
  o = adamw_state_options{};
  o.m = moment_format::f32;
  o.v = moment_format::f32;
  o.block = 0;
  CHECK_THROWS_AS(adamw_state(10, o), agoq::invalid_argument);
  adamw_state empty(0);
  std::vector<float> none;
  CHECK(adamw_step(host, empty, adamw_hyper{}, std::span<float>(none),
                   std::span<float const>(none)) == 0);
  CHECK(empty.bytes_per_parameter() == 0.0);
}

TEST_CASE("decode_flat_run decodes row-major runs across rows like dequantize") {
  for (auto const& shape :
       {std::tuple{"int8_g128_sym_sr_f32", 3, 300}, std::tuple{"fp8e4m3_g32_rne_e8m0", 9, 13},
        std::tuple{"int8_row_asym_rne_bf16", 5, 7}, std::tuple{"int8_col_sym_rne_f32", 4, 3},
        std::tuple{"fp8e5m2_b3x5_rne_f32", 7, 11}}) {
    // Not a structured binding: INFO below captures these, which clang before 16 cannot.
    char const* const name = std::get<0>(shape);
    int const rows = std::get<1>(shape);
    int const cols = std::get<2>(shape);
    INFO(name << " " << rows << "x" << cols);
    spec const s = spec::parse(name);
    std::int64_t const n = std::int64_t{rows} * cols;
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& f : x) f = normal(gen);
    quantized_tensor q(s, rows, cols);
    quantize(host, matrix_view<float const>(x.data(), rows, cols), q.view(), {3, 0});
    std::vector<float> want(x.size());
    dequantize(host, q.view(), matrix_view<float>(want.data(), rows, cols));
    const_quantized_view const v = q.view();
    quantized_layout const l = v.layout();
    dispatch_code(s, [&](auto code) {
      using Code = decltype(code);
      if constexpr (Code::bits == 8) {
        for (std::int64_t first = 0; first < n; ++first) {
          for (int count = 0; count <= 8; ++count) {
            if (first + count > n) break;
            float got[8];
            optim::detail::decode_flat_run<Code>(v, l, first, count, got);
            for (int i = 0; i < 8; ++i) {
              float const expect = i < count ? want[static_cast<std::size_t>(first + i)] : 0.0f;
              REQUIRE(std::memcmp(&got[i], &expect, 4) == 0);
            }
          }
        }
      } else {
        FAIL("not an 8-bit code");
      }
    });
  }
}
