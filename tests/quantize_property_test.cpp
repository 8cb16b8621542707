// Properties of the host quantizer on random data, checked against a plain scalar implementation
// of the format contract (DESIGN §4) written here from the contract alone: its own grouping loops,
// its own scale arithmetic (fp32, cross-checked in double), its own rounding, fp8 tables and
// Philox. Nothing below calls agoq's codec, fp8, scale or philox functions.
#include <doctest/doctest.h>

#include "quantized_fields.hpp"

#include <agoq/agoq.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using i64 = std::int64_t;
using agoq::test::code_field;
using agoq::test::code_prefixes;
using agoq::test::make_spec;
using agoq::test::stored_scale;
using u64 = std::uint64_t;

// ---------------------------------------------------------------------------------------------
// The reference.
// ---------------------------------------------------------------------------------------------

// Exact widening of the input elements (own bit decoding).
template <class T>
std::uint16_t bits16(T x) {
  std::uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float widen(float x) { return x; }
float widen(agoq::bfloat16 x) { return std::bit_cast<float>(std::uint32_t{bits16(x)} << 16); }
float widen(agoq::half x) {
  std::uint16_t const h = bits16(x);
  int const e = (h >> 10) & 31;
  int const m = h & 1023;
  double const sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN() : sign * HUGE_VALF;
  double const mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return static_cast<float>(sign * mag);
}

// An OCP FP8 format, tabulated: vals[m] is the value of magnitude code m, 0 <= m <= max_code.
struct fp8_table {
  int mbits = 0;
  int bias = 0;
  int max_code = 0;
  std::vector<double> vals;
  double max() const { return vals.back(); }
  // Spacing of the format around a magnitude a (that of a's binade; the subnormal step below
  // the smallest normal).
  double ulp(double a) const {
    int e = 1 - bias;  // exponent of the smallest normal
    if (a >= std::ldexp(1.0, 1 - bias)) e = std::ilogb(std::min(a, max()));
    return std::ldexp(1.0, e - mbits);
  }
};
fp8_table make_fp8_table(int mbits, int bias, int max_code) {
  fp8_table t{mbits, bias, max_code, {}};
  for (int m = 0; m <= max_code; ++m) {
    int const e = m >> mbits;
    int const f = m & ((1 << mbits) - 1);
    t.vals.push_back(e == 0 ? std::ldexp(f, 1 - bias - mbits)
                            : std::ldexp((1 << mbits) + f, e - bias - mbits));
  }
  return t;
}
fp8_table const& e4m3_table() {
  static fp8_table const t = make_fp8_table(3, 7, 0x7e);  // 0x7f is NaN; largest 448
  return t;
}
fp8_table const& e5m2_table() {
  static fp8_table const t = make_fp8_table(2, 15, 0x7b);  // 0x7c.. are Inf/NaN; largest 57344
  return t;
}

// Everything the reference needs to know about a code family.
struct code_info {
  int bits = 8;
  bool asym = false;
  fp8_table const* fp8 = nullptr;
  int qmax = 0;    // symmetric: 2^(b-1) - 1
  int levels = 0;  // asymmetric: 2^b - 1
  // Largest code magnitude in units of the scale (M in the bounds below).
  double span() const { return fp8 ? fp8->max() : asym ? levels : qmax; }
};
code_info info_of(agoq::spec const& s) {
  code_info c;
  c.bits = s.bits;
  switch (s.code) {
    case agoq::code_kind::int_sym:
      c.qmax = (1 << (s.bits - 1)) - 1;
      break;
    case agoq::code_kind::uint_asym:
      c.asym = true;
      c.levels = (1 << s.bits) - 1;
      break;
    case agoq::code_kind::fp8_e4m3:
      c.fp8 = &e4m3_table();
      break;
    case agoq::code_kind::fp8_e5m2:
      c.fp8 = &e5m2_table();
      break;
  }
  return c;
}

// The rectangle of one group and the group grid.
struct ref_grid {
  i64 tile_rows = 1, tile_cols = 1, grid_rows = 0, grid_cols = 0;
  i64 group_of(i64 r, i64 c) const { return (r / tile_rows) * grid_cols + c / tile_cols; }
};
ref_grid grid_of(agoq::spec const& s, i64 rows, i64 cols) {
  ref_grid g;
  switch (s.grouping) {
    case agoq::grouping_kind::tensor:
      g.tile_rows = std::max<i64>(rows, 1);
      g.tile_cols = std::max<i64>(cols, 1);
      break;
    case agoq::grouping_kind::row:
      g.tile_cols = std::max<i64>(cols, 1);
      break;
    case agoq::grouping_kind::column:
      g.tile_rows = std::max<i64>(rows, 1);
      break;
    case agoq::grouping_kind::group:
      g.tile_cols = s.group_cols;
      break;
    case agoq::grouping_kind::block:
      g.tile_rows = s.group_rows;
      g.tile_cols = s.group_cols;
      break;
  }
  if (rows > 0 && cols > 0) {
    g.grid_rows = (rows + g.tile_rows - 1) / g.tile_rows;
    g.grid_cols = (cols + g.tile_cols - 1) / g.tile_cols;
  }
  return g;
}

constexpr float min_normal = 0x1p-126f;
constexpr double bf16_max = 0x1.fep127;  // 0x7f7f

// The smallest value of the storage format that is >= s (s finite, >= 0), capped at the largest.
float round_up(float s, agoq::scale_format f) {
  if (s == 0.0f || f == agoq::scale_format::f32) return s;
  int e;
  (void)std::frexp(static_cast<double>(s), &e);  // s in [2^(e-1), 2^e)
  if (f == agoq::scale_format::bf16) {
    // 8 significant bits; bf16 subnormals (below 2^-126) are spaced 2^-133.
    double const step = std::ldexp(1.0, std::max(e - 8, -133));
    return static_cast<float>(std::min(std::ceil(s / step) * step, bf16_max));
  }
  // E8M0: powers of two from 2^-126 (agoq keeps the byte 0 for a zero scale) to 2^127.
  double p = std::ldexp(1.0, e - 1) == s ? s : std::ldexp(1.0, e);
  p = std::clamp(p, 0x1p-126, 0x1p127);
  return static_cast<float>(p);
}

// The bytes of a stored scale.
std::vector<std::uint8_t> scale_bytes_of(float s, agoq::scale_format f) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(s);
  switch (f) {
    case agoq::scale_format::f32:
      return {static_cast<std::uint8_t>(u), static_cast<std::uint8_t>(u >> 8),
              static_cast<std::uint8_t>(u >> 16), static_cast<std::uint8_t>(u >> 24)};
    case agoq::scale_format::bf16:
      return {static_cast<std::uint8_t>(u >> 16), static_cast<std::uint8_t>(u >> 24)};
    case agoq::scale_format::e8m0:
      return {static_cast<std::uint8_t>(s == 0.0f ? 0 : std::ilogb(s) + 127)};
  }
  return {};
}

struct ref_params {
  float scale = 0.0f;
  int zero_point = 0;
  double exact_scale = 0.0;  // the scale in exact (double) arithmetic, before storage rounding
  double lo = 0.0;           // asymmetric: min(min, 0) of the group
};

// Scale and zero point of a group from its finite values (DESIGN §4), in fp32; `double_ok` is
// cleared when the fp32 quotient differs from the double one rounded to float (it may not: a
// double quotient rounded to float is the correctly rounded float quotient, since 53 >= 2*24+2).
ref_params make_params(code_info const& c, agoq::scale_format f, std::vector<float> const& vals,
                       bool& double_ok) {
  float absmax = 0.0f, mn = 0.0f, mx = 0.0f;
  bool any = false;
  for (float v : vals) {
    if (!std::isfinite(v)) continue;
    absmax = std::max(absmax, std::fabs(v));
    mn = any ? std::min(mn, v) : v;
    mx = any ? std::max(mx, v) : v;
    any = true;
  }
  ref_params p;
  float s;
  if (c.asym) {
    float const lo = mn < 0.0f ? mn : 0.0f;
    float const hi = mx > 0.0f ? mx : 0.0f;
    float const levels = static_cast<float>(c.levels);
    float const range = hi - lo;
    s = range / levels;
    if (std::isfinite(s)) {
      double_ok &= static_cast<float>(static_cast<double>(range) / c.levels) == s;
    } else {
      // The range is wider than FLT_MAX: codec.hpp splits the division.
      s = hi / levels - lo / levels;
    }
    p.exact_scale = (static_cast<double>(hi) - static_cast<double>(lo)) / c.levels;
    p.lo = lo;
    s = round_up(s, f);
    if (!(s >= min_normal)) return p;
    float const zf = -lo / s;
    p.zero_point = static_cast<int>(std::clamp(std::nearbyint(zf), 0.0f, levels));
  } else {
    float const div = c.fp8 ? static_cast<float>(c.fp8->max()) : static_cast<float>(c.qmax);
    s = absmax / div;
    double_ok &= static_cast<float>(static_cast<double>(absmax) / div) == s;
    p.exact_scale = static_cast<double>(absmax) / div;
    s = round_up(s, f);
    if (!(s >= min_normal)) return p;
  }
  p.scale = s;
  return p;
}

// The FP8 code of v, saturating, NaN -> +0; below the saturation its magnitude is pick(i, a), i
// the table entry at or below |v| = a (pick chooses i or i + 1).
template <class Pick>
int fp8_code(double v, fp8_table const& t, Pick const& pick) {
  if (std::isnan(v)) return 0;
  int const sign = std::signbit(v) ? 0x80 : 0;
  double const a = std::fabs(v);
  int mag = t.max_code;
  if (a < t.max()) {
    int const i =
        static_cast<int>(std::upper_bound(t.vals.begin(), t.vals.end(), a) - t.vals.begin()) - 1;
    mag = pick(i, a);
  }
  return sign | mag;
}

// FP8, round to nearest even on the table, saturating; NaN -> +0.
int fp8_nearest(double v, fp8_table const& t) {
  return fp8_code(v, t, [&](int i, double a) {
    double const dl = a - t.vals[i];
    double const dh = t.vals[i + 1] - a;
    return dl < dh ? i : dh < dl ? i + 1 : (i % 2 == 0 ? i : i + 1);
  });
}

// FP8 stochastic rounding as codec.hpp documents it: up to the next magnitude when
// (1 - u) (hi - lo) <= a - lo, i.e. with probability (a - lo) / (hi - lo), and like floor(v + u)
// never at u = 0; saturating; NaN -> +0.
int fp8_stochastic(double v, double u, fp8_table const& t) {
  return fp8_code(v, t, [&](int i, double a) {
    return (1 - u) * (t.vals[i + 1] - t.vals[i]) <= a - t.vals[i] ? i + 1 : i;
  });
}

// Philox4x32-10 (Salmon et al., SC'11), checked below against Random123's known answers.
std::array<std::uint32_t, 4> philox(std::array<std::uint32_t, 4> c, std::uint32_t k0,
                                    std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    u64 const p0 = u64{0xD2511F53u} * c[0];
    u64 const p1 = u64{0xCD9E8D57u} * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<std::uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The uniform draw of stream position p: word p % 4 of the block counted by p / 4, keyed by the
// seed, its top 24 bits scaled by 2^-24 (numeric/philox.hpp documents this mapping).
float draw_at(u64 seed, u64 p) {
  u64 const block = p >> 2;
  auto const w =
      philox({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
             static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return static_cast<float>(std::ldexp(static_cast<double>(w[p & 3] >> 8), -24));
}

// The reference quantization of a [rows, cols] float matrix.
struct ref_result {
  ref_grid grid;
  std::vector<ref_params> params;  // per group
  std::vector<int> codes;          // per element: signed q, unsigned code, or fp8 byte
  std::vector<float> decoded;      // per element
  i64 nonfinite = 0;
  bool double_ok = true;
};

ref_result reference(agoq::spec const& s, i64 rows, i64 cols, std::vector<float> const& x,
                     agoq::quantize_options opt) {
  code_info const c = info_of(s);
  ref_result r;
  r.grid = grid_of(s, rows, cols);
  i64 const groups = r.grid.grid_rows * r.grid.grid_cols;
  std::vector<std::vector<float>> members(static_cast<std::size_t>(groups));
  for (i64 i = 0; i < rows; ++i) {
    for (i64 j = 0; j < cols; ++j) members[r.grid.group_of(i, j)].push_back(x[i * cols + j]);
  }
  for (auto const& m : members) r.params.push_back(make_params(c, s.scale, m, r.double_ok));
  bool const sr = s.rounding == agoq::rounding_kind::stochastic;
  r.codes.resize(x.size());
  r.decoded.resize(x.size());
  for (i64 i = 0; i < rows; ++i) {
    for (i64 j = 0; j < cols; ++j) {
      i64 const e = i * cols + j;
      float const xv = x[e];
      r.nonfinite += std::isfinite(xv) ? 0 : 1;
      ref_params const& p = r.params[r.grid.group_of(i, j)];
      float const u = sr ? draw_at(opt.seed, opt.offset + static_cast<u64>(e)) : 0.0f;
      int q = 0;
      float dec = 0.0f;
      if (p.scale == 0.0f) {
        q = c.asym ? p.zero_point : 0;  // every code of a zero-scale group decodes to 0
      } else if (c.fp8) {
        float const v = xv / p.scale;
        q = sr ? fp8_stochastic(v, u, *c.fp8) : fp8_nearest(v, *c.fp8);
        double const mag = c.fp8->vals[q & 0x7f];
        dec = static_cast<float>((q & 0x80) ? -mag : mag) * p.scale;
      } else {
        float v = xv / p.scale;
        if (std::isnan(v)) v = 0.0f;  // NaN -> the code of real zero
        double const lo = c.asym ? 0.0 : -c.qmax;
        double const hi = c.asym ? c.levels : c.qmax;
        double const z = c.asym ? p.zero_point : 0;
        // q = clamp(rne(x / s) + z) or clamp(floor(x / s + u) + z), with v = fl(x / s) and the
        // floor of v + u taken exactly (codec.hpp): floor(v) + 1 when the fraction of v reaches
        // 1 - u. In double, 1 - u (24 bits) and v - floor(v) (|v| <= 2^8) are exact except for v
        // in (-2^-30, 0), whose fraction 1 + v is then within 2^-30 of 1 and can only differ from
        // 1 - u at u = 0; an infinite v gives a NaN fraction (no step) and is clamped.
        double const vd = v;
        double const fl = std::floor(vd);
        double const k = sr ? fl + (1.0 - u <= vd - fl ? 1.0 : 0.0) : std::nearbyint(vd);
        q = static_cast<int>(std::clamp(k + z, lo, hi));
        dec = static_cast<float>(q - static_cast<int>(z)) * p.scale;
      }
      r.codes[e] = q;
      r.decoded[e] = dec;
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// What is compared.
// ---------------------------------------------------------------------------------------------

std::vector<std::string> const& grouping_names() {
  static std::vector<std::string> const g = {"tensor", "row", "col", "g32",      "g64", "g128",
                                             "g256",   "g7",  "g1",  "b128x128", "b3x5"};
  return g;
}

std::vector<agoq::spec> all_specs() {
  std::vector<std::string> const codes = {"int2", "int4", "int8",    "int2",
                                          "int4", "int8", "fp8e4m3", "fp8e5m2"};
  std::vector<agoq::spec> out;
  for (std::size_t k = 0; k < codes.size(); ++k) {
    std::string const sym = k < 3 ? "_sym" : k < 6 ? "_asym" : "";
    for (auto const& g : grouping_names()) {
      for (char const* rnd : {"_rne", "_sr"}) {
        for (char const* sc : {"_f32", "_bf16", "_e8m0"}) {
          out.push_back(agoq::spec::parse(codes[k] + "_" + g + sym + rnd + sc));
        }
      }
    }
  }
  return out;
}

// The field as the reference writes it: signed q for symmetric codes.
int code_value(agoq::spec const& s, int field) {
  if (s.code != agoq::code_kind::int_sym) return field;
  return field >= (1 << (s.bits - 1)) ? field - (1 << s.bits) : field;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

template <class T>
bool same_bytes(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Error bounds, for an element x, its stored scale s, its decoded value xh, M = code_info::span().
//
// Integer codes, nearest rounding. Let u = 2^-24 (fp32 unit roundoff); v = fl(x / s) =
// (x / s)(1 + d1), |d1| <= u, so |x - v s| <= u |x| (plus, were v subnormal, 2^-150 s); k = q or
// q - z is the code, |k| <= M; xh = fl(k s) = k s (1 + d2), |d2| <= u (k s is normal: s >= 2^-126).
//  - v inside the code range: |v - k| <= 1/2, so |x - xh| <= s/2 + u |x| + u M s.
//  - v clamped (symmetric): s = up(fl(absmax / qmax)) >= absmax / qmax (1 - u), so
//    x / s - qmax <= 2u qmax (to first order) and |x - xh| <= 2u M s + u M s.
//  - v clamped (asymmetric): z = rne(fl(-lo / s)) gives |-lo / s - z| <= 1/2 + u (M + 1), and s
//    is at least (hi - lo) / L after at most three fp32 roundings (the split division of
//    codec.hpp), so hi / s - (L - z) <= 1/2 + 3u L + u (M + 1).
// All cases: |x - xh| <= s/2 + u |x| + 2^-21 (M + 1) s + 2^-149 s (8u (M + 1) covers the sums).
double int_nearest_bound(double x, double s, double m) {
  return s / 2 + std::ldexp(std::fabs(x), -24) + std::ldexp((m + 1) * s, -21) + std::ldexp(s, -149);
}
// Stochastic rounding: floor(v + u) (taken exactly) is floor(v) or floor(v) + 1, so |v - k| < 1
// inside the range: one step (s) instead of half, with the same rounding terms.
double int_stochastic_bound(double x, double s, double m) {
  return s + std::ldexp(std::fabs(x), -24) + std::ldexp((m + 1) * s, -21) + std::ldexp(s, -149);
}
// FP8 codes: the code is the nearest FP8 value of v (half an FP8 ulp of v away; saturation at the
// largest value costs at most 2u max, as above); decoding fl(fp8 * s) adds u |xh| (and 2^-150
// where it lands in the float subnormals). Stochastic rounding: one FP8 ulp instead of half.
double fp8_bound(double x, double s, double xh, fp8_table const& t, bool stochastic) {
  double const v = x / s;
  double const step = t.ulp(std::fabs(v)) * s;
  return (stochastic ? step : step / 2) + std::ldexp(std::fabs(x) + std::fabs(xh), -24) +
         std::ldexp(t.max() * s, -22) + std::ldexp(s + 1, -149);
}

// The nearest-rounding code of x in exact arithmetic (double, with the unrounded scale sd and,
// for asymmetric codes, its own zero point); `near_tie` is set when x / sd is so close to a
// rounding boundary that the fp32 quotient may round to the other side: |fl(x / s) - x / sd| <=
// |x / sd| (2^-22 + 2^-24) for an fp32 scale s within 2^-22 of sd.
int exact_code(code_info const& c, double x, double sd, double zd, bool& near_tie) {
  double const t = x / sd;
  double const slack = std::ldexp(std::fabs(t) + 1, -20);
  if (c.fp8) {
    double const a = std::fabs(t);
    for (std::size_t i = 0; i + 1 < c.fp8->vals.size(); ++i) {
      double const mid = (c.fp8->vals[i] + c.fp8->vals[i + 1]) / 2;
      if (std::fabs(a - mid) <= slack * c.fp8->ulp(a)) near_tie = true;
    }
    return fp8_nearest(t, *c.fp8);
  }
  if (std::fabs(t - std::floor(t) - 0.5) <= slack) near_tie = true;
  double const k = std::nearbyint(t);
  if (c.asym) return static_cast<int>(std::clamp(k + zd, 0.0, static_cast<double>(c.levels)));
  return static_cast<int>(std::clamp(k, -1.0 * c.qmax, 1.0 * c.qmax));
}

using agoq::test::portable;

// One input, one spec: agoq against the reference and every executor against the others.
// Returns the first failure found ("" if none).
template <class T>
std::string check_case(agoq::spec const& s, i64 rows, i64 cols, std::vector<T> const& x,
                       agoq::quantize_options opt) {
  std::ostringstream why;
  auto fail = [&](auto const&... parts) {
    if (why.tellp() == 0) (why << ... << parts);
  };
  std::vector<float> xf(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xf[i] = widen(x[i]);
  agoq::matrix_view<T const> const in(x.data(), rows, cols);
  code_info const c = info_of(s);
  bool const sr = s.rounding == agoq::rounding_kind::stochastic;

  // Quantize with both executors: identical bytes.
  agoq::quantized_tensor q(s, rows, cols);
  agoq::quantized_tensor qp(s, rows, cols);
  i64 const n_simd = agoq::quantize(agoq::host, in, q.view(), opt);
  i64 const n_port = agoq::quantize(portable, in, qp.view(), opt);
  if (n_simd != 0 || n_port != 0)
    fail("non-finite count ", n_simd, "/", n_port, " for finite data");
  if (q.bytes() != qp.bytes() || std::memcmp(q.data(), qp.data(), q.bytes()) != 0)
    fail("SIMD and portable executors wrote different bytes");

  // Codes, scales and zero points equal the reference exactly.
  ref_result const ref = reference(s, rows, cols, xf, opt);
  if (!ref.double_ok) fail("reference: fp32 scale differs from the double quotient rounded");
  agoq::const_quantized_view const v = std::as_const(q).view();
  i64 const groups = ref.grid.grid_rows * ref.grid.grid_cols;
  if (q.layout().groups() != groups) fail("group count ", q.layout().groups(), " != ", groups);
  int const sbytes = agoq::scale_bytes(s.scale);
  for (i64 g = 0; g < groups && g < q.layout().groups(); ++g) {
    ref_params const& p = ref.params[g];
    auto const expect = scale_bytes_of(p.scale, s.scale);
    if (std::memcmp(v.scales + g * sbytes, expect.data(), expect.size()) != 0)
      fail("group ", g, ": stored scale differs from the reference ", p.scale);
    if (c.asym) {
      if (v.zero_points[g] != p.zero_point)
        fail("group ", g, ": zero point ", int{v.zero_points[g]}, " != ", p.zero_point);
      if (v.zero_points[g] > c.levels) fail("group ", g, ": zero point out of range");
    }
  }
  i64 const row_bytes = (cols * s.bits + 7) / 8;
  for (i64 r = 0; r < rows; ++r) {
    if ((cols * s.bits) % 8 != 0) {
      int const used = static_cast<int>((cols * s.bits) % 8);
      if (v.codes[r * row_bytes + row_bytes - 1] >> used) fail("row ", r, ": padding bits set");
    }
    for (i64 col = 0; col < cols; ++col) {
      i64 const e = r * cols + col;
      int const field = code_field(v, r, col);
      int const got = code_value(s, field);
      if (got != ref.codes[e]) {
        fail("element (", r, ",", col, ") x=", xf[e], ": code ", got, " != reference ",
             ref.codes[e], " (scale ", ref.params[ref.grid.group_of(r, col)].scale, ")");
      }
      // Codes in range.
      if (c.fp8 ? (field & 0x7f) > c.fp8->max_code : !c.asym && std::abs(got) > c.qmax)
        fail("element (", r, ",", col, "): code ", got, " out of range");
    }
  }

  // Dequantize: both executors, every element type; float equals the reference bit for bit,
  // half and bfloat16 equal from_float of the float result.
  std::vector<float> y(x.size()), yp(x.size());
  agoq::dequantize(agoq::host, v, agoq::matrix_view<float>(y.data(), rows, cols));
  agoq::dequantize(portable, v, agoq::matrix_view<float>(yp.data(), rows, cols));
  if (!same_bytes(y, yp)) fail("dequantize: SIMD and portable floats differ");
  for (std::size_t e = 0; e < y.size(); ++e) {
    if (!same_bits(y[e], ref.decoded[e])) {
      fail("element ", e, ": decoded ", y[e], " != reference ", ref.decoded[e]);
    }
  }
  auto check_narrow = [&](auto tag) {
    using U = decltype(tag);
    std::vector<U> z(x.size()), zp(x.size());
    agoq::dequantize(agoq::host, v, agoq::matrix_view<U>(z.data(), rows, cols));
    agoq::dequantize(portable, v, agoq::matrix_view<U>(zp.data(), rows, cols));
    if (!same_bytes(z, zp)) fail("dequantize<", agoq::element_name<U>(), ">: executors differ");
    for (std::size_t e = 0; e < y.size(); ++e) {
      if (bits16(z[e]) != bits16(agoq::numeric::from_float<U>(y[e])))
        fail("dequantize<", agoq::element_name<U>(), ">: element ", e, " is not from_float");
    }
  };
  check_narrow(agoq::half{});
  check_narrow(agoq::bfloat16{});

  // Error bounds (DESIGN §4: half a step for nearest rounding, one step for stochastic).
  for (i64 r = 0; r < rows; ++r) {
    for (i64 col = 0; col < cols; ++col) {
      i64 const e = r * cols + col;
      ref_params const& p = ref.params[ref.grid.group_of(r, col)];
      double const s_ = p.scale, xe = xf[e], xh = y[e];
      double bound;
      if (s_ == 0.0) {
        // A zero scale means the fp32 scale (rounded up) was below 2^-126: |x| < (M + 1) 2^-126.
        bound = (c.span() + 1) * 0x1p-126;
        if (xh != 0.0) fail("element ", e, ": zero scale but decoded ", xh);
      } else if (c.fp8) {
        bound = fp8_bound(xe, s_, xh, *c.fp8, sr);
      } else {
        bound = sr ? int_stochastic_bound(xe, s_, c.span()) : int_nearest_bound(xe, s_, c.span());
      }
      if (!(std::fabs(xe - xh) <= bound))
        fail("element (", r, ",", col, "): |x - xh| = |", xe, " - ", xh, "| > bound ", bound);
    }
  }

  // Against exact (double) quantization: the stored scale lies where rounding up from the exact
  // scale may put it, and (fp32 scales, nearest rounding) every code away from a rounding tie
  // is the exact code.
  for (i64 g = 0; g < groups; ++g) {
    ref_params const& p = ref.params[g];
    double const sd = p.exact_scale, s_ = p.scale;
    if (s_ == 0.0 || sd > 0x1p126) continue;
    double const lo = sd * (1 - 0x1p-22), hi = sd * (1 + 0x1p-22);
    bool ok = true;
    switch (s.scale) {
      case agoq::scale_format::f32:
        ok = s_ >= lo && s_ <= hi;
        break;
      case agoq::scale_format::bf16:
        ok = s_ >= lo && s_ <= hi * (1 + 0x1p-7);
        break;
      case agoq::scale_format::e8m0:
        ok = s_ >= std::min(lo, 0x1p-126) && s_ < 2 * std::max(hi, 0x1p-126) &&
             std::exp2(std::ilogb(s_)) == s_;
        break;
    }
    if (!ok) fail("group ", g, ": scale ", s_, " too far from the exact ", sd);
  }
  if (!sr && s.scale == agoq::scale_format::f32) {
    for (i64 r = 0; r < rows; ++r) {
      for (i64 col = 0; col < cols; ++col) {
        i64 const e = r * cols + col;
        ref_params const& p = ref.params[ref.grid.group_of(r, col)];
        if (p.scale == 0.0f) continue;
        double zd = 0.0;
        if (c.asym) {
          // The exact zero point, unless -lo / sd is too close to a tie for fp32 to agree.
          double const t = -p.lo / p.exact_scale;
          if (std::fabs(t - std::floor(t) - 0.5) <= std::ldexp(t + 1, -20)) continue;
          zd = std::clamp(std::nearbyint(t), 0.0, 1.0 * c.levels);
          if (zd != p.zero_point)
            fail("group of (", r, ",", col, "): zero point ", p.zero_point, " != exact ", zd);
        }
        bool near_tie = false;
        int const exact = exact_code(c, xf[e], p.exact_scale, zd, near_tie);
        if (!near_tie && exact != ref.codes[e]) {
          fail("element (", r, ",", col, ") x=", xf[e], ": code ", ref.codes[e],
               " != exact double code ", exact);
        }
      }
    }
  }

  // fake_quantize equals quantize + dequantize bit for bit: both executors, to float, to T, and
  // in place.
  for (agoq::host_executor ex : {agoq::host, portable}) {
    std::vector<float> f(x.size());
    if (agoq::fake_quantize(ex, s, in, agoq::matrix_view<float>(f.data(), rows, cols), opt) != 0)
      fail("fake_quantize: non-finite count for finite data");
    if (!same_bytes(f, y)) fail("fake_quantize<float> != quantize + dequantize");
    std::vector<T> t(x.size()), inplace = x, expect(x.size());
    agoq::dequantize(agoq::host, v, agoq::matrix_view<T>(expect.data(), rows, cols));
    agoq::fake_quantize(ex, s, in, agoq::matrix_view<T>(t.data(), rows, cols), opt);
    if (!same_bytes(t, expect)) fail("fake_quantize<T> != quantize + dequantize<T>");
    agoq::matrix_view<T> const io(inplace.data(), rows, cols);
    agoq::fake_quantize(ex, s, agoq::matrix_view<T const>(inplace.data(), rows, cols), io, opt);
    if (!same_bytes(inplace, expect)) fail("in-place fake_quantize != quantize + dequantize");
  }
  return why.str();
}

// Random test data: rows of widely different magnitudes (the group statistics differ), with exact
// zeros, outliers, all-positive, all-negative, constant and all-zero rows.
template <class T>
std::vector<T> random_matrix(i64 rows, i64 cols, std::mt19937_64& rng) {
  bool const narrow = std::is_same_v<T, agoq::half>;
  int const spread = narrow ? 6 : 20;  // half: stay far from 65504 and from its subnormals
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-spread, spread);
  std::vector<T> x(static_cast<std::size_t>(rows * cols));
  for (i64 r = 0; r < rows; ++r) {
    float const mag = std::ldexp(1.0f, expo(rng));
    int const mode = static_cast<int>(rng() % 8);
    float const constant = normal(rng) * mag;
    for (i64 c = 0; c < cols; ++c) {
      float v = normal(rng) * mag;
      float const pick = uni(rng);
      if (pick < 0.03f) v = 0.0f;
      if (pick > 0.98f) v *= 16.0f;
      if (mode == 1) v = std::fabs(v) + mag;
      if (mode == 2) v = -std::fabs(v) - mag / 2;
      if (mode == 3) v = constant;
      if (mode == 4) v = 0.0f;
      x[r * cols + c] = agoq::numeric::from_float<T>(v);
    }
  }
  return x;
}

struct shape {
  i64 rows, cols;
};

// 1x1, a prime-length row, odd extents, extents that are not multiples of G or of the block,
// more rows than a block has, and rows wider than one chunk of the executor (4096 columns).
std::vector<shape> const& shapes() {
  static std::vector<shape> const s = {{1, 1},    {1, 97},  {1, 257}, {3, 5},   {7, 13},
                                       {13, 129}, {131, 9}, {5, 300}, {2, 4099}};
  return s;
}

}  // namespace

TEST_CASE("reference Philox4x32-10 reproduces Random123's known answers") {
  CHECK(philox({0, 0, 0, 0}, 0, 0) ==
        std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff) ==
        std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0) ==
        std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("reference FP8 tables hold the OCP values") {
  CHECK(e4m3_table().max() == 448.0);
  CHECK(e5m2_table().max() == 57344.0);
  CHECK(e4m3_table().vals[1] == 0x1p-9);   // smallest subnormal
  CHECK(e5m2_table().vals[1] == 0x1p-16);  // smallest subnormal
  CHECK(e4m3_table().vals[8] == 0x1p-6);   // smallest normal
  CHECK(e5m2_table().vals[4] == 0x1p-14);
}

TEST_CASE_TEMPLATE("quantize matches the scalar reference of the format contract", T, float,
                   agoq::half, agoq::bfloat16) {
  std::mt19937_64 rng(0x5eed0001u + sizeof(T) * 7 + std::is_same_v<T, agoq::half>);
  std::vector<agoq::spec> const specs = all_specs();
  for (shape const& sh : shapes()) {
    std::vector<T> const x = random_matrix<T>(sh.rows, sh.cols, rng);
    for (std::size_t k = 0; k < specs.size(); ++k) {
      agoq::quantize_options const opt{0x9e3779b97f4a7c15ull * (k + 1), 1000 + 17 * k};
      std::string const msg = check_case(specs[k], sh.rows, sh.cols, x, opt);
      CHECK_MESSAGE(msg.empty(), specs[k].name(), " ", std::string(agoq::element_name<T>()), " ",
                    sh.rows, "x", sh.cols, ": ", msg);
    }
  }
}

namespace {

std::vector<int> unpacked_codes(agoq::const_quantized_view v) {
  std::vector<int> out;
  for (i64 r = 0; r < v.rows; ++r) {
    for (i64 c = 0; c < v.cols; ++c) out.push_back(code_value(v.spec, code_field(v, r, c)));
  }
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("nearest rounding breaks exact ties to even", T, float, agoq::half,
                   agoq::bfloat16) {
  // Each row holds the values that make the scale exactly 1 (absmax = qmax; lo = -z0 and
  // hi = L - z0; absmax = the FP8 maximum), then every tie of the code: half-integers, or the
  // midpoints between consecutive FP8 values, with both signs.
  for (std::string const& prefix : code_prefixes()) {
    agoq::spec const s = make_spec(prefix, "row", "rne_f32");
    code_info const c = info_of(s);
    std::vector<float> row;
    int z0 = 0;
    if (c.fp8) {
      row.push_back(static_cast<float>(c.fp8->max()));
      for (std::size_t i = 0; i + 1 < c.fp8->vals.size(); ++i) {
        double const mid = (c.fp8->vals[i] + c.fp8->vals[i + 1]) / 2;
        if (std::is_same_v<T, agoq::half> && (mid > 65504 || mid < 0x1p-14)) continue;
        row.push_back(static_cast<float>(mid));
        row.push_back(static_cast<float>(-mid));
      }
    } else if (c.asym) {
      z0 = (c.levels + 1) / 2;
      row.push_back(static_cast<float>(-z0));
      row.push_back(static_cast<float>(c.levels - z0));
      for (int k = -2 * z0 + 1; k < 2 * (c.levels - z0); k += 2) row.push_back(k / 2.0f);
    } else {
      row.push_back(static_cast<float>(c.qmax));
      for (int k = -2 * c.qmax + 1; k < 2 * c.qmax; k += 2) row.push_back(k / 2.0f);
    }
    std::vector<T> x;
    for (float f : row) x.push_back(agoq::numeric::from_float<T>(f));
    i64 const n = static_cast<i64>(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(widen(x[i]) == row[i]);
    std::string const msg = check_case(s, 1, n, x, {});
    CHECK_MESSAGE(msg.empty(), s.name(), ": ", msg);

    agoq::quantized_tensor q(s, 1, n);
    agoq::quantize(agoq::host, agoq::matrix_view<T const>(x.data(), 1, n), q.view());
    REQUIRE(stored_scale(std::as_const(q).view(), 0) == 1.0f);
    std::vector<int> const codes = unpacked_codes(std::as_const(q).view());
    for (std::size_t i = c.asym ? 2 : 1; i < codes.size(); ++i) {
      if (c.fp8) {
        CHECK_MESSAGE((codes[i] & 1) == 0, s.name(), ": tie ", row[i], " -> code ", codes[i]);
        CHECK(((codes[i] & 0x80) != 0) == (row[i] < 0));
      } else {
        int const k = codes[i] - z0;
        CHECK_MESSAGE(k % 2 == 0, s.name(), ": tie ", row[i], " -> ", k);
        CHECK(std::fabs(k - row[i]) == 0.5f);
      }
    }
  }
}

TEST_CASE("stochastic rounding is unbiased") {
  // Element x with neighbours a < x < b (one step apart, gap = b - a) decodes to b with
  // probability p = (x - a) / gap, so one draw has mean x and standard deviation
  // gap sqrt(p (1 - p)) <= gap / 2; the mean of N independent draws is within 5 standard errors,
  // 5 gap / (2 sqrt(N)), except with probability 6e-7. Deterministic deviations on top: the
  // 24-bit draws move p by at most 2^-24 (the floor of v + u is exact, codec.hpp); fl(x / s) and
  // the decoding multiply each move the value by at most 2^-24 relative.
  constexpr int draws = 2000;
  std::mt19937_64 rng(0xb1a5);
  std::uniform_real_distribution<float> uni(-0.6f, 1.0f);
  for (std::string const& prefix : code_prefixes()) {
    for (char const* scale : {"f32", "e8m0"}) {
      agoq::spec const s = make_spec(prefix, "row", std::string("sr_") + scale);
      code_info const c = info_of(s);
      i64 const n = 48;
      std::vector<float> x(n);
      for (float& v : x) v = uni(rng);
      x[0] = 1.0f;  // the statistics: absmax 1, min -0.6
      x[1] = -0.6f;
      agoq::quantized_tensor q(s, 1, n);
      std::vector<double> sum(n, 0.0);
      std::vector<float> y(n), first(n);
      std::vector<int> varied(n, 0);
      for (int t = 0; t < draws; ++t) {
        // Half the draws vary the seed, half the offset (in disjoint stretches of the stream).
        agoq::quantize_options const opt =
            t % 2 ? agoq::quantize_options{1000u + static_cast<u64>(t), 0}
                  : agoq::quantize_options{7, static_cast<u64>(t) * n};
        agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 1, n), q.view(), opt);
        agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(y.data(), 1, n));
        for (i64 i = 0; i < n; ++i) {
          sum[i] += y[i];
          if (t == 0) first[i] = y[i];
          varied[i] |= y[i] != first[i];
        }
      }
      agoq::const_quantized_view const v = std::as_const(q).view();
      double const sc = stored_scale(v, 0);
      double const z = c.asym ? v.zero_points[0] : 0;
      int inside = 0, moving = 0;
      for (i64 i = 0; i < n; ++i) {
        double const t = x[i] / sc;
        // Only values inside the grid are unbiased; outside it they clip.
        double const lo = c.fp8 ? -c.fp8->max() : c.asym ? -z : -c.qmax;
        double const hi = c.fp8 ? c.fp8->max() : c.asym ? c.levels - z : c.qmax;
        if (t <= lo || t >= hi) continue;
        ++inside;
        moving += varied[i];
        double const gap = c.fp8 ? c.fp8->ulp(std::fabs(t)) * sc : sc;
        double const bound = 5 * gap / (2 * std::sqrt(double{draws})) + gap * 0x1p-23 +
                             std::ldexp(std::fabs(x[i]), -22);
        double const mean = sum[i] / draws;
        CHECK_MESSAGE(std::fabs(mean - x[i]) <= bound, s.name(), ": x=", x[i], " mean ", mean,
                      " bound ", bound);
      }
      // The asymmetric grid may leave up to half a step of [lo, hi] outside (clipped): int2 loses
      // at most 1/6 of the range there, so well over 3/4 of the values stay inside.
      CHECK_MESSAGE(inside >= n * 3 / 4, s.name());
      CHECK(moving >= inside - 2);  // the draws do move the codes
    }
  }
}

TEST_CASE("stochastic rounding: seeds, offsets and stream positions") {
  std::mt19937_64 rng(0x0ff5e7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  i64 const rows = 3, cols = 200, n = rows * cols;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  agoq::matrix_view<float const> const in(x.data(), rows, cols);
  for (std::string const& prefix : code_prefixes()) {
    agoq::spec const s = make_spec(prefix, "g32", "sr_f32");
    CAPTURE(s.name());
    auto codes_with = [&](agoq::quantize_options opt) {
      agoq::quantized_tensor q(s, rows, cols);
      agoq::quantize(agoq::host, in, q.view(), opt);
      return unpacked_codes(std::as_const(q).view());
    };
    auto differing = [](std::vector<int> const& a, std::vector<int> const& b) {
      i64 d = 0;
      for (std::size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
      return d;
    };
    std::vector<int> const base = codes_with({11, 5});
    // Same seed and offset: the same codes, call after call.
    CHECK(codes_with({11, 5}) == base);
    // Another offset or another seed: other draws. About a third of the codes change (two
    // independent roundings of a value with up-probability p differ with probability
    // 2 p (1 - p)); a tenth is far below that.
    CHECK(differing(codes_with({11, 6}), base) > n / 10);
    CHECK(differing(codes_with({12, 5}), base) > n / 10);
    CHECK(differing(codes_with({11ull << 32, 5}), base) > n / 10);  // the seed's high word keys too

    // Offset k shifts the stream: element i of a call with offset K + k draws position
    // K + k + i, the position of element k + i of a call with offset K. Per-tensor scales (the
    // extremes sit in the shared part) make the two calls' parameters equal.
    agoq::spec const t = make_spec(prefix, "tensor", "sr_f32");
    i64 const k = 37, m = 300;
    std::vector<float> longer(k + m);
    for (i64 i = 0; i < k + m; ++i) longer[i] = i < k ? normal(rng) * 0.1f : normal(rng);
    longer[k] = 9.0f;
    longer[k + 1] = -7.0f;
    u64 const big = 0xfffffffffffffff0ull;  // the positions wrap around 2^64
    for (u64 K : {u64{0}, u64{123456789}, big}) {
      agoq::quantized_tensor a(t, 1, k + m), b(t, 1, m);
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(longer.data(), 1, k + m), a.view(),
                     {99, K});
      agoq::quantize(agoq::host, agoq::matrix_view<float const>(longer.data() + k, 1, m), b.view(),
                     {99, K + k});
      std::vector<int> const ca = unpacked_codes(std::as_const(a).view());
      std::vector<int> const cb = unpacked_codes(std::as_const(b).view());
      CHECK(std::vector<int>(ca.begin() + k, ca.end()) == cb);
      CHECK(check_case(t, 1, m, std::vector<float>(longer.begin() + k, longer.end()),
                       {99, K + k}) == "");
    }
    // The position is the global row-major index: a 3x200 matrix draws like its 1x600 reshape.
    agoq::quantized_tensor mat(t, rows, cols), flat(t, 1, n);
    agoq::quantize(agoq::host, in, mat.view(), {5, 77});
    agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 1, n), flat.view(),
                   {5, 77});
    CHECK(unpacked_codes(std::as_const(mat).view()) == unpacked_codes(std::as_const(flat).view()));
  }
}

TEST_CASE("stochastic rounding keeps -Inf and the bottom of the range at the smallest code") {
  // floor(x / s + u) with x / s <= lo is at most lo for every u < 1, so -Inf (and anything the
  // clamp pins to the bottom) must get the smallest code for every draw, including the draws
  // u > 1 - 2^-18 for which an fp32 sum lo + u rounds up to lo + 1 (int8: |lo| >= 64, so the sum's
  // ulp is 2^-17). Find such a draw with the reference Philox, put a -Inf at that position.
  u64 const seed = 0x5eed;
  u64 pos = 0;
  while (draw_at(seed, pos) <= 1.0f - 0x1p-18f) ++pos;
  for (std::string const& prefix : code_prefixes()) {
    agoq::spec const s = make_spec(prefix, "row", "sr_f32");
    code_info const c = info_of(s);
    if (c.fp8) continue;
    CAPTURE(s.name());
    // 100 and -100 fix the statistics; the -Inf draws position `pos`.
    std::vector<float> const x = {100.0f, -100.0f, -HUGE_VALF};
    agoq::quantized_tensor q(s, 1, 3);
    CHECK(agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), 1, 3), q.view(),
                         {seed, pos - 2}) == 1);
    std::vector<int> const codes = unpacked_codes(std::as_const(q).view());
    CHECK(codes[2] == (c.asym ? 0 : -c.qmax));
    CHECK(codes[1] == codes[2]);  // -100 is the bottom of the range too
  }
}
