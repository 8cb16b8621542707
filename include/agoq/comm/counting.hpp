/// \file
/// A communicator decorator that counts the bytes this rank sends to and receives from each peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "communicator.hpp"

namespace agoq::comm {

/// Wraps a communicator (held by reference) and counts, per peer, the bytes this rank sends to it
/// and receives from it. Bytes a rank "sends" to itself in an all-to-all or all-gather are not
/// counted: they never leave the rank. Host only; the counts are plain integers.
template <communicator C>
class counting {
 public:
  explicit counting(C& inner) : inner_(inner), sent_(inner.size(), 0), received_(inner.size(), 0) {}

  int rank() const { return static_cast<int>(inner_.rank()); }
  int size() const { return static_cast<int>(inner_.size()); }
  memory_space memory() const { return inner_.memory(); }

  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    inner_.all_to_all(send, recv, n);
    tally(n);
  }
  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    inner_.all_gather(send, recv, n);
    tally(n);
  }

  /// Bytes sent to `peer` so far.
  std::uint64_t sent_to(int peer) const { return sent_[static_cast<std::size_t>(peer)]; }
  /// Bytes received from `peer` so far.
  std::uint64_t received_from(int peer) const { return received_[static_cast<std::size_t>(peer)]; }
  /// Bytes sent to all peers so far.
  std::uint64_t sent() const {
    std::uint64_t t = 0;
    for (auto v : sent_) t += v;
    return t;
  }
  /// Bytes received from all peers so far.
  std::uint64_t received() const {
    std::uint64_t t = 0;
    for (auto v : received_) t += v;
    return t;
  }
  /// Sets every count to zero.
  void reset() {
    sent_.assign(sent_.size(), 0);
    received_.assign(received_.size(), 0);
  }

 private:
  void tally(std::size_t n) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      sent_[static_cast<std::size_t>(p)] += n;
      received_[static_cast<std::size_t>(p)] += n;
    }
  }

  C& inner_;
  std::vector<std::uint64_t> sent_;
  std::vector<std::uint64_t> received_;
};

}  // namespace agoq::comm
