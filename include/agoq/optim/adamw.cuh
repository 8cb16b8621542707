/// \file
/// The CUDA executor of the 8-bit AdamW step (optim/adamw.hpp): the same update on device
/// buffers, bit-identical to the host step. Needs nvcc.
///
/// For adamw_state's default formats (int8_g128_sym_sr_f32 codes of m, fp8e4m3_g128_sr_f32 codes
/// of sqrt(v)) one kernel reads each parameter, gradient and moment once and writes each once.
/// Where every buffer is aligned for whole-run vector accesses (the usual case) it takes its linear
/// path: 8 lanes hold one 128-element block, two runs of 8 elements each
/// (device::linear_group_slot), load the runs and the block's two scales before using any, decode
/// the moments (device::dequantize_packed), run adamw_update (the host step's function) per
/// element, reduce the block's new absolute maxima with shuffles (exact in any order) and encode
/// their runs (device::quantize_group_slot); the ragged last block, if any, and misaligned buffers
/// take the general path, 16 lanes of one run per block (device::quantize_group_lanes). Stochastic
/// rounding draws what the host step draws: stream_seed(seed, t, 0) for m and
/// stream_seed(seed, t, 1) for v, element i at stream position i. So params, codes and scales
/// equal the host step's bit for bit: tests/device/adamw_device_test.cu checks it (the kernel
/// before the linear path passed it on an H200; bench/device_check.sh runs it).
///
/// Every other state the host step takes (f32 or bf16 moments, the other 8-bit codes, nearest
/// rounding, blocks of 32, 64 or 256) runs through a second kernel on the general path alone, whose
/// lanes read and write each moment as its format says (a branch on values every thread shares);
/// its results equal the host step's bit for bit too. Blocks of other sizes throw
/// agoq::unsupported_scheme (the host step takes any).
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "../detail/gpu/kernels.cuh"
#include "../device/epilogue.cuh"
#include "../quantize.cuh"
#include "adamw.hpp"

namespace agoq::optim {

/// A non-owning view of one AdamW moment in device memory, in any moment_format: the [1, n]
/// quantized view of an 8-bit format (spec moment_spec(format, block, rounding): codes, block
/// scales and, for uint8_sqrt, zero points), or the n floats (f32) or bfloat16 bit patterns (bf16)
/// of a plain one. Zero bytes are a zero moment in every format. Trivially copyable; make one with
/// moment_of_buffer.
struct device_moment {
  moment_format format = moment_format::int8_linear;  ///< how the moment is stored
  quantized_view codes;       ///< the 8-bit formats' [1, n] view (unused by f32 and bf16)
  void* values = nullptr;     ///< f32 / bf16: n floats or bfloat16s (null for the 8-bit formats)
  std::int64_t elements = 0;  ///< f32 / bf16: n (an 8-bit format's n is codes.cols)

  /// Number of elements.
  AGOQ_HOST_DEVICE std::int64_t size() const noexcept {
    return is_quantized(format) ? codes.cols : elements;
  }
};

/// The alignment a moment's buffer needs in format f: its element's size for f32 and bf16, none
/// for the 8-bit formats. Host and device.
AGOQ_HOST_DEVICE constexpr std::uintptr_t moment_alignment(moment_format f) noexcept {
  return f == moment_format::f32 ? 4 : f == moment_format::bf16 ? 2 : 1;
}

/// The view of a moment of n elements stored in format f (block size `block` and rounding `r`
/// for the 8-bit formats) over `buffer`: device memory of at least moment_bytes(f, n, block)
/// bytes, aligned to its element (4 bytes for f32, 2 for bf16, any address for the 8-bit formats),
/// zero-filled for a fresh moment. Host only.
/// \throws agoq::invalid_argument for n < 0, a block size below 1, or a null or misaligned
/// buffer with n > 0.
inline device_moment moment_of_buffer(moment_format f, std::int64_t n, std::int64_t block,
                                      rounding_kind r, void* buffer) {
  std::int64_t const bytes = moment_bytes(f, n, block);
  AGOQ_EXPECTS(buffer != nullptr || bytes == 0, "moment_of_buffer: null buffer");
  std::uintptr_t const align = moment_alignment(f);
  AGOQ_EXPECTS((reinterpret_cast<std::uintptr_t>(buffer) & (align - 1)) == 0,
               std::string("moment_of_buffer: a ") + format_name(f) + " moment must be " +
                   std::to_string(align) + "-byte aligned");
  device_moment d;
  d.format = f;
  if (is_quantized(f)) {
    d.codes = view_of_buffer(moment_spec(f, block, r), 1, n, static_cast<std::uint8_t*>(buffer));
  } else {
    d.values = buffer;
    d.elements = n;
  }
  return d;
}

/// A non-owning view of an AdamW state in device memory: the two moments, the steps taken so far
/// and the stochastic rounding seed. Trivially copyable; lives on the host (each adamw_step_async
/// reads `step` and increments it there, the kernel receives the rest by value). Copying an
/// adamw_state's moment bytes into such views (copy_state) continues its run exactly.
struct adamw_device_state {
  device_moment m;         ///< first moment: f32, bf16 or int8_linear
  device_moment v;         ///< second moment: any format (v itself, or sqrt(v) for the sqrt ones)
  std::int64_t step = 0;   ///< steps taken so far (the next step is step + 1)
  std::uint64_t seed = 0;  ///< as adamw_state_options::seed

  /// Number of parameters.
  std::int64_t size() const noexcept { return m.size(); }
};

/// A zero state of n parameters stored as `opt` says (formats, block size, roundings, seed; the
/// device step takes blocks of 32, 64, 128 or 256) over two buffers of device memory of
/// moment_bytes(opt.m, n, opt.block) and moment_bytes(opt.v, n, opt.block) bytes, zero-filled by
/// the caller and aligned as moment_of_buffer says. Host only.
/// \throws agoq::invalid_argument as moment_of_buffer, or for a first moment format other than
/// f32, bf16 or int8_linear.
inline adamw_device_state adamw_device_state_of_buffers(std::int64_t n,
                                                        adamw_state_options const& opt,
                                                        void* m_buffer, void* v_buffer) {
  AGOQ_EXPECTS(!is_quantized(opt.m) || opt.m == moment_format::int8_linear,
               std::string("adamw_device_state_of_buffers: the first moment is signed; it takes "
                           "f32, bf16 or int8_linear, got ") +
                   format_name(opt.m));
  adamw_device_state s;
  s.m = moment_of_buffer(opt.m, n, opt.block, opt.m_rounding, m_buffer);
  s.v = moment_of_buffer(opt.v, n, opt.block, opt.v_rounding, v_buffer);
  s.seed = opt.seed;
  return s;
}

/// The spec of adamw_state's default first moment (int8_g128_sym_sr_f32), which the device
/// step's linear path takes. Host only.
inline spec adamw_device_m_spec() {
  return moment_spec(moment_format::int8_linear, 128, rounding_kind::stochastic);
}

/// The spec of adamw_state's default second moment (fp8e4m3_g128_sr_f32 of sqrt(v)), which the
/// device step's linear path takes. Host only.
inline spec adamw_device_v_spec() {
  return moment_spec(moment_format::e4m3_sqrt, 128, rounding_kind::stochastic);
}

namespace detail::gpu {

// The executor's device helpers (load_run, store_run, grid_for, ...).
namespace base = agoq::detail::gpu;

/// Lanes per 128-element block of the device step's general path (8 elements each), and its log2.
inline constexpr int adamw_lanes_log2 = 4;
inline constexpr int adamw_lanes = 1 << adamw_lanes_log2;
/// Elements per block scale of the device step.
inline constexpr std::int64_t adamw_block = std::int64_t{adamw_lanes} * base::run;
/// Runs of one block that a thread of the linear path holds (log2), so 16 / 2^this lanes hold a
/// block. Two (92 registers on sm_90): four took 126 registers for the same 2 blocks of 256
/// threads per SM, kept predicates in registers and left the loop's code per parameter where it
/// was (242 instructions against 247, sm_90 SASS).
inline constexpr int adamw_slot_runs_log2 = 1;
inline constexpr int adamw_slot_runs = 1 << adamw_slot_runs_log2;

/// Gradient source of the device step over a span of float, bfloat16 or half.
template <class T>
struct span_gradient_source {
  T const* g;
  /// Loads elements [first, first + count) as floats (0 past count).
  __device__ void load(std::int64_t first, int count, float (&v)[base::run]) const noexcept {
    base::load_run(g + first, count, v);
  }
  /// Whether load_whole may be used: whole runs at a multiple of the run length are aligned.
  AGOQ_HOST_DEVICE bool whole_runs_aligned() const noexcept { return base::aligned(g, 16); }
  /// Loads the whole run at `first` (a multiple of the run length) with vector loads.
  __device__ void load_whole(std::int64_t first, float (&v)[base::run]) const noexcept {
    base::load_aligned_run<true>(g + first, v);
  }
};

/// Gradient source over an 8-bit quantized view of any grouping, elements in row-major order
/// (a run may cross a row of the view), decoded like the host step's decode_flat.
template <class Code>
struct quantized_gradient_source {
  const_quantized_view q;
  quantized_layout l;
  /// log2 G where a whole run decodes from one load of codes and one of its group's parameters
  /// (groups of G consecutive elements of one row, G a power of two of at least 8, that tile the
  /// elements in row-major order, with aligned codes and scales: a gradient_buffer's view, for
  /// one), else -1.
  int group_log2 = -1;

  /// The source of `q` (host): group_log2 as documented above.
  quantized_gradient_source(const_quantized_view const& view, quantized_layout const& layout)
      : q(view), l(layout) {
    std::int64_t const g = l.tile.cols;
    if (l.tile.rows == 1 && g >= base::run && (g & (g - 1)) == 0 &&
        (l.rows == 1 || l.cols % g == 0) && base::params_and_codes_aligned<8>(q)) {
      group_log2 = std::countr_zero(static_cast<std::uint64_t>(g));
    }
  }
  /// Loads elements [first, first + count) as floats (0 past count).
  __device__ void load(std::int64_t first, int count, float (&v)[base::run]) const noexcept {
    optim::detail::decode_flat_run<Code>(q, l, first, count, v);
  }
  /// load_whole reads at any address.
  AGOQ_HOST_DEVICE bool whole_runs_aligned() const noexcept { return true; }
  /// Loads the whole run at `first` (a multiple of the run length): one 8-byte load of codes and
  /// one of parameters (device::dequantize_packed, decode's values) where group_log2 allows, else
  /// as load.
  __device__ void load_whole(std::int64_t first, float (&v)[base::run]) const noexcept {
    if (group_log2 >= 0) {
      std::uint64_t const w =
          __ldg(reinterpret_cast<std::uint64_t const*>(q.codes) + first / base::run);
      device::dequantize_packed<Code>(w, base::load_params_aligned(q, first >> group_log2), v);
    } else {
      load(first, base::run, v);
    }
  }
};

/// Decodes the 8-bit codes of elements [first, first + count) of a [1, n] moment whose block
/// `group` holds them (0 past count). Device only.
template <class Code>
__device__ inline void load_moment(quantized_view const& q, std::int64_t first, int count,
                                   std::int64_t group, float (&v)[base::run]) noexcept {
  constexpr int n = base::run;
  AGOQ_UNROLL
  for (int i = 0; i < n; ++i) v[i] = 0.0f;
  if (count <= 0) return;
  std::uint8_t codes[n];
  device::unpack_fragment<8>(base::load_codes<8>(q.codes + first, count), codes);
  float d[n];
  device::dequantize_fragment<Code>(codes, load_group_params(q, group), d);
  AGOQ_UNROLL
  for (int i = 0; i < n; ++i) v[i] = i < count ? d[i] : 0.0f;
}

/// How the general path reads and writes a moment whose code is fixed at compile time: the
/// default state's, `Code` with stochastic rounding.
template <class Code>
struct coded_moment_access {
  /// Decodes the lane's run `r` of block `group` (0 past r.count).
  __device__ static void load(device_moment const& d, device::element_run const& r,
                              std::int64_t group, float (&v)[base::run]) noexcept {
    load_moment<Code>(d.codes, r.col, r.count, group, v);
  }
  /// Requantizes the block with its other `lanes` lanes (device::quantize_group_lanes).
  __device__ static void store(device_moment const& d, device::element_run const& r,
                               std::int64_t group, unsigned lane, int lanes,
                               float const (&v)[base::run], std::uint64_t seed) noexcept {
    device::quantize_group_lanes<Code, round_stochastic>(d.codes, 0, r.col, r.count, group, lane,
                                                         lanes, v, seed, 0);
  }
};

/// Calls fn(Code{}) with the code of an 8-bit moment format: int_sym<8> for int8_linear,
/// uint_asym<8> for uint8_sqrt, fp8_e4m3 for e4m3 and e4m3_sqrt. Without `Second` only int8_linear,
/// the one 8-bit format of the first moment (check_device_state), so only its code is compiled.
template <bool Second, class F>
__device__ inline void with_moment_code(moment_format f, F&& fn) {
  if constexpr (Second) {
    if (f == moment_format::uint8_sqrt) return fn(uint_asym<8>{});
    if (f == moment_format::e4m3 || f == moment_format::e4m3_sqrt) return fn(fp8_e4m3{});
  }
  fn(int_sym<8>{});
}

/// How the general path reads and writes a moment of any format (the first moment's when not
/// `Second`: f32, bf16 or int8_linear), chosen at run time by its format and its codes' rounding
/// (the same branch in every thread of the kernel).
template <bool Second>
struct any_moment_access {
  /// Decodes (or loads) the lane's run `r` of block `group` (0 past r.count).
  __device__ static void load(device_moment const& d, device::element_run const& r,
                              std::int64_t group, float (&v)[base::run]) noexcept {
    if (d.format == moment_format::f32) {
      base::load_run(static_cast<float const*>(d.values) + r.col, r.count, v);
    } else if (d.format == moment_format::bf16) {
      base::load_run(static_cast<bfloat16 const*>(d.values) + r.col, r.count, v);
    } else {
      with_moment_code<Second>(d.format, [&](auto code) {
        load_moment<decltype(code)>(d.codes, r.col, r.count, group, v);
      });
    }
  }
  /// Stores the run (rounded to nearest even for bf16) or requantizes the block with its other
  /// `lanes` lanes.
  __device__ static void store(device_moment const& d, device::element_run const& r,
                               std::int64_t group, unsigned lane, int lanes,
                               float const (&v)[base::run], std::uint64_t seed) noexcept {
    if (d.format == moment_format::f32) {
      base::store_run(static_cast<float*>(d.values) + r.col, r.count, v);
    } else if (d.format == moment_format::bf16) {
      base::store_run(static_cast<bfloat16*>(d.values) + r.col, r.count, v);
    } else {
      with_moment_code<Second>(d.format, [&](auto code) {
        using Code = decltype(code);
        quantized_view const& q = d.codes;
        if (q.spec.rounding == rounding_kind::stochastic) {
          device::quantize_group_lanes<Code, round_stochastic>(q, 0, r.col, r.count, group, lane,
                                                               lanes, v, seed, 0);
        } else {
          device::quantize_group_lanes<Code, round_nearest>(q, 0, r.col, r.count, group, lane,
                                                            lanes, v, seed, 0);
        }
      });
    }
  }
};

/// The step's arguments, as the kernels receive them.
template <class P, class Source>
struct adamw_step_args {
  adamw_coefficients c;
  P* w;           ///< weights (float or bfloat16)
  float* master;  ///< fp32 master copy, or null
  Source grad;    ///< gradient source
  device_moment m;
  device_moment v;
  std::uint64_t seed_m = 0;
  std::uint64_t seed_v = 0;

  /// Whether the default kernel's linear path applies: weights, master copy, gradient, codes and
  /// scales aligned for whole-run vector accesses and one-load scales. Host and device.
  AGOQ_HOST_DEVICE bool linear() const noexcept {
    return base::aligned(w, 16) && base::aligned(master, 16) && grad.whole_runs_aligned() &&
           base::params_and_codes_aligned<8>(m.codes) && base::params_and_codes_aligned<8>(v.codes);
  }
};

/// The general path's work for thread t of n parameters: lane t % 2^lanes_log2 of block
/// t / 2^lanes_log2 (blocks of 8 * 2^lanes_log2 elements) holds its 8 elements (fewer or none at
/// the end), reads them and
/// the moments (through MAccess and VAccess), updates them (v holding sqrt(v) when `sqrt_v`) and
/// writes them back, the block's other lanes requantizing 8-bit moments with it. Every lane of
/// the warp must call it together.
template <class MAccess, class VAccess, class P, class Source>
__device__ inline void adamw_lane(adamw_step_args<P, Source> const& a, std::int64_t n,
                                  std::int64_t t, int lanes_log2, bool sqrt_v,
                                  unsigned long long& bad) {
  constexpr int n_run = base::run;
  std::int64_t group = 0;
  device::element_run const r = device::group_lane_run(t, lanes_log2, 1, n, group);
  float g[n_run], mv[n_run], vv[n_run], p[n_run];
  a.grad.load(r.col, r.count, g);
  MAccess::load(a.m, r, group, mv);
  VAccess::load(a.v, r, group, vv);
  if (a.master != nullptr) {
    base::load_run(a.master + r.col, r.count, p);
  } else {
    base::load_run(a.w + r.col, r.count, p);
  }
  AGOQ_UNROLL
  for (int i = 0; i < n_run; ++i) {
    if (i < r.count) {
      bool const ok = sqrt_v ? adamw_update<true>(a.c, g[i], p[i], mv[i], vv[i])
                             : adamw_update<false>(a.c, g[i], p[i], mv[i], vv[i]);
      if (!ok) ++bad;
    }
  }
  if (a.master != nullptr) base::store_run(a.master + r.col, r.count, p);
  base::store_run(a.w + r.col, r.count, p);
  int const lanes = 1 << lanes_log2;
  auto const lane = static_cast<unsigned>(t & (lanes - 1));
  MAccess::store(a.m, r, group, lane, lanes, mv, a.seed_m);
  VAccess::store(a.v, r, group, lane, lanes, vv, a.seed_v);
}

/// The linear path's work for one slot (device::linear_group_slot) of a whole block: the thread
/// loads its adamw_slot_runs runs (gradient, parameters, both moments' codes) and the block's two
/// scales with one load each before using any, updates them, stores the parameters and, with the
/// block's other lanes, requantizes the moments once for all its runs
/// (device::quantize_group_slot). An inactive slot stores nothing. Every lane of the warp must
/// call it together.
template <class P, class Source>
__device__ inline void adamw_slot(adamw_step_args<P, Source> const& a,
                                  device::linear_slot const& slot, bool active,
                                  unsigned long long& bad) {
  constexpr int n_run = base::run;
  constexpr int runs = adamw_slot_runs;
  auto const* m_codes = reinterpret_cast<std::uint64_t const*>(a.m.codes.codes);
  auto const* v_codes = reinterpret_cast<std::uint64_t const*>(a.v.codes.codes);
  float g[runs][n_run], p[runs][n_run], mv[runs][n_run], vv[runs][n_run];
  std::uint64_t m_word[runs], v_word[runs];
  AGOQ_UNROLL
  for (int k = 0; k < runs; ++k) {
    std::int64_t const u = slot.first + k * slot.lanes;
    m_word[k] = m_codes[u];
    v_word[k] = v_codes[u];
    a.grad.load_whole(u * n_run, g[k]);
    if (a.master != nullptr) {
      base::load_aligned_run(a.master + u * n_run, p[k]);
    } else {
      base::load_aligned_run(a.w + u * n_run, p[k]);
    }
  }
  group_params const pm{reinterpret_cast<float const*>(a.m.codes.scales)[slot.group], 0};
  group_params const pv{reinterpret_cast<float const*>(a.v.codes.scales)[slot.group], 0};
  unsigned skipped = 0;
  AGOQ_UNROLL
  for (int k = 0; k < runs; ++k) {
    device::dequantize_packed<int_sym<8>>(m_word[k], pm, mv[k]);
    device::dequantize_packed<fp8_e4m3>(v_word[k], pv, vv[k]);
    AGOQ_UNROLL
    for (int i = 0; i < n_run; ++i) {
      skipped += adamw_update<true>(a.c, g[k][i], p[k][i], mv[k][i], vv[k][i]) ? 0u : 1u;
    }
    if (active) {
      std::int64_t const first = (slot.first + k * slot.lanes) * n_run;
      if (a.master != nullptr) base::store_aligned_run(a.master + first, p[k]);
      base::store_aligned_run(a.w + first, p[k]);
    }
  }
  if (active) bad += skipped;
  device::quantize_group_slot<int_sym<8>, round_stochastic>(a.m.codes, slot, active, mv, a.seed_m,
                                                            0);
  device::quantize_group_slot<fp8_e4m3, round_stochastic>(a.v.codes, slot, active, vv, a.seed_v, 0);
}

/// The fused step of the default state (int8_linear m, e4m3_sqrt v, blocks of 128, stochastic
/// rounding). Linear path (adamw_step_args::linear): the whole blocks in slots of adamw_slot_runs
/// runs (adamw_slot), then the ragged last block, if any, by the first warp of block 0
/// (adamw_lane). General path: thread t is lane t % 16 of block t / 16 (adamw_lane). Weights and
/// the optional fp32 master copy are read and written in place; `skipped` (may be null) counts
/// the elements whose gradient was not finite.
template <class P, class Source>
AGOQ_KERNEL void adamw_step_kernel(adamw_step_args<P, Source> a, unsigned long long* skipped) {
  using m_access = coded_moment_access<int_sym<8>>;
  using v_access = coded_moment_access<fp8_e4m3>;
  std::int64_t const n = a.m.codes.cols;
  unsigned long long bad = 0;
  if (a.linear()) {
    std::int64_t const whole = n / adamw_block;
    base::for_each_linear_slot(
        whole << adamw_lanes_log2, adamw_lanes_log2, adamw_slot_runs_log2,
        [&](device::linear_slot const& slot, bool active) { adamw_slot(a, slot, active, bad); });
    if (whole * adamw_block < n && blockIdx.x == 0 && threadIdx.x < 32) {
      adamw_lane<m_access, v_access>(a, n, (whole << adamw_lanes_log2) + threadIdx.x,
                                     adamw_lanes_log2, true, bad);
    }
  } else {
    std::int64_t const threads = (n + adamw_block - 1) / adamw_block * adamw_lanes;
    base::block_uniform_loop(threads, [&](std::int64_t t) {
      adamw_lane<m_access, v_access>(a, n, t, adamw_lanes_log2, true, bad);
    });
  }
  base::add_warp_count(skipped, bad);
}

/// The fused step of every other state: the general path alone, thread t lane t % 2^lanes_log2 of
/// block t / 2^lanes_log2 (blocks of 8 * 2^lanes_log2 elements), each moment read and written as
/// its format says (any_moment_access). Arguments as adamw_step_kernel's.
template <class P, class Source>
AGOQ_KERNEL void adamw_formats_kernel(adamw_step_args<P, Source> a, int lanes_log2,
                                      unsigned long long* skipped) {
  std::int64_t const n = a.m.size();
  bool const sqrt_v = stores_sqrt(a.v.format);
  unsigned long long bad = 0;
  base::block_uniform_loop(device::group_lane_threads(1, n, lanes_log2), [&](std::int64_t t) {
    adamw_lane<any_moment_access<false>, any_moment_access<true>>(a, n, t, lanes_log2, sqrt_v, bad);
  });
  base::add_warp_count(skipped, bad);
}

/// Whether a state takes adamw_step_kernel: the default formats, block size and roundings.
inline bool default_formats(adamw_device_state const& s) {
  return s.m.format == moment_format::int8_linear && s.v.format == moment_format::e4m3_sqrt &&
         s.m.codes.spec == adamw_device_m_spec() && s.v.codes.spec == adamw_device_v_spec();
}

/// The block size of a state's 8-bit moments (both have the same, check_device_state sees to it),
/// or adamw_block where both are f32 or bf16.
inline std::int64_t moment_block(adamw_device_state const& s) {
  if (is_quantized(s.m.format)) return s.m.codes.spec.group_cols;
  if (is_quantized(s.v.format)) return s.v.codes.spec.group_cols;
  return adamw_block;
}

/// Checks one moment (`which`) of a device state against n parameters: a known format, n
/// elements, and for f32 / bf16 a device pointer aligned to its element, for the 8-bit formats a
/// valid [1, n] device view whose spec is moment_spec(format, B, rounding) with B in {32, 64, 128,
/// 256}.
/// \throws agoq::invalid_argument, agoq::unsupported_scheme for another block size.
inline void check_device_moment(device_moment const& d, std::int64_t n, char const* which) {
  std::string const what = std::string("adamw_step_async: the ") + which;
  auto const f = static_cast<unsigned>(d.format);
  AGOQ_EXPECTS(f <= static_cast<unsigned>(moment_format::e4m3),
               what + " has an unknown moment format " + std::to_string(f));
  AGOQ_EXPECTS(d.size() == n, "adamw_step_async: the parameters have " + std::to_string(n) +
                                  " elements, the " + which + " " + std::to_string(d.size()));
  if (!is_quantized(d.format)) {
    AGOQ_EXPECTS(d.values != nullptr || n == 0, what + " has null values");
    AGOQ_EXPECTS(base::aligned(d.values, moment_alignment(d.format)),
                 what + " (" + format_name(d.format) + ") is not aligned to its elements");
    if (n > 0) base::check_device_pointer(d.values, "adamw_step_async");
    return;
  }
  d.codes.validate();
  spec const& s = d.codes.spec;
  AGOQ_EXPECTS(d.codes.rows == 1, what + " must be a [1, n] view, got [" +
                                      std::to_string(d.codes.rows) + ", " +
                                      std::to_string(d.codes.cols) + "]");
  AGOQ_EXPECTS(s.grouping == grouping_kind::group && s.group_rows == 1 && s.group_cols >= 1 &&
                   s == moment_spec(d.format, s.group_cols, s.rounding),
               what + " is stored as " + format_name(d.format) + ", which its codes " + s.name() +
                   " are not (see moment_spec)");
  std::int64_t const b = s.group_cols;
  if (b != 32 && b != 64 && b != 128 && b != 256) {
    throw unsupported_scheme(
        "agoq: adamw_step_async: the CUDA step takes blocks of 32, 64, 128 "
        "or 256 elements (the host step any), the " +
        std::string(which) + " has " + std::to_string(b));
  }
  base::check_device_view(d.codes, "adamw_step_async");
}

/// Checks a device state against n parameters: its step count, a first moment format that takes
/// signed values, both moments (check_device_moment), and one block size for two 8-bit moments.
/// \throws agoq::invalid_argument, agoq::unsupported_scheme as check_device_moment.
inline void check_device_state(adamw_device_state const& s, std::int64_t n) {
  AGOQ_EXPECTS(s.step >= 0, "adamw_step_async: negative step " + std::to_string(s.step));
  AGOQ_EXPECTS(!is_quantized(s.m.format) || s.m.format == moment_format::int8_linear,
               std::string("adamw_step_async: the first moment is signed; it takes f32, bf16 or "
                           "int8_linear, got ") +
                   format_name(s.m.format));
  check_device_moment(s.m, n, "first moment");
  check_device_moment(s.v, n, "second moment");
  AGOQ_EXPECTS(!is_quantized(s.m.format) || !is_quantized(s.v.format) ||
                   s.m.codes.spec.group_cols == s.v.codes.spec.group_cols,
               "adamw_step_async: the moments have blocks of " +
                   std::to_string(s.m.codes.spec.group_cols) + " and " +
                   std::to_string(s.v.codes.spec.group_cols) + " elements; they must share one");
}

/// Validates, computes step t's coefficients and seeds on the host, launches the kernel of the
/// state's formats, increments the step count.
template <class P, class Source>
void launch_adamw_step(cuda_executor ex, adamw_device_state& s, adamw_hyper const& h, P* w,
                       float* master, Source const& grad, std::int64_t* skipped) {
  adamw_coefficients const c = make_coefficients(h, s.step + 1);
  auto const t = static_cast<std::uint64_t>(s.step + 1);
  cudaStream_t const stream = ex.stream.get();
  auto* count = reinterpret_cast<unsigned long long*>(skipped);
  if (count != nullptr) AGOQ_CUDA_TRY(cudaMemsetAsync(count, 0, sizeof(*count), stream));
  std::int64_t const n = s.size();
  if (n > 0) {
    adamw_step_args<P, Source> const a{
        c, w, master, grad, s.m, s.v, stream_seed(s.seed, t, 0), stream_seed(s.seed, t, 1)};
    device::launch_policy const pol = base::current_policy();
    if (default_formats(s)) {
      // The linear path's slots (at least one warp for the ragged block), else the lanes.
      std::int64_t const blocks = (n + adamw_block - 1) / adamw_block;
      std::int64_t const threads =
          a.linear()
              ? std::max<std::int64_t>(blocks << (adamw_lanes_log2 - adamw_slot_runs_log2), 32)
              : blocks * adamw_lanes;
      base::launch(adamw_step_kernel<P, Source>, base::grid_for(threads, pol), pol.block_threads, 0,
                   stream, a, count);
    } else {
      int const lanes_log2 = device::group_lanes_log2(moment_block(s));
      base::launch(adamw_formats_kernel<P, Source>,
                   base::grid_for(device::group_lane_threads(1, n, lanes_log2), pol),
                   pol.block_threads, 0, stream, a, lanes_log2, count);
    }
    AGOQ_CUDA_TRY(cudaGetLastError());
  }
  ++s.step;
}

/// Host checks of a device pointer of n elements.
template <class T>
void check_step_pointer(T const* p, std::int64_t n, char const* what) {
  AGOQ_EXPECTS(p != nullptr || n == 0, std::string("adamw_step_async: null ") + what + " pointer");
  if (n > 0) base::check_device_pointer(p, "adamw_step_async");
}

/// The checks of the bfloat16-weight steps before their gradient's own: the state against the
/// weights, the gradient's size (`grad_size` elements), the master copy (empty or of the weights'
/// size), the weight and master pointers.
inline void check_weight_step(adamw_device_state const& s, std::span<bfloat16 const> weights,
                              std::span<float const> master, std::int64_t grad_size) {
  auto const nw = static_cast<std::int64_t>(weights.size());
  check_device_state(s, nw);
  AGOQ_EXPECTS(grad_size == nw, "adamw_step_async: the gradient has " + std::to_string(grad_size) +
                                    " elements, the weights " + std::to_string(nw));
  AGOQ_EXPECTS(master.empty() || static_cast<std::int64_t>(master.size()) == nw,
               "adamw_step_async: the master copy has " + std::to_string(master.size()) +
                   " elements, the weights " + std::to_string(nw));
  check_step_pointer(weights.data(), nw, "weight");
  check_step_pointer(master.data(), static_cast<std::int64_t>(master.size()), "master");
}

/// Runs f with the gradient source of an 8-bit quantized view (checked on the host).
/// \throws agoq::invalid_argument on an invalid view or codes that are not 8-bit.
template <class F>
void with_quantized_gradient(const_quantized_view const& g, F&& f) {
  g.validate();
  AGOQ_EXPECTS(
      g.spec.bits == 8,
      "adamw_step_async: a quantized gradient must have 8-bit codes, got " + g.spec.name());
  if (g.size() > 0) base::check_device_view(g, "adamw_step_async");
  quantized_layout const l = g.layout();
  dispatch_code(g.spec, [&](auto code) {
    using Code = decltype(code);
    if constexpr (Code::bits == 8) f(quantized_gradient_source<Code>(g, l));
  });
}

}  // namespace detail::gpu

/// One fused AdamW step on fp32 parameters (device memory) with a float, bfloat16 or half
/// gradient (device memory, same size), enqueued on `ex.stream`; the moments of `state` are
/// updated in place and state.step is incremented on the host. When `skipped` is not null it must
/// point to one device-accessible std::int64_t, which receives the number of elements whose
/// gradient was NaN or ±Inf (left unchanged) once the stream reaches the end of the call.
/// Parameters, codes and scales equal adamw_step(host, ...)'s bit for bit on the same state.
/// Pointers need no particular alignment. Does not synchronize.
/// \throws agoq::invalid_argument on mismatched sizes, null or pageable host pointers, invalid
/// views or hyper-parameters, a state whose moments do not match their formats (then nothing is
/// enqueued); agoq::unsupported_scheme on 8-bit moments in blocks other than 32, 64, 128 or 256;
/// agoq::cuda_error.
template <class Grad>
requires element_type<std::remove_const_t<Grad>>
void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                      std::span<float> params, std::span<Grad> grads,
                      std::int64_t* skipped = nullptr) {
  auto const np = static_cast<std::int64_t>(params.size());
  auto const ng = static_cast<std::int64_t>(grads.size());
  detail::gpu::check_device_state(state, np);
  AGOQ_EXPECTS(ng == np, "adamw_step_async: the gradient has " + std::to_string(ng) +
                             " elements, the parameters " + std::to_string(np));
  detail::gpu::check_step_pointer(params.data(), np, "parameter");
  detail::gpu::check_step_pointer(grads.data(), ng, "gradient");
  using G = std::remove_const_t<Grad>;
  detail::gpu::launch_adamw_step(ex, state, h, params.data(), static_cast<float*>(nullptr),
                                 detail::gpu::span_gradient_source<G>{grads.data()}, skipped);
}

/// The fp32-parameter step reading the gradient from an 8-bit quantized view in device memory
/// (a const_quantized_view or a quantized_view; any grouping and 8-bit code; elements in
/// row-major order), bit-identical to the host overload. Does not synchronize. A template only so
/// that its kernels (one pair per 8-bit code) are compiled where it is called, not in every
/// translation unit that includes this header.
/// \throws as the span overload, and agoq::invalid_argument on an invalid view or codes that are
/// not 8-bit.
template <class View>
requires std::convertible_to<View, const_quantized_view>
void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                      std::span<float> params, View const& quantized_grads,
                      std::int64_t* skipped = nullptr) {
  const_quantized_view const grads = quantized_grads;
  auto const np = static_cast<std::int64_t>(params.size());
  detail::gpu::check_device_state(state, np);
  AGOQ_EXPECTS(grads.size() == np, "adamw_step_async: the gradient has " +
                                       std::to_string(grads.size()) + " elements, the parameters " +
                                       std::to_string(np));
  detail::gpu::check_step_pointer(params.data(), np, "parameter");
  detail::gpu::with_quantized_gradient(grads, [&](auto const& source) {
    detail::gpu::launch_adamw_step(ex, state, h, params.data(), static_cast<float*>(nullptr),
                                   source, skipped);
  });
}

/// One fused AdamW step on bfloat16 weights (device memory). With a non-empty `master` (fp32,
/// device memory, same size) the update runs on the master copy and the weights receive its
/// round-to-nearest-even bfloat16; with an empty `master` the weights are updated through fp32
/// and rounded back. Gradient, `skipped` and guarantees as in the fp32 overload. Does not
/// synchronize.
/// \throws as the fp32 overload.
template <class Grad>
requires element_type<std::remove_const_t<Grad>>
void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                      std::span<bfloat16> weights, std::span<float> master, std::span<Grad> grads,
                      std::int64_t* skipped = nullptr) {
  auto const nw = static_cast<std::int64_t>(weights.size());
  detail::gpu::check_weight_step(state, weights, master, static_cast<std::int64_t>(grads.size()));
  detail::gpu::check_step_pointer(grads.data(), nw, "gradient");
  using G = std::remove_const_t<Grad>;
  detail::gpu::launch_adamw_step(ex, state, h, weights.data(),
                                 master.empty() ? nullptr : master.data(),
                                 detail::gpu::span_gradient_source<G>{grads.data()}, skipped);
}

/// The bfloat16-weight step reading an 8-bit quantized gradient in device memory (see the
/// overloads above; a template for the same reason). Does not synchronize.
/// \throws as they do.
template <class View>
requires std::convertible_to<View, const_quantized_view>
void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                      std::span<bfloat16> weights, std::span<float> master,
                      View const& quantized_grads, std::int64_t* skipped = nullptr) {
  const_quantized_view const grads = quantized_grads;
  detail::gpu::check_weight_step(state, weights, master, grads.size());
  detail::gpu::with_quantized_gradient(grads, [&](auto const& source) {
    detail::gpu::launch_adamw_step(ex, state, h, weights.data(),
                                   master.empty() ? nullptr : master.data(), source, skipped);
  });
}

namespace detail::gpu {

/// The format of a moment as copy_state's messages name it: "int8_linear (int8_g128_sym_sr_f32)".
inline std::string moment_name(moment_format f, spec const& codes) {
  return is_quantized(f) ? std::string(format_name(f)) + " (" + codes.name() + ")" : format_name(f);
}

/// Checks that a host state mirrors a device state: the same size, moment formats (and specs for
/// the 8-bit ones) and seed.
inline void check_mirror(adamw_state const& h, adamw_device_state const& d) {
  check_device_state(d, h.size());
  auto same = [](moment_storage const& hm, device_moment const& dm) {
    return hm.format() == dm.format &&
           (!is_quantized(dm.format) || hm.quantized().spec() == dm.codes.spec);
  };
  AGOQ_EXPECTS(same(h.m(), d.m) && same(h.v(), d.v),
               "copy_state: the host state stores m as " +
                   moment_name(h.m().format(), h.m().quantized().spec()) + " and v as " +
                   moment_name(h.v().format(), h.v().quantized().spec()) +
                   ", the device state m as " + moment_name(d.m.format, d.m.codes.spec) +
                   " and v as " + moment_name(d.v.format, d.v.codes.spec));
  AGOQ_EXPECTS(h.options().seed == d.seed,
               "copy_state: the host and device states have different seeds");
}

/// Copies n bytes in direction `kind` on `stream` (nothing for n = 0).
inline void copy_bytes(void* dst, void const* src, std::int64_t n, cudaMemcpyKind kind,
                       cudaStream_t stream) {
  if (n > 0) AGOQ_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n), kind, stream));
}

/// Copies the sections (codes, scales, zero points) of one view into another of the same spec
/// and extents, in direction `kind`, on `stream`.
template <class From, class To>
void copy_sections(From const& from, To const& to, cudaMemcpyKind kind, cudaStream_t stream) {
  quantized_layout const l = from.layout();
  copy_bytes(to.codes, from.codes, l.codes_bytes, kind, stream);
  copy_bytes(to.scales, from.scales, l.scales_bytes, kind, stream);
  copy_bytes(to.zero_points, from.zero_points, l.zero_points_bytes, kind, stream);
}

/// The values of a host f32 or bf16 moment, as bytes (writable through a writable storage).
template <class Storage>
auto* plain_values(Storage& h) noexcept {
  using bytes = std::conditional_t<std::is_const_v<Storage>, void const, void>;
  return h.format() == moment_format::f32 ? static_cast<bytes*>(h.f32().data())
                                          : static_cast<bytes*>(h.bf16().data());
}

/// Copies a device moment into the host storage of the same format and size, on `stream`.
inline void copy_moment(device_moment const& d, moment_storage& h, cudaStream_t stream) {
  if (is_quantized(d.format)) {
    copy_sections(d.codes, h.quantized().view(), cudaMemcpyDeviceToHost, stream);
  } else {
    copy_bytes(plain_values(h), d.values, moment_bytes(d.format, d.size(), 1),
               cudaMemcpyDeviceToHost, stream);
  }
}

/// Copies a host moment into the device view of the same format and size, on `stream`.
inline void copy_moment(moment_storage const& h, device_moment const& d, cudaStream_t stream) {
  if (is_quantized(d.format)) {
    copy_sections(h.quantized().view(), d.codes, cudaMemcpyHostToDevice, stream);
  } else {
    copy_bytes(d.values, plain_values(h), moment_bytes(d.format, d.size(), 1),
               cudaMemcpyHostToDevice, stream);
  }
}

}  // namespace detail::gpu

/// Copies a device state's moments and step count into the host state `h` (to checkpoint it with
/// write_adamw_state, optim/checkpoint.hpp), which must have the device state's size, moment
/// formats (the same specs for the 8-bit ones: adamw_state_options with the same block size and
/// roundings) and seed. Enqueued on `ex.stream` after the work before it; synchronizes the stream
/// before returning.
/// \throws agoq::invalid_argument when the states do not match (nothing is copied);
/// agoq::cuda_error.
inline void copy_state(cuda_executor ex, adamw_device_state const& d, adamw_state& h) {
  detail::gpu::check_mirror(h, d);
  cudaStream_t const stream = ex.stream.get();
  detail::gpu::copy_moment(d.m, h.m(), stream);
  detail::gpu::copy_moment(d.v, h.v(), stream);
  AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
  h.set_step(d.step);
}

/// Copies a host state's moments and step count into the device state `d` (to resume from
/// read_adamw_state), which must have the host state's size, moment formats and specs, and seed.
/// Enqueued on `ex.stream`; returns once the host bytes are staged (copies from pageable memory),
/// so the host state may change or go then; CUDA may wait for the stream's earlier work before
/// staging.
/// \throws agoq::invalid_argument when the states do not match (nothing is copied);
/// agoq::cuda_error.
inline void copy_state(cuda_executor ex, adamw_state const& h, adamw_device_state& d) {
  detail::gpu::check_mirror(h, d);
  cudaStream_t const stream = ex.stream.get();
  detail::gpu::copy_moment(h.m(), d.m, stream);
  detail::gpu::copy_moment(h.v(), d.v, stream);
  d.step = h.step();
}

}  // namespace agoq::optim
