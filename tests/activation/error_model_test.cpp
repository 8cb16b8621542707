#include <agoq/activation/error_model.hpp>
#include <agoq/quantize.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace agoq::activation;
using agoq::spec;

TEST_CASE("rounding and scale-storage factors") {
  CHECK(rounding_noise_factor(agoq::rounding_kind::nearest) == doctest::Approx(1.0 / 12));
  CHECK(rounding_noise_factor(agoq::rounding_kind::stochastic) == doctest::Approx(0.25));
  CHECK(scale_storage_factor(agoq::scale_format::f32) == 1.0);
  CHECK(scale_storage_factor(agoq::scale_format::e8m0) == 4.0);
  CHECK(scale_storage_factor(agoq::scale_format::bf16) > 1.0);
  CHECK(scale_storage_factor(agoq::scale_format::bf16) < 1.02);
}

TEST_CASE("relative error from group statistics, by hand") {
  // One row of 128 elements, absmax 7, sum of squares 128: int4 sym has scale 1, so the noise is
  // 1/12 per element and the relative error 1/12.
  tensor_stats st;
  st.elements = 128;
  st.sum_squares = 128;
  st.add_group(128, 7.0);
  CHECK(relative_error(int4_g128, st, 1, 128) == doctest::Approx(1.0 / 12));
  CHECK(relative_error(spec::parse("int4_g128_sym_sr_f32"), st, 1, 128) == doctest::Approx(0.25));
  CHECK(relative_error(int8_g128, st, 1, 128) == doctest::Approx(49.0 / (127.0 * 127.0) / 12));
  CHECK(relative_error(spec::parse("int4_g128_sym_rne_e8m0"), st, 1, 128) ==
        doctest::Approx(4.0 / 12));
  // Asymmetric: the widened range when known, else 2 absmax.
  CHECK(relative_error(spec::parse("int4_g128_asym_rne_f32"), st, 1, 128) ==
        doctest::Approx(4.0 * 49.0 / 225.0 / 12));
  st.sum_group_range_sq = 0;
  st.add_group(0, 0.0, 0.0);
  tensor_stats st2 = st;
  st2.sum_group_range_sq = 128.0 * 15.0 * 15.0;
  CHECK(relative_error(spec::parse("int4_g128_asym_rne_f32"), st2, 1, 128) ==
        doctest::Approx(1.0 / 12));
  // FP8 E4M3: 3 mantissa bits, 2^-6 / 12 from the normals plus the subnormal floor.
  double const e4m3 = relative_error(spec::parse("fp8e4m3_g128_rne_f32"), st, 1, 128);
  CHECK(e4m3 > std::ldexp(1.0, -6) / 12);
  CHECK(e4m3 < 1.01 * std::ldexp(1.0, -6) / 12);
  CHECK(relative_error(spec::parse("fp8e5m2_g128_rne_f32"), st, 1, 128) >=
        std::ldexp(1.0, -4) / 12);
  // Statistics of another grouping cannot predict g64.
  CHECK_THROWS_WITH_AS(relative_error(spec::parse("int4_g64_sym_rne_f32"), st, 1, 128),
                       doctest::Contains("1x128"), agoq::invalid_argument);
  tensor_stats zero;
  zero.add_group(128, 0.0);
  CHECK(relative_error(int4_g128, zero, 1, 128) == 0.0);
}

TEST_CASE("relative error at 2 bits from the live elements' gaps, by hand") {
  // One group [1, -2, 3, 0.125] (absmax 3): under half a step, 1.5, 1 and 0.125 round to 0; -2 and
  // 3 round to -scale and scale. With f32 (and bf16: 3 is a bfloat16) scales, 3: errors 1 and 0.
  std::vector<float> const x = {1, -2, 3, 0.125f};
  tensor_stats st;
  st.tile = {1, 4};
  st.elements = 4;
  st.sum_squares = 14.015625;
  st.add_group(4, 3.0);
  st.has_dead_zones = true;
  st.add_dead_zone(0, 1.015625, 2, 3.0);
  st.add_live_gap((3.0 - 2.0) * (3.0 - 2.0), 2, 3.0f);
  auto const real = [&](spec const& s) {
    std::vector<float> y(x.size());
    agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(x.data(), 1, 4),
                        agoq::matrix_view<float>(y.data(), 1, 4));
    double noise = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      noise += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    return noise / st.sum_squares;
  };
  spec const f32 = spec::parse("int2_g4_sym_rne_f32");
  spec const bf16 = spec::parse("int2_g4_sym_rne_bf16");
  spec const e8m0 = spec::parse("int2_g4_sym_rne_e8m0");
  CHECK(relative_error(f32, st, 1, 4) == 2.015625 / 14.015625);
  CHECK(real(f32) == 2.015625 / 14.015625);
  CHECK(relative_error(bf16, st, 1, 4) == relative_error(f32, st, 1, 4));
  CHECK(real(bf16) == real(f32));
  // An e8m0 scale is 4: -2 / 4 = -0.5 rounds to 0 (error 4) and 3 / 4 to 1 (error 1), 6.015625 in
  // all; the model bounds the live elements' error by (1 + (4 - 3) sqrt(2))^2.
  CHECK(real(e8m0) == 6.015625 / 14.015625);
  CHECK(relative_error(e8m0, st, 1, 4) ==
        doctest::Approx((1.015625 + 3 + 2 * std::sqrt(2.0)) / 14.015625));
  CHECK(relative_error(e8m0, st, 1, 4) > real(e8m0));
  // Stochastic rounding and statistics without dead zones keep the uniform model.
  CHECK(relative_error(spec::parse("int2_g4_sym_sr_f32"), st, 1, 4) ==
        doctest::Approx(0.25 * 4 * 9 / 14.015625));
  st.has_dead_zones = false;
  CHECK(relative_error(f32, st, 1, 4) == doctest::Approx(4 * 9 / 12.0 / 14.015625));
}

TEST_CASE("the Gaussian model") {
  double const k1 = relative_error_gaussian(int4_g128, 64, 4096, 1.0);
  CHECK(k1 == doctest::Approx(2.0 * std::log(256.0) / 49.0 / 12.0));
  CHECK(relative_error_gaussian(int4_g128, 64, 4096, 3.0) == doctest::Approx(9.0 * k1));
  CHECK(relative_error_gaussian(int8_g128, 64, 4096, 1.0) < k1 / 300);
  // Larger groups have larger absmax.
  CHECK(relative_error_gaussian(spec::parse("int4_row_sym_rne_f32"), 64, 4096, 1.0) > k1);
  CHECK_THROWS_AS(relative_error_gaussian(int4_g128, 64, 4096, 0.5), agoq::invalid_argument);
}

TEST_CASE("the statistics model against real quantization of Gaussian data") {
  // The uniform-noise model (step^2 / 12) should predict the measured error of int4/int8 nearest
  // rounding within a factor, and the hard bound (step^2 / 4) must hold.
  std::int64_t const rows = 64;
  std::int64_t const cols = 1024;
  std::mt19937_64 gen(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (float& v : x) v = normal(gen);
  tensor_stats st;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < cols; g += 128) {
      double absmax = 0;
      for (std::int64_t c = g; c < g + 128; ++c) {
        double const v = x[static_cast<std::size_t>(r * cols + c)];
        absmax = std::max(absmax, std::abs(v));
        st.sum_squares += v * v;
      }
      st.add_group(128, absmax);
    }
  st.elements = rows * cols;
  for (spec const s : {int4_g128, int8_g128}) {
    std::vector<float> y(x.size());
    agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(x.data(), rows, cols),
                        agoq::matrix_view<float>(y.data(), rows, cols));
    double noise = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      noise += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    double const measured = noise / st.sum_squares;
    double const model = relative_error(s, st, rows, cols);
    CHECK(measured <= 3.0 * model);  // hard bound: step^2 / 4 = 3 x (step^2 / 12)
    CHECK(measured > 0.5 * model);
    CHECK(measured < 1.5 * model);
    // The Gaussian model (no statistics) is an upper estimate for Gaussian data.
    CHECK(relative_error_gaussian(s, rows, cols, 1.0) >= measured);
  }
}

TEST_CASE("error_model: sensitivities, outliers and recorded statistics") {
  error_model e;
  saved_shape const sh{64, 4096, 2};
  CHECK(e.sensitivity(tensor_kind::qkv_input) == 1.0);
  CHECK(e.sensitivity(tensor_kind::gate_output) == 2.0);
  CHECK(e.sensitivity(tensor_kind::attn_norm_input) == 4.0);
  CHECK(e.sensitivity(tensor_kind::query) == 8.0);
  CHECK(e.sensitivity(tensor_kind::o_proj_input) == e.sensitivity(tensor_kind::attention_output));
  CHECK(e.relative(0, tensor_kind::qkv_input, sh, storage::precise()) == 0.0);
  double const prior = e.relative(3, tensor_kind::qkv_input, sh, storage::with(int4_g128));
  CHECK(prior == doctest::Approx(relative_error_gaussian(int4_g128, 64, 4096, 3.0)));
  CHECK(e.weighted(3, tensor_kind::attn_norm_input, sh, storage::with(int8_g128)) ==
        doctest::Approx(4.0 * relative_error_gaussian(int8_g128, 64, 4096, 6.0)));
  tensor_stats st;
  st.elements = 64 * 4096;
  st.sum_squares = 64 * 4096;
  st.add_group(64 * 4096, 7.0);
  e.set_statistics(3, tensor_kind::qkv_input, st);
  CHECK(e.relative(3, tensor_kind::qkv_input, sh, storage::with(int4_g128)) ==
        doctest::Approx(1.0 / 12));
  CHECK(e.relative(4, tensor_kind::qkv_input, sh, storage::with(int4_g128)) ==
        doctest::Approx(prior));
  e.clear_statistics();
  CHECK(e.relative(3, tensor_kind::qkv_input, sh, storage::with(int4_g128)) ==
        doctest::Approx(prior));
  e.set_sensitivity(tensor_kind::qkv_input, 0.5);
  CHECK(e.sensitivity(tensor_kind::qkv_input) == 0.5);
  CHECK_THROWS_AS(e.set_sensitivity(tensor_kind::qkv_input, -1), agoq::invalid_argument);
  CHECK_THROWS_AS(e.set_outlier(tensor_kind::qkv_input, 0.9), agoq::invalid_argument);
  CHECK_THROWS_AS(e.set_statistics(-1, tensor_kind::qkv_input, st), agoq::invalid_argument);
}

TEST_CASE("error model: a sensitivity per layer replaces its kind's in that layer only") {
  error_model e;
  saved_shape const sh{64, 4096, 2};
  storage const q = storage::with(int4_g128);
  CHECK(e.last_layer() == -1);
  e.set_sensitivity(5, tensor_kind::gate_output, 7.5);
  CHECK(e.sensitivity(5, tensor_kind::gate_output) == 7.5);
  CHECK(e.sensitivity(4, tensor_kind::gate_output) == 2.0);  // the category's default
  CHECK(e.sensitivity(5, tensor_kind::up_output) == 2.0);
  CHECK(e.sensitivity(tensor_kind::gate_output) == 2.0);
  // The kind's weight moves the other layers, not the one set per layer.
  e.set_sensitivity(tensor_kind::gate_output, 3.0);
  CHECK(e.sensitivity(4, tensor_kind::gate_output) == 3.0);
  CHECK(e.sensitivity(5, tensor_kind::gate_output) == 7.5);
  CHECK(e.weighted(5, tensor_kind::gate_output, sh, q) ==
        doctest::Approx(7.5 * e.relative(5, tensor_kind::gate_output, sh, q)));
  CHECK(e.weighted(4, tensor_kind::gate_output, sh, q) ==
        doctest::Approx(3.0 * e.relative(4, tensor_kind::gate_output, sh, q)));
  // An alias reads the weight of the buffer it names.
  e.set_sensitivity(2, tensor_kind::o_proj_input, 0.25);
  CHECK(e.sensitivity(2, tensor_kind::attention_output) == 0.25);
  // The last layer any per-layer entry names, statistics included.
  CHECK(e.last_layer() == 5);
  tensor_stats st;
  st.elements = 1;
  st.sum_squares = 1;
  st.add_group(1, 1.0);
  e.set_statistics(9, tensor_kind::qkv_input, st);
  CHECK(e.last_layer() == 9);
  e.clear_statistics();
  CHECK(e.last_layer() == 5);
  e.clear_layer_sensitivities();
  CHECK(e.last_layer() == -1);
  CHECK(e.sensitivity(5, tensor_kind::gate_output) == 3.0);
  CHECK_THROWS_WITH_AS(e.set_sensitivity(-1, tensor_kind::key, 1.0),
                       doctest::Contains("the layer must be >= 0, got -1"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(e.set_sensitivity(0, tensor_kind::key, std::nan("")),
                       doctest::Contains("sensitivity must be finite and >= 0"),
                       agoq::invalid_argument);
  CHECK_THROWS_AS(e.set_sensitivity(0, tensor_kind::key, -0.5), agoq::invalid_argument);
}
