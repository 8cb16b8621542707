// The driver's index arithmetic: chunks cover every element exactly once, start packed codes on
// byte boundaries, and name the right groups.
#include <agoq/detail/host/engine.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;
using agoq::detail::host::chunk_at;
using agoq::detail::host::chunk_columns;
using agoq::detail::host::chunk_count;

TEST_CASE("chunks cover every element exactly once and stay group-aligned") {
  std::vector<std::string> const specs = {
      "int4_g128_sym_rne_f32",     "int2_g7_sym_rne_f32",     "int8_row_sym_rne_f32",
      "int4_col_asym_rne_f32",     "int2_tensor_sym_rne_f32", "int4_b3x5_sym_rne_f32",
      "int4_b128x128_sym_rne_f32", "int8_g1_sym_rne_f32",     "int4_g5000_sym_rne_f32"};
  std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
      {1, 1}, {1, 7}, {3, 5}, {7, 300}, {2, 4097}, {130, 129}, {1, 20011}, {5, 8192}, {1, 12001}};
  for (auto const& name : specs) {
    spec const s = spec::parse(name);
    for (auto [rows, cols] : shapes) {
      INFO(name << " " << rows << "x" << cols);
      quantized_layout const l = make_layout(s, rows, cols);
      std::vector<int> hits(static_cast<std::size_t>(rows * cols), 0);
      std::vector<int> group_hits(static_cast<std::size_t>(l.groups()), 0);
      for (std::int64_t u = 0; u < chunk_count(l); ++u) {
        auto const [r0, r1, c0, c1, g0] = chunk_at(l, u);
        REQUIRE(r0 % l.tile.rows == 0);
        REQUIRE(c0 % l.tile.cols == 0);
        REQUIRE((c0 * l.bits) % 8 == 0);  // packed codes of a chunk start on a byte
        REQUIRE(g0 == l.group_of(r0, c0));
        for (std::int64_t c = c0; c < c1; c += l.tile.cols) ++group_hits[l.group_of(r0, c)];
        for (std::int64_t r = r0; r < r1; ++r) {
          for (std::int64_t c = c0; c < c1; ++c) ++hits[static_cast<std::size_t>(r * cols + c)];
        }
      }
      for (int h : hits) REQUIRE(h == 1);
      for (int h : group_hits) REQUIRE(h == 1);
    }
  }
}

TEST_CASE("chunk width is whole tiles, about 4096 columns, a multiple of 8 when split") {
  for (std::int64_t g : {1, 3, 5, 7, 32, 100, 128, 4095, 5000}) {
    for (std::int64_t cols : {1, 100, 4096, 9000, 50001}) {
      std::int64_t const w = chunk_columns(tile_shape{1, g}, cols);
      if (w >= cols) continue;  // one chunk per row
      REQUIRE(w % g == 0);
      REQUIRE(w % 8 == 0);
    }
  }
  CHECK(chunk_columns(tile_shape{1, 128}, 1 << 20) == 4096);
  CHECK(chunk_columns(tile_shape{1, 300}, 100) == 100);
}

TEST_CASE("pack and unpack are inverse and lay codes out LSB first") {
  using agoq::detail::host::pack_codes;
  using agoq::detail::host::unpack_codes;
  std::uint8_t const q4[5] = {0x1, 0x2, 0x3, 0xf, 0x8};
  std::uint8_t out4[3] = {0xaa, 0xaa, 0xaa};
  pack_codes(q4, 5, 4, out4);
  CHECK(out4[0] == 0x21);
  CHECK(out4[1] == 0xf3);
  CHECK(out4[2] == 0x08);  // unused high bits are zero
  std::uint8_t const q2[6] = {0x1, 0x2, 0x3, 0x0, 0x3, 0x1};
  std::uint8_t out2[2] = {0xaa, 0xaa};
  pack_codes(q2, 6, 2, out2);
  CHECK(out2[0] == 0x39);  // 01 | 10<<2 | 11<<4 | 00<<6
  CHECK(out2[1] == 0x07);  // 11 | 01<<2
  std::mt19937 gen(3);
  for (int bits : {2, 4, 8}) {
    for (std::int64_t n : {1, 2, 3, 5, 63, 64, 65, 200}) {
      std::vector<std::uint8_t> q(static_cast<std::size_t>(n));
      for (auto& v : q) v = static_cast<std::uint8_t>(gen() & numeric::code_mask(bits));
      std::vector<std::uint8_t> packed(static_cast<std::size_t>((n * bits + 7) / 8));
      std::vector<std::uint8_t> back(q.size());
      pack_codes(q.data(), n, bits, packed.data());
      unpack_codes(packed.data(), n, bits, back.data());
      REQUIRE(back == q);
    }
  }
}
