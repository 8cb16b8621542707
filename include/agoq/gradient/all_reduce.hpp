/// \file
/// The precision-preserving 8-bit all-reduce (DESIGN §5, "Gradients"), its reduce-scatter form
/// for sharded optimizers and its hierarchical form across nodes, over any
/// agoq::comm::communicator with host memory, on the CPU executor.
///
/// The flat algorithm on P ranks, for a bucket of N elements and groups of G:
/// 1. every rank all-gathers a 32-byte record (N, G, options, a local error code), so mismatched
///    lengths or bad arguments throw agoq::invalid_argument on every rank instead of hanging;
/// 2. the bucket is cut into P chunks of whole groups (chunk_plan); every rank quantizes chunk j
///    of its input (int8, fp32 scales, stochastic or nearest rounding) into payload block j
///    (payload.hpp: header, codes, scales inline);
/// 3. all_to_all of the P equal-size blocks: rank j receives chunk j from every rank;
/// 4. rank j dequantizes the P received chunks and sums them in fp32, in rank order
///    s = x̂_0; s = s + x̂_1; ...; s = s + x̂_{P-1} (each + one IEEE fp32 addition rounded to nearest,
///    no fused multiply-add, no reassociation), then s = s / P when averaging (one IEEE division),
///    piece by piece (about 4096 elements);
/// 5. rank j requantizes its reduced chunk into one block and all_gather gives every rank all P
///    reduced chunks, which it dequantizes into its output (or copies, to keep them 8-bit).
/// Every element is quantized exactly twice whatever P is, no int8 value is summed, and every rank
/// ends with the same bytes. Bytes sent per rank: (P - 1) (32 + 2 (16 + ceil(ceil(N/G)/P) (G +
/// 4))), i.e. 2 (P-1)/P N (1 + 4/G) plus headers when P G divides N (all_reduce_bytes_sent).
///
/// The CUDA executor of all three is all_reduce.cuh (all_reduce_8bit_async,
/// reduce_scatter_8bit_async, all_reduce_8bit_hierarchical_async, over device communicators);
/// the functions here refuse a device communicator.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../comm/communicator.hpp"
#include "../detail/host/simd.hpp"
#include "../error.hpp"
#include "../layout/matrix.hpp"
#include "../layout/params.hpp"
#include "../layout/view.hpp"
#include "../numeric/codec.hpp"
#include "../numeric/element.hpp"
#include "../numeric/rounding.hpp"
#include "../quantize.hpp"
#include "buffer.hpp"
#include "payload.hpp"

namespace agoq::gradient {

/// Options of the 8-bit collectives. Every rank must pass the same group size, average and
/// rounding (checked: a mismatch throws on every rank).
struct all_reduce_options {
  int group_size = 128;                             ///< elements per scale, 32..256
  bool average = false;                             ///< divide the sum by the number of ranks
  rounding_kind rounding = rounding_kind::nearest;  ///< rounding of every quantization
  std::uint64_t seed = 0;  ///< stochastic rounding: the user seed (same on every rank)
  std::uint64_t step = 0;  ///< stochastic rounding: the step counter (advance it every call)
};

/// What an 8-bit collective reports.
struct all_reduce_result {
  /// Some rank's input held NaN or ±Inf, or a reduction overflowed: identical on every rank, so
  /// every rank can skip the optimizer step together.
  bool nonfinite = false;
  /// This rank's count of non-finite input values (for a gradient_buffer input: its
  /// nonfinite_count()).
  std::int64_t local_nonfinite = 0;
};

/// What reduce_scatter_8bit reports: the flags of all_reduce_result and this rank's element range
/// [begin, end) of the bucket, which its shard holds.
struct reduce_scatter_result {
  bool nonfinite = false;            ///< as all_reduce_result::nonfinite
  std::int64_t local_nonfinite = 0;  ///< as all_reduce_result::local_nonfinite
  std::int64_t begin = 0;            ///< first element of this rank's chunk
  std::int64_t end = 0;              ///< one past its last element
};

/// The element range [begin, end) that rank `rank` of `ranks` owns in an 8-bit collective over
/// `n` elements in groups of `group_size` (chunk_plan). Host only.
/// \throws agoq::invalid_argument for n < 0, ranks < 1, rank outside [0, ranks) or a group size
/// outside [32, 256].
inline reduce_scatter_result shard_range(std::int64_t n, int ranks, int rank, int group_size) {
  AGOQ_EXPECTS(n >= 0 && ranks >= 1 && rank >= 0 && rank < ranks,
               "shard_range: need n >= 0 and 0 <= rank < ranks, got n = " + std::to_string(n) +
                   ", rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  detail::check_group_size(group_size, "shard_range");
  chunk_plan const p(n, group_size, ranks);
  return {false, 0, p.begin(rank), p.end(rank)};
}

namespace detail {

/// Bytes of the argument record all-gathered before the payloads.
inline constexpr std::int64_t meta_bytes = 32;

/// Bytes one rank sends in all_reduce_8bit over `ranks` ranks (counted as comm::counting does:
/// nothing to itself). Host and device.
AGOQ_HOST_DEVICE constexpr std::int64_t all_reduce_bytes(std::int64_t n, std::int64_t ranks,
                                                         std::int64_t group_size) noexcept {
  return (ranks - 1) * (meta_bytes + 2 * chunk_plan(n, group_size, ranks).block_bytes());
}

}  // namespace detail

/// Bytes one rank sends to its peers in all_reduce_8bit of `n` elements over `ranks` ranks:
/// (P - 1) (32 + 2 (16 + ceil(ceil(n / G) / P) (G + 4))). When P G divides n this is
/// 2 (P - 1) / P n (1 + 4 / G) + 64 (P - 1) header bytes (32 per record, 16 per block). Host only.
inline std::int64_t all_reduce_bytes_sent(std::int64_t n, int ranks, int group_size) {
  shard_range(n, ranks, 0, group_size);  // validates
  return detail::all_reduce_bytes(n, ranks, group_size);
}

/// Bytes one rank sends in reduce_scatter_8bit: (P - 1) (32 + 16 + ceil(ceil(n / G) / P) (G + 4)).
/// Host only.
inline std::int64_t reduce_scatter_bytes_sent(std::int64_t n, int ranks, int group_size) {
  shard_range(n, ranks, 0, group_size);
  return (ranks - 1) * (detail::meta_bytes + chunk_plan(n, group_size, ranks).block_bytes());
}

namespace detail {

/// The collective a record belongs to (a rank calling another collective is a mismatch).
enum class collective_kind : std::uint8_t { all_reduce = 1, reduce_scatter = 2, hierarchical = 3 };

/// A rank's verdict on its own arguments, carried in its record so every rank can throw.
enum class local_error : std::uint32_t {
  none = 0,
  output_size = 1,        ///< the output does not hold the elements the collective writes
  group_size = 2,         ///< group size outside [32, 256]
  output_view = 3,        ///< the quantized output's spec or extents are not the payload's
  buffer_group_size = 4,  ///< a gradient_buffer operand's group size is not options.group_size
  null_pointer = 5,       ///< null data with a non-zero length
  overlap = 6,            ///< input and output overlap without being the same buffer
  peer_group = 7,         ///< hierarchical: a rank of this rank's other group failed its checks
};

inline char const* describe(local_error e) {
  switch (e) {
    case local_error::none:
      return "no error";
    case local_error::output_size:
      return "the output buffer is too small (or of another length)";
    case local_error::group_size:
      return "the group size is outside [32, 256]";
    case local_error::output_view:
      return "the quantized output is not a [1, N] int8_g<G>_sym_f32 view with codes and scales";
    case local_error::buffer_group_size:
      return "a gradient_buffer's group size differs from options.group_size";
    case local_error::null_pointer:
      return "a null data pointer with a non-zero length";
    case local_error::overlap:
      return "input and output overlap without being the same buffer";
    case local_error::peer_group:
      return "a rank of its node's group reported an invalid argument";
  }
  return "unknown error";
}

/// The argument record: 'A' 'G' 'Q' 'M', version, collective, average, rounding, N (u64 LE),
/// G (u32 LE), error (u32 LE), 8 zero bytes.
struct meta_record {
  collective_kind kind = collective_kind::all_reduce;
  std::uint8_t average = 0;
  std::uint8_t rounding = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;
  local_error error = local_error::none;
};

inline void put_le(unsigned char* p, std::uint64_t v, int bytes) noexcept {
  for (int b = 0; b < bytes; ++b) p[b] = static_cast<unsigned char>((v >> (8 * b)) & 0xffu);
}

inline std::uint64_t get_le(unsigned char const* p, int bytes) noexcept {
  std::uint64_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<std::uint64_t>(p[b]) << (8 * b);
  return v;
}

inline void write_meta(std::byte* dst, meta_record const& m) noexcept {
  unsigned char h[meta_bytes] = {'A', 'G', 'Q', 'M', payload_version};
  h[5] = static_cast<unsigned char>(m.kind);
  h[6] = m.average;
  h[7] = m.rounding;
  put_le(h + 8, static_cast<std::uint64_t>(m.n), 8);
  put_le(h + 16, static_cast<std::uint64_t>(m.group_size), 4);
  put_le(h + 20, static_cast<std::uint64_t>(m.error), 4);
  std::memcpy(dst, h, meta_bytes);
}

inline meta_record read_meta(std::byte const* src) {
  unsigned char h[meta_bytes];
  std::memcpy(h, src, meta_bytes);
  if (h[0] != 'A' || h[1] != 'G' || h[2] != 'Q' || h[3] != 'M' || h[4] != payload_version) {
    throw comm::comm_error("agoq: 8-bit collective: a peer sent no agoq argument record");
  }
  meta_record m;
  m.kind = static_cast<collective_kind>(h[5]);
  m.average = h[6];
  m.rounding = h[7];
  m.n = static_cast<std::int64_t>(get_le(h + 8, 8));
  m.group_size = static_cast<std::int64_t>(get_le(h + 16, 4));
  m.error = static_cast<local_error>(get_le(h + 20, 4));
  return m;
}

/// All-gathers `mine` over `comm` and returns the first problem any rank has (its own error, or
/// a record differing from rank 0's), described identically on every rank; empty when none.
template <comm::communicator C>
std::string check_group(C& comm, meta_record const& mine, char const* what) {
  auto const p = static_cast<std::size_t>(comm.size());
  std::vector<std::byte> send(meta_bytes), recv(p * meta_bytes);
  write_meta(send.data(), mine);
  comm.all_gather(send.data(), recv.data(), meta_bytes);
  std::vector<meta_record> all(p);
  for (std::size_t r = 0; r < p; ++r) all[r] = read_meta(recv.data() + r * meta_bytes);
  std::string const pre = std::string(what) + ": rank ";
  for (std::size_t r = 0; r < p; ++r) {
    if (all[r].error != local_error::none)
      return pre + std::to_string(r) + ": " + describe(all[r].error);
  }
  for (std::size_t r = 1; r < p; ++r) {
    meta_record const& a = all[0];
    meta_record const& b = all[r];
    if (b.kind != a.kind) return pre + std::to_string(r) + " called another collective than rank 0";
    if (b.n != a.n) {
      return pre + std::to_string(r) + " has " + std::to_string(b.n) + " elements but rank 0 has " +
             std::to_string(a.n) + " (lengths must match)";
    }
    if (b.group_size != a.group_size) {
      return pre + std::to_string(r) + " uses groups of " + std::to_string(b.group_size) +
             " but rank 0 groups of " + std::to_string(a.group_size);
    }
    if (b.average != a.average || b.rounding != a.rounding) {
      return pre + std::to_string(r) + " passed other average/rounding options than rank 0";
    }
  }
  return {};
}

/// The elements [b, b + n) of a [1, *] view whose b is a multiple of the group size.
template <class Byte>
basic_quantized_view<Byte> sub_view(basic_quantized_view<Byte> const& v, std::int64_t b,
                                    std::int64_t n) noexcept {
  std::int64_t const g = v.spec.group_cols;
  return {v.spec, 1, n, v.codes + b, v.scales + 4 * (b / g), nullptr};
}

/// Quantizes chunks of a flat array of float, half or bfloat16. Element i of the array is stream
/// position `position0 + i`.
template <class T>
struct span_source {
  T const* data = nullptr;
  std::uint64_t position0 = 0;
  std::uint8_t flags = 0;  ///< header flags to add on every block (none for a plain input)

  /// Quantizes chunk j into `block` in ranges of whole groups on the executor's threads (the same
  /// bits as one quantize of the chunk); returns the non-finite count.
  std::int64_t pack(host_executor ex, chunk_plan const& plan, std::int64_t j, spec const& s,
                    std::uint64_t key, std::byte* block) const {
    std::int64_t const b = plan.begin(j);
    std::int64_t const n = plan.count(j);
    quantized_view const out = payload_view(s, plan, block, n);
    return for_each_range(
        ex, n, plan.group_size, [&](host_executor one, std::int64_t c, std::int64_t e) {
          return quantize<payload_codes>(one, as_row(data + b + c, e - c), sub_view(out, c, e - c),
                                         {key, position0 + static_cast<std::uint64_t>(b + c)});
        });
  }
};

/// Copies chunks of an already quantized [1, N] view (a gradient_buffer): no requantization.
struct quantized_source {
  const_quantized_view view;
  std::uint8_t flags = 0;

  std::int64_t pack(host_executor, chunk_plan const& plan, std::int64_t j, spec const& s,
                    std::uint64_t, std::byte* block) const {
    std::int64_t const b = plan.begin(j);
    std::int64_t const n = plan.count(j);
    if (n == 0) return 0;
    quantized_view const dst = payload_view(s, plan, block, n);
    const_quantized_view const src = sub_view(view, b, n);
    std::memcpy(dst.codes, src.codes, static_cast<std::size_t>(n));
    std::memcpy(dst.scales, src.scales,
                static_cast<std::size_t>(4 * ((n + plan.group_size - 1) / plan.group_size)));
    return 0;
  }
};

/// Fills the P blocks of `send` from `src` (chunk j into block j), then their headers; the flags
/// carry payload_flag_nonfinite on every block when this rank met any non-finite value, so the
/// receiver of any one block learns it. Returns the non-finite count.
template <class Source>
std::int64_t pack_blocks(host_executor ex, chunk_plan const& plan, Source const& src, spec const& s,
                         std::uint64_t key, std::byte* send) {
  std::int64_t const bb = plan.block_bytes();
  std::int64_t nonfinite = 0;
  for (std::int64_t j = 0; j < plan.ranks; ++j) {
    nonfinite += src.pack(ex, plan, j, s, key, send + j * bb);
  }
  std::uint8_t const flags =
      static_cast<std::uint8_t>(src.flags | (nonfinite > 0 ? payload_flag_nonfinite : 0));
  for (std::int64_t j = 0; j < plan.ranks; ++j) {
    write_payload_header(send + j * bb, flags, plan.group_size, plan.count(j));
  }
  return nonfinite;
}

/// Reads and checks block j's header of a collective with `plan`.
inline payload_header checked_header(std::byte const* block, chunk_plan const& plan,
                                     std::int64_t j) {
  payload_header const h = read_payload_header(block);
  if (h.group_size != plan.group_size || h.elements != plan.count(j)) {
    throw comm::comm_error("agoq: 8-bit collective: a block of chunk " + std::to_string(j) +
                           " holds " + std::to_string(h.elements) + " elements in groups of " +
                           std::to_string(h.group_size) + ", expected " +
                           std::to_string(plan.count(j)) + " in groups of " +
                           std::to_string(plan.group_size));
  }
  return h;
}

/// sum[0, n) = the decoded elements [b, b + n) of the P blocks of `recv` (chunk j of `count`
/// elements; b a multiple of the group size) added in rank order, ((x0 + x1) + x2) + ..., each
/// x_r = numeric::decode of block r's code (what dequantize writes), then divided by `divisor`
/// unless it is 1: one fp32 rounding per addition and division, in the same order on every
/// executor, so the same bits. The portable loop decodes each block straight into the running
/// sums; the AVX-512 loop (host executor with simd, where compiled) keeps 16 sums in a register
/// across the P blocks, so each sum is stored once.
inline void sum_blocks(host_executor ex, chunk_plan const& plan, std::byte const* recv,
                       spec const& s, std::int64_t count, std::int64_t b, std::int64_t n,
                       float divisor, float* sum) noexcept {
  std::int64_t const bb = plan.block_bytes();
  std::int64_t const g = plan.group_size;
  std::int64_t const g0 = b / g;
#if defined(AGOQ_HOST_AVX512)
  if (ex.simd) {
    namespace h = agoq::detail::host;
    // Block r's codes of element b + i at codes + r * bb + i, its scale of group g0 + k at
    // scales + r * bb + 4 * k (payload_view's layout, f32 scales as load_group_params reads them).
    auto const* base = reinterpret_cast<std::uint8_t const*>(recv);
    std::uint8_t const* codes = base + payload_header_bytes + b;
    std::uint8_t const* scales = base + plan.scales_offset() + 4 * g0;
    __m512i const zero_point = _mm512_setzero_si512();
    __m512 const d = _mm512_set1_ps(divisor);
    for (std::int64_t k = 0; k * g < n; ++k) {
      std::int64_t const end = std::min(n, (k + 1) * g);
      for (std::int64_t i = k * g; i < end; i += 16) {
        __mmask16 const live = h::tail_mask16(end - i);
        __m512 acc = _mm512_setzero_ps();
        for (std::int64_t r = 0; r < plan.ranks; ++r) {
          float scale;
          std::memcpy(&scale, scales + r * bb + 4 * k, 4);
          __m512i const c = _mm512_slli_epi32(
              _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, codes + r * bb + i)), 24);
          __m512 const x = h::decode_vec<payload_code>(c, _mm512_set1_ps(scale), zero_point);
          acc = r == 0 ? x : _mm512_add_ps(acc, x);
        }
        if (divisor != 1.0f) acc = _mm512_div_ps(acc, d);
        _mm512_mask_storeu_ps(sum + i, live, acc);
      }
    }
    return;
  }
#else
  (void)ex;
#endif
  for (std::int64_t r = 0; r < plan.ranks; ++r) {
    const_quantized_view const v = payload_view(s, plan, recv + r * bb, count);
    std::uint8_t const* codes = v.codes + b;
    for (std::int64_t k = 0; k * g < n; ++k) {
      group_params const p = load_group_params(v, g0 + k);
      std::int64_t const end = std::min(n, (k + 1) * g);
      if (r == 0) {
        for (std::int64_t i = k * g; i < end; ++i) sum[i] = decode<payload_code>(codes[i], p);
      } else {
        for (std::int64_t i = k * g; i < end; ++i) {
          sum[i] = sum[i] + decode<payload_code>(codes[i], p);
        }
      }
    }
  }
  if (divisor != 1.0f) {
    for (std::int64_t i = 0; i < n; ++i) sum[i] = sum[i] / divisor;
  }
}

/// What reduce_blocks returns: the OR of the blocks' header flags, and the sum of what its emit
/// calls returned.
struct reduced {
  std::uint8_t flags = 0;
  std::int64_t emitted = 0;
};

/// The fused dequantize-sum(-divide) step of the rank owning chunk j: reads the P blocks of
/// `recv` (block r from rank r), and for each piece of whole groups (about 4096 elements) calls
/// emit(one, b, s, n) with the fp32 sums s[0, n) of chunk elements [b, b + n), summed in rank
/// order 0..P-1 and divided by `divisor` unless it is 1 (sum_blocks), and `one`, the executor
/// on one thread. The pieces are split among the executor's threads (for_each_piece: `scratch`
/// holds a piece's sums on one thread), so emit must only touch its own piece.
template <class Emit>
reduced reduce_blocks(host_executor ex, chunk_plan const& plan, std::int64_t j,
                      std::byte const* recv, spec const& s, float divisor,
                      std::vector<float>& scratch, Emit&& emit) {
  std::int64_t const bb = plan.block_bytes();
  std::int64_t const count = plan.count(j);
  reduced r;
  for (std::int64_t k = 0; k < plan.ranks; ++k)
    r.flags |= checked_header(recv + k * bb, plan, j).flags;
  r.emitted = for_each_piece(ex, count, plan.group_size, scratch,
                             [&](host_executor one, std::int64_t b, std::int64_t n, float* acc) {
                               sum_blocks(one, plan, recv, s, count, b, n, divisor, acc);
                               return emit(one, b, static_cast<float const*>(acc), n);
                             });
  return r;
}

/// The requantization of a reduced chunk j into `block` (zeroed first), with its header; returns
/// the header flags written (the received flags, plus non-finite when a sum overflowed).
template <class Reduce>
std::uint8_t requantize_chunk(chunk_plan const& plan, std::int64_t j, spec const& s,
                              std::uint64_t key, std::uint64_t position0, std::byte* block,
                              Reduce&& reduce) {
  std::memset(block, 0, static_cast<std::size_t>(plan.block_bytes()));
  std::int64_t const count = plan.count(j);
  quantized_view const out = payload_view(s, plan, block, count);
  reduced const r =
      reduce([&](host_executor one, std::int64_t b, float const* sum, std::int64_t n) {
        return quantize<payload_codes>(
            one, as_row(sum, n), sub_view(out, b, n),
            {key, position0 + static_cast<std::uint64_t>(plan.begin(j) + b)});
      });
  std::uint8_t flags = r.flags;
  if (r.emitted > 0) flags |= payload_flag_nonfinite;
  write_payload_header(block, flags, plan.group_size, count);
  return flags;
}

/// Writes gathered chunks into a float, half or bfloat16 array.
template <class Out>
struct span_sink {
  Out* data = nullptr;
  /// Dequantizes block j in ranges of whole groups on the executor's threads.
  void operator()(host_executor ex, chunk_plan const& plan, std::int64_t j, spec const& s,
                  std::byte const* block) const {
    std::int64_t const n = plan.count(j);
    const_quantized_view const in = payload_view(s, plan, block, n);
    Out* out = data + plan.begin(j);
    for_each_range(ex, n, plan.group_size, [&](host_executor one, std::int64_t c, std::int64_t e) {
      return dequantize<payload_codes>(one, sub_view(in, c, e - c), as_row(out + c, e - c));
    });
  }
};

/// Copies gathered chunks into a [1, N] quantized view (codes and scales, no requantization).
struct quantized_sink {
  quantized_view view;
  void operator()(host_executor, chunk_plan const& plan, std::int64_t j, spec const& s,
                  std::byte const* block) const {
    std::int64_t const n = plan.count(j);
    if (n == 0) return;
    const_quantized_view const src = payload_view(s, plan, block, n);
    quantized_view const dst = sub_view(view, plan.begin(j), n);
    std::memcpy(dst.codes, src.codes, static_cast<std::size_t>(n));
    std::memcpy(dst.scales, src.scales,
                static_cast<std::size_t>(4 * ((n + plan.group_size - 1) / plan.group_size)));
  }
};

inline meta_record make_meta(collective_kind kind, std::int64_t n, all_reduce_options const& opt,
                             local_error err) {
  meta_record m;
  m.kind = kind;
  m.average = opt.average ? 1 : 0;
  m.rounding = static_cast<std::uint8_t>(opt.rounding);
  m.n = n;
  m.group_size = opt.group_size;
  m.error = err;
  if (err == local_error::none &&
      (opt.group_size < min_group_size || opt.group_size > max_group_size))
    m.error = local_error::group_size;
  return m;
}

template <comm::communicator C>
void check_host(C& comm, char const* what) {
  AGOQ_EXPECTS(comm.memory() == comm::memory_space::host,
               std::string(what) +
                   ": the communicator moves device memory; use the CUDA executor "
                   "(the *_async collectives in agoq/gradient/all_reduce.cuh) with device "
                   "buffers, or a host communicator");
}

inline std::vector<std::byte> zeroed_bytes(std::int64_t n) {
  return std::vector<std::byte>(static_cast<std::size_t>(n));
}

/// The first half every 8-bit collective shares: check every rank's arguments together, quantize
/// this rank's P chunks into payload blocks and exchange them (all_to_all). Afterwards `recv`
/// holds the P blocks of this rank's chunk, and `send` is free for reuse.
struct scattered {
  int p;
  int rank;
  chunk_plan plan;
  spec s;
  std::int64_t block_bytes;
  std::vector<std::byte> send, recv;
  std::int64_t local_nonfinite;
};

template <comm::communicator C, class Source>
scattered scatter_chunks(host_executor ex, C& comm, std::int64_t n, Source const& src,
                         all_reduce_options const& opt, local_error err, collective_kind kind,
                         char const* what) {
  check_host(comm, what);
  std::string const problem = check_group(comm, make_meta(kind, n, opt, err), what);
  AGOQ_EXPECTS(problem.empty(), problem);
  int const p = static_cast<int>(comm.size());
  int const rank = static_cast<int>(comm.rank());
  chunk_plan const plan(n, opt.group_size, p);
  spec const s = payload_spec(opt.group_size, opt.rounding);
  std::int64_t const bb = plan.block_bytes();
  scattered out{p, rank, plan, s, bb, zeroed_bytes(p * bb), zeroed_bytes(p * bb), 0};
  out.local_nonfinite = pack_blocks(
      ex, plan, src, s,
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(rank)),
      out.send.data());
  comm.all_to_all(out.send.data(), out.recv.data(), static_cast<std::size_t>(bb));
  return out;
}

/// The flat 8-bit all-reduce: validate, pack, all_to_all, reduce, requantize, all_gather, sink.
template <comm::communicator C, class Source, class Sink>
all_reduce_result all_reduce(host_executor ex, C& comm, std::int64_t n, Source const& src,
                             Sink const& sink, all_reduce_options const& opt, local_error err) {
  scattered x =
      scatter_chunks(ex, comm, n, src, opt, err, collective_kind::all_reduce, "all_reduce_8bit");
  // References, not a structured binding: the lambda below uses them, and clang before 16 cannot
  // capture a structured binding.
  int const p = x.p;
  int const rank = x.rank;
  chunk_plan const& plan = x.plan;
  spec const& s = x.s;
  std::int64_t const bb = x.block_bytes;
  std::vector<std::byte>& send = x.send;
  std::vector<std::byte>& recv = x.recv;
  std::int64_t const local = x.local_nonfinite;
  std::vector<float> scratch;
  float const divisor = opt.average ? static_cast<float>(p) : 1.0f;
  requantize_chunk(plan, rank, s, stream_key(opt.seed, opt.step, stream_tag::gather, 0), 0,
                   send.data(), [&](auto&& emit) {
                     return reduce_blocks(ex, plan, rank, recv.data(), s, divisor, scratch, emit);
                   });
  comm.all_gather(send.data(), recv.data(), static_cast<std::size_t>(bb));
  bool nonfinite = false;
  for (std::int64_t j = 0; j < p; ++j) {
    std::byte const* block = recv.data() + j * bb;
    nonfinite |= (checked_header(block, plan, j).flags & payload_flag_nonfinite) != 0;
    sink(ex, plan, j, s, block);
  }
  return {nonfinite, local};
}

/// The reduce-scatter form: validate, pack, all_to_all, reduce into `shard` (fp32 sums, one
/// quantization).
template <comm::communicator C, class Source, class Out>
reduce_scatter_result reduce_scatter(host_executor ex, C& comm, std::int64_t n, Source const& src,
                                     Out* shard, all_reduce_options const& opt, local_error err) {
  scattered x = scatter_chunks(ex, comm, n, src, opt, err, collective_kind::reduce_scatter,
                               "reduce_scatter_8bit");
  auto& [p, rank, plan, s, bb, send, recv, local] = x;
  std::vector<float> scratch;
  float const divisor = opt.average ? static_cast<float>(p) : 1.0f;
  std::uint8_t const flags =
      reduce_blocks(ex, plan, rank, recv.data(), s, divisor, scratch,
                    [&](host_executor, std::int64_t b, float const* sum, std::int64_t m) {
                      for (std::int64_t i = 0; i < m; ++i)
                        shard[b + i] = numeric::from_float<Out>(sum[i]);
                      return std::int64_t{0};
                    })
          .flags;
  return {(flags & payload_flag_nonfinite) != 0, local, plan.begin(rank), plan.end(rank)};
}

/// The argument check of the hierarchical form: the records go round the node first, then among
/// the peers with the node's verdict (peer_group when a rank of the node failed), so a bad
/// argument on any rank throws on every rank of both groups. Host and device executors share it.
template <comm::communicator Intra, comm::communicator Inter>
void check_hierarchical(Intra& intra, Inter& inter, meta_record m, char const* what) {
  std::string const node_problem = check_group(intra, m, what);
  if (!node_problem.empty()) m.error = local_error::peer_group;
  std::string const peer_problem = check_group(inter, m, what);
  AGOQ_EXPECTS(node_problem.empty(), node_problem);
  AGOQ_EXPECTS(peer_problem.empty(), peer_problem);
}

/// The hierarchical form: reduce-scatter inside the node (fp32 shard), flat 8-bit all-reduce of
/// the shard among the ranks of `inter`, kept 8-bit, all_gather of the 8-bit shards inside the
/// node, sink.
template <comm::communicator Intra, comm::communicator Inter, class Source, class Sink>
all_reduce_result hierarchical(host_executor ex, Intra& intra, Inter& inter, std::int64_t n,
                               Source const& src, Sink const& sink, all_reduce_options const& opt,
                               local_error err) {
  char const* what = "all_reduce_8bit_hierarchical";
  check_host(intra, what);
  check_host(inter, what);
  check_hierarchical(intra, inter, make_meta(collective_kind::hierarchical, n, opt, err), what);

  int const l = static_cast<int>(intra.size());
  int const i = static_cast<int>(intra.rank());
  int const k = static_cast<int>(inter.size());
  int const a = static_cast<int>(inter.rank());
  spec const s = payload_spec(opt.group_size, opt.rounding);
  // Inside the node: chunk i of the bucket is this rank's shard.
  chunk_plan const node(n, opt.group_size, l);
  std::int64_t const bb = node.block_bytes();
  std::vector<std::byte> send = zeroed_bytes(l * bb), recv = zeroed_bytes(l * bb);
  std::int64_t const local = pack_blocks(
      ex, node, src, s,
      stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(a * l + i)),
      send.data());
  intra.all_to_all(send.data(), recv.data(), static_cast<std::size_t>(bb));
  std::int64_t const shard_begin = node.begin(i);
  std::int64_t const shard_n = node.count(i);
  std::vector<float> shard(static_cast<std::size_t>(shard_n));
  std::vector<float> scratch;
  std::uint8_t const node_flags =
      reduce_blocks(ex, node, i, recv.data(), s, 1.0f, scratch,
                    [&](host_executor, std::int64_t b, float const* sum, std::int64_t m2) {
                      std::memcpy(shard.data() + b, sum, static_cast<std::size_t>(m2) * 4);
                      return std::int64_t{0};
                    })
          .flags;

  // Across nodes: the flat algorithm on the shard, positions counted in the bucket.
  chunk_plan const peers(shard_n, opt.group_size, k);
  std::int64_t const pb = peers.block_bytes();
  std::vector<std::byte> psend = zeroed_bytes(k * pb), precv = zeroed_bytes(k * pb);
  span_source<float> const shard_src{
      shard.data(), static_cast<std::uint64_t>(shard_begin),
      static_cast<std::uint8_t>(node_flags & payload_flag_nonfinite)};
  pack_blocks(
      ex, peers, shard_src, s,
      stream_key(opt.seed, opt.step, stream_tag::inter_scatter, static_cast<std::uint32_t>(a)),
      psend.data());
  inter.all_to_all(psend.data(), precv.data(), static_cast<std::size_t>(pb));
  float const divisor = opt.average ? static_cast<float>(l) * static_cast<float>(k) : 1.0f;
  requantize_chunk(peers, a, s, stream_key(opt.seed, opt.step, stream_tag::inter_gather, 0),
                   static_cast<std::uint64_t>(shard_begin), psend.data(), [&](auto&& emit) {
                     return reduce_blocks(ex, peers, a, precv.data(), s, divisor, scratch, emit);
                   });
  inter.all_gather(psend.data(), precv.data(), static_cast<std::size_t>(pb));

  // The reduced shard, 8-bit, assembled from the K gathered chunks into one node block.
  std::memset(send.data(), 0, static_cast<std::size_t>(bb));
  quantized_view const mine = payload_view(s, node, send.data(), shard_n);
  std::uint8_t flags = 0;
  for (std::int64_t c = 0; c < k; ++c) {
    std::byte const* block = precv.data() + c * pb;
    flags |= checked_header(block, peers, c).flags;
    quantized_sink{sub_view(mine, 0, shard_n)}(ex, peers, c, s, block);
  }
  write_payload_header(send.data(), flags, opt.group_size, shard_n);
  intra.all_gather(send.data(), recv.data(), static_cast<std::size_t>(bb));
  bool nonfinite = false;
  for (std::int64_t j = 0; j < l; ++j) {
    std::byte const* block = recv.data() + j * bb;
    nonfinite |= (checked_header(block, node, j).flags & payload_flag_nonfinite) != 0;
    sink(ex, node, j, s, block);
  }
  return {nonfinite, local};
}

/// A reduce-scatter's verdict on its spans: a shard shorter than this rank's chunk of the bucket,
/// or a null pointer with elements. Host and device executors share it.
template <class In, class Out>
local_error shard_errors(std::span<In const> input, std::span<Out> shard, int ranks, int rank,
                         int group_size) {
  auto const n = static_cast<std::int64_t>(input.size());
  if (group_size >= min_group_size && group_size <= max_group_size &&
      static_cast<std::int64_t>(shard.size()) < chunk_plan(n, group_size, ranks).count(rank))
    return local_error::output_size;
  if ((input.data() == nullptr && n > 0) || (shard.data() == nullptr && !shard.empty()))
    return local_error::null_pointer;
  return local_error::none;
}

template <class In, class Out>
local_error span_errors(std::span<In const> in, std::span<Out> out, std::size_t out_needed) {
  if (out.size() != out_needed) return local_error::output_size;
  if ((in.data() == nullptr && !in.empty()) || (out.data() == nullptr && !out.empty()))
    return local_error::null_pointer;
  auto const* ib = reinterpret_cast<unsigned char const*>(in.data());
  auto const* ob = reinterpret_cast<unsigned char const*>(out.data());
  std::size_t const in_bytes = in.size_bytes();
  std::size_t const out_bytes = out.size_bytes();
  bool const disjoint =
      in_bytes == 0 || out_bytes == 0 || ib + in_bytes <= ob || ob + out_bytes <= ib;
  bool const same = std::is_same_v<std::remove_const_t<In>, Out> && ib == ob;
  return disjoint || same ? local_error::none : local_error::overlap;
}

inline local_error view_errors(quantized_view const& v, std::int64_t n, int group_size) {
  spec const want = payload_spec(group_size, v.spec.rounding);
  if (!(v.spec == want) || v.rows != 1 || v.cols != n) return local_error::output_view;
  if (n > 0 && (v.codes == nullptr || v.scales == nullptr)) return local_error::output_view;
  return local_error::none;
}

inline local_error first_error(local_error a, local_error b) {
  return a != local_error::none ? a : b;
}

inline quantized_source buffer_source(gradient_buffer const& g) {
  return {g.view(),
          static_cast<std::uint8_t>(g.nonfinite_count() > 0 ? payload_flag_nonfinite : 0)};
}

/// A gradient buffer operand's verdict (gradient_buffer or device_gradient_buffer).
template <class Buffer>
local_error buffer_errors(Buffer const& g, all_reduce_options const& opt) {
  return g.group_size() == opt.group_size ? local_error::none : local_error::buffer_group_size;
}

/// The verdict on a buffer input and a span output (all-reduce, hierarchical).
template <class Buffer, class Out>
local_error buffer_span_errors(Buffer const& in, std::span<Out> out,
                               all_reduce_options const& opt) {
  local_error err = buffer_errors(in, opt);
  if (err == local_error::none && static_cast<std::int64_t>(out.size()) != in.size())
    err = local_error::output_size;
  if (err == local_error::none && out.data() == nullptr && !out.empty())
    err = local_error::null_pointer;
  return err;
}

/// The verdict on a span input and a buffer output.
template <class In, class Buffer>
local_error span_buffer_errors(std::span<In const> in, Buffer const& out,
                               all_reduce_options const& opt) {
  auto const n = static_cast<std::int64_t>(in.size());
  local_error err = in.data() == nullptr && n > 0 ? local_error::null_pointer : local_error::none;
  err = first_error(err, buffer_errors(out, opt));
  if (err == local_error::none && out.size() != n) err = local_error::output_size;
  return err;
}

/// The verdict on a buffer input and a buffer output (which may be the input).
template <class Buffer>
local_error buffer_buffer_errors(Buffer const& in, Buffer const& out,
                                 all_reduce_options const& opt) {
  local_error err = first_error(buffer_errors(in, opt), buffer_errors(out, opt));
  if (err == local_error::none && out.size() != in.size()) err = local_error::output_size;
  return err;
}

/// The verdict on a buffer input and a reduce-scatter shard.
template <class Buffer, class Out>
local_error buffer_shard_errors(Buffer const& in, std::span<Out> shard, int ranks, int rank,
                                all_reduce_options const& opt) {
  local_error err = buffer_errors(in, opt);
  if (err == local_error::none && static_cast<std::int64_t>(shard.size()) <
                                      chunk_plan(in.size(), opt.group_size, ranks).count(rank))
    err = local_error::output_size;
  return err;
}

template <class T>
concept input_element = element_type<std::remove_const_t<T>>;
template <class T>
concept output_element = element_type<T> && !std::is_const_v<T>;

}  // namespace detail

/// 8-bit all-reduce of `input` (float, half or bfloat16; N elements) into `output` (N elements of
/// float, half or bfloat16) over `comm`: output = sum (or mean, opt.average) over the ranks of
/// their inputs, every element quantized twice (int8, groups of opt.group_size, fp32 scales), the
/// sum taken in fp32 in rank order. Every rank ends with identical bits. `output` may be `input`
/// itself (same element type); any other overlap is refused. Empty buckets and P = 1 work (P = 1
/// still quantizes twice, so every P gives the same kind of result).
///
/// Host memory, CPU executor; blocks until the collective completes (it calls comm's all_gather
/// twice and all_to_all once; every rank must call it with the same N and options).
/// \returns the global non-finite flag (same on every rank) and this rank's non-finite count.
/// \throws agoq::invalid_argument on every rank when any rank's arguments are invalid (lengths
/// differ between ranks, output of another length, group size outside [32, 256], null pointers,
/// overlapping buffers, different options) or the communicator is a device one;
/// agoq::comm::comm_error when the communicator fails or a payload is corrupted.
template <comm::communicator C, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out> all_reduce_result
all_reduce_8bit(host_executor ex, C& comm, std::span<In const> input, std::span<Out> output,
                all_reduce_options const& opt = {}) {
  using T = std::remove_const_t<In>;
  return detail::all_reduce(
      ex, comm, static_cast<std::int64_t>(input.size()), detail::span_source<T>{input.data(), 0, 0},
      detail::span_sink<Out>{output.data()}, opt, detail::span_errors(input, output, input.size()));
}

/// all_reduce_8bit of a non-const span.
template <comm::communicator C, class In, class Out>
requires detail::output_element<In> && detail::output_element<Out> all_reduce_result
all_reduce_8bit(host_executor ex, C& comm, std::span<In> input, std::span<Out> output,
                all_reduce_options const& opt = {}) {
  return all_reduce_8bit(ex, comm, std::span<In const>(input), output, opt);
}

/// all_reduce_8bit keeping the result 8-bit: `output` is a [1, N] view of spec
/// int8_g<opt.group_size>_sym_*_f32 (any rounding field), e.g. an optimizer's gradient input; it
/// receives the reduced codes and scales themselves (no third quantization).
/// \throws as the other overloads, and agoq::invalid_argument on every rank for another spec or
/// extents.
template <comm::communicator C, class In>
requires detail::input_element<In> all_reduce_result
all_reduce_8bit(host_executor ex, C& comm, std::span<In const> input, quantized_view output,
                all_reduce_options const& opt = {}) {
  using T = std::remove_const_t<In>;
  auto const n = static_cast<std::int64_t>(input.size());
  detail::local_error const err =
      detail::first_error(input.data() == nullptr && n > 0 ? detail::local_error::null_pointer
                                                           : detail::local_error::none,
                          detail::view_errors(output, n, opt.group_size));
  return detail::all_reduce(ex, comm, n, detail::span_source<T>{input.data(), 0, 0},
                            detail::quantized_sink{output}, opt, err);
}

/// all_reduce_8bit into a gradient_buffer of N elements (its group size must be
/// opt.group_size); the buffer then holds the reduced gradient and its nonfinite_count() is 1
/// when the global flag is set, else 0.
template <comm::communicator C, class In>
requires detail::input_element<In> all_reduce_result
all_reduce_8bit(host_executor ex, C& comm, std::span<In const> input, gradient_buffer& output,
                all_reduce_options const& opt = {}) {
  using T = std::remove_const_t<In>;
  all_reduce_result const r = detail::all_reduce(
      ex, comm, static_cast<std::int64_t>(input.size()), detail::span_source<T>{input.data(), 0, 0},
      detail::quantized_sink{output.view()}, opt, detail::span_buffer_errors(input, output, opt));
  output.mark_written(r.nonfinite ? 1 : 0);
  return r;
}

/// all_reduce_8bit of an 8-bit gradient_buffer (its group size must be opt.group_size): its codes
/// and scales travel as they are (the buffer's own quantization is the first of the two; no
/// full-precision copy is made), so the result carries the accumulation error plus one
/// requantization. The global flag also reports any buffer with nonfinite_count() > 0.
template <comm::communicator C, class Out>
requires detail::output_element<Out> all_reduce_result
all_reduce_8bit(host_executor ex, C& comm, gradient_buffer const& input, std::span<Out> output,
                all_reduce_options const& opt = {}) {
  all_reduce_result r = detail::all_reduce(ex, comm, input.size(), detail::buffer_source(input),
                                           detail::span_sink<Out>{output.data()}, opt,
                                           detail::buffer_span_errors(input, output, opt));
  r.local_nonfinite = input.nonfinite_count();
  return r;
}

/// all_reduce_8bit of a gradient_buffer into a gradient_buffer (8-bit in and out; `output` may
/// be `input`).
template <comm::communicator C>
all_reduce_result all_reduce_8bit(host_executor ex, C& comm, gradient_buffer const& input,
                                  gradient_buffer& output, all_reduce_options const& opt = {}) {
  std::int64_t const local = input.nonfinite_count();
  all_reduce_result r = detail::all_reduce(ex, comm, input.size(), detail::buffer_source(input),
                                           detail::quantized_sink{output.view()}, opt,
                                           detail::buffer_buffer_errors(input, output, opt));
  r.local_nonfinite = local;
  output.mark_written(r.nonfinite ? 1 : 0);
  return r;
}

/// The reduce-scatter form, for sharded optimizers: rank r receives the fp32 sum (or mean) of
/// chunk r of every rank's input (the range shard_range(N, P, r, G), returned too), written into
/// `shard[0, end - begin)`; each element is quantized once (the all-to-all) and never requantized,
/// so the shard is more precise than the all-reduce result. `shard` must hold at least the
/// largest chunk, ceil(ceil(N / G) / P) G elements, or exactly end - begin.
/// Host memory, CPU executor; blocks (one all_gather of records, one all_to_all).
/// \throws as all_reduce_8bit (a too-small shard throws on every rank).
template <comm::communicator C, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out> reduce_scatter_result
reduce_scatter_8bit(host_executor ex, C& comm, std::span<In const> input, std::span<Out> shard,
                    all_reduce_options const& opt = {}) {
  using T = std::remove_const_t<In>;
  auto const n = static_cast<std::int64_t>(input.size());
  detail::local_error const err = detail::shard_errors(
      input, shard, static_cast<int>(comm.size()), static_cast<int>(comm.rank()), opt.group_size);
  return detail::reduce_scatter(ex, comm, n, detail::span_source<T>{input.data(), 0, 0},
                                shard.data(), opt, err);
}

/// reduce_scatter_8bit of an 8-bit gradient_buffer (no full-precision copy).
template <comm::communicator C, class Out>
requires detail::output_element<Out> reduce_scatter_result
reduce_scatter_8bit(host_executor ex, C& comm, gradient_buffer const& input, std::span<Out> shard,
                    all_reduce_options const& opt = {}) {
  reduce_scatter_result r = detail::reduce_scatter(
      ex, comm, input.size(), detail::buffer_source(input), shard.data(), opt,
      detail::buffer_shard_errors(input, shard, static_cast<int>(comm.size()),
                                  static_cast<int>(comm.rank()), opt));
  r.local_nonfinite = input.nonfinite_count();
  return r;
}

/// The hierarchical 8-bit all-reduce across nodes: `intra` groups the L ranks of this node,
/// `inter` the K ranks of other nodes with the same intra rank (global rank = inter.rank() L +
/// intra.rank()). Steps: 8-bit reduce-scatter inside the node (rank i gets the fp32 sum of its
/// node's chunk i), the flat 8-bit all-reduce of that shard among its K peers (kept 8-bit), then
/// an all-gather of the 8-bit shards inside the node and dequantization into `output`. Each
/// element is quantized three times whatever L and K; inter-node bytes per rank are
/// 2 (K-1)/K (N / L)(1 + 4/G) plus headers, L times fewer than a flat all-reduce's. Every rank
/// ends with identical bits. opt.average divides by L K.
/// Host memory, CPU executor; blocks.
/// \throws as all_reduce_8bit, on every rank of both groups.
template <comm::communicator Intra, comm::communicator Inter, class In, class Out>
requires detail::input_element<In> && detail::output_element<Out> all_reduce_result
all_reduce_8bit_hierarchical(host_executor ex, Intra& intra, Inter& inter,
                             std::span<In const> input, std::span<Out> output,
                             all_reduce_options const& opt = {}) {
  using T = std::remove_const_t<In>;
  return detail::hierarchical(ex, intra, inter, static_cast<std::int64_t>(input.size()),
                              detail::span_source<T>{input.data(), 0, 0},
                              detail::span_sink<Out>{output.data()}, opt,
                              detail::span_errors(input, output, input.size()));
}

/// all_reduce_8bit_hierarchical of an 8-bit gradient_buffer.
template <comm::communicator Intra, comm::communicator Inter, class Out>
requires detail::output_element<Out> all_reduce_result all_reduce_8bit_hierarchical(
    host_executor ex, Intra& intra, Inter& inter, gradient_buffer const& input,
    std::span<Out> output, all_reduce_options const& opt = {}) {
  all_reduce_result r = detail::hierarchical(
      ex, intra, inter, input.size(), detail::buffer_source(input),
      detail::span_sink<Out>{output.data()}, opt, detail::buffer_span_errors(input, output, opt));
  r.local_nonfinite = input.nonfinite_count();
  return r;
}

}  // namespace agoq::gradient
