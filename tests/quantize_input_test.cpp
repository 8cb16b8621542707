// Bad and unusual input to the host quantizer: refused arguments (agoq::invalid_argument naming
// the problem), empty tensors, non-finite values, subnormal and huge values, unaligned pointers.
#include <doctest/doctest.h>

#include "quantized_fields.hpp"

#include <agoq/agoq.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using i64 = std::int64_t;
using agoq::test::code_field;
using agoq::test::code_prefixes;
using agoq::test::make_spec;
using agoq::test::portable;
using agoq::test::stored_scale;
using doctest::Contains;

constexpr float flt_max = std::numeric_limits<float>::max();
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// Code field of element (r, c) (packed LSB first, rows byte-aligned).
// The codes documented for the non-finite values (DESIGN §4), as raw fields.
struct special_codes {
  int zero, largest, smallest;
};
special_codes documented_codes(agoq::spec const& s, int zero_point) {
  switch (s.code) {
    case agoq::code_kind::int_sym: {
      int const qmax = (1 << (s.bits - 1)) - 1;
      int const mask = (1 << s.bits) - 1;
      return {0, qmax, -qmax & mask};
    }
    case agoq::code_kind::uint_asym:
      return {zero_point, (1 << s.bits) - 1, 0};
    case agoq::code_kind::fp8_e4m3:
      return {0, 0x7e, 0xfe};
    case agoq::code_kind::fp8_e5m2:
      return {0, 0x7b, 0xfb};
  }
  return {};
}

// Largest code magnitude in units of the scale.
double span(agoq::spec const& s) {
  switch (s.code) {
    case agoq::code_kind::int_sym:
      return (1 << (s.bits - 1)) - 1;
    case agoq::code_kind::uint_asym:
      return (1 << s.bits) - 1;
    case agoq::code_kind::fp8_e4m3:
      return 448;
    case agoq::code_kind::fp8_e5m2:
      return 57344;
  }
  return 0;
}

// |x - xh| for nearest rounding, derived in quantize_property_test.cpp: s/2 + 2^-24 |x| +
// 2^-21 (M + 1) s for integer codes; for FP8 half an FP8 ulp of x / s times s, which is at most
// 2^-(m+1) |x| (m mantissa bits) above the subnormals plus half the subnormal step times s, and
// the fp32 roundings (2^-24 |x| + 2^-24 |xh| + 2^-22 M s).
double nearest_bound(agoq::spec const& s, double x, double xh, double scale) {
  double const m = span(s);
  if (s.code == agoq::code_kind::fp8_e4m3 || s.code == agoq::code_kind::fp8_e5m2) {
    int const mbits = s.code == agoq::code_kind::fp8_e4m3 ? 3 : 2;
    double const sub_step = s.code == agoq::code_kind::fp8_e4m3 ? 0x1p-9 : 0x1p-16;
    return std::ldexp(std::fabs(x), -(mbits + 1)) + sub_step / 2 * scale +
           std::ldexp(std::fabs(x) + std::fabs(xh), -24) + std::ldexp(m * scale, -22);
  }
  return scale / 2 + std::ldexp(std::fabs(x), -24) + std::ldexp((m + 1) * scale, -21);
}

}  // namespace

TEST_CASE("null pointers with a non-zero size are refused, naming the pointer") {
  agoq::spec const s = agoq::spec::parse("int4_g32_asym_rne_f32");
  agoq::quantized_tensor q(s, 2, 40);
  std::vector<float> x(80, 1.0f), y(80);
  agoq::matrix_view<float const> const in(x.data(), 2, 40);
  agoq::matrix_view<float> const out(y.data(), 2, 40);

  CHECK_THROWS_WITH_AS(
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(nullptr, 2, 40), q.view()),
      Contains("quantize: null data pointer for 80 elements"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(nullptr, 2, 40)),
      Contains("dequantize: null data pointer"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(nullptr, 2, 40), out),
      Contains("fake_quantize: null data pointer"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::fake_quantize(agoq::host, s, in, agoq::matrix_view<float>(nullptr, 2, 40)),
      Contains("fake_quantize: null data pointer"), agoq::invalid_argument);

  agoq::quantized_view v = q.view();
  v.codes = nullptr;
  CHECK_THROWS_WITH_AS(agoq::quantize(agoq::host, in, v), Contains("null codes pointer"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::dequantize(agoq::host, v, out), Contains("null codes pointer"),
                       agoq::invalid_argument);
  v = q.view();
  v.scales = nullptr;
  CHECK_THROWS_WITH_AS(agoq::quantize(agoq::host, in, v), Contains("null scales pointer"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::dequantize(agoq::host, v, out), Contains("null scales pointer"),
                       agoq::invalid_argument);
  v = q.view();
  v.zero_points = nullptr;
  CHECK_THROWS_WITH_AS(agoq::quantize(agoq::host, in, v), Contains("zero points"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::dequantize(agoq::host, v, out), Contains("zero points"),
                       agoq::invalid_argument);
  // Symmetric codes have no zero points: a null pointer there is fine.
  agoq::quantized_tensor sym(agoq::spec::parse("int4_g32_sym_rne_f32"), 2, 40);
  agoq::quantized_view sv = sym.view();
  sv.zero_points = nullptr;
  CHECK(agoq::quantize(agoq::host, in, sv) == 0);
  // Nothing was written by the refused calls.
  CHECK(std::all_of(q.data(), q.data() + q.bytes(), [](std::uint8_t b) { return b == 0; }));
  CHECK(std::all_of(y.begin(), y.end(), [](float f) { return f == 0.0f; }));
}

TEST_CASE("extents that disagree with the quantized tensor are refused") {
  agoq::spec const s = agoq::spec::parse("int8_row_sym_rne_f32");
  agoq::quantized_tensor q(s, 4, 8);
  std::vector<float> x(64, 1.0f), y(64);
  CHECK_THROWS_WITH_AS(
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 4, 9), q.view()),
      Contains("quantize: the tensor is 4x9 but the quantized view is 4x8"),
      agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 8, 4), q.view()),
      Contains("the tensor is 8x4 but the quantized view is 4x8"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(y.data(), 3, 8)),
      Contains("dequantize: the tensor is 3x8 but the quantized view is 4x8"),
      agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(x.data(), 4, 8),
                          agoq::matrix_view<float>(y.data(), 4, 7)),
      Contains("fake_quantize: the tensor is 4x8 but the output is 4x7"), agoq::invalid_argument);
  // A view whose extents disagree with the spec's groups is only its own business; a view whose
  // extents are negative is refused.
  agoq::quantized_view v = q.view();
  v.rows = -4;
  CHECK_THROWS_WITH_AS(
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 0, 8), v),
      Contains("extents must be non-negative, got -4x8"), agoq::invalid_argument);
}

TEST_CASE("malformed spec names are refused, naming the bad field") {
  struct bad {
    char const* name;
    char const* why;
  };
  bad const cases[] = {
      {"", "expected <code>_<grouping>"},
      {"int4", "expected <code>_<grouping>"},
      {"int4_g128_sym_rne", "integer codes need 5 fields"},
      {"int3_g128_sym_rne_f32", "integer codes have 2, 4 or 8 bits, got 3"},
      {"int16_g128_sym_rne_f32", "got 16"},
      {"intx_g128_sym_rne_f32", "bad bit width 'x'"},
      {"fp8_g128_rne_f32", "unknown code 'fp8'"},
      {"fp4e2m1_g32_rne_e8m0", "unknown code 'fp4e2m1'"},
      {"int4_g128_rne_f32", "integer codes need 5 fields"},
      {"int4_g128_sym_rne_f32_", "integer codes need 5 fields"},
      {"fp8e4m3_g32_sym_rne_f32", "fp8 codes need 4 fields"},
      {"int4_q128_sym_rne_f32", "unknown grouping 'q128'"},
      {"int4_g12x_sym_rne_f32", "bad group size '12x'"},
      {"int4_g_sym_rne_f32", "bad group size ''"},
      {"int4_g-5_sym_rne_f32", "group size must be at least 1, got -5"},
      {"int4_b4_sym_rne_f32", "unknown grouping 'b4'"},
      {"int4_bx4_sym_rne_f32", "bad block rows ''"},
      {"int4_b0x4_sym_rne_f32", "block extents must be at least 1, got 0x4"},
      {"int4_b4x0_sym_rne_f32", "block extents must be at least 1, got 4x0"},
      {"int4_g128_both_rne_f32", "expected 'sym' or 'asym', got 'both'"},
      {"int4_g128_sym_rtz_f32", "unknown rounding 'rtz'"},
      {"int4_g128_sym_rne_f16", "unknown scale format 'f16'"},
      {"INT4_g128_sym_rne_f32", "unknown code 'INT4'"},
      {"int4__sym_rne_f32", "unknown grouping ''"},
  };
  for (bad const& b : cases) {
    std::string const name = b.name;
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(agoq::spec::parse(b.name), Contains(b.why), agoq::invalid_argument);
  }
}

TEST_CASE("group size 0 and negative extents are refused") {
  CHECK_THROWS_WITH_AS(agoq::spec::parse("int4_g0_sym_rne_f32"),
                       Contains("group size must be at least 1, got 0"), agoq::invalid_argument);
  agoq::spec s = agoq::spec::parse("int4_g32_sym_rne_f32");
  s.group_cols = 0;
  CHECK_THROWS_WITH_AS(agoq::quantized_tensor(s, 2, 2), Contains("group size must be at least 1"),
                       agoq::invalid_argument);
  std::vector<float> x(4, 1.0f), y(4);
  CHECK_THROWS_WITH_AS(
      agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(x.data(), 2, 2),
                          agoq::matrix_view<float>(y.data(), 2, 2)),
      Contains("group size must be at least 1"), agoq::invalid_argument);
  // A view carrying the bad spec is refused too (before anything is read or written).
  agoq::quantized_tensor good(agoq::spec::parse("int4_g32_sym_rne_f32"), 2, 2);
  agoq::quantized_view v = good.view();
  v.spec = s;
  CHECK_THROWS_WITH_AS(
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 2, 2), v),
      Contains("group size must be at least 1"), agoq::invalid_argument);

  agoq::spec const ok = agoq::spec::parse("int8_row_sym_rne_f32");
  CHECK_THROWS_WITH_AS(agoq::quantized_tensor(ok, -1, 4),
                       Contains("extents must be non-negative, got -1x4"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::quantized_tensor(ok, 4, -3),
                       Contains("extents must be non-negative, got 4x-3"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::make_layout(ok, -2, -2), Contains("non-negative"),
                       agoq::invalid_argument);
}

TEST_CASE("fake_quantize refuses partially overlapping buffers and accepts the same buffer") {
  agoq::spec const s = agoq::spec::parse("int8_g32_sym_rne_f32");
  std::vector<float> buf(64);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i) - 20.5f;
  std::vector<float> const before = buf;
  auto in_at = [&](std::size_t k) { return agoq::matrix_view<float const>(buf.data() + k, 1, 32); };
  auto out_at = [&](std::size_t k) { return agoq::matrix_view<float>(buf.data() + k, 1, 32); };
  CHECK_THROWS_WITH_AS(agoq::fake_quantize(agoq::host, s, in_at(0), out_at(16)),
                       Contains("input and output overlap"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::fake_quantize(agoq::host, s, in_at(16), out_at(0)),
                       Contains("input and output overlap"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(agoq::fake_quantize(agoq::host, s, in_at(1), out_at(0)),
                       Contains("input and output overlap"), agoq::invalid_argument);
  // Different element types at one address overlap too (only the same buffer may be shared).
  auto const* halves = reinterpret_cast<agoq::half const*>(buf.data());
  CHECK_THROWS_WITH_AS(
      agoq::fake_quantize(agoq::host, s, agoq::matrix_view<agoq::half const>(halves, 1, 32),
                          out_at(0)),
      Contains("input and output overlap"), agoq::invalid_argument);
  CHECK(buf == before);  // refused calls write nothing
  // Adjacent buffers do not overlap; the same buffer is fake-quantized in place.
  CHECK_NOTHROW(agoq::fake_quantize(agoq::host, s, in_at(0), out_at(32)));
  CHECK_NOTHROW(agoq::fake_quantize(agoq::host, s, in_at(32), out_at(0)));
  CHECK_NOTHROW(agoq::fake_quantize(agoq::host, s, in_at(0), out_at(0)));
}

TEST_CASE("empty tensors are no-ops that touch nothing and return 0") {
  for (char const* name : {"int4_g32_asym_sr_bf16", "int8_tensor_sym_rne_f32",
                           "fp8e4m3_col_rne_e8m0", "int2_b3x5_sym_rne_f32"}) {
    agoq::spec const s = agoq::spec::parse(name);
    for (auto [rows, cols] : {std::pair<i64, i64>{0, 7}, {7, 0}, {0, 0}}) {
      std::string const spec_name = name;
      CAPTURE(spec_name);
      CAPTURE(rows);
      CAPTURE(cols);
      agoq::quantized_tensor q(s, rows, cols);
      CHECK(q.bytes() == 0);
      CHECK(q.layout().groups() == 0);
      // A view over sentinel bytes: nothing may be written through it.
      std::vector<std::uint8_t> sentinel(64, 0xa5);
      agoq::quantized_view const v{
          s, rows, cols, sentinel.data(), sentinel.data() + 16, sentinel.data() + 32};
      std::vector<float> out(8, 42.0f);
      float const* const null_in = nullptr;
      CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(null_in, rows, cols), v) ==
            0);
      CHECK(agoq::quantize(portable, agoq::matrix_view<float const>(out.data(), rows, cols), v) ==
            0);
      CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(null_in, rows, cols),
                           q.view()) == 0);
      CHECK(agoq::dequantize(agoq::host, v, agoq::matrix_view<float>(out.data(), rows, cols)) == 0);
      CHECK(agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(nullptr, rows, cols)) ==
            0);
      CHECK(agoq::fake_quantize(agoq::host, s, agoq::matrix_view<float const>(null_in, rows, cols),
                                agoq::matrix_view<float>(out.data(), rows, cols)) == 0);
      CHECK(agoq::fake_quantize(agoq::host, s,
                                agoq::matrix_view<float const>(out.data(), rows, cols),
                                agoq::matrix_view<float>(nullptr, rows, cols)) == 0);
      CHECK(
          std::all_of(sentinel.begin(), sentinel.end(), [](std::uint8_t b) { return b == 0xa5; }));
      CHECK(std::all_of(out.begin(), out.end(), [](float f) { return f == 42.0f; }));
      // Even null code/scale pointers are fine for an empty tensor.
      agoq::quantized_view const nulls{s, rows, cols, nullptr, nullptr, nullptr};
      CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(null_in, rows, cols),
                           nulls) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("NaN and Inf are counted, encoded as documented, and leave the others alone", T,
                   float, agoq::half, agoq::bfloat16) {
  // Each non-finite value is compared with the same tensor where it is 0: 0 changes neither the
  // absmax nor the widened range [min(min, 0), max(max, 0)], so every other element must keep its
  // code, and the scales must be the same.
  std::mt19937_64 rng(0xbadf00d);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  i64 const rows = 5, cols = 70;
  std::vector<float> clean(rows * cols);
  for (float& v : clean) v = normal(rng);
  std::vector<float> dirty = clean;
  std::vector<float> const specials = {qnan, inf, -inf, -qnan};
  std::vector<i64> where;
  for (i64 i = 3; i < rows * cols; i += 11) {
    dirty[i] = specials[where.size() % specials.size()];
    clean[i] = 0.0f;
    where.push_back(i);
  }
  auto as_t = [](std::vector<float> const& f) {
    std::vector<T> t;
    for (float v : f) t.push_back(agoq::numeric::from_float<T>(v));
    return t;
  };
  std::vector<T> const xd = as_t(dirty), xc = as_t(clean);
  for (std::string const& prefix : code_prefixes()) {
    for (char const* grouping : {"tensor", "row", "col", "g32", "g7", "b3x5"}) {
      for (char const* tail : {"rne_f32", "sr_bf16", "rne_e8m0"}) {
        agoq::spec const s = make_spec(prefix, grouping, tail);
        CAPTURE(s.name());
        for (agoq::host_executor ex : {agoq::host, portable}) {
          agoq::quantized_tensor qd(s, rows, cols), qc(s, rows, cols);
          agoq::quantize_options const opt{31, 7};
          CHECK(agoq::quantize(ex, agoq::matrix_view<T const>(xd.data(), rows, cols), qd.view(),
                               opt) == static_cast<i64>(where.size()));
          CHECK(agoq::quantize(ex, agoq::matrix_view<T const>(xc.data(), rows, cols), qc.view(),
                               opt) == 0);
          agoq::const_quantized_view const vd = std::as_const(qd).view(),
                                           vc = std::as_const(qc).view();
          i64 const groups = qd.layout().groups();
          CHECK(std::memcmp(vd.scales, vc.scales, groups * agoq::scale_bytes(s.scale)) == 0);
          if (s.has_zero_point()) CHECK(std::memcmp(vd.zero_points, vc.zero_points, groups) == 0);
          i64 k = 0, wrong_other = 0, wrong_special = 0;
          for (i64 r = 0; r < rows; ++r) {
            for (i64 c = 0; c < cols; ++c) {
              i64 const e = r * cols + c;
              int const got = code_field(vd, r, c);
              if (k < static_cast<i64>(where.size()) && where[k] == e) {
                ++k;
                i64 const g = qd.layout().group_of(r, c);
                special_codes const want =
                    documented_codes(s, s.has_zero_point() ? vd.zero_points[g] : 0);
                float const x = dirty[e];
                int const expect = std::isnan(x) ? want.zero : x > 0 ? want.largest : want.smallest;
                wrong_special += got != expect;
              } else {
                wrong_other += got != code_field(vc, r, c);
              }
            }
          }
          CHECK(wrong_special == 0);
          CHECK(wrong_other == 0);
          // fake_quantize counts them too, and decodes NaN to 0 and ±Inf to the range's ends.
          std::vector<float> y(rows * cols), f(rows * cols);
          agoq::dequantize(ex, vd, agoq::matrix_view<float>(y.data(), rows, cols));
          CHECK(agoq::fake_quantize(ex, s, agoq::matrix_view<T const>(xd.data(), rows, cols),
                                    agoq::matrix_view<float>(f.data(), rows, cols),
                                    opt) == static_cast<i64>(where.size()));
          CHECK(std::memcmp(y.data(), f.data(), y.size() * sizeof(float)) == 0);
          // +Inf decodes to the top of its group's grid, -Inf to the bottom (for asymmetric codes
          // of a one-signed group that end is 0).
          std::vector<float> top(groups, -inf), bottom(groups, inf);
          for (i64 e = 0; e < rows * cols; ++e) {
            i64 const g = qd.layout().group_of(e / cols, e % cols);
            top[g] = std::max(top[g], y[e]);
            bottom[g] = std::min(bottom[g], y[e]);
          }
          for (i64 e : where) {
            i64 const g = qd.layout().group_of(e / cols, e % cols);
            if (std::isnan(dirty[e])) CHECK(y[e] == 0.0f);
            if (std::isinf(dirty[e])) CHECK(y[e] == (dirty[e] > 0 ? top[g] : bottom[g]));
            if (std::isinf(dirty[e])) CHECK((dirty[e] > 0 ? y[e] >= 0.0f : y[e] <= 0.0f));
            CHECK(std::isfinite(y[e]));
          }
        }
      }
    }
  }
}

TEST_CASE("an all-non-finite group gets scale 0 and decodes to zeros") {
  for (std::string const& prefix : code_prefixes()) {
    for (char const* tail : {"rne_f32", "sr_bf16", "rne_e8m0"}) {
      agoq::spec const s = make_spec(prefix, "g4", tail);
      CAPTURE(s.name());
      std::vector<float> const x = {qnan, inf,  -inf, qnan, 1.0f, -2.0f,
                                    3.0f, 0.5f, inf,  0.0f, 0.0f, -inf};
      agoq::quantized_tensor q(s, 1, 12);
      CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 1, 12), q.view(),
                           {1, 2}) == 6);
      agoq::const_quantized_view const v = std::as_const(q).view();
      CHECK(stored_scale(v, 0) == 0.0f);  // nothing finite
      CHECK(stored_scale(v, 1) > 0.0f);
      CHECK(stored_scale(v, 2) == 0.0f);  // finite values all zero
      std::vector<float> y(12, 9.0f);
      CHECK(agoq::dequantize(agoq::host, v, agoq::matrix_view<float>(y.data(), 1, 12)) == 0);
      for (int i : {0, 1, 2, 3, 8, 9, 10, 11}) CHECK(y[i] == 0.0f);
    }
  }
}

TEST_CASE("subnormal inputs and underflowing scales give scale 0 (below 2^-126)") {
  // A scale is 0 when, rounded up to its storage, it is below the smallest normal float
  // (codec.hpp): then every code decodes to 0, and |x| <= M * scale < M * 2^-126 is the error.
  // E8M0 rounds any positive scale up to at least 2^-126, so there the group keeps a scale and
  // its (exact) codes.
  std::vector<float> const x = {1e-40f, -3e-41f, 0x1p-149f, 0.0f, -1e-42f, 2e-39f};
  i64 const n = static_cast<i64>(x.size());
  for (std::string const& prefix : code_prefixes()) {
    for (char const* tail : {"rne_f32", "rne_bf16", "rne_e8m0", "sr_f32"}) {
      agoq::spec const s = make_spec(prefix, "row", tail);
      CAPTURE(s.name());
      agoq::quantized_tensor q(s, 1, n);
      CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 1, n), q.view()) ==
            0);
      agoq::const_quantized_view const v = std::as_const(q).view();
      float const sc = stored_scale(v, 0);
      std::vector<float> y(n);
      agoq::dequantize(agoq::host, v, agoq::matrix_view<float>(y.data(), 1, n));
      if (s.scale == agoq::scale_format::e8m0) {
        CHECK(sc == 0x1p-126f);
        for (i64 i = 0; i < n; ++i)
          CHECK(std::fabs(x[i] - y[i]) <=
                (s.rounding == agoq::rounding_kind::nearest ? 0.5 : 1.0) * sc + 0x1p-149);
      } else {
        CHECK(sc == 0.0f);
        if (s.has_zero_point()) CHECK(v.zero_points[0] == 0);
        for (i64 i = 0; i < n; ++i) CHECK(y[i] == 0.0f);
      }
    }
  }
  // A normal group whose scale underflows: absmax 2^-120 over 448 (E4M3) is below 2^-126.
  agoq::spec const s = agoq::spec::parse("fp8e4m3_tensor_rne_f32");
  float const tiny = 0x1p-120f;
  agoq::quantized_tensor q(s, 1, 1);
  agoq::quantize(agoq::host, agoq::matrix_view<float const>(&tiny, 1, 1), q.view());
  CHECK(stored_scale(std::as_const(q).view(), 0) == 0.0f);
  // ... while one just large enough keeps it.
  float const small = 0x1p-117f;
  agoq::quantize(agoq::host, agoq::matrix_view<float const>(&small, 1, 1), q.view());
  CHECK(stored_scale(std::as_const(q).view(), 0) == small / 448.0f);
}

TEST_CASE_TEMPLATE("huge values near FLT_MAX do not overflow", T, float, agoq::bfloat16) {
  // Rows: the full float range (an asymmetric range of 2 FLT_MAX, wider than any float), values
  // near +FLT_MAX only, near -FLT_MAX with a positive part, and mixed magnitudes.
  float const big = std::is_same_v<T, float> ? flt_max : 0x1.fep127f;  // largest bfloat16
  std::vector<std::vector<float>> const rows = {
      {big, -big, 1.0f, -3e38f, 2e38f, 0.0f, big / 2, -big / 3},
      {big, big * 0.999f, big * 0.75f, big * 0.5f, 1e38f, big, 3e38f, 0.0f},
      {-big, -big * 0.875f, 0.15f * big, 0.0f, -1e30f, -big, 5e37f, -3.3e38f},
      {big, -1.0f, 1e-30f, -big * 0.51f, 7.0f, -big, big * 0.26f, 2.0f},
  };
  i64 const cols = 8;
  for (std::string const& prefix : code_prefixes()) {
    for (char const* grouping : {"row", "g4", "tensor"}) {
      for (char const* tail : {"rne_f32", "rne_bf16", "rne_e8m0", "sr_f32", "sr_bf16"}) {
        agoq::spec const s = make_spec(prefix, grouping, tail);
        for (auto const& row : rows) {
          CAPTURE(s.name());
          std::vector<T> x;
          for (float f : row) x.push_back(agoq::numeric::from_float<T>(f));
          std::vector<float> xf;
          for (T t : x) xf.push_back(agoq::numeric::to_float(t));
          agoq::quantized_tensor q(s, 1, cols);
          CHECK(agoq::quantize(agoq::host, agoq::matrix_view<T const>(x.data(), 1, cols),
                               q.view()) == 0);
          agoq::const_quantized_view const v = std::as_const(q).view();
          std::vector<float> y(cols), yp(cols), f(cols);
          CHECK(agoq::dequantize(agoq::host, v, agoq::matrix_view<float>(y.data(), 1, cols)) == 0);
          agoq::dequantize(portable, v, agoq::matrix_view<float>(yp.data(), 1, cols));
          agoq::fake_quantize(agoq::host, s, agoq::matrix_view<T const>(x.data(), 1, cols),
                              agoq::matrix_view<float>(f.data(), 1, cols));
          CHECK(std::memcmp(y.data(), yp.data(), sizeof(float) * cols) == 0);
          CHECK(std::memcmp(y.data(), f.data(), sizeof(float) * cols) == 0);
          for (i64 i = 0; i < cols; ++i) {
            CAPTURE(xf[i]);
            CAPTURE(y[i]);
            CHECK(std::isfinite(y[i]));
            float const sc = stored_scale(v, q.layout().group_of(0, i));
            CHECK(std::isfinite(sc));
            // The error bound holds unless the scale had to be capped at the storage's largest
            // value (E8M0 2^127: int2 symmetric needs FLT_MAX / 1, asymmetric 2 FLT_MAX / 3).
            bool const capped = s.scale == agoq::scale_format::e8m0 && sc == 0x1p127f &&
                                (s.bits == 2 && s.code != agoq::code_kind::fp8_e4m3);
            if (!capped && s.rounding == agoq::rounding_kind::nearest)
              CHECK(std::fabs(static_cast<double>(xf[i]) - y[i]) <=
                    nearest_bound(s, xf[i], y[i], sc));
          }
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("unaligned pointers work on the host", T, float, agoq::half, agoq::bfloat16) {
  std::mt19937_64 rng(0xa1195);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  i64 const rows = 3, cols = 77;
  std::vector<T> storage(rows * cols + 1);
  for (T& t : storage) t = agoq::numeric::from_float<T>(normal(rng));
  T const* const x = storage.data() + 1;  // one element off the allocation's alignment
  for (std::string const& prefix : code_prefixes()) {
    for (char const* tail : {"rne_f32", "sr_bf16", "rne_e8m0"}) {
      agoq::spec const s = make_spec(prefix, "g32", tail);
      CAPTURE(s.name());
      agoq::quantized_tensor ref(s, rows, cols);
      agoq::quantize(agoq::host, agoq::matrix_view<T const>(x, rows, cols), ref.view(), {3, 4});
      agoq::quantized_layout const l = ref.layout();
      // Separate code, scale and zero-point buffers, each one byte off.
      std::vector<std::uint8_t> codes(l.codes_bytes + 1), scales(l.scales_bytes + 1),
          zps(l.groups() + 1);
      agoq::quantized_view const v{s,
                                   rows,
                                   cols,
                                   codes.data() + 1,
                                   scales.data() + 1,
                                   s.has_zero_point() ? zps.data() + 1 : nullptr};
      for (agoq::host_executor ex : {agoq::host, portable}) {
        agoq::quantize(ex, agoq::matrix_view<T const>(x, rows, cols), v, {3, 4});
        agoq::const_quantized_view const rv = std::as_const(ref).view();
        CHECK(std::memcmp(v.codes, rv.codes, l.codes_bytes) == 0);
        CHECK(std::memcmp(v.scales, rv.scales, l.scales_bytes) == 0);
        if (s.has_zero_point()) CHECK(std::memcmp(v.zero_points, rv.zero_points, l.groups()) == 0);
        std::vector<T> out(rows * cols + 1), expect(rows * cols);
        agoq::dequantize(ex, v, agoq::matrix_view<T>(out.data() + 1, rows, cols));
        agoq::dequantize(agoq::host, rv, agoq::matrix_view<T>(expect.data(), rows, cols));
        CHECK(std::memcmp(out.data() + 1, expect.data(), sizeof(T) * rows * cols) == 0);
        std::vector<T> fq(rows * cols + 1);
        agoq::fake_quantize(ex, s, agoq::matrix_view<T const>(x, rows, cols),
                            agoq::matrix_view<T>(fq.data() + 1, rows, cols), {3, 4});
        CHECK(std::memcmp(fq.data() + 1, expect.data(), sizeof(T) * rows * cols) == 0);
      }
    }
  }
}

TEST_CASE("a call compiled for a code list gives the full set's bits and refuses other families") {
  using int8_only = agoq::type_list<agoq::int_sym<8>>;
  std::vector<float> x(300);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  agoq::matrix_view<float const> const in(x.data(), 3, 100);
  for (char const* name : {"int8_g32_sym_sr_bf16", "int8_row_sym_rne_f32"}) {
    CAPTURE(name);
    agoq::spec const s = agoq::spec::parse(name);
    agoq::quantized_tensor full(s, 3, 100), listed(s, 3, 100);
    CHECK(agoq::quantize(agoq::host, in, full.view(), {5, 6}) ==
          agoq::quantize<int8_only>(agoq::host, in, listed.view(), {5, 6}));
    CHECK(std::memcmp(full.data(), listed.data(), static_cast<std::size_t>(full.bytes())) == 0);
    std::vector<float> y(300), z(300), f(300);
    agoq::dequantize(agoq::host, full.view(), agoq::matrix_view<float>(y.data(), 3, 100));
    agoq::dequantize<int8_only>(agoq::host, listed.view(),
                                agoq::matrix_view<float>(z.data(), 3, 100));
    agoq::fake_quantize<int8_only>(agoq::host, s, in, agoq::matrix_view<float>(f.data(), 3, 100),
                                   {5, 6});
    CHECK(std::memcmp(y.data(), z.data(), sizeof(float) * 300) == 0);
    CHECK(std::memcmp(y.data(), f.data(), sizeof(float) * 300) == 0);
  }
  agoq::spec const int4 = agoq::spec::parse("int4_g32_sym_rne_f32");
  agoq::quantized_tensor q(int4, 3, 100);
  std::vector<float> y(300, 7.0f);
  agoq::matrix_view<float> const out(y.data(), 3, 100);
  char const* const why = "outside the code list the call was compiled for";
  CHECK_THROWS_WITH_AS(agoq::quantize<int8_only>(agoq::host, in, q.view()), Contains(why),
                       agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(agoq::dequantize<int8_only>(agoq::host, q.view(), out), Contains(why),
                       agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(agoq::fake_quantize<int8_only>(agoq::host, int4, in, out), Contains(why),
                       agoq::unsupported_scheme);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
}

TEST_CASE("dispatch refuses a valid spec outside the dispatch set; the host takes it") {
  for (char const* name : {"int4_g48_sym_rne_f32", "int8_g7_asym_sr_bf16",
                           "fp8e4m3_b64x64_rne_e8m0", "int2_b128x64_sym_rne_f32"}) {
    std::string const spec_name = name;
    CAPTURE(spec_name);
    agoq::spec const s = agoq::spec::parse(name);
    CHECK_THROWS_WITH_AS(agoq::dispatch(s, [](auto) { return 0; }),
                         Contains("grouping outside the dispatch set"), agoq::unsupported_scheme);
    std::vector<float> x(200, 0.25f), y(200);
    x[3] = -1.0f;
    agoq::quantized_tensor q(s, 2, 100);
    CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 2, 100), q.view()) ==
          0);
    agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(y.data(), 2, 100));
    // Within one step of the coarsest of these codes (int2 asymmetric: a range of 1.25 in 3 steps).
    CHECK(std::fabs(y[3] + 1.0f) <= 1.25f / 3);
    CHECK(y[0] >= 0.0f);
  }
  CHECK(agoq::dispatch(agoq::spec::parse("int4_g128_sym_rne_f32"), [](auto sch) {
          return decltype(sch)::to_spec().name();
        }) == "int4_g128_sym_rne_f32");
}
