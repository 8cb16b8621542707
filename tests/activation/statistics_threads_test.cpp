// activation::measure on several threads of the host executor: the same statistics, bit for bit,
// as on one thread, for groupings measured in one pass and in two (bands shared out whole, or one
// by one with each pass's slices shared out), pieces of slices that end inside rows, and a
// caller's pool.
#include <agoq/activation/statistics.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "detail/host/reverse_pool.hpp"
#include "statistics_support.hpp"

using agoq::host_executor;
using agoq::tile_shape;
using agoq::activation::measure;
using agoq::activation::tensor_stats;
using host_test::reverse_pool;
using namespace statistics_test;

TEST_CASE_TEMPLATE("measure gives the same bits on any number of threads", T, float,
                   agoq::bfloat16) {
  struct shape {
    std::int64_t rows, cols;
  };
  std::uint64_t seed = 11;
  for (shape const sh : {shape{1, 1}, shape{3, 300}, shape{7, 1000}, shape{64, 700},
                         shape{40, 3000}, shape{2, 2049}, shape{257, 33}}) {
    std::vector<T> const x = sample<T>(sh.rows * sh.cols, seed++);
    for (tile_shape const t : groupings(sh.rows, sh.cols)) {
      CAPTURE(sh.rows);
      CAPTURE(sh.cols);
      CAPTURE(t.rows);
      CAPTURE(t.cols);
      for (bool simd : {true, false}) {
        tensor_stats const one = measure(host_executor{simd}, view(x, sh.rows, sh.cols), t);
        // min_elements_per_thread 1: any slice may go to any thread; 5000: fewer threads for
        // the smaller tensors. Where the dead zones take a second pass, the bands of these
        // tensors are measured together.
        for (std::int64_t min_elements : {1, 5000}) {
          for (int threads : {2, 3, 7}) {
            CAPTURE(simd);
            CAPTURE(min_elements);
            CAPTURE(threads);
            host_executor const ex{
                .simd = simd, .threads = threads, .min_elements_per_thread = min_elements};
            CHECK(same_bits(measure(ex, view(x, sh.rows, sh.cols), t), one));
          }
        }
        // A caller's pool gets the slices as its tasks.
        reverse_pool pool;
        host_executor const pooled{
            .simd = simd, .threads = 4, .min_elements_per_thread = 1, .pool = pool.pool()};
        CHECK(same_bits(measure(pooled, view(x, sh.rows, sh.cols), t), one));
        CHECK((pool.calls > 0) == (sh.rows * sh.cols > 1));
      }
    }
  }
}

TEST_CASE("measure on threads: a flat row folded in many pieces, and tall tiles") {
  // 1,100,000 columns: 8594 slices of 128 (one pass) or 1100 runs of 4 slices (two passes) in
  // one row, in pieces of host_piece_slots per thread that end inside the row.
  std::vector<agoq::bfloat16> const x = sample<agoq::bfloat16>(1100000, 41);
  for (tile_shape const t : {tile_shape{1, 128}, tile_shape{1, 1000}}) {
    tensor_stats const one = measure(agoq::host, view(x, 1, 1100000), t);
    for (int threads : {2, 3}) {
      CAPTURE(t.cols);
      CAPTURE(threads);
      CHECK(same_bits(measure(host_executor{.threads = threads}, view(x, 1, 1100000), t), one));
    }
  }
  // Two passes: a tile taller than the tensor (one band of every row) and one band of 1000 rows
  // of 1100 columns (above host_band_elements: its slices shared out, pass by pass); bands of 3
  // rows shared out whole, 334 of them in one set.
  for (tile_shape const t : {tile_shape{1 << 30, 7}, tile_shape{1000, 1100}, tile_shape{3, 1100}}) {
    CAPTURE(t.rows);
    tensor_stats const one = measure(agoq::host, view(x, 1000, 1100), t);
    CHECK(same_bits(measure(host_executor{.threads = 3}, view(x, 1000, 1100), t), one));
  }
}

TEST_CASE("measure on threads: bands shared out whole in several sets") {
  // 2500 rows of 1100 columns (5 slices a row, each row a band): 2 threads take sets of 1638
  // rows (host_piece_slots slices each), the last set shorter.
  std::vector<agoq::bfloat16> const x = sample<agoq::bfloat16>(2500 * 1100, 43);
  tensor_stats const one = measure(agoq::host, view(x, 2500, 1100), tile_shape{1, 1100});
  CHECK(same_bits(measure(host_executor{.threads = 2}, view(x, 2500, 1100), tile_shape{1, 1100}),
                  one));
}

TEST_CASE_TEMPLATE(
    "quantize_measured gives quantize's bytes and the same statistics on any number "
    "of threads",
    T, float, agoq::bfloat16) {
  struct shape {
    std::int64_t rows, cols;
  };
  std::uint64_t seed = 61;
  for (shape const sh : {shape{3, 300}, shape{64, 700}, shape{40, 3000}, shape{257, 33}}) {
    std::vector<T> const x = sample<T>(sh.rows * sh.cols, seed++);
    for (char const* name :
         {"int4_g128_sym_sr_f32", "int8_g32_sym_rne_e8m0", "int4_g7_sym_rne_f32",
          "int8_g1000_sym_rne_f32", "int8_b16x64_sym_rne_f32", "int8_tensor_asym_rne_f32"}) {
      agoq::spec const s = agoq::spec::parse(name);
      agoq::quantize_options const opt{.seed = 3, .offset = seed};
      for (bool simd : {true, false}) {
        CAPTURE(sh.rows);
        CAPTURE(sh.cols);
        CAPTURE(name);
        CAPTURE(simd);
        fused_result const one =
            quantize_and_measure(host_executor{simd}, s, x, sh.rows, sh.cols, false, opt);
        for (int threads : {1, 2, 3, 7}) {
          CAPTURE(threads);
          host_executor const ex{.simd = simd, .threads = threads, .min_elements_per_thread = 1};
          CHECK(same_result(quantize_and_measure(ex, s, x, sh.rows, sh.cols, true, opt), one));
        }
        reverse_pool pool;
        host_executor const pooled{
            .simd = simd, .threads = 4, .min_elements_per_thread = 1, .pool = pool.pool()};
        CHECK(same_result(quantize_and_measure(pooled, s, x, sh.rows, sh.cols, true, opt), one));
      }
    }
  }
  // A flat row of 1,100,000 columns in pieces of host_piece_slots a thread that end inside the
  // row, each thread's pieces quantized fused_slots groups at a time.
  std::vector<T> const flat = sample<T>(1100000, 71);
  agoq::spec const s = agoq::spec::parse("int4_g128_sym_sr_f32");
  fused_result const one = quantize_and_measure(agoq::host, s, flat, 1, 1100000, false);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    CHECK(same_result(
        quantize_and_measure(host_executor{.threads = threads}, s, flat, 1, 1100000, true), one));
  }
}
