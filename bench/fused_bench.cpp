/// \file
/// The CPU executor's fused activation ops (activation/fused.hpp) on [4096, 4096] bfloat16, single
/// thread, each in three forms (and a fourth on two threads, below):
///   plain   the op without saving anything;
///   fused   the op writing its output and the quantized saved copy in one pass;
///   unfused the plain op, then agoq::quantize of the saved tensor(s) (a second read).
/// The saved schemes are the default policy's: int8_g128 for the residual stream (the RMSNorm
/// input, the residual sum), int4_g128 for activation-function inputs (SwiGLU gate and up, GeLU).
///
/// The fused and unfused benchmarks also time the plain op in every iteration (outside the
/// reported time) and report `vs_plain` = their summed time over the plain op's summed time, so
/// the ratio is read from one run even on a busy machine. Target for fused: vs_plain <= 1.15.
/// A fourth form, `fused_threads:2`, runs the fused op on two threads of the host executor and
/// the same op on one in every iteration: `vs_one_thread` is the one-thread time over the
/// two-thread time (the speed-up). A fifth, `memory_floor`, moves the fused op's bytes and the
/// plain op's with none of their arithmetic: its `vs_plain` is the least the fused op's can be
/// on this machine where memory bounds both (a target below it cannot be met there).
///
/// A sixth, `measured`, runs the measured form (e.g. rmsnorm_forward_measured: the fused op that
/// also gathers measure's statistics of its saved tensors, row by row beside the op) and, in every
/// iteration, the fused op alone and the fused op followed by activation::measure of the saved
/// tensors: `vs_fused` is the measured form's time over the fused op's (what the statistics add),
/// `vs_apart` the fused op and measure's summed time over the measured form's (above 1: gathering
/// the statistics beside the op is faster than a pass of their own).
///
/// The backward ops (`rmsnorm_backward`, `swiglu_backward`, `gelu_backward`, each `/from_saved`)
/// read the gradient and the quantized saved copies the fused forward wrote, and write the input
/// gradients. Each iteration also times a memcpy of the gradients' bytes (a source of the same
/// size copied over them), and `vs_memcpy` is the summed memcpy time over the summed backward
/// time: the fraction of memcpy bandwidth, which a backward reaches only if decoding its saved
/// copies and its arithmetic cost nothing beyond their bytes.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <agoq/activation/fused.hpp>
#include <agoq/activation/policy.hpp>
#include <agoq/layout/tensor.hpp>

namespace {

using agoq::bfloat16;
using agoq::matrix_view;
using agoq::quantized_tensor;
namespace act = agoq::activation;

constexpr std::int64_t rows = 4096;
constexpr std::int64_t cols = 4096;
constexpr agoq::quantize_options opt{7, 0};
constexpr agoq::host_executor two_threads{.threads = 2};

/// A [rows, cols] bfloat16 tensor of normal values (fixed seed), built once per seed.
std::vector<bfloat16> const& input(std::uint32_t seed) {
  static std::vector<std::vector<bfloat16>> cache(4);
  auto& v = cache[seed];
  if (v.empty()) {
    v.resize(static_cast<std::size_t>(rows * cols));
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& e : v) e = agoq::numeric::from_float<bfloat16>(normal(gen));
  }
  return v;
}

matrix_view<bfloat16 const> in(std::uint32_t seed) {
  return matrix_view<bfloat16 const>(input(seed).data(), rows, cols);
}

/// One timed form: `measured` against `plain`, callables run once per iteration.
template <class Plain, class Run>
void run(benchmark::State& state, Plain&& plain, Run&& measured, std::int64_t bytes) {
  using clock = std::chrono::steady_clock;
  plain();
  measured();  // outputs and saved buffers touched before timing
  double measured_s = 0, plain_s = 0;
  for (auto _ : state) {
    auto const t0 = clock::now();
    measured();
    auto const t1 = clock::now();
    plain();
    auto const t2 = clock::now();
    double const m = std::chrono::duration<double>(t1 - t0).count();
    measured_s += m;
    plain_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(m);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["vs_plain"] = measured_s / plain_s;
}

/// The measured form: `measured` (the measured op) timed, and in every iteration `fused` (the
/// fused op) and `apart` (the fused op, then measure) against it.
template <class Fused, class Measured, class Apart>
void run_measured(benchmark::State& state, Fused&& fused, Measured&& measured, Apart&& apart,
                  std::int64_t bytes) {
  using clock = std::chrono::steady_clock;
  measured();
  double measured_s = 0, fused_s = 0, apart_s = 0;
  for (auto _ : state) {
    auto const t0 = clock::now();
    measured();
    auto const t1 = clock::now();
    fused();
    auto const t2 = clock::now();
    apart();
    auto const t3 = clock::now();
    double const m = std::chrono::duration<double>(t1 - t0).count();
    measured_s += m;
    fused_s += std::chrono::duration<double>(t2 - t1).count();
    apart_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(m);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["vs_fused"] = measured_s / fused_s;
  state.counters["vs_apart"] = apart_s / measured_s;
}

/// The two-thread form: the fused op on two threads against the same op on one.
template <class Fused>
void run_threads(benchmark::State& state, Fused&& fused, std::int64_t bytes) {
  run(
      state, [&] { fused(agoq::host); }, [&] { fused(two_threads); }, bytes);
  state.counters["vs_one_thread"] = 1.0 / state.counters["vs_plain"].value;
  state.counters.erase("vs_plain");
}

/// A backward op against a memcpy of `out_bytes`, the bytes of the gradients it writes.
template <class Backward>
void run_backward(benchmark::State& state, Backward&& backward, std::int64_t out_bytes,
                  std::int64_t bytes) {
  std::vector<std::uint8_t> const src(static_cast<std::size_t>(out_bytes), 0x5a);
  std::vector<std::uint8_t> dst(static_cast<std::size_t>(out_bytes));
  auto const copy = [&] {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  };
  run(state, copy, backward, bytes);
  state.counters["vs_memcpy"] = 1.0 / state.counters["vs_plain"].value;
  state.counters.erase("vs_plain");
}

constexpr std::int64_t tensor_bytes = rows * cols * 2;
constexpr std::int64_t tensor_words = tensor_bytes / 8;

/// The memory floor of an op with `inputs` bf16 input tensors and one output, saving copies of
/// `saved_bytes` bytes each (codes and scales): the same bytes moved with none of the op's
/// arithmetic, as 64-bit words through plain (cached) stores, the loop g++ vectorizes. The
/// output's words are the inputs' xor; after each block of 64 of them, each saved buffer gets
/// its share of the block (int8 codes of bf16 values: 32 words), so the saved copies are written
/// as the fused ops write them, in step with the output.
class traffic {
 public:
  traffic(int inputs, std::vector<std::int64_t> const& saved_bytes)
      : in_(static_cast<std::size_t>(inputs),
            std::vector<std::uint64_t>(static_cast<std::size_t>(tensor_words), 1)),
        out_(static_cast<std::size_t>(tensor_words)) {
    for (std::int64_t b : saved_bytes) saved_.emplace_back(static_cast<std::size_t>(b / 8));
  }

  /// Moves the plain op's bytes (with_saved false) or the fused op's.
  void move(bool with_saved) {
    std::uint64_t const* a = in_.front().data();
    std::uint64_t const* b = in_.back().data();
    std::uint64_t* y = out_.data();
    constexpr std::int64_t block = 64;
    for (std::int64_t i = 0; i < tensor_words; i += block) {
      for (std::int64_t j = i; j < i + block; ++j) y[j] = a[j] ^ b[j];
      if (!with_saved) continue;
      for (auto& s : saved_) {
        auto const n = static_cast<std::int64_t>(s.size());
        std::int64_t const s0 = i * n / tensor_words, s1 = (i + block) * n / tensor_words;
        for (std::int64_t j = s0; j < s1; ++j) s[static_cast<std::size_t>(j)] = y[i + (j - s0)];
      }
    }
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }

 private:
  std::vector<std::vector<std::uint64_t>> in_;
  std::vector<std::uint64_t> out_;
  std::vector<std::vector<std::uint64_t>> saved_;
};

/// Form `form` of one op (register_all's names): 0 the plain op, 1 fused, 2 unfused (each timed
/// against the plain op), 3 the fused op on two threads against one, 4 the op's memory floor (the
/// fused op's bytes moved, timed against the plain op's: the least vs_plain can be where memory
/// bounds the op), 5 the measured form (run_measured; `measured` runs it, `stats` measures the
/// saved tensors apart). `fused_on(ex)` runs the fused op on an executor.
template <class Plain, class FusedOn, class Unfused, class Measured, class Stats>
void run_form(benchmark::State& state, int form, Plain const& plain, FusedOn const& fused_on,
              Unfused const& unfused, Measured const& measured, Stats const& stats,
              std::int64_t bytes, int inputs, std::vector<std::int64_t> const& saved_bytes) {
  if (form == 0) run(state, plain, plain, bytes);
  if (form == 1)
    run(
        state, plain, [&] { fused_on(agoq::host); }, bytes);
  if (form == 2) run(state, plain, unfused, bytes);
  if (form == 3) run_threads(state, fused_on, bytes);
  if (form == 4) {
    traffic t(inputs, saved_bytes);
    run(
        state, [&] { t.move(false); }, [&] { t.move(true); }, bytes);
  }
  if (form == 5) {
    auto const fused = [&] { fused_on(agoq::host); };
    auto const apart = [&] {
      fused();
      stats();
    };
    run_measured(state, fused, measured, apart, bytes);
  }
}

void rmsnorm(benchmark::State& state, int form) {
  std::vector<bfloat16> w(static_cast<std::size_t>(cols),
                          agoq::numeric::from_float<bfloat16>(1.0f));
  std::vector<bfloat16> y(static_cast<std::size_t>(rows * cols));
  std::vector<float> rstd(static_cast<std::size_t>(rows));
  quantized_tensor saved(act::int8_g128, rows, cols);
  matrix_view<bfloat16> const yv(y.data(), rows, cols);
  std::span<bfloat16 const> const ws(w);
  auto plain = [&] {
    act::rmsnorm_forward(agoq::host, in(1), ws, 1e-5f, yv, std::span<float>(rstd));
  };
  auto fused_on = [&](agoq::host_executor ex) {
    act::rmsnorm_forward(ex, in(1), ws, 1e-5f, yv, saved.view(), std::span<float>(rstd), opt);
  };
  auto unfused = [&] {
    plain();
    agoq::quantize(agoq::host, in(1), saved.view(), opt);
  };
  act::tensor_stats st;
  auto measured = [&] {
    act::rmsnorm_forward_measured(agoq::host, in(1), ws, 1e-5f, yv, saved.view(),
                                  std::span<float>(rstd), st, opt);
  };
  auto stats = [&] { st = act::measure(agoq::host, in(1), act::int8_g128); };
  run_form(state, form, plain, fused_on, unfused, measured, stats, 2 * tensor_bytes, 1,
           {saved.bytes()});
}

void swiglu(benchmark::State& state, int form) {
  std::vector<bfloat16> out(static_cast<std::size_t>(rows * cols));
  quantized_tensor sg(act::int4_g128, rows, cols), su(act::int4_g128, rows, cols);
  matrix_view<bfloat16> const ov(out.data(), rows, cols);
  auto plain = [&] { act::swiglu_forward(agoq::host, in(1), in(2), ov); };
  auto fused_on = [&](agoq::host_executor ex) {
    act::swiglu_forward(ex, in(1), in(2), ov, sg.view(), su.view(), opt);
  };
  auto unfused = [&] {
    plain();
    agoq::quantize(agoq::host, in(1), sg.view(), opt);
    agoq::quantize(agoq::host, in(2), su.view(), {opt.seed, opt.offset + rows * cols});
  };
  act::tensor_stats st_gate, st_up;
  auto measured = [&] {
    act::swiglu_forward_measured(agoq::host, in(1), in(2), ov, sg.view(), su.view(), st_gate, st_up,
                                 opt);
  };
  auto stats = [&] {
    st_gate = act::measure(agoq::host, in(1), act::int4_g128);
    st_up = act::measure(agoq::host, in(2), act::int4_g128);
  };
  run_form(state, form, plain, fused_on, unfused, measured, stats, 3 * tensor_bytes, 2,
           {sg.bytes(), su.bytes()});
}

void gelu(benchmark::State& state, int form) {
  std::vector<bfloat16> y(static_cast<std::size_t>(rows * cols));
  quantized_tensor saved(act::int4_g128, rows, cols);
  matrix_view<bfloat16> const yv(y.data(), rows, cols);
  auto plain = [&] { act::gelu_forward(agoq::host, in(1), yv); };
  auto fused_on = [&](agoq::host_executor ex) {
    act::gelu_forward(ex, in(1), yv, saved.view(), opt);
  };
  auto unfused = [&] {
    plain();
    agoq::quantize(agoq::host, in(1), saved.view(), opt);
  };
  act::tensor_stats st;
  auto measured = [&] { act::gelu_forward_measured(agoq::host, in(1), yv, saved.view(), st, opt); };
  auto stats = [&] { st = act::measure(agoq::host, in(1), act::int4_g128); };
  run_form(state, form, plain, fused_on, unfused, measured, stats, 2 * tensor_bytes, 1,
           {saved.bytes()});
}

void residual(benchmark::State& state, int form) {
  std::vector<bfloat16> sum(static_cast<std::size_t>(rows * cols));
  quantized_tensor saved(act::int8_g128, rows, cols);
  matrix_view<bfloat16> const sv(sum.data(), rows, cols);
  auto plain = [&] { act::residual_add(agoq::host, in(1), in(2), sv); };
  auto fused_on = [&](agoq::host_executor ex) {
    act::residual_add(ex, in(1), in(2), sv, saved.view(), opt);
  };
  auto unfused = [&] {
    plain();
    agoq::quantize(agoq::host, matrix_view<bfloat16 const>(sum.data(), rows, cols), saved.view(),
                   opt);
  };
  act::tensor_stats st;
  auto measured = [&] {
    act::residual_add_measured(agoq::host, in(1), in(2), sv, saved.view(), st, opt);
  };
  auto stats = [&] {
    st = act::measure(agoq::host, matrix_view<bfloat16 const>(sum.data(), rows, cols),
                      act::int8_g128);
  };
  run_form(state, form, plain, fused_on, unfused, measured, stats, 3 * tensor_bytes, 2,
           {saved.bytes()});
}

/// RMSNorm backward from the int8 copy its fused forward saved (dweight accumulates over the
/// iterations, as over micro-batches).
void rmsnorm_back(benchmark::State& state) {
  std::vector<bfloat16> w(static_cast<std::size_t>(cols),
                          agoq::numeric::from_float<bfloat16>(1.0f));
  std::vector<bfloat16> dx(static_cast<std::size_t>(rows * cols));
  std::vector<float> rstd(static_cast<std::size_t>(rows)), dw(static_cast<std::size_t>(cols));
  quantized_tensor saved(act::int8_g128, rows, cols);
  matrix_view<bfloat16> const dxv(dx.data(), rows, cols);
  std::span<bfloat16 const> const ws(w);
  act::rmsnorm_forward(agoq::host, in(1), ws, 1e-5f, dxv, saved.view(), std::span<float>(rstd),
                       opt);
  auto backward = [&] {
    act::rmsnorm_backward(agoq::host, in(3), saved.view(), std::span<float const>(rstd), ws, dxv,
                          std::span<float>(dw));
  };
  run_backward(state, backward, tensor_bytes, 2 * tensor_bytes + saved.bytes());
}

/// SwiGLU backward from the two int4 copies its fused forward saved.
void swiglu_back(benchmark::State& state) {
  std::vector<bfloat16> dg(static_cast<std::size_t>(rows * cols)),
      du(static_cast<std::size_t>(rows * cols));
  quantized_tensor sg(act::int4_g128, rows, cols), su(act::int4_g128, rows, cols);
  matrix_view<bfloat16> const dgv(dg.data(), rows, cols), duv(du.data(), rows, cols);
  act::swiglu_forward(agoq::host, in(1), in(2), dgv, sg.view(), su.view(), opt);
  auto backward = [&] { act::swiglu_backward(agoq::host, in(3), sg.view(), su.view(), dgv, duv); };
  run_backward(state, backward, 2 * tensor_bytes, 3 * tensor_bytes + sg.bytes() + su.bytes());
}

/// GeLU backward from the int4 copy its fused forward saved.
void gelu_back(benchmark::State& state) {
  std::vector<bfloat16> dx(static_cast<std::size_t>(rows * cols));
  quantized_tensor saved(act::int4_g128, rows, cols);
  matrix_view<bfloat16> const dxv(dx.data(), rows, cols);
  act::gelu_forward(agoq::host, in(1), dxv, saved.view(), opt);
  auto backward = [&] { act::gelu_backward(agoq::host, in(3), saved.view(), dxv); };
  run_backward(state, backward, tensor_bytes, 2 * tensor_bytes + saved.bytes());
}

void register_all() {
  char const* forms[] = {"plain",           "fused",        "unfused",
                         "fused_threads:2", "memory_floor", "measured"};
  for (int f = 0; f < 6; ++f) {
    std::string const s = std::string("/") + forms[f] + "/bf16_4096x4096";
    benchmark::RegisterBenchmark(("rmsnorm_forward" + s).c_str(), rmsnorm, f)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("swiglu_forward" + s).c_str(), swiglu, f)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("gelu_forward" + s).c_str(), gelu, f)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("residual_add" + s).c_str(), residual, f)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("rmsnorm_backward/from_saved/bf16_4096x4096", rmsnorm_back)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("swiglu_backward/from_saved/bf16_4096x4096", swiglu_back)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gelu_backward/from_saved/bf16_4096x4096", gelu_back)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
