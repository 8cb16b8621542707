/// \file
/// The CPU executor's threads: a loop over independent work units split into contiguous ranges,
/// one per thread, the calling thread taking the first. Each unit is computed exactly as a serial
/// loop computes it, so the result is the same bits for every thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

#include "../../host_executor.hpp"

namespace agoq::detail::host {

/// How many threads a call may use: `requested` (0 means std::thread::hardware_concurrency()),
/// capped so that each thread gets at least `min_work` of the `work` units (and at least one).
inline int thread_count(int requested, std::int64_t work, std::int64_t min_work) noexcept {
  std::int64_t n = requested > 0 ? requested : std::thread::hardware_concurrency();
  n = std::min(n, work / std::max<std::int64_t>(min_work, 1));
  return static_cast<int>(std::max<std::int64_t>(n, 1));
}

/// The executor's thread count for a call over `units` units of `unit_elements` elements each.
inline int call_threads(host_executor ex, std::int64_t units, std::int64_t unit_elements) noexcept {
  std::int64_t const per_unit = std::max<std::int64_t>(unit_elements, 1);
  std::int64_t const min_units = (ex.min_elements_per_thread + per_unit - 1) / per_unit;
  return thread_count(ex.threads, units, min_units);
}

/// Calls f(u0, u1) for contiguous ranges that cover the units [0, units) exactly once, on
/// `threads` threads (the calling thread among them, and the only one for threads <= 1) or as
/// `threads` tasks of `pool` when it has one, and returns the sum of what the calls return. The
/// units must be independent of one another: which thread computes a unit then changes nothing
/// in it. A thread that cannot be started has its range run on the calling thread. Once every
/// range has returned, the exception of the lowest range that threw one is rethrown.
template <class F>
std::int64_t parallel_sum(host_pool pool, int threads, std::int64_t units, F&& f) {
  if (threads <= 1 || units <= 1) return units > 0 ? f(std::int64_t{0}, units) : 0;
  auto const n = static_cast<std::size_t>(std::min<std::int64_t>(threads, units));
  struct ranges {
    F& f;
    std::int64_t units;
    std::size_t n;
    std::vector<std::int64_t> sums;
    std::vector<std::exception_ptr> errors;

    std::int64_t begin(std::size_t i) const noexcept {
      return static_cast<std::int64_t>(i) * units / static_cast<std::int64_t>(n);
    }
    void run(std::size_t i) noexcept {
      try {
        sums[i] = f(begin(i), begin(i + 1));
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  } r{f, units, n, std::vector<std::int64_t>(n, 0), std::vector<std::exception_ptr>(n)};
  if (pool.run != nullptr) {
    pool.run(pool.self, static_cast<std::int64_t>(n),
             host_task{[](void* c, std::int64_t i) noexcept {
                         static_cast<ranges*>(c)->run(static_cast<std::size_t>(i));
                       },
                       &r});
  } else {
    std::vector<std::thread> workers;
    std::vector<std::size_t> inline_ranges;
    workers.reserve(n - 1);  // nothing below allocates once a thread runs
    inline_ranges.reserve(n);
    inline_ranges.push_back(0);
    for (std::size_t i = 1; i < n; ++i) {
      try {
        workers.emplace_back([&r, i] { r.run(i); });
      } catch (std::system_error const&) {
        inline_ranges.push_back(i);
      }
    }
    for (std::size_t i : inline_ranges) r.run(i);
    for (std::thread& w : workers) w.join();
  }
  std::int64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (r.errors[i]) std::rethrow_exception(r.errors[i]);
    total += r.sums[i];
  }
  return total;
}

/// parallel_sum on the executor's threads (or pool) for `units` units of `unit_elements` elements
/// each (call_threads): rows of a tensor, for example.
template <class F>
std::int64_t parallel_sum(host_executor ex, std::int64_t units, std::int64_t unit_elements, F&& f) {
  return parallel_sum(ex.pool, call_threads(ex, units, unit_elements), units, f);
}

}  // namespace agoq::detail::host
