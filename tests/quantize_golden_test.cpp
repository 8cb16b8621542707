// Hand-derived golden vectors of the format contract (DESIGN §4, docs/formats.md).
//
// Every expected byte below was worked out by hand from the formulas, not computed by the
// library: inputs are chosen so that scales are exact (powers of two wherever a tie must be
// exact), codes are written as packed bytes, scales as their little-endian storage bytes, and the
// dequantized values as floats compared bit for bit. docs/formats.md uses the same numbers in its
// worked examples. Each vector runs through both host loops (portable and, where compiled,
// AVX-512), through quantize + dequantize and through fake_quantize, and, where its values are
// exact in half and bfloat16, from and to those element types as well.
#include <doctest/doctest.h>

#include <agoq/agoq.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

// The vectors below name only the fields they need in designated initializers; the others keep
// their default member initializers, which is what the struct is designed for. GCC's
// -Wmissing-field-initializers still reports each omitted field, so it is silenced for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

namespace {

using bytes = std::vector<std::uint8_t>;

constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();
constexpr float infinity = std::numeric_limits<float>::infinity();

/// A seed whose two key words differ, for the stochastic-rounding vectors.
constexpr std::uint64_t sr_seed = 0x0123456789abcdefull;

/// One golden vector: a spec, an input, and every byte quantize must write.
struct golden {
  std::string spec;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<float> in;
  bytes codes;             ///< the code section, packed, byte for byte
  bytes scales;            ///< the stored scales, little-endian
  bytes zero_points;       ///< asymmetric codes only
  std::vector<float> out;  ///< dequantized values, compared bit for bit
  std::int64_t nonfinite = 0;
  std::int64_t scales_offset = 128;
  std::int64_t zero_points_offset = 256;  ///< asymmetric codes only
  agoq::quantize_options opt{};
  bool narrow = false;  ///< `in` and `out` are exact in half and bfloat16
};

std::string hex(std::uint8_t const* p, std::size_t n) {
  std::string s;
  char buf[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x ", static_cast<unsigned>(p[i]));
    s += buf;
  }
  return s;
}

std::string hex(bytes const& b) { return hex(b.data(), b.size()); }

/// Float bit patterns (so -0 differs from +0 and NaN from everything).
std::string hex(std::vector<float> const& v) {
  std::string s;
  char buf[12];
  for (float const x : v) {
    std::snprintf(buf, sizeof buf, "%08x ", static_cast<unsigned>(std::bit_cast<std::uint32_t>(x)));
    s += buf;
  }
  return s;
}

template <class T>
std::vector<T> convert(std::vector<float> const& v) {
  std::vector<T> r;
  for (float const x : v) r.push_back(agoq::numeric::from_float<T>(x));
  return r;
}

template <class T>
std::vector<float> widen(std::vector<T> const& v) {
  std::vector<float> r;
  for (T const x : v) r.push_back(agoq::numeric::to_float(x));
  return r;
}

/// The whole buffer quantize must leave: the sections at their offsets, zeros in the padding.
bytes expected_buffer(golden const& g, std::int64_t total) {
  bytes b(static_cast<std::size_t>(total), 0);
  std::copy(g.codes.begin(), g.codes.end(), b.begin());
  std::copy(g.scales.begin(), g.scales.end(), b.begin() + g.scales_offset);
  std::copy(g.zero_points.begin(), g.zero_points.end(), b.begin() + g.zero_points_offset);
  return b;
}

template <class In, class Out>
void run(golden const& g, agoq::host_executor ex) {
  INFO("input ", std::string(agoq::element_name<In>()), ", output ",
       std::string(agoq::element_name<Out>()), ", simd ", ex.simd);
  agoq::spec const s = agoq::spec::parse(g.spec);
  std::vector<In> const in = convert<In>(g.in);
  agoq::matrix_view<In const> const in_view(in.data(), g.rows, g.cols);

  agoq::quantized_tensor q(s, g.rows, g.cols);
  CHECK(agoq::quantize(ex, in_view, q.view(), g.opt) == g.nonfinite);
  agoq::const_quantized_view const v = std::as_const(q).view();
  CHECK(hex(v.codes, g.codes.size()) == hex(g.codes));
  CHECK(hex(v.scales, g.scales.size()) == hex(g.scales));
  if (s.has_zero_point()) {
    CHECK(hex(v.zero_points, g.zero_points.size()) == hex(g.zero_points));
  } else {
    CHECK(v.zero_points == nullptr);
  }
  CHECK(hex(q.data(), static_cast<std::size_t>(q.bytes())) == hex(expected_buffer(g, q.bytes())));

  // Quantizing over stale bytes writes the same sections: pad bits are written as zeros, not
  // merged with what was there.
  agoq::quantized_tensor stale(s, g.rows, g.cols);
  std::fill(stale.data(), stale.data() + stale.bytes(), std::uint8_t{0xa5});
  CHECK(agoq::quantize(ex, in_view, stale.view(), g.opt) == g.nonfinite);
  CHECK(hex(stale.data(), g.codes.size()) == hex(g.codes));
  CHECK(hex(stale.data() + g.scales_offset, g.scales.size()) == hex(g.scales));
  if (s.has_zero_point()) {
    CHECK(hex(stale.data() + g.zero_points_offset, g.zero_points.size()) == hex(g.zero_points));
  }

  std::vector<Out> out(g.in.size(), agoq::numeric::from_float<Out>(-1234.0f));
  CHECK(agoq::dequantize(ex, v, agoq::matrix_view<Out>(out.data(), g.rows, g.cols)) == 0);
  CHECK(hex(widen(out)) == hex(g.out));

  std::vector<Out> fake(g.in.size(), agoq::numeric::from_float<Out>(-1234.0f));
  CHECK(agoq::fake_quantize(ex, s, in_view, agoq::matrix_view<Out>(fake.data(), g.rows, g.cols),
                            g.opt) == g.nonfinite);
  CHECK(hex(widen(fake)) == hex(g.out));
}

/// Checks the layout of `g` and runs it through every executor and element type it allows.
void check(golden const& g) {
  INFO("spec ", g.spec, ", ", g.rows, "x", g.cols);
  REQUIRE(g.in.size() == static_cast<std::size_t>(g.rows * g.cols));
  REQUIRE(g.out.size() == g.in.size());
  agoq::spec const s = agoq::spec::parse(g.spec);
  CHECK(s.name() == g.spec);
  agoq::quantized_layout const l = agoq::make_layout(s, g.rows, g.cols);
  CHECK(l.codes_bytes == static_cast<std::int64_t>(g.codes.size()));
  CHECK(l.scales_offset == g.scales_offset);
  CHECK(l.scales_bytes == static_cast<std::int64_t>(g.scales.size()));
  if (s.has_zero_point()) {
    CHECK(l.zero_points_offset == g.zero_points_offset);
    CHECK(l.zero_points_bytes == static_cast<std::int64_t>(g.zero_points.size()));
    CHECK(l.total_bytes == g.zero_points_offset + static_cast<std::int64_t>(g.zero_points.size()));
  } else {
    CHECK(g.zero_points.empty());
    CHECK(l.zero_points_bytes == 0);
    CHECK(l.total_bytes == g.scales_offset + static_cast<std::int64_t>(g.scales.size()));
  }
  for (bool const simd : {false, true}) {
    agoq::host_executor const ex{simd};
    run<float, float>(g, ex);
    if (g.narrow) {
      run<agoq::bfloat16, agoq::bfloat16>(g, ex);
      run<agoq::half, agoq::half>(g, ex);
      run<agoq::bfloat16, float>(g, ex);
      run<float, agoq::half>(g, ex);
    }
  }
}

}  // namespace

TEST_CASE("golden: int4 sym, round-half-to-even ties, odd row length") {
  // absmax 1.75 = 7 * 0.25, so scale = 0.25 and x / scale is exact: 7, -7, 0.5, 1.5, 2.5, -0.5,
  // -1.5, -2.5, 3.5, 4.5, -5.5 -> 7, -7, 0, 2, 2, 0, -2, -2, 4, 4, -6. Nibbles (two's complement)
  // 7 9 0 2 2 0 e e 4 4 a, packed low nibble first; the 12th nibble is zero padding.
  check({.spec = "int4_g128_sym_rne_f32",
         .rows = 1,
         .cols = 11,
         .in = {1.75f, -1.75f, 0.125f, 0.375f, 0.625f, -0.125f, -0.375f, -0.625f, 0.875f, 1.125f,
                -1.375f},
         .codes = {0x97, 0x20, 0x02, 0xee, 0x44, 0x0a},
         .scales = {0x00, 0x00, 0x80, 0x3e},  // 0.25f = 0x3e800000
         .out = {1.75f, -1.75f, 0.0f, 0.5f, 0.5f, 0.0f, -0.5f, -0.5f, 1.0f, 1.0f, -1.5f},
         .narrow = true});
}

TEST_CASE("golden: int4 sym per row, bf16 scales rounded up, rows start on a byte") {
  // Row 0: absmax 7 -> scale 1 (bf16 0x3f80). Row 1: all zero -> scale 0, codes 0.
  // Row 2: absmax 1 -> 1/7 = 0x3e124925 in fp32, rounded up to bf16 0x3e13 = 0.1435546875;
  // 1 / s = 6.966 -> 7, -0.5 / s = -3.483 -> -3, 0.25 / s = 1.741 -> 2.
  // 3 codes of 4 bits take 2 bytes per row; the high nibble of each row's last byte is zero.
  check(
      {.spec = "int4_row_sym_rne_bf16",
       .rows = 3,
       .cols = 3,
       .in = {7.0f, 1.0f, -3.0f, 0.0f, 0.0f, 0.0f, 1.0f, -0.5f, 0.25f},
       .codes = {0x17, 0x0d, 0x00, 0x00, 0xd7, 0x02},
       .scales = {0x80, 0x3f, 0x00, 0x00, 0x13, 0x3e},
       .out = {7.0f, 1.0f, -3.0f, 0.0f, 0.0f, 0.0f, 1.0048828125f, -0.4306640625f, 0.287109375f}});
}

TEST_CASE("golden: int2 sym (ternary) per tensor, 2-bit packing of odd rows") {
  // absmax 2 = 1 * 2 -> scale 2; x / 2 = 1, -1, 0.5, -0.5, 0.75 | -0.75, 0.25, 0, -1, 1
  // -> 1, -1, 0, 0, 1 | -1, 0, 0, -1, 1; 2-bit fields 01 11 00 00 01 | 11 00 00 11 01, packed
  // from the least significant bits; each 5-code row takes 2 bytes (6 pad bits zero).
  check({.spec = "int2_tensor_sym_rne_f32",
         .rows = 2,
         .cols = 5,
         .in = {2.0f, -2.0f, 1.0f, -1.0f, 1.5f, -1.5f, 0.5f, 0.0f, -2.0f, 2.0f},
         .codes = {0x0d, 0x01, 0xc3, 0x01},
         .scales = {0x00, 0x00, 0x00, 0x40},
         .out = {2.0f, -2.0f, 0.0f, 0.0f, 2.0f, -2.0f, 0.0f, 0.0f, -2.0f, 2.0f},
         .narrow = true});
}

TEST_CASE("golden: int8 sym per column") {
  // Column 0: absmax 127 -> scale 1; 127, -63.5 -> -64 (tie to even), 0.5 -> 0.
  // Column 1: absmax 31.75 = 127 * 0.25 -> scale 0.25; -1, 0.5 -> 0, 127.
  check({.spec = "int8_col_sym_rne_f32",
         .rows = 3,
         .cols = 2,
         .in = {127.0f, -0.25f, -63.5f, 0.125f, 0.5f, 31.75f},
         .codes = {0x7f, 0xff, 0xc0, 0x00, 0x00, 0x7f},
         .scales = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3e},
         .out = {127.0f, -0.25f, -64.0f, 0.0f, 0.0f, 31.75f},
         .narrow = true});
}

TEST_CASE("golden: int4 sym g4, ragged tail, e8m0 scales rounded up to a power of two") {
  // Groups of a row: [0, 4) and the 2-element tail [4, 6); group grid 2x2, row-major.
  // (0,0): absmax 3.5 -> 0.5 exactly = 2^-1, byte 126; 7, -2, 1.5 -> 2, 0.5 -> 0.
  // (0,1): absmax 1 -> 1/7 rounds up to 0.25 = 2^-2, byte 125; 4, -1.25 -> -1.
  // (1,0): all zero -> byte 0, codes 0.  (1,1): absmax 4.5 -> 0.643 -> 1, byte 127;
  // -4.5 -> -4, 2.5 -> 2. Rows of 6 nibbles take 3 bytes.
  check({.spec = "int4_g4_sym_rne_e8m0",
         .rows = 2,
         .cols = 6,
         .in = {3.5f, -1.0f, 0.75f, 0.25f, 1.0f, -0.3125f, 0.0f, 0.0f, 0.0f, 0.0f, -4.5f, 2.5f},
         .codes = {0xe7, 0x02, 0xf4, 0x00, 0x00, 0x2c},
         .scales = {0x7e, 0x7d, 0x00, 0x7f},
         .out = {3.5f, -1.0f, 1.0f, 0.0f, 1.0f, -0.25f, 0.0f, 0.0f, 0.0f, 0.0f, -4.0f, 2.0f},
         .narrow = true});
}

TEST_CASE("golden: int8 sym 2x3 blocks clipped at the edges, a constant block") {
  // A 3x4 tensor in 2x3 blocks: grid 2x2 = {rows 0-1, cols 0-2}, {rows 0-1, col 3},
  // {row 2, cols 0-2}, {row 2, col 3}.
  // Block 0: absmax 63.5 -> scale 0.5: 127, -0.5 -> 0, 2.5 -> 2, -63.5 -> -64, 1.5 -> 2, 0.
  // Block 1: absmax 254 -> scale 2: 127, -0.5 -> 0.
  // Block 2: constant 3 -> scale 3/127 = 0x3cc18306; 3 / s rounds to 127, 127 * s = 3 exactly.
  // Block 3: one element, -15.875 = -127 * 0.125 -> scale 0.125, code -127 = 0x81.
  check({.spec = "int8_b2x3_sym_rne_f32",
         .rows = 3,
         .cols = 4,
         .in = {63.5f, -0.25f, 1.25f, 254.0f, -31.75f, 0.75f, 0.0f, -1.0f, 3.0f, 3.0f, 3.0f,
                -15.875f},
         .codes = {0x7f, 0x00, 0x02, 0x7f, 0xc0, 0x02, 0x00, 0x00, 0x7f, 0x7f, 0x7f, 0x81},
         .scales = {0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x06, 0x83, 0xc1, 0x3c, 0x00,
                    0x00, 0x00, 0x3e},
         .out = {63.5f, 0.0f, 1.0f, 254.0f, -32.0f, 1.0f, 0.0f, 0.0f, 3.0f, 3.0f, 3.0f, -15.875f},
         .narrow = true});
}

TEST_CASE("golden: int4 asym g8, zero points, a tie in the zero point, ragged tail") {
  // Group 0: lo -1, hi 2.75, scale 3.75 / 15 = 0.25, z = rne(4) = 4; x / s = -4, 11, 0, 0.5,
  // 1.5, -2.5, 4.5, 10.5 -> q = 0, 15, 4, 4, 6, 2, 8, 14.
  // Group 1 (5 elements): lo -0.625, hi 3.125, scale 0.25, z = rne(2.5) = 2 (not 3); x / s =
  // -2.5 -> -2 -> 0, 12.5 -> 12 -> 14, 0 -> 2, 4.5 -> 4 -> 6, -0.5 -> -0 -> 2.
  // 13 nibbles take 7 bytes; zero points sit at the next 128-byte boundary after the scales.
  check({.spec = "int4_g8_asym_rne_f32",
         .rows = 1,
         .cols = 13,
         .in = {-1.0f, 2.75f, 0.0f, 0.125f, 0.375f, -0.625f, 1.125f, 2.625f, -0.625f, 3.125f, 0.0f,
                1.125f, -0.125f},
         .codes = {0xf0, 0x44, 0x26, 0xe8, 0xe0, 0x62, 0x02},
         .scales = {0x00, 0x00, 0x80, 0x3e, 0x00, 0x00, 0x80, 0x3e},
         .zero_points = {0x04, 0x02},
         .out = {-1.0f, 2.75f, 0.0f, 0.0f, 0.5f, -0.5f, 1.0f, 2.5f, -0.5f, 3.0f, 0.0f, 1.0f, 0.0f},
         .narrow = true});
}

TEST_CASE("golden: int8 asym per row, one-signed rows, a constant row, bf16 scales") {
  // Row 0 (all >= 0): lo widened to 0, scale 15.9375 / 255 = 0.0625, z = 0; 255, 16, 0.5 -> 0.
  // Row 1 (all <= 0): hi widened to 0, scale 127.5 / 255 = 0.5, z = 255; x / s = -255,
  // -2.5 -> -2, -128.5 -> -128 -> q = 0, 253, 127.
  // Row 2 (constant 5): scale 5 / 255 = 0x3ca0a0a1 rounds up to bf16 0x3ca1 = 0.0196533203125,
  // z = 0, 5 / s = 254.41 -> 254, which decodes to 4.991943359375.
  check({.spec = "int8_row_asym_rne_bf16",
         .rows = 3,
         .cols = 3,
         .in = {15.9375f, 1.0f, 0.03125f, -127.5f, -1.25f, -64.25f, 5.0f, 5.0f, 5.0f},
         .codes = {0xff, 0x10, 0x00, 0x00, 0xfd, 0x7f, 0xfe, 0xfe, 0xfe},
         .scales = {0x80, 0x3d, 0x00, 0x3f, 0xa1, 0x3c},
         .zero_points = {0x00, 0xff, 0x00},
         .out = {15.9375f, 1.0f, 0.0f, -127.5f, -1.0f, -64.0f, 4.991943359375f, 4.991943359375f,
                 4.991943359375f}});
}

TEST_CASE("golden: int4 asym per column, an all-zero column") {
  // Column 0: lo -1, hi 2.75 -> scale 0.25, z 4; -1 -> 0, 2.75 -> 15.
  // Column 1: all zero -> scale 0, z 0, codes 0.
  // Column 2: lo widened to 0, hi 3.75 -> scale 0.25, z 0; 7.5 -> 8, 15.
  check({.spec = "int4_col_asym_rne_f32",
         .rows = 2,
         .cols = 3,
         .in = {-1.0f, 0.0f, 1.875f, 2.75f, 0.0f, 3.75f},
         .codes = {0x00, 0x08, 0x0f, 0x0f},
         .scales = {0x00, 0x00, 0x80, 0x3e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3e},
         .zero_points = {0x04, 0x00, 0x00},
         .out = {-1.0f, 0.0f, 2.0f, 2.75f, 0.0f, 3.75f},
         .narrow = true});
}

TEST_CASE("golden: int2 asym g3, e8m0 scales, 2-bit packing") {
  // Group 0: lo -1, hi 2 -> scale 1 (byte 127), z 1; q = 0, 3 (2 + 1), 1 (0.5 -> 0).
  // Group 1: lo -0.75, hi 0.75 -> scale 0.5 (byte 126), z = rne(1.5) = 2; x / s = -1.5 -> -2
  // -> 0, 1.5 clamps to 3 - 2 = 1 -> 3, 0.5 -> 0 -> 2.
  // Group 2 (tail): 0.1 -> lo 0, scale 0.0333 rounds up to 2^-4 (byte 123), z 0; 1.6 -> 2.
  // Codes 0 3 1 0 3 2 2 as 2-bit fields, least significant first: 0x1c 0x2b.
  check({.spec = "int2_g3_asym_rne_e8m0",
         .rows = 1,
         .cols = 7,
         .in = {-1.0f, 2.0f, 0.5f, -0.75f, 0.75f, 0.25f, 0.1f},
         .codes = {0x1c, 0x2b},
         .scales = {0x7f, 0x7e, 0x7b},
         .zero_points = {0x01, 0x02, 0x00},
         .out = {-1.0f, 2.0f, 0.0f, -1.0f, 0.5f, 0.0f, 0.125f}});
}

TEST_CASE("golden: fp8 e4m3 per row, ties, subnormals, signed zero") {
  // Row 0: absmax 448 -> scale 1; row 1 is row 0 / 16: absmax 28 -> scale 0.0625, same codes.
  // 1.0625 is halfway between 1 (0x38) and 1.125: even mantissa -> 0x38; 1.1875 -> 1.25 (0x3a);
  // 2^-10 is half the smallest subnormal 2^-9 -> 0; 3 * 2^-10 -> 2 * 2^-9 (0x02); -2^-10 -> -0
  // (0x80), which decodes to -0.
  float const t = 0.0009765625f;  // 2^-10
  check({.spec = "fp8e4m3_row_rne_bf16",
         .rows = 2,
         .cols = 9,
         .in = {448.0f, -448.0f, 1.0625f, 1.1875f, t, 3.0f * t, -0.5f, 0.0f, -t, 28.0f, -28.0f,
                0.06640625f, 0.07421875f, t / 16.0f, 3.0f * t / 16.0f, -0.03125f, 0.0f, -t / 16.0f},
         .codes = {0x7e, 0xfe, 0x38, 0x3a, 0x00, 0x02, 0xb0, 0x00, 0x80, 0x7e, 0xfe, 0x38, 0x3a,
                   0x00, 0x02, 0xb0, 0x00, 0x80},
         .scales = {0x80, 0x3f, 0x80, 0x3d},
         .out = {448.0f, -448.0f, 1.0f, 1.25f, 0.0f, 0.00390625f, -0.5f, 0.0f, -0.0f, 28.0f, -28.0f,
                 0.0625f, 0.078125f, 0.0f, 0.000244140625f, -0.03125f, 0.0f, -0.0f},
         .narrow = true});
}

TEST_CASE("golden: fp8 e5m2 g4, ties, subnormal, e8m0 scale rounded up") {
  // Group 0: absmax 57344 -> scale 1 (byte 127). 57344 -> 0x7b; -1.125 ties to -1 (0xbc);
  // 1.375 ties to 1.5 (0x3e); 1.5 * 2^-16 is 1.5 subnormal steps -> 2 steps (0x02) = 2^-15.
  // Group 1: 100 / 57344 = 0.00174 rounds up to 2^-9 (byte 118); -100 * 512 = -51200 -> -49152
  // (0xfa), decoded -96; 3 * 512 = 1536 (0x66).
  check({.spec = "fp8e5m2_g4_rne_e8m0",
         .rows = 1,
         .cols = 6,
         .in = {57344.0f, -1.125f, 1.375f, 2.288818359375e-05f, -100.0f, 3.0f},
         .codes = {0x7b, 0xbc, 0x3e, 0x02, 0xfa, 0x66},
         .scales = {0x7f, 0x76},
         .out = {57344.0f, -1.0f, 1.5f, 3.0517578125e-05f, -96.0f, 3.0f},
         .narrow = true});
}

TEST_CASE("golden: NaN and infinities are left out of the statistics and counted") {
  // NaN -> the code of zero, +Inf -> the largest code, -Inf -> the smallest.
  SUBCASE("int4 sym") {
    // Finite absmax 3.5 -> scale 0.5: codes 0, 7, -7, 7, -2, 0.5 -> 0.
    check({.spec = "int4_row_sym_rne_f32",
           .rows = 1,
           .cols = 6,
           .in = {not_a_number, infinity, -infinity, 3.5f, -1.0f, 0.25f},
           .codes = {0x70, 0x79, 0x0e},
           .scales = {0x00, 0x00, 0x00, 0x3f},
           .out = {0.0f, 3.5f, -3.5f, 3.5f, -1.0f, 0.0f},
           .nonfinite = 3,
           .narrow = true});
  }
  SUBCASE("int8 asym") {
    // Finite lo -1, hi 62.75 -> scale 0.25, z 4: NaN -> 4, -Inf -> 0, +Inf -> 255.
    check({.spec = "int8_tensor_asym_rne_f32",
           .rows = 1,
           .cols = 5,
           .in = {not_a_number, -infinity, infinity, -1.0f, 62.75f},
           .codes = {0x04, 0x00, 0xff, 0x00, 0xff},
           .scales = {0x00, 0x00, 0x80, 0x3e},
           .zero_points = {0x04},
           .out = {0.0f, -1.0f, 62.75f, -1.0f, 62.75f},
           .nonfinite = 3,
           .narrow = true});
  }
  SUBCASE("fp8 e4m3") {
    // Finite absmax 896 -> scale 2: NaN -> 0x00, ±Inf saturate to ±448 (0x7e, 0xfe).
    check({.spec = "fp8e4m3_tensor_rne_f32",
           .rows = 1,
           .cols = 4,
           .in = {not_a_number, infinity, -infinity, -896.0f},
           .codes = {0x00, 0x7e, 0xfe, 0xfe},
           .scales = {0x00, 0x00, 0x00, 0x40},
           .out = {0.0f, 896.0f, -896.0f, -896.0f},
           .nonfinite = 3,
           .narrow = true});
  }
  SUBCASE("fp8 e5m2") {
    // Finite absmax 114688 -> scale 2: ±Inf saturate to ±57344 (0x7b, 0xfb).
    check({.spec = "fp8e5m2_tensor_rne_f32",
           .rows = 1,
           .cols = 4,
           .in = {not_a_number, infinity, -infinity, 114688.0f},
           .codes = {0x00, 0x7b, 0xfb, 0x7b},
           .scales = {0x00, 0x00, 0x00, 0x40},
           .out = {0.0f, 114688.0f, -114688.0f, 114688.0f},
           .nonfinite = 3});
  }
}

TEST_CASE("golden: all-non-finite and underflowing groups have scale 0") {
  // Group 0 holds no finite value -> scale 0, and every code of a zero-scale group is 0 (so the
  // +Inf there encodes to 0, not to the largest code). Group 1: absmax 2^-127 / 7 is below
  // 2^-126 -> scale 0. Group 2: absmax 7 -> scale 1.
  float const tiny = 5.877471754111438e-39f;  // 2^-127, a float subnormal
  std::vector<float> const in = {infinity, not_a_number, tiny, -tiny / 2.0f, 7.0f, -7.0f};
  std::vector<float> const out = {0.0f, 0.0f, 0.0f, 0.0f, 7.0f, -7.0f};
  check({.spec = "int4_g2_sym_rne_f32",
         .rows = 1,
         .cols = 6,
         .in = in,
         .codes = {0x00, 0x00, 0x97},
         .scales = {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f},
         .out = out,
         .nonfinite = 2});
  // With e8m0 storage, group 1's scale rounds up to 2^-126 (byte 1), which is representable;
  // 2^-127 / 2^-126 = 0.5 and -0.25 both round to 0.
  check({.spec = "int4_g2_sym_rne_e8m0",
         .rows = 1,
         .cols = 6,
         .in = in,
         .codes = {0x00, 0x00, 0x97},
         .scales = {0x00, 0x01, 0x7f},
         .out = out,
         .nonfinite = 2});
}

TEST_CASE("golden: one-element tensors") {
  SUBCASE("int8 sym") {
    check({.spec = "int8_tensor_sym_rne_f32",
           .rows = 1,
           .cols = 1,
           .in = {-63.5f},
           .codes = {0x81},
           .scales = {0x00, 0x00, 0x00, 0x3f},
           .out = {-63.5f},
           .narrow = true});
  }
  SUBCASE("int4 asym") {
    // lo widened to 0: scale 3 / 15 = 0.2 rounds up to 0.25 (byte 125), z 0, code 12.
    check({.spec = "int4_tensor_asym_rne_e8m0",
           .rows = 1,
           .cols = 1,
           .in = {3.0f},
           .codes = {0x0c},
           .scales = {0x7d},
           .zero_points = {0x00},
           .out = {3.0f},
           .narrow = true});
  }
  SUBCASE("int2 sym") {
    // scale 5 (bf16 0x40a0), code -1 = 0b11 in the low bits, 6 zero pad bits.
    check({.spec = "int2_tensor_sym_rne_bf16",
           .rows = 1,
           .cols = 1,
           .in = {-5.0f},
           .codes = {0x03},
           .scales = {0xa0, 0x40},
           .out = {-5.0f},
           .narrow = true});
  }
  SUBCASE("fp8 e4m3") {
    // 3 / 448 = 0x3bdb6db7 rounds up to bf16 0x3bdc = 0.0067138671875; -3 / s = -446.84 rounds
    // to -448 (0xfe), which decodes to -3.0078125.
    check({.spec = "fp8e4m3_tensor_rne_bf16",
           .rows = 1,
           .cols = 1,
           .in = {-3.0f},
           .codes = {0xfe},
           .scales = {0xdc, 0x3b},
           .out = {-3.0078125f}});
  }
  SUBCASE("zero") {
    check({.spec = "int4_g128_sym_rne_f32",
           .rows = 1,
           .cols = 1,
           .in = {0.0f},
           .codes = {0x00},
           .scales = {0x00, 0x00, 0x00, 0x00},
           .out = {0.0f},
           .narrow = true});
  }
}

TEST_CASE("golden: sections at 128-byte boundaries past the first 128 bytes") {
  // 130 int8 codes: scales at 256, zero points at 384, 386 bytes in all.
  // Group 0 (128): lo -1, hi 254 -> scale 1, z 1; zeros encode to 1, 2.5 -> 2 -> 3,
  // -0.5 -> -0 -> 1. Group 1 (2): lo -15.9375, hi 0 -> scale 0.0625, z 255; -255 -> 0,
  // -127.5 -> -128 -> 127, decoded -8.
  golden g{.spec = "int8_g128_asym_rne_f32",
           .rows = 1,
           .cols = 130,
           .scales = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3d},
           .zero_points = {0x01, 0xff},
           .scales_offset = 256,
           .zero_points_offset = 384,
           .narrow = true};
  g.in.assign(130, 0.0f);
  g.codes.assign(130, 0x01);
  g.out.assign(130, 0.0f);
  g.in[0] = -1.0f, g.codes[0] = 0x00, g.out[0] = -1.0f;
  g.in[1] = 254.0f, g.codes[1] = 0xff, g.out[1] = 254.0f;
  g.in[5] = 2.5f, g.codes[5] = 0x03, g.out[5] = 2.0f;
  g.in[6] = -0.5f, g.codes[6] = 0x01, g.out[6] = 0.0f;
  g.in[128] = -15.9375f, g.codes[128] = 0x00, g.out[128] = -15.9375f;
  g.in[129] = -7.96875f, g.codes[129] = 0x7f, g.out[129] = -8.0f;
  check(g);
}

TEST_CASE("golden: MX aliases") {
  CHECK(agoq::spec::parse("mxfp8") == agoq::spec::parse("fp8e4m3_g32_rne_e8m0"));
  CHECK(agoq::spec::parse("mxfp8e4m3") == agoq::spec::parse("fp8e4m3_g32_rne_e8m0"));
  CHECK(agoq::spec::parse("mxfp8e5m2") == agoq::spec::parse("fp8e5m2_g32_rne_e8m0"));
  CHECK(agoq::spec::parse("mxint8") == agoq::spec::parse("int8_g32_sym_rne_e8m0"));
  CHECK(agoq::mxfp8_e4m3::to_spec() == agoq::spec::parse("mxfp8"));
  CHECK(agoq::mxfp8_e5m2::to_spec() == agoq::spec::parse("mxfp8e5m2"));
  CHECK(agoq::mxint8::to_spec() == agoq::spec::parse("mxint8"));

  SUBCASE("mxfp8") {
    // Group 0: absmax 56 = 448 / 8 -> 2^-3 (byte 124); 56 -> 448 (0x7e), -0.5 -> -4 (0xc8).
    // Group 1: 1 / 448 rounds up to 2^-8 (byte 119); ±1 -> ±256 (0x78, 0xf8).
    golden g{.spec = "fp8e4m3_g32_rne_e8m0",
             .rows = 1,
             .cols = 34,
             .scales = {0x7c, 0x77},
             .narrow = true};
    g.in.assign(34, 0.0f);
    g.codes.assign(34, 0x00);
    g.out.assign(34, 0.0f);
    g.in[0] = 56.0f, g.codes[0] = 0x7e, g.out[0] = 56.0f;
    g.in[1] = -0.5f, g.codes[1] = 0xc8, g.out[1] = -0.5f;
    g.in[32] = 1.0f, g.codes[32] = 0x78, g.out[32] = 1.0f;
    g.in[33] = -1.0f, g.codes[33] = 0xf8, g.out[33] = -1.0f;
    REQUIRE(agoq::spec::parse(g.spec) == agoq::spec::parse("mxfp8"));
    check(g);
  }
  SUBCASE("mxint8") {
    // Group 0: absmax 31.75 = 127 / 4 -> 2^-2 (byte 125); -0.5 -> 0, 1.5 -> 2.
    // Group 1: 100 / 127 rounds up to 1 (byte 127); code 100.
    golden g{.spec = "int8_g32_sym_rne_e8m0",
             .rows = 1,
             .cols = 33,
             .scales = {0x7d, 0x7f},
             .narrow = true};
    g.in.assign(33, 0.0f);
    g.codes.assign(33, 0x00);
    g.out.assign(33, 0.0f);
    g.in[0] = 31.75f, g.codes[0] = 0x7f, g.out[0] = 31.75f;
    g.in[1] = -0.125f, g.codes[1] = 0x00, g.out[1] = 0.0f;
    g.in[2] = 0.375f, g.codes[2] = 0x02, g.out[2] = 0.5f;
    g.in[32] = 100.0f, g.codes[32] = 0x64, g.out[32] = 100.0f;
    REQUIRE(agoq::spec::parse(g.spec) == agoq::spec::parse("mxint8"));
    check(g);
  }
  SUBCASE("mxfp8e5m2") {
    // absmax 7168 = 57344 / 8 -> 2^-3 (byte 124); -7168 -> -57344 (0xfb).
    REQUIRE(agoq::spec::parse("fp8e5m2_g32_rne_e8m0") == agoq::spec::parse("mxfp8e5m2"));
    check({.spec = "fp8e5m2_g32_rne_e8m0",
           .rows = 1,
           .cols = 1,
           .in = {-7168.0f},
           .codes = {0xfb},
           .scales = {0x7c},
           .out = {-7168.0f},
           .narrow = true});
  }
}

// Stochastic rounding: element i draws position offset + i (row-major) of the Philox4x32-10
// stream keyed by the seed (key = {seed low 32 bits, seed high 32 bits}, counter = {p / 4 low,
// p / 4 high, 0, 0}, word p % 4, u = (word >> 8) * 2^-24). The words below were computed from the
// Random123 definition independently of the library.
TEST_CASE("golden: stochastic rounding, int4 sym") {
  // Scale 1 in both rows. Positions 6..13 under sr_seed draw the words 65401425 b299da3f
  // f7ce299f 823ccb40 | 4fefe3cc 1a8fe6b6 ac3078f0 7fbe88a2, so u = 0.396 0.698 0.968 0.509 |
  // 0.312 0.104 0.673 0.499: floor(v + u) = 7 1 1 1 | -1 2 -4 7.
  std::vector<float> const in = {7.0f, 0.5f, 0.5f, 0.5f, -0.5f, 2.25f, -3.75f, 7.0f};
  check({.spec = "int4_row_sym_sr_f32",
         .rows = 2,
         .cols = 4,
         .in = in,
         .codes = {0x17, 0x11, 0x2f, 0x7c},
         .scales = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f},
         .out = {7.0f, 1.0f, 1.0f, 1.0f, -1.0f, 2.0f, -4.0f, 7.0f},
         .opt = {.seed = sr_seed, .offset = 6},
         .narrow = true});
  // Positions 0..7: words b850222e c58cb04b 14a7a020 7a84fff9 | adca1466 523e0d85 65401425
  // b299da3f, u = 0.720 0.772 0.081 0.479 | 0.679 0.321 0.396 0.698 -> 7 1 0 0 | 0 2 -4 7.
  check({.spec = "int4_row_sym_sr_f32",
         .rows = 2,
         .cols = 4,
         .in = in,
         .codes = {0x17, 0x00, 0x20, 0x7c},
         .scales = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f},
         .out = {7.0f, 1.0f, 0.0f, 0.0f, 0.0f, 2.0f, -4.0f, 7.0f},
         .opt = {.seed = sr_seed, .offset = 0},
         .narrow = true});
}

TEST_CASE("golden: stochastic rounding, int4 asym") {
  // Scale 0.25, z 4. Positions 3..8: u = 0.479 0.679 0.321 0.396 0.698 0.968;
  // x / s = -4, 11, 0.5, -0.5, 0.5, -0.5 -> floor(v + u) = -4, 11, 0, -1, 1, 0 -> q = v + 4.
  check({.spec = "int4_tensor_asym_sr_f32",
         .rows = 1,
         .cols = 6,
         .in = {-1.0f, 2.75f, 0.125f, -0.125f, 0.125f, -0.125f},
         .codes = {0xf0, 0x34, 0x45},
         .scales = {0x00, 0x00, 0x80, 0x3e},
         .zero_points = {0x04},
         .out = {-1.0f, 2.75f, 0.0f, -0.25f, 0.25f, 0.0f},
         .opt = {.seed = sr_seed, .offset = 3},
         .narrow = true});
}

TEST_CASE("golden: stochastic rounding, fp8 e4m3") {
  // Scale 1. A magnitude a between neighbouring FP8 values lo < hi rounds up when
  // (1 - u) * (hi - lo) <= a - lo, the FP8 analogue of floor(v + u).
  // Positions 0..3: u = 0.720 0.772 0.081 0.479. 448 is the largest code (never rounds up);
  // 1.0625: 0.228 * 0.125 <= 0.0625 -> 1.125 (0x39); -1.03125: 0.919 * 0.125 > 0.03125 -> -1
  // (0xb8); 1 is exact (a - lo = 0) -> 0x38.
  check({.spec = "fp8e4m3_tensor_sr_f32",
         .rows = 1,
         .cols = 4,
         .in = {448.0f, 1.0625f, -1.03125f, 1.0f},
         .codes = {0x7e, 0x39, 0xb8, 0x38},
         .scales = {0x00, 0x00, 0x80, 0x3f},
         .out = {448.0f, 1.125f, -1.0f, 1.0f},
         .opt = {.seed = sr_seed, .offset = 0},
         .narrow = true});
}
