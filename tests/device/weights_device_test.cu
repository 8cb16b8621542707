// The device tier of the weight quantization helpers (optim/weights.cuh) against the host ones
// (optim/weights.hpp): codes, scales and fake-quantized weights bit for bit, non-finite counts,
// the straight-through copy and the argument checks. Built once per element type
// (AGOQ_TEST_ELEMENT).
#include "device_support.cuh"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <agoq/optim/weights.cuh>

// The suite's names, apart from the other suites of tests/device/device_tests.cu.
namespace weights_device_test {

using namespace agoq;
using namespace agoq::optim;
using agoq::test::device_bytes;

using element = AGOQ_TEST_ELEMENT;

namespace {

std::vector<weight_format> formats() {
  std::vector<weight_format> out;
  for (weight_grouping const g : {weight_grouping::per_channel, weight_grouping::per_block})
    for (int bits : {8, 4})
      for (rounding_kind const r : {rounding_kind::nearest, rounding_kind::stochastic})
        out.push_back({g, bits, r, bits == 4 ? scale_format::bf16 : scale_format::f32});
  return out;
}

}  // namespace

TEST_CASE("weight quantization on the device equals the host's, bit for bit") {
  cuda_executor const ex{cudaStream_t{}};
  quantize_options const opt{0xfeedULL, 31};
  std::uint64_t seed = 5;
  for (auto const& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 7}, {300, 200}, {257, 129}, {128, 384}}) {
    std::vector<element> const w = agoq::test::random_input<element>(rows * cols, seed++, true);
    std::size_t const wbytes = w.size() * sizeof(element);
    device_bytes dw(wbytes);
    dw.upload(w.data(), wbytes);
    matrix_view<element const> const hw(w.data(), rows, cols);
    matrix_view<element const> const dv(reinterpret_cast<element const*>(dw.get()), rows, cols);
    for (weight_format const& f : formats()) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(f.to_spec().name());
      std::int64_t host_bad = -1;
      quantized_tensor const hq = quantize_weights(agoq::host, hw, f, opt, &host_bad);
      device_bytes dq(static_cast<std::size_t>(hq.bytes()) + 1);
      device_bytes dbad(sizeof(std::int64_t));
      quantized_view const q = view_of_buffer(f.to_spec(), rows, cols, dq.get());
      quantize_weights_async(ex, dv, f, q, opt, reinterpret_cast<std::int64_t*>(dbad.get()));
      std::int64_t dev_bad = -1;
      dbad.download(&dev_bad, sizeof dev_bad);
      CHECK(dev_bad == host_bad);
      auto const d = agoq::test::download(q);
      auto const h = agoq::test::host_sections(hq.view());
      CHECK(agoq::test::first_difference(d.codes, h.codes) == -1);
      CHECK(agoq::test::first_difference(d.scales, h.scales) == -1);

      // Fake quantization, out of place and in place.
      std::vector<element> host_fake(w.size());
      fake_quantize_weights(agoq::host, f, hw, matrix_view<element>(host_fake.data(), rows, cols),
                            opt);
      device_bytes dout(wbytes);
      fake_quantize_weights_async(
          ex, f, dv, matrix_view<element>(reinterpret_cast<element*>(dout.get()), rows, cols), opt);
      std::vector<element> dev_fake(w.size());
      dout.download(dev_fake.data(), wbytes);
      CHECK(std::memcmp(dev_fake.data(), host_fake.data(), wbytes) == 0);
      device_bytes inplace(wbytes);
      inplace.upload(w.data(), wbytes);
      auto* ip = reinterpret_cast<element*>(inplace.get());
      fake_quantize_weights_async(ex, f, matrix_view<element const>(ip, rows, cols),
                                  matrix_view<element>(ip, rows, cols), opt);
      inplace.download(dev_fake.data(), wbytes);
      CHECK(std::memcmp(dev_fake.data(), host_fake.data(), wbytes) == 0);
    }
  }
}

TEST_CASE("straight_through_async and bad arguments") {
  cuda_executor const ex{cudaStream_t{}};
  std::int64_t const rows = 33, cols = 65;
  std::vector<element> const g = agoq::test::random_input<element>(rows * cols, 77, false);
  std::size_t const bytes = g.size() * sizeof(element);
  device_bytes a(bytes), b(bytes + 2 * sizeof(element));
  a.upload(g.data(), bytes);
  auto* pa = reinterpret_cast<element*>(a.get());
  auto* pb = reinterpret_cast<element*>(b.get());
  straight_through_async(ex, matrix_view<element const>(pa, rows, cols),
                         matrix_view<element>(pb, rows, cols));
  std::vector<element> back(g.size());
  b.download(back.data(), bytes);
  CHECK(std::memcmp(back.data(), g.data(), bytes) == 0);
  // The same buffer: nothing to do.
  straight_through_async(ex, matrix_view<element const>(pa, rows, cols),
                         matrix_view<element>(pa, rows, cols));
  a.download(back.data(), bytes);
  CHECK(std::memcmp(back.data(), g.data(), bytes) == 0);
  // Partial overlap, mismatched extents, host memory, a null pointer.
  CHECK_THROWS_AS(straight_through_async(ex, matrix_view<element const>(pb, rows, cols),
                                         matrix_view<element>(pb + 1, rows, cols)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(straight_through_async(ex, matrix_view<element const>(pa, rows, cols),
                                         matrix_view<element>(pb, cols, rows)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(straight_through_async(ex, matrix_view<element const>(g.data(), rows, cols),
                                         matrix_view<element>(pb, rows, cols)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(straight_through_async(ex, matrix_view<element const>(nullptr, rows, cols),
                                         matrix_view<element>(pb, rows, cols)),
                  agoq::invalid_argument);
  // A view whose spec is not the format's, and an unsupported bit width.
  weight_format const f{weight_grouping::per_channel, 8};
  spec const other = spec::parse("int8_g128_sym_rne_f32");
  device_bytes dq(static_cast<std::size_t>(make_layout(other, rows, cols).total_bytes));
  CHECK_THROWS_AS(quantize_weights_async(ex, matrix_view<element const>(pa, rows, cols), f,
                                         view_of_buffer(other, rows, cols, dq.get())),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(quantize_weights_async(ex, matrix_view<element const>(pa, rows, cols),
                                         weight_format{weight_grouping::per_block, 2},
                                         view_of_buffer(other, rows, cols, dq.get())),
                  agoq::invalid_argument);
}

}  // namespace weights_device_test
