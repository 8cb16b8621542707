/// \file
/// The CUDA executor of the precise 8-bit collectives (DESIGN §5, "Gradients"): the device twin
/// of all_reduce.hpp's all_reduce_8bit and reduce_scatter_8bit, over a communicator that moves
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
#include "../quantize.cuh"
#include "all_reduce.hpp"
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

/// The fp32 scale of group g of a block's inline scales (load_group_params of an f32 view).
__device__ inline group_params payload_scale(std::uint8_t const* scales, std::int64_t g) noexcept {
  group_params p;
  std::memcpy(&p.scale, scales + 4 * g, 4);
  return p;
}

/// The fused dequantize-sum(-divide): out[0, count) = the elements of the `ranks` blocks at
/// `recv` (block r at recv + r block_bytes, `count` elements each) decoded and added in rank
/// order, divided by `divisor` unless it is 1, stored as Out (rounded to nearest even).
template <class Out>
AGOQ_KERNEL void reduce_blocks_kernel(std::uint8_t const* recv, std::int64_t block_bytes,
                                      std::int64_t scales_offset, std::int64_t ranks,
                                      std::int64_t count, std::int64_t group_size, float divisor,
                                      Out* out) {
  std::int64_t const threads = reduce_thread_count(count);
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < threads; t += step) {
    reduce_run const run = reduce_run_of(t, count, group_size);
    float v[reduce_run_elements] = {};
    for (std::int64_t r = 0; r < ranks; ++r) {
      std::uint8_t const* block = recv + r * block_bytes;
      std::uint64_t const codes =
          ::agoq::detail::gpu::load_codes<8>(block + payload_header_bytes + run.begin, run.count);
      group_params const first = payload_scale(block + scales_offset, run.group);
      group_params const second =
          run.split < run.count ? payload_scale(block + scales_offset, run.group + 1) : first;
      AGOQ_UNROLL
      for (int i = 0; i < reduce_run_elements; ++i) {
        if (i >= run.count) break;
        auto const code = static_cast<std::uint8_t>((codes >> (8 * i)) & 0xffu);
        float const x = decode<payload_code>(code, i < run.split ? first : second);
        v[i] = r == 0 ? x : __fadd_rn(v[i], x);
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
/// P chunk counts add up to more than zero (pack_blocks' rule). One thread.
AGOQ_KERNEL void scatter_headers_kernel(std::uint8_t* send, chunk_plan plan,
                                        std::int64_t const* counts) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < plan.ranks; ++j) total += counts[j];
  std::uint8_t const flags = total > 0 ? payload_flag_nonfinite : 0;
  for (std::int64_t j = 0; j < plan.ranks; ++j) {
    encode_payload_header(send + j * plan.block_bytes(), flags, plan.group_size, plan.count(j));
  }
}

/// Checks the P received headers (block r holds chunk `chunk`, or chunk r when chunk < 0), sets
/// acc[0] to the OR of their flags and acc[1] to 1 when one is wrong. One thread.
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
/// payload_flag_nonfinite when the requantization met a non-finite sum (requantize_chunk's rule).
/// One thread.
AGOQ_KERNEL void gather_header_kernel(std::uint8_t* block, chunk_plan plan, std::int64_t j,
                                      std::int64_t const* acc, std::int64_t const* requantized) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  auto flags = static_cast<std::uint8_t>(acc[0]);
  if (*requantized > 0) flags |= payload_flag_nonfinite;
  encode_payload_header(block, flags, plan.group_size, plan.count(j));
}

/// Fills the caller's status from the last headers' flags (acc[0]), the corruption mark (acc[1])
/// and this rank's P chunk counts. One thread.
AGOQ_KERNEL void status_kernel(std::int64_t ranks, std::int64_t const* counts,
                               std::int64_t const* acc, all_reduce_status* status) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < ranks; ++j) total += counts[j];
  status->nonfinite = (acc[0] & payload_flag_nonfinite) != 0 ? 1 : 0;
  status->local_nonfinite = total;
  status->corrupt = acc[1] != 0 ? 1 : 0;
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

/// A stream-ordered device allocation, freed on its stream (after everything enqueued on it).
class stream_allocation {
 public:
  stream_allocation(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) AGOQ_CUDA_TRY(cudaMallocAsync(&p_, bytes, stream_));
  }
  ~stream_allocation() {
    if (p_ != nullptr) cudaFreeAsync(p_, stream_);
  }
  stream_allocation(stream_allocation const&) = delete;
  stream_allocation& operator=(stream_allocation const&) = delete;
  std::byte* get() const noexcept { return static_cast<std::byte*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
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
  stream_allocation device_;
};

/// Offsets of the workspace sections, each 256-byte aligned.
struct device_workspace_layout {
  std::int64_t send = 0, recv = 0, sums = 0, counters = 0, total = 0;

  device_workspace_layout(chunk_plan const& plan, bool sums_needed) {
    auto const up = [](std::int64_t b) { return (b + 255) / 256 * 256; };
    std::int64_t const blocks = plan.ranks * plan.block_bytes();
    recv = up(blocks);
    sums = recv + up(blocks);
    counters = sums + (sums_needed ? up(4 * plan.code_capacity()) : 0);
    // P chunk counts, the requantization count, acc[2].
    total = counters + 8 * (plan.ranks + 3);
  }
};

/// A device pointer a collective must be able to read or write (local check: it throws on this
/// rank only, before any transfer, like quantize_async).
inline void check_device_span(void const* p, char const* what) {
  ::agoq::detail::gpu::check_device_pointer(p, what);
}

/// Everything both device collectives share up to the reduction: local pointer checks, the
/// record exchange (one synchronization), the workspace, the packed send blocks and the
/// all_to_all. `reduce` then runs with the received blocks.
template <comm::communicator C, class T, class Reduce>
void device_collective(cudaStream_t stream, C& comm, std::span<T const> input,
                       all_reduce_options const& opt, local_error err, collective_kind kind,
                       char const* what, bool sums_needed, Reduce&& reduce) {
  AGOQ_EXPECTS(comm.memory() == comm::memory_space::device,
               std::string(what) +
                   ": the communicator moves host memory; use the CPU executor "
                   "(all_reduce.hpp) with a host communicator");
  auto const n = static_cast<std::int64_t>(input.size());
  comm_join join(stream);
  {
    record_exchange<C> records(comm, join, stream);
    std::string const problem = check_group(records, make_meta(kind, n, opt, err), what);
    AGOQ_EXPECTS(problem.empty(), problem);
  }
  int const p = static_cast<int>(comm.size());
  int const rank = static_cast<int>(comm.rank());
  chunk_plan const plan(n, opt.group_size, p);
  spec const s = payload_spec(opt.group_size, opt.rounding);
  std::int64_t const bb = plan.block_bytes();
  device_workspace_layout const wl(plan, sums_needed);
  stream_allocation ws(static_cast<std::size_t>(wl.total), stream);
  std::byte* const send = ws.get() + wl.send;
  std::byte* const recv = ws.get() + wl.recv;
  auto* const counters = reinterpret_cast<std::int64_t*>(ws.get() + wl.counters);
  // Zeroed blocks (the padding bytes on the wire are zero, as on the CPU executor) and counters.
  AGOQ_CUDA_TRY(cudaMemsetAsync(ws.get(), 0, static_cast<std::size_t>(wl.total), stream));

  cuda_executor const ex{::cuda::stream_ref(stream)};
  std::uint64_t const key =
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(rank));
  for (std::int64_t j = 0; j < p; ++j) {
    std::int64_t const b = plan.begin(j);
    std::int64_t const m = plan.count(j);
    if (m == 0) continue;
    quantize_async(ex, as_row(input.data() + b, m), payload_view(s, plan, send + j * bb, m),
                   quantize_options{key, static_cast<std::uint64_t>(b)}, counters + j);
  }
  scatter_headers_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<std::uint8_t*>(send), plan,
                                              counters);
  AGOQ_CUDA_TRY(cudaGetLastError());
  join(comm, [&] { comm.all_to_all(send, recv, static_cast<std::size_t>(bb)); });
  std::int64_t* const acc = counters + p + 1;
  check_headers_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<std::uint8_t const*>(recv), plan, rank,
                                            acc);
  AGOQ_CUDA_TRY(cudaGetLastError());
  reduce(ex, plan, s, send, recv, reinterpret_cast<float*>(ws.get() + wl.sums), counters, join);
}

/// Launches reduce_blocks_kernel for chunk j of `plan` from the P blocks at `recv`.
template <class Out>
void launch_reduce(cudaStream_t stream, chunk_plan const& plan, std::int64_t j,
                   std::byte const* recv, float divisor, Out* out) {
  std::int64_t const count = plan.count(j);
  if (count == 0) return;
  device::launch_policy const pol = ::agoq::detail::gpu::current_policy();
  reduce_blocks_kernel<Out>
      <<<::agoq::detail::gpu::grid_for(reduce_thread_count(count), pol), pol.block_threads, 0,
         stream>>>(reinterpret_cast<std::uint8_t const*>(recv), plan.block_bytes(),
                   plan.scales_offset(), plan.ranks, count, plan.group_size, divisor, out);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

inline void launch_status(cudaStream_t stream, std::int64_t ranks, std::int64_t const* counters,
                          all_reduce_status* status) {
  if (status == nullptr) return;
  status_kernel<<<1, 1, 0, stream>>>(ranks, counters, counters + ranks + 1, status);
  AGOQ_CUDA_TRY(cudaGetLastError());
}

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
  detail::check_device_span(input.data(), what);
  detail::check_device_span(output.data(), what);
  detail::check_device_span(status, what);
  cudaStream_t const stream = ex.stream.get();
  detail::device_collective(
      stream, comm, std::span<T const>(input.data(), input.size()), opt,
      detail::span_errors(input, output, input.size()), detail::collective_kind::all_reduce, what,
      true,
      [&](cuda_executor dex, chunk_plan const& plan, spec const& s, std::byte* send,
          std::byte* recv, float* sums, std::int64_t* counters, detail::comm_join& join) {
        std::int64_t const p = plan.ranks;
        std::int64_t const rank = comm.rank();
        std::int64_t const bb = plan.block_bytes();
        std::int64_t const count = plan.count(rank);
        std::int64_t* const requantized = counters + p;
        std::int64_t* const acc = counters + p + 1;
        float const divisor = opt.average ? static_cast<float>(p) : 1.0f;
        detail::launch_reduce(stream, plan, rank, recv, divisor, sums);
        // The gather block reuses block 0 of `send`, zeroed again (the all_to_all has read it).
        AGOQ_CUDA_TRY(cudaMemsetAsync(send, 0, static_cast<std::size_t>(bb), stream));
        if (count > 0) {
          quantize_async(dex, as_row(static_cast<float const*>(sums), count),
                         payload_view(s, plan, send, count),
                         quantize_options{stream_key(opt.seed, opt.step, stream_tag::gather, 0),
                                          static_cast<std::uint64_t>(plan.begin(rank))},
                         requantized);
        }
        detail::gather_header_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<std::uint8_t*>(send),
                                                          plan, rank, acc, requantized);
        AGOQ_CUDA_TRY(cudaGetLastError());
        join(comm, [&] { comm.all_gather(send, recv, static_cast<std::size_t>(bb)); });
        detail::check_headers_kernel<<<1, 1, 0, stream>>>(
            reinterpret_cast<std::uint8_t const*>(recv), plan, -1, acc);
        AGOQ_CUDA_TRY(cudaGetLastError());
        for (std::int64_t j = 0; j < p; ++j) {
          std::int64_t const m = plan.count(j);
          if (m == 0) continue;
          dequantize_async(dex,
                           payload_view(s, plan, static_cast<std::byte const*>(recv + j * bb), m),
                           as_row(output.data() + plan.begin(j), m));
        }
        detail::launch_status(stream, p, counters, status);
      });
}

/// all_reduce_8bit_async of a non-const span.
template <comm::communicator C, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out>
void all_reduce_8bit_async(cuda_executor ex, C& comm, std::span<In> input, std::span<Out> output,
                           all_reduce_options const& opt = {},
                           all_reduce_status* status = nullptr) {
  all_reduce_8bit_async(ex, comm, std::span<In const>(input), output, opt, status);
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
  detail::check_device_span(input.data(), what);
  detail::check_device_span(shard.data(), what);
  detail::check_device_span(status, what);
  detail::local_error const err = detail::shard_errors(
      input, shard, static_cast<int>(comm.size()), static_cast<int>(comm.rank()), opt.group_size);
  cudaStream_t const stream = ex.stream.get();
  detail::device_collective(
      stream, comm, std::span<T const>(input.data(), input.size()), opt, err,
      detail::collective_kind::reduce_scatter, what, false,
      [&](cuda_executor, chunk_plan const& plan, spec const&, std::byte*, std::byte* recv, float*,
          std::int64_t* counters, detail::comm_join&) {
        float const divisor = opt.average ? static_cast<float>(plan.ranks) : 1.0f;
        detail::launch_reduce(stream, plan, comm.rank(), recv, divisor, shard.data());
        detail::launch_status(stream, plan.ranks, counters, status);
      });
}

/// reduce_scatter_8bit_async of a non-const span.
template <comm::communicator C, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out>
void reduce_scatter_8bit_async(cuda_executor ex, C& comm, std::span<In> input, std::span<Out> shard,
                               all_reduce_options const& opt = {},
                               all_reduce_status* status = nullptr) {
  reduce_scatter_8bit_async(ex, comm, std::span<In const>(input), shard, opt, status);
}

}  // namespace agoq::gradient
