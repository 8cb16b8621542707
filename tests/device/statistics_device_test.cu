// The device tier of measure() (activation/statistics.cuh) against the host form
// (activation/statistics.hpp): every field of the statistics bit for bit (dead zones included:
// one pass where groups are one slice, a second pass where they span several),
// for every grouping, in one pass and in many small passes; and quantize_measured's bytes, count
// and statistics against its host form. Built once per element type (AGOQ_TEST_ELEMENT).
#include "device_support.cuh"

#include <cstdint>
#include <utility>
#include <vector>

#include <agoq/activation/statistics.cuh>

// The suite's names, apart from the other suites of tests/device/device_tests.cu.
namespace statistics_device_test {

using namespace agoq;
using namespace agoq::activation;
using agoq::test::device_bytes;

using element = AGOQ_TEST_ELEMENT;

namespace {

void check_same(tensor_stats const& dev, tensor_stats const& host) {
  CHECK(dev.tile == host.tile);
  CHECK(dev.elements == host.elements);
  CHECK(dev.sum_squares == host.sum_squares);
  CHECK(dev.sum_group_absmax_sq == host.sum_group_absmax_sq);
  CHECK(dev.sum_group_range_sq == host.sum_group_range_sq);
  CHECK(dev.has_dead_zones == host.has_dead_zones);
  CHECK(dev.dead_energy == host.dead_energy);
  CHECK(dev.live_absmax_sq == host.live_absmax_sq);
  CHECK(dev.live_error_2bit == host.live_error_2bit);
}

}  // namespace

TEST_CASE("measure on the device equals the host, bit for bit") {
  cuda_executor const ex{cudaStream_t{}};
  std::uint64_t seed = 11;
  for (auto const& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 300}, {7, 1000}, {33, 129}, {2, 4097}, {130, 256}, {1, 70001}}) {
    std::vector<element> const x = agoq::test::random_input<element>(rows * cols, seed++, true);
    device_bytes d((x.size() + 1) * sizeof(element));
    // Offset by one element: measure() has no alignment requirement.
    d.upload(x.data(), x.size() * sizeof(element), sizeof(element));
    auto const* dx = reinterpret_cast<element const*>(d.get()) + 1;
    matrix_view<element const> const hv(x.data(), rows, cols);
    matrix_view<element const> const dv(dx, rows, cols);
    for (tile_shape const t :
         {tile_shape{1, 128}, tile_shape{1, 32}, tile_shape{1, 1000}, tile_shape{1, cols},
          tile_shape{rows, cols}, tile_shape{rows, 1}, tile_shape{3, 5}, tile_shape{128, 128}}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(t.rows);
      CAPTURE(t.cols);
      tensor_stats const host_stats = measure(agoq::host, hv, t);
      check_same(measure(ex, dv, t), host_stats);
      check_same(stats_detail::measure_in_chunks(ex, dv, t, 7), host_stats);
    }
  }
}

TEST_CASE("quantize_measured on the device equals the host form, bit for bit") {
  cuda_executor const ex{cudaStream_t{}};
  std::uint64_t seed = 31;
  for (auto const& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 300}, {33, 129}, {2, 4097}}) {
    std::vector<element> const x = agoq::test::random_input<element>(rows * cols, seed++, true);
    device_bytes d(x.size() * sizeof(element));
    d.upload(x.data(), x.size() * sizeof(element));
    matrix_view<element const> const hv(x.data(), rows, cols);
    matrix_view<element const> const dv(reinterpret_cast<element const*>(d.get()), rows, cols);
    for (char const* name :
         {"int4_g128_sym_sr_f32", "int8_g32_sym_rne_e8m0", "int4_g64_asym_rne_bf16",
          "int8_row_sym_rne_f32", "int8_b16x64_sym_rne_f32", "fp8e4m3_g32_rne_e8m0"}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(name);
      spec const s = spec::parse(name);
      quantize_options const opt{.seed = 7, .offset = seed};
      quantized_layout const l = make_layout(s, rows, cols);
      std::vector<std::uint8_t> host_buffer(static_cast<std::size_t>(l.total_bytes));
      auto const hq = view_of_buffer(s, rows, cols, host_buffer.data());
      tensor_stats host_stats;
      std::int64_t const host_count = quantize_measured(agoq::host, hv, hq, host_stats, opt);
      device_bytes q(static_cast<std::size_t>(l.total_bytes));
      auto const dq = view_of_buffer(s, rows, cols, q.get());
      tensor_stats dev_stats;
      CHECK(quantize_measured(ex, dv, dq, dev_stats, opt) == host_count);
      check_same(dev_stats, host_stats);
      agoq::test::sections const got = agoq::test::download(dq);
      agoq::test::sections const want = agoq::test::host_sections(hq);
      CHECK(got.codes == want.codes);
      CHECK(got.scales == want.scales);
      CHECK(got.zero_points == want.zero_points);
    }
  }
  // Refused before anything is enqueued: a host pointer; the statistics are left alone.
  std::vector<element> host_data(8);
  device_bytes q(256);
  tensor_stats st;
  st.elements = 5;
  CHECK_THROWS_AS(quantize_measured(ex, matrix_view<element const>(host_data.data(), 2, 4),
                                    view_of_buffer(int4_g128, 2, 4, q.get()), st),
                  agoq::invalid_argument);
  CHECK(st.elements == 5);
}

TEST_CASE("measure on the device: bad input and empty tensors") {
  cuda_executor const ex{cudaStream_t{}};
  std::vector<element> host_data(8);
  CHECK_THROWS_AS(measure(ex, matrix_view<element const>(host_data.data(), 2, 4), int4_g128),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(measure(ex, matrix_view<element const>(nullptr, 2, 4), int4_g128),
                  agoq::invalid_argument);
  device_bytes d(64);
  auto const* dx = reinterpret_cast<element const*>(d.get());
  CHECK_THROWS_AS(measure(ex, matrix_view<element const>(dx, 2, 4), tile_shape{0, 4}),
                  agoq::invalid_argument);
  tensor_stats const st = measure(ex, matrix_view<element const>(dx, 0, 4), int4_g128);
  CHECK(st.elements == 0);
  CHECK(st.sum_squares == 0);
}

}  // namespace statistics_device_test
