/// \file
/// The CUDA form of measure() (statistics.hpp): the same slices summed by the same per-lane
/// functions on the device, a half warp per slice (a thread per lane), then folded on the host in
/// the same order, so it returns the host's bits. Needs nvcc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "../cuda_check.hpp"
#include "../detail/gpu/allocation.cuh"
#include "../quantize.cuh"
#include "statistics.hpp"

namespace agoq::activation {

namespace stats_detail {

/// Slots measured per device pass (their partials are 72 MiB, on the device and on the host).
inline constexpr std::int64_t device_chunk_slots = std::int64_t{1} << 20;

/// The pairwise sum of the 16 lanes of a half warp (pairwise_sum's order: after the shift by
/// `off`, lane j holds the sum of lanes j to j + 2 off - 1 for j a multiple of 2 off), in lane 0.
__device__ inline double half_warp_pairwise_sum(double v, unsigned mask) noexcept {
  for (int off = 1; off < slice_lanes; off *= 2) v += __shfl_down_sync(mask, v, off, slice_lanes);
  return v;
}

/// The dead zones of the `count` elements at `xs` (a slice) under group absmax `absmax` into
/// p.dead_energy, p.live and p.live_gap_sq: thread `lane` of the half warp `mask` adds its lane's
/// elements (lane_dead_zone; at 2 bits lane_live_gap too), the lanes combine in pairwise_sum's
/// order; lane 0 ends with the sums.
template <class T>
__device__ void slice_dead_zones(T const* xs, std::int64_t count, float absmax, int lane,
                                 unsigned mask, slice_partial& p) {
  lane_live_gap gap;
  for (int w = 0; w < dead_zone_widths; ++w) {
    float const t = half_step(absmax, w);
    lane_dead_zone dz;
    for (std::int64_t k = lane; k < count; k += slice_lanes) {
      float const v = numeric::to_float(xs[k]);
      bool const live = dz.add(v, t);
      if (w == 0) gap.add(v, live, absmax);  // 2 bits
    }
    p.dead_energy[w] = half_warp_pairwise_sum(dz.sum, mask);
    for (int off = 1; off < slice_lanes; off *= 2)
      dz.live += __shfl_xor_sync(mask, dz.live, off, slice_lanes);
    p.live[w] = dz.live;
  }
  p.live_gap_sq = half_warp_pairwise_sum(gap.sum, mask);
}

/// out[i] = the statistics of slot first + i, for i in [0, n): 16 threads (a half warp) per slice,
/// thread j its lane j (lane_stats, lane_dead_zone, lane_live_gap), so its loads of 16 consecutive
/// elements coalesce; the lanes combine by shuffles in pairwise_sum's order. With `group_absmax`
/// (the second pass of a grid that is not one_pass; indexed by slice_grid::group_of) only the dead
/// zones, under the slice's group's absmax.
template <class T>
__global__ void measure_slices_kernel(T const* x, slice_grid g, std::int64_t first, std::int64_t n,
                                      float const* group_absmax, slice_partial* out) {
  int const lane = static_cast<int>(threadIdx.x) % slice_lanes;
  unsigned const mask = (threadIdx.x & 16u) != 0 ? 0xffff0000u : 0x0000ffffu;
  std::int64_t const stride = std::int64_t{gridDim.x} * blockDim.x / slice_lanes;
  for (std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / slice_lanes; i < n;
       i += stride) {
    std::int64_t const slot = first + i;
    std::int64_t const row = slot / g.per_row();
    std::int64_t c0 = 0, count = 0;
    g.columns(slot % g.per_row(), c0, count);
    T const* xs = x + row * g.cols + c0;
    slice_partial p;
    if (group_absmax != nullptr) {
      slice_dead_zones(xs, count, group_absmax[g.group_of(row, slot % g.per_row())], lane, mask, p);
      if (lane == 0) out[i] = p;
      continue;
    }
    lane_stats st;
    for (std::int64_t k = lane; k < count; k += slice_lanes) st.add(numeric::to_float(xs[k]));
    p.sum_squares = half_warp_pairwise_sum(st.sum, mask);
    for (int off = 1; off < slice_lanes; off *= 2) {  // every lane ends with the merged extrema
      lane_stats o;
      o.absmax = __shfl_xor_sync(mask, st.absmax, off, slice_lanes);
      o.lo = __shfl_xor_sync(mask, st.lo, off, slice_lanes);
      o.hi = __shfl_xor_sync(mask, st.hi, off, slice_lanes);
      o.finite = __shfl_xor_sync(mask, st.finite, off, slice_lanes);
      st.merge_extrema(o);
    }
    p.absmax = st.absmax;
    p.lo = st.lo;
    p.hi = st.hi;
    p.finite = st.finite;
    if (g.one_pass()) slice_dead_zones(xs, count, p.absmax, lane, mask, p);
    if (lane == 0) out[i] = p;
  }
}

/// measure() on the device, `chunk` slots per pass (the public form uses device_chunk_slots; the
/// tests pass small chunks to cross pass boundaries). Where the grid is not one_pass, every slot's
/// statistics are measured and folded first, then the groups' absmax copied to the device and
/// every slot's dead zones measured and folded (slice_folder's second pass).
template <class In>
tensor_stats measure_in_chunks(cuda_executor ex, matrix_view<In> x, tile_shape tile,
                               std::int64_t chunk) {
  slice_grid const g = make_slice_grid(x.extent(0), x.extent(1), tile);
  agoq::detail::check_data(x.data_handle(), x.size(), "measure");
  agoq::detail::gpu::check_device_pointer(x.data_handle(), "measure");
  AGOQ_EXPECTS(chunk >= 1, "measure: chunk must be positive");
  slice_folder fold(g);
  std::int64_t const slots = g.slots();
  if (slots == 0) return fold.result();
  cudaStream_t const stream = ex.stream.get();
  std::int64_t const per_pass = std::min(chunk, slots);
  auto const bytes = static_cast<std::size_t>(per_pass) * sizeof(slice_partial);
  agoq::detail::gpu::stream_allocation work(bytes, stream);
  std::vector<slice_partial> host(static_cast<std::size_t>(per_pass));
  auto* out = reinterpret_cast<slice_partial*>(work.get());
  device::launch_policy const pol = agoq::detail::gpu::current_policy();
  // Measures every slot in passes of per_pass and folds them with fold_piece.
  auto const sweep = [&](float const* group_absmax, auto fold_piece) {
    for (std::int64_t first = 0; first < slots; first += per_pass) {
      std::int64_t const n = std::min(per_pass, slots - first);
      agoq::detail::gpu::launch(measure_slices_kernel<std::remove_const_t<In>>,
                                agoq::detail::gpu::grid_for(n * slice_lanes, pol),
                                pol.block_threads, 0, stream, x.data_handle(), g, first, n,
                                group_absmax, out);
      AGOQ_CUDA_TRY(cudaGetLastError());
      AGOQ_CUDA_TRY(cudaMemcpyAsync(host.data(), out, static_cast<std::size_t>(n) * sizeof(*out),
                                    cudaMemcpyDeviceToHost, stream));
      AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
      fold_piece(first, n);
    }
  };
  sweep(nullptr, [&](std::int64_t first, std::int64_t n) { fold.add(host.data(), first, n); });
  if (g.one_pass()) return fold.result();
  // Every group's absmax, in slice_grid::group_of order.
  auto const table_bytes = static_cast<std::size_t>(fold.pending()) * sizeof(float);
  agoq::detail::gpu::stream_allocation table(table_bytes, stream);
  AGOQ_CUDA_TRY(cudaMemcpyAsync(table.get(), fold.pending_absmax(), table_bytes,
                                cudaMemcpyHostToDevice, stream));
  sweep(reinterpret_cast<float const*>(table.get()),
        [&](std::int64_t first, std::int64_t n) { fold.add_dead_zones(host.data(), first, n); });
  return fold.result();
}

}  // namespace stats_detail

/// measure() of a tensor in device memory: the same statistics, bit for bit, as the host form on
/// the same values. Unlike the `_async` calls it returns the result, so it synchronizes
/// `ex.stream` (after the work enqueued on it before); where every group is one row of at most
/// 256 columns it reads `x` once (each slice twice, the second time for its dead zones, mostly
/// from the caches), else twice (a second pass for the dead zones under the absmax of each group
/// the first found, copied to the device: 4 bytes per group); it copies 72 bytes per slice and
/// pass (a slice is up to 256 elements of one group's row: 0.56 byte per element at G = 128) back
/// to the host, 2^20 slices at a time. A half warp per slice.
/// \throws agoq::invalid_argument for a tile with an extent below 1, a null or pageable host
/// pointer; agoq::cuda_error on a CUDA failure.
template <agoq::detail::readable_elements In>
tensor_stats measure(cuda_executor ex, matrix_view<In> x, tile_shape tile) {
  return stats_detail::measure_in_chunks(ex, x, tile, stats_detail::device_chunk_slots);
}

/// measure() on the device under the group tile of scheme `s` on this tensor.
template <agoq::detail::readable_elements In>
tensor_stats measure(cuda_executor ex, matrix_view<In> x, spec const& s) {
  s.validate();
  return measure(ex, x, s.tile(x.extent(0), x.extent(1)));
}

/// quantize_measured() on the device: quantize_async of `in` into `out` (device memory) on
/// `ex.stream`, then measure() of `in` under the scheme's tile, so `out` holds the host form's
/// bytes and `stats` its statistics, bit for bit; returns the non-finite input count. Synchronizes
/// `ex.stream`, as measure() does. Two reads of `in` here (the quantize kernel, then measure's
/// half warps). By the byte counts (not yet timed on a GPU), measure's copy of 72 bytes per
/// slice to the host (0.56 byte per element at G = 128, over PCIe) and the host's fold outweigh
/// a second read of the tensor from device memory, and one kernel for both would keep them.
/// \throws as quantize_async and measure.
template <code_list Codes = dispatch_codes, agoq::detail::readable_elements In>
std::int64_t quantize_measured(cuda_executor ex, matrix_view<In> in, quantized_view out,
                               tensor_stats& stats, quantize_options opt = {}) {
  agoq::detail::gpu::stream_allocation count(sizeof(std::int64_t), ex.stream.get());
  auto* nonfinite = reinterpret_cast<std::int64_t*>(count.get());
  quantize_async<Codes>(ex, in, out, opt, nonfinite);
  tensor_stats const measured = measure(ex, in, out.spec);
  std::int64_t n = 0;
  AGOQ_CUDA_TRY(cudaMemcpyAsync(&n, nonfinite, sizeof(n), cudaMemcpyDeviceToHost, ex.stream.get()));
  AGOQ_CUDA_TRY(cudaStreamSynchronize(ex.stream.get()));
  stats = measured;
  return n;
}

}  // namespace agoq::activation
