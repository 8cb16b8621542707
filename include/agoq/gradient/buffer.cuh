/// \file
/// The CUDA form of the 8-bit gradient accumulation buffer (DESIGN §5, "Gradients"):
/// device_gradient_buffer keeps a flat bucket as int8 codes and fp32 group scales in device
/// memory, and accumulate_async adds a micro-batch's gradient into it in one kernel pass, writing
/// the codes and scales gradient_buffer::accumulate (buffer.hpp) writes from the same gradients.
/// Needs nvcc.
///
/// The pass: ceil(G / 8) rounded up to a power of two (4, 8, 16 or 32) consecutive lanes hold one
/// group (device::padded_group_lane_run), each a run of 8 elements. Every lane loads its gradient
/// run, its 8 codes and its group's scale, decodes with numeric::decode and adds in fp32
/// (__fadd_rn, the host's one IEEE addition), and the lanes requantize the group from their
/// registers (device::quantize_group_lanes: shuffled absolute maximum, fresh scale, stochastic or
/// nearest rounding at stream position = the element's index). So the buffer is read once and
/// written once, for any N (64-bit indexing) and any G in [32, 256]. The first accumulate after
/// construction or zero_async reads no codes (0 + x == x, as on the host).
///
/// Status: compiled (sm_80, sm_90) but not yet run on a GPU; tests/device/buffer_device_test.cu
/// holds the bit-for-bit comparison with gradient_buffer that a device run will check.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <cuda_runtime_api.h>
#include <cuda/stream_ref>

#include "../cuda_check.hpp"
#include "../detail/gpu/allocation.cuh"
#include "../device/epilogue.cuh"
#include "../quantize.cuh"
#include "buffer.hpp"
#include "payload.hpp"

namespace agoq::gradient {

namespace detail {

/// Whether accumulate_kernel takes its linear path: G a power of two (8 * 2^lanes_log2, at least
/// 8 * runs_in_flight), the gradient 16-byte aligned, the codes and scales aligned. Host and
/// device: the launcher sizes the grid by it.
template <class T>
AGOQ_HOST_DEVICE inline bool accumulate_linear(T const* g, quantized_view const& buf) noexcept {
  namespace gpu = ::agoq::detail::gpu;
  std::int64_t const group_size = buf.spec.group_cols;
  return (group_size & (group_size - 1)) == 0 && group_size >= gpu::run * gpu::runs_in_flight &&
         gpu::aligned(g, 16) && gpu::params_and_codes_aligned<8>(buf);
}

/// The general path's work for thread t of the accumulate pass over `groups` groups: lane
/// t % 2^lanes_log2 of group t / 2^lanes_log2 adds its run (device::padded_group_lane_run) and the
/// group's lanes requantize it (device::quantize_group_lanes). Every lane of the warp must call it
/// together.
template <class T, class Rounding>
__device__ inline void accumulate_lane(T const* g, quantized_view const& buf, std::int64_t groups,
                                       int lanes_log2, bool add, std::uint64_t key, std::int64_t t,
                                       unsigned long long& bad) {
  namespace gpu = ::agoq::detail::gpu;
  std::int64_t group = 0;
  device::element_run const r =
      device::padded_group_lane_run(t, buf.spec.group_cols, groups, lanes_log2, 1, buf.cols, group);
  float v[gpu::run];
  gpu::load_run(g + r.col, r.count, v);
  if (add && r.count > 0) {
    std::uint8_t q[gpu::run];
    device::unpack_fragment<8>(gpu::load_codes<8>(buf.codes + r.col, r.count), q);
    float old[gpu::run];
    device::dequantize_fragment<payload_code>(q, load_group_params(buf, group), old);
    AGOQ_UNROLL
    for (int i = 0; i < gpu::run; ++i) {
      if (i < r.count) v[i] = __fadd_rn(old[i], v[i]);
    }
  }
  // Every lane of the group has read its codes and the scale before the shuffles inside, and
  // the group's first lane stores the new scale after them.
  auto const lane = static_cast<unsigned>(t & ((std::int64_t{1} << lanes_log2) - 1));
  bad += static_cast<unsigned long long>(device::quantize_group_lanes<payload_code, Rounding>(
      buf, 0, r.col, r.count, group, lane, 1 << lanes_log2, v, key, 0));
}

/// The linear path's work for one slot (device::linear_group_slot) of a whole group:
/// runs_in_flight runs of the gradient and, when adding, their codes and the group's scale, each
/// with one load, all before any is used; the sums are requantized by the group's G / 32 lanes
/// (device::quantize_group_slot). An inactive slot stores nothing. Every lane of the warp must
/// call it together.
template <class T, class Rounding>
__device__ inline void accumulate_slot(T const* g, quantized_view const& buf, bool add,
                                       std::uint64_t key, device::linear_slot const& slot,
                                       bool active, unsigned long long& bad) {
  namespace gpu = ::agoq::detail::gpu;
  constexpr int runs = gpu::runs_in_flight;
  auto const* codes = reinterpret_cast<std::uint64_t const*>(buf.codes);
  float v[runs][gpu::run];
  std::uint64_t w[runs] = {};
  AGOQ_UNROLL
  for (int k = 0; k < runs; ++k) {
    std::int64_t const u = slot.first + k * slot.lanes;
    gpu::load_aligned_run<true>(g + u * gpu::run, v[k]);
    if (add) w[k] = codes[u];
  }
  if (add) {
    // Read before the shuffles inside quantize_group_slot, after which the group's first lane
    // stores the new scale.
    group_params const p{reinterpret_cast<float const*>(buf.scales)[slot.group], 0};
    AGOQ_UNROLL
    for (int k = 0; k < runs; ++k) {
      float old[gpu::run];
      device::dequantize_packed<payload_code>(w[k], p, old);
      AGOQ_UNROLL
      for (int i = 0; i < gpu::run; ++i) v[k][i] = __fadd_rn(old[i], v[k][i]);
    }
  }
  bad += static_cast<unsigned long long>(
      device::quantize_group_slot<payload_code, Rounding>(buf, slot, active, v, key, 0));
}

/// The accumulate pass over a [1, N] int8 buffer `buf` with groups of G <= 8 * 2^lanes_log2
/// (device::group_lanes_log2; one kernel for every G): adds g (decoded + g in fp32 when `add`,
/// else g alone) and requantizes every group with Rounding under Philox key `key`; adds the count
/// of non-finite sums to *call_count and *total (either may be null). Linear path
/// (accumulate_linear): the whole groups in slots of runs_in_flight runs (accumulate_slot), then
/// the ragged last group, if any, by the first warp of block 0 (accumulate_lane). General path:
/// accumulate_lane for every thread.
template <class T, class Rounding>
AGOQ_KERNEL void accumulate_kernel(T const* g, quantized_view buf, int lanes_log2, bool add,
                                   std::uint64_t key, unsigned long long* call_count,
                                   unsigned long long* total) {
  namespace gpu = ::agoq::detail::gpu;
  std::int64_t const n = buf.cols;
  std::int64_t const group_size = buf.spec.group_cols;
  std::int64_t const groups = (n + group_size - 1) / group_size;
  unsigned long long bad = 0;
  if (accumulate_linear(g, buf)) {
    std::int64_t const whole = n >> (lanes_log2 + gpu::run_log2);
    gpu::for_each_linear_slot(whole << lanes_log2, lanes_log2, gpu::runs_in_flight_log2,
                              [&](device::linear_slot const& slot, bool active) {
                                accumulate_slot<T, Rounding>(g, buf, add, key, slot, active, bad);
                              });
    if ((whole << (lanes_log2 + gpu::run_log2)) < n && blockIdx.x == 0 && threadIdx.x < 32) {
      accumulate_lane<T, Rounding>(g, buf, groups, lanes_log2, add, key,
                                   (whole << lanes_log2) + threadIdx.x, bad);
    }
  } else {
    gpu::block_uniform_loop(groups << lanes_log2, [&](std::int64_t t) {
      accumulate_lane<T, Rounding>(g, buf, groups, lanes_log2, add, key, t, bad);
    });
  }
  gpu::add_warp_count(call_count, bad);
  gpu::add_warp_count(total, bad);
}

/// Launches accumulate_kernel for the buffer's group size and rounding.
template <class T>
void launch_accumulate(T const* g, quantized_view const& buf, bool add, std::uint64_t key,
                       std::int64_t* call_count, std::int64_t* total, cudaStream_t stream) {
  namespace gpu = ::agoq::detail::gpu;
  std::int64_t const group_size = buf.spec.group_cols;
  int const lanes_log2 = device::group_lanes_log2(group_size);
  std::int64_t const lane_threads = ((buf.cols + group_size - 1) / group_size) << lanes_log2;
  // The linear path's slots (at least one warp for the ragged group), else the lanes.
  std::int64_t const threads =
      accumulate_linear(g, buf)
          ? std::max<std::int64_t>(lane_threads >> gpu::runs_in_flight_log2, 32)
          : lane_threads;
  device::launch_policy const pol = gpu::current_policy();
  dispatch_rounding(buf.spec, [&](auto rounding) {
    gpu::launch(accumulate_kernel<T, decltype(rounding)>, gpu::grid_for(threads, pol),
                pol.block_threads, 0, stream, g, buf, lanes_log2, add, key,
                reinterpret_cast<unsigned long long*>(call_count),
                reinterpret_cast<unsigned long long*>(total));
  });
  AGOQ_CUDA_TRY(cudaGetLastError());
}

}  // namespace detail

/// The device twin of gradient_buffer: an 8-bit accumulation buffer of `size()` elements in device
/// memory, int8 codes and fp32 scales of a [1, size()] tensor in agoq's standard layout (spec
/// int8_g<G>_sym_<rounding>_f32, the bytes and layout of gradient_buffer), plus one std::int64_t
/// of non-finite count. accumulate_async(g) adds a gradient in one kernel pass; the k-th accumulate
/// (k = counter()) rounds element i at Philox position i under stream_key(seed, k,
/// stream_tag::buffer, 0), as gradient_buffer does, so the same gradients and options give the
/// same codes and scales bit for bit.
///
/// Its memory is allocated stream-ordered on the stream given at construction and freed on it by
/// the destructor: work enqueued on other streams must be ordered before the destruction. The
/// members that enqueue work (the constructor, zero_async, accumulate_async, mark_written) return
/// without synchronizing; the host keeps only the sizes, the step counter and whether the buffer
/// is known to be zero. Not thread-safe. Movable, not copyable. Feed it to the CUDA 8-bit
/// collectives (all_reduce.cuh: its codes and scales travel as they are, and it can receive a
/// reduced result) and to the CUDA optimizer (adamw_step_async reads view()).
class device_gradient_buffer {
 public:
  /// A zeroed buffer of `n` elements, allocated and zeroed on `stream`. Host only.
  /// \throws agoq::invalid_argument for n < 0 or a group size outside [32, 256];
  /// agoq::cuda_error when the allocation fails.
  device_gradient_buffer(std::int64_t n, buffer_options const& opt, ::cuda::stream_ref stream)
      : opt_(detail::checked_options(opt, "device_gradient_buffer")),
        spec_(payload_spec(opt.group_size, opt.rounding)),
        layout_(make_layout(spec_, 1, n)),
        count_offset_((layout_.total_bytes + 7) / 8 * 8),
        memory_(static_cast<std::size_t>(count_offset_) + sizeof(std::int64_t), stream.get()) {
    clear(stream.get());
  }

  /// Number of elements.
  std::int64_t size() const noexcept { return layout_.cols; }
  /// Elements per scale.
  int group_size() const noexcept { return opt_.group_size; }
  /// The options given at construction.
  buffer_options const& options() const noexcept { return opt_; }
  /// The spec of the stored codes: int8_g<G>_sym_<rounding>_f32.
  agoq::spec const& spec() const noexcept { return spec_; }
  /// Bytes of codes, padding and scales (gradient_buffer::bytes()); 8 more hold the count.
  std::int64_t bytes() const noexcept { return layout_.total_bytes; }
  /// The stream the memory was allocated on (and is freed on).
  ::cuda::stream_ref stream() const noexcept { return ::cuda::stream_ref(memory_.stream()); }

  /// Read-only view of the codes and scales (device memory), for an optimizer or a collective.
  const_quantized_view view() const {
    return view_of_buffer(spec_, 1, size(), reinterpret_cast<std::uint8_t const*>(memory_.get()));
  }
  /// Writable view (device memory): a collective storing a reduced result writes through it.
  quantized_view view() {
    return view_of_buffer(spec_, 1, size(), reinterpret_cast<std::uint8_t*>(memory_.get()));
  }

  /// Device memory: the non-finite sums met since construction or the last zero_async, updated in
  /// stream order.
  std::int64_t const* nonfinite_count() const noexcept { return count(); }
  /// Writable count (a collective storing a reduced result writes its flag through it).
  std::int64_t* nonfinite_count() noexcept { return count(); }

  /// Sets every element to zero (codes and scales) and the non-finite count to 0, on `ex.stream`.
  /// The step counter is kept, so later steps draw fresh streams. Does not synchronize.
  /// \throws agoq::cuda_error.
  void zero_async(cuda_executor ex) { clear(ex.stream.get()); }

  /// Adds `g` (size() elements of float, half or bfloat16, device memory) into the buffer on
  /// `ex.stream`: the codes and scales gradient_buffer::accumulate writes, in one kernel pass.
  /// Sums that are not finite (a NaN or ±Inf input, an fp32 overflow) are encoded as quantize
  /// documents (NaN -> 0, ±Inf -> ±127) and counted: when `nonfinite` is not null it must point to
  /// one device-accessible std::int64_t, which receives this call's count in stream order (what
  /// the host accumulate returns); nonfinite_count() grows by it. Advances counter(). Does not
  /// synchronize. Pointers need no particular alignment.
  /// \throws agoq::invalid_argument when g.size() != size(), g is null with a non-zero size, or
  /// a pointer is pageable host memory; agoq::cuda_error.
  template <class In>
  requires element_type<std::remove_const_t<In>>
  void accumulate_async(cuda_executor ex, std::span<In> g, std::int64_t* nonfinite = nullptr) {
    using T = std::remove_const_t<In>;
    char const* what = "device_gradient_buffer::accumulate_async";
    detail::check_accumulate(g.data(), static_cast<std::int64_t>(g.size()), size(), what);
    ::agoq::detail::gpu::check_device_pointer(g.data(), what);
    ::agoq::detail::gpu::check_device_pointer(nonfinite, what);
    cudaStream_t const stream = ex.stream.get();
    if (nonfinite != nullptr) {
      AGOQ_CUDA_TRY(cudaMemsetAsync(nonfinite, 0, sizeof(*nonfinite), stream));
    }
    std::uint64_t const key = stream_key(opt_.seed, counter_, stream_tag::buffer, 0);
    ++counter_;
    if (size() == 0) return;
    detail::launch_accumulate(static_cast<T const*>(g.data()), view(), !empty_, key, nonfinite,
                              count(), stream);
    empty_ = false;
  }

  /// accumulate_async of a row-major matrix of size() elements (any shape; read as one flat run).
  /// \throws as the span overload.
  template <class In>
  requires element_type<std::remove_const_t<In>>
  void accumulate_async(cuda_executor ex, matrix_view<In> g, std::int64_t* nonfinite = nullptr) {
    accumulate_async(ex, std::span<In>(g.data_handle(), static_cast<std::size_t>(g.size())),
                     nonfinite);
  }

  /// The number of accumulate calls so far (the stochastic rounding step counter).
  std::uint64_t counter() const noexcept { return counter_; }
  /// Sets the step counter (e.g. when resuming from a checkpoint).
  void set_counter(std::uint64_t c) noexcept { counter_ = c; }

  /// Marks the buffer as written by someone else through view() (the 8-bit collectives do, and
  /// write nonfinite_count() too): the next accumulate then adds to its contents. Host only.
  void mark_written() noexcept { empty_ = false; }

 private:
  std::int64_t* count() const noexcept {
    return reinterpret_cast<std::int64_t*>(memory_.get() + count_offset_);
  }

  void clear(cudaStream_t stream) {
    AGOQ_CUDA_TRY(cudaMemsetAsync(
        memory_.get(), 0, static_cast<std::size_t>(count_offset_) + sizeof(std::int64_t), stream));
    empty_ = true;
  }

  buffer_options opt_;
  agoq::spec spec_;
  quantized_layout layout_;
  std::int64_t count_offset_;
  ::agoq::detail::gpu::stream_allocation memory_;
  std::uint64_t counter_ = 0;
  bool empty_ = true;
};

}  // namespace agoq::gradient
