/// \file
/// The index arithmetic and header bytes of the CUDA executor of the 8-bit collectives
/// (all_reduce.cuh), host and device so the host tests check what the kernels compute: which
/// thread of the fused dequantize-sum kernel covers which elements of a chunk and under which
/// group scales, and the 16-byte payload block header as the device writes and checks it
/// (payload.hpp's write_payload_header / read_payload_header, byte for byte).
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "payload.hpp"

namespace agoq::gradient::detail {

/// Elements one thread of the fused dequantize-sum kernel covers (one 8-byte load of codes per
/// block).
inline constexpr int reduce_run_elements = 8;

/// The elements thread `t` of the fused dequantize-sum kernel covers in a chunk of `count`
/// elements with groups of `group_size` (>= reduce_run_elements): elements [begin, begin + count)
/// of the chunk; elements begin + i with i < split lie in group `group` of the chunk, the others
/// (when split < count) in group + 1 (a run of 8 never spans more than two groups of 32 or more).
struct reduce_run {
  std::int64_t begin = 0;
  int count = 0;  ///< 0 for a thread past the end of the chunk
  std::int64_t group = 0;
  int split = 0;
};

/// Number of threads the fused dequantize-sum kernel needs for a chunk of `count` elements.
/// Host and device.
AGOQ_HOST_DEVICE constexpr std::int64_t reduce_thread_count(std::int64_t count) noexcept {
  return (count + reduce_run_elements - 1) / reduce_run_elements;
}

/// The run of thread `t` (see reduce_run). Host and device.
AGOQ_HOST_DEVICE constexpr reduce_run reduce_run_of(std::int64_t t, std::int64_t count,
                                                    std::int64_t group_size) noexcept {
  reduce_run r;
  std::int64_t const b = t * reduce_run_elements;
  if (t < 0 || b >= count) return r;
  std::int64_t const left = count - b;
  r.begin = b;
  r.count = static_cast<int>(left < reduce_run_elements ? left : reduce_run_elements);
  r.group = b / group_size;
  std::int64_t const to_next = (r.group + 1) * group_size - b;
  r.split = static_cast<int>(to_next < r.count ? to_next : r.count);
  return r;
}

// payload_magic as scalars (a namespace-scope array is host memory; device code reads these).
inline constexpr std::uint8_t magic0 = 0x41, magic1 = 0x47, magic2 = 0x51, magic3 = 0x38;
static_assert(magic0 == payload_magic[0] && magic1 == payload_magic[1] &&
              magic2 == payload_magic[2] && magic3 == payload_magic[3]);

/// Writes a payload block header into h[0, 16): the bytes write_payload_header writes. Host and
/// device.
AGOQ_HOST_DEVICE constexpr void encode_payload_header(std::uint8_t* h, std::uint8_t flags,
                                                      std::int64_t group_size,
                                                      std::int64_t elements) noexcept {
  h[0] = magic0;
  h[1] = magic1;
  h[2] = magic2;
  h[3] = magic3;
  h[4] = payload_version;
  h[5] = flags;
  auto const g = static_cast<std::uint64_t>(group_size);
  h[6] = static_cast<std::uint8_t>(g & 0xffu);
  h[7] = static_cast<std::uint8_t>((g >> 8) & 0xffu);
  auto const n = static_cast<std::uint64_t>(elements);
  for (int b = 0; b < 8; ++b) h[8 + b] = static_cast<std::uint8_t>((n >> (8 * b)) & 0xffu);
}

/// True when h[0, 16) is an agoq payload header (magic, version) for `elements` elements in
/// groups of `group_size`: what checked_header accepts. Host and device.
AGOQ_HOST_DEVICE constexpr bool payload_header_matches(std::uint8_t const* h,
                                                       std::int64_t group_size,
                                                       std::int64_t elements) noexcept {
  if (h[0] != magic0 || h[1] != magic1 || h[2] != magic2 || h[3] != magic3 ||
      h[4] != payload_version) {
    return false;
  }
  std::int64_t const g = static_cast<std::int64_t>(h[6] | (h[7] << 8));
  std::uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= static_cast<std::uint64_t>(h[8 + b]) << (8 * b);
  return g == group_size && static_cast<std::int64_t>(n) == elements;
}

}  // namespace agoq::gradient::detail
