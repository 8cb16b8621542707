/// \file
/// The CUDA executor of the precise 8-bit collectives (DESIGN §5, "Gradients"): the device twin
/// of all_reduce.hpp's all_reduce_8bit, reduce_scatter_8bit and all_reduce_8bit_hierarchical,
/// with float, half or bfloat16 spans or a device_gradient_buffer (buffer.cuh) as operands where
/// the CPU executor takes spans or a gradient_buffer, over communicators that move
/// device memory (nccl_communicator, in_process_device_group::member, or a user's own), with the
/// same payload blocks, stream keys and arithmetic, so every rank ends with the bits the CPU
/// executor computes from the same inputs and options. Needs nvcc.
///
/// Steps on the executor's stream (`ex.stream`), for a bucket of N elements on P ranks:
/// 1. the 32-byte argument record is copied to the device, all-gathered, copied back and the
///    stream synchronized once, so a mismatch throws agoq::invalid_argument on every rank (the
///    only synchronization of a call);
/// 2. quantize_async of each chunk j of the input into payload block j (int8, fp32 scales inline,
///    stream key stream_tag::scatter and this rank), then a one-thread kernel writes the P
///    headers (flag: this rank's non-finite count, read on the device);
/// 3. all_to_all of the blocks;
/// 4. the fused dequantize-sum(-divide) kernel over the P received blocks: each element decoded
///    with decode<int_sym<8>> as the host does, added in rank order with __fadd_rn and divided by
///    P with __fdiv_rn when averaging, so nvcc cannot contract or reassociate them;
/// 5. all-reduce: quantize_async of the fp32 sums into the gather block (stream_tag::gather,
///    positions counted in the bucket), its header written on the device, all_gather, then
///    dequantize_async of the P gathered blocks into the output. Reduce-scatter: step 4 writes the
///    shard directly.
/// A device_gradient_buffer input is copied into the blocks in step 2 (no quantization; its count
/// sets the flag), and a device_gradient_buffer output receives the gathered codes and scales in
/// step 5. The hierarchical form composes these steps over the node and the peers (see
/// detail::hierarchical_async; its record exchange synchronizes twice).
///
/// Workspace: allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync on `ex.stream`,
/// the device's default memory pool): 2 P block_bytes + 4 ceil(ceil(N/G)/P) G bytes, about
/// 2 N (1 + 4/G) + 4 N / P bytes, plus a few hundred bytes of counters.
///
/// Communicator streams: when the communicator has a `stream()` (cuda::stream_ref or
/// cudaStream_t) other than `ex.stream`, each transfer is joined to `ex.stream` with an event
/// both ways; otherwise the communicator must enqueue on `ex.stream` (or order its transfers
/// itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <cuda_runtime_api.h>
#include <cuda/stream_ref>

#include "../comm/communicator.hpp"
#include "../cuda_check.hpp"
#include "../detail/gpu/allocation.cuh"
#include "../quantize.cuh"
#include "all_reduce.hpp"
#include "buffer.cuh"
#include "payload.hpp"
#include "reduce_map.hpp"

namespace agoq::gradient {

/// What a CUDA 8-bit collective reports, written to device memory when the stream reaches the
/// end of the call (the device twin of all_reduce_result).
struct all_reduce_status {
  /// 1 when some rank's input held NaN or ±Inf or a reduction overflowed (the same on every
  /// rank), else 0.
  std::int64_t nonfinite = 0;
  /// This rank's count of non-finite input values.
  std::int64_t local_nonfinite = 0;
  /// 1 when a received block header was not agoq's or announced another chunk (where the CPU
  /// executor throws agoq::comm::comm_error), else 0. The outputs are then unspecified.
  std::int64_t corrupt = 0;
};

namespace detail {

static_assert(reduce_run_elements == ::agoq::detail::gpu::run);

/// Ranks whose blocks reduce_blocks_kernel loads together: reduce_rank_batch up to
/// reduce_wide_ranks ranks, reduce_rank_batch_wide beyond. At large P a chunk has few elements
/// (N / P), so few threads, each adding P blocks in rank order: the kernel's time is then the
/// latency of its ceil(P / batch) rounds of loads, which the wider batch divides by 4 (127
/// registers on sm_90 instead of 64, no spills: 2 blocks of 256 threads per SM instead of 4, which
/// such chunks do not fill anyway).
inline constexpr int reduce_rank_batch = 4;
inline constexpr int reduce_rank_batch_wide = 16;
inline constexpr int reduce_wide_ranks = 8;

/// The fp32 scale of group g of a block's inline scales (load_group_params of an f32 view): one
/// 4-byte load where `aligned` (the scales of every block on a 4-byte boundary, as for every G that
/// is a multiple of 4), else byte loads (a block's scales follow its chunk_groups * G codes).
__device__ inline group_params payload_scale(std::uint8_t const* scales, std::int64_t g,
                                             bool aligned) noexcept {
  group_params p;
  if (aligned) {
    // Through the read-only cache (the received blocks are not written while they are reduced);
    // the compiler would merge a plain load with the memcpy's byte loads.
    p.scale = __ldg(reinterpret_cast<float const*>(scales) + g);
  } else {
    std::memcpy(&p.scale, scales + 4 * g, 4);
  }
  return p;
}

/// The fused dequantize-sum(-divide): out[0, count) = the elements of the `ranks` blocks at
/// `recv` (block r at recv + r block_bytes, `count` elements each) decoded and added in rank
/// order, divided by `divisor` unless it is 1, stored as Out (rounded to nearest even).
template <class Out, int Batch>
AGOQ_KERNEL void reduce_blocks_kernel(std::uint8_t const* recv, std::int64_t block_bytes,
                                      std::int64_t scales_offset, std::int64_t ranks,
                                      std::int64_t count, std::int64_t group_size, float divisor,
                                      Out* out) {
  std::int64_t const threads = reduce_thread_count(count);
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  bool const aligned_scales =
      ::agoq::detail::gpu::aligned(recv + scales_offset, 4) && block_bytes % 4 == 0;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < threads; t += step) {
    reduce_run const run = reduce_run_of(t, count, group_size);
    float v[reduce_run_elements] = {};
    // Batch ranks' codes and scales are loaded before any of them is added, so that many loads
    // are in flight per thread; the additions keep rank order.
    for (std::int64_t r0 = 0; r0 < ranks; r0 += Batch) {
      std::uint64_t codes[Batch] = {};
      group_params first[Batch], second[Batch];
      AGOQ_UNROLL
      for (int k = 0; k < Batch; ++k) {
        if (r0 + k >= ranks) break;
        std::uint8_t const* block = recv + (r0 + k) * block_bytes;
        codes[k] =
            ::agoq::detail::gpu::load_codes<8>(block + payload_header_bytes + run.begin, run.count);
        first[k] = payload_scale(block + scales_offset, run.group, aligned_scales);
        second[k] = run.split < run.count
                        ? payload_scale(block + scales_offset, run.group + 1, aligned_scales)
                        : first[k];
      }
      AGOQ_UNROLL
      for (int k = 0; k < Batch; ++k) {
        if (r0 + k >= ranks) break;
        AGOQ_UNROLL
        for (int i = 0; i < reduce_run_elements; ++i) {
          if (i >= run.count) break;
          auto const code = static_cast<std::uint8_t>((codes[k] >> (8 * i)) & 0xffu);
          float const x = decode<payload_code>(code, i < run.split ? first[k] : second[k]);
          v[i] = r0 + k == 0 ? x : __fadd_rn(v[i], x);
        }
      }
    }
    if (divisor != 1.0f) {
      AGOQ_UNROLL
      for (int i = 0; i < reduce_run_elements; ++i) v[i] = __fdiv_rn(v[i], divisor);
    }
    ::agoq::detail::gpu::store_run(out + run.begin, run.count, v);
  }
}

/// Writes the P headers of the send blocks: flags carry payload_flag_nonfinite when this rank's
/// P chunk counts add up to more than zero or the source's flags (`extra`, when not null) carry it
/// (pack_blocks' rule). One thread. This and the header kernels below are templates of nothing, as
/// detail::gpu::init_accumulators_kernel says why.
template <class = void>
AGOQ_KERNEL void scatter_headers_kernel(std::uint8_t* send, chunk_plan plan,
                                        std::int64_t const* counts, std::int64_t const* extra) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < plan.ranks; ++j) total += counts[j];
  bool const flagged = total > 0 || (extra != nullptr && (*extra & payload_flag_nonfinite) != 0);
  std::uint8_t const flags = flagged ? payload_flag_nonfinite : 0;
  for (std::int64_t j = 0; j < plan.ranks; ++j) {
    encode_payload_header(send + j * plan.block_bytes(), flags, plan.group_size, plan.count(j));
  }
}

/// Checks the P received headers (block r holds chunk `chunk`, or chunk r when chunk < 0), sets
/// acc[0] to the OR of their flags and acc[1] to 1 when one is wrong. One thread.
template <class = void>
AGOQ_KERNEL void check_headers_kernel(std::uint8_t const* recv, chunk_plan plan, std::int64_t chunk,
                                      std::int64_t* acc) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::int64_t flags = 0;
  for (std::int64_t r = 0; r < plan.ranks; ++r) {
    std::uint8_t const* h = recv + r * plan.block_bytes();
    if (!payload_header_matches(h, plan.group_size, plan.count(chunk < 0 ? r : chunk))) acc[1] = 1;
    flags |= h[5];
  }
  acc[0] = flags;
}

/// Writes the header of the gather block of chunk j: the received flags (acc[0]) plus
/// payload_flag_nonfinite when the requantization met a non-finite sum (requantize_chunk's rule;
/// `requantized` may be null for a block assembled without requantization). One thread.
template <class = void>
AGOQ_KERNEL void gather_header_kernel(std::uint8_t* block, chunk_plan plan, std::int64_t j,
                                      std::int64_t const* acc, std::int64_t const* requantized) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  auto flags = static_cast<std::uint8_t>(acc[0]);
  if (requantized != nullptr && *requantized > 0) flags |= payload_flag_nonfinite;
  encode_payload_header(block, flags, plan.group_size, plan.count(j));
}

/// Fills the caller's status (when not null) from the last headers' flags (acc[0]), the
/// corruption mark (acc[1]) and this rank's P chunk counts, and sets *flag_count (a
/// device_gradient_buffer output's count, when not null) to the global flag, as the CPU
/// executor's mark_written does. One thread.
template <class = void>
AGOQ_KERNEL void status_kernel(std::int64_t ranks, std::int64_t const* counts,
                               std::int64_t const* acc, all_reduce_status* status,
                               std::int64_t* flag_count) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < ranks; ++j) total += counts[j];
  std::int64_t const flag = (acc[0] & payload_flag_nonfinite) != 0 ? 1 : 0;
  if (status != nullptr) {
    status->nonfinite = flag;
    status->local_nonfinite = total;
    status->corrupt = acc[1] != 0 ? 1 : 0;
  }
  if (flag_count != nullptr) *flag_count = flag;
}

/// The stream a communicator enqueues on: its stream() where it has one, else `fallback`.
template <class C>
cudaStream_t comm_stream(C& comm, cudaStream_t fallback) {
  if constexpr (requires { comm.stream(); }) {
    auto const s = comm.stream();
    if constexpr (requires { s.get(); }) {
      return s.get();
    } else {
      return static_cast<cudaStream_t>(s);
    }
  } else {
    return fallback;
  }
}

/// Runs `call` (one transfer of `comm`) ordered after the work on `stream` and before the work
/// enqueued on it afterwards: joins the communicator's stream both ways with an event when it is
/// another stream.
class comm_join {
 public:
  explicit comm_join(cudaStream_t stream) : stream_(stream) {}
  ~comm_join() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  comm_join(comm_join const&) = delete;
  comm_join& operator=(comm_join const&) = delete;

  template <class C, class F>
  void operator()(C& comm, F&& call) {
    cudaStream_t const cs = comm_stream(comm, stream_);
    if (cs == stream_) {
      call();
      return;
    }
    if (event_ == nullptr) AGOQ_CUDA_TRY(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    AGOQ_CUDA_TRY(cudaEventRecord(event_, stream_));
    AGOQ_CUDA_TRY(cudaStreamWaitEvent(cs, event_, 0));
    call();
    AGOQ_CUDA_TRY(cudaEventRecord(event_, cs));
    AGOQ_CUDA_TRY(cudaStreamWaitEvent(stream_, event_, 0));
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

/// The host-memory face of a device communicator, for check_group's record exchange: all_gather
/// copies the record to the device, all-gathers it there, copies the P records back and
/// synchronizes the stream.
template <comm::communicator C>
class record_exchange {
 public:
  record_exchange(C& comm, comm_join& join, cudaStream_t stream)
      : comm_(comm),
        join_(join),
        stream_(stream),
        device_(static_cast<std::size_t>(meta_bytes) * (static_cast<std::size_t>(comm.size()) + 1),
                stream) {}

  int rank() const { return static_cast<int>(comm_.rank()); }
  int size() const { return static_cast<int>(comm_.size()); }
  comm::memory_space memory() const noexcept { return comm::memory_space::host; }

  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    AGOQ_EXPECTS(n <= static_cast<std::size_t>(meta_bytes), "record_exchange: record too long");
    std::byte* const d = device_.get();
    auto const p = static_cast<std::size_t>(size());
    AGOQ_CUDA_TRY(cudaMemcpyAsync(d, send, n, cudaMemcpyHostToDevice, stream_));
    join_(comm_, [&] { comm_.all_gather(d, d + n, n); });
    AGOQ_CUDA_TRY(cudaMemcpyAsync(recv, d + n, p * n, cudaMemcpyDeviceToHost, stream_));
    AGOQ_CUDA_TRY(cudaStreamSynchronize(stream_));
  }

  [[noreturn]] void all_to_all(std::byte const*, std::byte*, std::size_t) {
    throw comm::comm_error("agoq: record_exchange: all_to_all is not used");
  }

 private:
  C& comm_;
  comm_join& join_;
  cudaStream_t stream_;
  ::agoq::detail::gpu::stream_allocation device_;
};

/// The workspace of one stage of a device collective over `plan`, zeroed on `stream` (the padding
/// bytes on the wire are zero, as on the CPU executor): P send and P receive blocks, the fp32 sums
/// of one chunk (when asked for), P chunk counts, the requantization count and acc[2] (the flags
/// of the last headers checked, the corruption mark).
struct device_workspace {
  collective_workspace layout;
  ::agoq::detail::gpu::stream_allocation memory;
  std::byte* send;
  std::byte* recv;
  float* sums;
  std::int64_t* counts;
  std::int64_t* requantized;
  std::int64_t* acc;

  device_workspace(chunk_plan const& plan, bool sums_needed, cudaStream_t stream)
      : layout(plan, sums_needed),
        memory(static_cast<std::size_t>(layout.total), stream),
        send(memory.get() + layout.send),
        recv(memory.get() + layout.recv),
        sums(reinterpret_cast<float*>(memory.get() + layout.sums)),
        counts(reinterpret_cast<std::int64_t*>(memory.get() + layout.counters)),
        requantized(counts + plan.ranks),
        acc(counts + plan.ranks + 1) {
    AGOQ_CUDA_TRY(cudaMemsetAsync(memory.get(), 0, static_cast<std::size_t>(layout.total), stream));
  }
};

/// Copies the codes and scales of `n` elements (a run of whole groups from a group boundary)
/// between two [1, *] int8 views in device memory, on `stream`.
inline void copy_chunk(quantized_view const& dst, const_quantized_view const& src, std::int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return;
  std::int64_t const g = dst.spec.group_cols;
  AGOQ_CUDA_TRY(cudaMemcpyAsync(dst.codes, src.codes, static_cast<std::size_t>(n),
                                cudaMemcpyDeviceToDevice, stream));
  AGOQ_CUDA_TRY(cudaMemcpyAsync(dst.scales, src.scales,
                                static_cast<std::size_t>(4 * ((n + g - 1) / g)),
                                cudaMemcpyDeviceToDevice, stream));
}

/// Quantizes chunks of a flat device array of float, half or bfloat16 (span_source's twin):
/// element i is stream position position0 + i; `flags` (device, may be null) adds its non-finite
/// bit to every header.
template <class T>
struct device_span_source {
  T const* data = nullptr;
  std::uint64_t position0 = 0;
  std::int64_t const* flags = nullptr;

  void pack(cuda_executor ex, chunk_plan const& plan, spec const& s, std::uint64_t key,
            std::byte* send, std::int64_t* counts) const {
    for (std::int64_t j = 0; j < plan.ranks; ++j) {
      std::int64_t const b = plan.begin(j);
      std::int64_t const m = plan.count(j);
      if (m == 0) continue;
      quantize_async<payload_codes>(
          ex, as_row(data + b, m), payload_view(s, plan, send + j * plan.block_bytes(), m),
          quantize_options{key, position0 + static_cast<std::uint64_t>(b)}, counts + j);
    }
  }
};

/// Copies chunks of a device [1, N] quantized view (a device_gradient_buffer; quantized_source's
/// twin): no requantization. Its non-finite count (device) becomes chunk 0's count, so the headers
/// and the status report it as the CPU executor does.
struct device_quantized_source {
  const_quantized_view view;
  std::int64_t const* nonfinite = nullptr;
  std::int64_t const* flags = nullptr;

  void pack(cuda_executor ex, chunk_plan const& plan, spec const& s, std::uint64_t, std::byte* send,
            std::int64_t* counts) const {
    cudaStream_t const stream = ex.stream.get();
    for (std::int64_t j = 0; j < plan.ranks; ++j) {
      std::int64_t const m = plan.count(j);
      copy_chunk(payload_view(s, plan, send + j * plan.block_bytes(), m),
                 sub_view(view, plan.begin(j), m), m, stream);
    }
    AGOQ_CUDA_TRY(
        cudaMemcpyAsync(counts, nonfinite, sizeof(std::int64_t), cudaMemcpyDeviceToDevice, stream));
  }
};

inline device_quantized_source buffer_source(device_gradient_buffer const& g) {
  return {g.view(), g.nonfinite_count(), nullptr};
}

/// Dequantizes gathered chunks into a device float, half or bfloat16 array (span_sink's twin).
template <class Out>
struct device_span_sink {
  Out* data = nullptr;
  void operator()(cuda_executor ex, chunk_plan const& plan, std::int64_t j, spec const& s,
                  std::byte const* block) const {
    std::int64_t const m = plan.count(j);
    if (m > 0)
      dequantize_async<payload_codes>(ex, payload_view(s, plan, block, m),
                                      as_row(data + plan.begin(j), m));
  }
};

/// Copies gathered chunks into a device [1, N] quantized view (quantized_sink's twin).
struct device_quantized_sink {
  quantized_view view;
  void operator()(cuda_executor ex, chunk_plan const& plan, std::int64_t j, spec const& s,
                  std::byte const* block) const {
    std::int64_t const m = plan.count(j);
    copy_chunk(sub_view(view, plan.begin(j), m), payload_view(s, plan, block, m), m,
               ex.stream.get());
  }
};

template <comm::communicator C>
void check_device_comm(C& comm, char const* what) {
  AGOQ_EXPECTS(comm.memory() == comm::memory_space::device,
               std::string(what) +
                   ": the communicator moves host memory; use the CPU executor "
                   "(all_reduce.hpp) with a host communicator");
}

/// The argument check of a flat collective over a device communicator: the record exchange (one
/// synchronization); throws on every rank when any rank's record is bad.
template <comm::communicator C>
void check_device_group(cudaStream_t stream, C& comm, comm_join& join, meta_record const& m,
                        char const* what) {
  check_device_comm(comm, what);
  record_exchange<C> records(comm, join, stream);
  std::string const problem = check_group(records, m, what);
  AGOQ_EXPECTS(problem.empty(), problem);
}

/// Steps 2-3 of every collective (pack_blocks and the all_to_all): packs the P chunks of `src`
/// into ws.send, writes their headers, exchanges them into ws.recv and checks the received
/// headers (acc[0] = their flags, acc[1] set on corruption).
template <comm::communicator C, class Source>
void scatter_blocks(cudaStream_t stream, C& comm, comm_join& join, chunk_plan const& plan,
                    spec const& s, std::uint64_t key, Source const& src, device_workspace const& ws,
                    std::int64_t* acc) {
  src.pack(cuda_executor{::cuda::stream_ref(stream)}, plan, s, key, ws.send, ws.counts);
  ::agoq::detail::gpu::launch(scatter_headers_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t*>(ws.send), plan, ws.counts, src.flags);
  AGOQ_CUDA_TRY(cudaGetLastError());
  join(comm,
       [&] { comm.all_to_all(ws.send, ws.recv, static_cast<std::size_t>(plan.block_bytes())); });
  ::agoq::detail::gpu::launch(check_headers_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t const*>(ws.recv), plan, comm.rank(),
                              acc);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// Launches reduce_blocks_kernel for chunk j of `plan` from the P blocks at `recv`.
template <class Out>
void launch_reduce(cudaStream_t stream, chunk_plan const& plan, std::int64_t j,
                   std::byte const* recv, float divisor, Out* out) {
  std::int64_t const count = plan.count(j);
  if (count == 0) return;
  device::launch_policy const pol = ::agoq::detail::gpu::current_policy();
  auto const run = [&](auto kernel) {
    ::agoq::detail::gpu::launch(
        kernel, ::agoq::detail::gpu::grid_for(reduce_thread_count(count), pol), pol.block_threads,
        0, stream, reinterpret_cast<std::uint8_t const*>(recv), plan.block_bytes(),
        plan.scales_offset(), plan.ranks, count, plan.group_size, divisor, out);
  };
  if (plan.ranks > reduce_wide_ranks) {
    run(reduce_blocks_kernel<Out, reduce_rank_batch_wide>);
  } else {
    run(reduce_blocks_kernel<Out, reduce_rank_batch>);
  }
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// Steps 4-7 of the all-reduce (requantize_chunk, the all_gather and the sink): the fused
/// dequantize-sum(-divide) of this rank's chunk into ws.sums, its requantization into block 0 of
/// ws.send (stream key `key`, element i of the chunk at position position0 + begin + i), its
/// header, the all_gather into ws.recv, the check of the gathered headers and `sink` of every
/// chunk.
template <comm::communicator C, class Sink>
void reduce_gather(cudaStream_t stream, C& comm, comm_join& join, chunk_plan const& plan,
                   spec const& s, float divisor, std::uint64_t key, std::uint64_t position0,
                   device_workspace const& ws, std::int64_t* acc, Sink const& sink) {
  cuda_executor const ex{::cuda::stream_ref(stream)};
  std::int64_t const rank = comm.rank();
  std::int64_t const bb = plan.block_bytes();
  std::int64_t const count = plan.count(rank);
  launch_reduce(stream, plan, rank, ws.recv, divisor, ws.sums);
  // The gather block reuses block 0 of `send`, zeroed again (the all_to_all has read it).
  AGOQ_CUDA_TRY(cudaMemsetAsync(ws.send, 0, static_cast<std::size_t>(bb), stream));
  if (count > 0) {
    quantize_async<payload_codes>(
        ex, as_row(static_cast<float const*>(ws.sums), count),
        payload_view(s, plan, ws.send, count),
        quantize_options{key, position0 + static_cast<std::uint64_t>(plan.begin(rank))},
        ws.requantized);
  }
  ::agoq::detail::gpu::launch(gather_header_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t*>(ws.send), plan, rank, acc,
                              ws.requantized);
  AGOQ_CUDA_TRY(cudaGetLastError());
  join(comm, [&] { comm.all_gather(ws.send, ws.recv, static_cast<std::size_t>(bb)); });
  ::agoq::detail::gpu::launch(check_headers_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t const*>(ws.recv), plan, -1, acc);
  AGOQ_CUDA_TRY(cudaGetLastError());
  for (std::int64_t j = 0; j < plan.ranks; ++j) sink(ex, plan, j, s, ws.recv + j * bb);
}

inline void launch_status(cudaStream_t stream, std::int64_t ranks, device_workspace const& ws,
                          all_reduce_status* status, std::int64_t* flag_count) {
  if (status == nullptr && flag_count == nullptr) return;
  ::agoq::detail::gpu::launch(status_kernel<>, 1, 1, 0, stream, ranks, ws.counts, ws.acc, status,
                              flag_count);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

/// The flat 8-bit all-reduce on the device (detail::all_reduce's twin): check, scatter_blocks,
/// reduce_gather, status (and *flag_count, for a buffer output).
template <comm::communicator C, class Source, class Sink>
void all_reduce_async(cudaStream_t stream, C& comm, std::int64_t n, Source const& src,
                      Sink const& sink, all_reduce_options const& opt, local_error err,
                      all_reduce_status* status, std::int64_t* flag_count, char const* what) {
  comm_join join(stream);
  check_device_group(stream, comm, join, make_meta(collective_kind::all_reduce, n, opt, err), what);
  int const p = static_cast<int>(comm.size());
  chunk_plan const plan(n, opt.group_size, p);
  spec const s = payload_spec(opt.group_size, opt.rounding);
  device_workspace const ws(plan, true, stream);
  scatter_blocks(
      stream, comm, join, plan, s,
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(comm.rank())),
      src, ws, ws.acc);
  reduce_gather(stream, comm, join, plan, s, opt.average ? static_cast<float>(p) : 1.0f,
                stream_key(opt.seed, opt.step, stream_tag::gather, 0), 0, ws, ws.acc, sink);
  launch_status(stream, p, ws, status, flag_count);
}

/// The reduce-scatter on the device (detail::reduce_scatter's twin): check, scatter_blocks, the
/// fused reduction straight into `shard`.
template <comm::communicator C, class Source, class Out>
void reduce_scatter_async(cudaStream_t stream, C& comm, std::int64_t n, Source const& src,
                          Out* shard, all_reduce_options const& opt, local_error err,
                          all_reduce_status* status, char const* what) {
  comm_join join(stream);
  check_device_group(stream, comm, join, make_meta(collective_kind::reduce_scatter, n, opt, err),
                     what);
  int const p = static_cast<int>(comm.size());
  chunk_plan const plan(n, opt.group_size, p);
  device_workspace const ws(plan, false, stream);
  scatter_blocks(
      stream, comm, join, plan, payload_spec(opt.group_size, opt.rounding),
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(comm.rank())),
      src, ws, ws.acc);
  launch_reduce(stream, plan, comm.rank(), ws.recv, opt.average ? static_cast<float>(p) : 1.0f,
                shard);
  launch_status(stream, p, ws, status, nullptr);
}

/// The hierarchical all-reduce on the device (detail::hierarchical's twin), its steps composed
/// from the flat ones: scatter_blocks inside the node and the fused reduction of this rank's
/// shard (fp32, divisor 1); scatter_blocks of the shard among the peers (positions counted in the
/// bucket, the node's flags carried) and reduce_gather among them (divided by L K when
/// opt.average, as detail::hierarchical), its sink assembling the 8-bit shard in the node's
/// gather block; that block's header, the all_gather inside the node and `sink`. One acc serves
/// every stage: each header step reads the flags the previous check left, in stream order, and
/// the corruption mark accumulates.
template <comm::communicator Intra, comm::communicator Inter, class Source, class Sink>
void hierarchical_async(cudaStream_t stream, Intra& intra, Inter& inter, std::int64_t n,
                        Source const& src, Sink const& sink, all_reduce_options const& opt,
                        local_error err, all_reduce_status* status) {
  char const* what = "all_reduce_8bit_hierarchical_async";
  check_device_comm(intra, what);
  check_device_comm(inter, what);
  comm_join join(stream);
  {
    record_exchange<Intra> node_records(intra, join, stream);
    record_exchange<Inter> peer_records(inter, join, stream);
    check_hierarchical(node_records, peer_records,
                       make_meta(collective_kind::hierarchical, n, opt, err), what);
  }
  int const l = static_cast<int>(intra.size());
  int const i = static_cast<int>(intra.rank());
  int const k = static_cast<int>(inter.size());
  int const a = static_cast<int>(inter.rank());
  spec const s = payload_spec(opt.group_size, opt.rounding);
  // Inside the node: chunk i of the bucket is this rank's shard, summed in fp32 into node.sums.
  chunk_plan const node(n, opt.group_size, l);
  device_workspace const nws(node, true, stream);
  std::int64_t* const acc = nws.acc;
  scatter_blocks(
      stream, intra, join, node, s,
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(a * l + i)),
      src, nws, acc);
  launch_reduce(stream, node, i, nws.recv, 1.0f, nws.sums);
  std::int64_t const shard_begin = node.begin(i);
  std::int64_t const shard_n = node.count(i);

  // Across nodes: the flat algorithm on the shard, kept 8-bit in block 0 of the node's send.
  chunk_plan const peers(shard_n, opt.group_size, k);
  device_workspace const pws(peers, true, stream);
  scatter_blocks(
      stream, inter, join, peers, s,
      stream_key(opt.seed, opt.step, stream_tag::inter_scatter, static_cast<std::uint32_t>(a)),
      device_span_source<float>{nws.sums, static_cast<std::uint64_t>(shard_begin), acc}, pws, acc);
  AGOQ_CUDA_TRY(cudaMemsetAsync(nws.send, 0, static_cast<std::size_t>(node.block_bytes()), stream));
  float const divisor = opt.average ? static_cast<float>(l) * static_cast<float>(k) : 1.0f;
  reduce_gather(stream, inter, join, peers, s, divisor,
                stream_key(opt.seed, opt.step, stream_tag::inter_gather, 0),
                static_cast<std::uint64_t>(shard_begin), pws, acc,
                device_quantized_sink{payload_view(s, node, nws.send, shard_n)});
  ::agoq::detail::gpu::launch(gather_header_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t*>(nws.send), node, i, acc, nullptr);
  AGOQ_CUDA_TRY(cudaGetLastError());
  join(intra,
       [&] { intra.all_gather(nws.send, nws.recv, static_cast<std::size_t>(node.block_bytes())); });
  ::agoq::detail::gpu::launch(check_headers_kernel<>, 1, 1, 0, stream,
                              reinterpret_cast<std::uint8_t const*>(nws.recv), node, -1, acc);
  AGOQ_CUDA_TRY(cudaGetLastError());
  cuda_executor const ex{::cuda::stream_ref(stream)};
  for (std::int64_t j = 0; j < l; ++j) sink(ex, node, j, s, nws.recv + j * node.block_bytes());
  launch_status(stream, l, nws, status, nullptr);
}

// The local pointer checks of a device collective throw on this rank only, before any transfer,
// like quantize_async's.
using ::agoq::detail::gpu::check_device_pointers;

}  // namespace detail

/// 8-bit all-reduce of `input` (float, half or bfloat16; N elements, device memory) into `output`
/// (N elements of float, half or bfloat16, device memory) over a device communicator, on
/// `ex.stream`: the same algorithm, payloads and stream keys as the CPU executor's
/// all_reduce_8bit, and on every rank the same output bits as all_reduce_8bit(host, ...) computes
/// from the same inputs and options. `output` may be `input` itself (same element type); any
/// other overlap is refused. Any N (64-bit indexing), including 0; any P >= 1.
///
/// Synchronizes `ex.stream` once, for the argument check (a 32-byte record all-gathered through
/// the device); everything else is enqueued and the call returns. When `status` is not null it
/// must point to a device-accessible all_reduce_status, which receives the global non-finite
/// flag (the same on every rank), this rank's non-finite count and the corruption mark once the
/// stream reaches the end of the call. The workspace is allocated and freed stream-ordered on
/// `ex.stream` (see the file comment). Every rank must call it with the same N and options.
/// \throws agoq::invalid_argument on every rank when any rank's arguments are invalid (lengths
/// differ between ranks, output of another length, group size outside [32, 256], null pointers,
/// overlapping buffers, different options), and on this rank only for a host communicator or a
/// pageable host pointer; agoq::comm::comm_error when the communicator fails; agoq::cuda_error
/// when a CUDA call fails.
template <comm::communicator C, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out>
void all_reduce_8bit_async(cuda_executor ex, C& comm, std::span<In const> input,
                           std::span<Out> output, all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  using T = std::remove_const_t<In>;
  char const* what = "all_reduce_8bit_async";
  detail::check_device_pointers(what, {input.data(), output.data(), status});
  detail::all_reduce_async(ex.stream.get(), comm, static_cast<std::int64_t>(input.size()),
                           detail::device_span_source<T>{input.data(), 0, nullptr},
                           detail::device_span_sink<Out>{output.data()}, opt,
                           detail::span_errors(input, output, input.size()), status, nullptr, what);
}

/// all_reduce_8bit_async of a non-const span.
template <comm::communicator C, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out>
void all_reduce_8bit_async(cuda_executor ex, C& comm, std::span<In> input, std::span<Out> output,
                           all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  all_reduce_8bit_async(ex, comm, std::span<In const>(input), output, opt, status);
}

/// all_reduce_8bit_async of a device_gradient_buffer (its group size must be opt.group_size): its
/// codes and scales travel as they are (no full-precision copy), as the CPU executor's overload
/// for gradient_buffer does, with the same output bits; the status's local_nonfinite is the
/// buffer's non-finite count and the global flag also reports any buffer whose count is not 0.
/// Synchronizes once, like the span overload.
/// \throws as the span overload (a buffer of another group size or length throws on every rank).
template <comm::communicator C, class Out>
requires detail::output_element<Out>
void all_reduce_8bit_async(cuda_executor ex, C& comm, device_gradient_buffer const& input,
                           std::span<Out> output, all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  char const* what = "all_reduce_8bit_async";
  detail::check_device_pointers(what, {output.data(), status});
  detail::all_reduce_async(ex.stream.get(), comm, input.size(), detail::buffer_source(input),
                           detail::device_span_sink<Out>{output.data()}, opt,
                           detail::buffer_span_errors(input, output, opt), status, nullptr, what);
}

/// all_reduce_8bit_async into a device_gradient_buffer of N elements (its group size must be
/// opt.group_size), kept 8-bit: the buffer receives the reduced codes and scales themselves, as
/// the CPU executor's gradient_buffer output does; its nonfinite_count() becomes the global flag
/// (1 or 0) in stream order, and its next accumulate adds to the reduced gradient.
/// \throws as the span overload.
template <comm::communicator C, class In>
requires detail::input_element<In>
void all_reduce_8bit_async(cuda_executor ex, C& comm, std::span<In const> input,
                           device_gradient_buffer& output, all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  using T = std::remove_const_t<In>;
  char const* what = "all_reduce_8bit_async";
  detail::check_device_pointers(what, {input.data(), status});
  detail::all_reduce_async(ex.stream.get(), comm, static_cast<std::int64_t>(input.size()),
                           detail::device_span_source<T>{input.data(), 0, nullptr},
                           detail::device_quantized_sink{output.view()}, opt,
                           detail::span_buffer_errors(input, output, opt), status,
                           output.nonfinite_count(), what);
  output.mark_written();
}

/// all_reduce_8bit_async of a device_gradient_buffer into a device_gradient_buffer (8-bit in and
/// out; `output` may be `input`).
/// \throws as the span overload.
template <comm::communicator C>
void all_reduce_8bit_async(cuda_executor ex, C& comm, device_gradient_buffer const& input,
                           device_gradient_buffer& output, all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  char const* what = "all_reduce_8bit_async";
  detail::check_device_pointers(what, {status});
  detail::all_reduce_async(ex.stream.get(), comm, input.size(), detail::buffer_source(input),
                           detail::device_quantized_sink{output.view()}, opt,
                           detail::buffer_buffer_errors(input, output, opt), status,
                           output.nonfinite_count(), what);
  output.mark_written();
}

/// The reduce-scatter form on the CUDA executor: rank r receives the fp32 sum (or mean) of chunk
/// r of every rank's input, the range shard_range(N, P, r, G), written into
/// `shard[0, end - begin)` (device memory) and bit-identical to reduce_scatter_8bit(host, ...).
/// `shard` must hold at least end - begin elements. Synchronizes `ex.stream` once (the argument
/// check); `status` as for all_reduce_8bit_async (its nonfinite is the OR of the flags of the
/// blocks this rank received, as the CPU executor's).
/// \throws as all_reduce_8bit_async (a too-small shard throws on every rank).
template <comm::communicator C, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out>
void reduce_scatter_8bit_async(cuda_executor ex, C& comm, std::span<In const> input,
                               std::span<Out> shard, all_reduce_options const& opt = {},
                               all_reduce_status* status = nullptr) {
  using T = std::remove_const_t<In>;
  char const* what = "reduce_scatter_8bit_async";
  detail::check_device_pointers(what, {input.data(), shard.data(), status});
  detail::reduce_scatter_async(ex.stream.get(), comm, static_cast<std::int64_t>(input.size()),
                               detail::device_span_source<T>{input.data(), 0, nullptr},
                               shard.data(), opt,
                               detail::shard_errors(input, shard, static_cast<int>(comm.size()),
                                                    static_cast<int>(comm.rank()), opt.group_size),
                               status, what);
}

/// reduce_scatter_8bit_async of a non-const span.
template <comm::communicator C, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out>
void reduce_scatter_8bit_async(cuda_executor ex, C& comm, std::span<In> input, std::span<Out> shard,
                               all_reduce_options const& opt = {},
                               all_reduce_status* status = nullptr) {
  reduce_scatter_8bit_async(ex, comm, std::span<In const>(input), shard, opt, status);
}

/// reduce_scatter_8bit_async of a device_gradient_buffer (no full-precision copy), bit-identical
/// to the CPU executor's gradient_buffer overload.
/// \throws as the span overload.
template <comm::communicator C, class Out>
requires detail::output_element<Out>
void reduce_scatter_8bit_async(cuda_executor ex, C& comm, device_gradient_buffer const& input,
                               std::span<Out> shard, all_reduce_options const& opt = {},
                               all_reduce_status* status = nullptr) {
  char const* what = "reduce_scatter_8bit_async";
  detail::check_device_pointers(what, {shard.data(), status});
  detail::reduce_scatter_async(
      ex.stream.get(), comm, input.size(), detail::buffer_source(input), shard.data(), opt,
      detail::buffer_shard_errors(input, shard, static_cast<int>(comm.size()),
                                  static_cast<int>(comm.rank()), opt),
      status, what);
}

/// The hierarchical 8-bit all-reduce on the CUDA executor, the twin of
/// all_reduce_8bit_hierarchical(host, ...): `intra` groups the L ranks of this node, `inter` the K
/// ranks of other nodes with the same intra rank (both device communicators). An 8-bit
/// reduce-scatter inside the node, the flat 8-bit all-reduce of the shard among the K peers (kept
/// 8-bit), an all-gather of the 8-bit shards inside the node and dequantization into `output`:
/// three quantizations, every rank ending with the bits the CPU executor computes from the same
/// inputs and options. opt.average divides by L K. `output` may be `input` (same element type).
///
/// Synchronizes `ex.stream` twice, for the argument check (the records go round the node, then
/// among the peers, so a bad argument on any rank throws on every rank of both groups); the rest
/// is enqueued. `status` as for all_reduce_8bit_async. Workspace (stream-ordered): about
/// 2 N (1 + 4/G) + 4 N / L bytes inside the node plus 2 N / L (1 + 4/G) + 4 N / (L K) across.
/// Status: compiled but not yet run on a GPU (as the device_gradient_buffer overloads above);
/// tests/device/all_reduce_device_test.cu holds the bit-for-bit comparison a device run will check.
/// \throws as all_reduce_8bit_async, on every rank of both groups.
template <comm::communicator Intra, comm::communicator Inter, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out>
void all_reduce_8bit_hierarchical_async(cuda_executor ex, Intra& intra, Inter& inter,
                                        std::span<In const> input, std::span<Out> output,
                                        all_reduce_options const& opt = {},
                                        all_reduce_status* status = nullptr) {
  using T = std::remove_const_t<In>;
  detail::check_device_pointers("all_reduce_8bit_hierarchical_async",
                                {input.data(), output.data(), status});
  detail::hierarchical_async(ex.stream.get(), intra, inter, static_cast<std::int64_t>(input.size()),
                             detail::device_span_source<T>{input.data(), 0, nullptr},
                             detail::device_span_sink<Out>{output.data()}, opt,
                             detail::span_errors(input, output, input.size()), status);
}

/// all_reduce_8bit_hierarchical_async of a non-const span.
template <comm::communicator Intra, comm::communicator Inter, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out>
void all_reduce_8bit_hierarchical_async(cuda_executor ex, Intra& intra, Inter& inter,
                                        std::span<In> input, std::span<Out> output,
                                        all_reduce_options const& opt = {},
                                        all_reduce_status* status = nullptr) {
  all_reduce_8bit_hierarchical_async(ex, intra, inter, std::span<In const>(input), output, opt,
                                     status);
}

/// all_reduce_8bit_hierarchical_async of a device_gradient_buffer (its codes and scales travel as
/// they are), bit-identical to the CPU executor's gradient_buffer overload.
/// \throws as the span overload.
template <comm::communicator Intra, comm::communicator Inter, class Out>
requires detail::output_element<Out>
void all_reduce_8bit_hierarchical_async(cuda_executor ex, Intra& intra, Inter& inter,
                                        device_gradient_buffer const& input, std::span<Out> output,
                                        all_reduce_options const& opt = {},
                                        all_reduce_status* status = nullptr) {
  detail::check_device_pointers("all_reduce_8bit_hierarchical_async", {output.data(), status});
  detail::hierarchical_async(ex.stream.get(), intra, inter, input.size(),
                             detail::buffer_source(input),
                             detail::device_span_sink<Out>{output.data()}, opt,
                             detail::buffer_span_errors(input, output, opt), status);
}

}  // namespace agoq::gradient
