/// \file
/// The host AdamW step (include/agoq/optim/adamw.hpp) on 16M parameters beside a memcpy that
/// moves the same bytes, single thread.
///
/// A step's traffic T is the bytes it reads (parameters, gradient, both moments with their scales)
/// plus the bytes it writes (parameters, both moments); SetBytesProcessed counts T. The memcpy
/// beside it copies T / 2 bytes, which is T bytes of traffic too (read T / 2, write T / 2), so
/// `vs_memcpy` = memcpy time / step time is the step's fraction of memcpy bandwidth. Each
/// iteration times the step and then (timing paused) that memcpy, so both see the same machine
/// state on a shared, noisy machine.
///
/// Cases: fp32 AdamW (fp32 m and v, 28 bytes of traffic per parameter), the default 8-bit state
/// (int8 m, E4M3 sqrt(v), stochastic rounding) with an fp32 gradient, and the same reading an
/// int8_g128_sym_sr_f32 gradient view (the 8-bit gradient buffer's format); and the default state
/// on two threads against one (`adamw_8bit/f32_grad/threads:2`).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <agoq/optim/adamw.hpp>

namespace {

/// Parameters per step: 16M.
constexpr std::int64_t parameter_count = std::int64_t{1} << 24;

/// A 64-byte-aligned, already-touched byte buffer.
struct buffer {
  struct free_deleter {
    void operator()(std::uint8_t* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, free_deleter> data;

  explicit buffer(std::int64_t n)
      : data(static_cast<std::uint8_t*>(std::aligned_alloc(64, static_cast<std::size_t>(n)))) {
    std::memset(data.get(), 0x11, static_cast<std::size_t>(n));
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Normal values (fixed seed), built once.
std::vector<float> const& normals() {
  static std::vector<float> const v = [] {
    std::vector<float> r(static_cast<std::size_t>(parameter_count));
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : r) x = normal(gen);
    return r;
  }();
  return v;
}

enum class gradient_kind { f32, int8_view };

/// Bytes of a moment format per element read or written (codes, scales, zero points).
double moment_bytes(agoq::optim::moment_storage const& m) {
  return static_cast<double>(m.bytes()) / static_cast<double>(parameter_count);
}

void bm_adamw(benchmark::State& state, agoq::optim::adamw_state_options opt, gradient_kind gk) {
  using namespace agoq::optim;
  adamw_state s(parameter_count, opt);
  std::vector<float> w(normals());
  std::vector<float> const& g = normals();
  agoq::quantized_tensor gq(agoq::spec::parse("int8_g128_sym_sr_f32"), 1, parameter_count);
  agoq::quantize(agoq::host, agoq::as_row(g.data(), parameter_count), gq.view(), {7, 0});
  adamw_hyper h;
  h.lr = 1e-5f;  // small, so the parameters stay in range over many iterations
  h.weight_decay = 0.01f;
  auto step = [&] {
    if (gk == gradient_kind::f32) {
      return adamw_step(agoq::host, s, h, std::span<float>(w), std::span<float const>(g));
    }
    return adamw_step(agoq::host, s, h, std::span<float>(w), std::as_const(gq).view());
  };
  step();  // the moments hold real values from here on
  double const grad_bytes = gk == gradient_kind::f32 ? 4.0
                                                     : static_cast<double>(gq.bytes()) /
                                                           static_cast<double>(parameter_count);
  double const per_param =
      4.0 + grad_bytes + 2.0 * (moment_bytes(s.m()) + moment_bytes(s.v())) + 4.0;
  auto const traffic = static_cast<std::int64_t>(per_param * static_cast<double>(parameter_count));
  std::int64_t const half = traffic / 2;
  buffer src(half);
  buffer dst(half);
  double step_s = 0.0;
  double memcpy_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step());
    benchmark::ClobberMemory();
    step_s += seconds_since(t0);
    state.PauseTiming();
    auto const t1 = std::chrono::steady_clock::now();
    std::memcpy(dst.data.get(), src.data.get(), static_cast<std::size_t>(half));
    benchmark::ClobberMemory();
    memcpy_s += seconds_since(t1);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * traffic);
  state.counters["bytes_per_param"] = per_param;
  state.counters["state_bytes_per_param"] = s.bytes_per_parameter();
  state.counters["vs_memcpy"] = step_s > 0.0 ? memcpy_s / step_s : 0.0;
  state.counters["memcpy_GB/s"] =
      memcpy_s > 0.0 ? static_cast<double>(state.iterations() * traffic) / memcpy_s * 1e-9 : 0.0;
}

/// The default 8-bit step (f32 gradient) on two threads of the host executor, and in every
/// iteration (timing paused) the same step of a second state on one: `vs_one_thread` is the
/// one-thread time over the two-thread time (the speed-up, measured over the same seconds).
void bm_adamw_threads(benchmark::State& state) {
  using namespace agoq::optim;
  adamw_state many(parameter_count), one(parameter_count);
  std::vector<float> wm(normals()), wo(normals());
  std::vector<float> const& g = normals();
  adamw_hyper h;
  h.lr = 1e-5f;
  h.weight_decay = 0.01f;
  agoq::host_executor const ex{.threads = 2};
  auto const step = [&](agoq::host_executor e, adamw_state& s, std::vector<float>& w) {
    return adamw_step(e, s, h, std::span<float>(w), std::span<float const>(g));
  };
  step(ex, many, wm);
  step(agoq::host, one, wo);
  double many_s = 0.0;
  double one_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step(ex, many, wm));
    benchmark::ClobberMemory();
    many_s += seconds_since(t0);
    state.PauseTiming();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step(agoq::host, one, wo));
    benchmark::ClobberMemory();
    one_s += seconds_since(t1);
    state.ResumeTiming();
  }
  state.counters["vs_one_thread"] = many_s > 0.0 ? one_s / many_s : 0.0;
}

agoq::optim::adamw_state_options fp32_state() {
  agoq::optim::adamw_state_options o;
  o.m = agoq::optim::moment_format::f32;
  o.v = agoq::optim::moment_format::f32;
  return o;
}

agoq::optim::adamw_state_options nearest_state() {
  agoq::optim::adamw_state_options o;
  o.m_rounding = agoq::rounding_kind::nearest;
  o.v_rounding = agoq::rounding_kind::nearest;
  return o;
}

}  // namespace

BENCHMARK_CAPTURE(bm_adamw, fp32_adamw / f32_grad, fp32_state(), gradient_kind::f32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(bm_adamw, adamw_8bit / f32_grad, agoq::optim::adamw_state_options{},
                  gradient_kind::f32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(bm_adamw, adamw_8bit / int8_grad, agoq::optim::adamw_state_options{},
                  gradient_kind::int8_view)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(bm_adamw, adamw_8bit_rne / f32_grad, nearest_state(), gradient_kind::f32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(bm_adamw_threads)
    ->Name("adamw_8bit/f32_grad/threads:2")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
