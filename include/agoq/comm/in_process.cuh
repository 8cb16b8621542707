/// \file
/// An in-process device group: N ranks as host threads of one process sharing one GPU, each
/// enqueueing on its own CUDA stream, exchanging device buffers with device-to-device
/// cudaMemcpyAsync ordered by events. The device twin of in_process.hpp, for single-GPU tests of
/// code written against a device communicator (NCCL refuses two ranks on one GPU). Needs nvcc (or
/// the CUDA runtime headers); not part of agoq.hpp.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>
#include <cuda/stream_ref>

#include "../cuda_check.hpp"
#include "communicator.hpp"
#include "in_process.hpp"

namespace agoq::comm {

/// The state the ranks of an in-process device group share: the posted send buffers and two
/// events per rank. Create it with the group size on the device the ranks use, then give each
/// thread its `at(rank, stream)`, or let `run` start the threads and streams. size() and abort()
/// come from detail::in_process_ranks.
class in_process_device_group : public detail::in_process_ranks {
 public:
  /// A group of `size` ranks on the current device. Host only.
  /// \throws agoq::invalid_argument for size < 1; agoq::cuda_error when events cannot be created.
  explicit in_process_device_group(int size)
      : in_process_ranks(size, "in_process_device_group"),
        posted_(static_cast<std::size_t>(size)),
        ready_(static_cast<std::size_t>(size)),
        done_(static_cast<std::size_t>(size)) {
    try {
      for (int r = 0; r < size; ++r) {
        auto const i = static_cast<std::size_t>(r);
        AGOQ_CUDA_TRY(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming));
        AGOQ_CUDA_TRY(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
      }
    } catch (...) {
      destroy_events();
      throw;
    }
  }
  ~in_process_device_group() { destroy_events(); }
  in_process_device_group(in_process_device_group const&) = delete;
  in_process_device_group& operator=(in_process_device_group const&) = delete;

  class member;

  /// The communicator of rank `rank`, enqueueing on `stream`; one thread uses it at a time.
  /// Host only. \throws agoq::invalid_argument for a rank outside [0, size()).
  member at(int rank, ::cuda::stream_ref stream);

  /// Runs f(communicator) on `size` threads (rank r on thread r, with its own non-blocking stream
  /// on the current device), synchronizes and destroys the streams, joins the threads and
  /// rethrows the first exception any rank threw; the other ranks' pending collectives then fail
  /// with comm_error instead of waiting forever. Host only.
  template <class F>
  static void run(int size, F&& f);

 private:
  friend class member;

  void destroy_events() noexcept {
    for (cudaEvent_t e : ready_)
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaEvent_t e : done_)
      if (e != nullptr) cudaEventDestroy(e);
  }

  std::vector<std::byte const*> posted_;
  std::vector<cudaEvent_t> ready_;  // rank r's send buffer is produced (recorded on its stream)
  std::vector<cudaEvent_t> done_;   // rank r has finished reading its peers' send buffers
};

/// One rank's communicator of an in_process_device_group (satisfies agoq::comm::communicator,
/// memory_space::device). Stream-ordered like nccl_communicator: a call enqueues its copies on
/// `stream()` after the work already there, and returns once every rank has enqueued its part
/// (the host threads meet at two barriers per call; no call waits for the GPU). Afterwards
/// `stream()` is ordered after every peer's reads of this rank's `send`, so work enqueued on it
/// later may overwrite or free `send`.
class in_process_device_group::member {
 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size(); }
  /// Always memory_space::device.
  memory_space memory() const noexcept { return memory_space::device; }
  /// The stream this rank's transfers are enqueued on.
  ::cuda::stream_ref stream() const noexcept { return stream_; }

  /// See agoq::comm::communicator. Host only; blocks until every rank has enqueued its copies.
  /// \throws comm_error when a peer failed; agoq::cuda_error when a CUDA call fails.
  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    exchange(send, recv, n, true);
  }

  /// See agoq::comm::communicator. Host only; blocks until every rank has enqueued its copies.
  /// \throws as all_to_all.
  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    exchange(send, recv, n, false);
  }

 private:
  friend class in_process_device_group;
  member(in_process_device_group* g, int rank, ::cuda::stream_ref stream)
      : group_(g), rank_(rank), stream_(stream) {}

  // Post `send` and an event after its producer; once every rank has posted, wait on each peer's
  // event and copy its block; record "done" and, once every rank has, wait on every peer's "done"
  // so this stream never overwrites `send` before the peers have read it. Each event is recorded
  // again only after the barrier that follows every wait on its previous record.
  void exchange(std::byte const* send, std::byte* recv, std::size_t n, bool to_all) {
    auto const me = static_cast<std::size_t>(rank_);
    cudaStream_t const s = stream_.get();
    group_->posted_[me] = send;
    AGOQ_CUDA_TRY(cudaEventRecord(group_->ready_[me], s));
    group_->barrier();
    for (int i = 0; i < size() && n > 0; ++i) {
      auto const peer = static_cast<std::size_t>(i);
      if (i != rank_) AGOQ_CUDA_TRY(cudaStreamWaitEvent(s, group_->ready_[peer], 0));
      std::byte const* src = group_->posted_[peer] + (to_all ? me * n : 0);
      AGOQ_CUDA_TRY(cudaMemcpyAsync(recv + peer * n, src, n, cudaMemcpyDeviceToDevice, s));
    }
    AGOQ_CUDA_TRY(cudaEventRecord(group_->done_[me], s));
    group_->barrier();
    for (int i = 0; i < size(); ++i) {
      if (i != rank_)
        AGOQ_CUDA_TRY(cudaStreamWaitEvent(s, group_->done_[static_cast<std::size_t>(i)], 0));
    }
  }

  in_process_device_group* group_;
  int rank_;
  ::cuda::stream_ref stream_;
};

inline in_process_device_group::member in_process_device_group::at(int rank,
                                                                   ::cuda::stream_ref stream) {
  check_rank(rank);
  return member(this, rank, stream);
}

template <class F>
void in_process_device_group::run(int size, F&& f) {
  in_process_device_group g(size);
  int device = 0;
  AGOQ_CUDA_TRY(cudaGetDevice(&device));
  // Each rank's stream, created on its thread and released there once the rank has finished or
  // failed (after the abort that wakes its peers).
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(size), nullptr);
  detail::run_ranks(
      g,
      [&](int r) {
        cudaStream_t& stream = streams[static_cast<std::size_t>(r)];
        AGOQ_CUDA_TRY(cudaSetDevice(device));
        AGOQ_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        f(g.at(r, ::cuda::stream_ref(stream)));
        AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
      },
      [&](int r) {
        cudaStream_t const stream = streams[static_cast<std::size_t>(r)];
        if (stream != nullptr) {
          cudaStreamSynchronize(stream);
          cudaStreamDestroy(stream);
        }
      });
}

static_assert(communicator<in_process_device_group::member>);

}  // namespace agoq::comm
