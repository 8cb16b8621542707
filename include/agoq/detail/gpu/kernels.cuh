/// \file
/// The CUDA kernels of quantize, dequantize and fake-quantize. Only `__global__` wrappers and
/// their per-thread bodies live here; the math is numeric/codec.hpp's, the thread-to-element map
/// device/partition.hpp's, and the launchers are in quantize.cuh.
///
/// Two quantize paths:
/// - one pass for per-group schemes with G in {32, 64, 128, 256}: the lanes holding a group reduce
///   its statistics with shuffles and each encodes its own elements; G / 32 lanes of four runs of
///   8 where whole groups tile the rows and the input is aligned (quantize_groups_linear), G / 8
///   lanes of one run elsewhere;
/// - three passes for every other grouping (tensor, row, column, blocks, other G): statistics
///   into per-group accumulators with atomics, one thread per group for the parameters, then the
///   encoding. Input is read twice, which these groupings need anyway.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

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

/// Runs each thread of the linear fast paths handles per loop iteration, all loaded before the
/// first is used: more bytes in flight per thread hide the memory latency that one 16-byte load
/// per iteration left exposed.
inline constexpr int runs_in_flight_log2 = 2;
inline constexpr int runs_in_flight = 1 << runs_in_flight_log2;

/// The linear kernels' block-uniform loop over the slots of `runs` runs in whole groups of
/// 2^runs_per_group_log2 runs, 2^slot_runs_log2 runs per slot (device::linear_group_slot): calls
/// f(slot, active) with the same number of iterations in every thread of a block; an inactive slot
/// (past the end) names runs of the first group and that group, so its loads (runs and group
/// parameters) stay in bounds, and must store nothing. 64-bit.
template <class F>
__device__ inline void for_each_linear_slot(std::int64_t runs, int runs_per_group_log2,
                                            int slot_runs_log2, F&& f) {
  std::int64_t const slots = runs >> slot_runs_log2;
  block_uniform_loop(slots, [&](std::int64_t t) {
    bool const active = t < slots;
    device::linear_slot s = device::linear_group_slot(t, runs_per_group_log2, slot_runs_log2);
    if (!active) {
      s.group = 0;
      s.first = s.place;
    }
    f(s, active);
  });
}

/// Reads group g's parameters with one aligned load; the same values as load_group_params.
template <class Byte>
__device__ inline group_params load_params_aligned(basic_quantized_view<Byte> const& v,
                                                   std::int64_t g) noexcept {
  group_params p;
  switch (v.spec.scale) {
    case scale_format::f32:
      p.scale = scale_f32::load(__ldg(reinterpret_cast<float const*>(v.scales) + g));
      break;
    case scale_format::bf16:
      p.scale = scale_bf16::load(__ldg(reinterpret_cast<std::uint16_t const*>(v.scales) + g));
      break;
    case scale_format::e8m0:
      p.scale = scale_e8m0::load(__ldg(v.scales + g));
      break;
  }
  if (v.zero_points) p.zero_point = __ldg(v.zero_points + g);
  return p;
}

/// The packed codes of one whole run, `run * Bits / 8` bytes, as one aligned access.
template <int Bits>
using packed_run_t =
    std::conditional_t<run * Bits == 64, std::uint64_t,
                       std::conditional_t<run * Bits == 32, std::uint32_t, std::uint16_t>>;

/// True when the quantized buffers of `v` allow the fast paths' aligned accesses: codes aligned
/// to one run's packed bytes, scales to their size.
template <int Bits, class Byte>
AGOQ_HOST_DEVICE inline bool params_and_codes_aligned(
    basic_quantized_view<Byte> const& v) noexcept {
  return aligned(v.codes, sizeof(packed_run_t<Bits>)) &&
         aligned(v.scales, v.spec.scale == scale_format::f32    ? 4
                           : v.spec.scale == scale_format::bf16 ? 2
                                                                : 1);
}

/// Whether the one-pass quantize kernel takes its linear path (quantize_groups_linear): whole
/// groups of G (a power of two, so a mask tests it) columns in every row and a 16-byte aligned
/// input. Host and device: the launcher sizes the grid by it (runs_in_flight runs per thread).
template <class T>
AGOQ_HOST_DEVICE inline bool quantize_linear(T const* x, std::int64_t cols,
                                             std::int64_t group_size) noexcept {
  return (cols & (group_size - 1)) == 0 && aligned(x, 16);
}

/// The linear fast path of the one-pass kernel, for cols % G == 0 and a 16-byte aligned input,
/// G = 8 * 2^runs_per_group_log2: whole groups then tile the tensor in row-major order (group g is
/// runs [g R, (g + 1) R), R = 2^runs_per_group_log2, run u elements [8u, 8u + 8) and codes from
/// byte u * Bits), so there is no division and no partial run. A group is held by
/// R / runs_in_flight lanes, each holding runs_in_flight of its runs (device::linear_group_slot):
/// all its loads are in flight at once, each load is coalesced with the group's other lanes', and
/// the statistics, the shuffles, the parameters and the divisor are made once per runs_in_flight
/// runs (device::quantize_group_slot).
template <class T, class Code, class Rounding>
__device__ inline void quantize_groups_linear(T const* x, quantized_view const& out,
                                              int runs_per_group_log2, std::uint64_t seed,
                                              std::uint64_t offset, unsigned long long& bad) {
  std::int64_t const runs = out.rows * (out.cols / run);
  for_each_linear_slot(
      runs, runs_per_group_log2, runs_in_flight_log2,
      [&](device::linear_slot const& slot, bool active) {
        // Inactive slots load the first group, which keeps the loads unpredicated.
        float v[runs_in_flight][run];
#pragma unroll
        for (int k = 0; k < runs_in_flight; ++k) {
          load_aligned_run<true>(x + (slot.first + k * slot.lanes) * run, v[k]);
        }
        bad += static_cast<unsigned long long>(
            device::quantize_group_slot<Code, Rounding>(out, slot, active, v, seed, offset));
      });
}

/// One-pass quantization of per-group schemes with G = 8 * 2^lanes_log2 (G / 8 lanes of one run
/// per group, or the linear path): one kernel for every G of the path, the group size a run-time
/// value.
template <class T, class Code, class Rounding>
AGOQ_KERNEL void quantize_groups_kernel(T const* x, quantized_view out, int lanes_log2,
                                        std::uint64_t seed, std::uint64_t offset,
                                        unsigned long long* nonfinite) {
  int const lanes = 1 << lanes_log2;
  std::int64_t const group_size = std::int64_t{lanes} * run;
  std::int64_t const rows = out.rows, cols = out.cols;
  unsigned long long bad = 0;
  if (quantize_linear(x, cols, group_size)) {
    quantize_groups_linear<T, Code, Rounding>(x, out, lanes_log2, seed, offset, bad);
    add_warp_count(nonfinite, bad);
    return;
  }
  block_uniform_loop(device::group_lane_threads(rows, cols, lanes_log2), [&](std::int64_t t) {
    std::int64_t group = 0;
    device::element_run const r = device::group_lane_run(t, lanes_log2, rows, cols, group);
    float v[run];
    load_run(x + r.row * cols + r.col, r.count, v);
    bad += static_cast<unsigned long long>(device::quantize_group_lanes<Code, Rounding>(
        out, r.row, r.col, r.count, group, static_cast<unsigned>(t & (lanes - 1)), lanes, v, seed,
        offset));
  });
  add_warp_count(nonfinite, bad);
}

/// Sets accumulators to the neutral elements: absmax 0, min INT_MAX, max INT_MIN. A template (of
/// nothing) as every kernel of these headers must be: a plain kernel defined in a header is
/// defined again in every translation unit that includes it, which the linker refuses (nvcc
/// ignores `inline` on a kernel, with a warning).
template <class = void>
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

/// Whether dequantization takes its linear path (dequantize_linear): a per-group scheme whose G is
/// a power of two of at least 8 * runs_in_flight dividing cols, a 16-byte aligned output, codes and
/// scales aligned to their accesses. Host and device: the launcher sizes the grid by it.
template <class Code, class T>
AGOQ_HOST_DEVICE inline bool dequantize_linear_applies(const_quantized_view const& in,
                                                       quantized_layout const& l,
                                                       T const* y) noexcept {
  return in.spec.grouping == grouping_kind::group && l.tile.rows == 1 &&
         l.tile.cols >= run * runs_in_flight && (l.tile.cols & (l.tile.cols - 1)) == 0 &&
         l.cols % l.tile.cols == 0 && aligned(y, 16) && params_and_codes_aligned<Code::bits>(in);
}

/// The linear fast path of dequantization, for per-group schemes whose G is a power of two of at
/// least 8 * runs_in_flight dividing cols, and aligned buffers (groups then tile the tensor in
/// row-major order): each thread holds runs_in_flight runs of one group
/// (device::linear_group_slot), so it loads their codes at once and the group's parameters once.
template <class T, class Code>
__device__ inline void dequantize_linear(const_quantized_view const& in, quantized_layout const& l,
                                         T* y, unsigned long long& bad) {
  int const runs_log2 = __ffsll(l.tile.cols / run) - 1;  // runs per group = 2^runs_log2
  std::int64_t const runs = l.rows * (l.cols / run);
  for_each_linear_slot(
      runs, runs_log2, runs_in_flight_log2, [&](device::linear_slot const& slot, bool active) {
        if (!active) return;
        auto const* codes = reinterpret_cast<packed_run_t<Code::bits> const*>(in.codes);
        packed_run_t<Code::bits> w[runs_in_flight];
#pragma unroll
        for (int k = 0; k < runs_in_flight; ++k) w[k] = __ldg(codes + slot.first + k * slot.lanes);
        group_params const p = load_params_aligned(in, slot.group);
        if (!numeric::is_finite(p.scale)) bad += run * runs_in_flight;
#pragma unroll
        for (int k = 0; k < runs_in_flight; ++k) {
          float v[run];
          device::dequantize_packed<Code>(static_cast<std::uint64_t>(w[k]), p, v);
          store_aligned_run(y + (slot.first + k * slot.lanes) * run, v);
        }
      });
}

/// Dequantization, one run per thread; counts outputs decoded under a non-finite scale.
template <class T, class Code>
AGOQ_KERNEL void dequantize_kernel(const_quantized_view in, quantized_layout l, T* y,
                                   unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  if (dequantize_linear_applies<Code>(in, l, y)) {
    dequantize_linear<T, Code>(in, l, y, bad);
    add_warp_count(nonfinite, bad);
    return;
  }
  std::int64_t const units = device::unit_count(l.rows, l.cols);
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
