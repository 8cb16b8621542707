#include <agoq/layout/layout.hpp>
#include <agoq/layout/view.hpp>

#include <doctest/doctest.h>

using namespace agoq;

TEST_CASE("layout of int4 g128 with a ragged row") {
  quantized_layout const l = make_layout(spec::parse("int4_g128_sym_rne_f32"), 3, 300);
  CHECK(l.tile == tile_shape{1, 128});
  CHECK(l.group_grid_rows == 3);
  CHECK(l.group_grid_cols == 3);  // 128 + 128 + 44
  CHECK(l.groups() == 9);
  CHECK(l.code_row_bytes == 150);
  CHECK(l.codes_bytes == 450);
  CHECK(l.scales_offset == 512);
  CHECK(l.scales_bytes == 36);
  CHECK(l.zero_points_bytes == 0);
  CHECK(l.total_bytes == 548);
  CHECK(l.group_of(2, 299) == 8);
  CHECK(l.group_of(1, 128) == 4);
}

TEST_CASE("layout of odd rows with 2-bit asymmetric codes and blocks") {
  quantized_layout const l = make_layout(spec::parse("int2_b2x3_asym_rne_bf16"), 5, 7);
  CHECK(l.code_row_bytes == 2);  // 14 bits
  CHECK(l.codes_bytes == 10);
  CHECK(l.group_grid_rows == 3);
  CHECK(l.group_grid_cols == 3);
  CHECK(l.scales_offset == 128);
  CHECK(l.scales_bytes == 18);
  CHECK(l.zero_points_offset == 256);
  CHECK(l.zero_points_bytes == 9);
  CHECK(l.total_bytes == 265);
  CHECK(l.group_of(4, 6) == 8);
}

TEST_CASE("per-tensor, per-row and per-column grids") {
  CHECK(make_layout(spec::parse("int8_tensor_sym_rne_f32"), 7, 9).groups() == 1);
  CHECK(make_layout(spec::parse("int8_row_sym_rne_f32"), 7, 9).groups() == 7);
  CHECK(make_layout(spec::parse("int8_col_sym_rne_e8m0"), 7, 9).groups() == 9);
  CHECK(make_layout(spec::parse("int8_col_sym_rne_e8m0"), 7, 9).scales_bytes == 9);
}

TEST_CASE("empty tensors have no codes and no groups") {
  for (auto [r, c] : {std::pair{0, 5}, std::pair{5, 0}, std::pair{0, 0}}) {
    quantized_layout const l = make_layout(spec::parse("int4_g32_asym_rne_f32"), r, c);
    CHECK(l.groups() == 0);
    CHECK(l.codes_bytes == 0);
    CHECK(l.total_bytes == 0);
  }
  CHECK_THROWS_WITH_AS(make_layout(spec{}, -1, 4), doctest::Contains("non-negative"),
                       agoq::invalid_argument);
}

TEST_CASE("sizes beyond 2^31 elements use 64-bit arithmetic") {
  std::int64_t const rows = 1 << 20, cols = (std::int64_t{1} << 12) + 3;  // 2^32 + ... elements
  quantized_layout const l = make_layout(spec::parse("int4_g128_sym_rne_bf16"), rows, cols);
  CHECK(l.elements() == rows * cols);
  CHECK(l.code_row_bytes == 2050);
  CHECK(l.codes_bytes == rows * 2050);
  CHECK(l.groups() == rows * 33);
  CHECK(l.scales_offset % section_alignment == 0);
}

TEST_CASE("views over one buffer and their validation") {
  spec const s = spec::parse("int4_g4_asym_rne_f32");
  quantized_layout const l = make_layout(s, 2, 6);
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(l.total_bytes));
  quantized_view const v = view_of_buffer(s, 2, 6, buf.data());
  CHECK(v.codes == buf.data());
  CHECK(v.scales == buf.data() + l.scales_offset);
  CHECK(v.zero_points == buf.data() + l.zero_points_offset);
  CHECK_NOTHROW(v.validate());
  const_quantized_view const cv = v;
  CHECK(cv.scales == v.scales);
  quantized_view bad = v;
  bad.zero_points = nullptr;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("zero points"), agoq::invalid_argument);
  bad = v;
  bad.codes = nullptr;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("null codes"), agoq::invalid_argument);
  bad = v;
  bad.scales = nullptr;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("null scales"), agoq::invalid_argument);
  quantized_view empty{s, 0, 6, nullptr, nullptr, nullptr};
  CHECK_NOTHROW(empty.validate());
}

TEST_CASE("extents past 2^59 elements are refused, not wrapped") {
  spec const s = spec::parse("int8_g128_sym_rne_f32");
  std::int64_t const big = std::int64_t{1} << 59;
  quantized_layout const l = make_layout(s, 1, big);  // the limit itself: sizes under 2^62
  CHECK(l.codes_bytes == big);
  CHECK(l.total_bytes == agoq::detail::align_up(big, section_alignment) + big / 128 * 4);
  CHECK_THROWS_WITH_AS(make_layout(s, 1, big + 1), doctest::Contains("too large"),
                       agoq::invalid_argument);
  CHECK_THROWS_AS(make_layout(s, std::int64_t{1} << 32, std::int64_t{1} << 32),
                  agoq::invalid_argument);  // 2^64 elements: rows * cols would wrap to 0
  CHECK_THROWS_AS(make_layout(s, 3, std::int64_t{1} << 62), agoq::invalid_argument);
  // One byte a scale at most 6 bytes an element: a group of one with asymmetric codes.
  quantized_layout const a = make_layout(spec::parse("int8_g1_asym_rne_f32"), big / 8, 8);
  CHECK(a.total_bytes <= agoq::max_size_count);
  CHECK(a.total_bytes == 6 * big + 0);
}
