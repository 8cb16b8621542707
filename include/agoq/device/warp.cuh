/// \file
/// Warp-level building blocks: the statistics of a group spread over `Lanes` consecutive lanes.
/// A butterfly of shuffles leaves the result in every lane, which is what each lane needs to
/// encode its own elements; max and min are exact, so any reduction order gives the same bits.
#pragma once

#include <cuda/std/bit>

#include "../numeric/codec.hpp"

namespace agoq::device {

/// Combines the statistics of `Lanes` consecutive lanes (Lanes a power of two <= 32, the group's
/// lanes aligned to a multiple of Lanes inside the warp) and returns them in every lane; `any`
/// becomes true when any lane saw a finite value. Only what `Code` reads is reduced: the absolute
/// maximum for symmetric and FP8 codes, the minimum and maximum for asymmetric ones. All lanes of
/// the warp must call it together. Device only.
template <code_format Code, int Lanes>
__device__ inline group_stats group_allreduce(group_stats st, bool& any) noexcept {
  static_assert(Lanes >= 1 && Lanes <= 32 && (Lanes & (Lanes - 1)) == 0,
                "group_allreduce: Lanes must be a power of two of at most 32");
  if constexpr (Code::has_zero_point) {
    constexpr float big = 3.402823466e38f;
    // Lanes without a finite value contribute neutral elements.
    float mn = any ? st.min : big;
    float mx = any ? st.max : -big;
    unsigned a = any ? 1u : 0u;
    AGOQ_UNROLL
    for (int d = 1; d < Lanes; d <<= 1) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, d));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      a |= __shfl_xor_sync(0xffffffffu, a, d);
    }
    any = a != 0;
    return any ? group_stats{0.0f, mn, mx} : group_stats{};
  } else {
    // An absolute maximum of 0 already means "no finite value" to make_group_params.
    float am = st.absmax;
    AGOQ_UNROLL
    for (int d = 1; d < Lanes; d <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, d));
    return group_stats{am, 0.0f, 0.0f};
  }
}

}  // namespace agoq::device
