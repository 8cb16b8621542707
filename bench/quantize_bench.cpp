/// \file
/// The CPU executor's quantize, dequantize and measure beside a memcpy of the same bytes, single
/// thread; `quantize_measured/...`, quantize gathering measure's statistics against the two
/// calls; and `threads/...`, quantize and dequantize on several threads against one.
///
/// "The same bytes" is the unquantized tensor in both directions: quantize is measured against a
/// memcpy of its input (rows x cols elements of the input type), dequantize against a memcpy of
/// its output (rows x cols elements of the output type). SetBytesProcessed counts those bytes, so
/// the bytes_per_second of a kernel and of `memcpy/<bytes>` are directly comparable, and their
/// ratio is how long a memcpy of the tensor takes over how long the kernel takes.
///
/// Every kernel benchmark also measures that ratio in-run: each iteration times the kernel and
/// then (timing paused) a memcpy of the same bytes, and the counter `vs_memcpy` is the summed
/// memcpy time over the summed kernel time. Both see the same machine state over the same
/// seconds, which keeps the figure meaningful on a shared, noisy machine.
///
/// Every input is 64 MiB (larger than the last-level cache), its pages are touched before timing,
/// and the quantized buffers and outputs are written once before timing too.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <agoq/activation/statistics.hpp>
#include <agoq/agoq.hpp>

namespace {

/// Bytes of every unquantized tensor.
constexpr std::int64_t tensor_bytes = std::int64_t{64} << 20;
/// Columns of every tensor (a typical hidden size); the rows follow from the bytes.
constexpr std::int64_t tensor_cols = 8192;

/// A 64-byte-aligned, already-touched byte buffer.
struct buffer {
  struct free_deleter {
    void operator()(std::uint8_t* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, free_deleter> data;
  std::int64_t bytes = 0;

  explicit buffer(std::int64_t n)
      : data(static_cast<std::uint8_t*>(std::aligned_alloc(64, static_cast<std::size_t>(n)))),
        bytes(n) {
    std::memset(data.get(), 0, static_cast<std::size_t>(n));
  }
};

/// The input tensor of element type T: normally distributed values whose per-group spread varies
/// (so the group scales differ), fixed seed; built once and kept.
template <class T>
T const* input() {
  static buffer const b = [] {
    buffer r(tensor_bytes);
    auto* x = reinterpret_cast<T*>(r.data.get());
    std::int64_t const n = tensor_bytes / static_cast<std::int64_t>(sizeof(T));
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> spread(-4.0f, 4.0f);
    float s = 1.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i % 32 == 0) s = std::exp2(spread(gen));
      x[i] = agoq::numeric::from_float<T>(normal(gen) * s);
    }
    return r;
  }();
  return reinterpret_cast<T const*>(b.data.get());
}

/// A scratch destination of tensor_bytes for the memcpy, shared by every benchmark.
std::uint8_t* memcpy_destination() {
  static buffer b(tensor_bytes);
  return b.data.get();
}

/// A scratch source of tensor_bytes for the dequantize memcpy (the output is the destination).
std::uint8_t const* memcpy_source() {
  static buffer const b = [] {
    buffer r(tensor_bytes);
    std::memset(r.data.get(), 0x5a, static_cast<std::size_t>(tensor_bytes));
    return r;
  }();
  return b.data.get();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Times one memcpy of `bytes` from src to dst, with timing paused.
double paused_memcpy(benchmark::State& state, void* dst, void const* src, std::int64_t bytes) {
  state.PauseTiming();
  auto const t0 = std::chrono::steady_clock::now();
  std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  benchmark::ClobberMemory();
  double const t = seconds_since(t0);
  state.ResumeTiming();
  return t;
}

void set_counters(benchmark::State& state, std::int64_t bytes, double kernel_s, double memcpy_s) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["vs_memcpy"] = kernel_s > 0.0 ? memcpy_s / kernel_s : 0.0;
  state.counters["memcpy_GB/s"] =
      memcpy_s > 0.0 ? static_cast<double>(state.iterations() * bytes) / memcpy_s * 1e-9 : 0.0;
}

/// memcpy of `state.range(0)` bytes: the reference every kernel is read against.
void bm_memcpy(benchmark::State& state) {
  std::int64_t const bytes = state.range(0);
  auto const* src = reinterpret_cast<std::uint8_t const*>(input<float>());
  std::uint8_t* dst = memcpy_destination();
  for (auto _ : state) {
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

/// quantize of the 64 MiB In tensor with the scheme named by `name`.
template <class In>
void bm_quantize(benchmark::State& state, std::string const& name) {
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const n = tensor_bytes / static_cast<std::int64_t>(sizeof(In));
  std::int64_t const rows = n / tensor_cols;
  In const* x = input<In>();
  agoq::quantized_tensor q(s, rows, tensor_cols);
  auto const in = agoq::matrix_view<In const>(x, rows, tensor_cols);
  agoq::quantize_options const opt{1234, 0};
  agoq::quantize(agoq::host, in, q.view(), opt);
  double kernel_s = 0.0;
  double memcpy_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(agoq::quantize(agoq::host, in, q.view(), opt));
    benchmark::ClobberMemory();
    kernel_s += seconds_since(t0);
    memcpy_s += paused_memcpy(state, memcpy_destination(), x, tensor_bytes);
  }
  set_counters(state, tensor_bytes, kernel_s, memcpy_s);
}

/// dequantize into the 64 MiB Out tensor from codes of the scheme named by `name`.
template <class Out>
void bm_dequantize(benchmark::State& state, std::string const& name) {
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const n = tensor_bytes / static_cast<std::int64_t>(sizeof(Out));
  std::int64_t const rows = n / tensor_cols;
  agoq::quantized_tensor q(s, rows, tensor_cols);
  agoq::quantize(agoq::host, agoq::matrix_view<Out const>(input<Out>(), rows, tensor_cols),
                 q.view(), agoq::quantize_options{1234, 0});
  buffer y(tensor_bytes);
  auto const out = agoq::matrix_view<Out>(reinterpret_cast<Out*>(y.data.get()), rows, tensor_cols);
  agoq::dequantize(agoq::host, std::as_const(q).view(), out);
  double kernel_s = 0.0;
  double memcpy_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(agoq::dequantize(agoq::host, std::as_const(q).view(), out));
    benchmark::ClobberMemory();
    kernel_s += seconds_since(t0);
    memcpy_s += paused_memcpy(state, y.data.get(), memcpy_source(), tensor_bytes);
  }
  set_counters(state, tensor_bytes, kernel_s, memcpy_s);
}

/// activation::measure (the error model's statistics) of the 64 MiB In tensor under the group
/// tile of the scheme named by `name`; it only reads, and is read against a memcpy of its input.
template <class In>
void bm_measure(benchmark::State& state, std::string const& name) {
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const rows = tensor_bytes / static_cast<std::int64_t>(sizeof(In)) / tensor_cols;
  In const* x = input<In>();
  auto const in = agoq::matrix_view<In const>(x, rows, tensor_cols);
  double kernel_s = 0.0;
  double memcpy_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(agoq::activation::measure(agoq::host, in, s));
    kernel_s += seconds_since(t0);
    memcpy_s += paused_memcpy(state, memcpy_destination(), x, tensor_bytes);
  }
  set_counters(state, tensor_bytes, kernel_s, memcpy_s);
}

/// activation::quantize_measured (quantize gathering measure's statistics in the same sweep) of
/// the 64 MiB In tensor with the scheme named by `name`, each iteration timing it and then (timing
/// paused) quantize followed by measure, the two calls it replaces, and quantize alone: the
/// counter `vs_apart` is the two calls' summed time over the fused call's (above 1: the fused
/// call is faster), `vs_quantize` the fused call's over quantize's (what the statistics add).
template <class In>
void bm_quantize_measured(benchmark::State& state, std::string const& name) {
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const rows = tensor_bytes / static_cast<std::int64_t>(sizeof(In)) / tensor_cols;
  auto const in = agoq::matrix_view<In const>(input<In>(), rows, tensor_cols);
  agoq::quantized_tensor q(s, rows, tensor_cols);
  agoq::quantize_options const opt{1234, 0};
  agoq::activation::tensor_stats st;
  agoq::activation::quantize_measured(agoq::host, in, q.view(), st, opt);
  double fused_s = 0.0;
  double apart_s = 0.0;
  double quantize_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(
        agoq::activation::quantize_measured(agoq::host, in, q.view(), st, opt));
    benchmark::ClobberMemory();
    fused_s += seconds_since(t0);
    state.PauseTiming();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(agoq::quantize(agoq::host, in, q.view(), opt));
    benchmark::ClobberMemory();
    double const q_s = seconds_since(t1);
    benchmark::DoNotOptimize(agoq::activation::measure(agoq::host, in, s));
    apart_s += seconds_since(t1);
    quantize_s += q_s;
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * tensor_bytes);
  state.counters["vs_apart"] = fused_s > 0.0 ? apart_s / fused_s : 0.0;
  state.counters["vs_quantize"] = quantize_s > 0.0 ? fused_s / quantize_s : 0.0;
}

/// What bm_threads times.
enum class threaded_call { quantize, dequantize, measure };

/// quantize, dequantize or measure of the 64 MiB bf16 tensor with the scheme named by `name` on
/// state.range(0) threads (0: one per hardware thread), each iteration timing it and then (timing
/// paused) the same call on one thread; `vs_one_thread` is the summed one-thread time over the
/// summed time on the threads (the speed-up, measured over the same seconds). `flat`: the tensor
/// as one row (a flat buffer) instead of rows of tensor_cols.
void bm_threads(benchmark::State& state, std::string const& name, threaded_call what, bool flat) {
  using T = agoq::bfloat16;
  agoq::spec const s = agoq::spec::parse(name);
  std::int64_t const elements = tensor_bytes / static_cast<std::int64_t>(sizeof(T));
  std::int64_t const cols = flat ? elements : tensor_cols;
  std::int64_t const rows = elements / cols;
  auto const in = agoq::matrix_view<T const>(input<T>(), rows, cols);
  agoq::quantized_tensor q(s, rows, cols);
  buffer y(tensor_bytes);
  auto const out = agoq::matrix_view<T>(reinterpret_cast<T*>(y.data.get()), rows, cols);
  agoq::host_executor const many{.threads = static_cast<int>(state.range(0))};
  auto const call = [&](agoq::host_executor ex) {
    if (what == threaded_call::dequantize)
      return agoq::dequantize(ex, std::as_const(q).view(), out);
    if (what == threaded_call::measure) return agoq::activation::measure(ex, in, s).elements;
    return agoq::quantize(ex, in, q.view(), agoq::quantize_options{1234, 0});
  };
  agoq::quantize(agoq::host, in, q.view(), agoq::quantize_options{1234, 0});
  call(agoq::host);  // every page of the output written once before timing
  double many_s = 0.0;
  double one_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(call(many));
    benchmark::ClobberMemory();
    many_s += seconds_since(t0);
    state.PauseTiming();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(call(agoq::host));
    benchmark::ClobberMemory();
    one_s += seconds_since(t1);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * tensor_bytes);
  state.counters["vs_one_thread"] = many_s > 0.0 ? one_s / many_s : 0.0;
}

/// The schemes measured: the two targets (int8 and int4, g128) and, so that their cost is known,
/// stochastic rounding, an asymmetric code, MXFP8 and FP8 stochastic rounding (the 8-bit AdamW
/// second moment's format).
std::vector<std::string> const& schemes() {
  static std::vector<std::string> const s = {"int8_g128_sym_rne_f32",  "int4_g128_sym_rne_f32",
                                             "int8_g128_sym_sr_f32",   "int8_g128_asym_rne_f32",
                                             "int4_g128_asym_rne_f32", "fp8e4m3_g32_rne_e8m0",
                                             "fp8e4m3_g128_sr_f32"};
  return s;
}

template <class T>
void register_type() {
  std::string const t = agoq::element_name<T>();
  for (std::string const& name : schemes()) {
    benchmark::RegisterBenchmark(("quantize/" + t + "/" + name).c_str(),
                                 [name](benchmark::State& st) { bm_quantize<T>(st, name); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (std::string const& name : schemes()) {
    if (name.find("_sr_") != std::string::npos) continue;  // decodes like its rne twin
    benchmark::RegisterBenchmark(("dequantize/" + t + "/" + name).c_str(),
                                 [name](benchmark::State& st) { bm_dequantize<T>(st, name); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (std::string const name : {"int4_g128_sym_rne_f32", "int8_row_sym_rne_f32"}) {
    benchmark::RegisterBenchmark(("measure/" + t + "/" + name).c_str(),
                                 [name](benchmark::State& st) { bm_measure<T>(st, name); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (std::string const name :
       {"int4_g128_sym_rne_f32", "int8_g128_sym_rne_f32", "int8_row_sym_rne_f32"}) {
    benchmark::RegisterBenchmark(
        ("quantize_measured/" + t + "/" + name).c_str(),
        [name](benchmark::State& st) { bm_quantize_measured<T>(st, name); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)
      ->Arg(tensor_bytes)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  register_type<agoq::bfloat16>();
  register_type<float>();
  auto const threads = [](std::string const& op, std::string const& name, threaded_call what,
                          bool flat = false) {
    benchmark::RegisterBenchmark(
        ("threads/" + op + "/bfloat16/" + name).c_str(),
        [name, what, flat](benchmark::State& st) { bm_threads(st, name, what, flat); })
        ->ArgName("threads")
        ->Arg(2)
        ->Arg(0)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  for (std::string const name : {"int8_g128_sym_rne_f32", "int4_g128_sym_sr_f32"}) {
    threads("quantize", name, threaded_call::quantize);
    threads("dequantize", name, threaded_call::dequantize);
  }
  // A flat buffer (one row of 32 Mi elements, as gradients and weights are often held).
  threads("quantize_flat", "int8_g128_sym_rne_f32", threaded_call::quantize, true);
  threads("dequantize_flat", "int8_g128_sym_rne_f32", threaded_call::dequantize, true);
  for (std::string const name : {"int4_g128_sym_rne_f32", "int8_row_sym_rne_f32"}) {
    threads("measure", name, threaded_call::measure);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
