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
namespace detail {

/// The base of every in-process group, whichever memory its collectives move: the rank count, the
/// barrier the rank threads meet at and the abort flag that releases them. Host only.
class in_process_ranks {
 public:
  int size() const noexcept { return size_; }

  /// Makes every pending and future collective of the group throw comm_error (a peer failed).
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

 protected:
  /// `name` (a string that outlives the object) names the group in its errors.
  /// \throws agoq::invalid_argument for size < 1.
  in_process_ranks(int size, char const* name) : size_(checked_size(size, name)), name_(name) {}

  /// \throws agoq::invalid_argument for a rank outside [0, size()).
  void check_rank(int rank) const {
    AGOQ_EXPECTS(rank >= 0 && rank < size_, std::string(name_) + ": rank " + std::to_string(rank) +
                                                " outside [0, " + std::to_string(size_) + ")");
  }

  /// Waits until all ranks arrived at this barrier; throws comm_error once the group is aborted.
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_) throw_peer_failed();
    std::uint64_t const gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw_peer_failed();
  }

 private:
  // The size, validated before anything is allocated for it.
  static int checked_size(int size, char const* name) {
    AGOQ_EXPECTS(size >= 1,
                 std::string(name) + ": the size must be at least 1, got " + std::to_string(size));
    return size;
  }

  [[noreturn]] void throw_peer_failed() const {
    throw comm_error(std::string("agoq: ") + name_ + ": a peer failed");
  }

  int size_;
  char const* name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
};

/// Runs body(r) on ranks.size() threads (rank r on thread r) and joins them. A rank whose body
/// throws keeps the exception and aborts `ranks`, so the other ranks' pending collectives fail
/// with comm_error instead of waiting forever; then every thread calls finish(r), which must not
/// throw. Rethrows the first exception that is not a comm_error (not the consequence of another
/// rank's failure), else the first comm_error. Host only.
template <class Body, class Finish>
void run_ranks(in_process_ranks& ranks, Body const& body, Finish const& finish) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks.size()));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks.size()));
  for (int r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        ranks.abort();
      }
      finish(r);
    });
  }
  for (auto& t : threads) t.join();
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

}  // namespace detail

/// The state the ranks of an in-process group share. Create it with the group size, then give
/// each thread its `member(rank)`, or let `run` start the threads. size() and abort() come from
/// detail::in_process_ranks.
class in_process_group : public detail::in_process_ranks {
 public:
  /// A group of `size` ranks. \throws agoq::invalid_argument for size < 1.
  explicit in_process_group(int size)
      : in_process_ranks(size, "in_process_group"), posted_(static_cast<std::size_t>(size)) {}

  class member;

  /// The communicator of rank `rank`; one thread uses it at a time.
  member at(int rank);

  /// Runs f(communicator) on `size` threads (rank r on thread r), joins them and rethrows the
  /// first exception any rank threw; the other ranks' pending collectives then fail with
  /// comm_error instead of waiting forever.
  template <class F>
  static void run(int size, F&& f);

 private:
  friend class member;

  std::vector<std::byte const*> posted_;  // sized once the base has validated the size
};

/// One rank's communicator of an in_process_group (satisfies agoq::comm::communicator).
class in_process_group::member {
 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size(); }
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
  check_rank(rank);
  return member(this, rank);
}

template <class F>
void in_process_group::run(int size, F&& f) {
  in_process_group g(size);
  detail::run_ranks(
      g, [&](int r) { f(g.at(r)); }, [](int) {});
}

static_assert(communicator<in_process_group::member>);

}  // namespace agoq::comm
