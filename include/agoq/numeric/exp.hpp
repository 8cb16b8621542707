/// \file
/// e^x in fp32 with the same bits on every executor. The C library's expf and CUDA's expf are
/// different approximations (glibc's within about 0.5 ulp, CUDA's within 2 ulp), so an op that
/// goes through e^x (SiLU, GeLU) would round differently on the host and on the device. agoq's
/// exp is written in operations that IEEE 754 rounds exactly and both sides perform alike (fused
/// multiply-adds, one exact subtraction, multiplications by powers of two and integer bit
/// arithmetic), with no product left next to a sum, so no compiler contracts it differently.
#pragma once

#include <cstdint>

#include <cuda/std/cmath>

#include "bits.hpp"

namespace agoq::numeric {

/// e^x as the exact product head * scale of two floats (scale a power of two), which lets a
/// caller that adds to e^x round once with a fused multiply-add (sigmoid's 1 + e^-g) rather than
/// leave a product next to a sum for each compiler to contract or not. Host and device.
struct exp_product {
  float head;   ///< e^x / scale, rounded once; within [2^-75 * 0.7, 2^65 * 1.42]
  float scale;  ///< a power of two
};

/// e^x as exp_product: x is clamped to [-104, 89] (beyond which e^x is 0 or +Inf anyway; NaN
/// passes the clamp), n = round(x log2 e) by the 1.5 * 2^23 shifter in a fused multiply-add,
/// r = x - n ln 2 in two fused multiply-adds with ln 2 split Cody-Waite style (exact up to the
/// second's rounding, |r| <= 0.35), e^r by its Taylor polynomial of degree 7 in Horner form (the
/// truncation is below 2^-27 relative), head = e^r * 2^floor(n/2) (exact) and scale =
/// 2^(n - floor(n/2)): both powers are normal floats for every n of the clamped range. Host and
/// device.
AGOQ_HOST_DEVICE inline exp_product exp_parts(float x) noexcept {
  constexpr float shifter = 12582912.0f;  // 1.5 * 2^23
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0x1.62e4p-1f;  // 12 significant bits: k * ln2_hi is exact
  constexpr float ln2_lo = 0x1.7f7d1cp-20f;
  float const c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float const kf = cuda::std::fma(c, log2e, shifter);
  float const k = kf - shifter;
  // kf = shifter + n lies in [2^23, 2^24), where the float bits count in units of 1 (for a NaN
  // x, n is some integer of magnitude below 2^31 and the NaN carries through r).
  auto const n = static_cast<std::int32_t>(float_bits(kf) - float_bits(shifter));
  float r = cuda::std::fma(k, -ln2_hi, c);
  r = cuda::std::fma(k, -ln2_lo, r);
  float p = cuda::std::fma(r, 1.0f / 5040.0f, 1.0f / 720.0f);
  p = cuda::std::fma(p, r, 1.0f / 120.0f);
  p = cuda::std::fma(p, r, 1.0f / 24.0f);
  p = cuda::std::fma(p, r, 1.0f / 6.0f);
  p = cuda::std::fma(p, r, 0.5f);
  p = cuda::std::fma(p, r, 1.0f);
  p = cuda::std::fma(p, r, 1.0f);
  std::int32_t const n1 = n >> 1;
  std::int32_t const n2 = n - n1;
  return {p * bits_float(static_cast<std::uint32_t>(n1 + 127) << 23),
          bits_float(static_cast<std::uint32_t>(n2 + 127) << 23)};
}

/// e^x in fp32 (head * scale of exp_parts, one rounding, also where the result is subnormal), the
/// same bits on the host and on the device. Within 0.94 ulp of e^x for every float (the exact
/// value rounded to nearest for 99.54% of them: checked over all 2^32 inputs against double exp,
/// subnormal results included); exp(-Inf) = 0, exp(+Inf) = +Inf, results above FLT_MAX overflow
/// to +Inf and those below half the smallest subnormal round to 0; NaN in, NaN out.
AGOQ_HOST_DEVICE inline float exp_fp32(float x) noexcept {
  exp_product const e = exp_parts(x);
  return e.head * e.scale;
}

}  // namespace agoq::numeric
