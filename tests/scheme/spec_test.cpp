#include <agoq/scheme/spec.hpp>

#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace agoq;

TEST_CASE("spec names round-trip") {
  std::vector<std::string> const names = {"int4_g128_sym_rne_f32",  "int8_row_sym_sr_bf16",
                                          "int2_col_asym_rne_e8m0", "int8_tensor_asym_sr_f32",
                                          "fp8e4m3_g32_rne_e8m0",   "fp8e5m2_b128x128_sr_bf16",
                                          "int4_g7_asym_rne_f32",   "int8_b3x5_sym_rne_f32"};
  for (auto const& n : names) {
    INFO(n);
    CHECK(spec::parse(n).name() == n);
  }
}

TEST_CASE("spec fields from a name") {
  spec const s = spec::parse("int4_g128_asym_sr_bf16");
  CHECK(s.code == code_kind::uint_asym);
  CHECK(s.bits == 4);
  CHECK(s.grouping == grouping_kind::group);
  CHECK(s.group_cols == 128);
  CHECK(s.rounding == rounding_kind::stochastic);
  CHECK(s.scale == scale_format::bf16);
  CHECK(s.has_zero_point());
  spec const b = spec::parse("int8_b64x32_sym_rne_f32");
  CHECK(b.grouping == grouping_kind::block);
  CHECK(b.group_rows == 64);
  CHECK(b.group_cols == 32);
  CHECK(b.tile(1000, 1000) == tile_shape{64, 32});
  CHECK(spec::parse("int8_tensor_sym_rne_f32").tile(3, 5) == tile_shape{3, 5});
  CHECK(spec::parse("int8_row_sym_rne_f32").tile(3, 5) == tile_shape{1, 5});
  CHECK(spec::parse("int8_col_sym_rne_f32").tile(3, 5) == tile_shape{3, 1});
}

TEST_CASE("MX aliases are ordinary schemes") {
  CHECK(spec::parse("mxfp8").name() == "fp8e4m3_g32_rne_e8m0");
  CHECK(spec::parse("mxfp8e4m3").name() == "fp8e4m3_g32_rne_e8m0");
  CHECK(spec::parse("mxfp8e5m2").name() == "fp8e5m2_g32_rne_e8m0");
  CHECK(spec::parse("mxint8").name() == "int8_g32_sym_rne_e8m0");
}

TEST_CASE("malformed names throw naming the problem") {
  auto throws_with = [](std::string const& name, std::string const& needle) {
    INFO(name);
    CHECK_THROWS_WITH_AS(spec::parse(name), doctest::Contains(needle.c_str()),
                         agoq::invalid_argument);
  };
  throws_with("", "expected");
  throws_with("int4", "expected");
  throws_with("int3_g128_sym_rne_f32", "2, 4 or 8 bits");
  throws_with("int4_g0_sym_rne_f32", "group size must be at least 1");
  throws_with("int4_g-3_sym_rne_f32", "group size must be at least 1");
  throws_with("int4_gx_sym_rne_f32", "bad group size");
  throws_with("int4_b0x4_sym_rne_f32", "block extents");
  throws_with("int4_g128_sign_rne_f32", "'sym' or 'asym'");
  throws_with("int4_g128_rne_f32", "5 fields");
  throws_with("fp8e4m3_g32_sym_rne_e8m0", "4 fields");
  throws_with("fp9_g32_rne_e8m0", "unknown code");
  throws_with("int4_blocks_sym_rne_f32", "unknown grouping");
  throws_with("int4_g128_sym_up_f32", "unknown rounding");
  throws_with("int4_g128_sym_rne_f64", "unknown scale format");
  throws_with("intx_g128_sym_rne_f32", "bad bit width");
}

TEST_CASE("validate rejects out-of-range fields") {
  spec s;
  s.bits = 5;
  CHECK_THROWS_AS(s.validate(), agoq::invalid_argument);
  s = spec{};
  s.code = code_kind::fp8_e4m3;
  s.bits = 4;
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("fp8 codes have 8 bits"),
                       agoq::invalid_argument);
  s = spec{};
  s.group_cols = 0;
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("group size"), agoq::invalid_argument);
  s = spec{};
  s.scale = static_cast<scale_format>(9);
  CHECK_THROWS_WITH_AS(s.name(), doctest::Contains("scale format"), agoq::invalid_argument);
}
