/// \file
/// Rounding modes of the quantizer.
#pragma once

#include <concepts>
#include <cstdint>

namespace agoq {

/// The rounding of a scheme, as kept in a runtime spec.
enum class rounding_kind : std::uint8_t {
  nearest,     ///< round half to even
  stochastic,  ///< floor(v + u), u uniform in [0, 1) from Philox4x32-10 (unbiased)
};

/// Round half to even.
struct round_nearest {
  static constexpr rounding_kind kind = rounding_kind::nearest;
};

/// Stochastic rounding keyed by `quantize_options::seed` and counted by the element's global
/// row-major index plus `quantize_options::offset`.
struct round_stochastic {
  static constexpr rounding_kind kind = rounding_kind::stochastic;
};

/// What a rounding policy type provides.
template <class R>
concept rounding_mode = requires {
  { R::kind } -> std::convertible_to<rounding_kind>;
};

}  // namespace agoq
