/// \file
/// An agoq communicator over an NCCL communicator and a CUDA stream. Include it only in code that
/// links NCCL (libnccl, shipped with the CUDA toolkit); it is not part of agoq.hpp.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <cuda/stream_ref>

#include "../error.hpp"
#include "communicator.hpp"

namespace agoq::comm {

namespace detail {

/// Throws comm_error naming `call`, ncclGetErrorString and, where there is one, NCCL's last
/// message for `comm`, when `result` is not ncclSuccess.
inline void nccl_check(ncclResult_t result, char const* call, ncclComm_t comm) {
  if (result == ncclSuccess) return;
  std::string message = std::string("agoq: ") + call + " failed: " + ncclGetErrorString(result);
  if (char const* last = ncclGetLastError(comm); last != nullptr && last[0] != '\0') {
    message += std::string(" (") + last + ")";
  }
  throw comm_error(message);
}

}  // namespace detail

/// An agoq::comm::communicator over an existing NCCL communicator, enqueueing every transfer on
/// one CUDA stream.
///
/// Neither the ncclComm_t nor the stream is owned: both must outlive this object and every
/// transfer enqueued through it (ncclCommDestroy / cudaStreamDestroy only after the stream has
/// drained). NCCL's rules apply: every rank enqueues the same collectives in the same order, and
/// one thread at a time enqueues on a communicator.
///
/// Buffers are device memory (memory() is memory_space::device). Calls are stream-ordered: they
/// enqueue the transfer on `stream()` and return; `send` is read and `recv` written when the
/// stream reaches them, so work that produces `send` must be ordered before the call on that
/// stream (or joined to it with an event), and `recv` may be read by later work on it.
///
/// Errors: a call NCCL rejects when enqueueing throws comm_error with ncclGetErrorString.
/// Failures that happen later, while the stream runs (a peer died, a network error), are not
/// seen by the call that enqueued them: poll check_async() (ncclCommGetAsyncError), and on an
/// error call ncclCommAbort rather than waiting on the stream, which may never drain.
class nccl_communicator {
 public:
  /// Wraps `comm`, enqueueing on `stream`. Host only.
  /// \throws agoq::invalid_argument for a null communicator; comm_error when NCCL cannot report
  ///         the rank or the size.
  nccl_communicator(ncclComm_t comm, cuda::stream_ref stream) : comm_(comm), stream_(stream) {
    AGOQ_EXPECTS(comm != nullptr, "nccl_communicator: the NCCL communicator is null");
    detail::nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank", comm_);
    detail::nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount", comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Always memory_space::device.
  memory_space memory() const noexcept { return memory_space::device; }
  /// The wrapped NCCL communicator.
  ncclComm_t native_handle() const noexcept { return comm_; }
  /// The stream every transfer is enqueued on.
  cuda::stream_ref stream() const noexcept { return stream_; }

  /// See agoq::comm::communicator: one ncclSend and one ncclRecv per peer (itself included) in
  /// one NCCL group. Stream-ordered; does not synchronize.
  /// \throws comm_error when NCCL rejects the transfer.
  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart", comm_);
    ncclResult_t result = ncclSuccess;
    char const* failed = nullptr;
    cudaStream_t const s = stream_.get();
    for (int peer = 0; peer < size_ && result == ncclSuccess; ++peer) {
      std::size_t const offset = static_cast<std::size_t>(peer) * n;
      result = ncclSend(send + offset, n, ncclUint8, peer, comm_, s);
      if (result != ncclSuccess) {
        failed = "ncclSend";
        break;
      }
      result = ncclRecv(recv + offset, n, ncclUint8, peer, comm_, s);
      if (result != ncclSuccess) failed = "ncclRecv";
    }
    // The group is closed whatever happened inside it, so NCCL's group state stays balanced.
    ncclResult_t const ended = ncclGroupEnd();
    detail::nccl_check(result, failed, comm_);
    detail::nccl_check(ended, "ncclGroupEnd", comm_);
  }

  /// See agoq::comm::communicator: ncclAllGather on bytes. Stream-ordered; does not synchronize.
  /// \throws comm_error when NCCL rejects the transfer.
  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    detail::nccl_check(ncclAllGather(send, recv, n, ncclUint8, comm_, stream_.get()),
                       "ncclAllGather", comm_);
  }

  /// Throws comm_error if NCCL has recorded an asynchronous error on the communicator (for
  /// example a failed peer); returns normally while it is healthy or still in progress. Host
  /// only; does not synchronize.
  void check_async() const {
    ncclResult_t state = ncclSuccess;
    detail::nccl_check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", comm_);
    if (state != ncclInProgress) detail::nccl_check(state, "an earlier NCCL operation", comm_);
  }

 private:
  ncclComm_t comm_;
  cuda::stream_ref stream_;
  int rank_ = 0;
  int size_ = 0;
};

static_assert(communicator<nccl_communicator>);

}  // namespace agoq::comm
