/// \file
/// Checkpoint records of quantized tensors: a quantized tensor written to a std::ostream with its
/// spec and extents and read back bit for bit (docs/formats.md §12). Host only.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <string>

#include "../error.hpp"
#include "../scheme/spec.hpp"
#include "layout.hpp"
#include "tensor.hpp"
#include "view.hpp"

namespace agoq {

namespace detail {

/// Writes the low `n` bytes of `x`, least significant first.
inline void write_le(std::ostream& out, std::uint64_t x, int n) {
  std::array<char, 8> b{};
  for (int i = 0; i < n; ++i)
    b[static_cast<std::size_t>(i)] = static_cast<char>((x >> (8 * i)) & 0xffu);
  out.write(b.data(), n);
}

/// Reads exactly `n` bytes into `dst`. \throws agoq::invalid_argument naming `what` when the
/// stream ends or fails first.
inline void read_exact(std::istream& in, void* dst, std::int64_t n, char const* what) {
  if (n > 0) in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  AGOQ_EXPECTS(n <= 0 || (in && in.gcount() == n),
               std::string("checkpoint: the stream ends inside ") + what);
}

/// Refuses a record that claims more bytes than the rest of a seekable stream holds, before
/// anything that size is allocated (a corrupted size would otherwise allocate and zero-fill it
/// first). \throws agoq::invalid_argument naming `what` when fewer than `bytes` bytes are left.
/// A stream that cannot tell its position (a pipe) is not checked: its reads fail where it ends.
inline void check_available(std::istream& in, std::int64_t bytes, char const* what) {
  std::istream::pos_type const here = in.tellg();
  if (here == std::istream::pos_type(-1)) return;
  in.seekg(0, std::ios::end);
  std::istream::pos_type const end = in.tellg();
  in.clear(in.rdstate() & ~std::ios::failbit);
  in.seekg(here);
  if (end == std::istream::pos_type(-1)) return;
  AGOQ_EXPECTS(static_cast<std::int64_t>(end - here) >= bytes,
               std::string("checkpoint: the stream ends inside ") + what + " (" +
                   std::to_string(bytes) + " bytes announced, " +
                   std::to_string(static_cast<std::int64_t>(end - here)) + " left)");
}

/// Reads an `n`-byte little-endian unsigned integer.
inline std::uint64_t read_le(std::istream& in, int n, char const* what) {
  std::array<unsigned char, 8> b{};
  read_exact(in, b.data(), n, what);
  std::uint64_t x = 0;
  for (int i = n - 1; i >= 0; --i) x = (x << 8) | b[static_cast<std::size_t>(i)];
  return x;
}

/// Writes a record's 8-byte magic and its 4-byte version.
inline void write_header(std::ostream& out, char const (&magic)[9], std::uint32_t version) {
  out.write(magic, 8);
  write_le(out, version, 4);
}

/// Reads and checks a record's magic and version. \throws agoq::invalid_argument for another
/// magic (naming `what`), a version other than `version`, or a truncated stream.
inline void read_header(std::istream& in, char const (&magic)[9], std::uint32_t version,
                        char const* what) {
  std::array<char, 8> m{};
  read_exact(in, m.data(), 8, "a record's magic");
  AGOQ_EXPECTS(std::memcmp(m.data(), magic, 8) == 0,
               std::string("checkpoint: not ") + what + " (bad magic)");
  auto const v = static_cast<std::uint32_t>(read_le(in, 4, "a record's version"));
  AGOQ_EXPECTS(v == version, std::string("checkpoint: ") + what + " of version " +
                                 std::to_string(v) + ", this agoq reads version " +
                                 std::to_string(version));
}

/// The magic of a quantized tensor record.
inline constexpr char tensor_magic[9] = "AGOQTNSR";
/// The version of the quantized tensor record this agoq writes and reads.
inline constexpr std::uint32_t tensor_version = 1;
/// The longest spec name a record may carry.
inline constexpr std::uint32_t max_spec_name = 256;

/// A quantized tensor record's header: spec and extents, its byte counts checked against the
/// layout they imply.
struct tensor_record {
  spec s;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  quantized_layout layout;
};

/// Reads and checks a tensor record's header up to its sections.
inline tensor_record read_tensor_header(std::istream& in) {
  read_header(in, tensor_magic, tensor_version, "a quantized tensor record");
  auto const name_size = static_cast<std::uint32_t>(read_le(in, 4, "a tensor record's header"));
  AGOQ_EXPECTS(name_size <= max_spec_name,
               "checkpoint: a spec name of " + std::to_string(name_size) + " bytes");
  std::string name(name_size, '\0');
  read_exact(in, name.data(), name_size, "a tensor record's spec");
  tensor_record r;
  r.s = spec::parse(name);
  r.rows = static_cast<std::int64_t>(read_le(in, 8, "a tensor record's header"));
  r.cols = static_cast<std::int64_t>(read_le(in, 8, "a tensor record's header"));
  r.layout = make_layout(r.s, r.rows, r.cols);
  std::int64_t sizes[3] = {};  // codes, scales, zero points
  for (std::int64_t& b : sizes)
    b = static_cast<std::int64_t>(read_le(in, 8, "a tensor record's header"));
  AGOQ_EXPECTS(sizes[0] == r.layout.codes_bytes && sizes[1] == r.layout.scales_bytes &&
                   sizes[2] == r.layout.zero_points_bytes,
               "checkpoint: the tensor record's byte counts do not match " + name + " [" +
                   std::to_string(r.rows) + ", " + std::to_string(r.cols) + "]");
  return r;
}

/// Reads a tensor record's sections into `v` (whose spec and extents are the record's).
inline void read_tensor_sections(std::istream& in, quantized_layout const& l,
                                 quantized_view const& v) {
  read_exact(in, v.codes, l.codes_bytes, "a tensor record's codes");
  read_exact(in, v.scales, l.scales_bytes, "a tensor record's scales");
  read_exact(in, v.zero_points, l.zero_points_bytes, "a tensor record's zero points");
}

}  // namespace detail

/// Writes the quantized tensor `v` (host memory) to `out` as a tensor record: the magic
/// "AGOQTNSR", a version, the spec's name, the extents, and the codes, scales and zero points
/// exactly as they are stored (their bytes are little-endian by the format contract; alignment
/// padding is not written). read_quantized gives the same tensor back, bit for bit.
/// \throws agoq::invalid_argument for an invalid view or when the stream fails.
inline void write_quantized(std::ostream& out, const_quantized_view const& v) {
  v.validate();
  quantized_layout const l = v.layout();
  std::string const name = v.spec.name();
  detail::write_header(out, detail::tensor_magic, detail::tensor_version);
  detail::write_le(out, name.size(), 4);
  out.write(name.data(), static_cast<std::streamsize>(name.size()));
  detail::write_le(out, static_cast<std::uint64_t>(v.rows), 8);
  detail::write_le(out, static_cast<std::uint64_t>(v.cols), 8);
  detail::write_le(out, static_cast<std::uint64_t>(l.codes_bytes), 8);
  detail::write_le(out, static_cast<std::uint64_t>(l.scales_bytes), 8);
  detail::write_le(out, static_cast<std::uint64_t>(l.zero_points_bytes), 8);
  auto section = [&](std::uint8_t const* p, std::int64_t n) {
    if (n > 0) out.write(reinterpret_cast<char const*>(p), static_cast<std::streamsize>(n));
  };
  section(v.codes, l.codes_bytes);
  section(v.scales, l.scales_bytes);
  section(v.zero_points, l.zero_points_bytes);
  AGOQ_EXPECTS(static_cast<bool>(out), "checkpoint: writing a quantized tensor record failed");
}

/// Reads a tensor record written by write_quantized into a new quantized_tensor.
/// \throws agoq::invalid_argument for a stream that is not a tensor record (another magic or
/// version, an unknown spec, byte counts that do not match the spec and extents) or ends early
/// (a seekable stream: before the tensor is allocated, detail::check_available); std::bad_alloc.
inline quantized_tensor read_quantized(std::istream& in) {
  detail::tensor_record const r = detail::read_tensor_header(in);
  detail::check_available(in,
                          r.layout.codes_bytes + r.layout.scales_bytes + r.layout.zero_points_bytes,
                          "a tensor record's sections");
  quantized_tensor t(r.s, r.rows, r.cols);
  detail::read_tensor_sections(in, r.layout, t.view());
  return t;
}

/// Reads a tensor record into the existing host tensor `v`, whose spec and extents must be the
/// record's (for restoring state in place, e.g. the moments of an optimizer).
/// \throws as read_quantized, and agoq::invalid_argument when the record holds another spec or
/// other extents (then `v` is unchanged; a stream that ends inside the sections leaves `v` partly
/// overwritten).
inline void read_quantized_into(std::istream& in, quantized_view const& v) {
  v.validate();
  detail::tensor_record const r = detail::read_tensor_header(in);
  AGOQ_EXPECTS(r.s == v.spec && r.rows == v.rows && r.cols == v.cols,
               "checkpoint: the record holds " + r.s.name() + " [" + std::to_string(r.rows) + ", " +
                   std::to_string(r.cols) + "], the destination is " + v.spec.name() + " [" +
                   std::to_string(v.rows) + ", " + std::to_string(v.cols) + "]");
  detail::read_tensor_sections(in, r.layout, v);
}

}  // namespace agoq
