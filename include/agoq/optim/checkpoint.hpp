/// \file
/// Checkpoint records of an adamw_state: its options, step count and both moments written to a
/// std::ostream, and read back into a state that continues the run bit for bit (the same
/// parameters, codes and scales at every later step as the state that was written). Host only;
/// a device state (optim/adamw.cuh) is checkpointed through a host adamw_state of the same
/// formats and seed (optim::copy_state copies the moments and step count either way).
#pragma once

#include <algorithm>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/serialize.hpp"
#include "../numeric/bits.hpp"
#include "adamw.hpp"

namespace agoq::optim {

namespace detail {

/// The magic of an AdamW state record.
inline constexpr char state_magic[9] = "AGOQADAM";
/// The version of the AdamW state record this agoq writes and reads.
inline constexpr std::uint32_t state_version = 1;
/// Elements converted to or from little-endian bytes per stream call.
inline constexpr std::size_t state_chunk = 1 << 16;

/// Writes x's elements as little-endian words of `bytes` bytes each (4 for floats' bits, 2 for
/// bfloat16 bits), a chunk at a time.
template <class T, class Bits>
void write_words(std::ostream& out, std::span<T const> x, int bytes, Bits bits) {
  std::vector<char> buf(std::min(x.size(), state_chunk) * static_cast<std::size_t>(bytes));
  for (std::size_t b = 0; b < x.size(); b += state_chunk) {
    std::size_t const n = std::min(state_chunk, x.size() - b);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t const w = bits(x[b + i]);
      for (int k = 0; k < bytes; ++k) {
        buf[i * static_cast<std::size_t>(bytes) + static_cast<std::size_t>(k)] =
            static_cast<char>((w >> (8 * k)) & 0xffu);
      }
    }
    out.write(buf.data(), static_cast<std::streamsize>(n * static_cast<std::size_t>(bytes)));
  }
}

/// Reads x's elements written by write_words.
template <class T, class Value>
void read_words(std::istream& in, std::span<T> x, int bytes, Value value) {
  std::vector<unsigned char> buf(std::min(x.size(), state_chunk) * static_cast<std::size_t>(bytes));
  for (std::size_t b = 0; b < x.size(); b += state_chunk) {
    std::size_t const n = std::min(state_chunk, x.size() - b);
    agoq::detail::read_exact(in, buf.data(), static_cast<std::int64_t>(n) * bytes,
                             "an AdamW state record's moment");
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t w = 0;
      for (int k = bytes - 1; k >= 0; --k) {
        w = (w << 8) | buf[i * static_cast<std::size_t>(bytes) + static_cast<std::size_t>(k)];
      }
      x[b + i] = value(w);
    }
  }
}

inline void write_moment(std::ostream& out, moment_storage const& m) {
  switch (m.format()) {
    case moment_format::f32:
      write_words(out, m.f32(), 4, [](float x) { return numeric::float_bits(x); });
      break;
    case moment_format::bf16:
      write_words(out, m.bf16(), 2, [](std::uint16_t x) { return std::uint32_t{x}; });
      break;
    default:
      write_quantized(out, m.quantized().view());
      break;
  }
}

inline void read_moment(std::istream& in, moment_storage& m) {
  switch (m.format()) {
    case moment_format::f32:
      read_words(in, m.f32(), 4, [](std::uint32_t w) { return numeric::bits_float(w); });
      break;
    case moment_format::bf16:
      read_words(in, m.bf16(), 2, [](std::uint32_t w) { return static_cast<std::uint16_t>(w); });
      break;
    default:
      read_quantized_into(in, m.quantized().view());
      break;
  }
}

}  // namespace detail

/// Writes `s` to `out` as an AdamW state record (docs/formats.md §12): the magic "AGOQADAM", a
/// version, the size, step count, seed and block size, the moment formats and roundings, then m
/// and v (an 8-bit moment as a tensor record of agoq/layout/serialize.hpp, an f32 or bf16 moment as
/// little-endian words). read_adamw_state gives back a state that continues the run bit for bit.
/// \throws agoq::invalid_argument when the stream fails.
inline void write_adamw_state(std::ostream& out, adamw_state const& s) {
  using agoq::detail::write_le;
  adamw_state_options const& o = s.options();
  agoq::detail::write_header(out, detail::state_magic, detail::state_version);
  write_le(out, static_cast<std::uint64_t>(s.size()), 8);
  write_le(out, static_cast<std::uint64_t>(s.step()), 8);
  write_le(out, o.seed, 8);
  write_le(out, static_cast<std::uint64_t>(o.block), 8);
  write_le(out, static_cast<std::uint64_t>(o.m), 1);
  write_le(out, static_cast<std::uint64_t>(o.v), 1);
  write_le(out, static_cast<std::uint64_t>(o.m_rounding), 1);
  write_le(out, static_cast<std::uint64_t>(o.v_rounding), 1);
  detail::write_moment(out, s.m());
  detail::write_moment(out, s.v());
  AGOQ_EXPECTS(static_cast<bool>(out), "checkpoint: writing an AdamW state record failed");
}

/// Reads an AdamW state record written by write_adamw_state into a new adamw_state.
/// \throws agoq::invalid_argument for a stream that is not an AdamW state record (another magic
/// or version, a negative size or step, an unknown format or rounding, a moment record that does
/// not match the options, a size past 2^59) or that ends early (a seekable stream: before the
/// state is allocated, when fewer bytes are left than its moments take at the least);
/// std::bad_alloc.
inline adamw_state read_adamw_state(std::istream& in) {
  using agoq::detail::read_le;
  agoq::detail::read_header(in, detail::state_magic, detail::state_version,
                            "an AdamW state record");
  char const* const header = "an AdamW state record's header";
  auto const n = static_cast<std::int64_t>(read_le(in, 8, header));
  auto const step = static_cast<std::int64_t>(read_le(in, 8, header));
  adamw_state_options o;
  o.seed = read_le(in, 8, header);
  o.block = static_cast<std::int64_t>(read_le(in, 8, header));
  auto const m = read_le(in, 1, header), v = read_le(in, 1, header);
  auto const mr = read_le(in, 1, header), vr = read_le(in, 1, header);
  AGOQ_EXPECTS(n >= 0 && step >= 0, "checkpoint: an AdamW state of size " + std::to_string(n) +
                                        " at step " + std::to_string(step));
  auto const last_format = static_cast<std::uint64_t>(moment_format::e4m3);
  AGOQ_EXPECTS(
      m <= last_format && v <= last_format,
      "checkpoint: unknown moment formats " + std::to_string(m) + ", " + std::to_string(v));
  auto const last_rounding = static_cast<std::uint64_t>(rounding_kind::stochastic);
  AGOQ_EXPECTS(mr <= last_rounding && vr <= last_rounding,
               "checkpoint: unknown roundings " + std::to_string(mr) + ", " + std::to_string(vr));
  o.m = static_cast<moment_format>(m);
  o.v = static_cast<moment_format>(v);
  o.m_rounding = static_cast<rounding_kind>(mr);
  o.v_rounding = static_cast<rounding_kind>(vr);
  // At least 4 (f32), 2 (bf16) or 1 (8-bit codes) bytes an element of each moment follow.
  auto const bytes_of = [](moment_format f) {
    return f == moment_format::f32 ? 4 : f == moment_format::bf16 ? 2 : 1;
  };
  AGOQ_EXPECTS(n <= max_size_count / 8,
               "checkpoint: an AdamW state of size " + std::to_string(n) + ", more than 2^59");
  agoq::detail::check_available(in, n * (bytes_of(o.m) + bytes_of(o.v)),
                                "an AdamW state record's moments");
  adamw_state s(n, o);
  s.set_step(step);
  detail::read_moment(in, s.m());
  detail::read_moment(in, s.v());
  return s;
}

}  // namespace agoq::optim
