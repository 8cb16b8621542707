/// \file
/// The CPU executor's fused producer/consumer ops of the activation path (DESIGN §5): RMSNorm,
/// SwiGLU, GeLU (tanh approximation) and the residual add. A forward op writes its output *and*
/// the quantized copy of the tensor its backward needs in one pass over the rows, quantizing each
/// row's groups while the row is in the L1 cache; the backward op reads codes + scales directly,
/// decoding one row at a time into a row-sized fp32 buffer (no full-size dequantized temporary).
///
/// Tensors are row-major [tokens, features]; elements are float, bfloat16 or half; every op
/// computes in fp32. The saved copy is bit-identical to agoq::quantize of the same tensor with the
/// same quantize_options (it calls the same segment loops of detail/host). Row-wise fusion needs
/// groups that lie within one row (per_row, per_group<G>, or any grouping of a one-row tensor);
/// for groupings that span rows (per_tensor, per_column, blocks) the op quantizes the saved tensor
/// in a separate pass with agoq::quantize, which gives the same bits at the cost of a second read.
///
/// Each forward op also exists without the saved view (the plain op, same arithmetic, same output
/// bits). Every function is host only and synchronous, and throws agoq::invalid_argument on
/// mismatched extents, null pointers, invalid specs or partially overlapping buffers; an output
/// may be the very same buffer as an input of its op (in place), any other overlap is refused.
/// Empty tensors are no-ops. The CUDA versions are not built yet.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/host/engine.hpp"
#include "../error.hpp"
#include "../layout/layout.hpp"
#include "../layout/matrix.hpp"
#include "../layout/params.hpp"
#include "../layout/view.hpp"
#include "../numeric/element.hpp"
#include "../quantize.hpp"
#include "../scheme/dispatch.hpp"

namespace agoq::activation {

namespace fused_detail {

using agoq::detail::host::scratch;

/// Quantizes columns [c0, c1) of row r of a row-wise saved tensor (tile.rows == 1) from `row` (the
/// whole row): each group's statistics, parameters and codes, exactly as detail::host::quantize
/// computes them (the same segment loops and the same stream positions offset + r * cols + c).
/// c0 is a group boundary whose codes start on a byte, c1 a group boundary or cols. Returns the
/// non-finite count of the range.
template <code_format Code, rounding_mode Rounding, class T>
std::int64_t quantize_row(T const* row, std::int64_t r, std::int64_t c0, std::int64_t c1,
                          quantized_view const& out, quantized_layout const& l, std::uint64_t seed,
                          std::uint64_t offset, bool simd, scratch& s) {
  namespace h = agoq::detail::host;
  constexpr bool stochastic = Rounding::kind == rounding_kind::stochastic;
  std::int64_t const g = l.tile.cols;
  std::int64_t const n_range = c1 - c0;
  std::uint64_t const first = offset + static_cast<std::uint64_t>(r * l.cols + c0);
  std::uint8_t* codes = out.codes + r * l.code_row_bytes + c0 * l.bits / 8;
  std::int64_t const k0 = r * l.group_grid_cols + c0 / g;
  std::int64_t nonfinite = 0;
  if constexpr (stochastic) {
    s.draws.resize(static_cast<std::size_t>(n_range));
    if (simd) {
      h::uniforms_simd(seed, first, n_range, s.draws.data());
    } else {
      h::uniforms(seed, first, n_range, s.draws.data());
    }
  }
#if defined(AGOQ_HOST_AVX512)
  if constexpr (Code::bits == 8 || Code::bits == 4) {
    if (simd && h::row_groups(l)) {  // packed codes straight from registers, group by group
      for (std::int64_t b = c0, k = k0; b < c1; b += g, ++k) {
        std::int64_t const n = std::min(g, c1 - b);
        h::segment_stats const st = h::stats_segment_simd<Code>(row + b, n);
        nonfinite += st.nonfinite;
        group_params const p = make_group_params<Code>(out.spec.scale, st.stats);
        store_group_params(out, k, p);
        float const* u = stochastic ? s.draws.data() + (b - c0) : nullptr;
        h::encode_simd<Code, Rounding::kind, Code::bits>(row + b, n, p, u,
                                                         codes + (b - c0) * Code::bits / 8);
      }
      return nonfinite;
    }
  }
#endif
  std::uint8_t* q = codes;
  if (l.bits != 8) {
    s.codes.resize(static_cast<std::size_t>(n_range));
    q = s.codes.data();
  }
  for (std::int64_t b = c0, k = k0; b < c1; b += g, ++k) {
    std::int64_t const n = std::min(g, c1 - b);
    h::segment_stats const st =
        simd ? h::stats_segment_simd<Code>(row + b, n) : h::stats_segment<Code>(row + b, n);
    nonfinite += st.nonfinite;
    group_params const p = make_group_params<Code>(out.spec.scale, st.stats);
    store_group_params(out, k, p);
    std::uint8_t* qb = q + (b - c0);
    if constexpr (stochastic) {
      float const* u = s.draws.data() + (b - c0);
      if (simd) {
        h::encode_stochastic_segment_simd<Code>(row + b, n, p, u, qb);
      } else {
        h::encode_stochastic_segment<Code>(row + b, n, p, u, qb);
      }
    } else if (simd) {
      h::encode_nearest_segment_simd<Code>(row + b, n, p, qb);
    } else {
      h::encode_nearest_segment<Code>(row + b, n, p, qb);
    }
  }
  if (l.bits != 8) {
    if (simd) {
      h::pack_codes_simd(q, n_range, l.bits, codes);
    } else {
      h::pack_codes(q, n_range, l.bits, codes);
    }
  }
  return nonfinite;
}

/// Decodes row r of a saved tensor (any grouping) into y[0, cols) in fp32; returns the number of
/// values decoded under a non-finite stored scale (only a corrupted buffer has such scales).
template <code_format Code>
std::int64_t decode_row(const_quantized_view const& in, quantized_layout const& l, std::int64_t r,
                        bool simd, std::vector<std::uint8_t>& unpacked, float* y) {
  namespace h = agoq::detail::host;
  std::int64_t const g = l.tile.cols;
  std::int64_t const cols = l.cols;
  std::uint8_t const* src = in.codes + r * l.code_row_bytes;
  std::int64_t nonfinite = 0;
#if defined(AGOQ_HOST_AVX512)
  if constexpr (Code::bits == 8 || Code::bits == 4) {
    if (simd && (g >= cols || (g * Code::bits) % 8 == 0)) {  // every group starts on a byte
      for (std::int64_t b = 0; b < cols; b += g) {
        std::int64_t const n = std::min(g, cols - b);
        group_params const p = load_group_params(in, l.group_of(r, b));
        if (!numeric::is_finite(p.scale)) nonfinite += n;
        h::decode_simd<Code, Code::bits>(src + b * Code::bits / 8, n, p, y + b);
      }
      return nonfinite;
    }
  }
#endif
  std::uint8_t const* q = src;
  if (l.bits != 8) {
    unpacked.resize(static_cast<std::size_t>(cols));
    if (simd) {
      h::unpack_codes_simd(src, cols, l.bits, unpacked.data());
    } else {
      h::unpack_codes(src, cols, l.bits, unpacked.data());
    }
    q = unpacked.data();
  }
  for (std::int64_t b = 0; b < cols; b += g) {
    std::int64_t const n = std::min(g, cols - b);
    group_params const p = load_group_params(in, l.group_of(r, b));
    if (!numeric::is_finite(p.scale)) nonfinite += n;
    if (simd) {
      h::decode_segment_simd<Code>(q + b, n, p, y + b);
    } else {
      h::decode_segment<Code>(q + b, n, p, y + b);
    }
  }
  return nonfinite;
}

/// Writes the saved copy of a [rows, cols] tensor of element type T: row by row where the
/// grouping allows (row()), else in one agoq::quantize pass (whole()). Default-constructed, it
/// saves nothing (the plain op).
template <class T>
class row_saver {
 public:
  row_saver() = default;

  row_saver(host_executor ex, quantized_view v, quantize_options opt)
      : ex_(ex), view_(v), layout_(v.layout()), opt_(opt), active_(true) {
    simd_ = ex.simd && agoq::detail::host::simd_available;
    if (layout_.elements() == 0 || layout_.tile.rows != 1) return;
    fn_ = dispatch_code(v.spec, [&](auto code) {
      return dispatch_rounding(v.spec, [&](auto rounding) -> row_fn {
        return &quantize_row<decltype(code), decltype(rounding), T>;
      });
    });
  }

  /// Quantizes row r (row-wise groupings only; otherwise does nothing).
  std::int64_t row(T const* x, std::int64_t r) { return range(x, r, 0, layout_.cols); }

  /// Quantizes columns [c0, c1) of row r, x being the whole row (row-wise groupings only;
  /// otherwise does nothing); c0 and c1 as quantize_row requires.
  std::int64_t range(T const* x, std::int64_t r, std::int64_t c0, std::int64_t c1) {
    return fn_ ? fn_(x, r, c0, c1, view_, layout_, opt_.seed, opt_.offset, simd_, scratch_) : 0;
  }

  /// Quantizes the whole tensor when its groups span rows (otherwise does nothing).
  std::int64_t whole(T const* x) {
    if (!active_ || fn_ != nullptr || layout_.elements() == 0) return 0;
    return agoq::quantize(ex_, matrix_view<T const>(x, layout_.rows, layout_.cols), view_, opt_);
  }

 private:
  using row_fn = std::int64_t (*)(T const*, std::int64_t, std::int64_t, std::int64_t,
                                  quantized_view const&, quantized_layout const&, std::uint64_t,
                                  std::uint64_t, bool, scratch&);
  host_executor ex_{};
  quantized_view view_{};
  quantized_layout layout_{};
  quantize_options opt_{};
  bool active_ = false;
  bool simd_ = false;
  row_fn fn_ = nullptr;
  scratch scratch_;
};

/// Reads a saved tensor row by row, decoded into a row-sized fp32 buffer.
class row_loader {
 public:
  row_loader(host_executor ex, const_quantized_view v)
      : view_(v), layout_(v.layout()), simd_(ex.simd && agoq::detail::host::simd_available) {
    if (layout_.elements() == 0) return;
    row_.resize(static_cast<std::size_t>(layout_.cols));
    fn_ = dispatch_code(v.spec, [](auto code) -> row_fn { return &decode_row<decltype(code)>; });
  }

  /// Row r decoded; adds the values decoded under a non-finite scale to `bad_scales`.
  float const* row(std::int64_t r, std::int64_t& bad_scales) {
    bad_scales += fn_(view_, layout_, r, simd_, unpacked_, row_.data());
    return row_.data();
  }

 private:
  using row_fn = std::int64_t (*)(const_quantized_view const&, quantized_layout const&,
                                  std::int64_t, bool, std::vector<std::uint8_t>&, float*);
  const_quantized_view view_;
  quantized_layout layout_;
  bool simd_;
  row_fn fn_ = nullptr;
  std::vector<std::uint8_t> unpacked_;
  std::vector<float> row_;
};

/// Throws unless `m` is [rows, cols] with data for its elements.
template <class T>
void check_matrix(matrix_view<T> m, std::int64_t rows, std::int64_t cols, char const* what,
                  char const* name) {
  agoq::detail::check_extents(m.extent(0), m.extent(1), rows, cols,
                              (std::string(what) + " (" + name + ")").c_str(), "the input");
  agoq::detail::check_data(m.data_handle(), m.size(),
                           (std::string(what) + " (" + name + ")").c_str());
}

/// Throws unless the saved view is valid and [rows, cols].
template <class Byte>
void check_saved(basic_quantized_view<Byte> const& v, std::int64_t rows, std::int64_t cols,
                 char const* what, char const* name) {
  v.validate();
  agoq::detail::check_extents(rows, cols, v.rows, v.cols,
                              (std::string(what) + " (" + name + ")").c_str());
}

/// Throws unless the vector has n elements and data for them.
template <class T>
void check_vector(std::span<T> s, std::int64_t n, char const* what, char const* name) {
  AGOQ_EXPECTS(static_cast<std::int64_t>(s.size()) == n,
               std::string(what) + ": " + name + " has " + std::to_string(s.size()) +
                   " elements, expected " + std::to_string(n));
  agoq::detail::check_data(s.data(), n, (std::string(what) + " (" + name + ")").c_str());
}

/// A byte range of an operand.
struct span_bytes {
  void const* data;
  std::int64_t bytes;
};

template <class T>
span_bytes bytes_of(T* p, std::int64_t n) noexcept {
  return {static_cast<void const*>(p), n * static_cast<std::int64_t>(sizeof(T))};
}

/// Throws when `out` overlaps `in`, unless `exact_allowed` and they are the very same buffer.
inline void check_overlap(span_bytes out, span_bytes in, bool exact_allowed, char const* what) {
  if (out.bytes == 0 || in.bytes == 0) return;
  auto const* o = static_cast<unsigned char const*>(out.data);
  auto const* i = static_cast<unsigned char const*>(in.data);
  bool const disjoint = o + out.bytes <= i || i + in.bytes <= o;
  bool const same = exact_allowed && o == i && out.bytes == in.bytes;
  AGOQ_EXPECTS(disjoint || same, std::string(what) + ": an output overlaps another operand" +
                                     (exact_allowed ? " without being the same buffer" : ""));
}

/// Sum of v(i) for i in [0, n) in fp32 over 16 independent lanes (vectorizable), then a fixed
/// pairwise reduction of the lanes.
template <class F>
float lane_sum(std::int64_t n, F&& v) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int j = 0; j < lanes; ++j) acc[j] += v(i + j);
  }
  for (int j = 0; i + j < n; ++j) acc[j] += v(i + j);
  for (int w = lanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

/// 1 / (1 + e^-g).
inline float sigmoid(float g) noexcept { return 1.0f / (1.0f + std::exp(-g)); }

/// sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GeLU.
inline constexpr float gelu_k = 0.7978845608028654f;
inline constexpr float gelu_c = 0.044715f;

template <class In, class Out>
void check_rmsnorm_args(matrix_view<In> x, matrix_view<Out> y, std::int64_t hidden,
                        std::int64_t weight_size, float eps, char const* what) {
  check_matrix(x, x.extent(0), x.extent(1), what, "x");
  check_matrix(y, x.extent(0), x.extent(1), what, "y");
  AGOQ_EXPECTS(weight_size == hidden, std::string(what) + ": weight has " +
                                          std::to_string(weight_size) + " elements, expected " +
                                          std::to_string(hidden));
  AGOQ_EXPECTS(std::isfinite(eps) && eps >= 0.0f,
               std::string(what) + ": eps must be finite and non-negative");
}

template <class X, class W, class Y>
std::int64_t rmsnorm_forward(matrix_view<X> x, std::span<W> weight, float eps, matrix_view<Y> y,
                             std::span<float> rstd, row_saver<std::remove_const_t<X>>& saver) {
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  char const* what = "rmsnorm_forward";
  check_vector(rstd, rows, what, "rstd");
  check_overlap(bytes_of(y.data_handle(), y.size()), bytes_of(x.data_handle(), x.size()), true,
                what);
  check_overlap(bytes_of(rstd.data(), rows), bytes_of(x.data_handle(), x.size()), false, what);
  check_overlap(bytes_of(rstd.data(), rows), bytes_of(y.data_handle(), y.size()), false, what);
  check_overlap(bytes_of(y.data_handle(), y.size()), bytes_of(weight.data(), cols), false, what);
  if (x.size() == 0) return 0;
  auto const* xp = x.data_handle();
  auto* yp = y.data_handle();
  W const* w = weight.data();
  using YT = std::remove_const_t<Y>;
  std::int64_t nonfinite = saver.whole(xp);
  float const inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* xr = xp + r * cols;
    // The sum of squares streams the row in from memory; the quantization then reads it hot.
    float const ss = lane_sum(cols, [&](std::int64_t i) {
      float const v = numeric::to_float(xr[i]);
      return v * v;
    });
    nonfinite += saver.row(xr, r);
    float const rs = 1.0f / std::sqrt(ss * inv_cols + eps);
    rstd[static_cast<std::size_t>(r)] = rs;
    YT* yr = yp + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      yr[i] = numeric::from_float<YT>(numeric::to_float(xr[i]) * rs * numeric::to_float(w[i]));
    }
  }
  return nonfinite;
}

template <class G, class U, class O>
std::int64_t swiglu_forward(matrix_view<G> gate, matrix_view<U> up, matrix_view<O> out,
                            row_saver<std::remove_const_t<G>>& gate_saver,
                            row_saver<std::remove_const_t<U>>& up_saver) {
  std::int64_t const rows = gate.extent(0);
  std::int64_t const cols = gate.extent(1);
  char const* what = "swiglu_forward";
  check_matrix(gate, rows, cols, what, "gate");
  check_matrix(up, rows, cols, what, "up");
  check_matrix(out, rows, cols, what, "out");
  auto const o = bytes_of(out.data_handle(), out.size());
  check_overlap(o, bytes_of(gate.data_handle(), gate.size()), true, what);
  check_overlap(o, bytes_of(up.data_handle(), up.size()), true, what);
  if (gate.size() == 0) return 0;
  using OT = std::remove_const_t<O>;
  auto const* gp = gate.data_handle();
  auto const* up_p = up.data_handle();
  OT* op = out.data_handle();
  std::int64_t nonfinite = gate_saver.whole(gp) + up_saver.whole(up_p);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* gr = gp + r * cols;
    auto const* ur = up_p + r * cols;
    nonfinite += gate_saver.row(gr, r) + up_saver.row(ur, r);
    OT* orow = op + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const g = numeric::to_float(gr[i]);
      orow[i] = numeric::from_float<OT>(g * sigmoid(g) * numeric::to_float(ur[i]));
    }
  }
  return nonfinite;
}

template <class X, class Y>
std::int64_t gelu_forward(matrix_view<X> x, matrix_view<Y> y,
                          row_saver<std::remove_const_t<X>>& saver) {
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  char const* what = "gelu_forward";
  check_matrix(x, rows, cols, what, "x");
  check_matrix(y, rows, cols, what, "y");
  check_overlap(bytes_of(y.data_handle(), y.size()), bytes_of(x.data_handle(), x.size()), true,
                what);
  if (x.size() == 0) return 0;
  using YT = std::remove_const_t<Y>;
  auto const* xp = x.data_handle();
  YT* yp = y.data_handle();
  std::int64_t nonfinite = saver.whole(xp);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* xr = xp + r * cols;
    nonfinite += saver.row(xr, r);
    YT* yr = yp + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const v = numeric::to_float(xr[i]);
      // (1 + tanh z) / 2 = sigmoid(2z): one exp, no cancellation (and several times faster
      // than tanhf).
      float const s = sigmoid(2.0f * gelu_k * (v + gelu_c * v * v * v));
      yr[i] = numeric::from_float<YT>(v * s);
    }
  }
  return nonfinite;
}

template <class A, class B, class S>
std::int64_t residual_add(matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                          row_saver<S>& saver) {
  std::int64_t const rows = a.extent(0);
  std::int64_t const cols = a.extent(1);
  char const* what = "residual_add";
  check_matrix(a, rows, cols, what, "a");
  check_matrix(b, rows, cols, what, "b");
  check_matrix(sum, rows, cols, what, "sum");
  auto const s = bytes_of(sum.data_handle(), sum.size());
  check_overlap(s, bytes_of(a.data_handle(), a.size()), true, what);
  check_overlap(s, bytes_of(b.data_handle(), b.size()), true, what);
  if (a.size() == 0) return 0;
  auto const* ap = a.data_handle();
  auto const* bp = b.data_handle();
  S* sp = sum.data_handle();
  std::int64_t nonfinite = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* ar = ap + r * cols;
    auto const* br = bp + r * cols;
    S* sr = sp + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      sr[i] = numeric::from_float<S>(numeric::to_float(ar[i]) + numeric::to_float(br[i]));
    }
    nonfinite += saver.row(sr, r);
  }
  return nonfinite + saver.whole(sp);
}

/// Counts the non-finite values of a gradient row.
template <class T>
std::int64_t count_nonfinite(T const* x, std::int64_t n) noexcept {
  std::int64_t c = 0;
  for (std::int64_t i = 0; i < n; ++i) c += numeric::is_finite(numeric::to_float(x[i])) ? 0 : 1;
  return c;
}

}  // namespace fused_detail

/// Element types the fused ops read (possibly const).
template <class T>
concept fused_input = element_type<std::remove_const_t<T>>;

/// Element types the fused ops write.
template <class T>
concept fused_output = element_type<T> && !std::is_const_v<T>;

/// RMSNorm forward, fused with saving its input: y = x * rstd * weight with
/// rstd[t] = 1 / sqrt(mean_j x[t, j]^2 + eps), computed in fp32 (the sum of squares over 16
/// lanes), and `saved_x` written with the quantized copy of x (scheme from its spec) bit-identical
/// to agoq::quantize(ex, x, saved_x, opt). x, y: [tokens, hidden]; weight: [hidden]; rstd:
/// [tokens] fp32 (kept for the backward). Returns the non-finite count of x (as agoq::quantize).
/// y may be x itself. Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec, a negative
/// or non-finite eps, or partially overlapping buffers.
template <fused_input X, fused_input W, fused_output Y>
std::int64_t rmsnorm_forward(host_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                             matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                             quantize_options opt = {}) {
  fused_detail::check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                                   "rmsnorm_forward");
  fused_detail::check_saved(saved_x, x.extent(0), x.extent(1), "rmsnorm_forward", "saved_x");
  fused_detail::check_vector(weight, x.extent(1), "rmsnorm_forward", "weight");
  fused_detail::row_saver<std::remove_const_t<X>> saver(ex, saved_x, opt);
  return fused_detail::rmsnorm_forward(x, weight, eps, y, rstd, saver);
}

/// The plain RMSNorm forward (no saved copy): the same arithmetic and output bits as the fused
/// rmsnorm_forward. Returns 0. Host only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input X, fused_input W, fused_output Y>
std::int64_t rmsnorm_forward(host_executor, matrix_view<X> x, std::span<W> weight, float eps,
                             matrix_view<Y> y, std::span<float> rstd) {
  fused_detail::check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                                   "rmsnorm_forward");
  fused_detail::check_vector(weight, x.extent(1), "rmsnorm_forward", "weight");
  fused_detail::row_saver<std::remove_const_t<X>> none;
  return fused_detail::rmsnorm_forward(x, weight, eps, y, rstd, none);
}

/// RMSNorm backward from the quantized input: with x̂ the decoded saved_x (fp32, row by row) and
/// r = rstd[t] from the forward, c = (1/hidden) sum_j weight_j dy_j x̂_j,
/// dx_i = r (weight_i dy_i - x̂_i r^2 c) and dweight_i += dy_i x̂_i r (fp32, accumulated over
/// tokens into what dweight holds). Returns the number of non-finite values in dy plus the number
/// of values decoded under a non-finite stored scale (zero for any buffer the forward wrote). dx
/// may be dy itself. Host only; synchronous. \throws agoq::invalid_argument on mismatched extents,
/// null pointers, an invalid spec or partially overlapping buffers.
template <fused_input DY, fused_input W, fused_output DX>
std::int64_t rmsnorm_backward(host_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                              std::span<float const> rstd, std::span<W> weight, matrix_view<DX> dx,
                              std::span<float> dweight) {
  char const* what = "rmsnorm_backward";
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  fused_detail::check_matrix(dy, rows, cols, what, "dy");
  fused_detail::check_matrix(dx, rows, cols, what, "dx");
  fused_detail::check_saved(saved_x, rows, cols, what, "saved_x");
  fused_detail::check_vector(rstd, rows, what, "rstd");
  fused_detail::check_vector(weight, cols, what, "weight");
  fused_detail::check_vector(dweight, cols, what, "dweight");
  auto const out = fused_detail::bytes_of(dx.data_handle(), dx.size());
  auto const dw = fused_detail::bytes_of(dweight.data(), cols);
  fused_detail::check_overlap(out, fused_detail::bytes_of(dy.data_handle(), dy.size()), true, what);
  fused_detail::check_overlap(out, dw, false, what);
  fused_detail::check_overlap(out, fused_detail::bytes_of(weight.data(), cols), false, what);
  fused_detail::check_overlap(out, fused_detail::bytes_of(rstd.data(), rows), false, what);
  fused_detail::check_overlap(dw, fused_detail::bytes_of(dy.data_handle(), dy.size()), false, what);
  if (dy.size() == 0) return 0;
  using DT = std::remove_const_t<DX>;
  fused_detail::row_loader loader(ex, saved_x);
  auto const* dyp = dy.data_handle();
  DT* dxp = dx.data_handle();
  W const* w = weight.data();
  float* dwp = dweight.data();
  float const inv_cols = 1.0f / static_cast<float>(cols);
  std::int64_t nonfinite = 0;
  std::int64_t bad_scales = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* dyr = dyp + r * cols;
    float const* xh = loader.row(r, bad_scales);
    nonfinite += fused_detail::count_nonfinite(dyr, cols);
    float const rs = rstd[static_cast<std::size_t>(r)];
    float const c =
        fused_detail::lane_sum(cols,
                               [&](std::int64_t i) {
                                 return numeric::to_float(w[i]) * numeric::to_float(dyr[i]) * xh[i];
                               }) *
        inv_cols;
    float const k = rs * rs * c;
    DT* dxr = dxp + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const d = numeric::to_float(dyr[i]);
      dwp[i] += d * xh[i] * rs;
      dxr[i] = numeric::from_float<DT>(rs * (numeric::to_float(w[i]) * d - xh[i] * k));
    }
  }
  return nonfinite + bad_scales;
}

/// SwiGLU forward, fused with saving both inputs: out = silu(gate) * up, silu(g) = g / (1 + e^-g),
/// in fp32. saved_gate is bit-identical to agoq::quantize(ex, gate, saved_gate, opt) and saved_up
/// to agoq::quantize(ex, up, saved_up, {opt.seed, opt.offset + tokens * features}), so that
/// stochastic rounding of the two tensors draws disjoint stream positions. Returns the non-finite
/// count of gate plus that of up. out may be gate or up itself. Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
template <fused_input G, fused_input U, fused_output O>
std::int64_t swiglu_forward(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                            matrix_view<O> out, quantized_view saved_gate, quantized_view saved_up,
                            quantize_options opt = {}) {
  std::int64_t const rows = gate.extent(0);
  std::int64_t const cols = gate.extent(1);
  fused_detail::check_saved(saved_gate, rows, cols, "swiglu_forward", "saved_gate");
  fused_detail::check_saved(saved_up, rows, cols, "swiglu_forward", "saved_up");
  fused_detail::row_saver<std::remove_const_t<G>> gs(ex, saved_gate, opt);
  fused_detail::row_saver<std::remove_const_t<U>> us(
      ex, saved_up, {opt.seed, opt.offset + static_cast<std::uint64_t>(rows * cols)});
  return fused_detail::swiglu_forward(gate, up, out, gs, us);
}

/// The plain SwiGLU forward (no saved copies), same output bits. Returns 0. Host only;
/// synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input G, fused_input U, fused_output O>
std::int64_t swiglu_forward(host_executor, matrix_view<G> gate, matrix_view<U> up,
                            matrix_view<O> out) {
  fused_detail::row_saver<std::remove_const_t<G>> gs;
  fused_detail::row_saver<std::remove_const_t<U>> us;
  return fused_detail::swiglu_forward(gate, up, out, gs, us);
}

/// SwiGLU backward from the quantized inputs: with ĝ, û decoded in fp32 and s = sigmoid(ĝ),
/// dup = dout · ĝ s and dgate = dout · û · s (1 + ĝ (1 - s)). Returns the number of non-finite
/// values in dout plus the number of values decoded under a non-finite stored scale (zero for any
/// buffer the forward wrote). dgate or dup may be dout itself (not each other). Host only;
/// synchronous. \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid
/// spec or overlapping outputs.
template <fused_input D, fused_output DG, fused_output DU>
std::int64_t swiglu_backward(host_executor ex, matrix_view<D> dout, const_quantized_view saved_gate,
                             const_quantized_view saved_up, matrix_view<DG> dgate,
                             matrix_view<DU> dup) {
  char const* what = "swiglu_backward";
  std::int64_t const rows = dout.extent(0);
  std::int64_t const cols = dout.extent(1);
  fused_detail::check_matrix(dout, rows, cols, what, "dout");
  fused_detail::check_matrix(dgate, rows, cols, what, "dgate");
  fused_detail::check_matrix(dup, rows, cols, what, "dup");
  fused_detail::check_saved(saved_gate, rows, cols, what, "saved_gate");
  fused_detail::check_saved(saved_up, rows, cols, what, "saved_up");
  auto const in = fused_detail::bytes_of(dout.data_handle(), dout.size());
  auto const og = fused_detail::bytes_of(dgate.data_handle(), dgate.size());
  auto const ou = fused_detail::bytes_of(dup.data_handle(), dup.size());
  fused_detail::check_overlap(og, in, true, what);
  fused_detail::check_overlap(ou, in, true, what);
  fused_detail::check_overlap(og, ou, false, what);
  if (dout.size() == 0) return 0;
  using GT = std::remove_const_t<DG>;
  using UT = std::remove_const_t<DU>;
  fused_detail::row_loader gl(ex, saved_gate);
  fused_detail::row_loader ul(ex, saved_up);
  std::int64_t nonfinite = 0;
  std::int64_t bad_scales = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* dr = dout.data_handle() + r * cols;
    float const* g = gl.row(r, bad_scales);
    float const* u = ul.row(r, bad_scales);
    nonfinite += fused_detail::count_nonfinite(dr, cols);
    GT* dgr = dgate.data_handle() + r * cols;
    UT* dur = dup.data_handle() + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const d = numeric::to_float(dr[i]);
      float const s = fused_detail::sigmoid(g[i]);
      dur[i] = numeric::from_float<UT>(d * (g[i] * s));
      dgr[i] = numeric::from_float<GT>(d * u[i] * (s * (1.0f + g[i] * (1.0f - s))));
    }
  }
  return nonfinite + bad_scales;
}

/// GeLU forward (tanh approximation: y = x/2 · (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3),
/// evaluated in fp32 as x · sigmoid(2z), which is the same function with one exp), fused with
/// saving its input: saved_x is bit-identical to agoq::quantize(ex, x, saved_x, opt). Returns the
/// non-finite count of x. y may be x itself. Host only; synchronous. \throws agoq::invalid_argument
/// on mismatched extents, null pointers, an invalid spec or partially overlapping buffers.
template <fused_input X, fused_output Y>
std::int64_t gelu_forward(host_executor ex, matrix_view<X> x, matrix_view<Y> y,
                          quantized_view saved_x, quantize_options opt = {}) {
  fused_detail::check_saved(saved_x, x.extent(0), x.extent(1), "gelu_forward", "saved_x");
  fused_detail::row_saver<std::remove_const_t<X>> saver(ex, saved_x, opt);
  return fused_detail::gelu_forward(x, y, saver);
}

/// The plain GeLU forward (tanh approximation, no saved copy), same output bits. Returns 0. Host
/// only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input X, fused_output Y>
std::int64_t gelu_forward(host_executor, matrix_view<X> x, matrix_view<Y> y) {
  fused_detail::row_saver<std::remove_const_t<X>> none;
  return fused_detail::gelu_forward(x, y, none);
}

/// GeLU backward (tanh approximation) from the quantized input: with x̂ decoded in fp32,
/// z = sqrt(2/pi) (x̂ + 0.044715 x̂^3), s = sigmoid(2z) = (1 + tanh z) / 2,
/// dx = dy · (s + 2 x̂ s (1 - s) sqrt(2/pi) (1 + 3 · 0.044715 x̂^2)) (the derivative
/// 1/2 (1 + t) + 1/2 x̂ (1 - t^2) z' of the tanh form, t = tanh z, rewritten in s). Returns the
/// number of non-finite values in dy plus the number of values decoded under a non-finite stored
/// scale (zero for any buffer the forward wrote). dx may be dy itself. Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
template <fused_input DY, fused_output DX>
std::int64_t gelu_backward(host_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                           matrix_view<DX> dx) {
  char const* what = "gelu_backward";
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  fused_detail::check_matrix(dy, rows, cols, what, "dy");
  fused_detail::check_matrix(dx, rows, cols, what, "dx");
  fused_detail::check_saved(saved_x, rows, cols, what, "saved_x");
  fused_detail::check_overlap(fused_detail::bytes_of(dx.data_handle(), dx.size()),
                              fused_detail::bytes_of(dy.data_handle(), dy.size()), true, what);
  if (dy.size() == 0) return 0;
  using DT = std::remove_const_t<DX>;
  fused_detail::row_loader loader(ex, saved_x);
  std::int64_t nonfinite = 0;
  std::int64_t bad_scales = 0;
  constexpr float k = fused_detail::gelu_k;
  constexpr float c = fused_detail::gelu_c;
  for (std::int64_t r = 0; r < rows; ++r) {
    auto const* dr = dy.data_handle() + r * cols;
    float const* x = loader.row(r, bad_scales);
    nonfinite += fused_detail::count_nonfinite(dr, cols);
    DT* dxr = dx.data_handle() + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const v = x[i];
      float const s = fused_detail::sigmoid(2.0f * k * (v + c * v * v * v));
      float const dg = s + 2.0f * v * (s * (1.0f - s)) * k * (1.0f + 3.0f * c * v * v);
      dxr[i] = numeric::from_float<DT>(numeric::to_float(dr[i]) * dg);
    }
  }
  return nonfinite + bad_scales;
}

/// Residual add, fused with saving the sum: sum = a + b (fp32, rounded to the sum's type), and
/// saved_sum written with the quantized copy of that sum, bit-identical to
/// agoq::quantize(ex, sum, saved_sum, opt); the saved copy feeds the next norm's backward.
/// Returns the non-finite count of the sum. sum may be a or b itself (the residual stream updated
/// in place). Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
template <fused_input A, fused_input B, fused_output S>
std::int64_t residual_add(host_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                          quantized_view saved_sum, quantize_options opt = {}) {
  fused_detail::check_saved(saved_sum, a.extent(0), a.extent(1), "residual_add", "saved_sum");
  fused_detail::row_saver<S> saver(ex, saved_sum, opt);
  return fused_detail::residual_add(a, b, sum, saver);
}

/// The plain residual add (no saved copy), same output bits. Returns 0. Host only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input A, fused_input B, fused_output S>
std::int64_t residual_add(host_executor, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum) {
  fused_detail::row_saver<S> none;
  return fused_detail::residual_add(a, b, sum, none);
}

}  // namespace agoq::activation
