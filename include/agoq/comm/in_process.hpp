/// \file
/// An in-process group: N ranks as threads of one process, for tests, demos and single-node CPU
/// use. Host memory; every collective is a barrier-synchronised copy between the ranks' buffers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "communicator.hpp"

namespace agoq::comm {

/// The state the ranks of an in-process group share. Create it with the group size, then give
/// each thread its `member(rank)`, or let `run` start the threads.
class in_process_group {
 public:
  /// A group of `size` ranks. \throws agoq::invalid_argument for size < 1.
  explicit in_process_group(int size)
      : size_(checked_size(size)), posted_(static_cast<std::size_t>(size_)) {}

  class member;

  /// The communicator of rank `rank`; one thread uses it at a time.
  member at(int rank);

  int size() const noexcept { return size_; }

  /// Runs f(communicator) on `size` threads (rank r on thread r), joins them and rethrows the
  /// first exception any rank threw; the other ranks' pending collectives then fail with
  /// comm_error instead of waiting forever.
  template <class F>
  static void run(int size, F&& f);

  /// Makes every pending and future collective of the group throw comm_error (a peer failed).
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  friend class member;

  // The size, validated before anything is allocated for it.
  static int checked_size(int size) {
    AGOQ_EXPECTS(size >= 1,
                 "in_process_group: the size must be at least 1, got " + std::to_string(size));
    return size;
  }

  // Waits until all ranks arrived at this barrier; throws once the group is aborted.
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_) throw comm_error("agoq: in_process_group: a peer failed");
    std::uint64_t const gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw comm_error("agoq: in_process_group: a peer failed");
  }

  int size_;
  std::vector<std::byte const*> posted_;  // sized from size_, declared after it
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
};

/// One rank's communicator of an in_process_group (satisfies agoq::comm::communicator).
class in_process_group::member {
 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size_; }
  memory_space memory() const noexcept { return memory_space::host; }

  /// See agoq::comm::communicator. Blocks until every rank has called it.
  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    exchange(send, recv, n, true);
  }

  /// See agoq::comm::communicator. Blocks until every rank has called it.
  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    exchange(send, recv, n, false);
  }

 private:
  friend class in_process_group;
  member(in_process_group* g, int rank) : group_(g), rank_(rank) {}

  // Post the send buffer, wait for everyone's, copy this rank's blocks, wait until every rank has
  // copied (so no send buffer is reused early).
  void exchange(std::byte const* send, std::byte* recv, std::size_t n, bool to_all) {
    group_->posted_[static_cast<std::size_t>(rank_)] = send;
    group_->barrier();
    for (int i = 0; i < size(); ++i) {
      std::byte const* src = group_->posted_[static_cast<std::size_t>(i)];
      if (n > 0) {
        std::memcpy(recv + static_cast<std::size_t>(i) * n,
                    src + (to_all ? static_cast<std::size_t>(rank_) * n : 0), n);
      }
    }
    group_->barrier();
  }

  in_process_group* group_;
  int rank_;
};

inline in_process_group::member in_process_group::at(int rank) {
  AGOQ_EXPECTS(rank >= 0 && rank < size_, "in_process_group: rank " + std::to_string(rank) +
                                              " outside [0, " + std::to_string(size_) + ")");
  return member(this, rank);
}

template <class F>
void in_process_group::run(int size, F&& f) {
  in_process_group g(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(g.at(r));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        g.abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  // The first rank whose error is not the consequence of another rank's failure.
  std::exception_ptr first;
  for (auto const& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (comm_error const&) {
      if (!first) first = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

static_assert(communicator<in_process_group::member>);

}  // namespace agoq::comm
