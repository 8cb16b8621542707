// The CUDA emulator's fiber scheduler and host-memory runtime (see cuda_emulator.hpp).
#include "cuda_emulator.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/context/fiber.hpp>

namespace agoq_emulation {
namespace {

[[noreturn]] void fail(std::string const& what) {
  std::fprintf(stderr, "agoq CUDA emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---------------------------------------------------------------------------------------------
// Fibers

/// Bytes of stack per emulated thread (committed only as touched).
constexpr std::size_t stack_bytes = std::size_t{256} << 10;
/// Room above each stack for its top's offset (stack_color).
constexpr std::size_t color_bytes = std::size_t{64} << 10;

/// The offset of thread t's stack top above its 256 KiB: 33 cache lines more per thread (modulo
/// color_bytes), so that the tops of a block's stacks, which a switch touches, fall in different
/// sets of the caches rather than all in one (the stacks, mapped whole, share their offset in a
/// page).
constexpr std::size_t stack_color(int t) noexcept {
  return static_cast<std::size_t>(t) * 2112 % color_bytes;
}

enum class fiber_state { runnable, at_shuffle, at_barrier, exited };

namespace ctx = boost::context;

/// A stack allocator handing out one of this host thread's stacks (kept between launches).
struct pooled_stack {
  char* base;
  std::size_t color;
  ctx::stack_context allocate() noexcept {
    ctx::stack_context sc;
    sc.size = stack_bytes + color;
    sc.sp = base + stack_bytes + color;
    return sc;
  }
  void deallocate(ctx::stack_context&) noexcept {}
};

struct fiber {
  ctx::fiber context;    ///< the thread, while suspended (empty once it has exited)
  ctx::fiber scheduler;  ///< inside the thread: the scheduler to switch back to
  uint3 index;
  int linear = 0;
  fiber_state state = fiber_state::runnable;
  std::uint64_t waits_for = 0;  ///< the generation it waits to see pass
  std::size_t group = 0;        ///< at a shuffle: the index of its warp's shuffle group
};

/// The lanes of one warp that shuffle under one mask (disjoint masks, half warps for one, shuffle
/// independently).
struct shuffle_group {
  unsigned mask = 0;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::uint64_t value[2][32] = {};
};

struct warp_state {
  std::vector<shuffle_group> groups;  ///< one per mask seen, kept so that waiting lanes find theirs
};

/// One block in flight on this host thread.
struct block_run {
  std::vector<fiber> threads;
  std::vector<warp_state> warps;
  int arrived = 0;  ///< threads at the current __syncthreads
  std::uint64_t generation = 0;
  int current = 0;
  kernel_body body{};
  void* shared = nullptr;
};

thread_local block_run* running = nullptr;

using stack = std::unique_ptr<char[]>;
/// Stacks of host threads that have exited, for the next threads to take: the in-process groups
/// run each collective on threads of their own, which would otherwise allocate and first touch
/// (page fault by page fault) fresh stacks for every launch of every collective.
std::mutex spare_stacks_mutex;
std::vector<stack> spare_stacks;

/// The fiber stacks of one host thread, kept between its launches and handed to spare_stacks
/// when it exits.
struct thread_stacks {
  std::vector<stack> held;
  ~thread_stacks() {
    std::lock_guard lock(spare_stacks_mutex);
    for (stack& s : held) spare_stacks.push_back(std::move(s));
  }
  /// Grows `held` to n stacks, spare ones first.
  void reserve(std::size_t n) {
    if (held.size() >= n) return;
    {
      std::lock_guard lock(spare_stacks_mutex);
      while (held.size() < n && !spare_stacks.empty()) {
        held.push_back(std::move(spare_stacks.back()));
        spare_stacks.pop_back();
      }
    }
    while (held.size() < n)
      held.push_back(std::make_unique_for_overwrite<char[]>(stack_bytes + color_bytes));
  }
};
thread_local thread_stacks stacks;
/// Dynamic shared memory of the launch in progress on this host thread.
thread_local std::vector<std::max_align_t> shared_memory;

fiber& self() {
  if (running == nullptr) fail("a device function was called outside a kernel");
  return running->threads[static_cast<std::size_t>(running->current)];
}

/// Suspends the current fiber until its wait is over (the scheduler checks).
void suspend(fiber_state why, std::uint64_t generation, std::size_t group = 0) {
  fiber& f = self();
  f.state = why;
  f.waits_for = generation;
  f.group = group;
  f.scheduler = std::move(f.scheduler).resume();
}

std::string describe(block_run const& r) {
  std::string s;
  for (fiber const& f : r.threads) {
    char const* what = f.state == fiber_state::at_shuffle   ? "at a warp shuffle"
                       : f.state == fiber_state::at_barrier ? "at __syncthreads"
                       : f.state == fiber_state::exited     ? "exited"
                                                            : "runnable";
    s += "\n  thread " + std::to_string(f.linear) + " (warp " + std::to_string(f.linear / 32) +
         "): " + what;
  }
  return s;
}

bool blocked(block_run const& r, fiber const& f) {
  switch (f.state) {
    case fiber_state::at_shuffle:
      return r.warps[static_cast<std::size_t>(f.linear / 32)].groups[f.group].generation ==
             f.waits_for;
    case fiber_state::at_barrier:
      return r.generation == f.waits_for;
    case fiber_state::exited:
      return true;
    case fiber_state::runnable:
      return false;
  }
  return true;
}

void run_block(block_run& r, dim3 block, uint3 block_index) {
  int const n = static_cast<int>(block.x * block.y * block.z);
  r.threads.clear();
  r.threads.resize(static_cast<std::size_t>(n));
  r.warps.assign(static_cast<std::size_t>((n + 31) / 32), warp_state{});
  r.arrived = 0;
  r.generation = 0;
  stacks.reserve(static_cast<std::size_t>(n));
  blockIdx = block_index;
  for (int t = 0; t < n; ++t) {
    fiber& f = r.threads[static_cast<std::size_t>(t)];
    f.linear = t;
    auto const x = static_cast<unsigned>(t) % block.x;
    auto const y = static_cast<unsigned>(t) / block.x % block.y;
    auto const z = static_cast<unsigned>(t) / (block.x * block.y);
    f.index = uint3{x, y, z};
    f.context =
        ctx::fiber(std::allocator_arg,
                   pooled_stack{stacks.held[static_cast<std::size_t>(t)].get(), stack_color(t)},
                   [&r, t](ctx::fiber&& scheduler) {
                     fiber& me = r.threads[static_cast<std::size_t>(t)];
                     me.scheduler = std::move(scheduler);
                     r.body.call(r.body.object);
                     me.state = fiber_state::exited;
                     return std::move(me.scheduler);
                   });
  }
  int live = n;
  while (live > 0) {
    bool progress = false;
    for (int t = 0; t < n; ++t) {
      fiber& f = r.threads[static_cast<std::size_t>(t)];
      if (blocked(r, f)) continue;
      progress = true;
      f.state = fiber_state::runnable;
      r.current = t;
      threadIdx = f.index;
      f.context = std::move(f.context).resume();
      if (f.state == fiber_state::exited) --live;
    }
    if (!progress) {
      fail("deadlock in block (" + std::to_string(block_index.x) + ", " +
           std::to_string(block_index.y) + ", " + std::to_string(block_index.z) +
           "): a warp shuffle or __syncthreads that some threads never reach" + describe(r));
    }
  }
}

}  // namespace

void run_grid(dim3 grid, dim3 block, std::size_t shared_bytes, kernel_body body) {
  if (running != nullptr) fail("a kernel was launched from inside a kernel");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      block.x * block.y * block.z > 1024) {
    fail("invalid launch configuration");
  }
  shared_memory.assign((shared_bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t),
                       std::max_align_t{});
  if (!shared_memory.empty()) {
    std::memset(static_cast<void*>(shared_memory.data()), 0xA5,
                shared_memory.size() * sizeof(std::max_align_t));
  }
  block_run r;
  r.body = body;
  r.shared = shared_memory.data();
  gridDim = grid;
  blockDim = block;
  running = &r;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) run_block(r, block, uint3{x, y, z});
    }
  }
  running = nullptr;
}

void* dynamic_shared() noexcept { return running != nullptr ? running->shared : nullptr; }

unsigned lane() noexcept { return static_cast<unsigned>(self().linear) & 31u; }

void sync_block() {
  block_run& r = *running;
  std::uint64_t const g = r.generation;
  if (++r.arrived == static_cast<int>(r.threads.size())) {
    r.arrived = 0;
    ++r.generation;
    return;
  }
  suspend(fiber_state::at_barrier, g);
}

std::uint64_t shuffle_bits(unsigned mask, std::uint64_t bits, int source) {
  fiber& f = self();
  int const lane = f.linear & 31;
  int const warp = f.linear / 32;
  std::vector<shuffle_group>& groups = running->warps[static_cast<std::size_t>(warp)].groups;
  if (((mask >> lane) & 1u) == 0) {
    fail("thread " + std::to_string(f.linear) + " calls a warp shuffle whose mask leaves it out");
  }
  std::size_t k = groups.size();
  for (std::size_t j = 0; j < groups.size(); ++j) {
    if (groups[j].mask == mask) {
      k = j;
    } else if (groups[j].arrived > 0 && (groups[j].mask & mask) != 0) {
      fail("warp " + std::to_string(warp) + ": lanes shuffle under overlapping masks " +
           std::to_string(groups[j].mask) + " and " + std::to_string(mask));
    }
  }
  if (k == groups.size()) groups.push_back(shuffle_group{mask});
  shuffle_group& g = groups[k];
  std::uint64_t const generation = g.generation;
  int const slot = static_cast<int>(generation & 1u);
  g.value[slot][lane] = bits;
  if (++g.arrived == std::popcount(mask)) {
    g.arrived = 0;
    ++g.generation;
  } else {
    suspend(fiber_state::at_shuffle, generation, k);
  }
  if (source < 0) return bits;
  if (((mask >> source) & 1u) == 0) {
    fail("thread " + std::to_string(f.linear) + " reads lane " + std::to_string(source) +
         ", which is outside the shuffle's mask");
  }
  // A lane reaches this group's next-but-one shuffle (the one that reuses `slot`) only once every
  // lane of the group has arrived at the next one, that is, has read this one. `groups` may have
  // grown meanwhile: index it again.
  return running->warps[static_cast<std::size_t>(warp)].groups[k].value[slot][source];
}

// ---------------------------------------------------------------------------------------------
// The runtime

namespace {

std::mutex allocations_mutex;
std::map<std::uintptr_t, std::size_t>& allocations() {
  static std::map<std::uintptr_t, std::size_t> m;
  return m;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

/// Whether [p, p + n) lies in one emulated device allocation.
bool device_range(void const* p, std::size_t n) {
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(allocations_mutex);
  auto it = allocations().upper_bound(a);
  if (it == allocations().begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

/// The emulated device's memory, as cudaMemGetInfo reports it: small enough that the tests past
/// 2^31 elements skip themselves.
constexpr std::size_t memory_bytes = std::size_t{2} << 30;

}  // namespace
}  // namespace agoq_emulation

using namespace agoq_emulation;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t n) {
  if (p == nullptr) return record(cudaErrorInvalidValue);
  *p = nullptr;
  if (n == 0) return cudaSuccess;
  // Exactly n bytes (256-byte aligned, as cudaMalloc's), so that a sanitizer sees an access past
  // the end, which the rounding of a real allocation hides.
  void* q = nullptr;
  if (posix_memalign(&q, 256, n) != 0) return record(cudaErrorMemoryAllocation);
  std::memset(q, 0xA5, n);  // device memory starts as garbage, never as zeros
  {
    std::lock_guard lock(allocations_mutex);
    allocations()[reinterpret_cast<std::uintptr_t>(q)] = n;
  }
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard lock(allocations_mutex);
    if (allocations().erase(reinterpret_cast<std::uintptr_t>(p)) == 0) {
      return record(cudaErrorInvalidValue);
    }
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }

cudaError_t cudaMemcpy(void* dst, void const* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  bool const from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  bool const to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (dst == nullptr || src == nullptr || (from_device && !device_range(src, n)) ||
      (to_device && !device_range(dst, n))) {
    std::fprintf(stderr,
                 "agoq CUDA emulator: cudaMemcpy of %zu bytes from %p to %p (kind %d): an operand "
                 "is null or its device side lies outside every allocation\n",
                 n, src, static_cast<void*>(dst), static_cast<int>(kind));
    return record(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, void const* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, n, kind);
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  if (n == 0) return cudaSuccess;
  if (!device_range(p, n)) return record(cudaErrorInvalidValue);
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t) {
  return cudaMemset(p, value, n);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  *free_bytes = memory_bytes;
  *total = memory_bytes;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, void const* p) {
  if (a == nullptr) return record(cudaErrorInvalidValue);
  *a = cudaPointerAttributes{};
  if (p != nullptr && device_range(p, 1)) {
    a->type = cudaMemoryTypeDevice;
    a->device = 0;
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}

// Streams and events: every operation completes before its call returns.
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

// One device: compute capability 9.0 with a few SMs, so that grids are small and grid-stride
// loops take several turns.
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : record(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 3;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    default:
      return record(cudaErrorInvalidValue);
  }
}

cudaError_t cudaGetLastError(void) {
  cudaError_t const e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

char const* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaErrorUnknown";
  }
}

char const* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (emulated)";
    default:
      return "unknown error (emulated)";
  }
}

}  // extern "C"
