/// \file
/// Measured statistics for the error model: the tensor_stats of a tensor for the group grid of a
/// scheme (sum of squares, each group's absmax and widened range, finite elements, and every
/// group's dead zones under symmetric 2-, 4- and 8-bit codes with the 2-bit live gaps), gathered on
/// the host here and on a device by statistics.cuh. Both executors run the same per-lane arithmetic
/// (`stats_detail::lane_stats`, `lane_dead_zone`, `lane_live_gap`: 16 lanes per slice, added
/// pairwise) over the same slices and fold the slices in the same order on the host
/// (`stats_detail::slice_folder`), so they return the same bits.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda/std/cmath>

#include "../config.hpp"
#include "../detail/host/parallel.hpp"
#include "../error.hpp"
#include "../layout/matrix.hpp"
#include "../numeric/bits.hpp"
#include "../numeric/element.hpp"
#include "../quantize.hpp"
#include "error_model.hpp"

namespace agoq::activation {

namespace stats_detail {

/// At most this many consecutive elements of one row of one group form a slice, the unit one
/// thread (device) or one loop (host) sums.
inline constexpr std::int64_t slice_cols = 256;

/// Slices the host measures before folding them, per thread (72 bytes each).
inline constexpr std::int64_t host_piece_slots = 4096;

/// Elements a thread measures per start of the threads where the dead zones take a second pass
/// over bands of at most this many elements (and host_piece_slots slices): each thread measures
/// whole bands twice in a row (the second time from its caches), and the threads start once per
/// this many elements (or host_piece_slots slices) each.
inline constexpr std::int64_t host_band_elements = std::int64_t{1} << 20;

/// Slices quantize_measured quantizes and then measures at a time along a row (rounded up to whole
/// groups): 8192 elements at G = 128, 16 KiB of bf16 (32 KiB of float), so the second read hits
/// the L1 cache.
inline constexpr std::int64_t fused_slots = 64;

/// The symmetric bit widths whose dead zones are measured (tensor_stats::dead_energy).
inline constexpr int dead_zone_widths = tensor_stats::dead_zone_widths;

/// The statistics of a set of elements: its finite elements' sum of squares in fp64, absolute
/// maximum, the minimum and maximum widened to include 0, and their count; and their dead zones
/// under their group's absmax (tensor_stats::dead_energy, live_absmax_sq, live_error_2bit): per
/// symmetric bit width tensor_stats::dead_zone_bits(w), the sum of squares of the finite elements
/// under half a step (|x| < absmax / (2 qmax), those nearest rounding sends to 0) and the count of
/// the others; at 2 bits the others' sum of (absmax - |x|)^2 (tensor_stats::add_live_gap).
template <class Count>
struct partial_stats {
  double sum_squares = 0;
  double dead_energy[dead_zone_widths] = {};
  double live_gap_sq = 0;
  float absmax = 0;
  float lo = 0;
  float hi = 0;
  Count finite = 0;
  Count live[dead_zone_widths] = {};
};

/// The statistics of one slice (72 bytes, copied back from the device).
using slice_partial = partial_stats<std::int32_t>;
static_assert(sizeof(slice_partial) == 72);

/// Half a step of symmetric b-bit codes (b = tensor_stats::dead_zone_bits(w)) in a group of
/// absolute maximum `absmax`: absmax / (2 qmax), rounded once. Host and device.
AGOQ_HOST_DEVICE inline float half_step(float absmax, int w) noexcept {
  int const qmax = (1 << (tensor_stats::dead_zone_bits(w) - 1)) - 1;
  return absmax / static_cast<float>(2 * qmax);
}

/// The slices of a [rows, cols] tensor under groups of `tile`: each row holds `group_cols` group
/// runs of `tile.cols` columns (the last may be shorter), each cut into `per_group` slots of
/// `slice_cols` columns from the run's start (slots past a short run's end are empty). Slot
/// `i` of the tensor is slot `i % per_row()` of row `i / per_row()`. Host and device.
struct slice_grid {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  tile_shape tile;
  std::int64_t group_cols = 0;
  std::int64_t per_group = 0;

  /// Slots of one row.
  AGOQ_HOST_DEVICE constexpr std::int64_t per_row() const noexcept {
    return group_cols * per_group;
  }
  /// Slots of the tensor.
  AGOQ_HOST_DEVICE constexpr std::int64_t slots() const noexcept { return rows * per_row(); }
  /// True when every group is one slice (one row, at most slice_cols columns): then a slice's
  /// absmax is its group's and one pass measures the dead zones with the other statistics.
  /// Otherwise a second pass over each band of tile.rows rows measures them, once the first has
  /// given each group's absmax (slice_folder::add_dead_zones).
  AGOQ_HOST_DEVICE constexpr bool one_pass() const noexcept {
    return tile.rows == 1 && per_group <= 1;
  }
  /// Index of the group of slot `s` of row `r` among all groups, band by band, in column order
  /// (the order slice_folder records their absmax). Host and device.
  AGOQ_HOST_DEVICE constexpr std::int64_t group_of(std::int64_t r, std::int64_t s) const noexcept {
    return r / tile.rows * group_cols + s / per_group;
  }
  /// First column and length (0 for an empty slot) of slot `s` of a row.
  AGOQ_HOST_DEVICE constexpr void columns(std::int64_t s, std::int64_t& first,
                                          std::int64_t& count) const noexcept {
    std::int64_t const run = s / per_group;
    std::int64_t const run_end = (run + 1) * tile.cols < cols ? (run + 1) * tile.cols : cols;
    first = run * tile.cols + (s % per_group) * slice_cols;
    std::int64_t const left = run_end - first;
    count = left <= 0 ? 0 : (left < slice_cols ? left : slice_cols);
  }
};

/// The slice grid of a [rows, cols] tensor under `tile`. Throws agoq::invalid_argument for
/// negative extents or a tile with an extent below 1.
inline slice_grid make_slice_grid(std::int64_t rows, std::int64_t cols, tile_shape tile) {
  AGOQ_EXPECTS(rows >= 0 && cols >= 0,
               "measure: negative extents " + std::to_string(rows) + "x" + std::to_string(cols));
  AGOQ_EXPECTS(tile.rows >= 1 && tile.cols >= 1,
               "measure: a group tile needs positive extents, got " + std::to_string(tile.rows) +
                   "x" + std::to_string(tile.cols));
  slice_grid g{rows, cols, tile, 0, 0};
  if (cols == 0) return g;
  std::int64_t const run = tile.cols < cols ? tile.cols : cols;
  g.group_cols = (cols - 1) / tile.cols + 1;  // no overflow for any tile.cols
  g.per_group = (run + slice_cols - 1) / slice_cols;
  return g;
}

/// Lanes of a slice's sums: element i of a slice goes to lane i % slice_lanes.
inline constexpr int slice_lanes = 16;

/// The 16 lanes' sums added pairwise (0+1, 2+3, ...; then those pairs, and so on); overwrites
/// `sum`. Host only (the device adds its lanes by shuffles in this order,
/// half_warp_pairwise_sum; the AVX-512 loops by permutes, pairwise_sum_simd).
inline double pairwise_sum(double (&sum)[slice_lanes]) noexcept {
  for (int w = 1; w < slice_lanes; w *= 2)
    for (int j = 0; j < slice_lanes; j += 2 * w) sum[j] += sum[j + w];
  return sum[0];
}

/// One lane of a slice's statistics: the elements i = lane, lane + 16, ... of the slice, in order.
/// The portable host loop keeps 16 of them; on the device each is a thread of the slice.
struct lane_stats {
  double sum = 0;
  float absmax = 0;
  float lo = 0;
  float hi = 0;
  std::int32_t finite = 0;

  /// Adds element value `raw`: a non-finite value counts as 0 (it adds nothing and leaves the
  /// extrema, which include 0, alone) and is not counted; sum = fma(v, v, sum) in fp64.
  AGOQ_HOST_DEVICE void add(float raw) noexcept {
    bool const ok = numeric::is_finite(raw);
    float const v = ok ? raw : 0.0f;
    double const d = v;
    sum = cuda::std::fma(d, d, sum);
    float const a = v < 0 ? -v : v;
    absmax = a > absmax ? a : absmax;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    finite += ok ? 1 : 0;
  }
  /// Merges another lane's extrema and count (order-independent; the sums are added pairwise).
  AGOQ_HOST_DEVICE void merge_extrema(lane_stats const& o) noexcept {
    absmax = o.absmax > absmax ? o.absmax : absmax;
    lo = o.lo < lo ? o.lo : lo;
    hi = o.hi > hi ? o.hi : hi;
    finite += o.finite;
  }
};

/// One lane of a slice's dead zone of one width: with half a step `t`, a finite element under it
/// adds fma(v, v, sum) in fp64, any other finite element counts as live. Host and device.
struct lane_dead_zone {
  double sum = 0;
  std::int32_t live = 0;

  /// Adds element value `raw`; returns whether it is live.
  AGOQ_HOST_DEVICE bool add(float raw, float t) noexcept {
    bool const ok = numeric::is_finite(raw);
    float const a = raw < 0 ? -raw : raw;
    bool const dead = ok && a < t;
    double const d = dead ? static_cast<double>(raw) : 0.0;
    sum = cuda::std::fma(d, d, sum);
    live += ok && !dead ? 1 : 0;
    return ok && !dead;
  }
};

/// One lane of a slice's 2-bit live gaps (partial_stats::live_gap_sq): an element that
/// lane_dead_zone found live under half a 2-bit step (absmax / 2 <= |x| <= absmax) adds
/// fma(d, d, sum) in fp64 with d = absmax - |x|, exact in fp32 (Sterbenz), so its square is exact
/// in fp64. Host and device.
struct lane_live_gap {
  double sum = 0;

  AGOQ_HOST_DEVICE void add(float raw, bool live, float absmax) noexcept {
    float const a = raw < 0 ? -raw : raw;
    double const d = live ? static_cast<double>(absmax - a) : 0.0;
    sum = cuda::std::fma(d, d, sum);
  }
};

/// Adds elements [i0, n) of `x` to the lanes of one dead-zone width (half a step `t`; element i
/// to lane i % 16) and, where `gaps` is not null (2 bits), to the live-gap lanes under `absmax`.
template <class T>
inline void add_dead_zone_lanes(T const* x, std::int64_t i0, std::int64_t n, float t, float absmax,
                                lane_dead_zone (&lanes)[slice_lanes],
                                lane_live_gap* gaps) noexcept {
  for (std::int64_t i = i0; i < n; ++i) {
    float const v = numeric::to_float(x[i]);
    bool const live = lanes[i % slice_lanes].add(v, t);
    if (gaps != nullptr) gaps[i % slice_lanes].add(v, live, absmax);
  }
}

/// Folds the lanes of dead-zone width w into p: their sums added pairwise into p.dead_energy[w],
/// their live counts into p.live[w].
inline void fold_dead_zone_lanes(lane_dead_zone const (&lanes)[slice_lanes], int w,
                                 slice_partial& p) noexcept {
  double sum[slice_lanes];
  p.live[w] = 0;
  for (int j = 0; j < slice_lanes; ++j) {
    sum[j] = lanes[j].sum;
    p.live[w] += lanes[j].live;
  }
  p.dead_energy[w] = pairwise_sum(sum);
}

/// The live-gap lanes' sums added pairwise into p.live_gap_sq.
inline void fold_gap_lanes(lane_live_gap const (&gaps)[slice_lanes], slice_partial& p) noexcept {
  double sum[slice_lanes];
  for (int j = 0; j < slice_lanes; ++j) sum[j] = gaps[j].sum;
  p.live_gap_sq = pairwise_sum(sum);
}

/// Adds the dead zones of the `n` elements at `x` to `p`, whose absmax is their group's: for each
/// width, element i goes to lane i % 16 (lane_dead_zone; at 2 bits lane_live_gap too), the lanes'
/// sums added pairwise into p.dead_energy and p.live_gap_sq, their live counts into p.live. Host
/// only (the device runs the lanes as threads).
template <class T>
inline void measure_dead_zones(T const* x, std::int64_t n, slice_partial& p) noexcept {
  lane_live_gap gaps[slice_lanes];
  for (int w = 0; w < dead_zone_widths; ++w) {
    lane_dead_zone lanes[slice_lanes];
    add_dead_zone_lanes(x, 0, n, half_step(p.absmax, w), p.absmax, lanes,
                        w == 0 ? gaps : nullptr);  // the live gaps at 2 bits
    fold_dead_zone_lanes(lanes, w, p);
  }
  fold_gap_lanes(gaps, p);
}

/// Adds elements [i0, n) of `x` to their lanes (element i to lane i % 16), in order.
template <class T>
inline void add_lanes(T const* x, std::int64_t i0, std::int64_t n,
                      lane_stats (&lanes)[slice_lanes]) noexcept {
  for (std::int64_t i = i0; i < n; ++i) lanes[i % slice_lanes].add(numeric::to_float(x[i]));
}

/// The statistics of 16 lanes: their sums added pairwise, their extrema and counts merged.
inline slice_partial fold_lanes(lane_stats const (&lanes)[slice_lanes]) noexcept {
  double sum[slice_lanes];
  lane_stats total;
  for (int j = 0; j < slice_lanes; ++j) {
    sum[j] = lanes[j].sum;
    total.merge_extrema(lanes[j]);
  }
  slice_partial p;
  p.sum_squares = pairwise_sum(sum);
  p.absmax = total.absmax;
  p.lo = total.lo;
  p.hi = total.hi;
  p.finite = total.finite;
  return p;
}

/// Statistics of the `n` elements at `x`: element i goes to lane i % 16 (lane_stats), the lanes'
/// sums added pairwise, their extrema and counts merged; with `dead_zones` (the slice is a whole
/// group), their dead zones too. The portable host loop (the device runs the same lanes as
/// threads, statistics.cuh; the host's vector loops are measure_slice_simd with AVX-512 and
/// measure_slice_avx2 with AVX2). Host only.
template <class T>
inline slice_partial measure_slice(T const* x, std::int64_t n, bool dead_zones) noexcept {
  lane_stats lanes[slice_lanes];
  add_lanes(x, 0, n, lanes);
  slice_partial p = fold_lanes(lanes);
  if (dead_zones) measure_dead_zones(x, n, p);
  return p;
}

#if defined(AGOQ_HOST_AVX512)
/// pairwise_sum of the 16 lanes lo (0-7) and hi (8-15) in registers: each level adds the
/// neighbouring partial sums within a vector (both lanes of a pair hold the same sum, addition
/// being commutative), then lane 0 of lo and of hi. Host only.
inline double pairwise_sum_simd(__m512d lo, __m512d hi) noexcept {
  auto const level = [](__m512d v) {
    v = _mm512_add_pd(v, _mm512_permute_pd(v, 0x55));                      // (0+1), (2+3), ...
    v = _mm512_add_pd(v, _mm512_permutex_pd(v, _MM_SHUFFLE(1, 0, 3, 2)));  // pairs of pairs
    return _mm512_add_pd(v, _mm512_shuffle_f64x2(v, v, _MM_SHUFFLE(1, 0, 3, 2)));  // halves
  };
  return _mm512_cvtsd_f64(level(lo)) + _mm512_cvtsd_f64(level(hi));
}

/// The 16 floats of `v` in fp64 (exact): lanes 0-7 in `lo`, 8-15 in `hi`. Host only.
inline void widen_pd(__m512 v, __m512d& lo, __m512d& hi) noexcept {
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/// measure_dead_zones with AVX-512: lane j of a vector is lane j of the sums (two vectors of 8
/// fp64 per width, and for the 2-bit live gaps), so the same bits. Host only.
template <class T>
inline void measure_dead_zones_simd(T const* x, std::int64_t n, slice_partial& p) noexcept {
  namespace h = agoq::detail::host;
  // One accumulator set per width, as separate variables (arrays of vectors are kept in memory).
  struct width {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    std::int32_t live = 0;
    __m512 t;
  };
  width w2{.t = _mm512_set1_ps(half_step(p.absmax, 0))};
  width w4{.t = _mm512_set1_ps(half_step(p.absmax, 1))};
  width w8{.t = _mm512_set1_ps(half_step(p.absmax, 2))};
  __m512d gap0 = _mm512_setzero_pd(), gap1 = _mm512_setzero_pd();
  __m512d const absmax = _mm512_set1_pd(p.absmax);
  __m512i const magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i const inf = _mm512_set1_epi32(0x7f800000);
  for (std::int64_t i = 0; i < n; i += slice_lanes) {
    __mmask16 const present = h::tail_mask16(n - i);
    __m512 const raw = h::load16(x + i, present);
    __m512i const mag = _mm512_and_si512(_mm512_castps_si512(raw), magnitude);
    __mmask16 const ok = _mm512_cmplt_epu32_mask(mag, inf) & present;
    __m512 const a = _mm512_castsi512_ps(mag);
    __m512d d0, d1;
    widen_pd(raw, d0, d1);
    // The square of a float is exact in fp64, so sum + v * v rounds as fma(v, v, sum) does.
    __m512d const q0 = _mm512_mul_pd(d0, d0);
    __m512d const q1 = _mm512_mul_pd(d1, d1);
    // Adds the dead elements' squares to w, counts the live ones and returns them.
    auto const add = [&](width& w) {
      __mmask16 const dead = _mm512_mask_cmp_ps_mask(ok, a, w.t, _CMP_LT_OQ);
      // Other lanes keep their sum, as the portable loop's fma(0, 0, sum) does.
      w.s0 = _mm512_mask_add_pd(w.s0, static_cast<__mmask8>(dead), w.s0, q0);
      w.s1 = _mm512_mask_add_pd(w.s1, static_cast<__mmask8>(dead >> 8), w.s1, q1);
      __mmask16 const live = ok & static_cast<__mmask16>(~dead);
      w.live += std::popcount(static_cast<unsigned>(live));
      return live;
    };
    __mmask16 const live2 = add(w2);
    add(w4);
    add(w8);
    // absmax - |x| is exact where live at 2 bits (lane_live_gap: in fp32, so in fp64 too); other
    // lanes keep their sum.
    __m512d const e0 = _mm512_sub_pd(absmax, _mm512_abs_pd(d0));
    __m512d const e1 = _mm512_sub_pd(absmax, _mm512_abs_pd(d1));
    gap0 = _mm512_mask3_fmadd_pd(e0, e0, gap0, static_cast<__mmask8>(live2));
    gap1 = _mm512_mask3_fmadd_pd(e1, e1, gap1, static_cast<__mmask8>(live2 >> 8));
  }
  auto const put = [&](int k, width const& w) {
    p.dead_energy[k] = pairwise_sum_simd(w.s0, w.s1);
    p.live[k] = w.live;
  };
  put(0, w2);
  put(1, w4);
  put(2, w8);
  p.live_gap_sq = pairwise_sum_simd(gap0, gap1);
}

/// measure_slice with AVX-512: the 16 lanes are a vector's (the sums in two vectors of 8 fp64),
/// the same operations lane by lane (vminps / vmaxps pick as the comparisons do), so the same
/// bits. Host only.
template <class T>
inline slice_partial measure_slice_simd(T const* x, std::int64_t n, bool dead_zones) noexcept {
  namespace h = agoq::detail::host;
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  __m512 absmax = _mm512_setzero_ps(), lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
  __m512i finite = _mm512_setzero_si512();
  __m512i const magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i const inf = _mm512_set1_epi32(0x7f800000);
  for (std::int64_t i = 0; i < n; i += slice_lanes) {
    __mmask16 const present = h::tail_mask16(n - i);
    __m512 const raw = h::load16(x + i, present);  // absent lanes read +0
    __m512i const mag = _mm512_and_si512(_mm512_castps_si512(raw), magnitude);
    __mmask16 const ok = _mm512_cmplt_epu32_mask(mag, inf);
    __m512 const v = _mm512_maskz_mov_ps(ok, raw);
    __m512d d0, d1;
    widen_pd(v, d0, d1);
    s0 = _mm512_fmadd_pd(d0, d0, s0);
    s1 = _mm512_fmadd_pd(d1, d1, s1);
    absmax = _mm512_max_ps(_mm512_castsi512_ps(_mm512_maskz_mov_epi32(ok, mag)), absmax);
    lo = _mm512_min_ps(v, lo);
    hi = _mm512_max_ps(v, hi);
    finite = _mm512_mask_add_epi32(finite, ok & present, finite, _mm512_set1_epi32(1));
  }
  // The extrema lanes hold no -0 (a -0 never replaces the +0 they start from), so the
  // reductions' order cannot show.
  slice_partial p;
  p.sum_squares = pairwise_sum_simd(s0, s1);
  p.absmax = _mm512_reduce_max_ps(absmax);
  p.lo = _mm512_reduce_min_ps(lo);
  p.hi = _mm512_reduce_max_ps(hi);
  p.finite = _mm512_reduce_add_epi32(finite);
  if (dead_zones) measure_dead_zones_simd(x, n, p);
  return p;
}
#endif

#if defined(AGOQ_HOST_AVX2) && !defined(AGOQ_HOST_AVX512)
/// The lane of the element in position `pos` of a step's two vectors (the first's 8, then the
/// second's) as avx2::load_step arranges the 16 elements of a step of T.
template <class T>
constexpr int avx2_lane(int pos) noexcept {
  if constexpr (agoq::detail::host::avx2::interleaved<T>) {
    return pos < 8 ? 2 * pos : 2 * (pos - 8) + 1;  // even elements, then odd
  } else {
    return pos;
  }
}

/// The 16 lanes' fp64 accumulators of an AVX2 loop: lane avx2_lane(4 k + j) in element j of
/// vector k (the low and high halves of the step's first vector, then of its second).
struct avx2_sums {
  __m256d v[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                  _mm256_setzero_pd()};

  /// Adds fma(d, d, sum) for the 8 values of `f` (the step's vector `k`, widened exactly).
  [[gnu::always_inline]] void add_squares(int k, __m256 f) noexcept {
    __m256d const lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
    __m256d const hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
    v[2 * k] = _mm256_fmadd_pd(lo, lo, v[2 * k]);
    v[2 * k + 1] = _mm256_fmadd_pd(hi, hi, v[2 * k + 1]);
  }
  /// The 16 sums by lane.
  template <class T>
  void store(double (&lane)[slice_lanes]) const noexcept {
    double pos[slice_lanes];
    for (int k = 0; k < 4; ++k) _mm256_storeu_pd(pos + 4 * k, v[k]);
    for (int q = 0; q < slice_lanes; ++q) lane[avx2_lane<T>(q)] = pos[q];
  }
};

/// The finite mask of the 8 values of `raw` (all bits set where finite) and their magnitudes.
[[gnu::always_inline]] inline __m256 finite_mask(__m256 raw, __m256& magnitude) noexcept {
  __m256i const mag = _mm256_and_si256(_mm256_castps_si256(raw), _mm256_set1_epi32(0x7fffffff));
  magnitude = _mm256_castsi256_ps(mag);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), mag));
}

/// Calls f(k, raw, magnitude, finite) for the two vectors k of each whole step of 16 elements of
/// x in [0, whole) (avx2::load_step's arrangement): their values, magnitudes and finite mask.
template <class T, class F>
[[gnu::always_inline]] inline void for_each_vector(T const* x, std::int64_t whole, F&& f) noexcept {
  namespace a2 = agoq::detail::host::avx2;
  for (std::int64_t i = 0; i < whole; i += a2::step) {
    a2::step_values const v = a2::load_step(x + i);
    for (int k = 0; k < 2; ++k) {
      __m256 const raw = k == 0 ? v.v0 : v.v1;
      __m256 a;
      __m256 const ok = finite_mask(raw, a);
      f(k, raw, a, ok);
    }
  }
}

/// measure_dead_zones with AVX2: the whole steps of 16 in vectors (each lane's sums in the same
/// order as lane_dead_zone's and lane_live_gap's, as fused multiply-adds of the same values), the
/// tail in the portable lanes, so the same bits. Host only.
template <class T>
inline void measure_dead_zones_avx2(T const* x, std::int64_t n, slice_partial& p) noexcept {
  namespace a2 = agoq::detail::host::avx2;
  std::int64_t const whole = n / a2::step * a2::step;
  lane_live_gap gaps[slice_lanes];
  __m256 const absmax = _mm256_set1_ps(p.absmax);
  for (int w = 0; w < dead_zone_widths; ++w) {
    float const t = half_step(p.absmax, w);
    __m256 const tv = _mm256_set1_ps(t);
    avx2_sums sums, gap;
    std::int32_t live = 0;
    for_each_vector(x, whole, [&](int k, __m256 raw, __m256 a, __m256 ok) {
      __m256 const dead = _mm256_and_ps(_mm256_cmp_ps(a, tv, _CMP_LT_OQ), ok);
      sums.add_squares(k, _mm256_and_ps(raw, dead));  // other lanes add fma(0, 0, sum)
      __m256 const alive = _mm256_andnot_ps(dead, ok);
      live += std::popcount(static_cast<unsigned>(_mm256_movemask_ps(alive)));
      if (w == 0) gap.add_squares(k, _mm256_and_ps(_mm256_sub_ps(absmax, a), alive));
    });
    lane_dead_zone lanes[slice_lanes];
    double sum[slice_lanes];
    sums.store<T>(sum);
    for (int j = 0; j < slice_lanes; ++j) lanes[j].sum = sum[j];
    lanes[0].live = live;  // only the total counts
    if (w == 0) {
      gap.store<T>(sum);
      for (int j = 0; j < slice_lanes; ++j) gaps[j].sum = sum[j];
    }
    add_dead_zone_lanes(x, whole, n, t, p.absmax, lanes, w == 0 ? gaps : nullptr);
    fold_dead_zone_lanes(lanes, w, p);
  }
  fold_gap_lanes(gaps, p);
}

/// measure_slice with AVX2: the whole steps of 16 in vectors (the sums as fused multiply-adds of
/// the same values in the same order per lane, the extrema by vminps / vmaxps, which pick as the
/// portable comparisons do), the tail in the portable lanes, so the same bits. Host only.
template <class T>
inline slice_partial measure_slice_avx2(T const* x, std::int64_t n, bool dead_zones) noexcept {
  namespace a2 = agoq::detail::host::avx2;
  std::int64_t const whole = n / a2::step * a2::step;
  avx2_sums sums;
  __m256 absmax[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 lo[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 hi[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256i finite = _mm256_setzero_si256();
  for_each_vector(x, whole, [&](int k, __m256 raw, __m256 a, __m256 ok) {
    __m256 const val = _mm256_and_ps(raw, ok);  // a non-finite value counts as 0
    sums.add_squares(k, val);
    absmax[k] = _mm256_max_ps(_mm256_and_ps(a, ok), absmax[k]);
    lo[k] = _mm256_min_ps(val, lo[k]);
    hi[k] = _mm256_max_ps(val, hi[k]);
    finite = _mm256_sub_epi32(finite, _mm256_castps_si256(ok));
  });
  lane_stats lanes[slice_lanes];
  double sum[slice_lanes];
  sums.store<T>(sum);
  float m[slice_lanes], l[slice_lanes], h[slice_lanes];
  for (int k = 0; k < 2; ++k) {
    _mm256_storeu_ps(m + 8 * k, absmax[k]);
    _mm256_storeu_ps(l + 8 * k, lo[k]);
    _mm256_storeu_ps(h + 8 * k, hi[k]);
  }
  for (int q = 0; q < slice_lanes; ++q) {
    lane_stats& lane = lanes[avx2_lane<T>(q)];
    lane.absmax = m[q];
    lane.lo = l[q];
    lane.hi = h[q];
  }
  for (int j = 0; j < slice_lanes; ++j) lanes[j].sum = sum[j];
  std::int32_t counts[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(counts), finite);
  for (std::int32_t c : counts) lanes[0].finite += c;  // only the total counts
  add_lanes(x, whole, n, lanes);
  slice_partial p = fold_lanes(lanes);
  if (dead_zones) measure_dead_zones_avx2(x, n, p);
  return p;
}
#endif

/// measure_slice, with the AVX-512 or AVX2 loop where `simd` and it is compiled (the same bits).
/// Host only.
template <class T>
inline slice_partial slice_statistics([[maybe_unused]] bool simd, T const* x, std::int64_t n,
                                      bool dead_zones) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (simd) return measure_slice_simd(x, n, dead_zones);
#elif defined(AGOQ_HOST_AVX2)
  if (simd) return measure_slice_avx2(x, n, dead_zones);
#endif
  return measure_slice(x, n, dead_zones);
}

/// measure_dead_zones, with the AVX-512 or AVX2 loop where `simd` and it is compiled (the same
/// bits). Host only.
template <class T>
inline void slice_dead_zones([[maybe_unused]] bool simd, T const* x, std::int64_t n,
                             slice_partial& p) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (simd) return measure_dead_zones_simd(x, n, p);
#elif defined(AGOQ_HOST_AVX2)
  if (simd) return measure_dead_zones_avx2(x, n, p);
#endif
  measure_dead_zones(x, n, p);
}

/// Folds slice partials, given in slot order in any number of pieces, into tensor_stats: each
/// group adds its slices in slot order (row by row), and when its last row ends the groups of
/// that band are added to the result in column order (sum_squares += the group's sum, then
/// tensor_stats::add_group(finite, absmax, hi - lo), then its dead zones,
/// tensor_stats::add_dead_zone and add_live_gap). Where groups span several slices (not
/// slice_grid::one_pass), the first pass (add) records each closed group's absmax (pending_absmax)
/// and a second pass (add_dead_zones) folds the same slots' dead zones, measured under those
/// absmaxes, in the same order; a band's second pass may follow its first at once (the host) or all
/// first passes may come before (the device). Host only.
class slice_folder {
 public:
  explicit slice_folder(slice_grid const& g)
      : grid_(g), open_(static_cast<std::size_t>(g.group_cols)) {
    stats_.tile = g.tile;
    stats_.has_dead_zones = true;
  }

  /// First pass: adds the partials of slots [first, first + n); pieces must come in slot order.
  void add(slice_partial const* p, std::int64_t first, std::int64_t n) {
    walk(
        first, n,
        [&](group& acc, std::int64_t i) {
          acc.sum_squares += p[i].sum_squares;
          if (p[i].absmax > acc.absmax) acc.absmax = p[i].absmax;
          if (p[i].lo < acc.lo) acc.lo = p[i].lo;
          if (p[i].hi > acc.hi) acc.hi = p[i].hi;
          acc.finite += p[i].finite;
          add_zones(acc, p[i]);
        },
        [&] { close_band(); });
  }

  /// Second pass (only where !grid.one_pass()): adds the dead zones (dead_energy, live,
  /// live_gap_sq; the other fields are ignored) of slots [first, first + n), measured under
  /// pending_absmax(); pieces must come in slot order, and no band's before its first pass.
  void add_dead_zones(slice_partial const* p, std::int64_t first, std::int64_t n) {
    walk(
        first, n, [&](group& acc, std::int64_t i) { add_zones(acc, p[i]); },
        [&] { close_dead_band(); });
  }

  /// The absmax of every group whose first pass has closed and second pass has not, band by band
  /// in column order (slice_grid::group_of, counted from the first such band); pending() of them.
  float const* pending_absmax() const noexcept { return absmax_.data() + next_; }
  /// How many groups pending_absmax() holds.
  std::int64_t pending() const noexcept {
    return static_cast<std::int64_t>(absmax_.size() - next_);
  }

  /// The statistics of everything added.
  tensor_stats const& result() const noexcept { return stats_; }

 private:
  using group = partial_stats<std::int64_t>;

  static void add_zones(group& acc, slice_partial const& p) noexcept {
    for (int w = 0; w < dead_zone_widths; ++w) {
      acc.dead_energy[w] += p.dead_energy[w];
      acc.live[w] += p.live[w];
    }
    acc.live_gap_sq += p.live_gap_sq;
  }

  /// Adds the dead zones of closed group `g`, measured under `absmax`, to the result.
  void close_zones(group const& g, float absmax) noexcept {
    for (int w = 0; w < dead_zone_widths; ++w)
      stats_.add_dead_zone(w, g.dead_energy[w], g.live[w], absmax);
    stats_.add_live_gap(g.live_gap_sq, g.live[0], absmax);
  }

  /// Calls add(group, i) for slot first + i, i in [0, n), and close() after each band's last slot.
  template <class Add, class Close>
  void walk(std::int64_t first, std::int64_t n, Add add, Close close) {
    if (n <= 0) return;
    std::int64_t const per_row = grid_.per_row();
    std::int64_t r = first / per_row;
    std::int64_t s = first % per_row;
    std::int64_t k = s % grid_.per_group;  // slot within the group's run
    group* acc = &open_[static_cast<std::size_t>(s / grid_.per_group)];
    for (std::int64_t i = 0; i < n; ++i) {
      add(*acc, i);
      if (++k == grid_.per_group) {
        k = 0;
        ++acc;
      }
      if (++s < per_row) continue;
      if ((r + 1) % grid_.tile.rows == 0 || r + 1 == grid_.rows) close();
      ++r;
      s = 0;
      acc = open_.data();
    }
  }

  void close_band() {
    for (group& g : open_) {
      stats_.elements += g.finite;
      stats_.sum_squares += g.sum_squares;
      stats_.add_group(g.finite, g.absmax, static_cast<double>(g.hi) - static_cast<double>(g.lo));
      if (grid_.one_pass()) {
        close_zones(g, g.absmax);
      } else {
        absmax_.push_back(g.absmax);
      }
      g = group{};
    }
  }

  void close_dead_band() {
    for (group& g : open_) {
      close_zones(g, absmax_[next_++]);
      g = group{};
    }
    if (next_ == absmax_.size()) {  // every recorded band done: keep the table small
      absmax_.clear();
      next_ = 0;
    }
  }

  slice_grid grid_;
  std::vector<group> open_;
  std::vector<float> absmax_;  // pending groups' absmax (two-pass grids)
  std::size_t next_ = 0;       // first pending entry of absmax_
  tensor_stats stats_;
};

/// The hook of a sweep that only measures (measure()).
struct no_hook {
  static constexpr bool active = false;
  std::int64_t step = 0;
  std::int64_t operator()(std::int64_t, std::int64_t, std::int64_t, std::int64_t) const noexcept {
    return 0;
  }
};

/// An active hook of sweep(): f(r0, r1, s0, s1) -> int64, called before the first pass over
/// slots [s0, s1) of rows [r0, r1), on the thread that then measures them.
template <class F>
struct slice_hook {
  static constexpr bool active = true;
  std::int64_t step;  ///< slots per call within a row where groups are one row tall
  F f;
  std::int64_t operator()(std::int64_t r0, std::int64_t r1, std::int64_t s0,
                          std::int64_t s1) const {
    return f(r0, r1, s0, s1);
  }
};

/// True when a band of tile.rows rows holds at most host_band_elements elements and
/// host_piece_slots slices: then one thread measures it whole (both passes in a row), from its
/// caches.
inline bool band_fits(slice_grid const& g) noexcept {
  std::int64_t const band_rows = std::min(g.tile.rows, g.rows);
  return band_rows * g.cols <= host_band_elements && band_rows * g.per_row() <= host_piece_slots;
}

/// Slot `s` of row `r` of the elements `x` of grid `g`: its first element, and its length in
/// `count`.
template <class In>
In const* slot_data(In const* x, slice_grid const& g, std::int64_t r, std::int64_t s,
                    std::int64_t& count) noexcept {
  std::int64_t c = 0;
  g.columns(s, c, count);
  return x + r * g.cols + c;
}

/// The first pass over slots [a, e) of row r of `x` (grid `g`): the statistics of slot s into
/// part[s - a] (with its dead zones where g.one_pass()), and its group's absmax into absmax[s /
/// g.per_group] where larger (the largest of its slices', as slice_folder records it).
template <class In>
void first_pass(bool simd, In const* x, slice_grid const& g, std::int64_t r, std::int64_t a,
                std::int64_t e, slice_partial* part, float* absmax) noexcept {
  for (std::int64_t s = a, count = 0; s < e; ++s) {
    auto const* xs = slot_data(x, g, r, s, count);
    part[s - a] = slice_statistics(simd, xs, count, g.one_pass());
    float& m = absmax[s / g.per_group];
    m = std::max(m, part[s - a].absmax);
  }
}

/// The second pass over rows [r0, r1) of a band of `x` (grid `g`, not one_pass()): the dead zones
/// of slot s of row r, under its group's absmax[s / g.per_group] (first_pass's), into
/// part[(r - r0) * g.per_row() + s].
template <class In>
void dead_zone_pass(bool simd, In const* x, slice_grid const& g, std::int64_t r0, std::int64_t r1,
                    slice_partial* part, float const* absmax) noexcept {
  std::int64_t const per_row = g.per_row();
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t s = 0, count = 0; s < per_row; ++s) {
      auto const* xs = slot_data(x, g, r, s, count);
      slice_partial& z = part[(r - r0) * per_row + s];
      z = slice_partial{};
      z.absmax = absmax[s / g.per_group];
      slice_dead_zones(simd, xs, count, z);
    }
  }
}

/// What sweep() returns: the statistics, and the sum of the hook's results.
struct swept {
  tensor_stats stats;
  std::int64_t hooked = 0;
};

/// measure()'s sweep over the slices of `x` (grid `g`, not empty), with `hook` called before
/// slices are first measured where it is active (quantize_measured). Its calls cover every slot
/// once, in whole groups: where the groups are one row tall, pieces of at most hook.step slots
/// of one row (a multiple of g.per_group, or g.per_row()), else whole bands of tile.rows rows.
/// An active hook takes the band path wherever band_fits(g), else needs g.one_pass() and a
/// hook.step that lets a piece end at any group.
template <class In, class Hook>
swept sweep(host_executor ex, matrix_view<In> x, slice_grid const& g, Hook const& hook) {
  namespace h = agoq::detail::host;
  bool const simd = ex.simd;
  slice_folder fold(g);
  std::int64_t const per_row = g.per_row();
  int const threads = h::call_threads(ex, g.slots(), std::max<std::int64_t>(g.cols / per_row, 1));
  std::int64_t const band_rows = std::min(g.tile.rows, g.rows);
  std::int64_t const bands = (g.rows - 1) / band_rows + 1;
  std::int64_t const band_elements = band_rows * g.cols;
  std::int64_t const band_slots = band_rows * per_row;
  // Slots per hook call within a row (whole groups), or whole rows.
  std::int64_t const piece = Hook::active && g.tile.rows == 1 ? hook.step : per_row;
  std::int64_t hooked = 0;
  if (band_fits(g) && (Hook::active || (!g.one_pass() && threads > 1 && bands >= threads))) {
    // Sets of bands, each band measured by one thread (twice in a row where the dead zones take a
    // second pass, the second time from its caches, under its groups' absmax, the largest of
    // their slices' as the folder records it); the threads start once per set, whose partials
    // are then folded in slot order. A set holds host_band_elements and at most
    // host_piece_slots a thread, and a band a thread at least.
    std::int64_t const per_set = std::max<std::int64_t>(
        threads * std::min(host_band_elements / band_elements, host_piece_slots / band_slots),
        threads);
    auto const set_slots = static_cast<std::size_t>(std::min(bands, per_set) * band_slots);
    std::vector<slice_partial> first(set_slots), second(g.one_pass() ? 0 : set_slots);
    for (std::int64_t b0 = 0; b0 < bands; b0 += per_set) {
      std::int64_t const b1 = std::min(bands, b0 + per_set);
      std::int64_t const s0 = b0 * band_slots;
      hooked += h::parallel_sum(ex.pool, threads, b1 - b0, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> absmax(static_cast<std::size_t>(g.group_cols));
        std::int64_t n = 0;
        for (std::int64_t b = b0 + i0; b < b0 + i1; ++b) {
          std::int64_t const r0 = b * band_rows;
          std::int64_t const r1 = std::min(g.rows, r0 + band_rows);
          std::fill(absmax.begin(), absmax.end(), 0.0f);
          for (std::int64_t r = r0; r < r1; ++r) {
            for (std::int64_t a = 0; a < per_row; a += piece) {
              std::int64_t const e = std::min(per_row, a + piece);
              if constexpr (Hook::active) {
                if (g.tile.rows == 1) {
                  n += hook(r, r + 1, a, e);
                } else if (r == r0) {
                  n += hook(r0, r1, 0, per_row);
                }
              }
              first_pass(simd, x.data_handle(), g, r, a, e, first.data() + (r * per_row + a - s0),
                         absmax.data());
            }
          }
          if (!g.one_pass())
            dead_zone_pass(simd, x.data_handle(), g, r0, r1, second.data() + (r0 * per_row - s0),
                           absmax.data());
        }
        return n;
      });
      std::int64_t const n = std::min(g.rows, b1 * band_rows) * per_row - s0;
      fold.add(first.data(), s0, n);
      if (!g.one_pass()) fold.add_dead_zones(second.data(), s0, n);
    }
    return {fold.result(), hooked};
  }
  // Otherwise the slots among the threads, measured and folded in pieces of at most
  // host_piece_slots a thread (a row of a flat tensor can hold millions): all at once in one
  // pass, else band by band, each band twice (the second time from the caches where it fits).
  std::int64_t const slots_per_piece = std::min(g.slots(), host_piece_slots * threads);
  std::vector<slice_partial> parts(static_cast<std::size_t>(slots_per_piece));
  // Measures and folds slots [first, last), which begin band r0's: their statistics, or with
  // `zones` (the second pass) their dead zones under their groups' pending absmax.
  auto const pass = [&](std::int64_t first, std::int64_t last, std::int64_t r0, bool zones) {
    for (std::int64_t s0 = first; s0 < last; s0 += slots_per_piece) {
      std::int64_t const n = std::min(slots_per_piece, last - s0);
      hooked += h::parallel_sum(ex.pool, threads, n, [&](std::int64_t i0, std::int64_t i1) {
        std::int64_t r = (s0 + i0) / per_row;
        std::int64_t s = (s0 + i0) % per_row;
        std::int64_t called = 0;
        for (std::int64_t i = i0; i < i1; ++i) {
          if constexpr (Hook::active) {  // one_pass: a piece may end at any slot (group)
            if (i == i0 || s % piece == 0)
              called += hook(r, r + 1, s, std::min({per_row, (s / piece + 1) * piece, s + i1 - i}));
          }
          std::int64_t count = 0;
          auto const* xs = slot_data(x.data_handle(), g, r, s, count);
          slice_partial& out = parts[static_cast<std::size_t>(i)];
          if (zones) {
            out = slice_partial{};
            out.absmax = fold.pending_absmax()[g.group_of(r - r0, s)];
            slice_dead_zones(simd, xs, count, out);
          } else {
            out = slice_statistics(simd, xs, count, g.one_pass());
          }
          if (++s == per_row) {
            s = 0;
            ++r;
          }
        }
        return called;
      });
      if (zones) {
        fold.add_dead_zones(parts.data(), s0, n);
      } else {
        fold.add(parts.data(), s0, n);
      }
    }
  };
  if (g.one_pass()) {
    pass(0, g.slots(), 0, false);
    return {fold.result(), hooked};
  }
  for (std::int64_t r0 = 0; r0 < g.rows; r0 += band_rows) {
    std::int64_t const r1 = std::min(g.rows, r0 + band_rows);
    pass(r0 * per_row, r1 * per_row, r0, false);
    pass(r0 * per_row, r1 * per_row, r0, true);
  }
  return {fold.result(), hooked};
}

}  // namespace stats_detail

/// The statistics relative_error() predicts from, of the [rows, cols] tensor `x` under groups of
/// `tile` (use `s.tile(rows, cols)` for a scheme `s`, or the overload below): the sum of squares,
/// per group the absmax and the widened range (min(min, 0) to max(max, 0)) over its finite
/// elements, and their count; and every group's dead zones under symmetric 2-, 4- and 8-bit codes
/// (tensor_stats::dead_energy, live_absmax_sq, live_error_2bit). NaN and ±Inf are left out (as
/// quantize leaves them out of a group's scale). Sums are fp64 in a fixed order, so the CUDA form
/// (statistics.cuh) returns the same bits, and so does every thread count of `ex`: its threads
/// measure slices (or whole bands of tile.rows rows, see below) whose partials the calling thread
/// then folds in slot order. Reads `x` once where each group is one row of at most 256 columns
/// (e.g. per_group<G <= 256>), else each band of tile.rows rows twice in a row (the second time
/// for the dead zones, under the absmax the first found; from the caches where a band fits them,
/// e.g. a row under per_row). On several threads, bands of at most host_band_elements elements
/// and host_piece_slots slices are shared out whole, at least one per thread; larger ones are
/// measured one by one, each pass's slices shared out. Empty tensors give empty statistics.
/// \throws agoq::invalid_argument for a tile with an extent below 1 or a null pointer.
template <agoq::detail::readable_elements In>
tensor_stats measure(host_executor ex, matrix_view<In> x, tile_shape tile) {
  stats_detail::slice_grid const g = stats_detail::make_slice_grid(x.extent(0), x.extent(1), tile);
  agoq::detail::check_data(x.data_handle(), x.size(), "measure");
  if (g.slots() == 0) return stats_detail::slice_folder(g).result();
  return stats_detail::sweep(ex, x, g, stats_detail::no_hook{}).stats;
}

/// measure() under the group tile of scheme `s` on this tensor.
/// \throws agoq::invalid_argument for an invalid spec or a null pointer.
template <agoq::detail::readable_elements In>
tensor_stats measure(host_executor ex, matrix_view<In> x, spec const& s) {
  s.validate();
  return measure(ex, x, s.tile(x.extent(0), x.extent(1)));
}

/// quantize() that gathers, in the same sweep, the statistics of `in` that measure(ex, in,
/// out.spec) returns (into `stats`, the same bits): a piece of whole groups is quantized and then
/// measured while it is in the caches, so `in` is read from memory once. The codes, scales, zero
/// points and the returned non-finite count are quantize's, bit for bit, on any number of
/// threads. Pieces: where each group is one row of at most 256 columns (per_group<G <= 256>, the
/// default policy's g128), about stats_detail::fused_slots groups of one row (whole rows where a
/// group's codes do not end on a byte); otherwise bands of tile.rows rows of at most
/// stats_detail::host_band_elements elements and host_piece_slots slices, measured twice in a row
/// (the dead zones' pass). Larger bands (per-tensor and per-column groups of large tensors, tall
/// blocks) are quantized and then measured, two reads. Host only; synchronous. `Codes` as in
/// quantize.
/// \throws agoq::invalid_argument on an invalid spec, mismatched extents or a null pointer;
/// agoq::unsupported_scheme on a code family outside `Codes` (before anything is written).
template <code_list Codes = dispatch_codes, agoq::detail::readable_elements In>
std::int64_t quantize_measured(host_executor ex, matrix_view<In> in, quantized_view out,
                               tensor_stats& stats, quantize_options opt = {}) {
  out.validate();
  agoq::detail::check_extents(in.extent(0), in.extent(1), out.rows, out.cols, "quantize_measured");
  agoq::detail::check_data(in.data_handle(), in.size(), "quantize_measured");
  require_code<Codes>(out.spec);
  quantized_layout const l = out.layout();
  stats_detail::slice_grid const g = stats_detail::make_slice_grid(l.rows, l.cols, l.tile);
  // A piece may begin at any group of a row where every group's codes begin on a byte.
  bool const on_bytes = l.tile.cols >= l.cols || (l.tile.cols * l.bits) % 8 == 0;
  if (g.slots() == 0 || !(stats_detail::band_fits(g) || (g.one_pass() && on_bytes))) {
    std::int64_t const nonfinite = quantize<Codes>(ex, in, out, opt);
    stats = measure(ex, in, l.tile);
    return nonfinite;
  }
  std::int64_t const step =
      on_bytes ? (stats_detail::fused_slots + g.per_group - 1) / g.per_group * g.per_group
               : g.per_row();
  // Quantizes the whole groups of slots [s0, s1) of rows [r0, r1) (whole rows, or one row) as a
  // tensor of their own: its groups, codes and stochastic-rounding positions are the same.
  auto const piece = [&](std::int64_t r0, std::int64_t r1, std::int64_t s0, std::int64_t s1) {
    std::int64_t const c0 = s0 / g.per_group * l.tile.cols;
    std::int64_t const c1 = s1 == g.per_row() ? l.cols : s1 / g.per_group * l.tile.cols;
    std::int64_t const group = r0 / l.tile.rows * l.group_grid_cols + c0 / l.tile.cols;
    quantized_view const part{out.spec,
                              r1 - r0,
                              c1 - c0,
                              out.codes + r0 * l.code_row_bytes + c0 * l.bits / 8,
                              out.scales + group * l.scale_bytes_each,
                              out.zero_points == nullptr ? nullptr : out.zero_points + group};
    std::uint64_t const first = static_cast<std::uint64_t>(r0 * l.cols + c0);
    return quantize<Codes>(host_executor{.simd = ex.simd},
                           matrix_view<In>(in.data_handle() + r0 * l.cols + c0, r1 - r0, c1 - c0),
                           part, {opt.seed, opt.offset + first});
  };
  stats_detail::swept const r =
      stats_detail::sweep(ex, in, g, stats_detail::slice_hook<decltype(piece)>{step, piece});
  stats = r.stats;
  return r.hooked;
}

namespace stats_detail {

/// A tensor an op's measured form measures (measured_rows): its elements, the scheme of its saved
/// copy (a valid spec) and where its statistics go.
template <class In>
struct measured_tensor {
  matrix_view<In> x;
  spec scheme;
  tensor_stats* stats;

  /// The group tile of the saved copy.
  tile_shape tile() const { return scheme.tile(x.extent(0), x.extent(1)); }
};

/// True when measured_rows can measure a tensor of grid `g` row by row beside an op: groups one row
/// tall (as the fused ops save row by row) and a row that band_fits (at most host_band_elements
/// elements and host_piece_slots slices).
inline bool rows_measurable(slice_grid const& g) noexcept {
  return g.tile.rows == 1 && band_fits(g);
}

/// Runs an op given as measured_rows takes it (`range`) over the rows [0, rows) of `cols` columns
/// on the executor's threads, each thread's range of rows in one call; returns the sum of its
/// counts. The ops' driver where nothing is measured.
template <class Range>
std::int64_t all_rows(host_executor ex, std::int64_t rows, std::int64_t cols, Range&& range) {
  return agoq::detail::host::parallel_sum(ex, rows, cols, [&](std::int64_t r0, std::int64_t r1) {
    return range(r0, r1, [&](auto&& run) { return run(r0, r1); });
  });
}

/// One measured_tensor of measured_rows: its grid, folder and the partials of a set of rows.
template <class In>
class row_measurer {
 public:
  row_measurer(measured_tensor<In> const& m, std::int64_t set_rows)
      : m_(m),
        g_(make_slice_grid(m.x.extent(0), m.x.extent(1), m.tile())),
        fold_(g_),
        first_(static_cast<std::size_t>(set_rows * g_.per_row())),
        second_(g_.one_pass() ? 0 : first_.size()) {}

  slice_grid const& grid() const noexcept { return g_; }

  /// Measures row r of the set that begins at row r0 (both passes, the second from the caches);
  /// `absmax` has room for the row's groups.
  void row(bool simd, std::int64_t r, std::int64_t r0, float* absmax) noexcept {
    std::int64_t const per_row = g_.per_row();
    std::fill(absmax, absmax + g_.group_cols, 0.0f);
    std::size_t const at = static_cast<std::size_t>((r - r0) * per_row);
    first_pass(simd, m_.x.data_handle(), g_, r, 0, per_row, first_.data() + at, absmax);
    if (!g_.one_pass())
      dead_zone_pass(simd, m_.x.data_handle(), g_, r, r + 1, second_.data() + at, absmax);
  }

  /// Folds the rows [r0, r1) of the set that begins at r0, in slot order.
  void fold(std::int64_t r0, std::int64_t r1) {
    std::int64_t const per_row = g_.per_row();
    fold_.add(first_.data(), r0 * per_row, (r1 - r0) * per_row);
    if (!g_.one_pass()) fold_.add_dead_zones(second_.data(), r0 * per_row, (r1 - r0) * per_row);
  }

  /// Writes the statistics of everything folded.
  void finish() const { *m_.stats = fold_.result(); }

 private:
  measured_tensor<In> m_;
  slice_grid g_;
  slice_folder fold_;
  std::vector<slice_partial> first_, second_;
};

/// Runs an op over the rows [0, rows) of [rows, cols] tensors on the executor's threads, and
/// measures the tensors `m` (each [rows, cols]) into their `stats`, as measure(ex, x, tile) would
/// (the same bits, on any number of threads): row by row beside the op, each row right before the
/// op's row (`before`: the op's inputs, which its output may overwrite in place) or right after it
/// (its outputs), so that the second of the two reads finds the row in the caches. The op is
/// `range(r0, r1, f)`, which runs on one thread: it prepares the op's state for rows [r0, r1)
/// (e.g. its savers) and returns f(run), where run(a, b) runs the op on rows [a, b) (in order,
/// within [r0, r1)) and returns a count; f calls it on every row. Threads start once per set of
/// rows whose slices' partials (72 bytes each, host_piece_slots a thread at most) the calling
/// thread then folds. Where a tensor's groups span rows or a row does not fit a band
/// (rows_measurable), the op runs over all rows and the tensors are measured whole before or
/// after it (two reads). Returns the sum of the op's counts; on an exception no `stats` is
/// written.
template <class Range, class... In>
std::int64_t measured_rows(host_executor ex, std::int64_t rows, std::int64_t cols, bool before,
                           Range&& range, measured_tensor<In> const&... m) {
  namespace h = agoq::detail::host;
  bool const fits =
      (rows_measurable(make_slice_grid(m.x.extent(0), m.x.extent(1), m.tile())) && ...);
  if (rows == 0 || cols == 0 || !fits) {
    std::array<tensor_stats, sizeof...(In)> stats;
    auto const measure_all = [&] {
      std::size_t i = 0;
      ((stats[i++] = measure(ex, m.x, m.tile())), ...);
    };
    if (before) measure_all();
    std::int64_t const count = all_rows(ex, rows, cols, range);
    if (!before) measure_all();
    std::size_t i = 0;
    ((*m.stats = stats[i++]), ...);
    return count;
  }
  int const threads = h::call_threads(ex, rows, cols);
  std::int64_t const per_row = std::max({make_slice_grid(rows, cols, m.tile()).per_row()...});
  std::int64_t const group_cols = std::max({make_slice_grid(rows, cols, m.tile()).group_cols...});
  std::int64_t const per_set =
      threads * std::min(host_band_elements / cols, host_piece_slots / per_row);
  std::tuple<row_measurer<In>...> measurers{row_measurer<In>(m, std::min(rows, per_set))...};
  bool const simd = ex.simd;
  std::int64_t count = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += per_set) {
    std::int64_t const r1 = std::min(rows, r0 + per_set);
    count += h::parallel_sum(ex.pool, threads, r1 - r0, [&](std::int64_t i0, std::int64_t i1) {
      return range(r0 + i0, r0 + i1, [&](auto&& run) {
        std::vector<float> absmax(static_cast<std::size_t>(group_cols));
        std::int64_t n = 0;
        for (std::int64_t r = r0 + i0; r < r0 + i1; ++r) {
          if (!before) n += run(r, r + 1);
          std::apply([&](auto&... each) { (each.row(simd, r, r0, absmax.data()), ...); },
                     measurers);
          if (before) n += run(r, r + 1);
        }
        return n;
      });
    });
    std::apply([&](auto&... each) { (each.fold(r0, r1), ...); }, measurers);
  }
  std::apply([&](auto const&... each) { (each.finish(), ...); }, measurers);
  return count;
}

}  // namespace stats_detail

}  // namespace agoq::activation
