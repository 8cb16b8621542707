/// \file
/// A fused AdamW step on the host whose moments are kept quantized (DESIGN §1: Adam's first
/// moment tolerates a linear 8-bit code, its second moment does not).
///
/// The default state is 2.0625 bytes per parameter at block size 128 (8 for fp32 Adam):
/// - the first moment m as int8 codes of m itself, block-wise symmetric (int8_g128_sym_sr_f32);
/// - the second moment v as scaled FP8 E4M3 codes of sqrt(v) per block (fp8e4m3_g128_sr_f32).
///   sqrt halves v's dynamic range and E4M3's exponent keeps values down to 2^-9 / 448 of the
///   block's largest alive, so a parameter whose gradient is much smaller than its block
///   neighbours' keeps a non-zero denominator. A plain linear 8-bit v (moment_format::int8_linear)
///   rounds every v below 1/254 of its block maximum to zero and the step then divides m by eps:
///   tests/optim/adamw_test.cpp shows it blowing up where the default does not, and
///   docs/optimizer.md has the measurement behind the choice.
///
/// The step walks the parameters in chunks of whole blocks (8192 elements): it decodes m and v,
/// reads the gradient (float, bfloat16 or half, or the codes of an 8-bit quantized view, decoded
/// group by group), updates in fp32 and requantizes m and v with fresh block scales. No full-size
/// fp32 temporary is made. The per-element math is adamw_update (host and device), so a CUDA
/// step can be its bit-exact twin: optim/adamw.cuh is that step (every format, blocks of 32-256).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda/std/cmath>

#include "../detail/host/parallel.hpp"
#include "../detail/host/segment.hpp"
#include "../detail/host/simd.hpp"
#include "../device/partition.hpp"
#include "../error.hpp"
#include "../layout/matrix.hpp"
#include "../layout/params.hpp"
#include "../layout/tensor.hpp"
#include "../layout/view.hpp"
#include "../numeric/bits.hpp"
#include "../numeric/element.hpp"
#include "../quantize.hpp"
#include "../scheme/dispatch.hpp"
#include "../scheme/spec.hpp"

namespace agoq::optim {

/// How one moment is stored. The 8-bit formats are block-wise with fp32 block scales in agoq's
/// standard quantized layout (docs/formats.md); their spec is moment_spec().
enum class moment_format : std::uint8_t {
  f32,          ///< fp32, 4 bytes per element (the unquantized reference)
  bf16,         ///< bfloat16 of the value, round to nearest even, 2 bytes per element
  int8_linear,  ///< int8 symmetric codes of the value: int8_g<B>_sym (m's default; for v the
                ///< negative control of DESIGN §1)
  uint8_sqrt,   ///< second moment only: unsigned 8-bit codes of sqrt(v): int8_g<B>_asym (the
                ///< zero point is always 0 since sqrt(v) >= 0, so all 255 steps cover [0, max])
  e4m3_sqrt,    ///< second moment only: FP8 E4M3 codes of sqrt(v): fp8e4m3_g<B> (v's default)
  e4m3,         ///< second moment only: FP8 E4M3 codes of v itself: fp8e4m3_g<B>
};

/// The short name of a moment format ("f32", "bf16", "int8_linear", "uint8_sqrt", "e4m3_sqrt",
/// "e4m3"). Host only.
inline char const* format_name(moment_format f) noexcept {
  switch (f) {
    case moment_format::f32:
      return "f32";
    case moment_format::bf16:
      return "bf16";
    case moment_format::int8_linear:
      return "int8_linear";
    case moment_format::uint8_sqrt:
      return "uint8_sqrt";
    case moment_format::e4m3_sqrt:
      return "e4m3_sqrt";
    case moment_format::e4m3:
      return "e4m3";
  }
  return "?";
}

/// True for the formats that store sqrt(v) instead of v.
AGOQ_HOST_DEVICE constexpr bool stores_sqrt(moment_format f) noexcept {
  return f == moment_format::uint8_sqrt || f == moment_format::e4m3_sqrt;
}

/// True for the formats kept as agoq quantized tensors (codes and block scales).
AGOQ_HOST_DEVICE constexpr bool is_quantized(moment_format f) noexcept {
  return f != moment_format::f32 && f != moment_format::bf16;
}

/// How an adamw_state stores its moments.
struct adamw_state_options {
  moment_format m = moment_format::int8_linear;  ///< first moment: f32, bf16 or int8_linear
  moment_format v = moment_format::e4m3_sqrt;    ///< second moment: any format
  std::int64_t block = 128;                      ///< elements per block scale (8-bit formats)
  /// Rounding of m's requantization. Stochastic by default: it keeps E[m] exact, so a parameter
  /// whose momentum is below half a step of its block still moves on average, where nearest
  /// rounding freezes it at zero (measured in docs/optimizer.md).
  rounding_kind m_rounding = rounding_kind::stochastic;
  /// Rounding of v's requantization. Stochastic by default: v moves by (1 - beta2) = 0.1% of
  /// itself per step, far below half a step of an 8-bit code, so nearest rounding leaves it stuck;
  /// stochastic rounding keeps E[v] exact. Safe only with a code whose range reaches small values
  /// (e4m3_sqrt): on a linear code it sends a small v to zero with a probability near one minus its
  /// fraction of a step, and a zero v divides m by eps (docs/optimizer.md).
  rounding_kind v_rounding = rounding_kind::stochastic;
  /// Stochastic rounding seed; step t rounds m and v with stream_seed(seed, t, 0 | 1), element i
  /// at stream position i.
  std::uint64_t seed = 0;
};

/// The agoq spec of a quantized moment format: int8_g<B>_sym, int8_g<B>_asym or fp8e4m3_g<B>,
/// with the given rounding and fp32 scales. Host only.
/// \throws agoq::invalid_argument for f32 or bf16 (not quantized) or a block size below 1.
inline spec moment_spec(moment_format f, std::int64_t block, rounding_kind r) {
  AGOQ_EXPECTS(is_quantized(f),
               std::string("moment_spec: ") + format_name(f) + " is not a quantized moment format");
  AGOQ_EXPECTS(block >= 1,
               "moment_spec: block size must be at least 1, got " + std::to_string(block));
  spec s;
  s.code = f == moment_format::int8_linear  ? code_kind::int_sym
           : f == moment_format::uint8_sqrt ? code_kind::uint_asym
                                            : code_kind::fp8_e4m3;
  s.bits = 8;
  s.grouping = grouping_kind::group;
  s.group_rows = 1;
  s.group_cols = block;
  s.rounding = r;
  s.scale = scale_format::f32;
  return s;
}

/// Bytes one moment of n elements takes in format f, block size `block` (moment_storage::bytes:
/// for the 8-bit formats the whole quantized buffer of make_layout(moment_spec(f, block, r), 1, n),
/// codes, alignment padding, scales and zero points; 4 or 2 bytes per element for f32 and bf16).
/// Host only.
/// \throws agoq::invalid_argument for n < 0 or a block size below 1.
inline std::int64_t moment_bytes(moment_format f, std::int64_t n, std::int64_t block) {
  AGOQ_EXPECTS(n >= 0, "moment_bytes: the size must be >= 0, got " + std::to_string(n));
  if (is_quantized(f))
    return make_layout(moment_spec(f, block, rounding_kind::nearest), 1, n).total_bytes;
  AGOQ_EXPECTS(block >= 1,
               "moment_bytes: block size must be at least 1, got " + std::to_string(block));
  return n * (f == moment_format::f32 ? 4 : 2);
}

/// The stochastic rounding seed of moment `moment` (0 = m, 1 = v) at step `step` under the
/// state's seed: two rounds of splitmix64, so every step and moment draws its own stream.
/// Host and device.
AGOQ_HOST_DEVICE constexpr std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t step,
                                                     std::uint32_t moment) noexcept {
  auto mix = [](std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return mix(seed ^ mix(step * 2u + moment));
}

/// AdamW hyper-parameters of one step (decoupled weight decay, Loshchilov & Hutter; the update of
/// torch.optim.AdamW):
///   p <- p (1 - lr wd) - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps),
/// with m <- beta1 m + (1 - beta1) g and v <- beta2 v + (1 - beta2) g^2 taken first.
struct adamw_hyper {
  float lr = 1e-3f;           ///< learning rate (>= 0, finite)
  float beta1 = 0.9f;         ///< first moment decay, in [0, 1)
  float beta2 = 0.999f;       ///< second moment decay, in [0, 1)
  float eps = 1e-8f;          ///< denominator guard, > 0 (so 0 / 0 never happens)
  float weight_decay = 0.0f;  ///< decoupled weight decay (>= 0)
};

/// The per-step constants of adamw_update, computed once on the host (bias corrections in double,
/// then rounded) so that every executor uses the same floats.
struct adamw_coefficients {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float step_size = 1e-3f;    ///< lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 1.0f;  ///< 1 / sqrt(1 - beta2^t)
  float eps = 1e-8f;
  float decay = 1.0f;  ///< 1 - lr * weight_decay
};

/// The constants of step t (t >= 1). Host only.
/// \throws agoq::invalid_argument for hyper-parameters outside their documented ranges or t < 1.
inline adamw_coefficients make_coefficients(adamw_hyper const& h, std::int64_t t) {
  AGOQ_EXPECTS(t >= 1, "adamw: the step count starts at 1, got " + std::to_string(t));
  AGOQ_EXPECTS(std::isfinite(h.lr) && h.lr >= 0.0f,
               "adamw: lr must be finite and >= 0, got " + std::to_string(h.lr));
  AGOQ_EXPECTS(h.beta1 >= 0.0f && h.beta1 < 1.0f,
               "adamw: beta1 must lie in [0, 1), got " + std::to_string(h.beta1));
  AGOQ_EXPECTS(h.beta2 >= 0.0f && h.beta2 < 1.0f,
               "adamw: beta2 must lie in [0, 1), got " + std::to_string(h.beta2));
  AGOQ_EXPECTS(std::isfinite(h.eps) && h.eps > 0.0f,
               "adamw: eps must be finite and > 0, got " + std::to_string(h.eps));
  AGOQ_EXPECTS(
      std::isfinite(h.weight_decay) && h.weight_decay >= 0.0f,
      "adamw: weight_decay must be finite and >= 0, got " + std::to_string(h.weight_decay));
  double const bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
  double const bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
  adamw_coefficients c;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  c.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = h.eps;
  c.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  return c;
}

/// One element's AdamW update in fp32 (host and device). `v` holds v, or sqrt(v) when `SqrtV`.
/// Every multiply-add is an explicit fma and every other operation a single rounding, so no
/// compiler contracts it differently on two executors. An element whose gradient is not finite is
/// left unchanged (parameter and moments) and the function returns false; true otherwise. With
/// eps > 0 and finite inputs no NaN can arise: the denominator is at least eps.
template <bool SqrtV>
AGOQ_HOST_DEVICE inline bool adamw_update(adamw_coefficients const& c, float g, float& p, float& m,
                                          float& v) noexcept {
  bool const finite = numeric::is_finite(g);
  float const v0 = SqrtV ? v * v : v;
  float const m1 = cuda::std::fma(c.beta1, m, c.one_minus_beta1 * g);
  float const v1 = cuda::std::fma(c.beta2, v0, (c.one_minus_beta2 * g) * g);
  float const r = cuda::std::sqrt(v1);
  float const denom = cuda::std::fma(r, c.inv_sqrt_bc2, c.eps);
  float const p1 = cuda::std::fma(-c.step_size, m1 / denom, p * c.decay);
  p = finite ? p1 : p;
  m = finite ? m1 : m;
  v = finite ? (SqrtV ? r : v1) : v;
  return finite;
}

namespace detail {

/// adamw_update over elements [0, k): gradient g, moments m and v (updated in place), parameters
/// read from `master` when given (else from w) and written to both. Returns the number of
/// elements whose gradient is finite. The portable per-element loop.
template <bool SqrtV, class P>
std::int64_t adamw_update_run(adamw_coefficients const& c, float const* g, P* w, float* master,
                              float* m, float* v, std::int64_t k) noexcept {
  std::int64_t ok = 0;
  if constexpr (std::is_same_v<P, float>) {
    float* p = master ? master : w;
    for (std::int64_t i = 0; i < k; ++i) ok += adamw_update<SqrtV>(c, g[i], p[i], m[i], v[i]);
  } else {
    for (std::int64_t i = 0; i < k; ++i) {
      float p = master ? master[i] : numeric::to_float(w[i]);
      ok += adamw_update<SqrtV>(c, g[i], p, m[i], v[i]);
      if (master) master[i] = p;
      w[i] = numeric::from_float<P>(p);
    }
  }
  return ok;
}

#if defined(AGOQ_HOST_AVX512)

/// adamw_update_run on 16 lanes at a time. g++ does not vectorize the portable loop (sqrt keeps
/// its errno branch under the default -fmath-errno), so this is written with intrinsics:
/// _mm512_fmadd_ps, _mm512_sqrt_ps, _mm512_div_ps and _mm512_mul_ps round exactly like the
/// scalar fma, sqrt, / and *, in the same order, so every bit equals adamw_update's. bfloat16
/// weights are widened by a shift and narrowed by detail::host::bf16_rounded_high, the bit-exact
/// twin of numeric::from_float<bfloat16> (NaN quieted alike).
template <bool SqrtV, class P>
std::int64_t adamw_update_run_simd(adamw_coefficients const& c, float const* g, P* w, float* master,
                                   float* m, float* v, std::int64_t k) noexcept {
  static_assert(std::is_same_v<P, float> || std::is_same_v<P, bfloat16>);
  __m512 const beta1 = _mm512_set1_ps(c.beta1);
  __m512 const one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  __m512 const beta2 = _mm512_set1_ps(c.beta2);
  __m512 const one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  __m512 const minus_step = _mm512_set1_ps(-c.step_size);
  __m512 const inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  __m512 const eps = _mm512_set1_ps(c.eps);
  __m512 const decay = _mm512_set1_ps(c.decay);
  __m512i const magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i const inf = _mm512_set1_epi32(0x7f800000);
  // Where the fp32 parameters live: the master copy, or float weights themselves.
  float* pf = master;
  if constexpr (std::is_same_v<P, float>) {
    if (!pf) pf = w;
  }
  std::int64_t ok = 0;
  for (std::int64_t i = 0; i < k; i += 16) {
    __mmask16 const live = agoq::detail::host::tail_mask16(k - i);
    __m512 const gv = _mm512_maskz_loadu_ps(live, g + i);
    __m512 const mv = _mm512_maskz_loadu_ps(live, m + i);
    __m512 const vv = _mm512_maskz_loadu_ps(live, v + i);
    __m512 pv = _mm512_setzero_ps();
    if (pf) {
      pv = _mm512_maskz_loadu_ps(live, pf + i);
    } else if constexpr (std::is_same_v<P, bfloat16>) {
      pv = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, w + i)), 16));
    }
    __mmask16 const finite = _mm512_mask_cmplt_epu32_mask(
        live, _mm512_and_si512(_mm512_castps_si512(gv), magnitude), inf);
    __m512 const v0 = SqrtV ? _mm512_mul_ps(vv, vv) : vv;
    __m512 const m1 = _mm512_fmadd_ps(beta1, mv, _mm512_mul_ps(one_minus_beta1, gv));
    __m512 const v1 =
        _mm512_fmadd_ps(beta2, v0, _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, gv), gv));
    __m512 const r = _mm512_sqrt_ps(v1);
    __m512 const denom = _mm512_fmadd_ps(r, inv_sqrt_bc2, eps);
    __m512 const p1 =
        _mm512_fmadd_ps(minus_step, _mm512_div_ps(m1, denom), _mm512_mul_ps(pv, decay));
    // A lane with a non-finite gradient keeps its parameter and moments: only finite lanes are
    // stored, except the bfloat16 weights, which the scalar loop rewrites from p in every lane.
    _mm512_mask_storeu_ps(m + i, finite, m1);
    _mm512_mask_storeu_ps(v + i, finite, SqrtV ? r : v1);
    if (pf) _mm512_mask_storeu_ps(pf + i, finite, p1);
    if constexpr (std::is_same_v<P, bfloat16>) {
      __m512 const p = _mm512_mask_mov_ps(pv, finite, p1);
      _mm256_mask_storeu_epi16(
          w + i, live,
          _mm512_cvtepi32_epi16(_mm512_srli_epi32(agoq::detail::host::bf16_rounded_high(p), 16)));
    }
    ok += __builtin_popcount(static_cast<unsigned>(finite));
  }
  return ok;
}

#endif  // AGOQ_HOST_AVX512

/// adamw_update_run, on 16 lanes at a time where compiled and `simd` is set.
template <bool SqrtV, class P>
std::int64_t adamw_update_run(adamw_coefficients const& c, float const* g, P* w, float* master,
                              float* m, float* v, std::int64_t k, bool simd) noexcept {
#if defined(AGOQ_HOST_AVX512)
  if (simd) return adamw_update_run_simd<SqrtV>(c, g, w, master, m, v, k);
#else
  (void)simd;
#endif
  return adamw_update_run<SqrtV>(c, g, w, master, m, v, k);
}

/// Elements per chunk of the fused step, rounded down to whole blocks (at least one block).
inline constexpr std::int64_t adamw_chunk_target = 8192;

/// The writable view of elements [b, b + n) of a one-row quantized tensor whose groups run
/// along the row; b must be a multiple of the group size.
template <class Byte>
basic_quantized_view<Byte> row_part(basic_quantized_view<Byte> const& v, std::int64_t b,
                                    std::int64_t n) {
  std::int64_t const g = b / v.spec.group_cols;
  std::int64_t const sb = scale_bytes(v.spec.scale);
  return {
      v.spec, 1, n, v.codes + b, v.scales + sb * g, v.zero_points ? v.zero_points + g : nullptr};
}

}  // namespace detail

/// One moment of an adamw_state: an agoq quantized tensor of [1, n] for the 8-bit formats, or a
/// plain fp32 / bfloat16 array. Host memory; movable, not copyable.
class moment_storage {
 public:
  /// An empty moment.
  moment_storage() = default;

  /// A zero moment of n elements in format f (block size and rounding used by 8-bit formats).
  /// \throws agoq::invalid_argument for n < 0 or a block size below 1; std::bad_alloc.
  moment_storage(moment_format f, std::int64_t n, std::int64_t block, rounding_kind r)
      : format_(f), size_(n) {
    AGOQ_EXPECTS(n >= 0, "adamw_state: the size must be >= 0, got " + std::to_string(n));
    if (is_quantized(f)) {
      codes_ = quantized_tensor(moment_spec(f, block, r), 1, n);
    } else if (f == moment_format::f32) {
      f32_.assign(static_cast<std::size_t>(n), 0.0f);
    } else {
      bf16_.assign(static_cast<std::size_t>(n), std::uint16_t{0});
    }
  }

  /// The format.
  moment_format format() const noexcept { return format_; }
  /// Number of elements.
  std::int64_t size() const noexcept { return size_; }
  /// Bytes held (for the 8-bit formats the whole quantized buffer: codes, alignment padding,
  /// scales and, for uint8_sqrt, zero points).
  std::int64_t bytes() const noexcept {
    return is_quantized(format_) ? codes_.bytes() : moment_bytes(format_, size_, 1);
  }
  /// The quantized tensor of an 8-bit format (a 0x0 tensor otherwise), e.g. to checkpoint it.
  quantized_tensor const& quantized() const noexcept { return codes_; }
  /// Writable access to the quantized tensor (restoring a checkpoint).
  quantized_tensor& quantized() noexcept { return codes_; }
  /// The values of an f32 moment (empty for the other formats), e.g. to checkpoint them.
  std::span<float const> f32() const noexcept { return f32_; }
  /// Writable values of an f32 moment (restoring a checkpoint).
  std::span<float> f32() noexcept { return f32_; }
  /// The bfloat16 bits of a bf16 moment (empty for the other formats).
  std::span<std::uint16_t const> bf16() const noexcept { return bf16_; }
  /// Writable bfloat16 bits of a bf16 moment (restoring a checkpoint).
  std::span<std::uint16_t> bf16() noexcept { return bf16_; }

  /// The moment's values (v itself, also for the sqrt formats) as floats, for inspection and
  /// tests. Host only; synchronous; allocates n floats.
  std::vector<float> values() const {
    std::vector<float> out(static_cast<std::size_t>(size_));
    float const* p = load(0, size_, out.data());
    if (p != out.data()) std::memcpy(out.data(), p, static_cast<std::size_t>(size_) * 4);
    if (stores_sqrt(format_)) {
      for (float& x : out) x = x * x;
    }
    return out;
  }

  /// The stored numbers of elements [b, b + n) as floats (sqrt(v) for the sqrt formats): a
  /// pointer into the storage for f32, otherwise `scratch` filled by decoding on executor `ex`.
  float const* load(std::int64_t b, std::int64_t n, float* scratch, host_executor ex = host) const {
    switch (format_) {
      case moment_format::f32:
        return f32_.data() + b;
      case moment_format::bf16:
        for (std::int64_t i = 0; i < n; ++i) scratch[i] = numeric::bf16_bits_to_float(bf16_[b + i]);
        return scratch;
      default: {
        dequantize(ex, detail::row_part(codes_.view(), b, n), as_row(scratch, n));
        return scratch;
      }
    }
  }

  /// Where the update writes elements [b, b + n): the storage itself for f32, else `scratch`.
  float* target(std::int64_t b, float* scratch) noexcept {
    return format_ == moment_format::f32 ? f32_.data() + b : scratch;
  }

  /// Stores elements [b, b + n) from `x` (a no-op when x is the f32 storage itself); the 8-bit
  /// formats requantize with fresh block scales, stochastic rounding drawing stream positions
  /// b .. b + n - 1 under `seed`, on executor `ex`. Returns the non-finite count of quantize (0 for
  /// valid steps).
  std::int64_t store(std::int64_t b, std::int64_t n, float const* x, std::uint64_t seed,
                     host_executor ex = host) {
    switch (format_) {
      case moment_format::f32:
        if (x != f32_.data() + b) std::memcpy(f32_.data() + b, x, static_cast<std::size_t>(n) * 4);
        return 0;
      case moment_format::bf16:
        for (std::int64_t i = 0; i < n; ++i) bf16_[b + i] = numeric::float_to_bf16_bits(x[i]);
        return 0;
      default:
        return quantize(ex, as_row(x, n), detail::row_part(codes_.view(), b, n),
                        quantize_options{seed, static_cast<std::uint64_t>(b)});
    }
  }

 private:
  moment_format format_ = moment_format::f32;
  std::int64_t size_ = 0;
  quantized_tensor codes_;
  std::vector<float> f32_;
  std::vector<std::uint16_t> bf16_;
};

/// The state of AdamW over n parameters: the two moments and the step count, plus the chunk
/// scratch of the fused step (a few chunks of fp32, independent of n). Zero-initialised (every
/// 8-bit block has scale 0 and decodes to 0). Host memory; movable, not copyable; one step at a
/// time per state.
class adamw_state {
 public:
  /// A zero state for n parameters.
  /// \throws agoq::invalid_argument for n < 0, a block size below 1, or a first moment format
  /// other than f32, bf16 or int8_linear (the sqrt and E4M3 codes assume v >= 0);
  /// std::bad_alloc when memory runs out.
  explicit adamw_state(std::int64_t n, adamw_state_options const& opt = {})
      : opt_(check_options(opt)),
        m_(opt.m, n, opt.block, opt.m_rounding),
        v_(opt.v, n, opt.block, opt.v_rounding) {
    chunk_ = std::max<std::int64_t>(opt.block, detail::adamw_chunk_target / opt.block * opt.block);
    std::size_t const k = static_cast<std::size_t>(std::min<std::int64_t>(chunk_, n));
    scratch_m_.resize(k);
    scratch_v_.resize(k);
    scratch_g_.resize(k);
  }

  /// Number of parameters.
  std::int64_t size() const noexcept { return m_.size(); }
  /// The options given at construction.
  adamw_state_options const& options() const noexcept { return opt_; }
  /// Steps taken so far (the next step is step() + 1, which sets the bias correction).
  std::int64_t step() const noexcept { return step_; }
  /// Sets the step count (e.g. when resuming from a checkpoint). \throws agoq::invalid_argument
  /// for t < 0.
  void set_step(std::int64_t t) {
    AGOQ_EXPECTS(t >= 0, "adamw_state::set_step: negative step " + std::to_string(t));
    step_ = t;
  }
  /// The first moment.
  moment_storage const& m() const noexcept { return m_; }
  /// The second moment.
  moment_storage const& v() const noexcept { return v_; }
  /// Writable first moment (restoring a checkpoint).
  moment_storage& m() noexcept { return m_; }
  /// Writable second moment (restoring a checkpoint).
  moment_storage& v() noexcept { return v_; }
  /// Bytes of optimizer state: both moments, codes, scales, zero points and alignment padding
  /// (the chunk scratch, which does not grow with n, is not counted).
  std::int64_t bytes() const noexcept { return m_.bytes() + v_.bytes(); }
  /// bytes() / size(): 2.0625 for the default formats at block 128 when n is a multiple of 128
  /// (plus at most 2 x 127 bytes of padding in all), 8 for fp32 Adam. 0 for an empty state.
  double bytes_per_parameter() const noexcept {
    return size() == 0 ? 0.0 : static_cast<double>(bytes()) / static_cast<double>(size());
  }

  /// Elements per chunk of the fused step.
  std::int64_t chunk() const noexcept { return chunk_; }

 private:
  template <class P, class Source>
  friend std::int64_t adamw_step_impl(host_executor, adamw_state&, adamw_hyper const&, P*, float*,
                                      Source&&);

  /// The block size (used by every format: it sets the step's chunk) and the first moment's
  /// format.
  static adamw_state_options const& check_options(adamw_state_options const& o) {
    AGOQ_EXPECTS(o.block >= 1,
                 "adamw_state: the block size must be at least 1, got " + std::to_string(o.block));
    AGOQ_EXPECTS(o.m == moment_format::f32 || o.m == moment_format::bf16 ||
                     o.m == moment_format::int8_linear,
                 std::string("adamw_state: the first moment is signed; it takes f32, bf16 or "
                             "int8_linear, got ") +
                     format_name(o.m));
    return o;
  }

  adamw_state_options opt_;
  moment_storage m_;
  moment_storage v_;
  std::int64_t step_ = 0;
  std::int64_t chunk_ = 0;
  std::vector<float> scratch_m_;
  std::vector<float> scratch_v_;
  std::vector<float> scratch_g_;
};

namespace detail {

/// Decodes elements [b, b + n) (row-major order) of an 8-bit quantized tensor of any grouping
/// into y, run by run of elements that share a row and a group (numeric::decode per element, the
/// vectorized segment loop where compiled and `simd` is set).
template <code_format Code>
void decode_flat(const_quantized_view const& q, quantized_layout const& l, std::int64_t b,
                 std::int64_t n, float* y, bool simd) {
  std::int64_t i = b;
  std::int64_t const end = b + n;
  while (i < end) {
    std::int64_t const r = i / l.cols;
    std::int64_t const c = i - r * l.cols;
    std::int64_t const tile_end = std::min(l.cols, (c / l.tile.cols + 1) * l.tile.cols);
    std::int64_t const run = std::min(tile_end - c, end - i);
    group_params const p = load_group_params(q, l.group_of(r, c));
    std::uint8_t const* codes = q.codes + r * l.code_row_bytes + c;
    if (simd) {
      agoq::detail::host::decode_segment_simd<Code>(codes, run, p, y + (i - b));
    } else {
      agoq::detail::host::decode_segment<Code>(codes, run, p, y + (i - b));
    }
    i += run;
  }
}

/// Decodes elements [first, first + count) (row-major order, 0 <= count <= N) of an 8-bit
/// quantized view of any grouping into v[0, count) and zeroes v[count, N); the run may cross rows.
/// Element by element with numeric::decode, so the floats equal decode_flat's. Host and device:
/// the CUDA step (optim/adamw.cuh) reads a quantized gradient through it.
template <code_format Code, int N>
AGOQ_HOST_DEVICE inline void decode_flat_run(const_quantized_view const& q,
                                             quantized_layout const& l, std::int64_t first,
                                             int count, float (&v)[N]) noexcept {
  static_assert(Code::bits == 8, "decode_flat_run: one code per byte");
  AGOQ_UNROLL
  for (int i = 0; i < N; ++i) v[i] = 0.0f;
  if (count <= 0) return;
  std::int64_t row = first / l.cols;
  std::int64_t col = first - row * l.cols;
  device::group_cursor cursor(row, col, l.tile, l.group_grid_cols);
  std::int64_t current = cursor.group;
  group_params p = load_group_params(q, current);
  for (int i = 0; i < count && i < N; ++i) {
    if (col == l.cols) {
      ++row;
      col = 0;
      cursor = device::group_cursor(row, 0, l.tile, l.group_grid_cols);
    }
    cursor.advance(col);
    if (cursor.group != current) {
      current = cursor.group;
      p = load_group_params(q, current);
    }
    v[i] = decode<Code>(q.codes[row * l.code_row_bytes + col], p);
    ++col;
  }
}

/// Gradient source over a span of float, bfloat16 or half.
template <class T>
struct span_gradient {
  T const* g;
  float const* chunk(std::int64_t b, std::int64_t n, float* scratch, host_executor) const {
    if constexpr (std::is_same_v<T, float>) {
      return g + b;
    } else {
      for (std::int64_t i = 0; i < n; ++i) scratch[i] = numeric::to_float(g[b + i]);
      return scratch;
    }
  }
};

/// Gradient source over an 8-bit quantized view, decoded chunk by chunk.
struct quantized_gradient {
  const_quantized_view q;
  quantized_layout l;
  float const* chunk(std::int64_t b, std::int64_t n, float* scratch, host_executor ex) const {
    dispatch_code(q.spec, [&](auto code) {
      using Code = decltype(code);
      if constexpr (Code::bits == 8) decode_flat<Code>(q, l, b, n, scratch, ex.simd);
    });
    return scratch;
  }
};

}  // namespace detail

/// The fused loop behind every adamw_step overload: weights w (float or bfloat16), an optional
/// fp32 master copy, a gradient source. Returns the number of skipped (non-finite gradient)
/// elements. The executor's `simd` flag picks the vector or the portable loops (same bits).
template <class P, class Source>
std::int64_t adamw_step_impl(host_executor ex, adamw_state& s, adamw_hyper const& h, P* w,
                             float* master, Source&& grad) {
  adamw_coefficients const c = make_coefficients(h, s.step_ + 1);
  std::int64_t const n = s.size();
  std::uint64_t const t = static_cast<std::uint64_t>(s.step_ + 1);
  std::uint64_t const seed_m = stream_seed(s.opt_.seed, t, 0);
  std::uint64_t const seed_v = stream_seed(s.opt_.seed, t, 1);
  bool const sqrt_v = stores_sqrt(s.v_.format());
  // The chunks are independent (whole blocks, stream positions by element index): split among
  // the executor's threads, one thread with the state's scratch, more with their own.
  std::int64_t const chunk = s.chunk_;
  std::int64_t const chunks = (n + chunk - 1) / chunk;
  int const threads = agoq::detail::host::call_threads(ex, chunks, chunk);
  host_executor const one{.simd = ex.simd};
  std::int64_t const skipped = agoq::detail::host::parallel_sum(
      ex.pool, threads, chunks, [&](std::int64_t c0, std::int64_t c1) {
        std::vector<float> own(threads > 1 ? static_cast<std::size_t>(3 * chunk) : 0);
        float* const sg = threads > 1 ? own.data() : s.scratch_g_.data();
        float* const sm = threads > 1 ? own.data() + chunk : s.scratch_m_.data();
        float* const sv = threads > 1 ? own.data() + 2 * chunk : s.scratch_v_.data();
        std::int64_t count = 0;
        for (std::int64_t b = c0 * chunk; b < std::min(n, c1 * chunk); b += chunk) {
          std::int64_t const k = std::min(chunk, n - b);
          float const* g = grad.chunk(b, k, sg, one);
          float const* m_in = s.m_.load(b, k, sm, one);
          float const* v_in = s.v_.load(b, k, sv, one);
          float* m = s.m_.target(b, sm);
          float* v = s.v_.target(b, sv);
          if (m != m_in) std::memmove(m, m_in, static_cast<std::size_t>(k) * 4);
          if (v != v_in) std::memmove(v, v_in, static_cast<std::size_t>(k) * 4);
          float* const mb = master ? master + b : nullptr;
          std::int64_t const ok =
              sqrt_v ? detail::adamw_update_run<true>(c, g, w + b, mb, m, v, k, ex.simd)
                     : detail::adamw_update_run<false>(c, g, w + b, mb, m, v, k, ex.simd);
          count += k - ok;
          s.m_.store(b, k, m, seed_m, one);
          s.v_.store(b, k, v, seed_v, one);
        }
        return count;
      });
  ++s.step_;
  return skipped;
}

namespace detail {

inline void check_step_sizes(adamw_state const& s, std::int64_t params, std::int64_t grads,
                             char const* what) {
  AGOQ_EXPECTS(params == s.size(), std::string("adamw_step: ") + what + " has " +
                                       std::to_string(params) + " elements, the state " +
                                       std::to_string(s.size()));
  AGOQ_EXPECTS(grads == s.size(), "adamw_step: the gradient has " + std::to_string(grads) +
                                      " elements, the state " + std::to_string(s.size()));
}

inline quantized_gradient check_quantized_gradient(const_quantized_view const& g) {
  g.validate();
  AGOQ_EXPECTS(g.spec.bits == 8,
               "adamw_step: a quantized gradient must have 8-bit codes, got " + g.spec.name());
  return {g, g.layout()};
}

template <class T>
void check_pointer(T const* p, std::int64_t n, char const* what) {
  AGOQ_EXPECTS(p != nullptr || n == 0, std::string("adamw_step: null ") + what + " pointer");
}

}  // namespace detail

/// One fused AdamW step on fp32 parameters with a float, bfloat16 or half gradient (same size).
/// Increments the state's step count and returns the number of elements skipped because their
/// gradient was NaN or ±Inf (their parameter and moments are left unchanged). Host only;
/// synchronous. The executor's `simd` flag picks the AVX-512 loops (where compiled) or the
/// portable ones; both give the same bits.
/// \throws agoq::invalid_argument on mismatched sizes, null pointers or invalid hyper-parameters
/// (then nothing is modified).
template <class Grad>
requires element_type<std::remove_const_t<Grad>> std::int64_t adamw_step(host_executor ex,
                                                                         adamw_state& state,
                                                                         adamw_hyper const& h,
                                                                         std::span<float> params,
                                                                         std::span<Grad> grads) {
  auto const np = static_cast<std::int64_t>(params.size());
  auto const ng = static_cast<std::int64_t>(grads.size());
  detail::check_step_sizes(state, np, ng, "the parameter");
  detail::check_pointer(params.data(), np, "parameter");
  detail::check_pointer(grads.data(), ng, "gradient");
  using G = std::remove_const_t<Grad>;
  return adamw_step_impl(ex, state, h, params.data(), static_cast<float*>(nullptr),
                         detail::span_gradient<G>{grads.data()});
}

/// One fused AdamW step on fp32 parameters reading the gradient straight from an 8-bit quantized
/// tensor (e.g. gradient::gradient_buffer::view(), int8_g128_sym_sr_f32), decoded group by group
/// inside the loop: the result is bit-identical to dequantizing it into floats first and calling
/// the span overload. Elements are taken in row-major order; any grouping and 8-bit code family
/// works. Host only; synchronous; returns the skipped-element count as above.
/// \throws agoq::invalid_argument on an invalid view, codes that are not 8-bit, mismatched
/// sizes, null pointers or invalid hyper-parameters.
inline std::int64_t adamw_step(host_executor ex, adamw_state& state, adamw_hyper const& h,
                               std::span<float> params, const_quantized_view grads) {
  detail::check_step_sizes(state, static_cast<std::int64_t>(params.size()), grads.size(),
                           "the parameter");
  detail::check_pointer(params.data(), static_cast<std::int64_t>(params.size()), "parameter");
  return adamw_step_impl(ex, state, h, params.data(), static_cast<float*>(nullptr),
                         detail::check_quantized_gradient(grads));
}

/// One fused AdamW step on bfloat16 weights. With a non-empty `master` (fp32, same size) the
/// update runs on the master copy and the weights receive its round-to-nearest-even bfloat16;
/// with an empty `master` the weights are read, updated in fp32 and rounded back (updates below
/// half a bfloat16 ulp are then lost, which is why a master copy is recommended). Gradient as in
/// the float overload. Host only; synchronous; returns the skipped-element count.
/// \throws agoq::invalid_argument on mismatched sizes, null pointers or invalid hyper-parameters.
template <class Grad>
requires element_type<std::remove_const_t<Grad>> std::int64_t adamw_step(
    host_executor ex, adamw_state& state, adamw_hyper const& h, std::span<bfloat16> weights,
    std::span<float> master, std::span<Grad> grads) {
  auto const nw = static_cast<std::int64_t>(weights.size());
  detail::check_step_sizes(state, nw, static_cast<std::int64_t>(grads.size()), "the weight");
  AGOQ_EXPECTS(master.empty() || static_cast<std::int64_t>(master.size()) == nw,
               "adamw_step: the master copy has " + std::to_string(master.size()) +
                   " elements, the weights " + std::to_string(nw));
  detail::check_pointer(weights.data(), nw, "weight");
  detail::check_pointer(grads.data(), nw, "gradient");
  using G = std::remove_const_t<Grad>;
  return adamw_step_impl(ex, state, h, weights.data(), master.empty() ? nullptr : master.data(),
                         detail::span_gradient<G>{grads.data()});
}

/// The bfloat16-weight step reading an 8-bit quantized gradient (see the overloads above).
/// \throws agoq::invalid_argument as they do.
inline std::int64_t adamw_step(host_executor ex, adamw_state& state, adamw_hyper const& h,
                               std::span<bfloat16> weights, std::span<float> master,
                               const_quantized_view grads) {
  auto const nw = static_cast<std::int64_t>(weights.size());
  detail::check_step_sizes(state, nw, grads.size(), "the weight");
  AGOQ_EXPECTS(master.empty() || static_cast<std::int64_t>(master.size()) == nw,
               "adamw_step: the master copy has " + std::to_string(master.size()) +
                   " elements, the weights " + std::to_string(nw));
  detail::check_pointer(weights.data(), nw, "weight");
  return adamw_step_impl(ex, state, h, weights.data(), master.empty() ? nullptr : master.data(),
                         detail::check_quantized_gradient(grads));
}

}  // namespace agoq::optim
