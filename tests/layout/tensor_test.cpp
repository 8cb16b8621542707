#include <agoq/layout/tensor.hpp>

#include <cstdint>
#include <utility>

#include <doctest/doctest.h>

using namespace agoq;

TEST_CASE("quantized_tensor owns an aligned, zeroed buffer") {
  quantized_tensor t(spec::parse("int8_g32_asym_rne_bf16"), 3, 70);
  CHECK(t.bytes() == t.layout().total_bytes);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % section_alignment == 0);
  for (std::int64_t i = 0; i < t.bytes(); ++i) REQUIRE(t.data()[i] == 0);
  quantized_view const v = t.view();
  CHECK(v.rows == 3);
  CHECK(v.cols == 70);
  CHECK(v.zero_points == t.data() + t.layout().zero_points_offset);
  CHECK(reinterpret_cast<std::uintptr_t>(v.scales) % section_alignment == 0);
}

TEST_CASE("quantized_tensor moves and clones") {
  quantized_tensor a(spec::parse("int4_row_sym_rne_f32"), 2, 5);
  a.data()[0] = 0x5a;
  quantized_tensor b = a.clone();
  CHECK(b.data() != a.data());
  CHECK(b.data()[0] == 0x5a);
  quantized_tensor c = std::move(a);
  CHECK(c.data()[0] == 0x5a);
  CHECK(c.spec() == b.spec());
  quantized_tensor empty;
  CHECK(empty.bytes() == 0);
  CHECK(empty.data() == nullptr);
  CHECK_NOTHROW(empty.view().validate());
}

TEST_CASE("quantized_tensor rejects invalid specs and extents") {
  spec bad;
  bad.group_cols = 0;
  CHECK_THROWS_AS(quantized_tensor(bad, 2, 2), agoq::invalid_argument);
  CHECK_THROWS_AS(quantized_tensor(spec{}, 2, -2), agoq::invalid_argument);
}
