/// \file
/// The communicator concept: what agoq's collectives (the 8-bit all-reduce, reduce-scatter and
/// their hierarchical forms) need of a process group. Algorithms never call NCCL or MPI directly;
/// adapters (in_process.hpp, mpi.hpp, nccl.cuh) or a user's own type satisfy this concept.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace agoq::comm {

/// Thrown by agoq's communicator adapters when a transfer fails or a peer has failed.
class comm_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where the buffers passed to a communicator live.
enum class memory_space : std::uint8_t {
  host,    ///< host memory; calls block until the data has arrived (MPI, in-process threads)
  device,  ///< device memory; calls are enqueued on the communicator's CUDA stream (NCCL)
};

/// A process group of `size()` ranks, this one being `rank()`, that moves bytes:
///
/// - `all_to_all(send, recv, n)`: every rank sends `n` bytes to every rank (itself included):
///   bytes [j n, (j + 1) n) of `send` go to rank j, and bytes [i n, (i + 1) n) of `recv` receive
///   what rank i sent to this rank. `send` and `recv` hold size() * n bytes and do not overlap.
/// - `all_gather(send, recv, n)`: every rank contributes `n` bytes; bytes [i n, (i + 1) n) of
///   `recv` receive rank i's. `recv` holds size() * n bytes and does not overlap `send`.
/// - `memory()`: where `send` and `recv` must live.
///
/// Every rank calls the same sequence of collectives with the same `n` (agoq checks lengths with
/// an all_gather before its payloads, so a mismatch is an error on every rank, not a hang).
/// Host communicators return once `recv` is complete and `send` may be reused; device
/// communicators enqueue the transfer on their stream and return. A failure throws (agoq
/// adapters throw agoq::comm::comm_error).
template <class C>
concept communicator = requires(C& c, std::byte const* send, std::byte* recv, std::size_t n) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.memory() } -> std::same_as<memory_space>;
  c.all_to_all(send, recv, n);
  c.all_gather(send, recv, n);
};

}  // namespace agoq::comm
