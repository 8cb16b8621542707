// The fused ops on several threads of the host executor: every output, saved copy, rstd, dweight
// and count the same bits as on one thread, for the savers' every path (the AVX-512 group savers,
// the row savers, groupings spanning rows) and dweight's blocks of rows split among threads.
#include <agoq/activation/fused.hpp>
#include <agoq/layout/tensor.hpp>

#include <doctest/doctest.h>

#include "statistics_support.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace agoq::activation;
using agoq::bfloat16;
using agoq::host_executor;
using agoq::matrix_view;
using agoq::quantize_options;
using agoq::quantized_tensor;
using agoq::spec;
using statistics_test::same_bits;
namespace numeric = agoq::numeric;

namespace {

using tensor = std::vector<bfloat16>;

// The code families of the specs below (each saver path has one): the test compiles no others.
using codes =
    agoq::type_list<agoq::int_sym<2>, agoq::int_sym<4>, agoq::int_sym<8>, agoq::uint_asym<4>>;

// bf16 data with outliers, NaN and +-Inf.
tensor sample(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  tensor x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float v = d(gen);
    if (i % 89 == 3) v *= 30.0f;
    if (i % 3001 == 17) v = std::nanf("");
    if (i % 4007 == 19) v = i % 2 ? HUGE_VALF : -HUGE_VALF;
    x[static_cast<std::size_t>(i)] = numeric::from_float<bfloat16>(v);
  }
  return x;
}

template <class T>
bool same(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same(quantized_tensor const& a, quantized_tensor const& b) {
  return a.bytes() == b.bytes() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.bytes())) == 0;
}

matrix_view<bfloat16> view(tensor& x, std::int64_t rows, std::int64_t cols) {
  return matrix_view<bfloat16>(x.data(), rows, cols);
}
matrix_view<bfloat16 const> cview(tensor const& x, std::int64_t rows, std::int64_t cols) {
  return matrix_view<bfloat16 const>(x.data(), rows, cols);
}

// What one run of all seven ops writes, and the statistics of the saved tensors where the
// forward ops ran in their measured forms.
struct outputs {
  std::vector<quantized_tensor> saved;
  std::vector<tensor> values;
  std::vector<float> rstd, dweight;
  std::vector<std::int64_t> counts;
  std::vector<tensor_stats> stats;
};

// With `measured`, the forward ops' measured forms, whose statistics measure must give too.
outputs run_all(host_executor ex, spec const& s, std::int64_t rows, std::int64_t cols,
                bool measured = false) {
  std::int64_t const n = rows * cols;
  tensor const x = sample(n, 1), g = sample(n, 2), u = sample(n, 3), dy = sample(n, 4);
  tensor w = sample(cols, 5);
  quantize_options const opt{.seed = 9, .offset = 77};
  outputs o;
  auto saved = [&] { return &o.saved.emplace_back(s, rows, cols); };
  auto value = [&] { return &o.values.emplace_back(static_cast<std::size_t>(n)); };
  o.saved.reserve(5);
  o.values.reserve(8);
  o.rstd.resize(static_cast<std::size_t>(rows));
  o.dweight.assign(static_cast<std::size_t>(cols), 0.5f);
  o.stats.resize(5);

  quantized_tensor* sx = saved();
  tensor* y = value();
  auto const ws = std::span<bfloat16 const>(w);
  o.counts.push_back(
      measured ? rmsnorm_forward_measured<codes>(ex, cview(x, rows, cols), ws, 1e-5f,
                                                 view(*y, rows, cols), sx->view(),
                                                 std::span<float>(o.rstd), o.stats[0], opt)
               : rmsnorm_forward<codes>(ex, cview(x, rows, cols), ws, 1e-5f, view(*y, rows, cols),
                                        sx->view(), std::span<float>(o.rstd), opt));
  tensor* dx = value();
  o.counts.push_back(rmsnorm_backward<codes>(
      ex, cview(dy, rows, cols), sx->view(), std::span<float const>(o.rstd),
      std::span<bfloat16 const>(w), view(*dx, rows, cols), std::span<float>(o.dweight)));
  quantized_tensor* sg = saved();
  quantized_tensor* su = saved();
  tensor* out = value();
  o.counts.push_back(
      measured ? swiglu_forward_measured<codes>(ex, cview(g, rows, cols), cview(u, rows, cols),
                                                view(*out, rows, cols), sg->view(), su->view(),
                                                o.stats[1], o.stats[2], opt)
               : swiglu_forward<codes>(ex, cview(g, rows, cols), cview(u, rows, cols),
                                       view(*out, rows, cols), sg->view(), su->view(), opt));
  tensor* dg = value();
  tensor* du = value();
  o.counts.push_back(swiglu_backward<codes>(ex, cview(dy, rows, cols), sg->view(), su->view(),
                                            view(*dg, rows, cols), view(*du, rows, cols)));
  quantized_tensor* sgelu = saved();
  tensor* gy = value();
  *gy = x;  // in place
  o.counts.push_back(
      measured
          ? gelu_forward_measured(ex, cview(*gy, rows, cols), view(*gy, rows, cols), sgelu->view(),
                                  o.stats[3], opt)
          : gelu_forward(ex, cview(*gy, rows, cols), view(*gy, rows, cols), sgelu->view(), opt));
  tensor* gdx = value();
  o.counts.push_back(
      gelu_backward(ex, cview(dy, rows, cols), sgelu->view(), view(*gdx, rows, cols)));
  quantized_tensor* ssum = saved();
  tensor* sum = value();
  *sum = g;  // in place: the residual stream
  o.counts.push_back(
      measured ? residual_add_measured<codes>(ex, cview(*sum, rows, cols), cview(u, rows, cols),
                                              view(*sum, rows, cols), ssum->view(), o.stats[4], opt)
               : residual_add<codes>(ex, cview(*sum, rows, cols), cview(u, rows, cols),
                                     view(*sum, rows, cols), ssum->view(), opt));
  return o;
}

}  // namespace

TEST_CASE("the fused ops give the same bits on any number of threads") {
  std::vector<std::string> const specs = {
      "int8_g128_sym_rne_f32",  // the AVX-512 group savers
      "int4_g128_sym_sr_f32",   // the same, stochastic
      "int2_g7_sym_rne_f32",    // row savers
      "int4_col_asym_sr_f32",   // groups spanning rows: one quantize pass
      "int8_b16x16_sym_rne_bf16"};
  std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
      {1, 300}, {37, 300}, {130, 129}, {5, 4100}};
  for (auto const& name : specs) {
    spec const s = spec::parse(name);
    for (auto const& shape : shapes) {
      std::int64_t const rows = shape.first;   // not a structured binding: INFO below captures it,
      std::int64_t const cols = shape.second;  // which clang before 16 cannot
      for (bool simd : {true, false}) {
        outputs const ref = run_all(host_executor{.simd = simd}, s, rows, cols);
        for (int threads : {2, 3, 7}) {
          INFO(name << " " << rows << "x" << cols << " simd " << simd << ", " << threads
                    << " threads");
          outputs const got =
              run_all(host_executor{.simd = simd, .threads = threads, .min_elements_per_thread = 1},
                      s, rows, cols);
          CHECK(got.counts == ref.counts);
          CHECK(same(got.rstd, ref.rstd));
          CHECK(same(got.dweight, ref.dweight));
          for (std::size_t i = 0; i < ref.values.size(); ++i) {
            INFO("output " << i);
            CHECK(same(got.values[i], ref.values[i]));
          }
          for (std::size_t i = 0; i < ref.saved.size(); ++i) {
            INFO("saved copy " << i);
            CHECK(same(got.saved[i], ref.saved[i]));
          }
        }
      }
    }
  }
}

TEST_CASE("RMSNorm backward splits dweight's blocks of rows among threads in block order") {
  // 2000 rows: blocks of 32 rows (dweight_block_rows), 63 of them, over 4 threads.
  spec const s = spec::parse("int8_g128_sym_rne_f32");
  outputs const one = run_all(host_executor{}, s, 2000, 64);
  outputs const four =
      run_all(host_executor{.threads = 4, .min_elements_per_thread = 1}, s, 2000, 64);
  CHECK(same(one.dweight, four.dweight));
  CHECK(same(one.values[1], four.values[1]));
}

TEST_CASE("the measured fused ops give the fused ops' bits and measure's statistics on threads") {
  // Row savers (g7: 43 groups a row, 95 rows a thread in a set of rows, so 400 rows cross sets on
  // any thread count), the AVX-512 group savers, rows measured in two passes (per row beyond 256
  // columns) and a grouping spanning rows (measured in a pass of its own).
  std::vector<std::string> const specs = {"int2_g7_sym_rne_f32", "int8_g128_sym_rne_f32",
                                          "int4_row_sym_rne_f32", "int4_col_asym_sr_f32"};
  std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {{400, 300}, {37, 300}};
  for (auto const& name : specs) {
    spec const s = spec::parse(name);
    for (auto const& shape : shapes) {
      std::int64_t const rows = shape.first;
      std::int64_t const cols = shape.second;
      std::int64_t const n = rows * cols;
      outputs const ref = run_all(host_executor{}, s, rows, cols);
      // The saved tensors as the sample makes them (gate the first input, the sum the last output).
      std::vector<tensor_stats> const expected = {
          measure(agoq::host, cview(sample(n, 1), rows, cols), s),
          measure(agoq::host, cview(sample(n, 2), rows, cols), s),
          measure(agoq::host, cview(sample(n, 3), rows, cols), s),
          measure(agoq::host, cview(sample(n, 1), rows, cols), s),
          measure(agoq::host, cview(ref.values.back(), rows, cols), s)};
      for (int threads : {1, 2, 3, 7}) {
        INFO(name << " " << rows << "x" << cols << ", " << threads << " threads");
        outputs const got = run_all(host_executor{.threads = threads, .min_elements_per_thread = 1},
                                    s, rows, cols, true);
        CHECK(got.counts == ref.counts);
        CHECK(same(got.rstd, ref.rstd));
        CHECK(same(got.dweight, ref.dweight));
        for (std::size_t i = 0; i < ref.values.size(); ++i)
          CHECK(same(got.values[i], ref.values[i]));
        for (std::size_t i = 0; i < ref.saved.size(); ++i) CHECK(same(got.saved[i], ref.saved[i]));
        for (std::size_t i = 0; i < expected.size(); ++i) {
          INFO("statistics " << i);
          CHECK(same_bits(got.stats[i], expected[i]));
        }
      }
    }
  }
}
