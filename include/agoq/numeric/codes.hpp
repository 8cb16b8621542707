/// \file
/// The code families: signed symmetric integers, unsigned asymmetric integers with a zero point,
/// and FP8. Each is a type whose constants describe the format (DESIGN §4).
#pragma once

#include <concepts>
#include <cstdint>

#include "fp8.hpp"

namespace agoq {

/// The family of a code, as stored in a runtime spec.
enum class code_kind : std::uint8_t {
  int_sym,    ///< signed integer, symmetric range [-qmax, qmax], no zero point
  uint_asym,  ///< unsigned integer [0, 2^b - 1] with an integer zero point
  fp8_e4m3,   ///< OCP FP8 E4M3, scaled
  fp8_e5m2,   ///< OCP FP8 E5M2, scaled
};

/// Signed symmetric b-bit integer code: q in [-qmax, qmax] with qmax = 2^(b-1) - 1 (2-bit is the
/// ternary {-1, 0, 1}); stored in b bits as two's complement.
template <int Bits>
requires(Bits == 2 || Bits == 4 || Bits == 8) struct int_sym {
  static constexpr code_kind kind = code_kind::int_sym;
  static constexpr int bits = Bits;
  static constexpr bool has_zero_point = false;
  static constexpr int qmax = (1 << (Bits - 1)) - 1;
  /// scale = absmax / range_divisor.
  static constexpr float range_divisor = static_cast<float>(qmax);
};

/// Unsigned asymmetric b-bit integer code: q in [0, 2^b - 1], x = (q - z) * scale with an
/// integer zero point z in the same range, so real zero is exact.
template <int Bits>
requires(Bits == 2 || Bits == 4 || Bits == 8) struct uint_asym {
  static constexpr code_kind kind = code_kind::uint_asym;
  static constexpr int bits = Bits;
  static constexpr bool has_zero_point = true;
  static constexpr int levels = (1 << Bits) - 1;
  /// scale = (hi - lo) / range_divisor.
  static constexpr float range_divisor = static_cast<float>(levels);
};

/// Scaled OCP FP8 E4M3 code (largest finite 448).
struct fp8_e4m3 {
  static constexpr code_kind kind = code_kind::fp8_e4m3;
  static constexpr int bits = 8;
  static constexpr bool has_zero_point = false;
  static constexpr numeric::fp8_format format = numeric::fp8_e4m3_format;
  static constexpr float range_divisor = format.max_value;
};

/// Scaled OCP FP8 E5M2 code (largest finite 57344).
struct fp8_e5m2 {
  static constexpr code_kind kind = code_kind::fp8_e5m2;
  static constexpr int bits = 8;
  static constexpr bool has_zero_point = false;
  static constexpr numeric::fp8_format format = numeric::fp8_e5m2_format;
  static constexpr float range_divisor = format.max_value;
};

/// What a code family type provides.
template <class C>
concept code_format = requires {
  { C::kind } -> std::convertible_to<code_kind>;
  { C::bits } -> std::convertible_to<int>;
  { C::has_zero_point } -> std::convertible_to<bool>;
  { C::range_divisor } -> std::convertible_to<float>;
};

/// True for the FP8 code families.
template <class C>
inline constexpr bool is_fp8_code =
    C::kind == code_kind::fp8_e4m3 || C::kind == code_kind::fp8_e5m2;

}  // namespace agoq
