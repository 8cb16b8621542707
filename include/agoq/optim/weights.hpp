/// \file
/// Weight quantization helpers: named wrappers over agoq::quantize / agoq::fake_quantize with the
/// specs that suit a linear layer's weight, and the straight-through-estimator convention for
/// quantization-aware training in a framework.
///
/// Weights are taken as the row-major [out_features, in_features] matrix of torch.nn.Linear (and
/// Megatron's linear layers), so one output channel is one row:
/// - per-channel quantization is agoq's `row` grouping (one scale per output channel), e.g.
///   int8_row_sym_rne_f32. agoq's `col` grouping would be per *input* channel and is not used
///   here; a caller with [in, out] weights should pass the transpose or use `col` directly.
/// - per-block quantization is agoq's `b128x128` grouping (one scale per 128 x 128 tile, the
///   DeepSeek-V3 style block), e.g. int4_b128x128_sym_rne_f32.
///
/// Straight-through estimator (STE): the forward pass uses fake_quantize_weights(w) in place of
/// w; the backward pass hands dL/dŵ back as dL/dw unchanged (straight_through). agoq does not
/// mask the gradient where a weight was clipped because its symmetric scales are absmax / qmax
/// rounded *up* to the stored scale format, so no finite weight is ever clipped: |w| <= qmax *
/// scale for every element of every group (tests/optim/weights_test.cpp checks it). The clipped
/// STE's mask is therefore all ones and equals the identity; only NaN / ±Inf weights (counted by
/// the return value of the quantizing calls) lie outside, and those need the caller's attention
/// anyway.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "../error.hpp"
#include "../layout/matrix.hpp"
#include "../layout/tensor.hpp"
#include "../numeric/element.hpp"
#include "../quantize.hpp"
#include "../scheme/spec.hpp"

namespace agoq::optim {

/// How a weight matrix [out_features, in_features] is grouped.
enum class weight_grouping : std::uint8_t {
  per_channel,  ///< one scale per output channel (row): agoq grouping `row`
  per_block,    ///< one scale per 128 x 128 tile: agoq grouping `b128x128`
};

/// The code families of every weight format (to_spec): the code list of the weight helpers'
/// quantize calls, which compile these two families' kernels alone.
using weight_codes = type_list<int_sym<8>, int_sym<4>>;

/// A weight quantization format: grouping, 8 or 4 bits, symmetric signed codes.
struct weight_format {
  weight_grouping grouping = weight_grouping::per_channel;
  int bits = 8;                                     ///< 8 or 4
  rounding_kind rounding = rounding_kind::nearest;  ///< nearest (deployment) or stochastic
  scale_format scale = scale_format::f32;           ///< stored scale type

  /// The agoq spec: int<bits>_row_sym_<r>_<scale> or int<bits>_b128x128_sym_<r>_<scale>. Host
  /// only. \throws agoq::invalid_argument unless bits is 8 or 4.
  spec to_spec() const {
    AGOQ_EXPECTS(bits == 8 || bits == 4,
                 "weight_format: weights take 8 or 4 bits, got " + std::to_string(bits));
    spec s;
    s.code = code_kind::int_sym;
    s.bits = bits;
    if (grouping == weight_grouping::per_channel) {
      s.grouping = grouping_kind::row;
    } else {
      s.grouping = grouping_kind::block;
      s.group_rows = 128;
      s.group_cols = 128;
    }
    s.rounding = rounding;
    s.scale = scale;
    s.validate();
    return s;
  }
};

/// Quantizes the [out, in] weight matrix `w` (float, bfloat16 or half) into a new quantized
/// tensor of format `f`. `nonfinite`, when given, receives the count of NaN / ±Inf weights
/// (encoded as agoq::quantize documents). Host only; synchronous.
/// \throws agoq::invalid_argument on an invalid format or a null pointer; std::bad_alloc.
template <class In>
requires element_type<std::remove_const_t<In>> quantized_tensor
quantize_weights(host_executor ex, matrix_view<In> w, weight_format const& f,
                 quantize_options opt = {}, std::int64_t* nonfinite = nullptr) {
  quantized_tensor q(f.to_spec(), w.extent(0), w.extent(1));
  std::int64_t const bad = quantize<weight_codes>(ex, w, q.view(), opt);
  if (nonfinite) *nonfinite = bad;
  return q;
}

/// Fake-quantizes the [out, in] weight matrix `w` with format `f` into `out` (the forward pass of
/// quantization-aware training): bit-identical to quantize_weights followed by agoq::dequantize.
/// `w` and `out` may be the same buffer. Returns the count of non-finite weights. Host only;
/// synchronous.
/// \throws agoq::invalid_argument as agoq::fake_quantize does, or for an invalid format.
template <class In, class Out>
requires element_type<std::remove_const_t<In>> && element_type<Out> std::int64_t
fake_quantize_weights(host_executor ex, weight_format const& f, matrix_view<In> w,
                      matrix_view<Out> out, quantize_options opt = {}) {
  return fake_quantize<weight_codes>(ex, f.to_spec(), w, out, opt);
}

namespace detail {

/// Checks straight_through's operands (same extents, non-null data); returns whether a copy is
/// needed (false when empty or the same buffer).
template <class G>
bool straight_through_copies(matrix_view<G const> grad_wq, matrix_view<G> grad_w,
                             char const* what) {
  AGOQ_EXPECTS(grad_wq.extent(0) == grad_w.extent(0) && grad_wq.extent(1) == grad_w.extent(1),
               std::string(what) + ": the gradients' extents differ");
  AGOQ_EXPECTS(
      (grad_wq.data_handle() != nullptr && grad_w.data_handle() != nullptr) || grad_w.size() == 0,
      std::string(what) + ": null gradient pointer");
  return grad_w.size() != 0 && grad_wq.data_handle() != grad_w.data_handle();
}

}  // namespace detail

/// The backward pass of fake_quantize_weights under agoq's STE convention: the gradient with
/// respect to the weights is the gradient with respect to the fake-quantized weights, unchanged
/// (no clipping mask, see the file comment). Copies `grad_wq` into `grad_w` (a no-op when they
/// are the same buffer). Host only; synchronous.
/// \throws agoq::invalid_argument when the extents differ or a pointer is null.
template <class G>
requires element_type<G>
void straight_through(host_executor, matrix_view<G const> grad_wq, matrix_view<G> grad_w) {
  if (!detail::straight_through_copies(grad_wq, grad_w, "straight_through")) return;
  std::memmove(grad_w.data_handle(), grad_wq.data_handle(),
               static_cast<std::size_t>(grad_w.size()) * sizeof(G));
}

}  // namespace agoq::optim
