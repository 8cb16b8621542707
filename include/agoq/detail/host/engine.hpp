/// \file
/// The CPU executor's driver. A grouping is a tiling by rectangles (tile_shape), so one loop
/// serves every grouping: it walks bands of tile rows and, inside a band, chunks of whole tiles
/// about 4096 columns wide, so that a chunk's statistics pass and its encoding pass both hit the
/// cache and the input is read from memory once (twice only when a group is larger than the
/// cache, as per-tensor and per-column groups are).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../layout/layout.hpp"
#include "../../layout/params.hpp"
#include "../../layout/view.hpp"
#include "../../numeric/codec.hpp"
#include "../../scheme/dispatch.hpp"
#include "parallel.hpp"
#include "segment.hpp"
#include "simd.hpp"

namespace agoq::detail::host {

/// Columns per chunk: whole tiles, about 4096 elements, and a multiple of 8 whenever a row has
/// more than one chunk, so every chunk's packed codes start on a byte boundary.
inline std::int64_t chunk_columns(tile_shape t, std::int64_t cols) noexcept {
  std::int64_t k = std::max<std::int64_t>(1, 4096 / t.cols);
  if (t.cols * k >= cols) return std::max<std::int64_t>(cols, 1);
  if ((t.cols * k) % 8 != 0) k = (k + 7) / 8 * 8;
  return t.cols * k;
}

/// One chunk: the band [r0, r1) of tile rows and the columns [c0, c1) of whole tiles; first_group
/// is the group-grid index of its first tile.
struct chunk {
  std::int64_t r0, r1, c0, c1, first_group;
};

/// Chunks per band of tile rows.
inline std::int64_t band_chunks(quantized_layout const& l) noexcept {
  std::int64_t const w = chunk_columns(l.tile, l.cols);
  return (l.cols + w - 1) / w;
}

/// How many chunks the tensor has (0 for an empty one).
inline std::int64_t chunk_count(quantized_layout const& l) noexcept {
  return l.elements() == 0 ? 0 : l.group_grid_rows * band_chunks(l);
}

/// Chunk u of chunk_count(l), in row-major band order.
inline chunk chunk_at(quantized_layout const& l, std::int64_t u) noexcept {
  std::int64_t const w = chunk_columns(l.tile, l.cols);
  std::int64_t const per_band = band_chunks(l);
  std::int64_t const tr = u / per_band;
  std::int64_t const c0 = (u % per_band) * w;
  std::int64_t const r0 = tr * l.tile.rows;
  return {r0, std::min(l.rows, r0 + l.tile.rows), c0, std::min(l.cols, c0 + w),
          tr * l.group_grid_cols + c0 / l.tile.cols};
}

/// Per-chunk scratch, reused across chunks.
struct scratch {
  std::vector<segment_stats> stats;
  std::vector<group_params> params;
  std::vector<std::uint8_t> codes;
  std::vector<float> draws;
};

/// Runs f(chunk, scratch&) -> int64 for every chunk on the executor's threads, each thread with a
/// scratch of its own, and returns the sum.
template <class F>
std::int64_t sum_over_chunks(host_executor ex, quantized_layout const& l, F&& f) {
  std::int64_t const n = chunk_count(l);
  std::int64_t const per_chunk = n == 0 ? 0 : l.elements() / n;
  return parallel_sum(ex, n, per_chunk, [&](std::int64_t u0, std::int64_t u1) {
    scratch s;
    std::int64_t sum = 0;
    for (std::int64_t u = u0; u < u1; ++u) sum += f(chunk_at(l, u), s);
    return sum;
  });
}

/// Statistics of every tile of the chunk [r0, r1) x [c0, c1), and the group parameters.
template <code_format Code, class T>
std::int64_t chunk_params(T const* x, std::int64_t cols, tile_shape t, scale_format f,
                          std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
                          bool simd, scratch& s) {
  std::int64_t const tiles = (c1 - c0 + t.cols - 1) / t.cols;
  s.stats.assign(static_cast<std::size_t>(tiles), segment_stats{});
  s.params.resize(static_cast<std::size_t>(tiles));
  for (std::int64_t r = r0; r < r1; ++r) {
    T const* row = x + r * cols;
    if (t.cols == 1) {  // per-column groups: one element of each per row, no segment loops
      for (std::int64_t k = 0; k < tiles; ++k)
        fold_value(s.stats[k], numeric::to_float(row[c0 + k]));
      continue;
    }
    for (std::int64_t k = 0; k < tiles; ++k) {
      std::int64_t const b = c0 + k * t.cols;
      std::int64_t const e = std::min(c1, b + t.cols);
      combine(s.stats[k], simd ? stats_segment_simd<Code>(row + b, e - b)
                               : stats_segment<Code>(row + b, e - b));
    }
  }
  std::int64_t nonfinite = 0;
  for (std::int64_t k = 0; k < tiles; ++k) {
    nonfinite += s.stats[k].nonfinite;
    s.params[k] = make_group_params<Code>(f, s.stats[k].stats);
  }
  return nonfinite;
}

/// Encodes row r's part [c0, c1) of a chunk into one code per byte (q), tile by tile.
template <code_format Code, rounding_mode Rounding, class T>
void encode_row(T const* row, std::int64_t r, std::int64_t cols, tile_shape t, std::int64_t c0,
                std::int64_t c1, std::uint64_t seed, std::uint64_t offset, bool simd, scratch& s,
                std::uint8_t* q) {
  if constexpr (Rounding::kind == rounding_kind::stochastic) {
    s.draws.resize(static_cast<std::size_t>(c1 - c0));
    std::uint64_t const first = offset + static_cast<std::uint64_t>(r * cols + c0);
    if (simd) {
      uniforms_simd(seed, first, c1 - c0, s.draws.data());
    } else {
      uniforms(seed, first, c1 - c0, s.draws.data());
    }
  }
  if (t.cols == 1) {  // per-column groups: each element has its own parameters
    for (std::int64_t k = 0; k < c1 - c0; ++k) {
      float const v = numeric::to_float(row[c0 + k]);
      if constexpr (Rounding::kind == rounding_kind::stochastic) {
        q[k] = encode_stochastic<Code>(v, s.params[k], s.draws[k]);
      } else {
        q[k] = encode_nearest<Code>(v, s.params[k]);
      }
    }
    return;
  }
  for (std::int64_t b = c0, k = 0; b < c1; b += t.cols, ++k) {
    std::int64_t const e = std::min(c1, b + t.cols);
    if constexpr (Rounding::kind == rounding_kind::stochastic) {
      float const* u = s.draws.data() + (b - c0);
      if (simd) {
        encode_stochastic_segment_simd<Code>(row + b, e - b, s.params[k], u, q + (b - c0));
      } else {
        encode_stochastic_segment<Code>(row + b, e - b, s.params[k], u, q + (b - c0));
      }
    } else if (simd) {
      encode_nearest_segment_simd<Code>(row + b, e - b, s.params[k], q + (b - c0));
    } else {
      encode_nearest_segment<Code>(row + b, e - b, s.params[k], q + (b - c0));
    }
  }
}

/// Decodes row part [c0, c1) from one code per byte (q) into y, tile by tile; returns the number
/// of outputs whose group scale is not finite (only a corrupted buffer has such scales).
template <code_format Code, class T>
std::int64_t decode_row(std::uint8_t const* q, tile_shape t, std::int64_t c0, std::int64_t c1,
                        bool simd, scratch const& s, T* y) {
  std::int64_t nonfinite = 0;
  if (t.cols == 1) {  // per-column groups
    for (std::int64_t k = 0; k < c1 - c0; ++k) {
      group_params const p = s.params[k];
      nonfinite += numeric::is_finite(p.scale) ? 0 : 1;
      y[c0 + k] = numeric::from_float<T>(decode<Code>(q[k], p));
    }
    return nonfinite;
  }
  for (std::int64_t b = c0, k = 0; b < c1; b += t.cols, ++k) {
    std::int64_t const e = std::min(c1, b + t.cols);
    group_params const p = s.params[k];
    if (!numeric::is_finite(p.scale)) nonfinite += e - b;
    if (simd) {
      decode_segment_simd<Code>(q + (b - c0), e - b, p, y + b);
    } else {
      decode_segment<Code>(q + (b - c0), e - b, p, y + b);
    }
  }
  return nonfinite;
}

/// True when every group is a run of one row whose codes start on a byte boundary: for codes of
/// 8 or 4 bits the row path then reads each group once from memory and writes its packed codes
/// straight from registers, with no chunk bookkeeping.
inline bool row_groups(quantized_layout const& l) noexcept {
  return l.tile.rows == 1 && (l.tile.cols >= l.cols || (l.tile.cols * l.bits) % 8 == 0);
}

#if defined(AGOQ_HOST_ROW_SIMD)

/// Bytes of input the row path takes its statistics of before encoding them (at most 16 groups):
/// small enough to stay in the L1 cache between the two passes.
inline constexpr std::int64_t row_batch_bytes = 1024;

/// Quantizes the groups [k0, k1) of a row-groups layout (row_groups, 8- or 4-bit codes; the
/// group grid in row-major order), group k of row r starting at column b being the n elements at
/// input(r, b), its stochastic draws (stochastic rounding) at draws(r, b, n). It works in batches
/// of groups that fit in the L1 cache: the statistics and parameters of a batch's groups, then
/// their codes, packed in registers. A group's codes depend on its parameters, which depend on a
/// reduction over the whole group, so encoding each group right after its own statistics makes
/// one long chain of latencies per group; a batch gives the processor a batch's independent
/// groups to overlap (MXFP8's 32-element groups gained 15-25%). Returns the non-finite count.
template <code_format Code, rounding_mode Rounding, class T, class Input, class Draws>
std::int64_t quantize_batches_simd(quantized_view const& out, quantized_layout const& l,
                                   std::int64_t k0, std::int64_t k1, Input&& input, Draws&& draws) {
  constexpr std::int64_t max_batch = 16;
  std::int64_t const g = l.tile.cols;
#if defined(AGOQ_HOST_AVX512)
  // Groups of one step (MXFP8's 32 elements): their statistics and scales 16 at a time.
  bool const small = !Code::has_zero_point && g <= simd_step;
  static_assert(small_group_batch == max_batch);
#else
  constexpr bool small = false;
#endif
  std::int64_t const batch =
      small ? max_batch
            : std::clamp<std::int64_t>(row_batch_bytes / (g * static_cast<std::int64_t>(sizeof(T))),
                                       1, max_batch);
  group_params params[max_batch];
  std::int64_t nonfinite = 0;
  for (std::int64_t kb = k0; kb < k1; kb += batch) {
    std::int64_t const ke = std::min(k1, kb + batch);
#if defined(AGOQ_HOST_AVX512)
    if constexpr (!Code::has_zero_point) {
      if (small) {
        nonfinite += small_group_params<Code, T>(
            static_cast<int>(ke - kb),
            [&](int j) {
              std::int64_t const k = kb + j;
              std::int64_t const r = k / l.group_grid_cols;
              std::int64_t const b = (k - r * l.group_grid_cols) * g;
              return std::pair<T const*, std::int64_t>(input(r, b), std::min(g, l.cols - b));
            },
            out.spec.scale, out.scales + kb * scale_bytes(out.spec.scale), params);
      }
    }
#endif
    for (std::int64_t k = kb; k < ke && !small; ++k) {
      std::int64_t const r = k / l.group_grid_cols;
      std::int64_t const b = (k - r * l.group_grid_cols) * g;
      std::int64_t const n = std::min(g, l.cols - b);
      T const* group = input(r, b);
      prefetch_ahead(group, n * static_cast<std::int64_t>(sizeof(T)));
      segment_stats const st = stats_segment_simd<Code>(group, n);
      nonfinite += st.nonfinite;
      params[k - kb] = make_group_params<Code>(out.spec.scale, st.stats);
      store_group_params(out, k, params[k - kb]);
    }
    for (std::int64_t k = kb; k < ke; ++k) {
      std::int64_t const r = k / l.group_grid_cols;
      std::int64_t const b = (k - r * l.group_grid_cols) * g;
      std::int64_t const n = std::min(g, l.cols - b);
      float const* u = nullptr;
      if constexpr (Rounding::kind == rounding_kind::stochastic) u = draws(r, b, n);
      encode_simd<Code, Rounding::kind, Code::bits>(
          input(r, b), n, params[k - kb], u, out.codes + r * l.code_row_bytes + b * Code::bits / 8);
    }
  }
  return nonfinite;
}

/// quantize along rows of groups (row_groups, 8- or 4-bit codes), the groups [k0, k1) of the
/// group grid in row-major order (so that a call of one row, a flat tensor, splits among threads
/// too).
template <code_format Code, rounding_mode Rounding, class T>
std::int64_t quantize_groups_simd(T const* x, quantized_view const& out, quantized_layout const& l,
                                  std::uint64_t seed, std::uint64_t offset, std::int64_t k0,
                                  std::int64_t k1) {
  std::vector<float> draws;
  if constexpr (Rounding::kind == rounding_kind::stochastic) {
    draws.resize(static_cast<std::size_t>(std::min(l.tile.cols, l.cols)));
  }
  return quantize_batches_simd<Code, Rounding, T>(
      out, l, k0, k1, [&](std::int64_t r, std::int64_t b) { return x + r * l.cols + b; },
      [&](std::int64_t r, std::int64_t b, std::int64_t n) {
        uniforms_simd(seed, offset + static_cast<std::uint64_t>(r * l.cols + b), n, draws.data());
        return static_cast<float const*>(draws.data());
      });
}

/// dequantize along rows of groups (row_groups, 8- or 4-bit codes), the groups [k0, k1) of the
/// group grid in row-major order, unpacking codes in registers.
template <code_format Code, class T>
std::int64_t dequantize_groups_simd(const_quantized_view const& in, quantized_layout const& l, T* y,
                                    std::int64_t k0, std::int64_t k1) {
  std::int64_t const g = l.tile.cols;
  std::int64_t nonfinite = 0;
  for (std::int64_t k = k0; k < k1; ++k) {
    std::int64_t const r = k / l.group_grid_cols;
    std::int64_t const b = (k - r * l.group_grid_cols) * g;
    std::int64_t const n = std::min(g, l.cols - b);
    group_params const p = load_group_params(in, k);
    if (!numeric::is_finite(p.scale)) nonfinite += n;
    std::uint8_t const* codes = in.codes + r * l.code_row_bytes + b * Code::bits / 8;
    prefetch_ahead(codes, n * Code::bits / 8);
    decode_simd<Code, Code::bits>(codes, n, p, y + r * l.cols + b);
  }
  return nonfinite;
}

#endif  // AGOQ_HOST_ROW_SIMD

/// quantize: statistics, parameters, codes; returns the non-finite input count.
template <code_format Code, rounding_mode Rounding, class T>
std::int64_t quantize(host_executor ex, T const* x, quantized_view const& out, std::uint64_t seed,
                      std::uint64_t offset) {
  quantized_layout const l = out.layout();
  bool const simd = ex.simd;
#if defined(AGOQ_HOST_ROW_SIMD)
  if constexpr (row_simd<Code>) {
    if (simd && row_groups(l)) {
      return parallel_sum(
          ex, l.groups(), std::min(l.tile.cols, l.cols), [&](std::int64_t k0, std::int64_t k1) {
            return quantize_groups_simd<Code, Rounding>(x, out, l, seed, offset, k0, k1);
          });
    }
  }
#endif
  return sum_over_chunks(ex, l, [&](chunk const& k, scratch& s) {
    std::int64_t const nonfinite =
        chunk_params<Code>(x, l.cols, l.tile, out.spec.scale, k.r0, k.r1, k.c0, k.c1, simd, s);
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      store_group_params(out, k.first_group + static_cast<std::int64_t>(i), s.params[i]);
    }
    for (std::int64_t r = k.r0; r < k.r1; ++r) {
      std::uint8_t* dst = out.codes + r * l.code_row_bytes + k.c0 * l.bits / 8;
      if (l.bits == 8) {
        encode_row<Code, Rounding>(x + r * l.cols, r, l.cols, l.tile, k.c0, k.c1, seed, offset,
                                   simd, s, dst);
      } else {
        s.codes.resize(static_cast<std::size_t>(k.c1 - k.c0));
        encode_row<Code, Rounding>(x + r * l.cols, r, l.cols, l.tile, k.c0, k.c1, seed, offset,
                                   simd, s, s.codes.data());
        if (simd) {
          pack_codes_simd(s.codes.data(), k.c1 - k.c0, l.bits, dst);
        } else {
          pack_codes(s.codes.data(), k.c1 - k.c0, l.bits, dst);
        }
      }
    }
    return nonfinite;
  });
}

/// dequantize: returns the count of outputs decoded under a non-finite scale.
template <code_format Code, class T>
std::int64_t dequantize(host_executor ex, const_quantized_view const& in, T* y) {
  quantized_layout const l = in.layout();
  bool const simd = ex.simd;
#if defined(AGOQ_HOST_ROW_SIMD)
  if constexpr (row_simd<Code>) {
    if (simd && row_groups(l)) {
      return parallel_sum(ex, l.groups(), std::min(l.tile.cols, l.cols),
                          [&](std::int64_t k0, std::int64_t k1) {
                            return dequantize_groups_simd<Code>(in, l, y, k0, k1);
                          });
    }
  }
#endif
  return sum_over_chunks(ex, l, [&](chunk const& k, scratch& s) {
    std::int64_t const tiles = (k.c1 - k.c0 + l.tile.cols - 1) / l.tile.cols;
    s.params.resize(static_cast<std::size_t>(tiles));
    for (std::int64_t i = 0; i < tiles; ++i) s.params[i] = load_group_params(in, k.first_group + i);
    std::int64_t nonfinite = 0;
    for (std::int64_t r = k.r0; r < k.r1; ++r) {
      std::uint8_t const* src = in.codes + r * l.code_row_bytes + k.c0 * l.bits / 8;
      std::uint8_t const* q = src;
      if (l.bits != 8) {
        s.codes.resize(static_cast<std::size_t>(k.c1 - k.c0));
        if (simd) {
          unpack_codes_simd(src, k.c1 - k.c0, l.bits, s.codes.data());
        } else {
          unpack_codes(src, k.c1 - k.c0, l.bits, s.codes.data());
        }
        q = s.codes.data();
      }
      nonfinite += decode_row<Code>(q, l.tile, k.c0, k.c1, simd, s, y + r * l.cols);
    }
    return nonfinite;
  });
}

/// fake_quantize: quantize then dequantize without storing the codes; identical to the two calls.
/// x and y may be the same buffer (same element type).
template <code_format Code, rounding_mode Rounding, class In, class Out>
std::int64_t fake_quantize(host_executor ex, spec const& sp, std::int64_t rows, std::int64_t cols,
                           In const* x, Out* y, std::uint64_t seed, std::uint64_t offset) {
  quantized_layout const l = make_layout(sp, rows, cols);
  bool const simd = ex.simd;
  return sum_over_chunks(ex, l, [&](chunk const& k, scratch& s) {
    std::int64_t const nonfinite =
        chunk_params<Code>(x, cols, l.tile, sp.scale, k.r0, k.r1, k.c0, k.c1, simd, s);
    s.codes.resize(static_cast<std::size_t>(k.c1 - k.c0));
    for (std::int64_t r = k.r0; r < k.r1; ++r) {
      encode_row<Code, Rounding>(x + r * cols, r, cols, l.tile, k.c0, k.c1, seed, offset, simd, s,
                                 s.codes.data());
      decode_row<Code>(s.codes.data(), l.tile, k.c0, k.c1, simd, s, y + r * cols);
    }
    return nonfinite;
  });
}

}  // namespace agoq::detail::host
