/// \file
/// agoq's first run: the library's main job shown on the CPU in a few seconds.
///
/// It generates three tensors like the ones training keeps (an LLM activation with outlier
/// channels, a heavy-tailed gradient, a weight matrix with per-row scales) from a fixed seed,
/// quantizes each with several schemes on the CPU executor, and prints per scheme what it costs
/// (bits per element, bytes) and what it loses (relative RMS error, max error, SQNR), then shows
/// that stochastic rounding is unbiased. Every section is a function so later sections (plans,
/// memory tables, training) slot in beside them.
///
/// Uses only agoq and the standard library; single-threaded.

#include <agoq/activation/statistics.hpp>
#include <agoq/agoq.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace demo {

// ---------------------------------------------------------------------------------------------
// Random numbers: a self-contained generator, so the tensors are the same on every platform and
// standard library (the distributions of <random> are implementation-defined).

/// xoshiro256** seeded through splitmix64, with uniform and normal draws.
class random_source {
 public:
  explicit random_source(std::uint64_t seed) noexcept {
    for (auto& s : state_) {
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }

  std::uint64_t next() noexcept {
    std::uint64_t const result = rotl(state_[1] * 5, 7) * 9;
    std::uint64_t const t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  /// Uniform in (0, 1): never 0, so its logarithm is finite.
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

  /// Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double const r = std::sqrt(-2.0 * std::log(uniform()));
    double const phi = 2.0 * std::numbers::pi * uniform();
    spare_ = r * std::sin(phi);
    has_spare_ = true;
    return r * std::cos(phi);
  }

  /// Student-t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3), a heavy tail (infinite kurtosis).
  double student_t3() noexcept {
    double const z = normal();
    double const a = normal();
    double const b = normal();
    double const c = normal();
    return z / std::sqrt((a * a + b * b + c * c) / 3.0);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

  std::uint64_t state_[4] = {};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// ---------------------------------------------------------------------------------------------
// The tensors.

/// A bf16 matrix that training would keep, with the schemes the demo tries on it.
struct sample_tensor {
  std::string name;         ///< short label
  std::string description;  ///< what it imitates
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<agoq::bfloat16> values;  ///< row-major
  std::vector<std::string> schemes;    ///< short names for agoq::spec::parse

  std::int64_t elements() const noexcept { return rows * cols; }
  std::int64_t bf16_bytes() const noexcept {
    return elements() * static_cast<std::int64_t>(sizeof(agoq::bfloat16));
  }
  agoq::matrix_view<agoq::bfloat16 const> view() const noexcept {
    return agoq::matrix_view<agoq::bfloat16 const>(values.data(), rows, cols);
  }
};

/// An LLM activation [tokens, hidden]: unit-normal entries with a mild per-token scale, and about
/// 1% of the hidden channels 20-50x larger in every token (the systematic outlier channels of
/// LLM activations, which break per-tensor and per-token scales).
inline sample_tensor make_activation(std::int64_t tokens, std::int64_t hidden, std::uint64_t seed) {
  random_source rng(seed);
  std::vector<float> channel_scale(static_cast<std::size_t>(hidden), 1.0f);
  std::int64_t const outliers = std::max<std::int64_t>(1, hidden / 100);
  for (std::int64_t i = 0; i < outliers; ++i) {
    auto const c = static_cast<std::size_t>(rng.next() % static_cast<std::uint64_t>(hidden));
    channel_scale[c] = static_cast<float>(20.0 + 30.0 * rng.uniform());
  }
  sample_tensor t{"activation",
                  "LLM hidden state [tokens, hidden], bf16, ~1% outlier channels 20-50x larger",
                  tokens,
                  hidden,
                  {},
                  {"int8_tensor_sym_rne_f32", "int8_row_sym_rne_f32", "int8_col_sym_rne_f32",
                   "int8_g128_sym_rne_f32", "mxint8", "mxfp8", "int4_tensor_sym_rne_f32",
                   "int4_row_sym_rne_f32", "int4_g128_sym_rne_f32", "int4_g128_asym_rne_f32",
                   "int4_g32_sym_rne_bf16", "int4_col_sym_rne_f32", "int2_g32_sym_rne_f32"}};
  t.values.resize(static_cast<std::size_t>(t.elements()));
  for (std::int64_t r = 0; r < tokens; ++r) {
    auto const token_scale = static_cast<float>(std::exp(0.3 * rng.normal()));
    for (std::int64_t c = 0; c < hidden; ++c) {
      auto const v = static_cast<float>(rng.normal()) * token_scale *
                     channel_scale[static_cast<std::size_t>(c)];
      t.values[static_cast<std::size_t>(r * hidden + c)] =
          agoq::numeric::from_float<agoq::bfloat16>(v);
    }
  }
  return t;
}

/// A gradient: Student-t (3 degrees of freedom) entries scaled to about 1e-3, the heavy tail of
/// real gradients, where a few entries are tens of times the typical one.
inline sample_tensor make_gradient(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  random_source rng(seed);
  sample_tensor t{"gradient",
                  "weight gradient, bf16, Student-t (3 dof) x 1e-3",
                  rows,
                  cols,
                  {},
                  {"int8_tensor_sym_rne_f32", "int8_row_sym_rne_f32", "int8_g128_sym_rne_f32",
                   "int8_g128_sym_sr_f32", "mxint8", "fp8e4m3_g128_rne_f32", "fp8e5m2_g128_rne_f32",
                   "mxfp8", "int4_g128_sym_rne_f32", "int4_g128_sym_sr_f32"}};
  t.values.resize(static_cast<std::size_t>(t.elements()));
  for (auto& v : t.values)
    v = agoq::numeric::from_float<agoq::bfloat16>(static_cast<float>(1e-3 * rng.student_t3()));
  return t;
}

/// A weight matrix [out, in]: normal entries (std 0.02) times a log-normal per-row (output
/// channel) scale, so rows differ in magnitude by several times.
inline sample_tensor make_weight(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  random_source rng(seed);
  sample_tensor t{"weight",
                  "linear weight [out, in], bf16, N(0, 0.02) x log-normal per-row scale",
                  rows,
                  cols,
                  {},
                  {"int8_tensor_sym_rne_f32", "int8_row_sym_rne_f32", "int8_col_sym_rne_f32",
                   "int8_b128x128_sym_rne_f32", "fp8e4m3_b128x128_rne_f32", "int4_row_sym_rne_f32",
                   "int4_b128x128_sym_rne_f32", "int4_g128_sym_rne_f32", "int4_g128_asym_rne_f32",
                   "int4_g32_sym_rne_e8m0", "int2_g32_sym_rne_f32"}};
  t.values.resize(static_cast<std::size_t>(t.elements()));
  for (std::int64_t r = 0; r < rows; ++r) {
    double const row_scale = 0.02 * std::exp(0.5 * rng.normal());
    for (std::int64_t c = 0; c < cols; ++c)
      t.values[static_cast<std::size_t>(r * cols + c)] =
          agoq::numeric::from_float<agoq::bfloat16>(static_cast<float>(row_scale * rng.normal()));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Measuring a scheme.

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Error of a reconstruction `y` of `x`.
struct error_stats {
  double rel_rms = 0.0;         ///< ||x - y|| / ||x||
  double max_abs = 0.0;         ///< max |x - y|
  double sqnr_db = 0.0;         ///< 10 log10(||x||^2 / ||x - y||^2); infinite when exact
  double mean_err = 0.0;        ///< mean of (y - x): the bias
  double magnitude_bias = 0.0;  ///< mean of sign(x) (y - x): < 0 when magnitudes shrink
};

inline error_stats compare(std::vector<agoq::bfloat16> const& x, std::vector<float> const& y) {
  double signal = 0.0;
  double noise = 0.0;
  double sum_err = 0.0;
  double magnitude_bias = 0.0;
  double max_abs = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const xi = agoq::numeric::to_float(x[i]);
    double const e = static_cast<double>(y[i]) - xi;
    signal += xi * xi;
    noise += e * e;
    sum_err += e;
    magnitude_bias += xi > 0 ? e : xi < 0 ? -e : 0.0;
    max_abs = std::max(max_abs, std::abs(e));
  }
  error_stats s;
  s.rel_rms = signal > 0.0 ? std::sqrt(noise / signal) : 0.0;
  s.max_abs = max_abs;
  s.sqnr_db =
      noise > 0.0 ? 10.0 * std::log10(signal / noise) : std::numeric_limits<double>::infinity();
  s.mean_err = x.empty() ? 0.0 : sum_err / static_cast<double>(x.size());
  s.magnitude_bias = x.empty() ? 0.0 : magnitude_bias / static_cast<double>(x.size());
  return s;
}

/// One row of a table.
struct scheme_result {
  std::string name;             ///< canonical short name
  std::string alias;            ///< the name asked for, when it differs (mxfp8, mxint8)
  double bits_per_element = 0;  ///< total bytes (codes, scales, zero points, padding) * 8 / n
  std::int64_t bytes = 0;
  error_stats error;
  double quantize_ms_per_gb = 0.0;    ///< per GB of bf16 input
  double dequantize_ms_per_gb = 0.0;  ///< per GB of bf16-equivalent (elements * 2 bytes)
  std::int64_t non_finite = 0;
};

/// Repetitions of each timed call; the fastest counts (the first run also faults pages in).
inline constexpr int timing_repeats = 2;

/// Quantizes `t` with `scheme_name`, dequantizes to float, and measures bytes, error and time.
inline scheme_result evaluate(sample_tensor const& t, std::string const& scheme_name,
                              std::vector<float>& scratch) {
  agoq::spec const s = agoq::spec::parse(scheme_name);
  agoq::quantized_tensor q(s, t.rows, t.cols);
  scratch.resize(static_cast<std::size_t>(t.elements()));
  agoq::matrix_view<float> const out(scratch.data(), t.rows, t.cols);

  scheme_result r;
  r.name = s.name();
  if (scheme_name != r.name) r.alias = scheme_name;
  r.bytes = q.bytes();
  r.bits_per_element = 8.0 * static_cast<double>(q.bytes()) / static_cast<double>(t.elements());

  double best_q = std::numeric_limits<double>::infinity();
  double best_dq = std::numeric_limits<double>::infinity();
  for (int i = 0; i < timing_repeats; ++i) {
    auto const t0 = clock_type::now();
    r.non_finite = agoq::quantize(agoq::host, t.view(), q.view(), agoq::quantize_options{1234, 0});
    best_q = std::min(best_q, seconds_since(t0));
    auto const t1 = clock_type::now();
    agoq::dequantize(agoq::host, std::as_const(q).view(), out);
    best_dq = std::min(best_dq, seconds_since(t1));
  }
  double const gb = static_cast<double>(t.bf16_bytes()) * 1e-9;
  r.quantize_ms_per_gb = 1e3 * best_q / gb;
  r.dequantize_ms_per_gb = 1e3 * best_dq / gb;
  r.error = compare(t.values, scratch);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Printing.

inline std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

/// The banner: what agoq is and what this run does.
inline void print_header() {
  std::printf("agoq %d.%d.%d - quantization that cuts the memory and traffic of LLM training\n",
              agoq::version_major, agoq::version_minor, agoq::version_patch);
  std::printf(
      "  saved activations (~4 bit), gradients (8 bit + an 8-bit all-reduce), optimizer states\n"
      "  and weights, in one byte layout shared by CUDA kernels and their bit-exact CPU twin.\n\n");
  // host_simd_isa names the vector loops the CPU executor was compiled with.
  std::printf(
      "This demo runs the CPU executor (%s loops, one thread) on synthetic tensors drawn from a\n"
      "fixed seed. Per scheme: bits per element and size, scales, zero points and padding\n"
      "included; error of the dequantized tensor against the bf16 input; time per GB of bf16\n"
      "(elements x 2 bytes), fastest of %d runs.\n\n",
      agoq::host_simd_isa, timing_repeats);
}

/// Prints one table of results for `t`, then the expansion of any alias it used.
inline void print_table(sample_tensor const& t, std::vector<scheme_result> const& results) {
  std::printf("  %-25s %7s %10s %8s %8s %9s %6s %7s %7s\n", "scheme", "bits/el", "size", "vs bf16",
              "rel RMS", "max |err|", "SQNR", "quant", "dequant");
  std::printf("  %-25s %7s %10s %8s %8s %9s %6s %7s %7s\n", "", "", "", "", "", "", "dB", "ms/GB",
              "ms/GB");
  std::printf("  %-25s %7.2f %10s %8s %8s %9s %6s\n", "bf16 (input)", 16.0,
              mib(t.bf16_bytes()).c_str(), "", "0", "0", "inf");
  std::string aliases;
  for (auto const& r : results) {
    double const change =
        100.0 * (static_cast<double>(r.bytes) / static_cast<double>(t.bf16_bytes()) - 1.0);
    std::printf("  %-25s %7.2f %10s %7.1f%% %8.2e %9.2e %6.1f %7.0f %7.0f\n",
                r.alias.empty() ? r.name.c_str() : r.alias.c_str(), r.bits_per_element,
                mib(r.bytes).c_str(), change, r.error.rel_rms, r.error.max_abs, r.error.sqnr_db,
                r.quantize_ms_per_gb, r.dequantize_ms_per_gb);
    if (r.non_finite != 0)
      std::printf("  %-25s (%lld non-finite inputs)\n", "", static_cast<long long>(r.non_finite));
    if (!r.alias.empty()) aliases += (aliases.empty() ? "" : ", ") + r.alias + " = " + r.name;
  }
  if (!aliases.empty()) std::printf("  (OCP MX: %s)\n", aliases.c_str());
}

inline scheme_result const* find(std::vector<scheme_result> const& results, std::string_view name) {
  for (auto const& r : results)
    if (r.name == name || r.alias == name) return &r;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Sections.

/// A tensor and how each of its schemes did.
struct section_output {
  sample_tensor tensor;
  std::vector<scheme_result> results;
};

/// Generates one tensor with `make` (one progress line as it goes), evaluates its schemes and
/// prints the table. Returns the tensor and results so later sections can use them.
template <class Make>
section_output run_tensor_section(int index, int count, Make&& make) {
  auto const t0 = clock_type::now();
  std::printf("[%d/%d] generating ... ", index, count);
  std::fflush(stdout);
  section_output out{make(), {}};
  sample_tensor const& t = out.tensor;
  std::printf("%s %lldx%lld (%s) in %.2f s; %zu schemes ... ", t.name.c_str(),
              static_cast<long long>(t.rows), static_cast<long long>(t.cols),
              mib(t.bf16_bytes()).c_str(), seconds_since(t0), t.schemes.size());
  std::fflush(stdout);
  auto const t1 = clock_type::now();
  std::vector<float> scratch;
  for (auto const& name : t.schemes) out.results.push_back(evaluate(t, name, scratch));
  std::printf("%.2f s\n      %s\n\n", seconds_since(t1), t.description.c_str());
  print_table(t, out.results);
  std::printf("\n");
  return out;
}

/// Prints what the activation table says about outlier channels: a scale per tensor or per token
/// spends the 4-bit range on the outliers; smaller groups share it with fewer elements, and a
/// scale per channel isolates them.
inline void print_outlier_note(std::vector<scheme_result> const& results) {
  auto const* tensor4 = find(results, "int4_tensor_sym_rne_f32");
  auto const* row4 = find(results, "int4_row_sym_rne_f32");
  auto const* g128 = find(results, "int4_g128_sym_rne_f32");
  auto const* g32 = find(results, "int4_g32_sym_rne_bf16");
  auto const* col4 = find(results, "int4_col_sym_rne_f32");
  if (tensor4 == nullptr || row4 == nullptr || g128 == nullptr || g32 == nullptr || col4 == nullptr)
    return;
  std::printf(
      "  outlier channels at 4 bits, SQNR: one scale per tensor %.1f dB, per token %.1f dB,\n"
      "  per 128 elements %.1f dB, per 32 elements %.1f dB, per channel %.1f dB.\n\n",
      tensor4->error.sqnr_db, row4->error.sqnr_db, g128->error.sqnr_db, g32->error.sqnr_db,
      col4->error.sqnr_db);
}

/// Prints the error model's prediction (agoq::activation, from statistics measured on the
/// tensor) beside the error the table measured, for the schemes the planner chooses between.
inline void print_model_note(sample_tensor const& t, std::vector<scheme_result> const& results) {
  std::printf("  the planner's error model, from statistics measured on this tensor:\n");
  for (char const* name :
       {"int4_g128_sym_rne_f32", "int8_g128_sym_rne_f32", "int4_row_sym_rne_f32"}) {
    auto const* r = find(results, name);
    if (r == nullptr) continue;
    agoq::spec const s = agoq::spec::parse(name);
    double const predicted = std::sqrt(agoq::activation::relative_error(
        s, agoq::activation::measure(agoq::host, t.view(), s), t.rows, t.cols));
    std::printf("    %-25s predicts rel RMS %.2e, measured %.2e\n", name, predicted,
                r->error.rel_rms);
  }
  std::printf(
      "  (the elements under half a step, which round to zero, count their own x^2, the others\n"
      "  the uniform step^2/12: outliers that make most of a group round to zero would make the\n"
      "  uniform model alone predict 0.40 at int4 g128 and 1.09 per token)\n\n");
}

/// Shows that stochastic rounding is unbiased where nearest rounding is not. Over a symmetric
/// gradient the plain mean error is near zero for both; the bias of nearest rounding is toward
/// zero (small entries flush to 0), measured as mean(sign(x) (x^ - x)). Averaging independent
/// draws (what a buffer that accumulates quantized micro-batch gradients does) removes sr's
/// noise and leaves rne's bias.
inline void run_stochastic_rounding_section(sample_tensor const& grad) {
  constexpr int draws = 8;
  std::printf(
      "stochastic rounding on the %s: mean error and mean error toward zero, mean(sign(x) *\n"
      "(x^ - x)), in %% of mean |x|; rel RMS error of one draw and of the mean of %d draws:\n",
      grad.name.c_str(), draws);
  auto const n = static_cast<std::size_t>(grad.elements());
  double mean_abs = 0.0;
  for (auto const v : grad.values) mean_abs += std::abs(agoq::numeric::to_float(v));
  mean_abs /= static_cast<double>(n);

  std::vector<float> one(n);
  std::vector<float> sum(n);
  agoq::matrix_view<float> const one_view(one.data(), grad.rows, grad.cols);
  for (std::string const base : {"int8_g128_sym", "int4_g128_sym"}) {
    for (std::string const rounding : {"rne", "sr"}) {
      agoq::spec const s = agoq::spec::parse(base + "_" + rounding + "_f32");
      std::fill(sum.begin(), sum.end(), 0.0f);
      error_stats first;
      for (int d = 0; d < draws; ++d) {
        // A fresh stream per draw, as each micro-batch or step gets its own offset.
        agoq::quantize_options const opt{7, static_cast<std::uint64_t>(d) * n};
        agoq::fake_quantize(agoq::host, s, grad.view(), one_view, opt);
        if (d == 0) first = compare(grad.values, one);
        for (std::size_t i = 0; i < n; ++i) sum[i] += one[i];
      }
      for (auto& v : sum) v /= draws;
      error_stats const averaged = compare(grad.values, sum);
      std::printf(
          "  %-14s %-3s  mean %+7.3f%%  toward 0 %+7.3f%%  rel RMS one %.2e, mean of %d %.2e\n",
          rounding == "rne" ? base.c_str() : "", rounding.c_str(),
          100.0 * first.mean_err / mean_abs, 100.0 * first.magnitude_bias / mean_abs, first.rel_rms,
          draws, averaged.rel_rms);
    }
  }
  std::printf("\n");
}

/// Section 4: per-GPU training memory of a LLaMA-3-8B-sized model, bf16 activations and fp32
/// gradients against agoq's layer-aware activations and 8-bit gradients (the memory model).
void run_memory_section(int index, int count) {
  namespace act = agoq::activation;
  act::model_shape const llama;  // the defaults are LLaMA-3-8B
  act::parallel_config parallel;
  parallel.tp = 2;
  parallel.pp = 4;
  parallel.dp = 4;
  parallel.zero_stage = 1;
  parallel.sp = true;
  act::step_config step;
  step.seq = 8192;
  act::policy_table const policy;
  auto const baseline = act::estimate_memory(
      llama, parallel, step, {act::gradient_format::fp32, act::optimizer_format::fp32},
      [](std::int64_t, act::tensor_kind) { return act::storage{}; });
  auto const agoq =
      act::estimate_memory(llama, parallel, step,
                           {act::gradient_format::int8_g128, act::optimizer_format::fp32}, policy);
  std::printf(
      "[%d/%d] training memory per GPU, LLaMA-3-8B, TP 2 x PP 4 (1F1B) x DP 4, ZeRO-1, SP,\n"
      "      micro-batch 1 x 8192 tokens (agoq::activation::estimate_memory, GiB)\n\n",
      index, count);
  std::printf("  stage  in flight   baseline: activations  total   agoq: activations  total\n");
  double const gib = 1024.0 * 1024.0 * 1024.0;
  for (std::size_t i = 0; i < baseline.size(); ++i) {
    std::printf(
        "  %5lld  %9lld   %22.2f %6.2f   %17.2f %6.2f\n", static_cast<long long>(baseline[i].stage),
        static_cast<long long>(baseline[i].in_flight.empty() ? 0 : baseline[i].in_flight[0]),
        (baseline[i].activations + baseline[i].head_activations) / gib, baseline[i].total() / gib,
        (agoq[i].activations + agoq[i].head_activations) / gib, agoq[i].total() / gib);
  }
  double const before = act::peak_total(baseline) / gib, after = act::peak_total(agoq) / gib;
  std::printf(
      "\n  peak %.2f GiB -> %.2f GiB (%.1f%% less): bf16 activations and fp32 gradients\n"
      "  against attention in bf16, linear/activation inputs int4_g128, residual int8_g128,\n"
      "  and 8-bit gradients (Adam states fp32 in both)\n\n",
      before, after, 100.0 * (1.0 - after / before));
}

/// Section 5: the 8-bit all-reduce of a gradient bucket over 4 ranks (threads), with the bytes
/// each rank sent and the error against an fp64 sum.
void run_all_reduce_section(int index, int count) {
  int const ranks = 4;
  std::int64_t const n = std::int64_t{1} << 20;
  std::printf("[%d/%d] 8-bit all-reduce of a %lld-element gradient over %d ranks (threads)\n",
              index, count, static_cast<long long>(n), ranks);
  std::vector<std::vector<float>> grads(ranks);
  for (int r = 0; r < ranks; ++r) {
    auto const t = make_gradient(1, n, 0x5eed + static_cast<std::uint64_t>(r));
    grads[static_cast<std::size_t>(r)].resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      grads[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] =
          agoq::numeric::to_float(t.values[static_cast<std::size_t>(i)]);
    }
  }
  std::vector<float> result(static_cast<std::size_t>(n));
  std::vector<std::uint64_t> sent(ranks);
  auto const t0 = clock_type::now();
  agoq::comm::in_process_group::run(ranks, [&](auto member) {
    agoq::comm::counting counted(member);
    std::vector<float> out(static_cast<std::size_t>(n));
    auto const& in = grads[static_cast<std::size_t>(member.rank())];
    agoq::gradient::all_reduce_8bit(agoq::host, counted, std::span<float const>(in),
                                    std::span<float>(out));
    sent[static_cast<std::size_t>(member.rank())] = counted.sent();
    if (member.rank() == 0) result = out;
  });
  double const ms = seconds_since(t0) * 1e3;
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (auto const& g : grads) sum += g[static_cast<std::size_t>(i)];
    double const d = result[static_cast<std::size_t>(i)] - sum;
    err2 += d * d;
    ref2 += sum * sum;
  }
  double const ring_bf16 = 2.0 * (ranks - 1) / ranks * static_cast<double>(n) * 2.0;
  std::printf(
      "  bytes sent per rank %llu, a bf16 ring all-reduce sends %.0f (%.3fx);\n"
      "  relative RMS error against the fp64 sum %.2e (each element quantized twice,\n"
      "  whatever the number of ranks); %.0f ms on the CPU\n\n",
      static_cast<unsigned long long>(sent[0]), ring_bf16, static_cast<double>(sent[0]) / ring_bf16,
      std::sqrt(err2 / ref2), ms);
}

}  // namespace demo

int main() {
  try {
    auto const t0 = demo::clock_type::now();
    demo::print_header();
    constexpr int sections = 5;
    auto const activation = demo::run_tensor_section(
        1, sections, [] { return demo::make_activation(2048, 4096, 0x0a11ce); });
    demo::print_outlier_note(activation.results);
    demo::print_model_note(activation.tensor, activation.results);
    auto const gradient = demo::run_tensor_section(
        2, sections, [] { return demo::make_gradient(2048, 4096, 0x9ad); });
    demo::run_stochastic_rounding_section(gradient.tensor);
    demo::run_tensor_section(3, sections, [] { return demo::make_weight(4096, 4096, 0x3e16); });
    demo::run_memory_section(4, sections);
    demo::run_all_reduce_section(5, sections);
    std::printf("done in %.1f s\n", demo::seconds_since(t0));
    return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "agoq_demo: %s\n", e.what());
    return 1;
  }
}
