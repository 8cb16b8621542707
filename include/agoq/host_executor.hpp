/// \file
/// The CPU executor's handle: whether it runs its AVX-512 loops and on how many threads.
#pragma once

#include <cstdint>

namespace agoq {

/// One of the tasks a host_pool runs: run(context, i).
struct host_task {
  void (*run)(void* context, std::int64_t i) noexcept;
  void* context;
};

/// A caller's own thread pool for the host executor (OpenMP, TBB, PyTorch's intra-op pool), so
/// that agoq's threads are the pool's rather than threads of its own next to them:
/// `run(self, n, task)` must call `task.run(task.context, i)` exactly once for every i in
/// [0, n), on any threads (the calling thread among them or not, in any order), and return once
/// every call has returned; it must not throw. The tasks never throw (agoq catches what its work
/// throws and rethrows it on the calling thread). A null `run` (the default) has agoq start
/// std::threads.
struct host_pool {
  void (*run)(void* self, std::int64_t n, host_task task) = nullptr;
  void* self = nullptr;
};

/// The host executor. Every setting gives the same bits: `simd = false` forces the portable loops
/// (used by the tests, and where a caller wants to compare), and `threads` only chooses which
/// thread computes which rows or groups, each of them exactly as one thread computes it.
///
/// Threads: quantize, dequantize, fake_quantize (and what calls them: the weight helpers, the
/// fused ops' passes for groupings that span rows), the fused ops' row loops, activation::measure,
/// the AdamW step, the gradient buffer's accumulate and the 8-bit collectives' host steps (pack,
/// reduce-requantize, unpack; the communicator's calls stay on the calling thread) split their
/// work among `threads` threads, started by the call (or taken from `pool`) and joined before it
/// returns, the calling thread among them; a caller's own threads may call them concurrently on
/// different data, as with one thread.
struct host_executor {
  bool simd = true;
  /// Threads a call may use: 1 (the default) runs on the calling thread alone; 0 (or less) means
  /// std::thread::hardware_concurrency(). With a `pool`, the number of tasks handed to it.
  int threads = 1;
  /// The fewest elements a call hands each thread it starts: starting a thread costs about what
  /// quantizing a few thousand elements does, so smaller calls use fewer threads (at least one).
  /// The tests set 1, so that small tensors are split too.
  std::int64_t min_elements_per_thread = std::int64_t{1} << 16;
  /// Where the threads come from: agoq's own std::threads unless a pool is given.
  host_pool pool{};
};

/// The default host executor: the vector loops compiled for this target (AVX-512; AVX2 draws for
/// stochastic rounding), the calling thread alone.
inline constexpr host_executor host{};

}  // namespace agoq
