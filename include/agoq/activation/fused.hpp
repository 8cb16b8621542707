/// \file
/// The CPU executor's fused producer/consumer ops of the activation path (DESIGN §5): RMSNorm,
/// SwiGLU, GeLU (tanh approximation) and the residual add. A forward op writes its output *and*
/// the quantized copy of the tensor its backward needs in one pass over the rows, quantizing each
/// row's groups while the row is in the L1 cache; the backward op reads codes + scales directly
/// (no full-size dequantized temporary): RMSNorm's AVX-512 loops decode each step of 32 values
/// into registers (group_loader), the other loops decode one row at a time into a row-sized fp32
/// buffer (row_loader).
///
/// Tensors are row-major [tokens, features]; elements are float, bfloat16 or half; every op
/// computes in fp32. The saved copy is bit-identical to agoq::quantize of the same tensor with the
/// same quantize_options (it calls the same segment loops of detail/host). Row-wise fusion needs
/// groups that lie within one row (per_row, per_group<G>, or any grouping of a one-row tensor);
/// for groupings that span rows (per_tensor, per_column, blocks) the op quantizes the saved tensor
/// in a separate pass with agoq::quantize, which gives the same bits at the cost of a second read.
///
/// RMSNorm and the residual add run AVX-512 loops wherever those are compiled (detail/host/simd),
/// whatever the executor, so their output bits do not depend on it; the executor chooses the
/// loops of the saved copy. Under the simd executor, 8- and 4-bit codes of row-wise groups whose
/// codes start on a byte are made inside those loops (group_saver): each group's statistics from
/// the registers of the pass that streams it in, its codes from those of the pass that writes
/// the output; GeLU's codes come from the registers of its own pass over each group, whose
/// statistics it reads one group ahead. Elsewhere the row is quantized once it is in the L1 cache
/// (row_saver), as SwiGLU's two inputs always are. SwiGLU's and GeLU's element loops are g++'s
/// vectorization (agoq's e^x, numeric/exp.hpp, is plain fp32 arithmetic).
///
/// Each forward op also exists without the saved view (the plain op, same arithmetic, same output
/// bits). Every function is host only and synchronous, and throws agoq::invalid_argument on
/// mismatched extents, null pointers, invalid specs or partially overlapping buffers; an output
/// may be the very same buffer as an input of its op (in place), any other overlap is refused.
/// Empty tensors are no-ops. The CUDA versions are in fused.cuh (rmsnorm_forward_async and the
/// others, stream-ordered), with the same saved bits and the same output bits. The ops that save
/// or decode a quantized tensor take a leading code list (as agoq::quantize): the code families
/// they compile for, every family of the dispatch set by default.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/host/engine.hpp"
#include "../error.hpp"
#include "../layout/layout.hpp"
#include "../layout/matrix.hpp"
#include "../layout/params.hpp"
#include "../layout/view.hpp"
#include "../numeric/element.hpp"
#include "../numeric/exp.hpp"
#include "../quantize.hpp"
#include "../scheme/dispatch.hpp"
#include "statistics.hpp"

namespace agoq::activation {

namespace fused_detail {

using agoq::detail::host::scratch;

/// The code list of the plain ops (no saved copy): they compile no saving code at all.
using no_codes = type_list<>;

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
#if defined(AGOQ_HOST_ROW_SIMD)
  if constexpr (h::row_simd<Code>) {
    if (simd && h::row_groups(l)) {  // packed codes straight from registers
      return h::quantize_batches_simd<Code, Rounding, T>(
          out, l, k0, k0 + (n_range + g - 1) / g,
          [&](std::int64_t, std::int64_t b) { return row + b; },
          [&](std::int64_t, std::int64_t b, std::int64_t) {
            return static_cast<float const*>(s.draws.data() + (b - c0));
          });
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

/// True where decode_row decodes a saved tensor group by group with the row path
/// (detail::host::decode_simd): 8- or 4-bit codes whose groups start on a byte, under the simd
/// executor: a run of whole groups of a row then costs its own groups only (row_loader::step).
template <code_format Code>
bool decodes_by_groups(quantized_layout const& l, bool simd) noexcept {
#if defined(AGOQ_HOST_ROW_SIMD)
  if constexpr (agoq::detail::host::row_simd<Code>) {
    return simd && (l.tile.cols >= l.cols || (l.tile.cols * Code::bits) % 8 == 0);
  }
#endif
  (void)l;
  (void)simd;
  return false;
}

/// Decodes columns [c0, c1) of row r of a saved tensor (any grouping) into y[0, c1 - c0) in fp32;
/// returns the number of values decoded under a non-finite stored scale (only a corrupted buffer
/// has such scales). [c0, c1) is a run of whole groups of the row (c1 may be cols); only where
/// decodes_by_groups holds does a run cost less than the whole row (elsewhere the row's codes are
/// unpacked whole).
template <code_format Code>
std::int64_t decode_row(const_quantized_view const& in, quantized_layout const& l, std::int64_t r,
                        std::int64_t c0, std::int64_t c1, bool simd,
                        std::vector<std::uint8_t>& unpacked, float* y) {
  namespace h = agoq::detail::host;
  std::int64_t const g = l.tile.cols;
  std::int64_t const cols = l.cols;
  std::uint8_t const* src = in.codes + r * l.code_row_bytes;
  std::int64_t nonfinite = 0;
#if defined(AGOQ_HOST_ROW_SIMD)
  if constexpr (h::row_simd<Code>) {
    if (decodes_by_groups<Code>(l, simd)) {
      for (std::int64_t b = c0; b < c1; b += g) {
        std::int64_t const n = std::min(g, c1 - b);
        group_params const p = load_group_params(in, l.group_of(r, b));
        if (!numeric::is_finite(p.scale)) nonfinite += n;
        h::decode_simd<Code, Code::bits>(src + b * Code::bits / 8, n, p, y + (b - c0));
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
  for (std::int64_t b = c0; b < c1; b += g) {
    std::int64_t const n = std::min(g, c1 - b);
    group_params const p = load_group_params(in, l.group_of(r, b));
    if (!numeric::is_finite(p.scale)) nonfinite += n;
    if (simd) {
      h::decode_segment_simd<Code>(q + b, n, p, y + (b - c0));
    } else {
      h::decode_segment<Code>(q + b, n, p, y + (b - c0));
    }
  }
  return nonfinite;
}

/// Writes the saved copy of a [rows, cols] tensor of element type T, its code family one of
/// Codes: row by row where the grouping allows (row()), else in one agoq::quantize<Codes> pass
/// (whole()). Under no_codes (the plain op) it is default-constructed, saves nothing and compiles
/// no quantization at all. It is the saving policy of the op loops wherever
/// group_saver is not (SwiGLU, no saved copy, the portable executor, 2-bit codes, groups spanning
/// rows or whose codes do not start on a byte).
template <class T, class Codes>
class row_saver {
 public:
  row_saver() requires(std::is_same_v<Codes, no_codes>) = default;

  row_saver(host_executor ex, quantized_view v,
            quantize_options opt) requires(!std::is_same_v<Codes, no_codes>)
      : ex_(ex), view_(v), layout_(v.layout()), opt_(opt) {
    simd_ = ex.simd;
    if (layout_.elements() == 0 || layout_.tile.rows != 1) return;
    fn_ = dispatch_code<Codes>(v.spec, [&](auto code) {
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

  /// The columns of a row to save at a time, about `target` of them, so that an op loop can save
  /// a piece of the row and use it while it is in the L1 cache: whole groups whose codes end on a
  /// byte, or the whole row where one group spans it; `target` columns where range() saves
  /// nothing (the grouping is not row-wise, or nothing is saved).
  std::int64_t step(std::int64_t cols, std::int64_t target) const noexcept {
    std::int64_t const g = layout_.tile.cols;
    if (fn_ == nullptr) return std::min(cols, target);
    if (g >= cols) return cols;
    std::int64_t k = std::max<std::int64_t>(1, target / g);
    while (g * k * layout_.bits % 8 != 0) ++k;
    return std::min(cols, g * k);
  }

  /// True where range() saves (row-wise groupings), reading its columns from memory first.
  bool saves_rows() const noexcept { return fn_ != nullptr; }

  /// Quantizes the whole tensor when its groups span rows (otherwise does nothing).
  std::int64_t whole(T const* x) {
    if constexpr (std::is_same_v<Codes, no_codes>) {
      return 0;
    } else {
      if (fn_ != nullptr || layout_.elements() == 0) return 0;
      return agoq::quantize<Codes>(ex_, matrix_view<T const>(x, layout_.rows, layout_.cols), view_,
                                   opt_);
    }
  }

#if defined(AGOQ_HOST_AVX512)
  /// The op loops' run of columns: the whole row.
  std::int64_t width(std::int64_t cols) const noexcept { return cols; }
  /// Neither statistics nor codes from the op loops' registers: their per-group hooks (see
  /// group_saver) do nothing here.
  struct nothing {
    void add(__m512, __mmask16) const noexcept {}
    template <class A>
    void step(std::int64_t, __m512, __m512, std::int64_t) const noexcept {}
  };
  nothing stats() const noexcept { return {}; }
  std::int64_t end_group(T const*, std::int64_t, std::int64_t, nothing) const noexcept { return 0; }
  nothing begin(std::int64_t, std::int64_t) const noexcept { return {}; }
#endif

 private:
  using row_fn = std::int64_t (*)(T const*, std::int64_t, std::int64_t, std::int64_t,
                                  quantized_view const&, quantized_layout const&, std::uint64_t,
                                  std::uint64_t, bool, scratch&);
  host_executor ex_{};
  quantized_view view_{};
  quantized_layout layout_{};
  quantize_options opt_{};
  bool simd_ = false;
  row_fn fn_ = nullptr;
  scratch scratch_;
};

#if defined(AGOQ_HOST_AVX512)

/// Writes the saved copy of a [rows, cols] tensor of element type T from the AVX-512 op loops,
/// group by group, for row-wise groupings whose codes start on a byte (detail::host::row_groups)
/// with 8- or 4-bit codes under the simd executor. As the op loop streams a group in, it folds
/// the group's values into stats() and then calls end_group(), which makes the group's
/// parameters; later it calls begin() on the group and step() on each step of 32 of its values
/// it loads again: right away from the L1 cache (residual add) or on its second pass over the
/// row (RMSNorm, whose output waits for the whole row's sum of squares). Statistics and codes so
/// come from the op's own registers: one read of the row from memory for the op and its saved
/// copy, and no call inside the loops. GeLU, whose element loop is g++'s, reads each group's
/// statistics from memory with read_group() / read_next() instead (quantize's own statistics
/// loop, one group ahead of its codes) and hands step() the values of its pass over the group.
/// The statistics, parameters, encoder and stream positions are those of agoq::quantize's row
/// path, hence the same bits.
template <code_format Code, rounding_kind Rounding, class T>
class group_saver {
 public:
  group_saver(quantized_view v, quantized_layout const& l, quantize_options opt)
      : view_(v), layout_(l), opt_(opt), params_(static_cast<std::size_t>(l.group_grid_cols)) {
    if constexpr (stochastic) {
      draws_.resize(static_cast<std::size_t>(std::min(l.tile.cols, l.cols)));
    }
  }

  /// Nothing to do at once: the groups lie within rows.
  std::int64_t whole(T const*) noexcept { return 0; }
  /// The op loops' run of columns: one group.
  std::int64_t width(std::int64_t) const noexcept { return layout_.tile.cols; }

  /// A group's statistics, to fold its values into.
  agoq::detail::host::value_stats<Code> stats() const noexcept { return {}; }

  /// The parameters of group k of row r (x the row) from its statistics s, stored in the view and
  /// kept for begin(); returns the group's non-finite count.
  [[gnu::always_inline, gnu::flatten]] std::int64_t end_group(
      T const* x, std::int64_t r, std::int64_t k, agoq::detail::host::value_stats<Code> const& s) {
    std::int64_t const b = k * layout_.tile.cols;
    return set_params(r, k,
                      agoq::detail::host::value_stats<Code>::stats(
                          s.reduce(), x + b, std::min(layout_.tile.cols, layout_.cols - b)));
  }

  /// The parameters of group k of row r of x (the whole tensor), as end_group makes them, from
  /// statistics read from memory by quantize's row path (stats_segment_simd, on T's own bits);
  /// returns the group's non-finite count.
  std::int64_t read_group(T const* x, std::int64_t r, std::int64_t k) {
    std::int64_t const b = k * layout_.tile.cols;
    return set_params(r, k,
                      agoq::detail::host::stats_segment_simd<Code>(
                          x + r * layout_.cols + b, std::min(layout_.tile.cols, layout_.cols - b)));
  }

  /// read_group of the group after group k of row r (the next row's first after a row's last;
  /// none from row `end` on: the rows of this saver end there), so that its parameters are ready
  /// by the time its codes begin: called after begin(r, k), it leaves that group's codes as they
  /// are.
  std::int64_t read_next(T const* x, std::int64_t r, std::int64_t k, std::int64_t end) {
    if ((k + 1) * layout_.tile.cols < layout_.cols) return read_group(x, r, k + 1);
    return r + 1 < end ? read_group(x, r + 1, 0) : 0;
  }

  /// Nothing to do per row: the groups are done one by one.
  std::int64_t row(T const*, std::int64_t) noexcept { return 0; }

  /// The codes of one group, step by step: a value the op loop keeps in registers.
  class group {
   public:
    group(group_params p, std::uint8_t* codes, float const* draws, std::int64_t b) noexcept
        : encoder_(p), codes_(codes), draws_(draws), b_(b), zero_scale_(p.scale == 0.0f) {}

    /// Codes of the group's step at column i: its values v0, v1 arranged like a step of A,
    /// `left` of them elements (a group whose scale is 0 has its codes already).
    template <class A>
    void step(std::int64_t i, __m512 v0, __m512 v1, std::int64_t left) const noexcept {
      if (zero_scale_) return;
      agoq::detail::host::encode_step<Code, Rounding, Code::bits, A>(
          encoder_, v0, v1, stochastic ? draws_ + (i - b_) : nullptr, left,
          codes_ + (i - b_) * Code::bits / 8);
    }

   private:
    agoq::detail::host::encoder<Code> encoder_;
    std::uint8_t* codes_;  // the group's codes
    float const* draws_;   // the group's draws (stochastic rounding)
    std::int64_t b_;       // the group's first column
    bool zero_scale_;
  };

  /// Starts the codes of group k of row r, after its end_group() or read_group(): draws its stream
  /// positions for stochastic rounding (or writes all its codes at once if its scale is 0).
  group begin(std::int64_t r, std::int64_t k) {
    namespace h = agoq::detail::host;
    group_params const p = params_[static_cast<std::size_t>(k)];
    std::int64_t const b = k * layout_.tile.cols;
    std::int64_t const n = std::min(layout_.tile.cols, layout_.cols - b);
    std::uint8_t* codes = view_.codes + r * layout_.code_row_bytes + b * Code::bits / 8;
    if (p.scale == 0.0f) {
      h::encode_zero_scale<Code, Code::bits>(n, p, codes);
    } else if constexpr (stochastic) {
      h::uniforms_simd(opt_.seed, opt_.offset + static_cast<std::uint64_t>(r * layout_.cols + b), n,
                       draws_.data());
    }
    return group(p, codes, draws_.data(), b);
  }

 private:
  static constexpr bool stochastic = Rounding == rounding_kind::stochastic;

  /// Makes, stores and keeps for begin() the parameters of group k of row r from its statistics;
  /// returns its non-finite count.
  std::int64_t set_params(std::int64_t r, std::int64_t k,
                          agoq::detail::host::segment_stats const& st) {
    group_params const p = make_group_params<Code>(view_.spec.scale, st.stats);
    store_group_params(view_, r * layout_.group_grid_cols + k, p);
    params_[static_cast<std::size_t>(k)] = p;
    return st.nonfinite;
  }

  quantized_view view_;
  quantized_layout layout_;
  quantize_options opt_;
  std::vector<group_params> params_;  // the current row's groups
  std::vector<float> draws_;          // the current group's draws (stochastic rounding)
};

#endif  // AGOQ_HOST_AVX512

/// Calls f(saver) with the saving policy of a tensor of element type T into *v (its code family
/// one of Codes), or under no_codes with one that saves nothing (v is then null), and returns its
/// result: a group_saver where the AVX-512 op loops can encode from their registers (see there),
/// else a row_saver.
template <class T, class Codes, class F>
std::int64_t with_saver(host_executor ex, quantized_view const* v, quantize_options opt, F&& f) {
  if constexpr (std::is_same_v<Codes, no_codes>) {
    row_saver<T, no_codes> none;
    return f(none);
  } else {
#if defined(AGOQ_HOST_AVX512)
    quantized_layout const l = v->layout();
    if (ex.simd && l.elements() > 0 && agoq::detail::host::row_groups(l)) {
      return dispatch_code<Codes>(v->spec, [&](auto code) {
        using Code = decltype(code);
        if constexpr (Code::bits == 8 || Code::bits == 4) {
          return dispatch_rounding(v->spec, [&](auto rounding) {
            group_saver<Code, decltype(rounding)::kind, T> s(*v, l, opt);
            return f(s);
          });
        } else {
          row_saver<T, Codes> s(ex, *v, opt);
          return f(s);
        }
      });
    }
#endif
    row_saver<T, Codes> s(ex, *v, opt);
    return f(s);
  }
}

/// The saved copy's pass over the whole tensor x (of element type T, into *v) where its groups
/// span rows (the saver's whole(); nothing otherwise or under no_codes): before the op's rows
/// for an input, which the op's output may overwrite, after them for an output.
template <class T, class Codes>
std::int64_t save_whole(host_executor ex, quantized_view const* v, quantize_options opt,
                        T const* x) {
  return with_saver<T, Codes>(ex, v, opt, [&](auto& save) { return save.whole(x); });
}

/// The driver of an op's rows without statistics: `drive(rows, cols, range)` runs the op `range`
/// (as stats_detail::measured_rows takes it) over ranges of the rows on the executor's threads
/// (stats_detail::all_rows). The measured forms drive the rows with measuring() instead.
inline auto plain_rows(host_executor ex) noexcept {
  return [ex](std::int64_t rows, std::int64_t cols, auto&& range) {
    return stats_detail::all_rows(ex, rows, cols, range);
  };
}

/// The driver of a measured form's rows: stats_detail::measured_rows, measuring the tensors `m`
/// beside the op, each row before the op's (`before`, inputs) or after it (outputs).
template <class... In>
auto measuring(host_executor ex, bool before, stats_detail::measured_tensor<In>... m) {
  return [=](std::int64_t rows, std::int64_t cols, auto&& range) {
    return stats_detail::measured_rows(ex, rows, cols, before, range, m...);
  };
}

/// What an op returns for an empty tensor: nothing runs, and a measured driver writes the empty
/// statistics.
template <class Drive>
std::int64_t no_rows(Drive&& drive, std::int64_t rows, std::int64_t cols) {
  return drive(rows, cols, [](std::int64_t, std::int64_t, auto&&) { return std::int64_t{0}; });
}

/// Runs f(save, a, b) over the rows [0, rows) (of `cols` elements) as `drive` runs them, each
/// thread's range of rows with a saver of its own (with_saver), and returns the sum.
template <class T, class Codes, class Drive, class F>
std::int64_t save_rows(Drive&& drive, host_executor ex, quantized_view const* v,
                       quantize_options opt, std::int64_t rows, std::int64_t cols, F&& f) {
  return drive(rows, cols, [&](std::int64_t, std::int64_t, auto&& go) {
    return with_saver<T, Codes>(ex, v, opt, [&](auto& save) {
      return go([&](std::int64_t a, std::int64_t b) { return f(save, a, b); });
    });
  });
}

/// Reads a saved tensor row by row, or piece by piece of a row, decoded into an fp32 buffer; its
/// code family is one of Codes.
template <class Codes>
class row_loader {
 public:
  row_loader(host_executor ex, const_quantized_view v)
      : view_(v), layout_(v.layout()), simd_(ex.simd) {
    if (layout_.elements() == 0) return;
    row_.resize(static_cast<std::size_t>(layout_.cols));
    dispatch_code<Codes>(v.spec, [&](auto code) {
      using Code = decltype(code);
      fn_ = &decode_row<Code>;
      by_groups_ = decodes_by_groups<Code>(layout_, simd_);
    });
  }

  /// Row r decoded; adds the values decoded under a non-finite scale to `bad_scales`.
  float const* row(std::int64_t r, std::int64_t& bad_scales) {
    return range(r, 0, layout_.cols, bad_scales);
  }

  /// Columns [c0, c1) of row r decoded (the buffer's first c1 - c0 values): the whole row, or a
  /// run of whole groups that step() allows; adds the values decoded under a non-finite scale to
  /// `bad_scales`.
  float const* range(std::int64_t r, std::int64_t c0, std::int64_t c1, std::int64_t& bad_scales) {
    bad_scales += fn_(view_, layout_, r, c0, c1, simd_, unpacked_, row_.data());
    return row_.data();
  }

  /// The columns of a row to decode at a time, about `target` of them, so that an op loop can use
  /// them while they are in the L1 cache: whole groups where decode_row decodes group by group,
  /// else the whole row.
  std::int64_t step(std::int64_t cols, std::int64_t target) const noexcept {
    std::int64_t const g = layout_.tile.cols;
    if (!by_groups_ || g >= cols) return cols;
    return std::min(cols, g * std::max<std::int64_t>(1, target / g));
  }

 private:
  using row_fn = std::int64_t (*)(const_quantized_view const&, quantized_layout const&,
                                  std::int64_t, std::int64_t, std::int64_t, bool,
                                  std::vector<std::uint8_t>&, float*);
  const_quantized_view view_;
  quantized_layout layout_;
  bool simd_;
  bool by_groups_ = false;
  row_fn fn_ = nullptr;
  std::vector<std::uint8_t> unpacked_;
  std::vector<float> row_;
};

#if defined(AGOQ_HOST_AVX512)

/// Reads a saved tensor in the AVX-512 op loops, group by group, for row-wise groupings whose
/// groups start on a multiple of 16 columns (groups of a multiple of 16 elements, or one group a
/// row) with 8- or 4-bit codes under the simd executor: each step of 32 values is decoded from its
/// codes straight into registers, arranged like a step of A (the op loop's arrangement), by the
/// arithmetic of decode_row's vector loop (detail::host::decode_vec), hence the same values, with
/// no row buffer between the codes and the op.
template <code_format Code, class A>
class group_loader {
 public:
  group_loader(const_quantized_view v, quantized_layout const& l) noexcept : view_(v), layout_(l) {}

  /// The op loops' run of columns: one group.
  std::int64_t width(std::int64_t cols) const noexcept { return std::min(layout_.tile.cols, cols); }

  /// The values of one group, step by step: a value the op loop keeps in registers.
  class group {
   public:
    group(group_params p, std::uint8_t const* codes, std::int64_t b) noexcept
        : scale_(_mm512_set1_ps(p.scale)),
          zero_point_(_mm512_set1_epi32(p.zero_point)),
          codes_(codes),
          b_(b),
          saturate_(agoq::detail::host::decode_saturates<Code>(p.scale)) {}

    /// The decoded values of the group's step at column j with `left` elements, arranged like a
    /// step of A (absent elements decode from code 0: the op masks them), without decode_vec's
    /// saturation where it cannot bind (integer codes under any scale below about 2^120).
    [[gnu::always_inline]] void step(std::int64_t j, std::int64_t left, __m512& x0,
                                     __m512& x1) const noexcept {
      namespace h = agoq::detail::host;
      std::uint8_t const* src = codes_ + (j - b_) * Code::bits / 8;
      if (saturate_) {
        h::decode_step<Code, Code::bits, A, true>(src, left, scale_, zero_point_, x0, x1);
      } else {
        h::decode_step<Code, Code::bits, A, false>(src, left, scale_, zero_point_, x0, x1);
      }
    }

   private:
    __m512 scale_;
    __m512i zero_point_;
    std::uint8_t const* codes_;  // the group's codes
    std::int64_t b_;             // the group's first column
    bool saturate_;              // decode_vec's saturation can change a value
  };

  /// Group k of row r; adds its element count to `bad_scales` if its stored scale is not finite
  /// (as decode_row counts).
  group begin(std::int64_t r, std::int64_t k, std::int64_t& bad_scales) const noexcept {
    std::int64_t const b = k * layout_.tile.cols;
    group_params const p = load_group_params(view_, r * layout_.group_grid_cols + k);
    if (!numeric::is_finite(p.scale)) bad_scales += std::min(layout_.tile.cols, layout_.cols - b);
    return group(p, view_.codes + r * layout_.code_row_bytes + b * Code::bits / 8, b);
  }

 private:
  const_quantized_view view_;
  quantized_layout layout_;
};

#endif  // AGOQ_HOST_AVX512

/// Calls f(loader) with the reader of a saved tensor (its code family one of Codes) for an op loop
/// whose steps are arranged like those of A, and returns its result: a group_loader where the
/// AVX-512 op loops can decode into their registers (see there), else a row_loader.
template <class Codes, class A, class F>
std::int64_t with_loader(host_executor ex, const_quantized_view v, F&& f) {
#if defined(AGOQ_HOST_AVX512)
  quantized_layout const l = v.layout();
  if (ex.simd && l.elements() > 0 && l.tile.rows == 1 &&
      (l.tile.cols >= l.cols || l.tile.cols % 16 == 0)) {
    return dispatch_code<Codes>(v.spec, [&](auto code) {
      using Code = decltype(code);
      if constexpr (Code::bits == 8 || Code::bits == 4) {
        group_loader<Code, A> load(v, l);
        return f(load);
      } else {
        row_loader<Codes> load(ex, v);
        return f(load);
      }
    });
  }
#endif
  row_loader<Codes> load(ex, v);
  return f(load);
}

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

/// The argument checks of an op with two [rows, cols] inputs and one output of that shape (the
/// output may be either input itself; no other overlap). Both executors call it.
template <class A, class B, class O>
void check_binary(matrix_view<A> a, matrix_view<B> b, matrix_view<O> out, char const* what,
                  char const* a_name, char const* b_name, char const* out_name) {
  std::int64_t const rows = a.extent(0);
  std::int64_t const cols = a.extent(1);
  check_matrix(a, rows, cols, what, a_name);
  check_matrix(b, rows, cols, what, b_name);
  check_matrix(out, rows, cols, what, out_name);
  auto const o = bytes_of(out.data_handle(), out.size());
  check_overlap(o, bytes_of(a.data_handle(), a.size()), true, what);
  check_overlap(o, bytes_of(b.data_handle(), b.size()), true, what);
}

/// RMSNorm forward's checks of rstd ([rows]) and of overlaps: y may be x itself; rstd and the
/// weight overlap nothing. Both executors call it.
template <class X, class W, class Y>
void check_rmsnorm_outputs(matrix_view<X> x, std::span<W> weight, matrix_view<Y> y,
                           std::span<float> rstd, char const* what) {
  std::int64_t const rows = x.extent(0);
  check_vector(rstd, rows, what, "rstd");
  auto const xb = bytes_of(x.data_handle(), x.size());
  auto const yb = bytes_of(y.data_handle(), y.size());
  check_overlap(yb, xb, true, what);
  check_overlap(bytes_of(rstd.data(), rows), xb, false, what);
  check_overlap(bytes_of(rstd.data(), rows), yb, false, what);
  check_overlap(yb, bytes_of(weight.data(), x.extent(1)), false, what);
}

/// The argument checks of an op with one [rows, cols] input x and an output y of that shape (y
/// may be x itself; no other overlap). Both executors call it.
template <class X, class Y>
void check_unary(matrix_view<X> x, matrix_view<Y> y, char const* what) {
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  check_matrix(x, rows, cols, what, "x");
  check_matrix(y, rows, cols, what, "y");
  check_overlap(bytes_of(y.data_handle(), y.size()), bytes_of(x.data_handle(), x.size()), true,
                what);
}

/// The shape checks of a backward op with one saved input: dy, dx and saved_x all [rows, cols]
/// (dy's extents), with data for them (overlaps are the caller's).
template <class DY, class DX>
void check_backward_tensors(matrix_view<DY> dy, const_quantized_view const& saved_x,
                            matrix_view<DX> dx, char const* what) {
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  check_matrix(dy, rows, cols, what, "dy");
  check_matrix(dx, rows, cols, what, "dx");
  check_saved(saved_x, rows, cols, what, "saved_x");
}

/// RMSNorm backward's argument checks: dy, dx and saved_x [rows, cols], rstd [rows], weight and
/// dweight [cols]; dx may be dy itself, and no output overlaps another operand otherwise. Both
/// executors call it.
template <class DY, class W, class DX>
void check_rmsnorm_backward_args(matrix_view<DY> dy, const_quantized_view const& saved_x,
                                 std::span<float const> rstd, std::span<W> weight,
                                 matrix_view<DX> dx, std::span<float> dweight, char const* what) {
  check_backward_tensors(dy, saved_x, dx, what);
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  check_vector(rstd, rows, what, "rstd");
  check_vector(weight, cols, what, "weight");
  check_vector(dweight, cols, what, "dweight");
  auto const out = bytes_of(dx.data_handle(), dx.size());
  auto const dw = bytes_of(dweight.data(), cols);
  check_overlap(out, bytes_of(dy.data_handle(), dy.size()), true, what);
  check_overlap(out, dw, false, what);
  check_overlap(out, bytes_of(weight.data(), cols), false, what);
  check_overlap(out, bytes_of(rstd.data(), rows), false, what);
  check_overlap(dw, bytes_of(dy.data_handle(), dy.size()), false, what);
}

/// SwiGLU backward's argument checks: dout, dgate, dup, saved_gate and saved_up [rows, cols];
/// dgate or dup may be dout itself, not each other. Both executors call it.
template <class D, class DG, class DU>
void check_swiglu_backward_args(matrix_view<D> dout, const_quantized_view const& saved_gate,
                                const_quantized_view const& saved_up, matrix_view<DG> dgate,
                                matrix_view<DU> dup, char const* what) {
  std::int64_t const rows = dout.extent(0);
  std::int64_t const cols = dout.extent(1);
  check_matrix(dout, rows, cols, what, "dout");
  check_matrix(dgate, rows, cols, what, "dgate");
  check_matrix(dup, rows, cols, what, "dup");
  check_saved(saved_gate, rows, cols, what, "saved_gate");
  check_saved(saved_up, rows, cols, what, "saved_up");
  auto const in = bytes_of(dout.data_handle(), dout.size());
  auto const og = bytes_of(dgate.data_handle(), dgate.size());
  auto const ou = bytes_of(dup.data_handle(), dup.size());
  check_overlap(og, in, true, what);
  check_overlap(ou, in, true, what);
  check_overlap(og, ou, false, what);
}

/// GeLU backward's argument checks: dy, dx and saved_x [rows, cols]; dx may be dy itself. Both
/// executors call it.
template <class DY, class DX>
void check_gelu_backward_args(matrix_view<DY> dy, const_quantized_view const& saved_x,
                              matrix_view<DX> dx, char const* what) {
  check_backward_tensors(dy, saved_x, dx, what);
  check_overlap(bytes_of(dx.data_handle(), dx.size()), bytes_of(dy.data_handle(), dy.size()), true,
                what);
}

/// Sum of a_i b_i for i in [0, n) in fp32 over 16 independent lanes (vectorizable): lane j folds
/// i = j, j + 16, ... in order with fma(a_i, b_i, acc), term(i, a, b) giving a_i and b_i; then a
/// fixed pairwise reduction of the lanes. The CUDA executor's lane_sum (fused.cuh) is its twin.
template <class F>
float lane_sum(std::int64_t n, F&& term) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  auto const fold = [&](std::int64_t i, int j) {
    float a, b;
    term(i, a, b);
    acc[j] = std::fma(a, b, acc[j]);
  };
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int j = 0; j < lanes; ++j) fold(i + j, j);
  }
  for (int j = 0; i + j < n; ++j) fold(i + j, j);
  for (int w = lanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

/// Rows per block of RMSNorm backward's dweight sum, the same on both executors: each block of
/// that many consecutive rows (the last one possibly shorter) is folded in row order into a
/// partial sum starting at 0, p_i = fma(dy_ti x̂_ti, rstd_t, p_i), and the blocks' partial sums
/// are then added to dweight in block order. At least 32 rows, and at most 512 blocks, so that a
/// GPU folds the blocks in parallel into a bounded workspace (512 x hidden floats). Host and
/// device.
AGOQ_HOST_DEVICE constexpr std::int64_t dweight_block_rows(std::int64_t rows) noexcept {
  std::int64_t const spread = agoq::detail::ceil_div(rows, 512);
  return spread > 32 ? spread : 32;
}

// The element math of SwiGLU and GeLU, shared by the CPU and CUDA executors: every multiply-add
// an explicit fma and every other step one rounding with no product next to a sum, so that no
// compiler (g++ at any -ffp-contract, clang, nvcc) contracts it differently and both executors
// compute the same bits. e^x is agoq's (numeric/exp.hpp), not the C library's nor CUDA's expf.

/// 1 / (1 + e^-g), the sum rounded once (fma of exp_parts). Host and device.
AGOQ_HOST_DEVICE inline float sigmoid(float g) noexcept {
  numeric::exp_product const e = numeric::exp_parts(-g);
  return 1.0f / cuda::std::fma(e.head, e.scale, 1.0f);
}

/// sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GeLU.
inline constexpr float gelu_k = 0.7978845608028654f;
inline constexpr float gelu_c = 0.044715f;

/// SwiGLU's output (g sigmoid(g)) u. Host and device.
AGOQ_HOST_DEVICE inline float swiglu(float g, float u) noexcept { return (g * sigmoid(g)) * u; }

/// SwiGLU's gradients from dout = d, with s = sigmoid(g): du = d (g s) and
/// dg = (d u) (s fma(g, 1 - s, 1)). Host and device.
AGOQ_HOST_DEVICE inline void swiglu_grads(float d, float g, float u, float& dg,
                                          float& du) noexcept {
  float const s = sigmoid(g);
  du = d * (g * s);
  dg = (d * u) * (s * cuda::std::fma(g, 1.0f - s, 1.0f));
}

/// 2z = 2 sqrt(2/pi) (v + c v^3), evaluated as (2k) fma((c v) v, v, v) (2k is exact). Host and
/// device.
AGOQ_HOST_DEVICE inline float gelu_arg(float v) noexcept {
  return (2.0f * gelu_k) * cuda::std::fma((gelu_c * v) * v, v, v);
}

/// GeLU (tanh approximation) as v sigmoid(2z): (1 + tanh z) / 2 = sigmoid(2z), one exp and no
/// cancellation. Host and device.
AGOQ_HOST_DEVICE inline float gelu(float v) noexcept { return v * sigmoid(gelu_arg(v)); }

/// GeLU's gradient d gelu'(v) with s = sigmoid(2z):
/// d fma(((2v) (s (1 - s))) k, fma((3c) v, v, 1), s) (3c rounded once). Host and device.
AGOQ_HOST_DEVICE inline float gelu_grad(float d, float v) noexcept {
  float const s = sigmoid(gelu_arg(v));
  float const a = ((2.0f * v) * (s * (1.0f - s))) * gelu_k;
  return d * cuda::std::fma(a, cuda::std::fma((3.0f * gelu_c) * v, v, 1.0f), s);
}

// The element loops of SwiGLU and GeLU on the CPU executor, which g++ vectorizes (with 512-bit
// vectors under AVX-512: AGOQ_HOST_WIDE_VECTORS). Outputs may be inputs themselves: each element
// is read before it is written and no iteration depends on another, which AGOQ_HOST_IVDEP tells
// g++ so that it drops the overlap test it would otherwise make and run in place at vector speed.

/// o[i] = swiglu(g[i], u[i]) for i in [0, n). Host only.
template <class G, class U, class O>
AGOQ_HOST_WIDE_VECTORS void swiglu_span(G const* g, U const* u, O* o, std::int64_t n) noexcept {
  AGOQ_HOST_IVDEP
  for (std::int64_t i = 0; i < n; ++i) {
    o[i] = numeric::from_float<O>(swiglu(numeric::to_float(g[i]), numeric::to_float(u[i])));
  }
}

/// y[i] = gelu(x[i]) for i in [0, n). Host only.
template <class X, class Y>
AGOQ_HOST_WIDE_VECTORS void gelu_span(X const* x, Y* y, std::int64_t n) noexcept {
  AGOQ_HOST_IVDEP
  for (std::int64_t i = 0; i < n; ++i) y[i] = numeric::from_float<Y>(gelu(numeric::to_float(x[i])));
}

/// Non-finite values are counted in 32 bits per piece of at most this many values, which g++
/// vectorizes without widening every lane's count to 64 bits (a fifth of the RMSNorm backward's
/// time when it did).
inline constexpr std::int64_t count_piece = std::int64_t{1} << 30;

/// Runs body(i, v) for i in [0, n), v = x[i] as a float, and returns how many v are not finite,
/// counted in 32 bits per piece of count_piece. Always inlined, so that its loop is vectorized
/// within its caller (the element loops' AGOQ_HOST_WIDE_VECTORS). Host only.
template <class T, class Body>
[[gnu::always_inline]] inline std::int64_t counting_loop(T const* x, std::int64_t n,
                                                         Body&& body) noexcept {
  std::int64_t nonfinite = 0;
  for (std::int64_t b = 0; b < n; b += count_piece) {
    std::int64_t const e = std::min(n, b + count_piece);
    std::int32_t k = 0;
    AGOQ_HOST_IVDEP
    for (std::int64_t i = b; i < e; ++i) {
      float const v = numeric::to_float(x[i]);
      k += numeric::is_finite(v) ? 0 : 1;
      body(i, v);
    }
    nonfinite += k;
  }
  return nonfinite;
}

/// SwiGLU's gradients of a row from dout d and the decoded gate g and up u; returns how many of
/// d's values are not finite (counted in the same loop, counting_loop). Host only.
template <class D, class DG, class DU>
AGOQ_HOST_WIDE_VECTORS std::int64_t swiglu_grads_span(D const* d, float const* g, float const* u,
                                                      DG* dg, DU* du, std::int64_t n) noexcept {
  return counting_loop(
      d, n, [&](std::int64_t i, float di) __attribute__((always_inline)) {
        float dgi, dui;
        swiglu_grads(di, g[i], u[i], dgi, dui);
        du[i] = numeric::from_float<DU>(dui);
        dg[i] = numeric::from_float<DG>(dgi);
      });
}

/// GeLU's gradient of a row from dy and the decoded input x; returns how many of dy's values are
/// not finite (counted in the same loop, counting_loop). Host only.
template <class DY, class DX>
AGOQ_HOST_WIDE_VECTORS std::int64_t gelu_grad_span(DY const* dy, float const* x, DX* dx,
                                                   std::int64_t n) noexcept {
  return counting_loop(
      dy, n, [&](std::int64_t i, float d) __attribute__((always_inline)) {
        dx[i] = numeric::from_float<DX>(gelu_grad(d, x[i]));
      });
}

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

#if defined(AGOQ_HOST_AVX512)

/// lane_sum's fixed pairwise reduction of 16 lanes: lane j + lane j + w for w = 8, 4, 2, 1.
inline float lane_total(__m512 acc) noexcept {
  __m256 const a = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  __m128 const b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 const c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/// Calls f(j, left) for each step j = b, b + 32, ... of the columns [b, e), left = e - j of them:
/// whole steps two at a time with a constant `left` (no tail tests in the step's loads, stores
/// and encoding), then the rest one by one.
template <class F>
[[gnu::always_inline]] inline void for_each_step(std::int64_t b, std::int64_t e, F const& f) {
  constexpr std::int64_t s = agoq::detail::host::simd_step;
  std::int64_t j = b;
  for (; j + 2 * s <= e; j += 2 * s) {
    f(j, s);
    f(j + s, s);
  }
  for (; j < e; j += s) f(j, e - j);
}

/// RMSNorm rows with AVX-512, the saving of x by the policy S (group_saver or row_saver). The
/// first pass streams each row in: the sum of squares over 16 lanes (lane j: x_i^2 for
/// i = j mod 16 in order, each a fused multiply-add, then lane_total) and, from the same
/// registers, each group's statistics and parameters (their arithmetic hides under the latency
/// of the sum's chain). The second pass reads the row from the L1 cache, writes y and hands each
/// step's values to the saver; it keeps x's arrangement of a step (detail::host::interleaved),
/// into which the weights are loaded and from which y is stored. Never inlined: inlined into a
/// caller (the plain op's, whose saver is its only user), g++ 12 kept acc in memory, a store and
/// a load in the chain of every fma, and the plain op ran 1.4-2.1x slower in paired runs.
template <class S, class X, class W, class Y>
[[gnu::noinline]] std::int64_t rmsnorm_rows(X const* x, W const* w, float eps, Y* y, float* rstd,
                                            std::int64_t r0, std::int64_t r1, std::int64_t cols,
                                            S& save) {
  namespace h = agoq::detail::host;
  std::int64_t nonfinite = 0;
  std::int64_t const g = save.width(cols);
  float const inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = r0; r < r1; ++r) {
    X const* xr = x + r * cols;
    Y* yr = y + r * cols;
    __m512 acc = _mm512_setzero_ps();
    for (std::int64_t b = 0, k = 0; b < cols; b += g, ++k) {
      std::int64_t const e = std::min(cols, b + g);
      auto st = save.stats();
      // The vectors of 16 at multiples of 16 that meet the group, masked to its lanes: lane j
      // of acc takes the elements j mod 16 in order.
      auto const add = [&](__m512 v, __mmask16 m) __attribute__((always_inline, flatten)) {
        acc = _mm512_mask3_fmadd_ps(v, v, acc, m);
        st.add(v, m);
      };
      std::int64_t i = b - b % 16;
      if (i < b) {
        auto const m = static_cast<__mmask16>(h::tail_mask16(e - i) & ~h::tail_mask16(b - i));
        add(h::load16(xr + i, m), m);
        i += 16;
      }
      for (; i + 16 <= e; i += 16) add(h::load16(xr + i, 0xffff), 0xffff);
      if (i < e) add(h::load16(xr + i, h::tail_mask16(e - i)), h::tail_mask16(e - i));
      nonfinite += save.end_group(xr, r, k, st);
    }
    nonfinite += save.row(xr, r);
    float const rs = 1.0f / std::sqrt(std::fma(lane_total(acc), inv_cols, eps));
    rstd[r] = rs;
    __m512 const rv = _mm512_set1_ps(rs);
    for (std::int64_t b = 0, k = 0; b < cols; b += g, ++k) {
      std::int64_t const e = std::min(cols, b + g);
      auto const codes = save.begin(r, k);
      auto const step = [&](std::int64_t j, std::int64_t left)
          __attribute__((always_inline, flatten)) {
        h::step_values const v = h::load_step(xr + j, left);
        h::step_values const wv = h::load_step_as<X>(w + j, left);
        h::store_step_as<X>(yr + j, _mm512_mul_ps(_mm512_mul_ps(v.v0, rv), wv.v0),
                            _mm512_mul_ps(_mm512_mul_ps(v.v1, rv), wv.v1), left);
        codes.template step<X>(j, v.v0, v.v1, left);
      };
      for_each_step(b, e, step);
    }
  }
  return nonfinite;
}

/// Residual-add rows with AVX-512, the saving of the sum by the policy S: each group's sums are
/// written (in the sum's arrangement of a step) and folded, read back as stored, into the
/// group's statistics; its codes follow from the L1 cache before the next group streams in.
template <class S, class A, class B, class T>
std::int64_t residual_rows(A const* a, B const* b, T* sum, std::int64_t r0, std::int64_t r1,
                           std::int64_t cols, S& save) {
  namespace h = agoq::detail::host;
  std::int64_t nonfinite = 0;
  std::int64_t const g = save.width(cols);
  for (std::int64_t r = r0; r < r1; ++r) {
    A const* ar = a + r * cols;
    B const* br = b + r * cols;
    T* sr = sum + r * cols;
    for (std::int64_t c = 0, k = 0; c < cols; c += g, ++k) {
      std::int64_t const e = std::min(cols, c + g);
      auto st = save.stats();
      auto const add = [&](std::int64_t j, std::int64_t left)
          __attribute__((always_inline, flatten)) {
        h::step_values const av = h::load_step_as<T>(ar + j, left);
        h::step_values const bv = h::load_step_as<T>(br + j, left);
        h::store_step(sr + j, _mm512_add_ps(av.v0, bv.v0), _mm512_add_ps(av.v1, bv.v1), left);
        h::step_values const v = h::load_step(sr + j, left);
        st.add(v.v0, v.m0);
        st.add(v.v1, v.m1);
      };
      for_each_step(c, e, add);
      nonfinite += save.end_group(sr, r, k, st);
      auto const codes = save.begin(r, k);
      auto const encode = [&](std::int64_t j, std::int64_t left)
          __attribute__((always_inline, flatten)) {
        h::step_values const v = h::load_step(sr + j, left);
        codes.template step<T>(j, v.v0, v.v1, left);
      };
      for_each_step(c, e, encode);
    }
    nonfinite += save.row(sr, r);
  }
  return nonfinite;
}

#else

/// RMSNorm rows with the portable loops, the saving of x by a row_saver.
template <class S, class X, class W, class Y>
std::int64_t rmsnorm_rows(X const* x, W const* w, float eps, Y* y, float* rstd, std::int64_t r0,
                          std::int64_t r1, std::int64_t cols, S& save) {
  std::int64_t nonfinite = 0;
  float const inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = r0; r < r1; ++r) {
    X const* xr = x + r * cols;
    // The sum of squares streams the row in from memory; the quantization then reads it hot.
    float const ss = lane_sum(
        cols, [&](std::int64_t i, float& a, float& b) { a = b = numeric::to_float(xr[i]); });
    nonfinite += save.row(xr, r);
    float const rs = 1.0f / std::sqrt(std::fma(ss, inv_cols, eps));
    rstd[r] = rs;
    Y* yr = y + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      yr[i] = numeric::from_float<Y>(numeric::to_float(xr[i]) * rs * numeric::to_float(w[i]));
    }
  }
  return nonfinite;
}

/// Residual-add rows with the portable loops, the saving of the sum by a row_saver.
template <class S, class A, class B, class T>
std::int64_t residual_rows(A const* a, B const* b, T* sum, std::int64_t r0, std::int64_t r1,
                           std::int64_t cols, S& save) {
  std::int64_t nonfinite = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    A const* ar = a + r * cols;
    B const* br = b + r * cols;
    T* sr = sum + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      sr[i] = numeric::from_float<T>(numeric::to_float(ar[i]) + numeric::to_float(br[i]));
    }
    nonfinite += save.row(sr, r);
  }
  return nonfinite;
}

#endif  // AGOQ_HOST_AVX512

/// RMSNorm forward, saving x into *saved (its code family one of Codes), or nothing under
/// no_codes (saved null).
template <class Codes, class X, class W, class Y, class Drive>
std::int64_t rmsnorm_forward(host_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                             matrix_view<Y> y, std::span<float> rstd, quantized_view const* saved,
                             quantize_options opt, Drive&& drive) {
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  char const* what = "rmsnorm_forward";
  check_rmsnorm_outputs(x, weight, y, rstd, what);
  if (x.size() == 0) return no_rows(drive, rows, cols);
  using T = std::remove_const_t<X>;
  std::int64_t const nonfinite = save_whole<T, Codes>(ex, saved, opt, x.data_handle());
  return nonfinite + save_rows<T, Codes>(drive, ex, saved, opt, rows, cols,
                                         [&](auto& save, std::int64_t r0, std::int64_t r1) {
                                           return rmsnorm_rows(x.data_handle(), weight.data(), eps,
                                                               y.data_handle(), rstd.data(), r0, r1,
                                                               cols, save);
                                         });
}

/// Columns per piece of a row that SwiGLU and GeLU save and then compute while it is in the L1
/// cache (row_saver::step), and that their backward ops decode and then use (row_loader::step):
/// 1024 made the fused SwiGLU about 7% faster than whole 4096-wide rows.
inline constexpr std::int64_t piece_target = 1024;

/// SwiGLU forward, saving gate into *saved_gate and up into *saved_up (their code families among
/// Codes), or nothing under no_codes (both null).
template <class Codes, class G, class U, class O, class Drive>
std::int64_t swiglu_forward(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                            matrix_view<O> out, quantized_view const* saved_gate,
                            quantized_view const* saved_up, quantize_options opt, Drive&& drive) {
  std::int64_t const rows = gate.extent(0);
  std::int64_t const cols = gate.extent(1);
  char const* what = "swiglu_forward";
  check_binary(gate, up, out, what, "gate", "up", "out");
  if (gate.size() == 0) return no_rows(drive, rows, cols);
  using GT = std::remove_const_t<G>;
  using UT = std::remove_const_t<U>;
  using OT = std::remove_const_t<O>;
  auto const* gp = gate.data_handle();
  auto const* up_p = up.data_handle();
  OT* op = out.data_handle();
  quantize_options const up_opt{opt.seed, opt.offset + static_cast<std::uint64_t>(rows * cols)};
  auto const savers = [&] {
    if constexpr (std::is_same_v<Codes, no_codes>) {
      return std::pair<row_saver<GT, Codes>, row_saver<UT, Codes>>();
    } else {
      return std::pair<row_saver<GT, Codes>, row_saver<UT, Codes>>(
          std::piecewise_construct, std::forward_as_tuple(ex, *saved_gate, opt),
          std::forward_as_tuple(ex, *saved_up, up_opt));
    }
  };
  auto first = savers();
  std::int64_t const nonfinite = first.first.whole(gp) + first.second.whole(up_p);
  // Both saves and the op's loop go over the same pieces of a row (the whole row unless both
  // savers agree on a step), the saves first: out may be gate or up itself.
  std::int64_t const gs = first.first.step(cols, piece_target);
  std::int64_t const step = gs == first.second.step(cols, piece_target) ? gs : cols;
  auto const range = [&](std::int64_t, std::int64_t, auto&& go) {
    auto s = savers();
    return go([&](std::int64_t r0, std::int64_t r1) {
      auto& [gate_saver, up_saver] = s;
      std::int64_t count = 0;
      for (std::int64_t r = r0; r < r1; ++r) {
        auto const* gr = gp + r * cols;
        auto const* ur = up_p + r * cols;
        OT* orow = op + r * cols;
        for (std::int64_t c = 0; c < cols; c += step) {
          std::int64_t const e = std::min(cols, c + step);
          if (!gate_saver.saves_rows()) {  // a hint for the op's loop (prefetch_ahead)
            agoq::detail::host::prefetch_ahead(gr + c,
                                               (e - c) * static_cast<std::int64_t>(sizeof(*gr)));
            agoq::detail::host::prefetch_ahead(ur + c,
                                               (e - c) * static_cast<std::int64_t>(sizeof(*ur)));
          }
          count += gate_saver.range(gr, r, c, e) + up_saver.range(ur, r, c, e);
          swiglu_span(gr + c, ur + c, orow + c, e - c);
        }
      }
      return count;
    });
  };
  return nonfinite + drive(rows, cols, range);
}

/// GeLU rows, the saving of x by a row_saver: the save of each piece of a row first, then the op
/// on it from the L1 cache (y may be x).
template <class X, class Y, class Codes>
std::int64_t gelu_rows(X const* x, Y* y, std::int64_t r0, std::int64_t r1, std::int64_t cols,
                       row_saver<X, Codes>& saver) {
  std::int64_t nonfinite = 0;
  std::int64_t const step = saver.step(cols, piece_target);
  for (std::int64_t r = r0; r < r1; ++r) {
    X const* xr = x + r * cols;
    Y* yr = y + r * cols;
    for (std::int64_t c = 0; c < cols; c += step) {
      std::int64_t const e = std::min(cols, c + step);
      if (!saver.saves_rows()) {  // a hint for the op's loop (prefetch_ahead)
        agoq::detail::host::prefetch_ahead(xr + c, (e - c) * static_cast<std::int64_t>(sizeof(X)));
      }
      nonfinite += saver.range(xr, r, c, e);
      gelu_span(xr + c, yr + c, e - c);
    }
  }
  return nonfinite;
}

#if defined(AGOQ_HOST_AVX512)

/// GeLU rows, the saving of x by a group_saver, piece by piece of a row (whole groups, about
/// piece_target columns): the codes of the piece's groups step by step (the encoder from the
/// registers of the step it loads), then the op's loop, which g++ vectorizes, over the piece from
/// the L1 cache. Each group's statistics and parameters are read one group ahead
/// (group_saver::read_next), so that their latency hides under the previous group's steps. y may
/// be x itself (a piece is written after its codes and the next group's statistics are read).
/// The op's loop over a whole piece rather than over each step of 32 (which let the encoder's
/// divisions overlap the op's arithmetic) made the fused GeLU about 10% faster (vs_plain 1.43 ->
/// 1.29 on an EPYC Zen 4): its vector loop's entry and tail cost more than that overlap won.
template <code_format Code, rounding_kind Rounding, class X, class Y>
std::int64_t gelu_rows(X const* x, Y* y, std::int64_t r0, std::int64_t r1, std::int64_t cols,
                       group_saver<Code, Rounding, X>& save) {
  namespace h = agoq::detail::host;
  std::int64_t const g = save.width(cols);
  std::int64_t const piece = std::max<std::int64_t>(1, piece_target / g) * g;
  std::int64_t nonfinite = save.read_group(x, r0, 0);
  for (std::int64_t r = r0; r < r1; ++r) {
    X const* xr = x + r * cols;
    Y* yr = y + r * cols;
    for (std::int64_t p = 0, k = 0; p < cols; p += piece) {
      std::int64_t const pe = std::min(cols, p + piece);
      h::prefetch_ahead(xr + p, (pe - p) * static_cast<std::int64_t>(sizeof(X)));
      for (std::int64_t b = p; b < pe; b += g, ++k) {
        auto const codes = save.begin(r, k);
        nonfinite += save.read_next(x, r, k, r1);
        auto const step = [&](std::int64_t j, std::int64_t left)
            __attribute__((always_inline, flatten)) {
          h::step_values const v = h::load_step(xr + j, left);
          codes.template step<X>(j, v.v0, v.v1, left);
        };
        for_each_step(b, std::min(pe, b + g), step);
      }
      gelu_span(xr + p, yr + p, pe - p);
    }
  }
  return nonfinite;
}

#endif  // AGOQ_HOST_AVX512

/// GeLU forward, saving x into *saved (its code family one of Codes), or nothing under no_codes
/// (saved null).
template <class Codes, class X, class Y, class Drive>
std::int64_t gelu_forward(host_executor ex, matrix_view<X> x, matrix_view<Y> y,
                          quantized_view const* saved, quantize_options opt, Drive&& drive) {
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  check_unary(x, y, "gelu_forward");
  if (x.size() == 0) return no_rows(drive, rows, cols);
  using T = std::remove_const_t<X>;
  std::int64_t const nonfinite = save_whole<T, Codes>(ex, saved, opt, x.data_handle());
  return nonfinite +
         save_rows<T, Codes>(
             drive, ex, saved, opt, rows, cols, [&](auto& save, std::int64_t r0, std::int64_t r1) {
               return gelu_rows(x.data_handle(), y.data_handle(), r0, r1, cols, save);
             });
}

/// Residual add, saving the sum into *saved (its code family one of Codes), or nothing under
/// no_codes (saved null).
template <class Codes, class A, class B, class S, class Drive>
std::int64_t residual_add(host_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                          quantized_view const* saved, quantize_options opt, Drive&& drive) {
  std::int64_t const rows = a.extent(0);
  std::int64_t const cols = a.extent(1);
  char const* what = "residual_add";
  check_binary(a, b, sum, what, "a", "b", "sum");
  if (a.size() == 0) return no_rows(drive, rows, cols);
  std::int64_t const nonfinite = save_rows<S, Codes>(
      drive, ex, saved, opt, rows, cols, [&](auto& save, std::int64_t r0, std::int64_t r1) {
        return residual_rows(a.data_handle(), b.data_handle(), sum.data_handle(), r0, r1, cols,
                             save);
      });
  return nonfinite + save_whole<S, Codes>(ex, saved, opt, sum.data_handle());
}

/// Counts the non-finite values of a gradient row (counting_loop).
template <class T>
std::int64_t count_nonfinite(T const* x, std::int64_t n) noexcept {
  return counting_loop(x, n, [](std::int64_t, float) {});
}

/// RMSNorm backward of the rows [r0, r1) (of `cols` elements) of one block of dweight's rows, x̂
/// row by row from a row_loader: writes dx and folds each row's dy x̂ r into `partial` (the
/// block's sum, in element order). Returns the non-finite count of dy plus the values decoded
/// under a non-finite stored scale.
template <class Codes, class DY, class W, class DX>
std::int64_t rmsnorm_backward_rows(row_loader<Codes>& load, DY const* dy, W const* w,
                                   float const* rstd, DX* dx, float* partial, std::int64_t r0,
                                   std::int64_t r1, std::int64_t cols) {
  float const inv_cols = 1.0f / static_cast<float>(cols);
  std::int64_t nonfinite = 0;
  std::int64_t bad_scales = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    DY const* dyr = dy + r * cols;
    float const* xh = load.row(r, bad_scales);
    nonfinite += count_nonfinite(dyr, cols);
    float const rs = rstd[r];
    float const c = lane_sum(cols,
                             [&](std::int64_t i, float& a, float& b) {
                               a = numeric::to_float(w[i]) * numeric::to_float(dyr[i]);
                               b = xh[i];
                             }) *
                    inv_cols;
    float const k = (rs * rs) * c;
    DX* dxr = dx + r * cols;
    for (std::int64_t i = 0; i < cols; ++i) {
      float const d = numeric::to_float(dyr[i]);
      partial[i] = std::fma(d * xh[i], rs, partial[i]);
      dxr[i] = numeric::from_float<DX>(rs * std::fma(numeric::to_float(w[i]), d, -(xh[i] * k)));
    }
  }
  return nonfinite + bad_scales;
}

#if defined(AGOQ_HOST_AVX512)

/// The count of the non-finite lanes of v (absent elements, read as +0, are finite).
[[gnu::always_inline]] inline std::int64_t nonfinite_lanes(__m512 v) noexcept {
  // fpclass: quiet NaN (0x01), +Inf (0x08), -Inf (0x10), signaling NaN (0x80).
  return _mm_popcnt_u32(static_cast<unsigned>(_mm512_fpclass_ps_mask(v, 0x99)));
}

/// RMSNorm backward rows with AVX-512, x̂ decoded into registers by a group_loader: the same
/// arithmetic, in the same order, as the row_loader overload. The first pass streams each row's
/// dy, codes and weights in and folds w dy x̂ into lane_sum's 16 lanes (each step's products and
/// values put in element order: lane j takes the elements j mod 16 in order, as the groups start
/// on multiples of 16) while it counts dy's non-finite values; the second pass reads dy and the
/// codes again from the L1 cache, decodes again (cheaper than a row of fp32 values between the
/// passes), writes dx in dy's arrangement and folds dy x̂ r into `partial` in element order.
template <code_format Code, class DY, class W, class DX>
[[gnu::noinline]] std::int64_t rmsnorm_backward_rows(group_loader<Code, DY> const& load,
                                                     DY const* dy, W const* w, float const* rstd,
                                                     DX* dx, float* partial, std::int64_t r0,
                                                     std::int64_t r1, std::int64_t cols) {
  namespace h = agoq::detail::host;
  std::int64_t const g = load.width(cols);
  float const inv_cols = 1.0f / static_cast<float>(cols);
  std::int64_t nonfinite = 0;
  std::int64_t bad_scales = 0;
  // A step's operands, in dy's arrangement: dy, the weights and x̂ (decoded from `values`, its
  // group's reader).
  struct operands {
    h::step_values d, w;
    __m512 x0, x1;
  };
  auto const load_operands = [&](DY const* dyr, auto const& values, std::int64_t j,
                                 std::int64_t left) __attribute__((always_inline)) {
    operands o{h::load_step(dyr + j, left), h::load_step_as<DY>(w + j, left), {}, {}};
    values.step(j, left, o.x0, o.x1);
    return o;
  };
  for (std::int64_t r = r0; r < r1; ++r) {
    DY const* dyr = dy + r * cols;
    DX* dxr = dx + r * cols;
    __m512 acc = _mm512_setzero_ps();
    for (std::int64_t b = 0, k = 0; b < cols; b += g, ++k) {
      auto const values = load.begin(r, k, bad_scales);
      auto const step = [&](std::int64_t j, std::int64_t left)
          __attribute__((always_inline, flatten)) {
        operands o = load_operands(dyr, values, j, left);
        nonfinite += nonfinite_lanes(o.d.v0) + nonfinite_lanes(o.d.v1);
        __m512 a0 = _mm512_mul_ps(o.w.v0, o.d.v0);
        __m512 a1 = _mm512_mul_ps(o.w.v1, o.d.v1);
        h::unarrange<DY>(a0, a1);
        h::unarrange<DY>(o.x0, o.x1);
        acc = _mm512_mask3_fmadd_ps(a0, o.x0, acc, h::tail_mask16(left));
        acc = _mm512_mask3_fmadd_ps(a1, o.x1, acc, h::tail_mask16(left - 16));
      };
      for_each_step(b, std::min(cols, b + g), step);
    }
    float const rs = rstd[r];
    float const c = lane_total(acc) * inv_cols;
    __m512 const rv = _mm512_set1_ps(rs);
    __m512 const kv = _mm512_set1_ps((rs * rs) * c);
    std::int64_t ignored = 0;  // counted in the first pass
    for (std::int64_t b = 0, k = 0; b < cols; b += g, ++k) {
      auto const values = load.begin(r, k, ignored);
      auto const step = [&](std::int64_t j, std::int64_t left)
          __attribute__((always_inline, flatten)) {
        operands const o = load_operands(dyr, values, j, left);
        h::store_step_as<DY>(
            dxr + j, _mm512_mul_ps(rv, _mm512_fmsub_ps(o.w.v0, o.d.v0, _mm512_mul_ps(o.x0, kv))),
            _mm512_mul_ps(rv, _mm512_fmsub_ps(o.w.v1, o.d.v1, _mm512_mul_ps(o.x1, kv))), left);
        __m512 p0 = _mm512_mul_ps(o.d.v0, o.x0);
        __m512 p1 = _mm512_mul_ps(o.d.v1, o.x1);
        h::unarrange<DY>(p0, p1);
        float* pj = partial + j;
        if (left >= h::simd_step) {
          _mm512_storeu_ps(pj, _mm512_fmadd_ps(p0, rv, _mm512_loadu_ps(pj)));
          _mm512_storeu_ps(pj + 16, _mm512_fmadd_ps(p1, rv, _mm512_loadu_ps(pj + 16)));
        } else {
          __mmask16 const m0 = h::tail_mask16(left);
          __mmask16 const m1 = h::tail_mask16(left - 16);
          _mm512_mask_storeu_ps(pj, m0, _mm512_fmadd_ps(p0, rv, _mm512_maskz_loadu_ps(m0, pj)));
          _mm512_mask_storeu_ps(pj + 16, m1,
                                _mm512_fmadd_ps(p1, rv, _mm512_maskz_loadu_ps(m1, pj + 16)));
        }
      };
      for_each_step(b, std::min(cols, b + g), step);
    }
  }
  return nonfinite + bad_scales;
}

#endif  // AGOQ_HOST_AVX512

/// The fused RMSNorm forward's checks, then the op with its rows driven by `drive` (plain_rows,
/// or measuring for the measured form).
template <class Codes, class X, class W, class Y, class Drive>
std::int64_t rmsnorm_saving(host_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                            matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                            quantize_options opt, Drive&& drive) {
  check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                     "rmsnorm_forward");
  check_saved(saved_x, x.extent(0), x.extent(1), "rmsnorm_forward", "saved_x");
  check_vector(weight, x.extent(1), "rmsnorm_forward", "weight");
  require_code<Codes>(saved_x.spec);
  return rmsnorm_forward<Codes>(ex, x, weight, eps, y, rstd, &saved_x, opt, drive);
}

/// The fused SwiGLU forward's checks, then the op with its rows driven by `drive`.
template <class Codes, class G, class U, class O, class Drive>
std::int64_t swiglu_saving(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                           matrix_view<O> out, quantized_view saved_gate, quantized_view saved_up,
                           quantize_options opt, Drive&& drive) {
  std::int64_t const rows = gate.extent(0);
  std::int64_t const cols = gate.extent(1);
  check_saved(saved_gate, rows, cols, "swiglu_forward", "saved_gate");
  check_saved(saved_up, rows, cols, "swiglu_forward", "saved_up");
  require_code<Codes>(saved_gate.spec);
  require_code<Codes>(saved_up.spec);
  return swiglu_forward<Codes>(ex, gate, up, out, &saved_gate, &saved_up, opt, drive);
}

/// The fused GeLU forward's checks, then the op with its rows driven by `drive`.
template <class Codes, class X, class Y, class Drive>
std::int64_t gelu_saving(host_executor ex, matrix_view<X> x, matrix_view<Y> y,
                         quantized_view saved_x, quantize_options opt, Drive&& drive) {
  check_saved(saved_x, x.extent(0), x.extent(1), "gelu_forward", "saved_x");
  require_code<Codes>(saved_x.spec);
  return gelu_forward<Codes>(ex, x, y, &saved_x, opt, drive);
}

/// The fused residual add's checks, then the op with its rows driven by `drive`.
template <class Codes, class A, class B, class S, class Drive>
std::int64_t residual_saving(host_executor ex, matrix_view<A> a, matrix_view<B> b,
                             matrix_view<S> sum, quantized_view saved_sum, quantize_options opt,
                             Drive&& drive) {
  check_saved(saved_sum, a.extent(0), a.extent(1), "residual_add", "saved_sum");
  require_code<Codes>(saved_sum.spec);
  return residual_add<Codes>(ex, a, b, sum, &saved_sum, opt, drive);
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
/// lanes; the AVX-512 loops fuse each square into its lane's sum and the mean into + eps with
/// fused multiply-adds, as GCC contracts the portable loop), and `saved_x` written with the
/// quantized copy of x (scheme from its spec) bit-identical to agoq::quantize(ex, x, saved_x,
/// opt). x, y: [tokens, hidden]; weight: [hidden]; rstd: [tokens] fp32 (kept for the backward).
/// Returns the non-finite count of x (as agoq::quantize). y may be x itself. Host only;
/// synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec, a negative
/// or non-finite eps, or partially overlapping buffers.
/// `Codes`: the code families the call compiles its saving code for (by default every family of
/// the dispatch set, as agoq::quantize); a saved view of another family throws
/// agoq::unsupported_scheme before anything is written.
template <code_list Codes = dispatch_codes, fused_input X, fused_input W, fused_output Y>
std::int64_t rmsnorm_forward(host_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                             matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                             quantize_options opt = {}) {
  return fused_detail::rmsnorm_saving<Codes>(ex, x, weight, eps, y, saved_x, rstd, opt,
                                             fused_detail::plain_rows(ex));
}

/// rmsnorm_forward that also gathers the statistics of x that measure(ex, x, saved_x.spec)
/// returns (into `stats`, the same bits; for the error model, e.g. make_plan's measured
/// statistics), beside the op: each row is measured right before the op reads it, which then
/// finds it in the caches, so x is read from memory once. y, rstd, saved_x and the count are
/// rmsnorm_forward's, bit for bit, on any number of threads. Where saved_x's groups span rows, or
/// a row exceeds stats_detail::host_band_elements elements, x is measured in a pass of its own
/// before the op (two reads). y may be x itself. Host only; synchronous.
/// \throws as rmsnorm_forward; a refused call writes nothing, `stats` included.
template <code_list Codes = dispatch_codes, fused_input X, fused_input W, fused_output Y>
std::int64_t rmsnorm_forward_measured(host_executor ex, matrix_view<X> x, std::span<W> weight,
                                      float eps, matrix_view<Y> y, quantized_view saved_x,
                                      std::span<float> rstd, tensor_stats& stats,
                                      quantize_options opt = {}) {
  return fused_detail::rmsnorm_saving<Codes>(
      ex, x, weight, eps, y, saved_x, rstd, opt,
      fused_detail::measuring(ex, true, stats_detail::measured_tensor<X>{x, saved_x.spec, &stats}));
}

/// The plain RMSNorm forward (no saved copy): the same arithmetic and output bits as the fused
/// rmsnorm_forward. Returns 0. Host only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input X, fused_input W, fused_output Y>
std::int64_t rmsnorm_forward(host_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                             matrix_view<Y> y, std::span<float> rstd) {
  fused_detail::check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                                   "rmsnorm_forward");
  fused_detail::check_vector(weight, x.extent(1), "rmsnorm_forward", "weight");
  return fused_detail::rmsnorm_forward<fused_detail::no_codes>(ex, x, weight, eps, y, rstd, nullptr,
                                                               {}, fused_detail::plain_rows(ex));
}

/// RMSNorm backward from the quantized input: with x̂ the decoded saved_x (fp32, row by row) and
/// r = rstd[t] from the forward, c = (1/hidden) sum_j weight_j dy_j x̂_j,
/// dx_i = r fma(weight_i, dy_i, -(x̂_i (r^2 c))) and dweight_i += sum over tokens of dy_i x̂_i r
/// (fp32, in blocks of fused_detail::dweight_block_rows tokens: each block's sum folded in token
/// order with fused multiply-adds, then the block sums added to what dweight holds in order).
/// Returns the number of non-finite values in dy plus the number
/// of values decoded under a non-finite stored scale (zero for any buffer the forward wrote). dx
/// may be dy itself. Host only; synchronous. \throws agoq::invalid_argument on mismatched extents,
/// null pointers, an invalid spec or partially overlapping buffers.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is written.
template <code_list Codes = dispatch_codes, fused_input DY, fused_input W, fused_output DX>
std::int64_t rmsnorm_backward(host_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                              std::span<float const> rstd, std::span<W> weight, matrix_view<DX> dx,
                              std::span<float> dweight) {
  fused_detail::check_rmsnorm_backward_args(dy, saved_x, rstd, weight, dx, dweight,
                                            "rmsnorm_backward");
  require_code<Codes>(saved_x.spec);
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  if (dy.size() == 0) return 0;
  using DT = std::remove_const_t<DX>;
  auto const* dyp = dy.data_handle();
  DT* dxp = dx.data_handle();
  W const* w = weight.data();
  float* dwp = dweight.data();
  // dweight is summed in blocks of rows, each folded from 0 in row order and added to dweight in
  // block order. One thread adds each block as it ends; several keep every block's sum until all
  // have joined, then add them in the same order: the same bits.
  std::int64_t const block = fused_detail::dweight_block_rows(rows);
  std::int64_t const blocks = (rows + block - 1) / block;
  int const threads = agoq::detail::host::call_threads(ex, blocks, block * cols);
  std::vector<float> block_sums(threads > 1 ? static_cast<std::size_t>(blocks * cols) : 0);
  auto const run = [&](std::int64_t b0, std::int64_t b1) {
    return fused_detail::with_loader<Codes, std::remove_const_t<DY>>(ex, saved_x, [&](auto& load) {
      std::vector<float> own(threads > 1 ? 0 : static_cast<std::size_t>(cols));
      std::int64_t count = 0;
      for (std::int64_t bi = b0; bi < b1; ++bi) {
        float* partial = threads > 1 ? block_sums.data() + bi * cols : own.data();
        std::fill(partial, partial + cols, 0.0f);
        count +=
            fused_detail::rmsnorm_backward_rows(load, dyp, w, rstd.data(), dxp, partial, bi * block,
                                                std::min(rows, (bi + 1) * block), cols);
        if (threads == 1) {
          for (std::int64_t i = 0; i < cols; ++i) dwp[i] += partial[i];
        }
      }
      return count;
    });
  };
  std::int64_t const count = agoq::detail::host::parallel_sum(ex.pool, threads, blocks, run);
  for (std::int64_t bi = 0; bi < (threads > 1 ? blocks : 0); ++bi) {
    float const* partial = block_sums.data() + bi * cols;
    for (std::int64_t i = 0; i < cols; ++i) dwp[i] += partial[i];
  }
  return count;
}

/// SwiGLU forward, fused with saving both inputs: out = silu(gate) * up, silu(g) = g / (1 + e^-g),
/// in fp32. saved_gate is bit-identical to agoq::quantize(ex, gate, saved_gate, opt) and saved_up
/// to agoq::quantize(ex, up, saved_up, {opt.seed, opt.offset + tokens * features}), so that
/// stochastic rounding of the two tensors draws disjoint stream positions. Returns the non-finite
/// count of gate plus that of up. out may be gate or up itself. Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
/// `Codes`: the code families the call compiles its saving code for (by default every family of
/// the dispatch set, as agoq::quantize); a saved view of another family throws
/// agoq::unsupported_scheme before anything is written.
template <code_list Codes = dispatch_codes, fused_input G, fused_input U, fused_output O>
std::int64_t swiglu_forward(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                            matrix_view<O> out, quantized_view saved_gate, quantized_view saved_up,
                            quantize_options opt = {}) {
  return fused_detail::swiglu_saving<Codes>(ex, gate, up, out, saved_gate, saved_up, opt,
                                            fused_detail::plain_rows(ex));
}

/// swiglu_forward that also gathers the statistics of gate and of up that measure(ex, gate,
/// saved_gate.spec) and measure(ex, up, saved_up.spec) return (into `stats_gate` and `stats_up`,
/// the same bits), beside the op: each row of both is measured right before the op reads it, which
/// then finds it in the caches. out, the saved copies and the count are swiglu_forward's, bit for
/// bit, on any number of threads. Where a saved copy's groups span rows, or a row exceeds
/// stats_detail::host_band_elements elements, both inputs are measured in a pass of their own
/// before the op. out may be gate or up itself. Host only; synchronous.
/// \throws as swiglu_forward; a refused call writes nothing, the statistics included.
template <code_list Codes = dispatch_codes, fused_input G, fused_input U, fused_output O>
std::int64_t swiglu_forward_measured(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                                     matrix_view<O> out, quantized_view saved_gate,
                                     quantized_view saved_up, tensor_stats& stats_gate,
                                     tensor_stats& stats_up, quantize_options opt = {}) {
  return fused_detail::swiglu_saving<Codes>(
      ex, gate, up, out, saved_gate, saved_up, opt,
      fused_detail::measuring(ex, true,
                              stats_detail::measured_tensor<G>{gate, saved_gate.spec, &stats_gate},
                              stats_detail::measured_tensor<U>{up, saved_up.spec, &stats_up}));
}

/// The plain SwiGLU forward (no saved copies), same output bits. Returns 0. Host only;
/// synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input G, fused_input U, fused_output O>
std::int64_t swiglu_forward(host_executor ex, matrix_view<G> gate, matrix_view<U> up,
                            matrix_view<O> out) {
  return fused_detail::swiglu_forward<fused_detail::no_codes>(ex, gate, up, out, nullptr, nullptr,
                                                              {}, fused_detail::plain_rows(ex));
}

/// SwiGLU backward from the quantized inputs: with ĝ, û decoded in fp32 and s = sigmoid(ĝ),
/// dup = dout · ĝ s and dgate = dout · û · s (1 + ĝ (1 - s)). Returns the number of non-finite
/// values in dout plus the number of values decoded under a non-finite stored scale (zero for any
/// buffer the forward wrote). dgate or dup may be dout itself (not each other). Host only;
/// synchronous. \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid
/// spec or overlapping outputs.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is written.
template <code_list Codes = dispatch_codes, fused_input D, fused_output DG, fused_output DU>
std::int64_t swiglu_backward(host_executor ex, matrix_view<D> dout, const_quantized_view saved_gate,
                             const_quantized_view saved_up, matrix_view<DG> dgate,
                             matrix_view<DU> dup) {
  fused_detail::check_swiglu_backward_args(dout, saved_gate, saved_up, dgate, dup,
                                           "swiglu_backward");
  require_code<Codes>(saved_gate.spec);
  require_code<Codes>(saved_up.spec);
  std::int64_t const rows = dout.extent(0);
  std::int64_t const cols = dout.extent(1);
  if (dout.size() == 0) return 0;
  using GT = std::remove_const_t<DG>;
  using UT = std::remove_const_t<DU>;
  auto const run = [&](std::int64_t r0, std::int64_t r1) {
    fused_detail::row_loader<Codes> gl(ex, saved_gate);
    fused_detail::row_loader<Codes> ul(ex, saved_up);
    std::int64_t const gs = gl.step(cols, fused_detail::piece_target);
    std::int64_t const step = gs == ul.step(cols, fused_detail::piece_target) ? gs : cols;
    std::int64_t nonfinite = 0;
    std::int64_t bad_scales = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      auto const* dr = dout.data_handle() + r * cols;
      GT* dgr = dgate.data_handle() + r * cols;
      UT* dur = dup.data_handle() + r * cols;
      for (std::int64_t c0 = 0; c0 < cols; c0 += step) {
        std::int64_t const c1 = std::min(cols, c0 + step);
        agoq::detail::host::prefetch_ahead(dr + c0,
                                           (c1 - c0) * static_cast<std::int64_t>(sizeof(*dr)));
        float const* g = gl.range(r, c0, c1, bad_scales);
        float const* u = ul.range(r, c0, c1, bad_scales);
        nonfinite += fused_detail::swiglu_grads_span(dr + c0, g, u, dgr + c0, dur + c0, c1 - c0);
      }
    }
    return nonfinite + bad_scales;
  };
  return agoq::detail::host::parallel_sum(ex, rows, cols, run);
}

/// GeLU forward (tanh approximation: y = x/2 · (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3),
/// evaluated in fp32 as x · sigmoid(2z), which is the same function with one exp), fused with
/// saving its input: saved_x is bit-identical to agoq::quantize(ex, x, saved_x, opt). Returns the
/// non-finite count of x. y may be x itself. Host only; synchronous. \throws agoq::invalid_argument
/// on mismatched extents, null pointers, an invalid spec or partially overlapping buffers.
/// `Codes`: the code families the call compiles its saving code for (by default every family of
/// the dispatch set, as agoq::quantize); a saved view of another family throws
/// agoq::unsupported_scheme before anything is written.
template <code_list Codes = dispatch_codes, fused_input X, fused_output Y>
std::int64_t gelu_forward(host_executor ex, matrix_view<X> x, matrix_view<Y> y,
                          quantized_view saved_x, quantize_options opt = {}) {
  return fused_detail::gelu_saving<Codes>(ex, x, y, saved_x, opt, fused_detail::plain_rows(ex));
}

/// gelu_forward that also gathers the statistics of x that measure(ex, x, saved_x.spec) returns
/// (into `stats`, the same bits), beside the op: each row is measured right before the op reads
/// it, which then finds it in the caches. y, saved_x and the count are gelu_forward's, bit for
/// bit, on any number of threads. Where saved_x's groups span rows, or a row exceeds
/// stats_detail::host_band_elements elements, x is measured in a pass of its own before the op.
/// y may be x itself. Host only; synchronous.
/// \throws as gelu_forward; a refused call writes nothing, `stats` included.
template <code_list Codes = dispatch_codes, fused_input X, fused_output Y>
std::int64_t gelu_forward_measured(host_executor ex, matrix_view<X> x, matrix_view<Y> y,
                                   quantized_view saved_x, tensor_stats& stats,
                                   quantize_options opt = {}) {
  return fused_detail::gelu_saving<Codes>(
      ex, x, y, saved_x, opt,
      fused_detail::measuring(ex, true, stats_detail::measured_tensor<X>{x, saved_x.spec, &stats}));
}

/// The plain GeLU forward (tanh approximation, no saved copy), same output bits. Returns 0. Host
/// only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input X, fused_output Y>
std::int64_t gelu_forward(host_executor ex, matrix_view<X> x, matrix_view<Y> y) {
  return fused_detail::gelu_forward<fused_detail::no_codes>(ex, x, y, nullptr, {},
                                                            fused_detail::plain_rows(ex));
}

/// GeLU backward (tanh approximation) from the quantized input: with x̂ decoded in fp32,
/// z = sqrt(2/pi) (x̂ + 0.044715 x̂^3), s = sigmoid(2z) = (1 + tanh z) / 2,
/// dx = dy · (s + 2 x̂ s (1 - s) sqrt(2/pi) (1 + 3 · 0.044715 x̂^2)) (the derivative
/// 1/2 (1 + t) + 1/2 x̂ (1 - t^2) z' of the tanh form, t = tanh z, rewritten in s). Returns the
/// number of non-finite values in dy plus the number of values decoded under a non-finite stored
/// scale (zero for any buffer the forward wrote). dx may be dy itself. Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is written.
template <code_list Codes = dispatch_codes, fused_input DY, fused_output DX>
std::int64_t gelu_backward(host_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                           matrix_view<DX> dx) {
  fused_detail::check_gelu_backward_args(dy, saved_x, dx, "gelu_backward");
  require_code<Codes>(saved_x.spec);
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  if (dy.size() == 0) return 0;
  using DT = std::remove_const_t<DX>;
  auto const run = [&](std::int64_t r0, std::int64_t r1) {
    fused_detail::row_loader<Codes> loader(ex, saved_x);
    std::int64_t const step = loader.step(cols, fused_detail::piece_target);
    std::int64_t nonfinite = 0;
    std::int64_t bad_scales = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      auto const* dr = dy.data_handle() + r * cols;
      DT* dxr = dx.data_handle() + r * cols;
      for (std::int64_t c0 = 0; c0 < cols; c0 += step) {
        std::int64_t const c1 = std::min(cols, c0 + step);
        agoq::detail::host::prefetch_ahead(dr + c0,
                                           (c1 - c0) * static_cast<std::int64_t>(sizeof(*dr)));
        float const* x = loader.range(r, c0, c1, bad_scales);
        nonfinite += fused_detail::gelu_grad_span(dr + c0, x, dxr + c0, c1 - c0);
      }
    }
    return nonfinite + bad_scales;
  };
  return agoq::detail::host::parallel_sum(ex, rows, cols, run);
}

/// Residual add, fused with saving the sum: sum = a + b (fp32, rounded to the sum's type), and
/// saved_sum written with the quantized copy of that sum, bit-identical to
/// agoq::quantize(ex, sum, saved_sum, opt); the saved copy feeds the next norm's backward.
/// Returns the non-finite count of the sum. sum may be a or b itself (the residual stream updated
/// in place). Host only; synchronous.
/// \throws agoq::invalid_argument on mismatched extents, null pointers, an invalid spec or
/// partially overlapping buffers.
/// `Codes`: the code families the call compiles its saving code for (by default every family of
/// the dispatch set, as agoq::quantize); a saved view of another family throws
/// agoq::unsupported_scheme before anything is written.
template <code_list Codes = dispatch_codes, fused_input A, fused_input B, fused_output S>
std::int64_t residual_add(host_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                          quantized_view saved_sum, quantize_options opt = {}) {
  return fused_detail::residual_saving<Codes>(ex, a, b, sum, saved_sum, opt,
                                              fused_detail::plain_rows(ex));
}

/// residual_add that also gathers the statistics of the sum that measure(ex, sum, saved_sum.spec)
/// returns (into `stats`, the same bits), beside the op: each row of the sum is measured right
/// after the op writes it, from the caches. sum, saved_sum and the count are residual_add's, bit
/// for bit, on any number of threads. Where saved_sum's groups span rows, or a row exceeds
/// stats_detail::host_band_elements elements, the sum is measured in a pass of its own after the
/// op. sum may be a or b itself. Host only; synchronous.
/// \throws as residual_add; a refused call writes nothing, `stats` included.
template <code_list Codes = dispatch_codes, fused_input A, fused_input B, fused_output S>
std::int64_t residual_add_measured(host_executor ex, matrix_view<A> a, matrix_view<B> b,
                                   matrix_view<S> sum, quantized_view saved_sum,
                                   tensor_stats& stats, quantize_options opt = {}) {
  return fused_detail::residual_saving<Codes>(
      ex, a, b, sum, saved_sum, opt,
      fused_detail::measuring(ex, false,
                              stats_detail::measured_tensor<S>{sum, saved_sum.spec, &stats}));
}

/// The plain residual add (no saved copy), same output bits. Returns 0. Host only; synchronous.
/// \throws agoq::invalid_argument as the fused overload.
template <fused_input A, fused_input B, fused_output S>
std::int64_t residual_add(host_executor ex, matrix_view<A> a, matrix_view<B> b,
                          matrix_view<S> sum) {
  return fused_detail::residual_add<fused_detail::no_codes>(ex, a, b, sum, nullptr, {},
                                                            fused_detail::plain_rows(ex));
}

}  // namespace agoq::activation
