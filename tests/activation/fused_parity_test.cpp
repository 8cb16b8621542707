// Every output bit of the fused ops, pinned by hashes, for a build-independence check: the same
// file is built into activation_test (the project's flags: -march=native, g++'s default
// -ffp-contract=fast), into fused_baseline_isa_test (-march=x86-64: no FMA unit, so std::fma is
// libm's, and RMSNorm's portable loops instead of AVX-512) and into fused_no_contract_test
// (-ffp-contract=off); clang 14 gave the same hashes when tried by hand. All three must produce
// the hashes below, as the format contract's "same bits on every executor" asks of the host side
// (the device test compares the CUDA ops with the host ones). The inputs are made from integers,
// since the standard library's distributions are themselves floating-point code that a build may
// contract. A deliberate change of the ops' arithmetic changes the hashes; print them with
// AGOQ_PRINT_PARITY=1 and update them together.
#include <agoq/activation/fused.hpp>
#include <agoq/activation/policy.hpp>
#include <agoq/layout/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <vector>

using namespace agoq;
using namespace agoq::activation;

namespace {

constexpr std::int64_t rows = 67;
constexpr std::int64_t cols = 640;

/// FNV-1a over the bytes of some buffers.
class hasher {
 public:
  /// Elements of a tensor; every NaN hashes as one pattern, as IEEE 754 leaves NaN payloads and
  /// signs open (x86's vector units return the negative default NaN for an invalid operation,
  /// libm's fmaf the positive one).
  template <class T>
  hasher& add(std::vector<T> const& v) {
    T const nan = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    for (T const& e : v) add_bytes(std::isnan(numeric::to_float(e)) ? &nan : &e, sizeof(T));
    return *this;
  }
  hasher& add(quantized_tensor const& t) {
    return add_bytes(t.data(), static_cast<std::size_t>(t.bytes()));
  }
  std::uint64_t value() const { return h_; }

 private:
  hasher& add_bytes(void const* p, std::size_t n) {
    auto const* b = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ull;
    return *this;
  }
  std::uint64_t h_ = 14695981039346656037ull;
};

/// Values k / 512 for integers k in [-6000, 6000] (|x| < 12, including exact ties of the int4 and
/// int8 grids and zeros) from a linear congruential sequence, with a ±Inf and a NaN.
template <class T>
std::vector<T> input(std::uint64_t seed) {
  std::vector<T> x(static_cast<std::size_t>(rows * cols));
  std::uint64_t s = seed;
  for (auto& e : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    auto const k = static_cast<std::int64_t>((s >> 33) % 12001) - 6000;
    e = numeric::from_float<T>(static_cast<float>(k) / 512.0f);
  }
  x[5] = numeric::from_float<T>(std::numeric_limits<float>::infinity());
  x[700] = numeric::from_float<T>(-std::numeric_limits<float>::infinity());
  x[1500] = numeric::from_float<T>(std::numeric_limits<float>::quiet_NaN());
  return x;
}

template <class T>
matrix_view<T const> cview(std::vector<T> const& v) {
  return matrix_view<T const>(v.data(), rows, cols);
}
template <class T>
matrix_view<T> mview(std::vector<T>& v) {
  return matrix_view<T>(v.data(), rows, cols);
}

/// Checks a hash against the pinned one, printing it when asked.
void pin(char const* what, std::uint64_t got, std::uint64_t want) {
  if (std::getenv("AGOQ_PRINT_PARITY") != nullptr) {
    std::printf("%s 0x%016llxull\n", what, static_cast<unsigned long long>(got));
  }
  CAPTURE(what);
  CHECK(got == want);
}

quantize_options const opt{2024, 11};

template <class T>
std::uint64_t rmsnorm_hash() {
  auto const x = input<T>(1);
  auto const dy = input<T>(2);
  std::vector<T> w(static_cast<std::size_t>(cols));
  for (std::int64_t i = 0; i < cols; ++i) w[i] = numeric::from_float<T>(0.5f + (i % 7) / 8.0f);
  quantized_tensor saved(int8_g128, rows, cols);
  std::vector<T> y(x.size()), dx(x.size());
  std::vector<float> rstd(static_cast<std::size_t>(rows));
  std::vector<float> dw(static_cast<std::size_t>(cols), 0.125f);
  rmsnorm_forward(host, cview(x), std::span<T const>(w), 1e-5f, mview(y), saved.view(),
                  std::span<float>(rstd), opt);
  rmsnorm_backward(host, cview(dy), saved.view(), std::span<float const>(rstd),
                   std::span<T const>(w), mview(dx), std::span<float>(dw));
  return hasher{}.add(y).add(rstd).add(saved).add(dx).add(dw).value();
}

template <class T>
std::uint64_t swiglu_hash() {
  auto const g = input<T>(3);
  auto const u = input<T>(4);
  auto const d = input<T>(5);
  quantized_tensor sg(int4_g128, rows, cols), su(int4_g128, rows, cols);
  std::vector<T> out(g.size()), dg(g.size()), du(g.size());
  swiglu_forward(host, cview(g), cview(u), mview(out), sg.view(), su.view(), opt);
  swiglu_backward(host, cview(d), sg.view(), su.view(), mview(dg), mview(du));
  return hasher{}.add(out).add(sg).add(su).add(dg).add(du).value();
}

template <class T>
std::uint64_t gelu_hash() {
  auto const x = input<T>(6);
  auto const d = input<T>(7);
  quantized_tensor sx(int4_g128, rows, cols);
  std::vector<T> y(x.size()), dx(x.size());
  gelu_forward(host, cview(x), mview(y), sx.view(), opt);
  gelu_backward(host, cview(d), sx.view(), mview(dx));
  return hasher{}.add(y).add(sx).add(dx).value();
}

template <class T>
std::uint64_t residual_hash() {
  auto const a = input<T>(8);
  auto const b = input<T>(9);
  quantized_tensor saved(int8_g128, rows, cols);
  std::vector<T> sum(a.size());
  residual_add(host, cview(a), cview(b), mview(sum), saved.view(), opt);
  return hasher{}.add(sum).add(saved).value();
}

}  // namespace

TEST_CASE("fused ops: the same output bits in every build (float operands)") {
  pin("rmsnorm float", rmsnorm_hash<float>(), 0x11cd8d7cb41e7036ull);
  pin("swiglu float", swiglu_hash<float>(), 0x7be6778dc1606112ull);
  pin("gelu float", gelu_hash<float>(), 0x09e9d70a2867a42bull);
  pin("residual float", residual_hash<float>(), 0x26eb63a059947332ull);
}

TEST_CASE("fused ops: the same output bits in every build (bfloat16 operands)") {
  pin("rmsnorm bfloat16", rmsnorm_hash<bfloat16>(), 0x77a8466f9059937eull);
  pin("swiglu bfloat16", swiglu_hash<bfloat16>(), 0xf69fa92069155db1ull);
  pin("gelu bfloat16", gelu_hash<bfloat16>(), 0x9fbfc52c6362a579ull);
  pin("residual bfloat16", residual_hash<bfloat16>(), 0x03c96a24ffb20952ull);
}
