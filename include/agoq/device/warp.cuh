/// \file
/// Warp-level building blocks: the statistics of a group spread over consecutive lanes.
/// A butterfly of shuffles leaves the result in every lane, which is what each lane needs to
/// encode its own elements; max and min are exact, so any reduction order gives the same bits.
#pragma once

#include <cuda/std/bit>

#include "../numeric/codec.hpp"

namespace agoq::device {

/// Combines the statistics of `lanes` consecutive lanes (a power of two <= 32, the same in every
/// lane of the warp, the group's lanes aligned to a multiple of `lanes` inside the warp) and
/// returns them in every lane; `any` becomes true when any lane saw a finite value. Only what
/// `Code` reads is reduced: the absolute maximum for symmetric and FP8 codes, the minimum and
/// maximum for asymmetric ones. `lanes` is a run-time value, so one kernel serves every group
/// size (a butterfly of up to five shuffle steps, each taken when its distance is below `lanes`);
/// a constant folds to the steps it needs. All lanes of the warp must call it together. Device
/// only.
template <code_format Code>
__device__ inline group_stats group_allreduce(group_stats st, bool& any, int lanes) noexcept {
  if constexpr (Code::has_zero_point) {
    constexpr float big = 3.402823466e38f;
    // Lanes without a finite value contribute neutral elements.
    float mn = any ? st.min : big;
    float mx = any ? st.max : -big;
    unsigned a = any ? 1u : 0u;
    AGOQ_UNROLL
    for (int d = 1; d < 32; d <<= 1) {
      if (d >= lanes) break;
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
    for (int d = 1; d < 32; d <<= 1) {
      if (d >= lanes) break;
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, d));
    }
    return group_stats{am, 0.0f, 0.0f};
  }
}

}  // namespace agoq::device
