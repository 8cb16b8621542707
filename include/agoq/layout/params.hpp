/// \file
/// Reading and writing one group's stored scale and zero point in a quantized view, shared by
/// the CPU executor and the CUDA kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "../numeric/codec.hpp"
#include "../numeric/scale.hpp"
#include "view.hpp"

namespace agoq {

/// Writes group g's scale (in the view's scale format, little-endian) and, for asymmetric codes,
/// its zero point. `p.scale` must be a value the format stores exactly (make_group_params gives
/// such values). Host and device.
template <class Byte>
AGOQ_HOST_DEVICE inline void store_group_params(basic_quantized_view<Byte> const& v, std::int64_t g,
                                                group_params p) noexcept {
  switch (v.spec.scale) {
    case scale_format::f32: {
      float const s = scale_f32::store(p.scale);
      std::memcpy(v.scales + 4 * g, &s, 4);
      break;
    }
    case scale_format::bf16: {
      std::uint16_t const s = scale_bf16::store(p.scale);
      std::memcpy(v.scales + 2 * g, &s, 2);
      break;
    }
    case scale_format::e8m0:
      v.scales[g] = scale_e8m0::store(p.scale);
      break;
  }
  if (v.zero_points) v.zero_points[g] = static_cast<std::uint8_t>(p.zero_point);
}

/// Reads group g's scale and zero point. Host and device.
template <class Byte>
AGOQ_HOST_DEVICE inline group_params load_group_params(basic_quantized_view<Byte> const& v,
                                                       std::int64_t g) noexcept {
  group_params p;
  switch (v.spec.scale) {
    case scale_format::f32:
      std::memcpy(&p.scale, v.scales + 4 * g, 4);
      break;
    case scale_format::bf16: {
      std::uint16_t s;
      std::memcpy(&s, v.scales + 2 * g, 2);
      p.scale = scale_bf16::load(s);
      break;
    }
    case scale_format::e8m0:
      p.scale = scale_e8m0::load(v.scales[g]);
      break;
  }
  if (v.zero_points) p.zero_point = v.zero_points[g];
  return p;
}

/// A group's parameters from its statistics under a runtime scale format. Host and device.
template <code_format Code>
AGOQ_HOST_DEVICE inline group_params make_group_params(scale_format f,
                                                       group_stats const& st) noexcept {
  switch (f) {
    case scale_format::bf16:
      return make_group_params<Code, scale_bf16>(st);
    case scale_format::e8m0:
      return make_group_params<Code, scale_e8m0>(st);
    default:
      return make_group_params<Code, scale_f32>(st);
  }
}

}  // namespace agoq
