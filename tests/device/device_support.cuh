// Shared helpers of the device tests: owning device buffers, random inputs and comparisons of a
// device quantized buffer with the CPU executor's.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <agoq/agoq.hpp>
#include <agoq/quantize.cuh>

namespace agoq::test {

/// True in the emulated device tier (tests/emulator: the kernels run on the host), where a test
/// that compares device code with the same host code compiled twice would prove nothing.
#if defined(AGOQ_DEVICE_EMULATION)
inline constexpr bool emulated = true;
#else
inline constexpr bool emulated = false;
#endif

/// A cudaMalloc'ed buffer of n bytes.
class device_bytes {
 public:
  explicit device_bytes(std::size_t n) : n_(n) {
    if (n_ > 0) AGOQ_CUDA_TRY(cudaMalloc(&p_, n_));
  }
  ~device_bytes() { cudaFree(p_); }
  device_bytes(device_bytes const&) = delete;
  device_bytes& operator=(device_bytes const&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(p_); }
  void upload(void const* src, std::size_t n, std::size_t at = 0) const {
    AGOQ_CUDA_TRY(cudaMemcpy(get() + at, src, n, cudaMemcpyHostToDevice));
  }
  void download(void* dst, std::size_t n, std::size_t at = 0) const {
    AGOQ_CUDA_TRY(cudaMemcpy(dst, get() + at, n, cudaMemcpyDeviceToHost));
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Random normal data with ties at power-of-two steps, zeros, subnormals, NaN and ±Inf.
template <class T>
std::vector<T> random_input(std::int64_t n, std::uint64_t seed, bool non_finite) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) {
    float f = normal(gen) * ((gen() % 64 == 0) ? 30.0f : 1.0f);
    switch (gen() % 40) {
      case 0:
        f = static_cast<float>(static_cast<int>(gen() % 33) - 16) * 0.125f + 0.0625f;
        break;
      case 1:
        f = 0.0f;
        break;
      case 2:
        f = std::numeric_limits<float>::denorm_min() * 3.0f;
        break;
      case 3:
        if (non_finite) f = std::numeric_limits<float>::quiet_NaN();
        break;
      case 4:
        if (non_finite) f = (gen() & 1 ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity();
        break;
      default:
        break;
    }
    v = numeric::from_float<T>(f);
  }
  return x;
}

/// The bytes of each section of a device quantized view, downloaded.
struct sections {
  std::vector<std::uint8_t> codes, scales, zero_points;
};

inline sections download(const_quantized_view v) {
  quantized_layout const l = v.layout();
  sections s;
  s.codes.resize(static_cast<std::size_t>(l.codes_bytes));
  s.scales.resize(static_cast<std::size_t>(l.scales_bytes));
  s.zero_points.resize(static_cast<std::size_t>(l.zero_points_bytes));
  if (l.codes_bytes)
    AGOQ_CUDA_TRY(cudaMemcpy(s.codes.data(), v.codes, s.codes.size(), cudaMemcpyDeviceToHost));
  if (l.scales_bytes)
    AGOQ_CUDA_TRY(cudaMemcpy(s.scales.data(), v.scales, s.scales.size(), cudaMemcpyDeviceToHost));
  if (l.zero_points_bytes) {
    AGOQ_CUDA_TRY(cudaMemcpy(s.zero_points.data(), v.zero_points, s.zero_points.size(),
                             cudaMemcpyDeviceToHost));
  }
  return s;
}

inline sections host_sections(const_quantized_view v) {
  quantized_layout const l = v.layout();
  sections s;
  s.codes.assign(v.codes, v.codes + l.codes_bytes);
  s.scales.assign(v.scales, v.scales + l.scales_bytes);
  if (l.zero_points_bytes) s.zero_points.assign(v.zero_points, v.zero_points + l.zero_points_bytes);
  return s;
}

/// Index of the first differing byte, or -1.
inline std::int64_t first_difference(std::vector<std::uint8_t> const& a,
                                     std::vector<std::uint8_t> const& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  }
  return -1;
}

}  // namespace agoq::test
