#include <agoq/optim/weights.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <agoq/layout/params.hpp>

using namespace agoq;
using namespace agoq::optim;

namespace {

/// An [out, in] weight matrix with a few outliers (fixed seed).
std::vector<float> weights(std::int64_t out, std::int64_t in, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(out * in));
  for (float& x : w) x = normal(gen);
  for (std::size_t i = 0; i < w.size(); i += 997) w[i] *= 40.0f;
  return w;
}

std::vector<weight_format> formats() {
  std::vector<weight_format> f;
  for (weight_grouping const g : {weight_grouping::per_channel, weight_grouping::per_block}) {
    for (int const bits : {8, 4}) f.push_back({g, bits, rounding_kind::nearest, scale_format::f32});
  }
  return f;
}

}  // namespace

TEST_CASE("weights: formats name the per-row and 128x128-block specs") {
  weight_format f;
  CHECK(f.to_spec().name() == "int8_row_sym_rne_f32");
  f.bits = 4;
  CHECK(f.to_spec().name() == "int4_row_sym_rne_f32");
  f.grouping = weight_grouping::per_block;
  f.bits = 8;
  CHECK(f.to_spec().name() == "int8_b128x128_sym_rne_f32");
  f.bits = 4;
  f.rounding = rounding_kind::stochastic;
  f.scale = scale_format::bf16;
  CHECK(f.to_spec().name() == "int4_b128x128_sym_sr_bf16");
  f.bits = 2;
  CHECK_THROWS_AS(f.to_spec(), agoq::invalid_argument);
}

TEST_CASE("weights: quantize round trip stays within half a step of each group") {
  std::int64_t const out = 300;  // not a multiple of 128: partial blocks
  std::int64_t const in = 200;
  std::vector<float> const w = weights(out, in, 1);
  for (weight_format const& f : formats()) {
    CAPTURE(f.to_spec().name());
    quantized_tensor const q =
        quantize_weights(host, matrix_view<float const>(w.data(), out, in), f);
    CHECK(q.spec() == f.to_spec());
    std::vector<float> back(w.size());
    dequantize(host, q.view(), matrix_view<float>(back.data(), out, in));
    quantized_layout const l = q.layout();
    int const qmax = (1 << (f.bits - 1)) - 1;
    for (std::int64_t r = 0; r < out; ++r) {
      for (std::int64_t c = 0; c < in; ++c) {
        float const scale = load_group_params(q.view(), l.group_of(r, c)).scale;
        float const x = w[r * in + c];
        // Half a step, plus the float rounding of x / scale and of q * scale.
        REQUIRE(std::abs(back[r * in + c] - x) <= 0.5f * scale * (1.0f + 1e-6f));
        // The STE convention: no finite weight lies outside its group's range (no clipping).
        // scale = fl(absmax / qmax) and the product fl(qmax * scale) each round by at most 2^-24
        // relative, so the group's absmax may exceed the float product by those roundings only.
        REQUIRE(std::abs(x) <= static_cast<float>(qmax) * scale * (1.0f + 0x1p-22f));
      }
    }
  }
}

TEST_CASE("weights: per-channel scales follow each output row's absmax") {
  std::int64_t const out = 4;
  std::int64_t const in = 64;
  std::vector<float> w(out * in, 0.0f);
  for (std::int64_t r = 0; r < out; ++r) w[r * in + r] = static_cast<float>(r + 1);  // absmax r+1
  quantized_tensor const q = quantize_weights(host, matrix_view<float const>(w.data(), out, in),
                                              weight_format{weight_grouping::per_channel, 8});
  CHECK(q.layout().groups() == out);
  for (std::int64_t r = 0; r < out; ++r) {
    CHECK(load_group_params(q.view(), r).scale == static_cast<float>(r + 1) / 127.0f);
  }
}

TEST_CASE("weights: fake-quantize equals quantize followed by dequantize") {
  std::int64_t const out = 130;
  std::int64_t const in = 260;
  std::vector<float> const w = weights(out, in, 2);
  for (weight_format f : formats()) {
    for (rounding_kind const r : {rounding_kind::nearest, rounding_kind::stochastic}) {
      f.rounding = r;
      CAPTURE(f.to_spec().name());
      quantize_options const opt{42, 7};
      auto const wv = matrix_view<float const>(w.data(), out, in);
      quantized_tensor const q = quantize_weights(host, wv, f, opt);
      std::vector<float> a(w.size()), b(w.size());
      dequantize(host, q.view(), matrix_view<float>(a.data(), out, in));
      CHECK(fake_quantize_weights(host, f, wv, matrix_view<float>(b.data(), out, in), opt) == 0);
      REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      // In place on bfloat16 weights, as a training framework holds them.
      std::vector<bfloat16> wb(w.size()), qb(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) wb[i] = numeric::from_float<bfloat16>(w[i]);
      quantized_tensor const qq =
          quantize_weights(host, matrix_view<bfloat16 const>(wb.data(), out, in), f, opt);
      dequantize(host, qq.view(), matrix_view<bfloat16>(qb.data(), out, in));
      fake_quantize_weights(host, f, matrix_view<bfloat16 const>(wb.data(), out, in),
                            matrix_view<bfloat16>(wb.data(), out, in), opt);
      REQUIRE(std::memcmp(wb.data(), qb.data(), wb.size() * sizeof(bfloat16)) == 0);
    }
  }
}

TEST_CASE("weights: the straight-through backward passes the gradient unchanged") {
  std::int64_t const out = 3;
  std::int64_t const in = 5;
  std::vector<float> gq(out * in);
  for (std::size_t i = 0; i < gq.size(); ++i) gq[i] = static_cast<float>(i) - 7.5f;
  gq[4] = -0.0f;
  std::vector<float> gw(gq.size(), 123.0f);
  straight_through(host, matrix_view<float const>(gq.data(), out, in),
                   matrix_view<float>(gw.data(), out, in));
  REQUIRE(std::memcmp(gq.data(), gw.data(), gq.size() * sizeof(float)) == 0);
  // Even for weights far outside the bulk (outliers), nothing is masked: see the round-trip test,
  // which checks |w| <= qmax * scale for every weight, i.e. the clipping mask is all ones.
  straight_through(host, matrix_view<float const>(gw.data(), out, in),
                   matrix_view<float>(gw.data(), out, in));
  REQUIRE(std::memcmp(gq.data(), gw.data(), gq.size() * sizeof(float)) == 0);
  std::vector<float> wrong(4);
  CHECK_THROWS_AS(straight_through(host, matrix_view<float const>(gq.data(), out, in),
                                   matrix_view<float>(wrong.data(), 2, 2)),
                  agoq::invalid_argument);
}

TEST_CASE("weights: non-finite weights are counted") {
  std::vector<float> w(128 * 2, 0.5f);
  w[3] = NAN;
  w[200] = INFINITY;
  std::int64_t bad = 0;
  quantized_tensor const q =
      quantize_weights(host, matrix_view<float const>(w.data(), 2, 128),
                       weight_format{weight_grouping::per_block, 4}, {}, &bad);
  CHECK(bad == 2);
  std::vector<float> y(w.size());
  CHECK(fake_quantize_weights(host, weight_format{weight_grouping::per_channel, 8},
                              matrix_view<float const>(w.data(), 2, 128),
                              matrix_view<float>(y.data(), 2, 128)) == 2);
}
