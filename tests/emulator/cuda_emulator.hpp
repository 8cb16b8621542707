/// \file
/// A CUDA emulator for agoq's device tier on machines without a GPU: the device tests compile with
/// the host compiler and run every kernel on the CPU, thread by thread, bit for bit as the device
/// would compute it under the same floating-point rules. Include it before anything else (the
/// emulated tests' translation units do); link cuda_emulator.cpp instead of libcudart.
///
/// What it provides:
/// - the CUDA language surface agoq's kernels use: threadIdx, blockIdx, blockDim, gridDim,
///   __shared__ (per block), __syncthreads, __shfl_{xor,down,up,}_sync, __ldg, atomicAdd / Min /
///   Max, __ffsll, __float_as_int and kin, and the IEEE intrinsics (__fadd_rn, __fmul_rn,
///   __fmaf_rn,
///   __fdiv_rn, __fsqrt_rn);
/// - agoq_emulation::launch, which agoq's launcher (agoq::detail::gpu::launch) calls under
///   AGOQ_DEVICE_EMULATION: it runs the grid's blocks one after another, each block's threads as
///   cooperative fibers that switch only at __syncthreads and warp shuffles;
/// - a host-memory CUDA runtime (cuda_emulator.cpp): cudaMalloc and kin on tracked host memory
///   filled with a garbage pattern, synchronous copies and streams, one device (sm_90, a few SMs).
///
/// What it checks that a GPU would leave undefined: a warp shuffle whose lanes disagree on the
/// mask, a lane that reads a lane outside the mask, __syncthreads or a shuffle that some threads
/// never reach (deadlock: reported with the waiting threads), copies from or to untracked memory.
/// Each aborts the test binary with a message.
///
/// What it cannot check: timing, the device's own code paths behind __CUDA_ARCH__ (agoq has three,
/// each a few lines: numeric::mul_hi_lo, numeric::from_float and AGOQ_UNROLL), and ptxas's choices.
/// Floating point follows the host compiler's rules: build the emulated tests with
/// -ffp-contract=off so that no a * b + c is contracted (agoq's device code writes every fma it
/// wants explicitly, and nvcc's contraction of what it does not is checked by the GPU tier).
#pragma once

#define AGOQ_DEVICE_EMULATION 1

// Per-block storage: a host thread runs one block at a time, so a static thread_local local is the
// block's shared variable (host threads launching at once, ranks for one, each have their own).
// Must precede the CUDA headers, which define __shared__ only where it is not defined yet.
#define __shared__ static thread_local

#include <cuda_runtime_api.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

/// The emulated thread's coordinates (set by the fiber scheduler before each switch).
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace agoq_emulation {

/// A kernel body to run once per thread: a callable and its trampoline (no allocation).
struct kernel_body {
  void const* object;
  void (*call)(void const*);
};

/// Runs `body` for every thread of the grid (blocks in order, each block's threads as fibers).
/// Dynamic shared memory of `shared_bytes` bytes is zeroed per launch, then reused by every block.
void run_grid(dim3 grid, dim3 block, std::size_t shared_bytes, kernel_body body);

/// The launch hook of agoq::detail::gpu::launch: runs `f()` as the kernel body on `grid` x
/// `block` threads. Streams are synchronous: the kernel has finished when this returns.
template <class F>
void launch(dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t, F const& f) {
  run_grid(grid, block, shared_bytes,
           kernel_body{&f, [](void const* o) { (*static_cast<F const*>(o))(); }});
}

/// The current block's dynamic shared memory (extern __shared__).
void* dynamic_shared() noexcept;

/// Waits until every thread of the block has arrived (__syncthreads).
void sync_block();

/// The warp-shuffle core: publishes this lane's `bits` under `mask`, waits for the mask's lanes,
/// and returns lane `source`'s bits (this lane's own when `source` < 0).
std::uint64_t shuffle_bits(unsigned mask, std::uint64_t bits, int source);

/// The lane of the current thread in its warp.
unsigned lane() noexcept;

template <class T>
T shuffle(unsigned mask, T v, int source) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle: 1 to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shuffle_bits(mask, bits, source);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

/// First lane of the caller's segment of `width` lanes (a power of two up to 32).
inline int segment_first(int width) noexcept { return static_cast<int>(lane()) & ~(width - 1); }

}  // namespace agoq_emulation

inline void __syncthreads() { agoq_emulation::sync_block(); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return agoq_emulation::shuffle(mask, v,
                                 agoq_emulation::segment_first(width) + (src & (width - 1)));
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  int const self = static_cast<int>(agoq_emulation::lane());
  int const j = self ^ lane_mask;
  return agoq_emulation::shuffle(mask, v,
                                 j <= agoq_emulation::segment_first(width) + width - 1 ? j : -1);
}

template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int const j = static_cast<int>(agoq_emulation::lane()) + static_cast<int>(delta);
  return agoq_emulation::shuffle(mask, v,
                                 j <= agoq_emulation::segment_first(width) + width - 1 ? j : -1);
}

template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int const j = static_cast<int>(agoq_emulation::lane()) - static_cast<int>(delta);
  return agoq_emulation::shuffle(mask, v, j >= agoq_emulation::segment_first(width) ? j : -1);
}

/// __ldg: a plain load (the read-only cache changes nothing a program can see).
template <class T>
T __ldg(T const* p) {
  return *p;
}

// Atomics: the fibers of a launch share one host thread, but several host threads (ranks) may
// launch at once, so these are real atomics.
template <class T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}

namespace agoq_emulation {
/// Stores v at *p where better(v, *p), atomically; returns the old value.
template <class T, class Better>
T atomic_replace_if(T* p, T v, Better better) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (better(v, old) && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
}  // namespace agoq_emulation

template <class T>
T atomicMax(T* p, T v) {
  return agoq_emulation::atomic_replace_if(p, v, [](T a, T b) { return b < a; });
}

template <class T>
T atomicMin(T* p, T v) {
  return agoq_emulation::atomic_replace_if(p, v, [](T a, T b) { return a < b; });
}

inline int __ffsll(long long x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1;
}

inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }

// The IEEE round-to-nearest intrinsics: one rounding each (with -ffp-contract=off nothing fuses).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
