/// \file
/// The communication payload of agoq's 8-bit collectives (docs/formats.md, "8-bit collective
/// payloads"): one block per chunk of whole groups, a 16-byte header, the int8 codes, then the
/// chunk's fp32 group scales inline. Also the stream keys of their stochastic rounding. Host-safe;
/// the index and key arithmetic is host and device so a CUDA executor computes the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "../comm/communicator.hpp"
#include "../config.hpp"
#include "../error.hpp"
#include "../layout/view.hpp"
#include "../numeric/codes.hpp"
#include "../scheme/dispatch.hpp"
#include "../scheme/spec.hpp"

namespace agoq::gradient {

/// Smallest and largest group size of the 8-bit collectives and of gradient_buffer.
inline constexpr int min_group_size = 32;
inline constexpr int max_group_size = 256;

/// The four magic bytes that open a payload block: 'A', 'G', 'Q', '8'.
inline constexpr unsigned char payload_magic[4] = {0x41, 0x47, 0x51, 0x38};
/// Version of the payload block format written in byte 4 of its header.
inline constexpr std::uint8_t payload_version = 1;
/// Bytes of a payload block header.
inline constexpr std::int64_t payload_header_bytes = 16;
/// Header flag: some source of this payload held NaN or ±Inf (or its reduction overflowed).
inline constexpr std::uint8_t payload_flag_nonfinite = 0x01;

/// The spec of the payload codes: int8 symmetric, groups of `group_size` along the one row, fp32
/// scales, with the given rounding.
inline spec payload_spec(int group_size, rounding_kind rounding) {
  spec s;
  s.code = code_kind::int_sym;
  s.bits = 8;
  s.grouping = grouping_kind::group;
  s.group_rows = 1;
  s.group_cols = group_size;
  s.rounding = rounding;
  s.scale = scale_format::f32;
  return s;
}

/// How a bucket of `elements` values is cut into one chunk per rank of `ranks`, each a run of
/// whole groups: chunk j holds groups [j * chunk_groups, min(groups, (j + 1) * chunk_groups)) with
/// chunk_groups = ceil(groups / ranks), so trailing chunks may be shorter or empty. Every chunk
/// travels in a block of the same size, sized for chunk_groups groups. Host and device.
struct chunk_plan {
  std::int64_t elements = 0;      ///< N, the bucket length
  std::int64_t group_size = 128;  ///< G
  std::int64_t ranks = 1;         ///< P
  std::int64_t groups = 0;        ///< ceil(N / G)
  std::int64_t chunk_groups = 0;  ///< ceil(groups / P): the capacity of every block, in groups

  AGOQ_HOST_DEVICE constexpr chunk_plan(std::int64_t n, std::int64_t g, std::int64_t p) noexcept
      : elements(n),
        group_size(g),
        ranks(p),
        groups((n + g - 1) / g),
        chunk_groups(((n + g - 1) / g + p - 1) / p) {}

  /// First element of chunk j.
  AGOQ_HOST_DEVICE constexpr std::int64_t begin(std::int64_t j) const noexcept {
    std::int64_t const e = j * chunk_groups * group_size;
    return e < elements ? e : elements;
  }
  /// One past the last element of chunk j.
  AGOQ_HOST_DEVICE constexpr std::int64_t end(std::int64_t j) const noexcept {
    return begin(j + 1);
  }
  /// Elements of chunk j.
  AGOQ_HOST_DEVICE constexpr std::int64_t count(std::int64_t j) const noexcept {
    return end(j) - begin(j);
  }
  /// Codes capacity of a block: chunk_groups * G bytes.
  AGOQ_HOST_DEVICE constexpr std::int64_t code_capacity() const noexcept {
    return chunk_groups * group_size;
  }
  /// Byte offset of the scales inside a block.
  AGOQ_HOST_DEVICE constexpr std::int64_t scales_offset() const noexcept {
    return payload_header_bytes + code_capacity();
  }
  /// Bytes of one block: 16 + chunk_groups * (G + 4).
  AGOQ_HOST_DEVICE constexpr std::int64_t block_bytes() const noexcept {
    return scales_offset() + 4 * chunk_groups;
  }
};

/// The device memory one stage of a CUDA 8-bit collective over `plan` allocates (all_reduce.cuh),
/// section by section, each section 256-byte aligned: the P send blocks, the P receive blocks, the
/// fp32 sums of one chunk when `sums_needed` (an all-reduce requantizes them; a reduce-scatter
/// writes its shard directly), then P chunk counts, the requantization count and two flags of 8
/// bytes each. About 2 N (1 + 4/G) + 4 N / P bytes for a bucket of N elements on P ranks. The
/// memory model sizes agoq's gradient-reduction buffers with it. Host and device.
struct collective_workspace {
  std::int64_t send = 0;      ///< offset of the send blocks
  std::int64_t recv = 0;      ///< offset of the receive blocks
  std::int64_t sums = 0;      ///< offset of the fp32 sums (empty unless sums_needed)
  std::int64_t counters = 0;  ///< offset of the counts and flags
  std::int64_t total = 0;     ///< bytes allocated

  AGOQ_HOST_DEVICE constexpr collective_workspace(chunk_plan const& plan,
                                                  bool sums_needed) noexcept {
    std::int64_t const blocks = up(plan.ranks * plan.block_bytes());
    recv = blocks;
    sums = recv + blocks;
    counters = sums + (sums_needed ? up(4 * plan.code_capacity()) : 0);
    total = counters + 8 * (plan.ranks + 3);
  }

 private:
  AGOQ_HOST_DEVICE static constexpr std::int64_t up(std::int64_t bytes) noexcept {
    return (bytes + 255) / 256 * 256;
  }
};

/// A decoded payload header.
struct payload_header {
  std::uint8_t flags = 0;
  std::int64_t group_size = 0;
  std::int64_t elements = 0;
};

/// Writes a block header: magic, version, flags, group size (u16 LE), element count (u64 LE).
/// Host only (a device writer stores the same 16 bytes).
inline void write_payload_header(std::byte* block, std::uint8_t flags, std::int64_t group_size,
                                 std::int64_t elements) noexcept {
  unsigned char h[payload_header_bytes] = {};
  std::memcpy(h, payload_magic, 4);
  h[4] = payload_version;
  h[5] = flags;
  auto const g = static_cast<std::uint64_t>(group_size);
  h[6] = static_cast<unsigned char>(g & 0xffu);
  h[7] = static_cast<unsigned char>((g >> 8) & 0xffu);
  auto const n = static_cast<std::uint64_t>(elements);
  for (int b = 0; b < 8; ++b) h[8 + b] = static_cast<unsigned char>((n >> (8 * b)) & 0xffu);
  std::memcpy(block, h, payload_header_bytes);
}

/// Reads and checks a block header. Host only.
/// \throws agoq::comm::comm_error when the magic or the version is not agoq's (a corrupted or
/// foreign payload).
inline payload_header read_payload_header(std::byte const* block) {
  unsigned char h[payload_header_bytes];
  std::memcpy(h, block, payload_header_bytes);
  if (std::memcmp(h, payload_magic, 4) != 0 || h[4] != payload_version) {
    throw comm::comm_error("agoq: 8-bit collective: received a block without agoq's payload " +
                           std::string("header (magic 'AGQ8', version ") +
                           std::to_string(payload_version) + ")");
  }
  payload_header p;
  p.flags = h[5];
  p.group_size = static_cast<std::int64_t>(h[6] | (h[7] << 8));
  std::uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= static_cast<std::uint64_t>(h[8 + b]) << (8 * b);
  p.elements = static_cast<std::int64_t>(n);
  return p;
}

/// The codes and scales of a block as a quantized [1, elements] view (agoq's standard layout with
/// the codes and scales in one block). Host only.
inline quantized_view payload_view(spec const& s, chunk_plan const& plan, std::byte* block,
                                   std::int64_t elements) noexcept {
  auto* b = reinterpret_cast<std::uint8_t*>(block);
  return {s, 1, elements, b + payload_header_bytes, b + plan.scales_offset(), nullptr};
}

/// The read-only view of a block's codes and scales. Host only.
inline const_quantized_view payload_view(spec const& s, chunk_plan const& plan,
                                         std::byte const* block, std::int64_t elements) noexcept {
  auto const* b = reinterpret_cast<std::uint8_t const*>(block);
  return {s, 1, elements, b + payload_header_bytes, b + plan.scales_offset(), nullptr};
}

namespace detail {

/// The code family of every payload (payload_spec) and of gradient_buffer.
using payload_code = int_sym<8>;
/// payload_code as the code list of quantize and dequantize calls: the collectives and the
/// gradient buffers compile the kernels of that one family, not the whole dispatch set's.
using payload_codes = type_list<payload_code>;

}  // namespace detail

/// The splitmix64 finalizer (Steele, Lea, Flood 2014). Host and device.
AGOQ_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Which quantization of the gradient path a stochastic-rounding stream belongs to.
enum class stream_tag : std::uint32_t {
  buffer = 0,         ///< gradient_buffer::accumulate
  scatter = 1,        ///< a rank quantizing its own input for the all-to-all
  gather = 2,         ///< the owner of a chunk requantizing the reduced chunk
  inter_scatter = 3,  ///< hierarchical: a node's shard quantized for the inter-node all-to-all
  inter_gather = 4,   ///< hierarchical: the inter-node reduced chunk requantized
};

/// The Philox key of one stochastic quantization: mix64(mix64(mix64(seed) ^ step) ^ (tag << 32 |
/// rank)). Inside a stream, an element draws position = its index in the bucket (so chunks of one
/// quantization never share a draw). `rank` separates ranks quantizing the same positions. Host
/// and device.
AGOQ_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t step,
                                                    stream_tag tag, std::uint32_t rank) noexcept {
  std::uint64_t const t = (static_cast<std::uint64_t>(tag) << 32) | rank;
  return mix64(mix64(mix64(seed) ^ step) ^ t);
}

}  // namespace agoq::gradient
