/// \file
/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
/// counter-based generator behind stochastic rounding. The same key and counter give the same
/// numbers on the host and on the device, in any order and on any number of threads.
#pragma once

#include <cstdint>

#include <cuda/std/array>

#include "../config.hpp"

namespace agoq::numeric {

/// Four 32-bit outputs of one Philox block.
using philox_block = cuda::std::array<std::uint32_t, 4>;

/// The high and low 32 bits of the 64-bit product a * b. On the device as __umulhi and a 32-bit
/// multiply, which ptxas compiles to one wide multiply or to a high and a low multiply as the
/// registers allow, without the register move of the high half that the 64-bit form cost (18 of
/// a Philox block's 89 instructions on sm_90, 69 without). Host and device.
AGOQ_HOST_DEVICE constexpr void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                          std::uint32_t& lo) noexcept {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  std::uint64_t const p = std::uint64_t{a} * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
#endif
}

/// Philox4x32 with 10 rounds of the counter `ctr` under the key `key`. Host and device.
AGOQ_HOST_DEVICE constexpr philox_block philox4x32_10(philox_block ctr, std::uint32_t key0,
                                                      std::uint32_t key1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u;
  constexpr std::uint32_t m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u;
  constexpr std::uint32_t w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t h0 = 0, l0 = 0, h1 = 0, l1 = 0;
    mul_hi_lo(m0, ctr[0], h0, l0);
    mul_hi_lo(m1, ctr[2], h1, l1);
    ctr = {h1 ^ ctr[1] ^ key0, l1, h0 ^ ctr[3] ^ key1, l0};
    key0 += w0;
    key1 += w1;
  }
  return ctr;
}

/// The Philox block that holds the random word of stream position `position` under `seed`:
/// position p uses word p % 4 of block p / 4, so four consecutive elements cost one block.
AGOQ_HOST_DEVICE constexpr philox_block philox_block_at(std::uint64_t seed,
                                                        std::uint64_t position) noexcept {
  std::uint64_t const block = position >> 2;
  return philox4x32_10(
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// Turns a 32-bit random word into a uniform float in [0, 1) with 24 random bits (exact).
AGOQ_HOST_DEVICE constexpr float uniform24(std::uint32_t word) noexcept {
  return static_cast<float>(word >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

/// The uniform draw of stream position `position` under `seed` (DESIGN §4): the position is an
/// element's global row-major index plus the caller's offset. Host and device.
AGOQ_HOST_DEVICE constexpr float uniform_at(std::uint64_t seed, std::uint64_t position) noexcept {
  return uniform24(philox_block_at(seed, position)[position & 3u]);
}

}  // namespace agoq::numeric
