/// \file
/// The CUDA executor's fused producer/consumer ops (the twins of fused.hpp's): RMSNorm, SwiGLU,
/// GeLU (tanh approximation) and the residual add, stream-ordered on a cuda_executor, every
/// tensor in device memory. Needs nvcc.
///
/// Saved copies: for per-group schemes with G in {32, 64, 128, 256} the forward kernel quantizes
/// the saved tensor from the registers it loaded for the op (G / 8 lanes per group, the building
/// blocks of device/epilogue.cuh), so the tensor is read once; for every other grouping the op
/// runs plain and the saved tensor is quantized by quantize_async's kernels in a second pass.
/// Either way the codes, scales and zero points equal agoq::quantize's bit for bit (the same
/// numeric/codec.hpp math at the same stream positions).
///
/// Outputs: every fp32 step is written as the explicit operation the CPU executor performs
/// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, and __fmaf_rn exactly where the CPU executor
/// multiplies-adds: its explicit fmas, in the AVX-512 loops and in the portable ones), so nvcc
/// contracts nothing on its own and the results equal the CPU executor's bit for bit: RMSNorm
/// (y, rstd, dx, dweight; the sums of squares and of w·dy·x̂ run as 16 lanes, lane j taking the
/// elements j mod 16 in order, combined by the same pairwise tree; dweight's sum over the rows in
/// fused_detail::dweight_block_rows blocks, each folded in row order, then added in block order)
/// and the residual add. SwiGLU and GeLU call the very functions the
/// CPU executor calls per element (fused_detail::swiglu, swiglu_grads, gelu, gelu_grad: explicit
/// fmas, agoq's e^x of numeric/exp.hpp rather than CUDA's expf), so their outputs equal the CPU
/// executor's bit for bit too.
///
/// Element types float, bfloat16 and half for every operand. Host functions validate (extents,
/// null or pageable host pointers, specs, eps, overlaps: agoq::invalid_argument, as the CPU ops)
/// and enqueue; they do not synchronize. An optional `nonfinite` points to one device-accessible
/// std::int64_t that receives the op's count (the CPU op's return value) in stream order.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "../quantize.cuh"
#include "fused.hpp"
#include "statistics.cuh"

namespace agoq::activation {

namespace fused_gpu {

using agoq::detail::gpu::add_warp_count;
using agoq::detail::gpu::check_device_pointers;
using agoq::detail::gpu::run;
using agoq::detail::gpu::run_log2;

/// Threads of the row kernels (RMSNorm): one block per row, each thread a run of 8 columns of
/// each chunk of 2048.
inline constexpr int row_threads = 256;
inline constexpr std::int64_t chunk = std::int64_t{row_threads} * run;
/// The 16 lanes of the CPU executor's sums (fused_detail::lane_sum).
inline constexpr int sum_lanes = 16;

/// No saved copy in the kernel (the plain op, or a grouping saved by a second pass).
struct no_save {
  static constexpr bool grouped = false;
  static constexpr bool slots = false;
  static constexpr int lanes_log2 = 0;
  __device__ int operator()(std::int64_t, std::int64_t, int, std::int64_t, unsigned,
                            float const (&)[run]) const noexcept {
    return 0;
  }
  /// Named by the ops' slot lambdas, which are never called without slots.
  template <int Runs>
  __device__ int slot(device::linear_slot const&, bool, float const (&)[Runs][run]) const noexcept {
    return 0;
  }
};

/// The saved copy of a per-group scheme with G = 8 * 2^lanes_log2 (G in {32, 64, 128, 256}), from
/// the lanes holding a group. The group size is a run-time value, so one kernel of each op serves
/// every G of a code and rounding (a quarter of the kernels, which the dispatch compiles for every
/// code, rounding and operand type).
template <class Code, class Rounding>
struct lane_save {
  static constexpr bool grouped = true;
  /// Whether the ops take two-run slots where whole groups tile the rows: for the symmetric integer
  /// codes (the default policy's), whose lean encoder they serve; other codes keep one run per
  /// lane, which also keeps the many kernels of the dispatch small to compile.
  static constexpr bool slots = Code::kind == code_kind::int_sym;
  quantized_view out;
  std::uint64_t seed;
  std::uint64_t offset;
  int lanes_log2;  ///< log2 of the lanes of one run holding a group, 2 to 5
  __device__ int operator()(std::int64_t row, std::int64_t col, int count, std::int64_t group,
                            unsigned lane, float const (&v)[run]) const noexcept {
    return device::quantize_group_lanes<Code, Rounding>(out, row, col, count, group, lane,
                                                        1 << lanes_log2, v, seed, offset);
  }
  /// The saved copy of the Runs runs one lane holds of a group where whole groups tile the rows
  /// (device::quantize_group_slot, 2^lanes_log2 / Runs lanes per group).
  template <int Runs>
  __device__ int slot(device::linear_slot const& s, bool active,
                      float const (&v)[Runs][run]) const noexcept {
    return device::quantize_group_slot<Code, Rounding>(out, s, active, v, seed, offset);
  }
};

/// Runs a thread of the forward ops holds of one group where whole groups tile the rows: two, as
/// the ops' own values and temporaries share the registers (four took the residual add and GeLU to
/// 80 and 86 registers on sm_90, two leave them at 47 and 48).
inline constexpr int slot_runs_log2 = 1;
inline constexpr int slot_runs = 1 << slot_runs_log2;

/// Calls f(run, 0, 0) for every thread's run of 8 columns of a [rows, cols] tensor
/// (device::unit_run). 64-bit.
template <class F>
__device__ inline void for_each_unit(std::int64_t rows, std::int64_t cols, F&& f) {
  agoq::detail::gpu::block_uniform_loop(device::unit_count(rows, cols), [&](std::int64_t u) {
    f(device::unit_run(u, rows, cols), std::int64_t{0}, 0u);
  });
}

/// Calls f(run, group, lane) for every thread's run of a [rows, cols] tensor with 2^lanes_log2
/// lanes per group of 8 * 2^lanes_log2 columns (device::group_lane_run; every lane of a warp
/// calls f together). 64-bit.
template <class F>
__device__ inline void for_each_group_lane(std::int64_t rows, std::int64_t cols, int lanes_log2,
                                           F&& f) {
  std::int64_t const threads = device::group_lane_threads(rows, cols, lanes_log2);
  std::int64_t const lane_mask = (std::int64_t{1} << lanes_log2) - 1;
  agoq::detail::gpu::block_uniform_loop(threads, [&](std::int64_t t) {
    std::int64_t group = 0;
    device::element_run const r = device::group_lane_run(t, lanes_log2, rows, cols, group);
    f(r, group, static_cast<unsigned>(t & lane_mask));
  });
}

/// The forward ops' walk over a save `Save`: where Save::slots (a grouped save whose group of
/// 2^lanes_log2 runs, at least 4, can be held in slots of slot_runs runs) and whole groups tile
/// the rows, calls slot(s, active) for every thread's slot of slot_runs runs of one group
/// (device::linear_group_slot, flat row-major runs; every lane of a warp calls it together; an
/// inactive slot, past the end, names runs of the first group and must store nothing), so that
/// the save reduces each group once per slot_runs runs; else for_each_group_lane for a grouped
/// save, for_each_unit for no_save. `slot` may be a generic lambda: it is instantiated only where
/// Save::slots. 64-bit.
template <class Save, class Each, class Slot>
__device__ inline void for_each_run_or_slot(std::int64_t rows, std::int64_t cols, Save const& save,
                                            Each&& each, Slot&& slot) {
  if constexpr (Save::slots) {
    if ((cols & ((std::int64_t{run} << save.lanes_log2) - 1)) == 0) {
      agoq::detail::gpu::for_each_linear_slot(rows * (cols / run), save.lanes_log2, slot_runs_log2,
                                              slot);
      return;
    }
  }
  if constexpr (Save::grouped) {
    for_each_group_lane(rows, cols, save.lanes_log2, each);
  } else {
    for_each_unit(rows, cols, each);
  }
}

/// The flat index of run k of a slot's first element.
__device__ inline std::int64_t slot_at(device::linear_slot const& s, int k) noexcept {
  return (s.first + k * s.lanes) * run;
}

/// Decodes the run r of a saved tensor (any grouping) as Code; returns the values decoded under a
/// non-finite stored scale.
template <class Code>
__device__ inline int decode_run_as(const_quantized_view const& in, quantized_layout const& l,
                                    device::element_run const& r, float (&v)[run]) noexcept {
  int bad = 0;
  std::uint8_t q[run];
  device::unpack_fragment<Code::bits>(
      agoq::detail::gpu::load_codes<Code::bits>(
          in.codes + r.row * l.code_row_bytes + r.col * Code::bits / 8, r.count),
      q);
  agoq::detail::gpu::params_cursor<const_quantized_view> groups(in, l, r);
#pragma unroll
  for (int i = 0; i < run; ++i) {
    v[i] = 0.0f;
    if (i >= r.count) continue;
    group_params const& p = groups.at(r.col + i);
    v[i] = decode<Code>(q[i], p);
    if (!numeric::is_finite(p.scale)) ++bad;
  }
  return bad;
}

/// decode_run_as for the code of the view's spec, the first of C, Cs... that matches it, or the
/// last (the host checked the family against the list: require_code).
template <class C, class... Cs>
__device__ inline int decode_listed(type_list<C, Cs...>, const_quantized_view const& in,
                                    quantized_layout const& l, device::element_run const& r,
                                    float (&v)[run]) noexcept {
  if constexpr (sizeof...(Cs) == 0) {
    return decode_run_as<C>(in, l, r, v);
  } else {
    if (is_code_of<C>(in.spec)) return decode_run_as<C>(in, l, r, v);
    return decode_listed(type_list<Cs...>{}, in, l, r, v);
  }
}

/// decode_run_as for the code of the view's spec, one of Codes (a uniform branch; one kernel for
/// the whole list).
template <class Codes>
__device__ inline int decode_run(const_quantized_view const& in, quantized_layout const& l,
                                 device::element_run const& r, float (&v)[run]) noexcept {
  if (r.count <= 0) {
#pragma unroll
    for (int i = 0; i < run; ++i) v[i] = 0.0f;
    return 0;
  }
  return decode_listed(Codes{}, in, l, r, v);
}

/// Counts the non-finite values of v[0, count).
__device__ inline int count_nonfinite(float const (&v)[run], int count) noexcept {
  int c = 0;
#pragma unroll
  for (int i = 0; i < run; ++i) c += (i < count && !numeric::is_finite(v[i])) ? 1 : 0;
  return c;
}

/// The 16-lane sum of the CPU executor: lane j (threads 0..15 of the block's first warp) folds
/// term(i) for i = j, j + 16, ... in order with fma(a_i, b_i, acc) (term returns a_i, b_i), then
/// the pairwise tree j += j + 8, 4, 2, 1. The result is in thread 0. Called by the whole first
/// warp.
template <class F>
__device__ inline float lane_sum(std::int64_t n, F&& term) {
  float acc = 0.0f;
  unsigned const j = threadIdx.x;
  if (j < sum_lanes) {
    std::int64_t i = j;
    // Four terms' loads in flight per step; the fma chain keeps its order.
    for (; i + 3 * sum_lanes < n; i += 4 * sum_lanes) {
      float a[4], b[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) term(i + k * sum_lanes, a[k], b[k]);
#pragma unroll
      for (int k = 0; k < 4; ++k) acc = __fmaf_rn(a[k], b[k], acc);
    }
    for (; i < n; i += sum_lanes) {
      float a, b;
      term(i, a, b);
      acc = __fmaf_rn(a, b, acc);
    }
  }
#pragma unroll
  for (int w = sum_lanes / 2; w > 0; w /= 2) {
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, w));
  }
  return acc;
}

/// The rows' buffers of a row kernel: dynamic shared memory when `shared`, else `scratch` (one
/// slice of `floats` per block).
__device__ inline float* row_buffer(bool shared, float* scratch, std::int64_t floats) noexcept {
#if defined(AGOQ_DEVICE_EMULATION)
  auto* const smem = static_cast<float*>(::agoq_emulation::dynamic_shared());
#else
  extern __shared__ float smem[];
#endif
  return shared ? smem : scratch + static_cast<std::int64_t>(blockIdx.x) * floats;
}

/// Writes row `out` of `cols` elements, each thread its runs of 8 in every chunk: element c + i
/// is op(j, w[c + i]) with j = c + i, or j = c past the row's end (a tail's lanes the store
/// drops still read in bounds).
template <class W, class Out, class Op>
__device__ inline void store_weighted_row(W const* w, Out* out, std::int64_t cols, Op&& op) {
  for (std::int64_t base = 0; base < cols; base += chunk) {
    std::int64_t const c = base + std::int64_t{threadIdx.x} * run;
    if (c >= cols) continue;
    int const count = static_cast<int>(cols - c < run ? cols - c : run);
    float wv[run];
    agoq::detail::gpu::load_run(w + c, count, wv);
    float o[run];
#pragma unroll
    for (int i = 0; i < run; ++i) o[i] = op(c + i < cols ? c + i : c, wv[i]);
    agoq::detail::gpu::store_run(out + c, count, o);
  }
}

/// RMSNorm forward: one block per row (grid-stride). The row is loaded once into the block's
/// buffer (and, with Save, quantized from the registers), the first warp's 16 lanes make the sum
/// of squares, then the row is scaled from the buffer.
template <class X, class W, class Y, class Save>
AGOQ_KERNEL void rmsnorm_forward_kernel(X const* x, W const* w, float eps, Y* y, float* rstd,
                                        std::int64_t rows, std::int64_t cols, bool shared,
                                        float* scratch, Save save, unsigned long long* nonfinite) {
  float* buf = row_buffer(shared, scratch, cols);
  __shared__ float rs_shared;
  float const inv_cols = __fdiv_rn(1.0f, static_cast<float>(cols));
  // The save's groups of G = 8 * 2^lanes_log2 columns: shifts by log2(G).
  int const group_log2 = save.lanes_log2 + run_log2;
  std::int64_t const group_grid_cols = device::lane_groups_per_row(cols, save.lanes_log2);
  unsigned const lane_mask = (1u << save.lanes_log2) - 1u;
  unsigned long long bad = 0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    X const* xr = x + r * cols;
    for (std::int64_t base = 0; base < cols; base += chunk) {
      std::int64_t const c = base + std::int64_t{threadIdx.x} * run;
      int const count = static_cast<int>(c >= cols ? 0 : cols - c < run ? cols - c : run);
      float v[run] = {};
      if (count > 0) agoq::detail::gpu::load_run(xr + c, count, v);
#pragma unroll
      for (int i = 0; i < run; ++i) {
        if (i < count) buf[c + i] = v[i];
      }
      bad += static_cast<unsigned long long>(
          save(r, c, count, r * group_grid_cols + (c >> group_log2), threadIdx.x & lane_mask, v));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      float const ss = lane_sum(cols, [&](std::int64_t i, float& a, float& b) {
        a = buf[i];
        b = a;
      });
      if (threadIdx.x == 0) {
        float const rs = __fdiv_rn(1.0f, __fsqrt_rn(__fmaf_rn(ss, inv_cols, eps)));
        rstd[r] = rs;
        rs_shared = rs;
      }
    }
    __syncthreads();
    float const rs = rs_shared;
    store_weighted_row(w, y + r * cols, cols, [&](std::int64_t j, float wj) {
      return __fmul_rn(__fmul_rn(buf[j], rs), wj);
    });
    __syncthreads();  // the buffer is refilled by the next row
  }
  add_warp_count(nonfinite, bad);
}

/// RMSNorm backward, dx: one block per row. The buffer holds x̂ and dy of the row (2 cols floats);
/// the saved family is one of Codes.
template <class Codes, class DY, class W, class DX>
AGOQ_KERNEL void rmsnorm_backward_kernel(DY const* dy, const_quantized_view saved,
                                         quantized_layout l, float const* rstd, W const* w, DX* dx,
                                         bool shared, float* scratch,
                                         unsigned long long* nonfinite) {
  std::int64_t const rows = l.rows, cols = l.cols;
  float* buf = row_buffer(shared, scratch, 2 * cols);
  float* xh = buf;
  float* dv = buf + cols;
  float const inv_cols = __fdiv_rn(1.0f, static_cast<float>(cols));
  __shared__ float k_shared;
  unsigned long long bad = 0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (std::int64_t base = 0; base < cols; base += chunk) {
      std::int64_t const c = base + std::int64_t{threadIdx.x} * run;
      if (c >= cols) continue;
      device::element_run const er{r, c, static_cast<int>(cols - c < run ? cols - c : run)};
      float v[run], d[run];
      bad += static_cast<unsigned long long>(decode_run<Codes>(saved, l, er, v));
      agoq::detail::gpu::load_run(dy + r * cols + c, er.count, d);
      bad += static_cast<unsigned long long>(count_nonfinite(d, er.count));
#pragma unroll
      for (int i = 0; i < run; ++i) {
        if (i < er.count) {
          xh[c + i] = v[i];
          dv[c + i] = d[i];
        }
      }
    }
    __syncthreads();
    float const rs = rstd[r];
    if (threadIdx.x < 32) {
      float const s = lane_sum(cols, [&](std::int64_t i, float& a, float& b) {
        a = __fmul_rn(numeric::to_float(w[i]), dv[i]);
        b = xh[i];
      });
      if (threadIdx.x == 0) k_shared = __fmul_rn(__fmul_rn(rs, rs), __fmul_rn(s, inv_cols));
    }
    __syncthreads();
    float const k = k_shared;
    store_weighted_row(w, dx + r * cols, cols, [&](std::int64_t j, float wj) {
      return __fmul_rn(rs, __fmaf_rn(wj, dv[j], -__fmul_rn(xh[j], k)));
    });
    __syncthreads();
  }
  add_warp_count(nonfinite, bad);
}

/// RMSNorm backward, dweight's block sums: unit u = (block b, run of 8 columns) folds the rows of
/// block b (fused_detail::dweight_block_rows) in order from 0, p_i = fma(dy_i x̂_i, rstd, p_i), as
/// the CPU executor does, into partial[b * cols + i]. Consecutive threads take consecutive runs of
/// one block, so their loads of each row coalesce. The saved family is one of Codes.
template <class Codes, class DY>
AGOQ_KERNEL void rmsnorm_dweight_blocks_kernel(DY const* dy, const_quantized_view saved,
                                               quantized_layout l, float const* rstd,
                                               float* partial) {
  std::int64_t const rows = l.rows, cols = l.cols;
  std::int64_t const block = fused_detail::dweight_block_rows(rows);
  std::int64_t const runs = device::unit_count(1, cols);
  std::int64_t const units = runs * agoq::detail::ceil_div(rows, block);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t const b = u / runs;
    device::element_run const first = device::unit_run(u - b * runs, 1, cols);
    float acc[run] = {};
    std::int64_t const end = rows < (b + 1) * block ? rows : (b + 1) * block;
    for (std::int64_t r = b * block; r < end; ++r) {
      device::element_run const er{r, first.col, first.count};
      float v[run], d[run];
      decode_run<Codes>(saved, l, er, v);
      agoq::detail::gpu::load_run(dy + r * cols + er.col, er.count, d);
      float const rs = rstd[r];
#pragma unroll
      for (int i = 0; i < run; ++i) acc[i] = __fmaf_rn(__fmul_rn(d[i], v[i]), rs, acc[i]);
    }
    agoq::detail::gpu::store_run(partial + b * cols + first.col, first.count, acc);
  }
}

/// RMSNorm backward, dweight: one thread per run of 8 columns adds the `blocks` block sums to
/// dweight in block order, as the CPU executor does. A template of nothing, as
/// detail::gpu::init_accumulators_kernel (a plain kernel in a header breaks the link).
template <class = void>
AGOQ_KERNEL void rmsnorm_dweight_fold_kernel(float const* partial, std::int64_t blocks,
                                             std::int64_t cols, float* dweight) {
  std::int64_t const units = device::unit_count(1, cols);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    device::element_run const first = device::unit_run(u, 1, cols);
    float acc[run], p[run];
    agoq::detail::gpu::load_run(dweight + first.col, first.count, acc);
    for (std::int64_t b = 0; b < blocks; ++b) {
      agoq::detail::gpu::load_run(partial + b * cols + first.col, first.count, p);
#pragma unroll
      for (int i = 0; i < run; ++i) acc[i] = __fadd_rn(acc[i], p[i]);
    }
    agoq::detail::gpu::store_run(dweight + first.col, first.count, acc);
  }
}

/// SwiGLU forward: out = (g sigmoid(g)) u; saves gate and up through sg, su.
template <class G, class U, class O, class Save>
AGOQ_KERNEL void swiglu_forward_kernel(G const* gate, U const* up, O* out, std::int64_t rows,
                                       std::int64_t cols, Save sg, Save su,
                                       unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  auto op = [&](std::int64_t at, int count, float const(&g)[run], float const(&u)[run]) {
    float o[run];
#pragma unroll
    for (int i = 0; i < run; ++i) o[i] = fused_detail::swiglu(g[i], u[i]);
    agoq::detail::gpu::store_run(out + at, count, o);
  };
  for_each_run_or_slot(
      rows, cols, sg,
      [&](device::element_run const& r, std::int64_t group, unsigned lane) {
        float g[run] = {}, u[run] = {};
        std::int64_t const at = r.row * cols + r.col;
        if (r.count > 0) {
          agoq::detail::gpu::load_run(gate + at, r.count, g);
          agoq::detail::gpu::load_run(up + at, r.count, u);
        }
        bad += static_cast<unsigned long long>(sg(r.row, r.col, r.count, group, lane, g));
        bad += static_cast<unsigned long long>(su(r.row, r.col, r.count, group, lane, u));
        if (r.count > 0) op(at, r.count, g, u);
      },
      [&](auto const& s, bool active) {
        float g[slot_runs][run], u[slot_runs][run];
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) {
          agoq::detail::gpu::load_run(gate + slot_at(s, k), run, g[k]);
          agoq::detail::gpu::load_run(up + slot_at(s, k), run, u[k]);
        }
        bad += static_cast<unsigned long long>(sg.slot(s, active, g));
        bad += static_cast<unsigned long long>(su.slot(s, active, u));
        if (!active) return;
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) op(slot_at(s, k), run, g[k], u[k]);
      });
  add_warp_count(nonfinite, bad);
}

/// SwiGLU backward from the decoded saved gate and up (their families among Codes).
template <class Codes, class D, class DG, class DU>
AGOQ_KERNEL void swiglu_backward_kernel(D const* dout, const_quantized_view sg, quantized_layout lg,
                                        const_quantized_view su, quantized_layout lu, DG* dgate,
                                        DU* dup, unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  for_each_unit(lg.rows, lg.cols, [&](device::element_run const& r, std::int64_t, unsigned) {
    if (r.count == 0) return;
    float g[run], u[run], d[run];
    bad += static_cast<unsigned long long>(decode_run<Codes>(sg, lg, r, g));
    bad += static_cast<unsigned long long>(decode_run<Codes>(su, lu, r, u));
    std::int64_t const at = r.row * lg.cols + r.col;
    agoq::detail::gpu::load_run(dout + at, r.count, d);
    bad += static_cast<unsigned long long>(count_nonfinite(d, r.count));
    float og[run], ou[run];
#pragma unroll
    for (int i = 0; i < run; ++i) {
      fused_detail::swiglu_grads(d[i], g[i], u[i], og[i], ou[i]);
    }
    agoq::detail::gpu::store_run(dup + at, r.count, ou);
    agoq::detail::gpu::store_run(dgate + at, r.count, og);
  });
  add_warp_count(nonfinite, bad);
}

/// GeLU forward: y = x sigmoid(2z); saves x through save.
template <class X, class Y, class Save>
AGOQ_KERNEL void gelu_forward_kernel(X const* x, Y* y, std::int64_t rows, std::int64_t cols,
                                     Save save, unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  auto op = [&](std::int64_t at, int count, float const(&v)[run]) {
    float o[run];
#pragma unroll
    for (int i = 0; i < run; ++i) o[i] = fused_detail::gelu(v[i]);
    agoq::detail::gpu::store_run(y + at, count, o);
  };
  for_each_run_or_slot(
      rows, cols, save,
      [&](device::element_run const& r, std::int64_t group, unsigned lane) {
        float v[run] = {};
        std::int64_t const at = r.row * cols + r.col;
        if (r.count > 0) agoq::detail::gpu::load_run(x + at, r.count, v);
        bad += static_cast<unsigned long long>(save(r.row, r.col, r.count, group, lane, v));
        if (r.count > 0) op(at, r.count, v);
      },
      [&](auto const& s, bool active) {
        float v[slot_runs][run];
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) {
          agoq::detail::gpu::load_run(x + slot_at(s, k), run, v[k]);
        }
        bad += static_cast<unsigned long long>(save.slot(s, active, v));
        if (!active) return;
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) op(slot_at(s, k), run, v[k]);
      });
  add_warp_count(nonfinite, bad);
}

/// GeLU backward from the decoded saved input (its family among Codes):
/// dx = fused_detail::gelu_grad(dy, x̂).
template <class Codes, class DY, class DX>
AGOQ_KERNEL void gelu_backward_kernel(DY const* dy, const_quantized_view saved, quantized_layout l,
                                      DX* dx, unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  for_each_unit(l.rows, l.cols, [&](device::element_run const& r, std::int64_t, unsigned) {
    if (r.count == 0) return;
    float v[run], d[run];
    bad += static_cast<unsigned long long>(decode_run<Codes>(saved, l, r, v));
    std::int64_t const at = r.row * l.cols + r.col;
    agoq::detail::gpu::load_run(dy + at, r.count, d);
    bad += static_cast<unsigned long long>(count_nonfinite(d, r.count));
    float o[run];
#pragma unroll
    for (int i = 0; i < run; ++i) o[i] = fused_detail::gelu_grad(d[i], v[i]);
    agoq::detail::gpu::store_run(dx + at, r.count, o);
  });
  add_warp_count(nonfinite, bad);
}

/// Residual add: sum = a + b rounded to S; saves the stored sum through save.
template <class A, class B, class S, class Save>
AGOQ_KERNEL void residual_add_kernel(A const* a, B const* b, S* sum, std::int64_t rows,
                                     std::int64_t cols, Save save, unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  // The sums of one run as stored (rounded to S): the saved copy quantizes them, as the CPU op
  // does.
  auto add = [](float const(&av)[run], float const(&bv)[run], int count, float(&s)[run]) {
#pragma unroll
    for (int i = 0; i < run; ++i) {
      s[i] = i < count ? numeric::to_float(numeric::from_float<S>(__fadd_rn(av[i], bv[i]))) : 0.0f;
    }
  };
  for_each_run_or_slot(
      rows, cols, save,
      [&](device::element_run const& r, std::int64_t group, unsigned lane) {
        float s[run] = {};
        std::int64_t const at = r.row * cols + r.col;
        if (r.count > 0) {
          float av[run], bv[run];
          agoq::detail::gpu::load_run(a + at, r.count, av);
          agoq::detail::gpu::load_run(b + at, r.count, bv);
          add(av, bv, r.count, s);
          agoq::detail::gpu::store_run(sum + at, r.count, s);
        }
        bad += static_cast<unsigned long long>(save(r.row, r.col, r.count, group, lane, s));
      },
      [&](auto const& sl, bool active) {
        // Every load before the first store: the sum may be a's or b's very buffer.
        float av[slot_runs][run], bv[slot_runs][run], s[slot_runs][run];
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) {
          agoq::detail::gpu::load_run(a + slot_at(sl, k), run, av[k]);
          agoq::detail::gpu::load_run(b + slot_at(sl, k), run, bv[k]);
        }
#pragma unroll
        for (int k = 0; k < slot_runs; ++k) add(av[k], bv[k], run, s[k]);
        if (active) {
#pragma unroll
          for (int k = 0; k < slot_runs; ++k) {
            agoq::detail::gpu::store_run(sum + slot_at(sl, k), run, s[k]);
          }
        }
        bad += static_cast<unsigned long long>(save.slot(sl, active, s));
      });
  add_warp_count(nonfinite, bad);
}

// ---- host side ----

/// Lanes per group of the in-kernel saving for a per-group spec with G in {32, 64, 128, 256}; 0
/// for every other grouping (saved by a second pass).
inline int save_lanes(spec const& s) {
  return agoq::detail::gpu::one_pass(s) ? static_cast<int>(s.group_cols / run) : 0;
}

/// The code list of the plain ops (no saved copy), the host ops' own: they compile no saving
/// kernel at all.
using fused_detail::no_codes;

/// Calls launch(saver) with a lane_save for `v` (one-pass groupings; its code one of Codes) or
/// with no_save.
template <class Codes, class F>
void with_lane_save(quantized_view const* v, quantize_options opt, F&& launch) {
  if constexpr (std::is_same_v<Codes, no_codes>) {
    launch(no_save{});
  } else if (v == nullptr || save_lanes(v->spec) == 0) {
    launch(no_save{});
  } else {
    int const lanes_log2 = device::group_lanes_log2(v->spec.group_cols);
    dispatch_code<Codes>(v->spec, [&](auto code) {
      dispatch_rounding(v->spec, [&](auto rounding) {
        launch(lane_save<decltype(code), decltype(rounding)>{*v, opt.seed, opt.offset, lanes_log2});
      });
    });
  }
}

/// Saves x into v with quantize_async's kernels (a pass of its own; adds to the count). Under
/// no_codes (the plain ops, which have no view to save into) it compiles and does nothing.
template <class Codes, class T>
void launch_save(T const* x, quantized_view const& v, quantize_options opt,
                 unsigned long long* count, cudaStream_t stream) {
  if constexpr (!std::is_same_v<Codes, no_codes>) {
    dispatch_code<Codes>(v.spec, [&](auto code) {
      dispatch_rounding(v.spec, [&](auto rounding) {
        agoq::detail::gpu::launch_quantize<decltype(code), decltype(rounding)>(x, v, opt, count,
                                                                               stream);
      });
    });
  }
}

/// The second-pass save of a grouping the kernels do not save in place (adds to the count).
template <class Codes, class T>
void save_second_pass(T const* x, quantized_view const* v, quantize_options opt,
                      unsigned long long* count, cudaStream_t stream) {
  if (v != nullptr && save_lanes(v->spec) == 0) launch_save<Codes>(x, *v, opt, count, stream);
}

inline unsigned long long* start_count(std::int64_t* nonfinite, cudaStream_t stream) {
  auto* count = reinterpret_cast<unsigned long long*>(nonfinite);
  if (count != nullptr) AGOQ_CUDA_TRY(cudaMemsetAsync(count, 0, sizeof(*count), stream));
  return count;
}

/// The launch shape of a row kernel: grid, dynamic shared bytes, and a stream-ordered scratch
/// buffer (grid slices of `floats`) when the row buffer exceeds the 48 KiB of shared memory.
struct row_launch {
  unsigned grid = 1;
  std::size_t shared_bytes = 0;
  float* scratch = nullptr;
};

inline row_launch make_row_launch(std::int64_t rows, std::int64_t floats, cudaStream_t stream) {
  device::launch_policy const pol = agoq::detail::gpu::current_policy();
  row_launch rl;
  std::int64_t const bytes = floats * static_cast<std::int64_t>(sizeof(float));
  // 48 KiB of shared memory without opting in, less the kernels' few static bytes.
  if (bytes <= 48 * 1024 - 256) {
    rl.grid = agoq::detail::gpu::grid_for(rows * row_threads, pol);
    rl.shared_bytes = static_cast<std::size_t>(bytes);
  } else {
    // Long rows: a global buffer per block, fewer blocks (two per SM) to bound its size.
    rl.grid = agoq::detail::gpu::grid_for(rows * row_threads, {row_threads, 2});
    AGOQ_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&rl.scratch),
                                  static_cast<std::size_t>(bytes) * rl.grid, stream));
  }
  return rl;
}

inline void end_row_launch(row_launch const& rl, cudaStream_t stream) {
  AGOQ_CUDA_TRY(cudaGetLastError());
  if (rl.scratch != nullptr) AGOQ_CUDA_TRY(cudaFreeAsync(rl.scratch, stream));
}

/// The launch shape of an elementwise kernel over a [rows, cols] tensor (one unit per run of 8,
/// grid-stride): grid and block threads under the current device's launch policy.
struct elementwise_launch {
  unsigned grid = 1;
  int threads = 0;
};

inline elementwise_launch make_elementwise_launch(std::int64_t rows, std::int64_t cols) {
  device::launch_policy const pol = agoq::detail::gpu::current_policy();
  return {agoq::detail::gpu::grid_for(device::unit_count(rows, cols), pol), pol.block_threads};
}

/// What the ops call once their arguments are checked, before they enqueue their work: nothing,
/// or (the measured forms) the measuring of their inputs.
struct nothing {
  void operator()() const noexcept {}
};

template <class Codes, class X, class W, class Y, class Before = nothing>
void rmsnorm_forward(cuda_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                     matrix_view<Y> y, std::span<float> rstd, quantized_view const* saved,
                     quantize_options opt, std::int64_t* nonfinite, Before const& before = {}) {
  using namespace fused_detail;
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  char const* what = "rmsnorm_forward_async";
  check_rmsnorm_outputs(x, weight, y, rstd, what);
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = saved ? start_count(nonfinite, stream) : nullptr;
  if (x.size() == 0) return;
  check_device_pointers(what, {x.data_handle(), y.data_handle(), weight.data(), rstd.data()});
  if (saved) agoq::detail::gpu::check_device_view(*saved, what);
  before();
  using XT = std::remove_const_t<X>;
  using WT = std::remove_const_t<W>;
  using YT = std::remove_const_t<Y>;
  // A spanning grouping is quantized first: y may overwrite x.
  save_second_pass<Codes>(static_cast<XT const*>(x.data_handle()), saved, opt, count, stream);
  row_launch const rl = make_row_launch(rows, cols, stream);
  with_lane_save<Codes>(saved, opt, [&](auto save) {
    agoq::detail::gpu::launch(
        rmsnorm_forward_kernel<XT, WT, YT, decltype(save)>, rl.grid, row_threads, rl.shared_bytes,
        stream, x.data_handle(), static_cast<WT const*>(weight.data()), eps, y.data_handle(),
        rstd.data(), rows, cols, rl.scratch == nullptr, rl.scratch, save, count);
  });
  end_row_launch(rl, stream);
}

template <class Codes, class X, class Y, class Before = nothing>
void gelu_forward(cuda_executor ex, matrix_view<X> x, matrix_view<Y> y, quantized_view const* saved,
                  quantize_options opt, std::int64_t* nonfinite, Before const& before = {}) {
  using namespace fused_detail;
  std::int64_t const rows = x.extent(0);
  std::int64_t const cols = x.extent(1);
  char const* what = "gelu_forward_async";
  check_unary(x, y, what);
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = saved ? start_count(nonfinite, stream) : nullptr;
  if (x.size() == 0) return;
  check_device_pointers(what, {x.data_handle(), y.data_handle()});
  if (saved) agoq::detail::gpu::check_device_view(*saved, what);
  before();
  using XT = std::remove_const_t<X>;
  using YT = std::remove_const_t<Y>;
  save_second_pass<Codes>(static_cast<XT const*>(x.data_handle()), saved, opt, count, stream);
  elementwise_launch const el = make_elementwise_launch(rows, cols);
  with_lane_save<Codes>(saved, opt, [&](auto save) {
    agoq::detail::gpu::launch(gelu_forward_kernel<XT, YT, decltype(save)>, el.grid, el.threads, 0,
                              stream, x.data_handle(), y.data_handle(), rows, cols, save, count);
  });
  AGOQ_CUDA_TRY(cudaGetLastError());
}

template <class Codes, class G, class U, class O, class Before = nothing>
void swiglu_forward(cuda_executor ex, matrix_view<G> gate, matrix_view<U> up, matrix_view<O> out,
                    quantized_view const* saved_gate, quantized_view const* saved_up,
                    quantize_options opt, std::int64_t* nonfinite, Before const& before = {}) {
  using namespace fused_detail;
  std::int64_t const rows = gate.extent(0);
  std::int64_t const cols = gate.extent(1);
  char const* what = "swiglu_forward_async";
  check_binary(gate, up, out, what, "gate", "up", "out");
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = saved_gate ? start_count(nonfinite, stream) : nullptr;
  if (gate.size() == 0) return;
  check_device_pointers(what, {gate.data_handle(), up.data_handle(), out.data_handle()});
  using GT = std::remove_const_t<G>;
  using UT = std::remove_const_t<U>;
  using OT = std::remove_const_t<O>;
  quantize_options const up_opt{opt.seed, opt.offset + static_cast<std::uint64_t>(rows * cols)};
  elementwise_launch const el = make_elementwise_launch(rows, cols);
  // In-kernel saving of both needs one code, rounding and group size (the usual case: one
  // scheme from the policy); otherwise the op runs plain after second-pass saves.
  bool const together = saved_gate != nullptr && save_lanes(saved_gate->spec) != 0 &&
                        saved_gate->spec.code == saved_up->spec.code &&
                        saved_gate->spec.bits == saved_up->spec.bits &&
                        saved_gate->spec.rounding == saved_up->spec.rounding &&
                        save_lanes(saved_up->spec) == save_lanes(saved_gate->spec);
  if (saved_gate != nullptr) {
    agoq::detail::gpu::check_device_view(*saved_gate, what);
    agoq::detail::gpu::check_device_view(*saved_up, what);
  }
  before();
  if (!together) {
    if (saved_gate != nullptr) {
      launch_save<Codes>(static_cast<GT const*>(gate.data_handle()), *saved_gate, opt, count,
                         stream);
      launch_save<Codes>(static_cast<UT const*>(up.data_handle()), *saved_up, up_opt, count,
                         stream);
    }
    agoq::detail::gpu::launch(swiglu_forward_kernel<GT, UT, OT, no_save>, el.grid, el.threads, 0,
                              stream, gate.data_handle(), up.data_handle(), out.data_handle(), rows,
                              cols, no_save{}, no_save{}, count);
  } else {
    with_lane_save<Codes>(saved_gate, opt, [&](auto sg) {
      if constexpr (!std::is_same_v<decltype(sg), no_save>) {
        auto su = sg;
        su.out = *saved_up;
        su.offset = up_opt.offset;
        agoq::detail::gpu::launch(swiglu_forward_kernel<GT, UT, OT, decltype(sg)>, el.grid,
                                  el.threads, 0, stream, gate.data_handle(), up.data_handle(),
                                  out.data_handle(), rows, cols, sg, su, count);
      }
    });
  }
  AGOQ_CUDA_TRY(cudaGetLastError());
}

template <class Codes, class A, class B, class S>
void residual_add(cuda_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                  quantized_view const* saved, quantize_options opt, std::int64_t* nonfinite) {
  using namespace fused_detail;
  std::int64_t const rows = a.extent(0);
  std::int64_t const cols = a.extent(1);
  char const* what = "residual_add_async";
  check_binary(a, b, sum, what, "a", "b", "sum");
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = saved ? start_count(nonfinite, stream) : nullptr;
  if (a.size() == 0) return;
  check_device_pointers(what, {a.data_handle(), b.data_handle(), sum.data_handle()});
  if (saved) agoq::detail::gpu::check_device_view(*saved, what);
  using AT = std::remove_const_t<A>;
  using BT = std::remove_const_t<B>;
  elementwise_launch const el = make_elementwise_launch(rows, cols);
  with_lane_save<Codes>(saved, opt, [&](auto save) {
    agoq::detail::gpu::launch(residual_add_kernel<AT, BT, S, decltype(save)>, el.grid, el.threads,
                              0, stream, a.data_handle(), b.data_handle(), sum.data_handle(), rows,
                              cols, save, count);
  });
  AGOQ_CUDA_TRY(cudaGetLastError());
  // A spanning grouping is quantized from the stored sum, after it.
  save_second_pass<Codes>(static_cast<S const*>(sum.data_handle()), saved, opt, count, stream);
}

/// The fused RMSNorm forward's checks, then the op, calling `before` once they pass.
template <class Codes, class X, class W, class Y, class Before>
void rmsnorm_saving(cuda_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                    matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                    quantize_options opt, std::int64_t* nonfinite, Before const& before) {
  char const* what = "rmsnorm_forward_async";
  fused_detail::check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                                   what);
  fused_detail::check_saved(saved_x, x.extent(0), x.extent(1), what, "saved_x");
  fused_detail::check_vector(weight, x.extent(1), what, "weight");
  require_code<Codes>(saved_x.spec);
  rmsnorm_forward<Codes>(ex, x, weight, eps, y, rstd, &saved_x, opt, nonfinite, before);
}

/// The fused SwiGLU forward's checks, then the op, calling `before` once they pass.
template <class Codes, class G, class U, class O, class Before>
void swiglu_saving(cuda_executor ex, matrix_view<G> gate, matrix_view<U> up, matrix_view<O> out,
                   quantized_view saved_gate, quantized_view saved_up, quantize_options opt,
                   std::int64_t* nonfinite, Before const& before) {
  char const* what = "swiglu_forward_async";
  fused_detail::check_saved(saved_gate, gate.extent(0), gate.extent(1), what, "saved_gate");
  fused_detail::check_saved(saved_up, gate.extent(0), gate.extent(1), what, "saved_up");
  require_code<Codes>(saved_gate.spec);
  require_code<Codes>(saved_up.spec);
  swiglu_forward<Codes>(ex, gate, up, out, &saved_gate, &saved_up, opt, nonfinite, before);
}

/// The fused GeLU forward's checks, then the op, calling `before` once they pass.
template <class Codes, class X, class Y, class Before>
void gelu_saving(cuda_executor ex, matrix_view<X> x, matrix_view<Y> y, quantized_view saved_x,
                 quantize_options opt, std::int64_t* nonfinite, Before const& before) {
  fused_detail::check_saved(saved_x, x.extent(0), x.extent(1), "gelu_forward_async", "saved_x");
  require_code<Codes>(saved_x.spec);
  gelu_forward<Codes>(ex, x, y, &saved_x, opt, nonfinite, before);
}

/// An input a device measured form measures once the op's arguments are checked (before()), with
/// measure() on the device.
template <class In>
class measured_input {
 public:
  measured_input(cuda_executor ex, matrix_view<In> x) : ex_(ex), x_(x) {}

  /// The callable that measures x under the saved copy's scheme (a valid spec by then).
  auto before(quantized_view const& saved) {
    return [this, &saved] {
      stats_ = measure(ex_, x_, saved.spec);
      measured_ = true;
    };
  }

  /// The statistics: measure()'s, or for an empty tensor (whose op returns before measuring)
  /// the empty statistics measure() returns.
  tensor_stats result(quantized_view const& saved) const {
    if (measured_) return stats_;
    std::int64_t const rows = x_.extent(0);
    std::int64_t const cols = x_.extent(1);
    return stats_detail::slice_folder(
               stats_detail::make_slice_grid(rows, cols, saved.spec.tile(rows, cols)))
        .result();
  }

 private:
  cuda_executor ex_;
  matrix_view<In> x_;
  tensor_stats stats_;
  bool measured_ = false;
};

}  // namespace fused_gpu

/// RMSNorm forward on the device, fused with saving its input: the twin of
/// rmsnorm_forward(host_executor, ...) (same y, rstd and saved bits). `nonfinite` (optional,
/// device-accessible) receives the non-finite count of x. y may be x itself. Stream-ordered on
/// ex.stream; does not synchronize.
/// \throws agoq::invalid_argument as the CPU op, and on a pageable host pointer;
/// agoq::cuda_error when a CUDA call fails.
/// `Codes`: the code families whose saving kernels the call compiles (by default every family of
/// the dispatch set, as quantize_async); a saved view of another family throws
/// agoq::unsupported_scheme before anything is enqueued.
template <code_list Codes = dispatch_codes, fused_input X, fused_input W, fused_output Y>
void rmsnorm_forward_async(cuda_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                           matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                           quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  fused_gpu::rmsnorm_saving<Codes>(ex, x, weight, eps, y, saved_x, rstd, opt, nonfinite,
                                   fused_gpu::nothing{});
}

/// rmsnorm_forward_async that also returns in `stats` the statistics of x that measure(ex, x,
/// saved_x.spec) gives (the host forms' bits): once the arguments are checked, measure() runs on
/// ex.stream and synchronizes it, then the op is enqueued (so y may be x itself) and not waited
/// for. Two reads of x (measure's and the op's); on the host, rmsnorm_forward_measured reads it
/// once. \throws as rmsnorm_forward_async and measure(); a refused call writes nothing, `stats`
/// included.
template <code_list Codes = dispatch_codes, fused_input X, fused_input W, fused_output Y>
void rmsnorm_forward_measured(cuda_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                              matrix_view<Y> y, quantized_view saved_x, std::span<float> rstd,
                              tensor_stats& stats, quantize_options opt = {},
                              std::int64_t* nonfinite = nullptr) {
  fused_gpu::measured_input<X> m(ex, x);
  fused_gpu::rmsnorm_saving<Codes>(ex, x, weight, eps, y, saved_x, rstd, opt, nonfinite,
                                   m.before(saved_x));
  stats = m.result(saved_x);
}

/// The plain RMSNorm forward on the device (no saved copy): the same y and rstd bits.
/// Stream-ordered; does not synchronize. \throws as the fused overload.
template <fused_input X, fused_input W, fused_output Y>
void rmsnorm_forward_async(cuda_executor ex, matrix_view<X> x, std::span<W> weight, float eps,
                           matrix_view<Y> y, std::span<float> rstd) {
  char const* what = "rmsnorm_forward_async";
  fused_detail::check_rmsnorm_args(x, y, x.extent(1), static_cast<std::int64_t>(weight.size()), eps,
                                   what);
  fused_detail::check_vector(weight, x.extent(1), what, "weight");
  fused_gpu::rmsnorm_forward<fused_gpu::no_codes>(ex, x, weight, eps, y, rstd, nullptr, {},
                                                  nullptr);
}

/// RMSNorm backward on the device from the quantized input: the twin of
/// rmsnorm_backward(host_executor, ...) (same dx and dweight bits; dweight's sum over the rows in
/// the same blocks and orders, the blocks folded in parallel through a workspace of at most
/// 512 x hidden floats, allocated and freed in stream order). `nonfinite` receives the non-finite
/// count of dy plus the values decoded under a non-finite stored scale. dx may be dy itself.
/// Stream-ordered; does not synchronize. \throws as the CPU op, and on a pageable host pointer.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is enqueued.
template <code_list Codes = dispatch_codes, fused_input DY, fused_input W, fused_output DX>
void rmsnorm_backward_async(cuda_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                            std::span<float const> rstd, std::span<W> weight, matrix_view<DX> dx,
                            std::span<float> dweight, std::int64_t* nonfinite = nullptr) {
  using namespace fused_detail;
  char const* what = "rmsnorm_backward_async";
  check_rmsnorm_backward_args(dy, saved_x, rstd, weight, dx, dweight, what);
  require_code<Codes>(saved_x.spec);
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = fused_gpu::start_count(nonfinite, stream);
  if (dy.size() == 0) return;
  fused_gpu::check_device_pointers(
      what, {dy.data_handle(), dx.data_handle(), rstd.data(), weight.data(), dweight.data()});
  agoq::detail::gpu::check_device_view(saved_x, what);
  using DYT = std::remove_const_t<DY>;
  using WT = std::remove_const_t<W>;
  quantized_layout const l = saved_x.layout();
  // dweight first: dx may overwrite dy. Its block sums go through a stream-ordered workspace.
  device::launch_policy const pol = agoq::detail::gpu::current_policy();
  std::int64_t const blocks = agoq::detail::ceil_div(rows, dweight_block_rows(rows));
  float* partial = nullptr;
  AGOQ_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                static_cast<std::size_t>(blocks * cols) * sizeof(float), stream));
  agoq::detail::gpu::launch(fused_gpu::rmsnorm_dweight_blocks_kernel<Codes, DYT>,
                            agoq::detail::gpu::grid_for(blocks * device::unit_count(1, cols), pol),
                            pol.block_threads, 0, stream, static_cast<DYT const*>(dy.data_handle()),
                            saved_x, l, rstd.data(), partial);
  AGOQ_CUDA_TRY(cudaGetLastError());
  agoq::detail::gpu::launch(fused_gpu::rmsnorm_dweight_fold_kernel<>,
                            agoq::detail::gpu::grid_for(device::unit_count(1, cols), pol),
                            pol.block_threads, 0, stream, partial, blocks, cols, dweight.data());
  AGOQ_CUDA_TRY(cudaGetLastError());
  AGOQ_CUDA_TRY(cudaFreeAsync(partial, stream));
  fused_gpu::row_launch const rl = fused_gpu::make_row_launch(rows, 2 * cols, stream);
  agoq::detail::gpu::launch(fused_gpu::rmsnorm_backward_kernel<Codes, DYT, WT, DX>, rl.grid,
                            fused_gpu::row_threads, rl.shared_bytes, stream,
                            static_cast<DYT const*>(dy.data_handle()), saved_x, l, rstd.data(),
                            static_cast<WT const*>(weight.data()), dx.data_handle(),
                            rl.scratch == nullptr, rl.scratch, count);
  fused_gpu::end_row_launch(rl, stream);
}

/// SwiGLU forward on the device, fused with saving both inputs: the twin of
/// swiglu_forward(host_executor, ...): saved_gate and saved_up bit-identical (up at stream
/// positions offset + tokens * features on), out bit-identical.
/// `nonfinite` receives the non-finite count of gate plus that of up. out may be gate or up
/// itself. Stream-ordered; does not synchronize. \throws as the CPU op, and on a pageable host
/// pointer.
/// `Codes`: the code families whose saving kernels the call compiles (by default every family of
/// the dispatch set, as quantize_async); a saved view of another family throws
/// agoq::unsupported_scheme before anything is enqueued.
template <code_list Codes = dispatch_codes, fused_input G, fused_input U, fused_output O>
void swiglu_forward_async(cuda_executor ex, matrix_view<G> gate, matrix_view<U> up,
                          matrix_view<O> out, quantized_view saved_gate, quantized_view saved_up,
                          quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  fused_gpu::swiglu_saving<Codes>(ex, gate, up, out, saved_gate, saved_up, opt, nonfinite,
                                  fused_gpu::nothing{});
}

/// swiglu_forward_async that also returns in `stats_gate` and `stats_up` the statistics of gate
/// and up that measure(ex, gate, saved_gate.spec) and measure(ex, up, saved_up.spec) give (the host
/// forms' bits): once the arguments are checked, both are measured on ex.stream, which synchronizes
/// it, then the op is enqueued (so out may be gate or up itself) and not waited for.
/// \throws as swiglu_forward_async and measure(); a refused call writes nothing, the statistics
/// included.
template <code_list Codes = dispatch_codes, fused_input G, fused_input U, fused_output O>
void swiglu_forward_measured(cuda_executor ex, matrix_view<G> gate, matrix_view<U> up,
                             matrix_view<O> out, quantized_view saved_gate, quantized_view saved_up,
                             tensor_stats& stats_gate, tensor_stats& stats_up,
                             quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  fused_gpu::measured_input<G> mg(ex, gate);
  fused_gpu::measured_input<U> mu(ex, up);
  auto const before_g = mg.before(saved_gate);
  auto const before_u = mu.before(saved_up);
  fused_gpu::swiglu_saving<Codes>(ex, gate, up, out, saved_gate, saved_up, opt, nonfinite, [&] {
    before_g();
    before_u();
  });
  stats_gate = mg.result(saved_gate);
  stats_up = mu.result(saved_up);
}

/// The plain SwiGLU forward on the device (no saved copies). Stream-ordered.
/// \throws as the fused overload.
template <fused_input G, fused_input U, fused_output O>
void swiglu_forward_async(cuda_executor ex, matrix_view<G> gate, matrix_view<U> up,
                          matrix_view<O> out) {
  fused_gpu::swiglu_forward<fused_gpu::no_codes>(ex, gate, up, out, nullptr, nullptr, {}, nullptr);
}

/// SwiGLU backward on the device from the quantized inputs: the twin of
/// swiglu_backward(host_executor, ...). `nonfinite` receives the non-finite count of dout plus the
/// values decoded under a non-finite stored scale. dgate or dup may be dout itself (not each
/// other). Stream-ordered; does not synchronize. \throws as the CPU op, and on a pageable host
/// pointer.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is enqueued.
template <code_list Codes = dispatch_codes, fused_input D, fused_output DG, fused_output DU>
void swiglu_backward_async(cuda_executor ex, matrix_view<D> dout, const_quantized_view saved_gate,
                           const_quantized_view saved_up, matrix_view<DG> dgate,
                           matrix_view<DU> dup, std::int64_t* nonfinite = nullptr) {
  using namespace fused_detail;
  char const* what = "swiglu_backward_async";
  check_swiglu_backward_args(dout, saved_gate, saved_up, dgate, dup, what);
  require_code<Codes>(saved_gate.spec);
  require_code<Codes>(saved_up.spec);
  std::int64_t const rows = dout.extent(0);
  std::int64_t const cols = dout.extent(1);
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = fused_gpu::start_count(nonfinite, stream);
  if (dout.size() == 0) return;
  fused_gpu::check_device_pointers(what,
                                   {dout.data_handle(), dgate.data_handle(), dup.data_handle()});
  agoq::detail::gpu::check_device_view(saved_gate, what);
  agoq::detail::gpu::check_device_view(saved_up, what);
  using DT = std::remove_const_t<D>;
  fused_gpu::elementwise_launch const el = fused_gpu::make_elementwise_launch(rows, cols);
  agoq::detail::gpu::launch(fused_gpu::swiglu_backward_kernel<Codes, DT, DG, DU>, el.grid,
                            el.threads, 0, stream, static_cast<DT const*>(dout.data_handle()),
                            saved_gate, saved_gate.layout(), saved_up, saved_up.layout(),
                            dgate.data_handle(), dup.data_handle(), count);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// GeLU forward (tanh approximation) on the device, fused with saving its input: the twin of
/// gelu_forward(host_executor, ...): saved_x and y bit-identical. `nonfinite` receives the
/// non-finite count of x. y may be x itself. Stream-ordered; does not synchronize. \throws as the
/// CPU op, and on a pageable host pointer.
/// `Codes`: the code families whose saving kernels the call compiles (by default every family of
/// the dispatch set, as quantize_async); a saved view of another family throws
/// agoq::unsupported_scheme before anything is enqueued.
template <code_list Codes = dispatch_codes, fused_input X, fused_output Y>
void gelu_forward_async(cuda_executor ex, matrix_view<X> x, matrix_view<Y> y,
                        quantized_view saved_x, quantize_options opt = {},
                        std::int64_t* nonfinite = nullptr) {
  fused_gpu::gelu_saving<Codes>(ex, x, y, saved_x, opt, nonfinite, fused_gpu::nothing{});
}

/// gelu_forward_async that also returns in `stats` the statistics of x that measure(ex, x,
/// saved_x.spec) gives (the host forms' bits): once the arguments are checked, measure() runs on
/// ex.stream and synchronizes it, then the op is enqueued (so y may be x itself) and not waited
/// for. \throws as gelu_forward_async and measure(); a refused call writes nothing, `stats`
/// included.
template <code_list Codes = dispatch_codes, fused_input X, fused_output Y>
void gelu_forward_measured(cuda_executor ex, matrix_view<X> x, matrix_view<Y> y,
                           quantized_view saved_x, tensor_stats& stats, quantize_options opt = {},
                           std::int64_t* nonfinite = nullptr) {
  fused_gpu::measured_input<X> m(ex, x);
  fused_gpu::gelu_saving<Codes>(ex, x, y, saved_x, opt, nonfinite, m.before(saved_x));
  stats = m.result(saved_x);
}

/// The plain GeLU forward on the device (no saved copy). Stream-ordered.
/// \throws as the fused overload.
template <fused_input X, fused_output Y>
void gelu_forward_async(cuda_executor ex, matrix_view<X> x, matrix_view<Y> y) {
  fused_gpu::gelu_forward<fused_gpu::no_codes>(ex, x, y, nullptr, {}, nullptr);
}

/// GeLU backward (tanh approximation) on the device from the quantized input: the twin of
/// gelu_backward(host_executor, ...). `nonfinite` receives the non-finite count of dy plus the
/// values decoded under a non-finite stored scale. dx may be dy itself. Stream-ordered; does not
/// synchronize. \throws as the CPU op, and on a pageable host pointer.
/// `Codes`: the code families the call compiles its decoding for (by default every family of the
/// dispatch set); a saved view of another family throws agoq::unsupported_scheme before anything
/// is enqueued.
template <code_list Codes = dispatch_codes, fused_input DY, fused_output DX>
void gelu_backward_async(cuda_executor ex, matrix_view<DY> dy, const_quantized_view saved_x,
                         matrix_view<DX> dx, std::int64_t* nonfinite = nullptr) {
  using namespace fused_detail;
  char const* what = "gelu_backward_async";
  check_gelu_backward_args(dy, saved_x, dx, what);
  require_code<Codes>(saved_x.spec);
  std::int64_t const rows = dy.extent(0);
  std::int64_t const cols = dy.extent(1);
  cudaStream_t const stream = ex.stream.get();
  unsigned long long* count = fused_gpu::start_count(nonfinite, stream);
  if (dy.size() == 0) return;
  fused_gpu::check_device_pointers(what, {dy.data_handle(), dx.data_handle()});
  agoq::detail::gpu::check_device_view(saved_x, what);
  using DYT = std::remove_const_t<DY>;
  fused_gpu::elementwise_launch const el = fused_gpu::make_elementwise_launch(rows, cols);
  agoq::detail::gpu::launch(fused_gpu::gelu_backward_kernel<Codes, DYT, DX>, el.grid, el.threads, 0,
                            stream, static_cast<DYT const*>(dy.data_handle()), saved_x,
                            saved_x.layout(), dx.data_handle(), count);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// Residual add on the device, fused with saving the sum: the twin of
/// residual_add(host_executor, ...) (same sum and saved bits). `nonfinite` receives the non-finite
/// count of the sum. sum may be a or b itself. Stream-ordered; does not synchronize.
/// \throws as the CPU op, and on a pageable host pointer.
/// `Codes`: the code families whose saving kernels the call compiles (by default every family of
/// the dispatch set, as quantize_async); a saved view of another family throws
/// agoq::unsupported_scheme before anything is enqueued.
template <code_list Codes = dispatch_codes, fused_input A, fused_input B, fused_output S>
void residual_add_async(cuda_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                        quantized_view saved_sum, quantize_options opt = {},
                        std::int64_t* nonfinite = nullptr) {
  fused_detail::check_saved(saved_sum, a.extent(0), a.extent(1), "residual_add_async", "saved_sum");
  require_code<Codes>(saved_sum.spec);
  fused_gpu::residual_add<Codes>(ex, a, b, sum, &saved_sum, opt, nonfinite);
}

/// residual_add_async that also returns in `stats` the statistics of the sum that measure(ex, sum,
/// saved_sum.spec) gives (the host forms' bits): the op is enqueued on ex.stream, then measure()
/// reads the sum after it and synchronizes the stream. sum may be a or b itself.
/// \throws as residual_add_async and measure(); a refused call writes nothing, `stats` included.
template <code_list Codes = dispatch_codes, fused_input A, fused_input B, fused_output S>
void residual_add_measured(cuda_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum,
                           quantized_view saved_sum, tensor_stats& stats, quantize_options opt = {},
                           std::int64_t* nonfinite = nullptr) {
  residual_add_async<Codes>(ex, a, b, sum, saved_sum, opt, nonfinite);
  stats = measure(ex, sum, saved_sum.spec);
}

/// The plain residual add on the device (no saved copy), same sum bits. Stream-ordered.
/// \throws as the fused overload.
template <fused_input A, fused_input B, fused_output S>
void residual_add_async(cuda_executor ex, matrix_view<A> a, matrix_view<B> b, matrix_view<S> sum) {
  fused_gpu::residual_add<fused_gpu::no_codes>(ex, a, b, sum, nullptr, {}, nullptr);
}

}  // namespace agoq::activation
