/// \file
/// Loads and stores of one thread's run of elements and codes: 16-byte (or 8/4-byte) vector
/// accesses when the run is whole and the address is aligned, element by element otherwise.
/// Alignment is checked at run time, never assumed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda/std/bit>

#include "../../device/partition.hpp"
#include "../../numeric/element.hpp"

namespace agoq::detail::gpu {

inline constexpr int run = device::elements_per_thread;
inline constexpr int run_log2 = device::elements_per_thread_log2;

/// True when `p` is a multiple of `a` (a power of two). Host and device.
AGOQ_HOST_DEVICE inline bool aligned(void const* p, std::uintptr_t a) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0;
}

/// A vector load, through the read-only data cache (__ldg) when ReadOnly: for inputs that no thread
/// of the kernel writes.
template <bool ReadOnly, class V>
__device__ inline V load_vector(V const* p) noexcept {
  if constexpr (ReadOnly) {
    return __ldg(p);
  } else {
    return *p;
  }
}

/// Loads a whole run from a 16-byte aligned address as floats (ReadOnly: see load_vector).
template <bool ReadOnly = false, class T>
__device__ inline void load_aligned_run(T const* x, float (&v)[run]) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    float4 const a = load_vector<ReadOnly>(reinterpret_cast<float4 const*>(x));
    float4 const b = load_vector<ReadOnly>(reinterpret_cast<float4 const*>(x) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    uint4 const a = load_vector<ReadOnly>(reinterpret_cast<uint4 const*>(x));
    std::uint32_t const w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = numeric::to_float(cuda::std::bit_cast<T>(static_cast<std::uint16_t>(w[i])));
      v[2 * i + 1] =
          numeric::to_float(cuda::std::bit_cast<T>(static_cast<std::uint16_t>(w[i] >> 16)));
    }
  }
}

/// Loads x[0, count) as floats; lanes past count read 0.
template <class T>
__device__ inline void load_run(T const* x, int count, float (&v)[run]) noexcept {
  if (count == run && aligned(x, 16)) {
    load_aligned_run(x, v);
    return;
  }
#pragma unroll
  for (int i = 0; i < run; ++i) v[i] = i < count ? numeric::to_float(x[i]) : 0.0f;
}

/// Stores a whole run at a 16-byte aligned address, rounding to nearest even.
template <class T>
__device__ inline void store_aligned_run(T* y, float const (&v)[run]) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(y)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(y)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    std::uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = std::uint32_t{numeric::raw_bits(numeric::from_float<T>(v[2 * i]))} |
             (std::uint32_t{numeric::raw_bits(numeric::from_float<T>(v[2 * i + 1]))} << 16);
    }
    *reinterpret_cast<uint4*>(y) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/// Stores v[0, count) as T, rounding to nearest even.
template <class T>
__device__ inline void store_run(T* y, int count, float const (&v)[run]) noexcept {
  if (count == run && aligned(y, 16)) {
    store_aligned_run(y, v);
    return;
  }
#pragma unroll
  for (int i = 0; i < run; ++i) {
    if (i < count) y[i] = numeric::from_float<T>(v[i]);
  }
}

/// Loads the packed codes of a run into the low bytes of a word: one aligned load for a whole run
/// (two 4-byte loads for 8 bytes on a 4-byte boundary, as the blocks of the 8-bit collectives can
/// be), byte loads otherwise.
template <int Bits>
__device__ inline std::uint64_t load_codes(std::uint8_t const* src, int count) noexcept {
  constexpr int full_bytes = run * Bits / 8;
  if (count == run) {
    if constexpr (full_bytes == 8) {
      if (aligned(src, 8)) return *reinterpret_cast<std::uint64_t const*>(src);
      if (aligned(src, 4)) {
        auto const* w = reinterpret_cast<std::uint32_t const*>(src);
        return std::uint64_t{w[0]} | (std::uint64_t{w[1]} << 32);
      }
    } else if constexpr (full_bytes == 4) {
      if (aligned(src, 4)) return *reinterpret_cast<std::uint32_t const*>(src);
    } else {
      if (aligned(src, 2)) return *reinterpret_cast<std::uint16_t const*>(src);
    }
  }
  std::uint64_t w = 0;
  int const bytes = (count * Bits + 7) / 8;
  for (int i = 0; i < bytes; ++i) w |= std::uint64_t{src[i]} << (8 * i);
  return w;
}

}  // namespace agoq::detail::gpu
