/// \file
/// The 8-bit gradient accumulation buffer (DESIGN §5, "Gradients"): a flat bucket kept as int8
/// codes with fp32 group scales, to which each micro-batch's gradient is added.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/host/parallel.hpp"
#include "../error.hpp"
#include "../layout/matrix.hpp"
#include "../layout/tensor.hpp"
#include "../numeric/element.hpp"
#include "../quantize.hpp"
#include "payload.hpp"

namespace agoq::gradient {

/// Options of a gradient_buffer.
struct buffer_options {
  int group_size = 128;                                ///< elements per scale, 32..256
  rounding_kind rounding = rounding_kind::stochastic;  ///< rounding of each requantization
  /// Stochastic rounding seed. Give every rank (and every bucket) its own seed, e.g. a hash of
  /// (run seed, rank, bucket), so their rounding noise is independent.
  std::uint64_t seed = 0;
};

namespace detail {

/// Elements per piece of the piece-wise loops: whole groups, about 4096 elements (16 KiB of fp32
/// scratch, which stays in the L1/L2 cache). Host and device.
AGOQ_HOST_DEVICE constexpr std::int64_t piece_elements(std::int64_t group_size) noexcept {
  std::int64_t const k = 4096 / group_size;
  return (k > 0 ? k : 1) * group_size;
}

/// Calls f(one, b, e) for contiguous ranges [b, e) that cover [0, count) once, one per thread of
/// the executor, each of whole pieces (piece_elements: whole groups of `group_size`) but the last,
/// and returns the sum of what f returns. `one` is the executor on one thread (each range is one
/// thread's work). The ranges must be independent of one another; on one thread f gets the whole
/// of [0, count) in one call.
template <class F>
std::int64_t for_each_range(host_executor ex, std::int64_t count, std::int64_t group_size, F&& f) {
  if (count <= 0) return 0;
  std::int64_t const piece = std::min(count, piece_elements(group_size));
  std::int64_t const pieces = (count + piece - 1) / piece;
  host_executor const one{.simd = ex.simd};
  return agoq::detail::host::parallel_sum(ex.pool,
                                          agoq::detail::host::call_threads(ex, pieces, piece),
                                          pieces, [&](std::int64_t p0, std::int64_t p1) {
                                            return f(one, p0 * piece, std::min(count, p1 * piece));
                                          });
}

/// Calls f(one, b, n, acc) for every piece [b, b + n) of [0, count) (piece_elements: whole groups
/// of `group_size`, the last shorter), the pieces split among the executor's threads by
/// for_each_range, and returns the sum of what f returns. `acc` is a buffer of a piece's floats:
/// `scratch` (resized to at most a piece) where one range covers everything, else a buffer of
/// each range's own.
template <class F>
std::int64_t for_each_piece(host_executor ex, std::int64_t count, std::int64_t group_size,
                            std::vector<float>& scratch, F&& f) {
  std::int64_t const piece = std::min(count, piece_elements(group_size));
  return for_each_range(ex, count, group_size,
                        [&](host_executor one, std::int64_t b0, std::int64_t e) {
                          bool const whole = b0 == 0 && e == count;
                          if (whole) scratch.resize(static_cast<std::size_t>(piece));
                          std::vector<float> own(whole ? 0 : static_cast<std::size_t>(piece));
                          float* acc = whole ? scratch.data() : own.data();
                          std::int64_t sum = 0;
                          for (std::int64_t b = b0; b < e; b += piece)
                            sum += f(one, b, std::min(piece, e - b), acc);
                          return sum;
                        });
}

/// Throws agoq::invalid_argument unless 32 <= group_size <= 256.
inline void check_group_size(std::int64_t g, char const* what) {
  AGOQ_EXPECTS(
      g >= min_group_size && g <= max_group_size,
      std::string(what) + ": the group size must be in [32, 256], got " + std::to_string(g));
}

/// `opt`, after checking its group size. \throws agoq::invalid_argument outside [32, 256].
inline buffer_options const& checked_options(buffer_options const& opt, char const* what) {
  check_group_size(opt.group_size, what);
  return opt;
}

/// Throws agoq::invalid_argument unless a gradient of `n` elements at `data` can be added into a
/// buffer of `size` elements (same length, no null pointer with elements). Host only.
inline void check_accumulate(void const* data, std::int64_t n, std::int64_t size,
                             char const* what) {
  AGOQ_EXPECTS(n == size, std::string(what) + ": the gradient has " + std::to_string(n) +
                              " elements, the buffer " + std::to_string(size));
  AGOQ_EXPECTS(data != nullptr || n == 0, std::string(what) + ": null gradient pointer");
}

}  // namespace detail

/// An 8-bit gradient accumulation buffer of `size()` elements: int8 codes and fp32 scales of a
/// [1, size()] tensor in agoq's standard quantized layout (spec int8_g<G>_sym_<rounding>_f32,
/// docs/formats.md), the alignment padding internal. Each `accumulate(g)` dequantizes the buffer,
/// adds g in fp32 and requantizes with fresh group scales, piece by piece (about 4096 elements of
/// fp32 scratch; no full-size fp32 temporary). With stochastic rounding (the default) the
/// requantization is unbiased, so the expected buffer is the exact sum of the gradients; its RMS
/// error after K additions is at most sqrt(sum_k Delta_k^2) / 2 <= sqrt(K) Delta_max / 2, Delta_k
/// being the element's group scale after addition k (docs/gradients.md).
///
/// The k-th accumulate (k = counter(), starting at 0 and never reset by zero()) rounds element i
/// with Philox stream position i under stream_key(seed, k, stream_tag::buffer, 0).
///
/// Host memory, CPU executor; every member is synchronous. Not thread-safe: one thread at a time.
/// Movable, not copyable. Its device twin is device_gradient_buffer (buffer.cuh), which writes
/// the same codes and scales from the same gradients.
class gradient_buffer {
 public:
  /// A zeroed buffer of `n` elements.
  /// \throws agoq::invalid_argument for n < 0 or a group size outside [32, 256];
  /// std::bad_alloc when memory runs out.
  explicit gradient_buffer(std::int64_t n, buffer_options const& opt = {})
      : opt_(detail::checked_options(opt, "gradient_buffer")),
        tensor_(payload_spec(opt.group_size, opt.rounding), 1, n) {}

  /// Number of elements.
  std::int64_t size() const noexcept { return tensor_.cols(); }
  /// Elements per scale.
  int group_size() const noexcept { return opt_.group_size; }
  /// The options given at construction.
  buffer_options const& options() const noexcept { return opt_; }
  /// The spec of the stored codes: int8_g<G>_sym_<rounding>_f32.
  agoq::spec const& spec() const noexcept { return tensor_.spec(); }
  /// Bytes held: N codes, padding to a multiple of 128 bytes, then 4 ceil(N / G) bytes of scales.
  /// Per element 1 + 4 / G (1.03125 at G = 128) plus at most 127 bytes of padding in all.
  std::int64_t bytes() const noexcept { return tensor_.bytes(); }

  /// Read-only view of the codes and scales, for an optimizer or the 8-bit all-reduce.
  const_quantized_view view() const { return tensor_.view(); }
  /// Writable view (used by the 8-bit all-reduce to store a reduced result); writing codes and
  /// scales by hand leaves the buffer valid as long as they follow the spec.
  quantized_view view() { return tensor_.view(); }

  /// Sets every element to zero (codes and scales) and the non-finite count to 0. The rounding
  /// counter is kept, so later steps draw fresh streams.
  void zero() {
    if (tensor_.bytes() > 0) std::memset(tensor_.data(), 0, static_cast<std::size_t>(bytes()));
    nonfinite_ = 0;
    empty_ = true;
  }

  /// Adds `g` (size() elements of float, half or bfloat16) into the buffer and returns how many
  /// sums were not finite (a NaN or ±Inf input, or an fp32 overflow); those are encoded as
  /// documented for quantize (NaN -> 0, ±Inf -> ±127) and counted in nonfinite_count().
  /// Advances counter(). Synchronous.
  /// \throws agoq::invalid_argument when g.size() != size() or g is null with a non-zero size.
  template <class In>
  requires element_type<std::remove_const_t<In>> std::int64_t accumulate(host_executor ex,
                                                                         std::span<In> g) {
    using T = std::remove_const_t<In>;
    detail::check_accumulate(g.data(), static_cast<std::int64_t>(g.size()), size(),
                             "gradient_buffer::accumulate");
    std::uint64_t const key = stream_key(opt_.seed, counter_, stream_tag::buffer, 0);
    ++counter_;
    if (size() == 0) return 0;
    quantized_view const v = tensor_.view();
    std::int64_t nonfinite = 0;
    if (empty_) {
      // 0 + x == x for every x (and -0 encodes like +0), so the first addition quantizes g
      // directly: the same bits, one pass, in ranges of whole groups among the threads.
      nonfinite = detail::for_each_range(
          ex, size(), opt_.group_size, [&](host_executor one, std::int64_t b, std::int64_t e) {
            return quantize<detail::payload_codes>(
                one, as_row(static_cast<T const*>(g.data()) + b, e - b), sub_view(v, b, e - b),
                {key, static_cast<std::uint64_t>(b)});
          });
    } else {
      // Pieces of whole groups, each decoded, added to and requantized on its own, split among
      // the executor's threads.
      nonfinite = detail::for_each_piece(
          ex, size(), opt_.group_size, scratch_,
          [&](host_executor one, std::int64_t b, std::int64_t n, float* acc) {
            quantized_view const part = sub_view(v, b, n);
            dequantize<detail::payload_codes>(one, const_quantized_view(part), as_row(acc, n));
            T const* x = g.data() + b;
            for (std::int64_t i = 0; i < n; ++i) acc[i] = acc[i] + numeric::to_float(x[i]);
            return quantize<detail::payload_codes>(one, as_row(static_cast<float const*>(acc), n),
                                                   part, {key, static_cast<std::uint64_t>(b)});
          });
    }
    empty_ = false;
    nonfinite_ += nonfinite;
    return nonfinite;
  }

  /// accumulate(host, g).
  template <class In>
  requires element_type<std::remove_const_t<In>> std::int64_t accumulate(std::span<In> g) {
    return accumulate(host, g);
  }

  /// accumulate of a row-major matrix of size() elements (any shape; read as one flat run).
  /// \throws agoq::invalid_argument when g.size() != size().
  template <class In>
  requires element_type<std::remove_const_t<In>> std::int64_t accumulate(host_executor ex,
                                                                         matrix_view<In> g) {
    return accumulate(ex, std::span<In>(g.data_handle(), static_cast<std::size_t>(g.size())));
  }

  /// accumulate(host, g).
  template <class In>
  requires element_type<std::remove_const_t<In>> std::int64_t accumulate(matrix_view<In> g) {
    return accumulate(host, g);
  }

  /// Non-finite sums met since construction or the last zero().
  std::int64_t nonfinite_count() const noexcept { return nonfinite_; }
  /// The number of accumulate calls so far (the stochastic rounding step counter).
  std::uint64_t counter() const noexcept { return counter_; }
  /// Sets the step counter (e.g. when resuming from a checkpoint).
  void set_counter(std::uint64_t c) noexcept { counter_ = c; }

  /// Marks the buffer as written by someone else through view() (the 8-bit all-reduce does):
  /// the next accumulate then adds to its contents. `nonfinite` becomes nonfinite_count().
  void mark_written(std::int64_t nonfinite) noexcept {
    empty_ = false;
    nonfinite_ = nonfinite;
  }

 private:
  // Elements [b, b + n) of a [1, N] view whose b is a multiple of the group size.
  quantized_view sub_view(quantized_view const& v, std::int64_t b, std::int64_t n) const {
    return {v.spec, 1, n, v.codes + b, v.scales + 4 * (b / opt_.group_size), nullptr};
  }

  buffer_options opt_;
  quantized_tensor tensor_;
  std::vector<float> scratch_;
  std::int64_t nonfinite_ = 0;
  std::uint64_t counter_ = 0;
  bool empty_ = true;
};

}  // namespace agoq::gradient
