#include <agoq/activation/fused.hpp>
#include <agoq/activation/policy.hpp>
#include <agoq/layout/tensor.hpp>

#include <doctest/doctest.h>

#include "statistics_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace agoq::activation;
using agoq::bfloat16;
using agoq::half;
using agoq::matrix_view;
using agoq::quantized_tensor;
using agoq::spec;
namespace numeric = agoq::numeric;

namespace {

/// Unit roundoff of fp32 and gamma_n = n u / (1 - n u), the classic bound on the relative error of
/// n rounded fp32 operations in a chain (Higham, Accuracy and Stability, §3.1).
constexpr double u32 = 1.0 / 16777216.0;
double gamma(double n) { return n * u32 / (1.0 - n * u32); }

/// Half an ulp of T relative to the value (the rounding of the fp32 result to T), and the absolute
/// half-ulp of T's smallest subnormal (half underflows inside the tested range; float and bfloat16
/// share fp32's exponent range, so their fp32 result is already subject to it).
template <class T>
constexpr double unit_round() {
  if constexpr (std::is_same_v<T, bfloat16>) return 1.0 / 256.0;
  if constexpr (std::is_same_v<T, half>) return 1.0 / 2048.0;
  return 0.0;
}
template <class T>
constexpr double subnormal_half() {
  if constexpr (std::is_same_v<T, half>) return 1.0 / 33554432.0;
  return 0.0;
}

template <class T>
double d(T x) {
  return numeric::to_float(x);
}

/// The output y (type T) of an fp32 computation is within `err` of `ref` (the exact value of the
/// same formula on the same inputs, or the unquantized one), plus T's rounding of the result.
template <class T>
bool within(T y, double ref, double err) {
  double const bound = err + unit_round<T>() * (std::abs(ref) + err) + subnormal_half<T>();
  return std::abs(d(y) - ref) <= bound;
}

/// Normal values whose spread changes every 16 elements, so that group scales differ; fixed seed.
template <class T>
std::vector<T> random_tensor(std::int64_t n, std::uint32_t seed, float center = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(-2.0f, 1.5f);
  std::vector<T> x(static_cast<std::size_t>(n));
  float s = 1.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 16 == 0) s = std::exp2(spread(gen));
    x[static_cast<std::size_t>(i)] = numeric::from_float<T>(center + normal(gen) * s);
  }
  return x;
}

template <class T>
matrix_view<T const> cview(std::vector<T> const& v, std::int64_t rows, std::int64_t cols) {
  return matrix_view<T const>(v.data(), rows, cols);
}
template <class T>
matrix_view<T> mview(std::vector<T>& v, std::int64_t rows, std::int64_t cols) {
  return matrix_view<T>(v.data(), rows, cols);
}

/// The saved copy equals agoq::quantize of the same tensor, every byte (codes, scales, zero
/// points and the zeroed padding).
template <class T>
void check_saved_bits(quantized_tensor const& saved, std::vector<T> const& x, std::int64_t rows,
                      std::int64_t cols, agoq::quantize_options opt, std::int64_t nonfinite) {
  quantized_tensor expected(saved.spec(), rows, cols);
  std::int64_t const n = agoq::quantize(agoq::host, cview(x, rows, cols), expected.view(), opt);
  CHECK(n == nonfinite);
  REQUIRE(saved.bytes() == expected.bytes());
  CHECK(std::memcmp(saved.data(), expected.data(), static_cast<std::size_t>(saved.bytes())) == 0);
}

/// The decoded saved tensor and each element's error bound under the scheme: half a step
/// (symmetric codes, nearest rounding), one step (stochastic rounding: floor(v + u) moves less than
/// one step; asymmetric codes: the rounded zero point shifts the grid by up to half a step, so a
/// value at the clamped end may be up to one step away). Symmetric scales are absmax / qmax
/// rounded up, so no finite value is clamped. The fp32 quotient x / s and the decoded product
/// q s are each rounded once, which adds u (|x| + |x̂|) (u the fp32 unit roundoff).
struct decoded {
  std::vector<double> value;
  std::vector<double> err;
};
template <class T>
decoded decode_with_bounds(quantized_tensor const& q, std::vector<T> const& x) {
  std::int64_t const rows = q.rows();
  std::int64_t const cols = q.cols();
  std::vector<float> y(static_cast<std::size_t>(rows * cols));
  agoq::dequantize(agoq::host, q.view(), mview(y, rows, cols));
  bool const half_step = q.spec().code == agoq::code_kind::int_sym &&
                         q.spec().rounding == agoq::rounding_kind::nearest;
  agoq::quantized_layout const l = q.layout();
  decoded out;
  out.value.assign(y.begin(), y.end());
  out.err.resize(y.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      double const s = agoq::load_group_params(q.view(), l.group_of(r, c)).scale;
      std::size_t const k = static_cast<std::size_t>(r * cols + c);
      out.err[k] = (half_step ? 0.5 * s : s) + u32 * (std::abs(d(x[k])) + std::abs(out.value[k]));
    }
  }
  return out;
}

/// The scheme's bound itself holds (a precondition of every propagated bound below).
template <class T>
void check_scheme_bound(decoded const& q, std::vector<T> const& x) {
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) bad += std::abs(q.value[i] - d(x[i])) > q.err[i];
  CHECK(bad == 0);
}

/// Saved-tensor schemes: the two defaults of the policy (row-wise), stochastic and asymmetric
/// variants, FP8, groups whose codes do not end on a byte (SwiGLU and GeLU then save rows in
/// pieces of 1022 and 1032 columns, which the 1100-wide shape crosses), and two groupings that
/// span rows (the separate-pass path).
std::vector<spec> forward_specs() {
  return {int4_g128,
          int8_g128,
          spec::parse("int4_g128_sym_sr_f32"),
          spec::parse("int4_g64_asym_rne_bf16"),
          spec::parse("int2_g128_sym_sr_e8m0"),
          spec::parse("int4_g7_sym_rne_f32"),
          spec::parse("int2_g3_sym_sr_f32"),
          spec::parse("int8_row_sym_rne_f32"),
          spec::parse("fp8e4m3_g32_rne_e8m0"),
          spec::parse("int8_b16x64_sym_rne_f32"),
          spec::parse("int8_col_sym_sr_f32")};
}
/// Integer schemes whose per-element bound decode_with_bounds states (backward tests).
std::vector<spec> backward_specs() {
  return {int4_g128, int8_g128, spec::parse("int4_g128_sym_sr_f32"),
          spec::parse("int4_g64_asym_rne_bf16"), spec::parse("int8_b16x64_sym_rne_f32")};
}

constexpr agoq::quantize_options opts{1234, 77};
constexpr agoq::host_executor portable{false};

/// Shapes: whole groups, a last partial group, and a long row of many groups.
struct shape {
  std::int64_t rows, cols;
};
constexpr shape shapes[] = {{19, 256}, {5, 200}, {3, 1100}};

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// same_bits, except that any two NaNs match: IEEE 754 leaves a NaN's sign and payload open
/// (x86's vector units return the negative default NaN for an invalid operation, its scalar
/// ones pass an operand's NaN on), as fused_parity_test's hashes do.
template <class T>
bool same_bits_but_nan(std::vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bool const nan = std::isnan(d(a[i])) && std::isnan(d(b[i]));
    if (!nan && std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
  }
  return true;
}

// ---- RMSNorm -------------------------------------------------------------------------------

constexpr float eps = 1e-5f;

TEST_CASE_TEMPLATE("rmsnorm_forward: plain output and rstd, saved input bit for bit", T, float,
                   bfloat16, half) {
  for (shape const sh : shapes) {
    auto const x = random_tensor<T>(sh.rows * sh.cols, 1);
    auto const w = random_tensor<T>(sh.cols, 2, 1.0f);
    std::vector<T> y_plain(x.size());
    std::vector<float> rstd_plain(static_cast<std::size_t>(sh.rows));
    CHECK(rmsnorm_forward(agoq::host, cview(x, sh.rows, sh.cols), std::span<T const>(w), eps,
                          mview(y_plain, sh.rows, sh.cols), std::span<float>(rstd_plain)) == 0);
    // Forward bound: the squares and their 16-lane sum (cols/16 + 4 + 1 roundings on positive
    // terms), the mean, + eps, sqrt and the reciprocal (4), then x * rstd * w (2).
    double const g_rstd = gamma(static_cast<double>(sh.cols) / 16 + 9);
    double const g_y = gamma(static_cast<double>(sh.cols) / 16 + 11);
    for (std::int64_t r = 0; r < sh.rows; ++r) {
      double ss = 0;
      for (std::int64_t c = 0; c < sh.cols; ++c)
        ss += d(x[r * sh.cols + c]) * d(x[r * sh.cols + c]);
      double const rs = 1.0 / std::sqrt(ss / static_cast<double>(sh.cols) + eps);
      CHECK(std::abs(rstd_plain[r] - rs) <= g_rstd * rs);
      std::int64_t bad = 0;
      for (std::int64_t c = 0; c < sh.cols; ++c) {
        double const ref = d(x[r * sh.cols + c]) * rs * d(w[c]);
        bad += !within(y_plain[r * sh.cols + c], ref, g_y * std::abs(ref));
      }
      CHECK(bad == 0);
    }
    for (spec const& s : forward_specs()) {
      CAPTURE(s.name());
      for (agoq::host_executor ex : {agoq::host, portable}) {
        quantized_tensor saved(s, sh.rows, sh.cols);
        std::vector<T> y(x.size());
        std::vector<float> rstd(static_cast<std::size_t>(sh.rows));
        std::int64_t const n =
            rmsnorm_forward(ex, cview(x, sh.rows, sh.cols), std::span<T const>(w), eps,
                            mview(y, sh.rows, sh.cols), saved.view(), std::span<float>(rstd), opts);
        CHECK(n == 0);
        CHECK(same_bits(y, y_plain));
        CHECK(same_bits(rstd, rstd_plain));
        check_saved_bits(saved, x, sh.rows, sh.cols, opts, n);
      }
    }
  }
}

TEST_CASE_TEMPLATE("rmsnorm_backward from the quantized input is within the propagated bound", T,
                   float, bfloat16) {
  shape const sh{13, 384};
  std::int64_t const rows = sh.rows, cols = sh.cols;
  auto const x = random_tensor<T>(rows * cols, 3);
  auto const w = random_tensor<T>(cols, 4, 1.0f);
  auto const dy = random_tensor<T>(rows * cols, 5);
  for (spec const& s : backward_specs()) {
    CAPTURE(s.name());
    quantized_tensor saved(s, rows, cols);
    std::vector<T> y(x.size());
    std::vector<float> rstd(static_cast<std::size_t>(rows));
    rmsnorm_forward(agoq::host, cview(x, rows, cols), std::span<T const>(w), eps,
                    mview(y, rows, cols), saved.view(), std::span<float>(rstd), opts);
    decoded const q = decode_with_bounds(saved, x);
    check_scheme_bound(q, x);
    std::vector<T> dx(x.size());
    std::vector<float> dw(static_cast<std::size_t>(cols), 0.0f);
    CHECK(rmsnorm_backward(agoq::host, cview(dy, rows, cols), saved.view(),
                           std::span<float const>(rstd), std::span<T const>(w),
                           mview(dx, rows, cols), std::span<float>(dw)) == 0);
    // Reference: the same formula in double on the exact x with the forward's rstd r. With e_j the
    // scheme's bound on |x̂_j - x_j|, c = (1/H) Σ w_j dy_j x_j moves by at most
    // C_e = (1/H) Σ |w_j dy_j| e_j, so dx_i = r (w_i dy_i - x_i r² c) moves by at most
    // r³ (e_i (|c| + C_e) + |x_i| C_e), and dweight_i = Σ_t dy_ti x_ti r_t by Σ_t |dy_ti| e_ti r_t.
    // The fp32 evaluation on x̂ adds gamma_n times the same formula in absolute values: the
    // 16-lane sum for c (H/16 + 4 + 2 products + 2 for 1/H), r² c (2), and w dy, x̂ k, the
    // difference and the factor r (4); dweight: two products, then one add per token.
    double const g_dx = gamma(static_cast<double>(cols) / 16 + 14);
    double const g_dw = gamma(static_cast<double>(rows) + 2);
    std::vector<double> dw_ref(static_cast<std::size_t>(cols), 0.0);
    std::vector<double> dw_err(static_cast<std::size_t>(cols), 0.0);
    std::vector<double> dw_mag(static_cast<std::size_t>(cols), 0.0);
    std::int64_t bad = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      double const rs = rstd[r];
      double c = 0, ce = 0, ca = 0;
      for (std::int64_t j = 0; j < cols; ++j) {
        std::size_t const k = static_cast<std::size_t>(r * cols + j);
        double const wd = d(w[j]) * d(dy[k]);
        c += wd * d(x[k]);
        ce += std::abs(wd) * q.err[k];
        ca += std::abs(wd * q.value[k]);
      }
      c /= static_cast<double>(cols);
      ce /= static_cast<double>(cols);
      ca /= static_cast<double>(cols);
      for (std::int64_t i = 0; i < cols; ++i) {
        std::size_t const k = static_cast<std::size_t>(r * cols + i);
        double const ref = rs * (d(w[i]) * d(dy[k]) - d(x[k]) * rs * rs * c);
        double const quant =
            rs * rs * rs * (q.err[k] * (std::abs(c) + ce) + std::abs(d(x[k])) * ce);
        double const mag =
            rs * (std::abs(d(w[i]) * d(dy[k])) + std::abs(q.value[k]) * rs * rs * ca);
        bad += !within(dx[k], ref, quant + g_dx * mag);
        dw_ref[i] += d(dy[k]) * d(x[k]) * rs;
        dw_err[i] += std::abs(d(dy[k])) * q.err[k] * rs;
        dw_mag[i] += std::abs(d(dy[k]) * q.value[k] * rs);
      }
    }
    CHECK(bad == 0);
    std::int64_t bad_dw = 0;
    for (std::int64_t i = 0; i < cols; ++i) {
      bad_dw += !within(dw[i], dw_ref[i], dw_err[i] + g_dw * dw_mag[i]);
    }
    CHECK(bad_dw == 0);
  }
}

/// Saved layouts for the two readers of rmsnorm_backward (and, for SwiGLU's and GeLU's backward,
/// the pieces of rows that the row path decodes group by group): the AVX-512 loops that decode each
/// step into registers (row-wise groups of a multiple of 16 columns or one group a row, 8- or
/// 4-bit codes: symmetric, asymmetric, FP8; groups of 48 take steps of 32 and 16) and the row
/// buffer (the portable executor, and under the simd one groups of 24 or 7 columns, 2-bit codes
/// and groups spanning rows).
std::vector<spec> backward_reader_specs() {
  return {int8_g128,
          int4_g128,
          spec::parse("int8_g32_sym_rne_f32"),
          spec::parse("int4_g64_asym_rne_bf16"),
          spec::parse("int8_g128_asym_rne_f32"),
          spec::parse("int8_row_sym_rne_f32"),
          spec::parse("int4_row_sym_rne_f32"),
          spec::parse("fp8e4m3_g32_rne_e8m0"),
          spec::parse("fp8e5m2_g32_rne_e8m0"),
          spec::parse("int8_g48_sym_rne_f32"),
          spec::parse("int8_g24_sym_rne_f32"),
          spec::parse("int4_g7_sym_rne_f32"),
          spec::parse("int2_g128_sym_sr_e8m0"),
          spec::parse("int8_b16x64_sym_rne_f32")};
}

/// Writes +Inf, NaN and 2^127 (a finite scale whose products saturate at FLT_MAX) into the first
/// three fp32 scales of a saved tensor, as only a corrupted buffer has them; returns the number of
/// elements under a non-finite scale. Other scale formats are left as they are.
std::int64_t corrupt_scales(quantized_tensor& t) {
  agoq::quantized_layout const l = t.layout();
  if (t.spec().scale != agoq::scale_format::f32 || l.groups() < 3) return 0;
  float const values[] = {std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::exp2(127.0f)};
  for (std::int64_t g = 0; g < 3; ++g) {
    std::memcpy(t.data() + l.scales_offset + 4 * g, &values[g], 4);
  }
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < l.rows; ++r) {
    for (std::int64_t c = 0; c < l.cols; ++c) n += l.group_of(r, c) < 2;
  }
  return n;
}

TEST_CASE_TEMPLATE(
    "rmsnorm_backward: the same bits and counts from either reader of the saved input", T, float,
    bfloat16, half) {
  float const inf = std::numeric_limits<float>::infinity();
  for (shape const sh : {shape{19, 256}, shape{5, 200}, shape{3, 1100}, shape{4, 40}}) {
    CAPTURE(sh.rows);
    CAPTURE(sh.cols);
    std::int64_t const n = sh.rows * sh.cols;
    auto const x = random_tensor<T>(n, 21);
    auto const w = random_tensor<T>(sh.cols, 22, 1.0f);
    auto dy = random_tensor<T>(n, 23);
    dy[1] = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    dy[static_cast<std::size_t>(sh.cols + 2)] = numeric::from_float<T>(inf);
    dy[static_cast<std::size_t>(n - 1)] = numeric::from_float<T>(-inf);
    std::vector<float> rstd(static_cast<std::size_t>(sh.rows));
    std::vector<T> y(static_cast<std::size_t>(n));
    for (spec const& s : backward_reader_specs()) {
      CAPTURE(s.name());
      quantized_tensor saved(s, sh.rows, sh.cols);
      rmsnorm_forward(agoq::host, cview(x, sh.rows, sh.cols), std::span<T const>(w), eps,
                      mview(y, sh.rows, sh.cols), saved.view(), std::span<float>(rstd), opts);
      for (bool const corrupted : {false, true}) {
        CAPTURE(corrupted);
        std::int64_t const bad_scales = corrupted ? corrupt_scales(saved) : 0;
        std::vector<std::vector<T>> dx;
        std::vector<std::vector<float>> dw;
        for (agoq::host_executor ex : {agoq::host, portable}) {
          dx.emplace_back(static_cast<std::size_t>(n));
          dw.emplace_back(static_cast<std::size_t>(sh.cols), 0.125f);
          CHECK(rmsnorm_backward(ex, cview(dy, sh.rows, sh.cols), saved.view(),
                                 std::span<float const>(rstd), std::span<T const>(w),
                                 mview(dx.back(), sh.rows, sh.cols),
                                 std::span<float>(dw.back())) == 3 + bad_scales);
        }
        CHECK(same_bits_but_nan(dx[0], dx[1]));
        CHECK(same_bits_but_nan(dw[0], dw[1]));
        // In place: dx written over dy.
        std::vector<T> g = dy;
        std::vector<float> dw_in_place(static_cast<std::size_t>(sh.cols), 0.125f);
        CHECK(rmsnorm_backward(agoq::host, cview(g, sh.rows, sh.cols), saved.view(),
                               std::span<float const>(rstd), std::span<T const>(w),
                               mview(g, sh.rows, sh.cols),
                               std::span<float>(dw_in_place)) == 3 + bad_scales);
        CHECK(same_bits(g, dx[0]));
        CHECK(same_bits(dw_in_place, dw[0]));
      }
    }
  }
}

TEST_CASE("rmsnorm_backward: mixed element types give the same bits from either reader") {
  std::int64_t const rows = 7, cols = 96 + 24;
  auto const x = random_tensor<bfloat16>(rows * cols, 31);
  auto const w = random_tensor<float>(cols, 32, 1.0f);
  auto const dy = random_tensor<bfloat16>(rows * cols, 33);
  std::vector<float> rstd(static_cast<std::size_t>(rows));
  std::vector<bfloat16> y(x.size());
  for (spec const& s : {int8_g128, spec::parse("int4_g32_sym_rne_f32")}) {
    CAPTURE(s.name());
    quantized_tensor saved(s, rows, cols);
    rmsnorm_forward(agoq::host, cview(x, rows, cols), std::span<float const>(w), eps,
                    mview(y, rows, cols), saved.view(), std::span<float>(rstd), opts);
    std::vector<half> dx_simd(x.size()), dx_portable(x.size());
    std::vector<float> dw_simd(cols, 0.0f), dw_portable(cols, 0.0f);
    rmsnorm_backward(agoq::host, cview(dy, rows, cols), saved.view(), std::span<float const>(rstd),
                     std::span<float const>(w), mview(dx_simd, rows, cols),
                     std::span<float>(dw_simd));
    rmsnorm_backward(portable, cview(dy, rows, cols), saved.view(), std::span<float const>(rstd),
                     std::span<float const>(w), mview(dx_portable, rows, cols),
                     std::span<float>(dw_portable));
    CHECK(same_bits(dx_simd, dx_portable));
    CHECK(same_bits(dw_simd, dw_portable));
  }
}

TEST_CASE("dweight_block_rows: at least 32 rows a block, at most 512 blocks") {
  using fused_detail::dweight_block_rows;
  CHECK(dweight_block_rows(1) == 32);
  CHECK(dweight_block_rows(16384) == 32);
  CHECK(dweight_block_rows(16385) == 33);
  CHECK(dweight_block_rows(std::int64_t{1} << 31) == std::int64_t{1} << 22);
  for (std::int64_t const rows :
       {std::int64_t{1}, std::int64_t{31}, std::int64_t{16385}, std::int64_t{3000000000}}) {
    CHECK(agoq::detail::ceil_div(rows, dweight_block_rows(rows)) <= 512);
  }
}

TEST_CASE(
    "rmsnorm_backward sums dweight in blocks of rows, each in row order, then in block order") {
  // The order both executors follow (the device test checks the CUDA one against this one): the
  // reference repeats it in fp32 from the decoded input and must match bit for bit, also onto a
  // dweight that already holds values.
  std::int64_t const cols = 24;
  for (std::int64_t rows : {1, 31, 32, 33, 100, 16385}) {
    CAPTURE(rows);
    auto const x = random_tensor<bfloat16>(rows * cols, 11);
    auto const w = random_tensor<bfloat16>(cols, 12, 1.0f);
    auto const dy = random_tensor<bfloat16>(rows * cols, 13);
    quantized_tensor saved(int4_g128, rows, cols);
    std::vector<bfloat16> y(x.size());
    std::vector<float> rstd(static_cast<std::size_t>(rows));
    rmsnorm_forward(agoq::host, cview(x, rows, cols), std::span<bfloat16 const>(w), eps,
                    mview(y, rows, cols), saved.view(), std::span<float>(rstd), opts);
    std::vector<float> xh(x.size());
    agoq::dequantize(agoq::host, saved.view(), matrix_view<float>(xh.data(), rows, cols));
    std::vector<float> dw(static_cast<std::size_t>(cols));
    for (std::int64_t i = 0; i < cols; ++i) dw[i] = 0.25f * static_cast<float>(i) - 3.0f;
    std::vector<float> want = dw;
    std::int64_t const block = fused_detail::dweight_block_rows(rows);
    for (std::int64_t b = 0; b * block < rows; ++b) {
      std::vector<float> p(static_cast<std::size_t>(cols), 0.0f);
      for (std::int64_t r = b * block; r < std::min(rows, (b + 1) * block); ++r) {
        for (std::int64_t i = 0; i < cols; ++i) {
          std::size_t const k = static_cast<std::size_t>(r * cols + i);
          p[i] = std::fma(numeric::to_float(dy[k]) * xh[k], rstd[r], p[i]);
        }
      }
      for (std::int64_t i = 0; i < cols; ++i) want[i] += p[i];
    }
    std::vector<bfloat16> dx(x.size());
    rmsnorm_backward(agoq::host, cview(dy, rows, cols), saved.view(), std::span<float const>(rstd),
                     std::span<bfloat16 const>(w), mview(dx, rows, cols), std::span<float>(dw));
    CHECK(std::memcmp(dw.data(), want.data(), dw.size() * sizeof(float)) == 0);
  }
}

// ---- SwiGLU --------------------------------------------------------------------------------

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

TEST_CASE_TEMPLATE("swiglu_forward: plain output, saved gate and up bit for bit", T, float,
                   bfloat16, half) {
  for (shape const sh : shapes) {
    std::int64_t const n = sh.rows * sh.cols;
    auto const gate = random_tensor<T>(n, 6);
    auto const up = random_tensor<T>(n, 7);
    std::vector<T> out_plain(static_cast<std::size_t>(n));
    swiglu_forward(agoq::host, cview(gate, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                   mview(out_plain, sh.rows, sh.cols));
    // exp (counted as 2 roundings), 1 + e, g / (...) and the product with up: products only, so
    // gamma_5 of the value.
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const ref = silu(d(gate[i])) * d(up[i]);
      bad += !within(out_plain[i], ref, gamma(5) * std::abs(ref));
    }
    CHECK(bad == 0);
    for (spec const& s : forward_specs()) {
      CAPTURE(s.name());
      for (agoq::host_executor ex : {agoq::host, portable}) {
        quantized_tensor sg(s, sh.rows, sh.cols), su(s, sh.rows, sh.cols);
        std::vector<T> out(static_cast<std::size_t>(n));
        std::int64_t const nf =
            swiglu_forward(ex, cview(gate, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                           mview(out, sh.rows, sh.cols), sg.view(), su.view(), opts);
        CHECK(nf == 0);
        CHECK(same_bits(out, out_plain));
        check_saved_bits(sg, gate, sh.rows, sh.cols, opts, 0);
        // up draws the stream positions after gate's.
        check_saved_bits(su, up, sh.rows, sh.cols,
                         {opts.seed, opts.offset + static_cast<std::uint64_t>(n)}, 0);
      }
    }
  }
}

TEST_CASE_TEMPLATE("swiglu_backward from the quantized inputs is within the propagated bound", T,
                   float, bfloat16) {
  std::int64_t const rows = 11, cols = 256, n = rows * cols;
  auto const gate = random_tensor<T>(n, 8);
  auto const up = random_tensor<T>(n, 9);
  auto const dout = random_tensor<T>(n, 10);
  for (spec const& s : backward_specs()) {
    CAPTURE(s.name());
    quantized_tensor sg(s, rows, cols), su(s, rows, cols);
    std::vector<T> out(static_cast<std::size_t>(n));
    swiglu_forward(agoq::host, cview(gate, rows, cols), cview(up, rows, cols),
                   mview(out, rows, cols), sg.view(), su.view(), opts);
    decoded const qg = decode_with_bounds(sg, gate);
    decoded const qu = decode_with_bounds(su, up);
    check_scheme_bound(qg, gate);
    check_scheme_bound(qu, up);
    std::vector<T> dgate(static_cast<std::size_t>(n)), dup(static_cast<std::size_t>(n));
    CHECK(swiglu_backward(agoq::host, cview(dout, rows, cols), sg.view(), su.view(),
                          mview(dgate, rows, cols), mview(dup, rows, cols)) == 0);
    // With h = silu' (sup |h| = 1.09984, sup |h'| = 0.5, at g = 0; a dense scan of [-40, 40]
    // confirms both), the mean value theorem gives |Δdup| <= |dout| 1.0999 e_g and
    // |Δdgate| = |dout| |û h(ĝ) - u h(g)| <= |dout| (1.0999 e_u + |u| 0.5 e_g).
    // fp32 on ĝ, û: the sigmoid takes 4 roundings (exp counted as 2); dup adds 2 products;
    // dgate adds 1 - s, ĝ (1 - s), 1 + ..., s (...), and two products with dout and û (6), all
    // bounded by the formula in absolute values.
    std::int64_t bad_g = 0, bad_u = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const dd = d(dout[i]);
      double const g = d(gate[i]), u = d(up[i]);
      double const gh = qg.value[i], uh = qu.value[i];
      double const sh = sigmoid(gh);
      double const ref_u = dd * silu(g);
      double const ref_g = dd * u * sigmoid(g) * (1.0 + g * (1.0 - sigmoid(g)));
      double const mag_u = std::abs(dd * gh * sh);
      double const mag_g = std::abs(dd * uh) * sh * (1.0 + std::abs(gh) * (1.0 + sh));
      bad_u += !within(dup[i], ref_u, std::abs(dd) * 1.0999 * qg.err[i] + gamma(6) * mag_u);
      bad_g += !within(
          dgate[i], ref_g,
          std::abs(dd) * (1.0999 * qu.err[i] + std::abs(u) * 0.5 * qg.err[i]) + gamma(10) * mag_g);
    }
    CHECK(bad_u == 0);
    CHECK(bad_g == 0);
  }
}

// ---- GeLU ----------------------------------------------------------------------------------

constexpr double gk = 0.7978845608028654;
constexpr double gc = 0.044715;
/// The tanh approximation in double, written with 1 + tanh z = 2 sigmoid(2z) (the same function)
/// because 1 + tanh z cancels in double too for very negative z.
double gelu(double x) { return x * sigmoid(2.0 * gk * (x + gc * x * x * x)); }
/// Its derivative, 1/2 (1 + t) + 1/2 x (1 - t²) k (1 + 3c x²) with the same rewriting
/// (1/2 (1 - t²) = 2 s (1 - s)).
double gelu_grad(double x) {
  double const s = sigmoid(2.0 * gk * (x + gc * x * x * x));
  return s + 2.0 * x * s * (1.0 - s) * gk * (1.0 + 3.0 * gc * x * x);
}

TEST_CASE("the double-precision GeLU reference is the tanh approximation") {
  for (double v = -1.0; v <= 8.0; v += 0.125) {
    double const tanh_form = 0.5 * v * (1.0 + std::tanh(gk * (v + gc * v * v * v)));
    CHECK(std::abs(gelu(v) - tanh_form) <= 1e-14 * (1.0 + std::abs(v)));
  }
}

TEST_CASE_TEMPLATE("gelu_forward: plain output, saved input bit for bit", T, float, bfloat16,
                   half) {
  for (shape const sh : shapes) {
    std::int64_t const n = sh.rows * sh.cols;
    auto const x = random_tensor<T>(n, 11);
    std::vector<T> y_plain(static_cast<std::size_t>(n));
    gelu_forward(agoq::host, cview(x, sh.rows, sh.cols), mview(y_plain, sh.rows, sh.cols));
    // The op computes x sigmoid(2z), z = k (x + c x³) (the same function): 2z takes 5 roundings
    // of same-sign terms and the fp32 constants k and c are each off by one rounding, so
    // e = exp(-2z) is off by 2|z| gamma_7 + 1 ulp relatively and s = 1 / (1 + e) by (1 - s)
    // times that plus 2 roundings; the product with x adds one:
    // |Δy| <= gamma_8 |x| s (1 + 2 |z| (1 - s)). Below 2^-126, s is subnormal or 0 (exp(-2z)
    // overflows past 2z < -88.7): an absolute error of at most 2^-126 in s, |x| 2^-126 in y.
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const v = d(x[i]);
      double const z = gk * (v + gc * v * v * v);
      double const sg = sigmoid(2.0 * z);
      double const mag = std::abs(v) * sg * (1.0 + 2.0 * std::abs(z) * (1.0 - sg));
      bad += !within(y_plain[i], gelu(v), gamma(8) * mag + std::abs(v) * 0x1p-126);
    }
    CHECK(bad == 0);
    for (spec const& s : forward_specs()) {
      CAPTURE(s.name());
      for (agoq::host_executor ex : {agoq::host, portable}) {
        quantized_tensor saved(s, sh.rows, sh.cols);
        std::vector<T> y(static_cast<std::size_t>(n));
        std::int64_t const nf = gelu_forward(ex, cview(x, sh.rows, sh.cols),
                                             mview(y, sh.rows, sh.cols), saved.view(), opts);
        CHECK(nf == 0);
        CHECK(same_bits(y, y_plain));
        check_saved_bits(saved, x, sh.rows, sh.cols, opts, 0);
      }
    }
  }
}

TEST_CASE_TEMPLATE("gelu_backward from the quantized input is within the propagated bound", T,
                   float, bfloat16) {
  std::int64_t const rows = 9, cols = 384, n = rows * cols;
  auto const x = random_tensor<T>(n, 12);
  auto const dy = random_tensor<T>(n, 13);
  for (spec const& s : backward_specs()) {
    CAPTURE(s.name());
    quantized_tensor saved(s, rows, cols);
    std::vector<T> y(static_cast<std::size_t>(n)), dx(static_cast<std::size_t>(n));
    gelu_forward(agoq::host, cview(x, rows, cols), mview(y, rows, cols), saved.view(), opts);
    decoded const q = decode_with_bounds(saved, x);
    check_scheme_bound(q, x);
    CHECK(gelu_backward(agoq::host, cview(dy, rows, cols), saved.view(), mview(dx, rows, cols)) ==
          0);
    // sup |gelu''| of the tanh approximation is sqrt(2/pi) = 0.79789 (at 0; dense scan of
    // [-40, 40]), so |Δdx| <= |dy| 0.7979 e. fp32 on x̂: s = sigmoid(2z) is off by at most
    // gamma_8 s (1 + 2|z|) (as in the forward), which the derivative s + 2 x̂ s (1 - s) p,
    // p = k (1 + 3c x̂²), scales by at most 1 + 2|x̂| p; the derivative's own 8 roundings and the
    // product with dy are bounded by gamma_9 times its absolute-value form. Where s underflows
    // (below 2^-126, as in the forward) its absolute error 2^-126 is scaled by the same factor.
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const v = q.value[i];
      double const z = gk * (v + gc * v * v * v);
      double const sg = sigmoid(2.0 * z);
      double const p = gk * (1.0 + 3.0 * gc * v * v);
      double const mag_dg = sg + 2.0 * std::abs(v) * sg * (1.0 - sg) * p;
      double const mag_s =
          (1.0 + 2.0 * std::abs(v) * p) * (sg * (1.0 + 2.0 * std::abs(z)) * gamma(8) + 0x1p-126);
      double const dd = std::abs(d(dy[i]));
      bad += !within(dx[i], d(dy[i]) * gelu_grad(d(x[i])),
                     dd * 0.7979 * q.err[i] + dd * (gamma(9) * mag_dg + mag_s));
    }
    CHECK(bad == 0);
  }
}

// ---- SwiGLU and GeLU: in place, mixed element types, mixed schemes -----------------------

/// Shapes for the group-by-group saves (each group's parameters made one group ahead): one partial
/// group per row, exactly one group per row, many groups and a partial last one, rows of several
/// pieces (GeLU's op runs a piece of about 1024 columns at a time) and one element.
constexpr shape group_shapes[] = {{4, 100}, {3, 128}, {2, 1000}, {2, 2600}, {1, 1}};

TEST_CASE_TEMPLATE(
    "swiglu_forward and gelu_forward: in place, mixed types and schemes, bit for bit", T, float,
    bfloat16, half) {
  // up of another element type than gate (and out, in place, of either).
  using U = std::conditional_t<std::is_same_v<T, float>, bfloat16, float>;
  spec const sr = spec::parse("int4_g128_sym_sr_f32");
  spec const asym = spec::parse("int8_g64_asym_sr_bf16");
  spec const g64 = spec::parse("int4_g64_sym_rne_f32");
  // Saves of one code, rounding and group width (made together, group by group), and saves that
  // differ in code or width (made row by row).
  std::pair<spec, spec> const pairs[] = {
      {int4_g128, int4_g128}, {int8_g128, int8_g128}, {sr, sr},
      {asym, asym},           {int4_g128, int8_g128}, {int4_g128, g64}};
  for (shape const sh : group_shapes) {
    CAPTURE(sh.cols);
    std::int64_t const n = sh.rows * sh.cols;
    auto const gate = random_tensor<T>(n, 21);
    auto const up = random_tensor<U>(n, 22);
    agoq::quantize_options const up_opts{opts.seed, opts.offset + static_cast<std::uint64_t>(n)};
    std::vector<T> out_t(static_cast<std::size_t>(n));
    std::vector<U> out_u(static_cast<std::size_t>(n));
    swiglu_forward(agoq::host, cview(gate, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                   mview(out_t, sh.rows, sh.cols));
    swiglu_forward(agoq::host, cview(gate, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                   mview(out_u, sh.rows, sh.cols));
    std::vector<T> y_plain(static_cast<std::size_t>(n));
    gelu_forward(agoq::host, cview(gate, sh.rows, sh.cols), mview(y_plain, sh.rows, sh.cols));
    for (auto const& pair : pairs) {
      spec const& gs = pair.first;  // not a structured binding: clang 14 cannot capture one
      spec const& us = pair.second;
      CAPTURE(gs.name());
      CAPTURE(us.name());
      for (agoq::host_executor ex : {agoq::host, portable}) {
        quantized_tensor sg(gs, sh.rows, sh.cols), su(us, sh.rows, sh.cols);
        std::vector<T> g = gate;  // out written over gate
        CHECK(swiglu_forward(ex, cview(g, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                             mview(g, sh.rows, sh.cols), sg.view(), su.view(), opts) == 0);
        CHECK(same_bits(g, out_t));
        check_saved_bits(sg, gate, sh.rows, sh.cols, opts, 0);
        check_saved_bits(su, up, sh.rows, sh.cols, up_opts, 0);
        std::vector<U> u = up;  // out written over up
        CHECK(swiglu_forward(ex, cview(gate, sh.rows, sh.cols), cview(u, sh.rows, sh.cols),
                             mview(u, sh.rows, sh.cols), sg.view(), su.view(), opts) == 0);
        CHECK(same_bits(u, out_u));
        check_saved_bits(sg, gate, sh.rows, sh.cols, opts, 0);
        check_saved_bits(su, up, sh.rows, sh.cols, up_opts, 0);
        std::vector<T> x = gate;  // y written over x
        CHECK(gelu_forward(ex, cview(x, sh.rows, sh.cols), mview(x, sh.rows, sh.cols), sg.view(),
                           opts) == 0);
        CHECK(same_bits(x, y_plain));
        check_saved_bits(sg, gate, sh.rows, sh.cols, opts, 0);
      }
    }
  }
}

TEST_CASE_TEMPLATE(
    "swiglu_backward and gelu_backward: the same bits and counts piece by piece as row by row", T,
    float, bfloat16, half) {
  // The simd executor decodes pieces of about 1024 columns where the row path decodes group by
  // group (several pieces a row at 1100 and 2600 columns; one where gate's and up's pieces differ),
  // the portable executor whole rows.
  float const inf = std::numeric_limits<float>::infinity();
  std::vector<spec> const specs = backward_reader_specs();
  for (shape const sh :
       {shape{19, 256}, shape{5, 200}, shape{3, 1100}, shape{2, 2600}, shape{4, 40}}) {
    CAPTURE(sh.rows);
    CAPTURE(sh.cols);
    std::int64_t const n = sh.rows * sh.cols;
    auto const x = random_tensor<T>(n, 41);
    auto const up = random_tensor<T>(n, 42);
    auto dy = random_tensor<T>(n, 43);
    dy[1] = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    dy[static_cast<std::size_t>(sh.cols + 2)] = numeric::from_float<T>(inf);
    dy[static_cast<std::size_t>(n - 1)] = numeric::from_float<T>(-inf);
    std::vector<T> y(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      spec const& s = specs[i];
      for (spec const& us : {s, specs[(i + 1) % specs.size()]}) {
        CAPTURE(s.name());
        CAPTURE(us.name());
        quantized_tensor sx(s, sh.rows, sh.cols), su(us, sh.rows, sh.cols);
        swiglu_forward(agoq::host, cview(x, sh.rows, sh.cols), cview(up, sh.rows, sh.cols),
                       mview(y, sh.rows, sh.cols), sx.view(), su.view(), opts);
        for (bool const corrupted : {false, true}) {
          CAPTURE(corrupted);
          std::int64_t const bad_x = corrupted ? corrupt_scales(sx) : 0;
          std::int64_t const bad_u = corrupted ? corrupt_scales(su) : 0;
          std::vector<std::vector<T>> dg, du, dx;
          for (agoq::host_executor ex : {agoq::host, portable}) {
            dg.emplace_back(static_cast<std::size_t>(n));
            du.emplace_back(static_cast<std::size_t>(n));
            dx.emplace_back(static_cast<std::size_t>(n));
            CHECK(swiglu_backward(ex, cview(dy, sh.rows, sh.cols), sx.view(), su.view(),
                                  mview(dg.back(), sh.rows, sh.cols),
                                  mview(du.back(), sh.rows, sh.cols)) == 3 + bad_x + bad_u);
            CHECK(gelu_backward(ex, cview(dy, sh.rows, sh.cols), sx.view(),
                                mview(dx.back(), sh.rows, sh.cols)) == 3 + bad_x);
          }
          CHECK(same_bits_but_nan(dg[0], dg[1]));
          CHECK(same_bits_but_nan(du[0], du[1]));
          CHECK(same_bits_but_nan(dx[0], dx[1]));
          // In place: dgate, then dup, then dx written over the gradient.
          std::vector<T> d = dy;
          std::vector<T> other(static_cast<std::size_t>(n));
          CHECK(swiglu_backward(agoq::host, cview(d, sh.rows, sh.cols), sx.view(), su.view(),
                                mview(d, sh.rows, sh.cols),
                                mview(other, sh.rows, sh.cols)) == 3 + bad_x + bad_u);
          CHECK(same_bits(d, dg[0]));
          d = dy;
          CHECK(swiglu_backward(agoq::host, cview(d, sh.rows, sh.cols), sx.view(), su.view(),
                                mview(other, sh.rows, sh.cols),
                                mview(d, sh.rows, sh.cols)) == 3 + bad_x + bad_u);
          CHECK(same_bits(d, du[0]));
          d = dy;
          CHECK(gelu_backward(agoq::host, cview(d, sh.rows, sh.cols), sx.view(),
                              mview(d, sh.rows, sh.cols)) == 3 + bad_x);
          CHECK(same_bits(d, dx[0]));
        }
      }
    }
  }
}

// ---- Residual add --------------------------------------------------------------------------

TEST_CASE_TEMPLATE("residual_add: plain sum, saved sum bit for bit, in place", T, float, bfloat16,
                   half) {
  for (shape const sh : shapes) {
    std::int64_t const n = sh.rows * sh.cols;
    auto const a = random_tensor<T>(n, 14);
    auto const b = random_tensor<T>(n, 15);
    std::vector<T> sum_plain(static_cast<std::size_t>(n));
    residual_add(agoq::host, cview(a, sh.rows, sh.cols), cview(b, sh.rows, sh.cols),
                 mview(sum_plain, sh.rows, sh.cols));
    // One fp32 addition (correctly rounded), then T's rounding.
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double const ref = d(a[i]) + d(b[i]);
      bad += !within(sum_plain[i], ref, gamma(1) * std::abs(ref));
    }
    CHECK(bad == 0);
    for (spec const& s : forward_specs()) {
      CAPTURE(s.name());
      for (agoq::host_executor ex : {agoq::host, portable}) {
        quantized_tensor saved(s, sh.rows, sh.cols);
        std::vector<T> sum = a;  // the residual stream updated in place
        std::int64_t const nf =
            residual_add(ex, cview(sum, sh.rows, sh.cols), cview(b, sh.rows, sh.cols),
                         mview(sum, sh.rows, sh.cols), saved.view(), opts);
        CHECK(nf == 0);
        CHECK(same_bits(sum, sum_plain));
        check_saved_bits(saved, sum, sh.rows, sh.cols, opts, 0);
      }
    }
  }
}

// ---- Code lists -------------------------------------------------------------------------------

/// The bytes of a saved tensor.
std::vector<std::uint8_t> bytes_of(quantized_tensor const& q) {
  return {q.data(), q.data() + q.bytes()};
}

TEST_CASE_TEMPLATE("fused ops compiled for a code list give the same bits and refuse others", T,
                   float, bfloat16) {
  using listed = agoq::type_list<agoq::int_sym<4>, agoq::int_sym<8>>;
  std::int64_t const rows = 5, cols = 384, n = rows * cols;
  auto const x = random_tensor<T>(n, 41);
  auto const u = random_tensor<T>(n, 42);
  auto const w = random_tensor<T>(cols, 43, 1.0f);
  auto const xv = cview(x, rows, cols);
  auto const uv = cview(u, rows, cols);
  std::span<T const> const ws(w);
  // In-loop saves (g128: group_saver under the simd executor), row saves, a separate pass.
  for (spec const& s :
       {int4_g128, spec::parse("int4_g128_sym_sr_f32"), spec::parse("int8_row_sym_rne_f32"),
        spec::parse("int8_b16x64_sym_rne_f32")}) {
    for (agoq::host_executor ex : {agoq::host, portable}) {
      CAPTURE(s.name());
      CAPTURE(ex.simd);
      std::vector<T> y1(static_cast<std::size_t>(n)), y2(y1);
      std::vector<float> r1(rows), r2(rows);
      quantized_tensor a1(s, rows, cols), a2(s, rows, cols), b1(s, rows, cols), b2(s, rows, cols);
      CHECK(rmsnorm_forward(ex, xv, ws, eps, mview(y1, rows, cols), a1.view(), std::span<float>(r1),
                            opts) == rmsnorm_forward<listed>(ex, xv, ws, eps, mview(y2, rows, cols),
                                                             a2.view(), std::span<float>(r2),
                                                             opts));
      CHECK((same_bits(y1, y2) && same_bits(r1, r2) && bytes_of(a1) == bytes_of(a2)));
      CHECK(swiglu_forward(ex, xv, uv, mview(y1, rows, cols), a1.view(), b1.view(), opts) ==
            swiglu_forward<listed>(ex, xv, uv, mview(y2, rows, cols), a2.view(), b2.view(), opts));
      CHECK((same_bits(y1, y2) && bytes_of(a1) == bytes_of(a2) && bytes_of(b1) == bytes_of(b2)));
      CHECK(gelu_forward(ex, xv, mview(y1, rows, cols), a1.view(), opts) ==
            gelu_forward<listed>(ex, xv, mview(y2, rows, cols), a2.view(), opts));
      CHECK((same_bits(y1, y2) && bytes_of(a1) == bytes_of(a2)));
      CHECK(residual_add(ex, xv, uv, mview(y1, rows, cols), a1.view(), opts) ==
            residual_add<listed>(ex, xv, uv, mview(y2, rows, cols), a2.view(), opts));
      CHECK((same_bits(y1, y2) && bytes_of(a1) == bytes_of(a2)));
      // The backward ops from the saved copies (a the residual sum's, b SwiGLU's up), u playing
      // the incoming gradient.
      std::vector<T> z1(y1.size()), z2(y1.size());
      std::vector<float> w1(cols, 0.5f), w2(w1);
      CHECK(rmsnorm_backward(ex, uv, a1.view(), std::span<float const>(r1), ws,
                             mview(y1, rows, cols), std::span<float>(w1)) ==
            rmsnorm_backward<listed>(ex, uv, a1.view(), std::span<float const>(r1), ws,
                                     mview(y2, rows, cols), std::span<float>(w2)));
      CHECK((same_bits(y1, y2) && same_bits(w1, w2)));
      CHECK(swiglu_backward(ex, uv, a1.view(), b1.view(), mview(y1, rows, cols),
                            mview(z1, rows, cols)) ==
            swiglu_backward<listed>(ex, uv, a1.view(), b1.view(), mview(y2, rows, cols),
                                    mview(z2, rows, cols)));
      CHECK((same_bits(y1, y2) && same_bits(z1, z2)));
      CHECK(gelu_backward(ex, uv, b1.view(), mview(y1, rows, cols)) ==
            gelu_backward<listed>(ex, uv, b1.view(), mview(y2, rows, cols)));
      CHECK(same_bits(y1, y2));
    }
  }
  // Another family (even one of SwiGLU's two views): refused before anything is written, for
  // groups within rows and for blocks (which the residual add would quantize after its sums).
  for (char const* name : {"fp8e4m3_g128_rne_f32", "fp8e4m3_b16x64_rne_f32"}) {
    CAPTURE(name);
    quantized_tensor fp8(spec::parse(name), rows, cols);
    quantized_tensor int4(int4_g128, rows, cols);
    std::memset(fp8.data(), 0x5a, static_cast<std::size_t>(fp8.bytes()));
    std::memset(int4.data(), 0x5a, static_cast<std::size_t>(int4.bytes()));
    auto const fp8_bytes = bytes_of(fp8);
    auto const int4_bytes = bytes_of(int4);
    std::vector<T> const y0(static_cast<std::size_t>(n), numeric::from_float<T>(3.0f));
    std::vector<T> y = y0;
    std::vector<float> rstd(rows, 7.0f);
    auto const yv = mview(y, rows, cols);
    char const* refused = "code family outside the code list the call was compiled for";
    CHECK_THROWS_WITH_AS(
        rmsnorm_forward<listed>(agoq::host, xv, ws, eps, yv, fp8.view(), std::span<float>(rstd)),
        doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK_THROWS_WITH_AS(swiglu_forward<listed>(agoq::host, xv, uv, yv, int4.view(), fp8.view()),
                         doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK_THROWS_WITH_AS(gelu_forward<listed>(agoq::host, xv, yv, fp8.view()),
                         doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK_THROWS_WITH_AS(residual_add<listed>(agoq::host, xv, uv, yv, fp8.view()),
                         doctest::Contains(refused), agoq::unsupported_scheme);
    std::vector<T> z = y0;
    std::vector<float> dw(cols, 1.0f);
    CHECK_THROWS_WITH_AS(
        rmsnorm_backward<listed>(agoq::host, xv, fp8.view(), std::span<float const>(rstd), ws, yv,
                                 std::span<float>(dw)),
        doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK_THROWS_WITH_AS(
        swiglu_backward<listed>(agoq::host, xv, int4.view(), fp8.view(), yv, mview(z, rows, cols)),
        doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK_THROWS_WITH_AS(gelu_backward<listed>(agoq::host, xv, fp8.view(), yv),
                         doctest::Contains(refused), agoq::unsupported_scheme);
    CHECK(same_bits(z, y0));
    CHECK(dw == std::vector<float>(cols, 1.0f));
    CHECK(same_bits(y, y0));
    CHECK(rstd == std::vector<float>(rows, 7.0f));
    CHECK(bytes_of(fp8) == fp8_bytes);
    CHECK(bytes_of(int4) == int4_bytes);
  }
}

// ---- Bad input, empty tensors, non-finite values -------------------------------------------

TEST_CASE("fused ops refuse mismatched extents, null pointers and overlapping buffers") {
  std::int64_t const rows = 4, cols = 128;
  std::vector<float> x(rows * cols, 1.0f), y(rows * cols), w(cols, 1.0f), rstd(rows);
  quantized_tensor saved(int4_g128, rows, cols);
  quantized_tensor wrong(int4_g128, rows, cols * 2);
  auto const xv = cview(x, rows, cols);
  auto const yv = mview(y, rows, cols);
  std::span<float const> const ws(w);
  CHECK_THROWS_AS(
      rmsnorm_forward(agoq::host, xv, ws, eps, yv, wrong.view(), std::span<float>(rstd)),
      agoq::invalid_argument);
  CHECK_THROWS_AS(rmsnorm_forward(agoq::host, xv, ws.first(cols - 1), eps, yv, saved.view(),
                                  std::span<float>(rstd)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(rmsnorm_forward(agoq::host, xv, ws, eps, yv, saved.view(),
                                  std::span<float>(rstd).first(rows - 1)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(
      rmsnorm_forward(agoq::host, xv, ws, -1.0f, yv, saved.view(), std::span<float>(rstd)),
      agoq::invalid_argument);
  CHECK_THROWS_AS(rmsnorm_forward(agoq::host, matrix_view<float const>(nullptr, rows, cols), ws,
                                  eps, yv, saved.view(), std::span<float>(rstd)),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(rmsnorm_forward(agoq::host, xv, ws, eps, mview(y, rows - 1, cols), saved.view(),
                                  std::span<float>(rstd)),
                  agoq::invalid_argument);
  // y shifted by one element over x: a partial overlap.
  CHECK_THROWS_AS(
      rmsnorm_forward(agoq::host, xv, ws, eps, matrix_view<float>(x.data() + 1, rows - 1, cols),
                      saved.view(), std::span<float>(rstd)),
      agoq::invalid_argument);
  agoq::quantized_view no_codes = saved.view();
  no_codes.codes = nullptr;
  CHECK_THROWS_AS(gelu_forward(agoq::host, xv, yv, no_codes), agoq::invalid_argument);
  CHECK_THROWS_AS(gelu_forward(agoq::host, xv, mview(y, rows, cols - 1), saved.view()),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(residual_add(agoq::host, xv, cview(y, rows, cols - 1), yv, saved.view()),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(swiglu_forward(agoq::host, xv, xv, yv, saved.view(), wrong.view()),
                  agoq::invalid_argument);
  std::vector<float> g(rows * cols), u(rows * cols);
  CHECK_THROWS_AS(swiglu_backward(agoq::host, cview(x, rows, cols), saved.view(), saved.view(),
                                  mview(g, rows, cols), mview(g, rows, cols)),
                  agoq::invalid_argument);  // dgate and dup the same buffer
  CHECK_THROWS_AS(swiglu_backward(agoq::host, cview(x, rows, cols), saved.view(), wrong.view(),
                                  mview(g, rows, cols), mview(u, rows, cols)),
                  agoq::invalid_argument);
  std::vector<float> dw(cols);
  CHECK_THROWS_AS(
      rmsnorm_backward(agoq::host, cview(x, rows, cols), saved.view(), std::span<float const>(rstd),
                       ws, yv, std::span<float>(dw).first(cols - 1)),
      agoq::invalid_argument);
  CHECK_THROWS_AS(gelu_backward(agoq::host, cview(x, rows, cols), wrong.view(), yv),
                  agoq::invalid_argument);
  agoq::quantized_view bad_spec = saved.view();
  bad_spec.spec.bits = 3;
  CHECK_THROWS_AS(gelu_forward(agoq::host, xv, yv, bad_spec), agoq::invalid_argument);
}

TEST_CASE("fused ops on empty tensors are no-ops") {
  quantized_tensor saved(int4_g128, 0, 128);
  std::vector<float> w(128, 1.0f);
  auto const x = matrix_view<float const>(nullptr, 0, 128);
  auto const y = matrix_view<float>(nullptr, 0, 128);
  CHECK(rmsnorm_forward(agoq::host, x, std::span<float const>(w), eps, y, saved.view(),
                        std::span<float>()) == 0);
  std::vector<float> dw(128, 3.0f);
  CHECK(rmsnorm_backward(agoq::host, x, saved.view(), std::span<float const>(),
                         std::span<float const>(w), y, std::span<float>(dw)) == 0);
  CHECK(dw[0] == 3.0f);
  CHECK(swiglu_forward(agoq::host, x, x, y, saved.view(), saved.view()) == 0);
  CHECK(swiglu_backward(agoq::host, x, saved.view(), saved.view(), y,
                        matrix_view<float>(nullptr, 0, 128)) == 0);
  CHECK(gelu_forward(agoq::host, x, y, saved.view()) == 0);
  CHECK(gelu_backward(agoq::host, x, saved.view(), y) == 0);
  CHECK(residual_add(agoq::host, x, x, y, saved.view()) == 0);
  quantized_tensor none(int4_g128, 3, 0);
  auto const x0 = matrix_view<float const>(nullptr, 3, 0);
  auto const y0 = matrix_view<float>(nullptr, 3, 0);
  std::vector<float> rstd(3, 7.0f);
  CHECK(rmsnorm_forward(agoq::host, x0, std::span<float const>(), eps, y0, none.view(),
                        std::span<float>(rstd)) == 0);
  CHECK(rstd[0] == 7.0f);
  CHECK(gelu_forward(agoq::host, x0, y0, none.view()) == 0);
}

TEST_CASE_TEMPLATE("fused ops count non-finite inputs and keep the saved copy exact", T, float,
                   bfloat16) {
  std::int64_t const rows = 6, cols = 256, n = rows * cols;
  auto x = random_tensor<T>(n, 16);
  float const inf = std::numeric_limits<float>::infinity();
  x[3] = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
  x[300] = numeric::from_float<T>(inf);
  x[1000] = numeric::from_float<T>(-inf);
  auto const other = random_tensor<T>(n, 17);
  auto const w = random_tensor<T>(cols, 18, 1.0f);
  for (spec const& s : {int4_g128, spec::parse("int8_b16x64_sym_rne_f32")}) {
    CAPTURE(s.name());
    quantized_tensor a(s, rows, cols), b(s, rows, cols);
    std::vector<T> y(static_cast<std::size_t>(n));
    std::vector<float> rstd(rows);
    CHECK(rmsnorm_forward(agoq::host, cview(x, rows, cols), std::span<T const>(w), eps,
                          mview(y, rows, cols), a.view(), std::span<float>(rstd), opts) == 3);
    check_saved_bits(a, x, rows, cols, opts, 3);
    CHECK(std::isnan(rstd[0]));  // NaN and Inf in row 0 / row 1 reach their rows only
    CHECK(std::isinf(rstd[1]) == false);
    CHECK(std::isfinite(rstd[5]));
    CHECK(gelu_forward(agoq::host, cview(x, rows, cols), mview(y, rows, cols), a.view(), opts) ==
          3);
    check_saved_bits(a, x, rows, cols, opts, 3);
    CHECK(swiglu_forward(agoq::host, cview(x, rows, cols), cview(x, rows, cols),
                         mview(y, rows, cols), a.view(), b.view(), opts) == 6);
    check_saved_bits(a, x, rows, cols, opts, 3);
    check_saved_bits(b, x, rows, cols, {opts.seed, opts.offset + static_cast<std::uint64_t>(n)}, 3);
    std::vector<T> sum(static_cast<std::size_t>(n));
    CHECK(residual_add(agoq::host, cview(x, rows, cols), cview(other, rows, cols),
                       mview(sum, rows, cols), a.view(), opts) == 3);
    check_saved_bits(a, sum, rows, cols, opts, 3);
    // Backward counts the non-finite incoming gradients.
    std::vector<T> dx(static_cast<std::size_t>(n)), dx2(static_cast<std::size_t>(n));
    std::vector<float> dw(cols, 0.0f);
    CHECK(gelu_backward(agoq::host, cview(x, rows, cols), a.view(), mview(dx, rows, cols)) == 3);
    CHECK(swiglu_backward(agoq::host, cview(x, rows, cols), a.view(), b.view(),
                          mview(dx, rows, cols), mview(dx2, rows, cols)) == 3);
    CHECK(rmsnorm_backward(agoq::host, cview(x, rows, cols), a.view(), std::span<float const>(rstd),
                           std::span<T const>(w), mview(dx, rows, cols),
                           std::span<float>(dw)) == 3);
  }
}

// ---- Measured forms ---------------------------------------------------------------------------

/// The statistics measure gathers of x for scheme s (the measured forms' reference).
template <class T>
tensor_stats measured(agoq::host_executor ex, std::vector<T> const& x, std::int64_t rows,
                      std::int64_t cols, spec const& s) {
  return measure(ex, cview(x, rows, cols), s);
}

/// The same statistics, bit for bit.
bool same_stats(tensor_stats const& a, tensor_stats const& b) {
  return statistics_test::same_bits(a, b);
}

/// A tensor_stats no op writes: a refused call must leave it so.
tensor_stats untouched() {
  tensor_stats st;
  st.elements = 99;
  st.sum_squares = -1.0;
  return st;
}

/// Runs the four forward ops on [rows, cols] tensors, fused and measured, on `ex`, in place or
/// not, and checks that the measured forms give the fused ops' outputs, saved copies, rstd and
/// counts bit for bit, and measure's statistics of the saved tensors (the inputs as they were
/// before the op, the residual add's sum after it).
template <class T>
void check_measured_forms(agoq::host_executor ex, spec const& s, std::vector<T> const& x,
                          std::vector<T> const& u, std::vector<T> const& w, std::int64_t rows,
                          std::int64_t cols, bool in_place) {
  auto const n = static_cast<std::size_t>(rows * cols);
  auto const ws = std::span<T const>(w);
  tensor_stats const stats_x = measured(ex, x, rows, cols, s);
  // Outputs of the fused op (1) and of its measured form (2); in place, the input is the output.
  std::vector<T> y1 = x, y2 = x;
  auto const input = [&](std::vector<T> const& y) { return cview(in_place ? y : x, rows, cols); };
  quantized_tensor a1(s, rows, cols), a2(s, rows, cols), b1(s, rows, cols), b2(s, rows, cols);
  std::vector<float> r1(static_cast<std::size_t>(rows)), r2(r1);
  tensor_stats st = untouched(), su = untouched();
  CHECK(rmsnorm_forward(ex, input(y1), ws, eps, mview(y1, rows, cols), a1.view(),
                        std::span<float>(r1), opts) ==
        rmsnorm_forward_measured(ex, input(y2), ws, eps, mview(y2, rows, cols), a2.view(),
                                 std::span<float>(r2), st, opts));
  CHECK((same_bits(y1, y2) && same_bits(r1, r2) && bytes_of(a1) == bytes_of(a2)));
  CHECK(same_stats(st, stats_x));

  y1 = x;
  y2 = x;
  st = untouched();
  CHECK(gelu_forward(ex, input(y1), mview(y1, rows, cols), a1.view(), opts) ==
        gelu_forward_measured(ex, input(y2), mview(y2, rows, cols), a2.view(), st, opts));
  CHECK((same_bits(y1, y2) && bytes_of(a1) == bytes_of(a2)));
  CHECK(same_stats(st, stats_x));

  y1 = x;  // gate, and in place the output
  y2 = x;
  st = untouched();
  CHECK(swiglu_forward(ex, input(y1), cview(u, rows, cols), mview(y1, rows, cols), a1.view(),
                       b1.view(), opts) ==
        swiglu_forward_measured(ex, input(y2), cview(u, rows, cols), mview(y2, rows, cols),
                                a2.view(), b2.view(), st, su, opts));
  CHECK((same_bits(y1, y2) && bytes_of(a1) == bytes_of(a2) && bytes_of(b1) == bytes_of(b2)));
  CHECK(same_stats(st, stats_x));
  CHECK(same_stats(su, measured(ex, u, rows, cols, s)));

  y1 = x;  // the residual stream, and in place the sum
  y2 = x;
  st = untouched();
  std::vector<T> sum1(n), sum2(n);
  auto const out = [&](std::vector<T>& y, std::vector<T>& sum) {
    return in_place ? mview(y, rows, cols) : mview(sum, rows, cols);
  };
  CHECK(residual_add(ex, input(y1), cview(u, rows, cols), out(y1, sum1), a1.view(), opts) ==
        residual_add_measured(ex, input(y2), cview(u, rows, cols), out(y2, sum2), a2.view(), st,
                              opts));
  std::vector<T> const& sum = in_place ? y2 : sum2;
  CHECK((same_bits(y1, y2) && same_bits(sum1, sum2) && bytes_of(a1) == bytes_of(a2)));
  CHECK(same_stats(st, measured(ex, sum, rows, cols, s)));
}

TEST_CASE_TEMPLATE("measured fused ops: the fused ops' bits and measure's statistics", T, float,
                   bfloat16, half) {
  float const inf = std::numeric_limits<float>::infinity();
  for (shape const sh : shapes) {
    std::int64_t const n = sh.rows * sh.cols;
    auto x = random_tensor<T>(n, 61);
    x[1] = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    x[static_cast<std::size_t>(n / 2)] = numeric::from_float<T>(inf);
    x[static_cast<std::size_t>(n - 1)] = numeric::from_float<T>(-inf);
    auto const u = random_tensor<T>(n, 62);
    auto const w = random_tensor<T>(sh.cols, 63, 1.0f);
    // Row by row (groups in rows, on both executors' savers) and the separate passes of the
    // groupings that span rows.
    for (spec const& s : forward_specs()) {
      for (agoq::host_executor ex : {agoq::host, portable}) {
        for (bool in_place : {false, true}) {
          CAPTURE(sh.rows);
          CAPTURE(sh.cols);
          CAPTURE(s.name());
          CAPTURE(ex.simd);
          CAPTURE(in_place);
          check_measured_forms(ex, s, x, u, w, sh.rows, sh.cols, in_place);
        }
      }
    }
  }
}

TEST_CASE("measured fused ops: sets of rows, and rows too long to measure beside the op") {
  // 300 rows of 4096: 128 rows a set (host_piece_slots / 32 slices a row), so three sets; then
  // one row of 1,100,000 columns (8594 groups of 128, more slices than a set holds), measured in
  // a pass of its own (before the op, after it for the residual add's sum).
  for (shape const sh : {shape{300, 4096}, shape{1, 1100000}}) {
    std::int64_t const n = sh.rows * sh.cols;
    auto const x = random_tensor<bfloat16>(n, 64);
    auto const u = random_tensor<bfloat16>(n, 65);
    auto const w = random_tensor<bfloat16>(sh.cols, 66, 1.0f);
    for (spec const& s : {int8_g128, spec::parse("int4_row_sym_rne_f32")}) {
      CAPTURE(sh.cols);
      CAPTURE(s.name());
      check_measured_forms(agoq::host, s, x, u, w, sh.rows, sh.cols, true);
    }
  }
}

TEST_CASE("measured fused ops: empty tensors, and refused calls write nothing") {
  std::vector<float> w(128, 1.0f);
  std::span<float const> const ws(w);
  for (std::int64_t rows : {0, 3}) {
    std::int64_t const cols = rows == 0 ? 128 : 0;
    CAPTURE(rows);
    quantized_tensor saved(int4_g128, rows, cols);
    auto const x = matrix_view<float const>(nullptr, rows, cols);
    auto const y = matrix_view<float>(nullptr, rows, cols);
    tensor_stats const empty = measure(agoq::host, x, int4_g128);
    CHECK(empty.elements == 0);
    std::vector<float> rstd(static_cast<std::size_t>(rows), 7.0f);
    tensor_stats st = untouched(), su = untouched();
    CHECK(rmsnorm_forward_measured(agoq::host, x, ws.first(static_cast<std::size_t>(cols)), eps, y,
                                   saved.view(), std::span<float>(rstd), st) == 0);
    CHECK(same_stats(st, empty));
    CHECK(rstd == std::vector<float>(static_cast<std::size_t>(rows), 7.0f));
    st = untouched();
    CHECK(swiglu_forward_measured(agoq::host, x, x, y, saved.view(), saved.view(), st, su) == 0);
    CHECK((same_stats(st, empty) && same_stats(su, empty)));
    st = untouched();
    CHECK(gelu_forward_measured(agoq::host, x, y, saved.view(), st) == 0);
    CHECK(same_stats(st, empty));
    st = untouched();
    CHECK(residual_add_measured(agoq::host, x, x, y, saved.view(), st) == 0);
    CHECK(same_stats(st, empty));
  }
  // Mismatched extents, a partial overlap, a code family outside the code list.
  std::int64_t const rows = 4, cols = 128;
  std::vector<float> x(rows * cols, 1.0f), y(rows * cols), rstd(rows);
  auto const xv = cview(x, rows, cols);
  auto const yv = mview(y, rows, cols);
  quantized_tensor saved(int4_g128, rows, cols), wrong(int4_g128, rows, cols * 2);
  quantized_tensor fp8(spec::parse("fp8e4m3_g128_rne_f32"), rows, cols);
  using listed = agoq::type_list<agoq::int_sym<4>, agoq::int_sym<8>>;
  tensor_stats st = untouched(), su = untouched();
  CHECK_THROWS_AS(rmsnorm_forward_measured(agoq::host, xv, ws, eps, yv, wrong.view(),
                                           std::span<float>(rstd), st),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(rmsnorm_forward_measured<listed>(agoq::host, xv, ws, eps, yv, fp8.view(),
                                                   std::span<float>(rstd), st),
                  agoq::unsupported_scheme);
  CHECK_THROWS_AS(
      swiglu_forward_measured(agoq::host, xv, xv, yv, saved.view(), wrong.view(), st, su),
      agoq::invalid_argument);
  CHECK_THROWS_AS(
      gelu_forward_measured(agoq::host, xv, matrix_view<float>(x.data() + 1, rows - 1, cols),
                            saved.view(), st),
      agoq::invalid_argument);
  CHECK_THROWS_AS(residual_add_measured<listed>(agoq::host, xv, xv, yv, fp8.view(), st),
                  agoq::unsupported_scheme);
  CHECK(same_stats(st, untouched()));
  CHECK(same_stats(su, untouched()));
}

}  // namespace
