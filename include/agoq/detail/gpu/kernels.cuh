/// \file
/// The CUDA kernels of quantize, dequantize and fake-quantize. Only `__global__` wrappers and
/// their per-thread bodies live here; the math is numeric/codec.hpp's, the thread-to-element map
/// device/partition.hpp's, and the launchers are in quantize.cuh.
///
/// Two quantize paths:
/// - one pass for per-group schemes with G in {32, 64, 128, 256}: G / 8 consecutive lanes load a
///   group, reduce its statistics with shuffles, and each encodes its own 8 elements;
/// - three passes for every other grouping (tensor, row, column, blocks, other G): statistics
///   into per-group accumulators with atomics, one thread per group for the parameters, then the
///   encoding. Input is read twice, which these groupings need anyway.
#pragma once

#include <climits>
#include <cstdint>

#include "../../device/epilogue.cuh"
#include "../../device/partition.hpp"
#include "../../device/thread.hpp"
#include "../../device/warp.cuh"
#include "../../layout/layout.hpp"
#include "../../layout/params.hpp"
#include "../../layout/view.hpp"
#include "memory.cuh"

namespace agoq::detail::gpu {

/// Per-group accumulator of the three-pass path: the magnitude bits of the absolute maximum and
/// order-preserving integers of the minimum and maximum (atomics on integers are exact).
struct group_accumulator {
  unsigned int absmax_bits;
  int min_ordered;
  int max_ordered;
};

__device__ inline int ordered_int(float f) noexcept {
  int const s = __float_as_int(f);
  return s ^ ((s >> 31) & 0x7fffffff);
}

__device__ inline float from_ordered(int o) noexcept {
  return __int_as_float(o ^ ((o >> 31) & 0x7fffffff));
}

/// Adds a per-thread count into *total once per warp. All lanes of the warp must call it.
__device__ inline void add_warp_count(unsigned long long* total, unsigned long long n) noexcept {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) n += __shfl_xor_sync(0xffffffffu, n, d);
  if (total != nullptr && (threadIdx.x & 31u) == 0 && n != 0) atomicAdd(total, n);
}

/// A grid-stride loop over [0, total) in which every thread of a block runs the same number of
/// iterations (indices past the end included), so warp shuffles inside `f` are safe; 64-bit.
template <class F>
__device__ inline void block_uniform_loop(std::int64_t total, F&& f) {
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x; base < total;
       base += step) {
    f(base + threadIdx.x);
  }
}

/// One-pass quantization of per-group schemes with G = Lanes * 8.
template <class T, class Code, class Rounding, int Lanes>
AGOQ_KERNEL void quantize_groups_kernel(T const* x, quantized_view out, std::uint64_t seed,
                                        std::uint64_t offset, unsigned long long* nonfinite) {
  constexpr std::int64_t group_size = std::int64_t{Lanes} * run;
  std::int64_t const rows = out.rows, cols = out.cols;
  std::int64_t const threads = rows * ((cols + group_size - 1) / group_size) * Lanes;
  unsigned long long bad = 0;
  block_uniform_loop(threads, [&](std::int64_t t) {
    std::int64_t group = 0;
    device::element_run const r = device::group_lane_run(t, group_size, rows, cols, group);
    float v[run];
    load_run(x + r.row * cols + r.col, r.count, v);
    bad += static_cast<unsigned long long>(device::quantize_group_lanes<Code, Rounding, Lanes>(
        out, r.row, r.col, r.count, group, static_cast<unsigned>(t % Lanes), v, seed, offset));
  });
  add_warp_count(nonfinite, bad);
}

/// Sets accumulators to the neutral elements: absmax 0, min INT_MAX, max INT_MIN.
AGOQ_KERNEL void init_accumulators_kernel(group_accumulator* acc, std::int64_t groups) {
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    acc[g] = group_accumulator{0u, INT_MAX, INT_MIN};
  }
}

/// Pass 1 of the three-pass path: group statistics into accumulators. A thread keeps its running
/// statistics while consecutive runs stay in one group and flushes them with atomics when the
/// group changes, so a per-tensor group costs one atomic per thread, not per element.
template <class T, class Code>
AGOQ_KERNEL void stats_kernel(T const* x, quantized_layout l, group_accumulator* acc,
                              unsigned long long* nonfinite) {
  std::int64_t const units = device::unit_count(l.rows, l.cols);
  unsigned long long bad = 0;
  std::int64_t current = -1;
  group_stats st;
  bool any = false;
  auto flush = [&]() {
    if (current < 0 || !any) return;
    if constexpr (Code::has_zero_point) {
      atomicMin(&acc[current].min_ordered, ordered_int(st.min));
      atomicMax(&acc[current].max_ordered, ordered_int(st.max));
    } else {
      atomicMax(&acc[current].absmax_bits, __float_as_uint(st.absmax));
    }
  };
  block_uniform_loop(units, [&](std::int64_t u) {
    device::element_run const r = device::unit_run(u, l.rows, l.cols);
    float v[run];
    load_run(x + r.row * l.cols + r.col, r.count, v);
    device::group_cursor cursor(r.row, r.col, l.tile, l.group_grid_cols);
#pragma unroll
    for (int i = 0; i < run; ++i) {
      if (i >= r.count) break;
      cursor.advance(r.col + i);
      std::int64_t const g = cursor.group;
      if (g != current) {
        flush();
        current = g;
        st = group_stats{};
        any = false;
      }
      float const one[1] = {v[i]};
      bad += static_cast<unsigned long long>(device::fragment_stats(one, 1, st, any));
    }
  });
  flush();
  add_warp_count(nonfinite, bad);
}

/// Pass 2: one thread per group turns the accumulators into stored scales and zero points.
template <class Code>
AGOQ_KERNEL void params_kernel(group_accumulator const* acc, quantized_view out,
                               std::int64_t groups) {
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    group_accumulator const a = acc[g];
    group_stats st;
    st.absmax = __uint_as_float(a.absmax_bits);
    if (a.min_ordered <= a.max_ordered) {
      st.min = from_ordered(a.min_ordered);
      st.max = from_ordered(a.max_ordered);
    }
    store_group_params(out, g, make_group_params<Code>(out.spec.scale, st));
  }
}

/// A thread's walk over the groups of its run, loading each group's stored parameters once (as
/// `Params`: group_params, or group_encoding to encode).
template <class View, class Params = group_params>
struct params_cursor {
  View const& view;
  device::group_cursor cursor;
  std::int64_t current = -1;
  Params params{group_params{}};

  __device__ params_cursor(View const& v, quantized_layout const& l, device::element_run const& r)
      : view(v), cursor(r.row, r.col, l.tile, l.group_grid_cols) {}

  /// The parameters of column `col` of the run's row (columns visited in increasing order).
  __device__ Params const& at(std::int64_t col) {
    cursor.advance(col);
    if (cursor.group != current) {
      current = cursor.group;
      params = Params(load_group_params(view, current));
    }
    return params;
  }
};

/// Pass 3: encoding with the stored parameters, one run per thread.
template <class T, class Code, class Rounding>
AGOQ_KERNEL void encode_kernel(T const* x, quantized_view out, quantized_layout l,
                               std::uint64_t seed, std::uint64_t offset) {
  std::int64_t const units = device::unit_count(l.rows, l.cols);
  block_uniform_loop(units, [&](std::int64_t u) {
    device::element_run const r = device::unit_run(u, l.rows, l.cols);
    if (r.count == 0) return;
    float v[run];
    load_run(x + r.row * l.cols + r.col, r.count, v);
    std::uint8_t q[run] = {};
    params_cursor<quantized_view, group_encoding> groups(out, l, r);
    float draws[run];
    if constexpr (Rounding::kind == rounding_kind::stochastic) {
      device::fragment_draws(seed, offset + static_cast<std::uint64_t>(r.row * l.cols + r.col),
                             draws);
    }
#pragma unroll
    for (int i = 0; i < run; ++i) {
      if (i >= r.count) break;
      group_encoding const& g = groups.at(r.col + i);
      if constexpr (Rounding::kind == rounding_kind::stochastic) {
        q[i] = encode_stochastic<Code>(v[i], g, draws[i]);
      } else {
        q[i] = encode_nearest<Code>(v[i], g);
      }
    }
    device::store_packed<Code::bits, run>(
        out.codes + r.row * l.code_row_bytes + r.col * Code::bits / 8, r.count,
        device::pack_fragment<Code::bits>(q, r.count));
  });
}

/// Dequantization, one run per thread; counts outputs decoded under a non-finite scale.
template <class T, class Code>
AGOQ_KERNEL void dequantize_kernel(const_quantized_view in, quantized_layout l, T* y,
                                   unsigned long long* nonfinite) {
  std::int64_t const units = device::unit_count(l.rows, l.cols);
  unsigned long long bad = 0;
  block_uniform_loop(units, [&](std::int64_t u) {
    device::element_run const r = device::unit_run(u, l.rows, l.cols);
    if (r.count > 0) {
      std::uint8_t q[run];
      device::unpack_fragment<Code::bits>(
          load_codes<Code::bits>(in.codes + r.row * l.code_row_bytes + r.col * Code::bits / 8,
                                 r.count),
          q);
      float v[run] = {};
      params_cursor<const_quantized_view> groups(in, l, r);
#pragma unroll
      for (int i = 0; i < run; ++i) {
        if (i >= r.count) break;
        group_params const& p = groups.at(r.col + i);
        v[i] = decode<Code>(q[i], p);
        if (!numeric::is_finite(p.scale)) ++bad;
      }
      store_run(y + r.row * l.cols + r.col, r.count, v);
    }
  });
  add_warp_count(nonfinite, bad);
}

}  // namespace agoq::detail::gpu
