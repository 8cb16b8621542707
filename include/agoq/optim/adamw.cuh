/// \file
/// The CUDA executor of the 8-bit AdamW step (optim/adamw.hpp): the same update on device
/// buffers, bit-identical to the host step. Needs nvcc.
///
/// One kernel reads each parameter, gradient and moment once and writes each once. Where every
/// buffer is aligned for whole-run vector accesses (the usual case) it takes its linear path:
/// 8 lanes hold one 128-element block, two runs of 8 elements each (device::linear_group_slot),
/// load the runs and the block's two scales before using any, decode the moments
/// (device::dequantize_packed), run adamw_update (the host step's function) per element, reduce
/// the block's new absolute maxima with shuffles (exact in any order) and encode their runs
/// (device::quantize_group_slot); the ragged last block, if any, and misaligned buffers take the
/// general path, 16 lanes of one run per block (device::quantize_group_lanes). Stochastic
/// rounding draws what the host step draws: stream_seed(seed, t, 0) for m and
/// stream_seed(seed, t, 1) for v, element i at stream position i. So params, codes and scales
/// equal the host step's bit for bit: tests/device/adamw_device_test.cu checks it (the kernel
/// before the linear path passed it on an H200; bench/device_check.sh runs it).
///
/// Supported state formats are adamw_state's defaults: m as int8_g128_sym_sr_f32 (int8_linear),
/// v as fp8e4m3_g128_sr_f32 codes of sqrt(v) (e4m3_sqrt). Other moment formats, block sizes or
/// roundings throw agoq::unsupported_scheme (the host step takes them).
#pragma once

#include <algorithm>
#include <bit>
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

/// A non-owning view of an AdamW state in device memory: the two quantized moments (views of
/// [1, n] tensors, e.g. from view_of_buffer over a cudaMalloc'ed buffer of
/// make_layout(adamw_device_m_spec(), 1, n).total_bytes bytes, zero-filled for a fresh state), the
/// steps taken so far and the stochastic rounding seed. Trivially copyable; lives on the host
/// (each adamw_step_async reads `step` and increments it there, the kernel receives the rest by
/// value). Copying an adamw_state's moment bytes into such views continues its run exactly.
struct adamw_device_state {
  quantized_view m;        ///< first moment: int8_g128_sym_sr_f32 codes of m, device memory
  quantized_view v;        ///< second moment: fp8e4m3_g128_sr_f32 codes of sqrt(v), device memory
  std::int64_t step = 0;   ///< steps taken so far (the next step is step + 1)
  std::uint64_t seed = 0;  ///< as adamw_state_options::seed

  /// Number of parameters.
  std::int64_t size() const noexcept { return m.cols; }
};

/// The spec of the first moment of adamw_device_state (int8_g128_sym_sr_f32, adamw_state's
/// default). Host only.
inline spec adamw_device_m_spec() {
  return moment_spec(moment_format::int8_linear, 128, rounding_kind::stochastic);
}

/// The spec of the second moment of adamw_device_state (fp8e4m3_g128_sr_f32 of sqrt(v),
/// adamw_state's default). Host only.
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

/// The step's arguments, as the kernel receives them.
template <class P, class Source>
struct adamw_step_args {
  adamw_coefficients c;
  P* w;           ///< weights (float or bfloat16)
  float* master;  ///< fp32 master copy, or null
  Source grad;    ///< gradient source
  quantized_view m;
  quantized_view v;
  std::uint64_t seed_m = 0;
  std::uint64_t seed_v = 0;

  /// Whether the linear path applies: weights, master copy, gradient, codes and scales aligned
  /// for whole-run vector accesses and one-load scales. Host and device.
  AGOQ_HOST_DEVICE bool linear() const noexcept {
    return base::aligned(w, 16) && base::aligned(master, 16) && grad.whole_runs_aligned() &&
           base::params_and_codes_aligned<8>(m) && base::params_and_codes_aligned<8>(v);
  }
};

/// The general path's work for thread t: lane t % 16 of block t / 16 holds its 8 elements (fewer
/// or none at the end), decodes them, updates them, and with the block's other lanes requantizes
/// the moments (device::quantize_group_lanes). Every lane of the warp must call it together.
template <class P, class Source>
__device__ inline void adamw_lane(adamw_step_args<P, Source> const& a, std::int64_t t,
                                  unsigned long long& bad) {
  constexpr int n_run = base::run;
  std::int64_t group = 0;
  device::element_run const r = device::group_lane_run(t, adamw_lanes_log2, 1, a.m.cols, group);
  float g[n_run], mv[n_run], vv[n_run], p[n_run];
  a.grad.load(r.col, r.count, g);
  load_moment<int_sym<8>>(a.m, r.col, r.count, group, mv);
  load_moment<fp8_e4m3>(a.v, r.col, r.count, group, vv);
  if (a.master != nullptr) {
    base::load_run(a.master + r.col, r.count, p);
  } else {
    base::load_run(a.w + r.col, r.count, p);
  }
  AGOQ_UNROLL
  for (int i = 0; i < n_run; ++i) {
    if (i < r.count && !adamw_update<true>(a.c, g[i], p[i], mv[i], vv[i])) ++bad;
  }
  if (a.master != nullptr) base::store_run(a.master + r.col, r.count, p);
  base::store_run(a.w + r.col, r.count, p);
  auto const lane = static_cast<unsigned>(t & (adamw_lanes - 1));
  device::quantize_group_lanes<int_sym<8>, round_stochastic>(a.m, 0, r.col, r.count, group, lane,
                                                             adamw_lanes, mv, a.seed_m, 0);
  device::quantize_group_lanes<fp8_e4m3, round_stochastic>(a.v, 0, r.col, r.count, group, lane,
                                                           adamw_lanes, vv, a.seed_v, 0);
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
  auto const* m_codes = reinterpret_cast<std::uint64_t const*>(a.m.codes);
  auto const* v_codes = reinterpret_cast<std::uint64_t const*>(a.v.codes);
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
  group_params const pm{reinterpret_cast<float const*>(a.m.scales)[slot.group], 0};
  group_params const pv{reinterpret_cast<float const*>(a.v.scales)[slot.group], 0};
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
  device::quantize_group_slot<int_sym<8>, round_stochastic>(a.m, slot, active, mv, a.seed_m, 0);
  device::quantize_group_slot<fp8_e4m3, round_stochastic>(a.v, slot, active, vv, a.seed_v, 0);
}

/// The fused step. Linear path (adamw_step_args::linear): the whole blocks in slots of
/// adamw_slot_runs runs (adamw_slot), then the ragged last block, if any, by the first warp of
/// block 0 (adamw_lane). General path: thread t is lane t % 16 of block t / 16 (adamw_lane).
/// Weights and the optional fp32 master copy are read and written in place; `skipped` (may be
/// null) counts the elements whose gradient was not finite.
template <class P, class Source>
AGOQ_KERNEL void adamw_step_kernel(adamw_step_args<P, Source> a, unsigned long long* skipped) {
  std::int64_t const n = a.m.cols;
  unsigned long long bad = 0;
  if (a.linear()) {
    std::int64_t const whole = n / adamw_block;
    base::for_each_linear_slot(
        whole << adamw_lanes_log2, adamw_lanes_log2, adamw_slot_runs_log2,
        [&](device::linear_slot const& slot, bool active) { adamw_slot(a, slot, active, bad); });
    if (whole * adamw_block < n && blockIdx.x == 0 && threadIdx.x < 32) {
      adamw_lane(a, (whole << adamw_lanes_log2) + threadIdx.x, bad);
    }
  } else {
    std::int64_t const threads = (n + adamw_block - 1) / adamw_block * adamw_lanes;
    base::block_uniform_loop(threads, [&](std::int64_t t) { adamw_lane(a, t, bad); });
  }
  base::add_warp_count(skipped, bad);
}

/// Checks a device state against n parameters. \throws agoq::invalid_argument on bad shapes or
/// pointers, agoq::unsupported_scheme on moment formats other than the defaults.
inline void check_device_state(adamw_device_state const& s, std::int64_t n) {
  s.m.validate();
  s.v.validate();
  AGOQ_EXPECTS(s.step >= 0, "adamw_step_async: negative step " + std::to_string(s.step));
  AGOQ_EXPECTS(s.m.rows == 1 && s.v.rows == 1 && s.m.cols == s.v.cols,
               "adamw_step_async: the moments must be [1, n] views of one size, got [" +
                   std::to_string(s.m.rows) + ", " + std::to_string(s.m.cols) + "] and [" +
                   std::to_string(s.v.rows) + ", " + std::to_string(s.v.cols) + "]");
  AGOQ_EXPECTS(s.m.cols == n, "adamw_step_async: the parameters have " + std::to_string(n) +
                                  " elements, the state " + std::to_string(s.m.cols));
  if (!(s.m.spec == adamw_device_m_spec())) {
    throw unsupported_scheme("agoq: adamw_step_async: the CUDA step stores m as " +
                             adamw_device_m_spec().name() + " only (adamw_state's default), got " +
                             s.m.spec.name());
  }
  if (!(s.v.spec == adamw_device_v_spec())) {
    throw unsupported_scheme(
        "agoq: adamw_step_async: the CUDA step stores v as " + adamw_device_v_spec().name() +
        " codes of sqrt(v) only (adamw_state's default), got " + s.v.spec.name());
  }
  base::check_device_view(s.m, "adamw_step_async");
  base::check_device_view(s.v, "adamw_step_async");
}

/// Validates, computes step t's coefficients and seeds on the host, launches, increments the
/// step count.
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
    // The linear path's slots (at least one warp for the ragged block), else the lanes.
    std::int64_t const blocks = (n + adamw_block - 1) / adamw_block;
    std::int64_t const threads =
        a.linear() ? std::max<std::int64_t>(blocks << (adamw_lanes_log2 - adamw_slot_runs_log2), 32)
                   : blocks * adamw_lanes;
    base::launch(adamw_step_kernel<P, Source>, base::grid_for(threads, pol), pol.block_threads, 0,
                 stream, a, count);
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
/// views or hyper-parameters (then nothing is enqueued); agoq::unsupported_scheme on moment
/// formats other than adamw_device_m_spec() / adamw_device_v_spec(); agoq::cuda_error.
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
/// (any grouping and 8-bit code; elements in row-major order), bit-identical to the host
/// overload. Does not synchronize.
/// \throws as the span overload, and agoq::invalid_argument on an invalid view or codes that are
/// not 8-bit.
inline void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                             std::span<float> params, const_quantized_view grads,
                             std::int64_t* skipped = nullptr) {
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
/// overloads above). Does not synchronize.
/// \throws as they do.
inline void adamw_step_async(cuda_executor ex, adamw_device_state& state, adamw_hyper const& h,
                             std::span<bfloat16> weights, std::span<float> master,
                             const_quantized_view grads, std::int64_t* skipped = nullptr) {
  detail::gpu::check_weight_step(state, weights, master, grads.size());
  detail::gpu::with_quantized_gradient(grads, [&](auto const& source) {
    detail::gpu::launch_adamw_step(ex, state, h, weights.data(),
                                   master.empty() ? nullptr : master.data(), source, skipped);
  });
}

namespace detail::gpu {

/// Checks that a host state mirrors a device state: the same size, moment specs and seed.
inline void check_mirror(adamw_state const& h, adamw_device_state const& d) {
  check_device_state(d, h.size());
  AGOQ_EXPECTS(is_quantized(h.options().m) && is_quantized(h.options().v) &&
                   h.m().quantized().spec() == d.m.spec && h.v().quantized().spec() == d.v.spec,
               std::string("copy_state: the host state stores m as ") + format_name(h.options().m) +
                   " and v as " + format_name(h.options().v) +
                   "; the device state needs adamw_state's default formats");
  AGOQ_EXPECTS(h.options().seed == d.seed,
               "copy_state: the host and device states have different seeds");
}

/// Copies the sections (codes, scales, zero points) of one view into another of the same spec
/// and extents, in direction `kind`, on `stream`.
template <class From, class To>
void copy_sections(From const& from, To const& to, cudaMemcpyKind kind, cudaStream_t stream) {
  quantized_layout const l = from.layout();
  auto copy = [&](void* dst, void const* src, std::int64_t n) {
    if (n > 0) {
      AGOQ_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n), kind, stream));
    }
  };
  copy(to.codes, from.codes, l.codes_bytes);
  copy(to.scales, from.scales, l.scales_bytes);
  copy(to.zero_points, from.zero_points, l.zero_points_bytes);
}

}  // namespace detail::gpu

/// Copies a device state's moments and step count into the host state `h` (to checkpoint it with
/// write_adamw_state, optim/checkpoint.hpp), which must have the device state's size, default
/// moment formats (adamw_device_m_spec / adamw_device_v_spec) and seed. Enqueued on `ex.stream`
/// after the work before it; synchronizes the stream before returning.
/// \throws agoq::invalid_argument when the states do not match (nothing is copied);
/// agoq::cuda_error.
inline void copy_state(cuda_executor ex, adamw_device_state const& d, adamw_state& h) {
  detail::gpu::check_mirror(h, d);
  cudaStream_t const stream = ex.stream.get();
  detail::gpu::copy_sections(d.m, h.m().quantized().view(), cudaMemcpyDeviceToHost, stream);
  detail::gpu::copy_sections(d.v, h.v().quantized().view(), cudaMemcpyDeviceToHost, stream);
  AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
  h.set_step(d.step);
}

/// Copies a host state's moments and step count into the device state `d` (to resume from
/// read_adamw_state), which must have the host state's size, moment specs and seed. Enqueued on
/// `ex.stream`; returns once the host bytes are staged (copies from pageable memory), so the host
/// state may change or go then; CUDA may wait for the stream's earlier work before staging.
/// \throws agoq::invalid_argument when the states do not match (nothing is copied);
/// agoq::cuda_error.
inline void copy_state(cuda_executor ex, adamw_state const& h, adamw_device_state& d) {
  detail::gpu::check_mirror(h, d);
  cudaStream_t const stream = ex.stream.get();
  detail::gpu::copy_sections(h.m().quantized().view(), d.m, cudaMemcpyHostToDevice, stream);
  detail::gpu::copy_sections(h.v().quantized().view(), d.v, cudaMemcpyHostToDevice, stream);
  d.step = h.step();
}

}  // namespace agoq::optim
