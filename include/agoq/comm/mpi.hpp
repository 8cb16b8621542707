/// \file
/// An agoq communicator over an MPI communicator. Include it only in code that links MPI (for
/// example CMake's MPI::MPI_CXX); it is not part of agoq.hpp.
///
/// Errors: every MPI return code is checked and a failure throws agoq::comm::comm_error carrying
/// MPI_Error_string. MPI only *returns* errors when the communicator's error handler says so; with
/// the default handler, MPI_ERRORS_ARE_FATAL, MPI aborts the whole job inside the failing call and
/// agoq never sees the error. To get exceptions, set
///
///     MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
///
/// on the communicator you wrap (and on MPI_COMM_WORLD for errors MPI raises outside any
/// communicator). Even then, MPI does not promise a usable state after an error; treat comm_error
/// as "report and shut down", not "retry".
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include <mpi.h>

#include "../error.hpp"
#include "communicator.hpp"

namespace agoq::comm {

namespace detail {

/// Throws comm_error naming `call` and MPI's text for `code` when `code` is not MPI_SUCCESS.
inline void mpi_check(int code, char const* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::string message = std::string("agoq: ") + call + " failed: ";
  if (MPI_Error_string(code, text, &length) == MPI_SUCCESS) {
    message.append(text, static_cast<std::size_t>(length));
  } else {
    message += "MPI error code " + std::to_string(code);
  }
  throw comm_error(message);
}

/// A committed MPI datatype, freed when it goes out of scope.
class mpi_datatype {
 public:
  mpi_datatype() = default;
  mpi_datatype(mpi_datatype const&) = delete;
  mpi_datatype& operator=(mpi_datatype const&) = delete;
  ~mpi_datatype() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }

  /// `count` contiguous bytes whose extent is `stride` bytes, so that block p of a collective
  /// starts at p * stride: one piece of every peer's block of a split transfer.
  void make_strided_bytes(int count, std::size_t stride) {
    MPI_Datatype bytes = MPI_DATATYPE_NULL;
    mpi_check(MPI_Type_contiguous(count, MPI_BYTE, &bytes), "MPI_Type_contiguous");
    int const resized = MPI_Type_create_resized(bytes, 0, static_cast<MPI_Aint>(stride), &type_);
    MPI_Type_free(&bytes);
    mpi_check(resized, "MPI_Type_create_resized");
    mpi_check(MPI_Type_commit(&type_), "MPI_Type_commit");
  }

  MPI_Datatype get() const noexcept { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

}  // namespace detail

/// Options of an mpi_communicator.
struct mpi_options {
  /// The buffers are device memory and MPI moves them itself (a CUDA-aware MPI build). memory()
  /// then reports memory_space::device. Check your MPI before setting it: with OpenMPI,
  /// `#include <mpi-ext.h>`, and `MPIX_CUDA_AWARE_SUPPORT` (compile time) and
  /// `MPIX_Query_cuda_support()` (run time) must both be 1. A non-CUDA-aware MPI handed device
  /// pointers crashes or reads garbage.
  bool cuda_aware = false;
  /// The most bytes per peer one MPI call moves (at most INT_MAX, MPI's `int` counts). Larger
  /// blocks are moved in several calls. The default stays well below INT_MAX because some MPI
  /// transports mishandle single messages close to 2 GiB; tests lower it to exercise the split.
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

/// An agoq::comm::communicator over an existing MPI communicator.
///
/// The MPI communicator is not owned: it must stay valid (not freed, MPI not finalized) for as
/// long as this object is used, and only one thread at a time may call into it (MPI's usual
/// rule for collectives on one communicator). Every member is a host function.
///
/// Collectives block until `recv` is complete and `send` may be reused (MPI_Alltoall and
/// MPI_Allgather on bytes). Blocks of more than `max_message_bytes` per peer are moved in pieces
/// of at most that size, each piece one collective call with a strided datatype, so any `n` works
/// whatever the limit of MPI's `int` counts.
///
/// With `cuda_aware`, the buffers are device memory but the calls still block: they are not
/// ordered on any CUDA stream, so the bytes in `send` must be complete (the producing stream
/// synchronized) before a call, and `recv` is complete when it returns.
class mpi_communicator {
 public:
  /// Wraps `comm`. \throws agoq::invalid_argument for MPI_COMM_NULL or a max_message_bytes
  /// outside [1, INT_MAX]; comm_error when MPI cannot report the rank or the size.
  explicit mpi_communicator(MPI_Comm comm, mpi_options const& options = {})
      : comm_(comm), options_(options) {
    AGOQ_EXPECTS(comm != MPI_COMM_NULL, "mpi_communicator: the communicator is MPI_COMM_NULL");
    AGOQ_EXPECTS(options.max_message_bytes >= 1 &&
                     options.max_message_bytes <= static_cast<std::size_t>(INT_MAX),
                 "mpi_communicator: max_message_bytes must be in [1, INT_MAX], got " +
                     std::to_string(options.max_message_bytes));
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// memory_space::device when constructed with `cuda_aware`, else memory_space::host.
  memory_space memory() const noexcept {
    return options_.cuda_aware ? memory_space::device : memory_space::host;
  }
  /// The wrapped MPI communicator.
  MPI_Comm native_handle() const noexcept { return comm_; }

  /// See agoq::comm::communicator. Blocks until this rank's part is complete.
  /// \throws comm_error when an MPI call fails (and the error handler lets it return).
  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    if (n <= options_.max_message_bytes) {
      int const count = static_cast<int>(n);
      detail::mpi_check(MPI_Alltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_),
                        "MPI_Alltoall");
      return;
    }
    split(n, [&](std::size_t offset, int, MPI_Datatype piece) {
      detail::mpi_check(MPI_Alltoall(send + offset, 1, piece, recv + offset, 1, piece, comm_),
                        "MPI_Alltoall");
    });
  }

  /// See agoq::comm::communicator. Blocks until this rank's part is complete.
  /// \throws comm_error when an MPI call fails (and the error handler lets it return).
  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    if (n <= options_.max_message_bytes) {
      int const count = static_cast<int>(n);
      detail::mpi_check(MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_),
                        "MPI_Allgather");
      return;
    }
    split(n, [&](std::size_t offset, int count, MPI_Datatype piece) {
      detail::mpi_check(
          MPI_Allgather(send + offset, count, MPI_BYTE, recv + offset, 1, piece, comm_),
          "MPI_Allgather");
    });
  }

 private:
  // Calls f(offset, count, piece) for consecutive pieces [offset, offset + count) of every peer's
  // n-byte block; `piece` is `count` <= max_message_bytes contiguous bytes with extent n.
  template <class F>
  void split(std::size_t n, F&& f) const {
    std::size_t const limit = options_.max_message_bytes;
    std::size_t const full = n / limit;
    std::size_t const rest = n % limit;
    detail::mpi_datatype full_piece;
    full_piece.make_strided_bytes(static_cast<int>(limit), n);
    for (std::size_t k = 0; k < full; ++k) f(k * limit, static_cast<int>(limit), full_piece.get());
    if (rest > 0) {
      detail::mpi_datatype rest_piece;
      rest_piece.make_strided_bytes(static_cast<int>(rest), n);
      f(full * limit, static_cast<int>(rest), rest_piece.get());
    }
  }

  MPI_Comm comm_;
  mpi_options options_;
  int rank_ = 0;
  int size_ = 0;
};

static_assert(communicator<mpi_communicator>);

}  // namespace agoq::comm
