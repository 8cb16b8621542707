/// \file
/// How each saved tensor is stored: the default policy (attention core precise, linear-layer and
/// activation-function inputs at 4 bits per group of 128, residual stream at 8 bits), a
/// compile-time policy concept to override it, and a run-time table. Host only.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/layout.hpp"
#include "../scheme/spec.hpp"
#include "layer_kind.hpp"

namespace agoq::activation {

/// How one saved tensor is stored: precise (as produced: bf16, or fp32 for the logsumexp) or
/// quantized with a spec.
struct storage {
  std::optional<spec> quantized;  ///< empty: kept precise

  /// Kept precise, not quantized.
  static constexpr storage precise() noexcept { return {}; }
  /// Quantized with `s`.
  static constexpr storage with(spec const& s) noexcept { return {s}; }
  /// Quantized with the scheme of a short name (spec::parse); throws on a bad name.
  static storage parse(std::string const& name) {
    if (name == "bf16" || name == "precise") return precise();
    return {spec::parse(name)};
  }

  /// True when kept precise.
  constexpr bool is_precise() const noexcept { return !quantized.has_value(); }
  /// Bits of one stored element, `precise_bits` when kept precise.
  constexpr int bits(int precise_bits = 16) const noexcept {
    return quantized ? quantized->bits : precise_bits;
  }
  /// The spec's short name; when kept precise "bf16", or "fp32" for 4-byte elements.
  std::string name(int precise_bytes = 2) const {
    if (quantized) return quantized->name();
    return precise_bytes == 4 ? "fp32" : "bf16";
  }

  /// Bytes of one tensor of shape `s` stored this way (quantized: make_layout's total_bytes).
  std::int64_t bytes(saved_shape const& s) const {
    return quantized ? make_layout(*quantized, s.rows, s.cols).total_bytes : s.bytes();
  }

  friend constexpr bool operator==(storage const&, storage const&) = default;
};

/// `int4_g128_sym_rne_f32`: linear-layer and activation-function inputs.
inline constexpr spec int4_g128 = {
    code_kind::int_sym, 4, grouping_kind::group, 1, 128, rounding_kind::nearest, scale_format::f32};
/// `int8_g128_sym_rne_f32`: the residual stream.
inline constexpr spec int8_g128 = {
    code_kind::int_sym, 8, grouping_kind::group, 1, 128, rounding_kind::nearest, scale_format::f32};

/// A compile-time activation policy: for each kind the storage used without a planner and the
/// candidates a planner may choose from (the default must be one of them).
template <class P>
concept activation_policy = requires(tensor_kind k) {
  { P::default_storage(k) } -> std::convertible_to<storage>;
  { P::candidates(k) } -> std::convertible_to<std::vector<storage>>;
};

/// agoq's default policy (AGoQ's layer-aware split):
/// - attention core (Q, K, V, O, logsumexp): precise; the softmax backward amplifies their
///   errors exponentially and flash attention needs them as they were;
/// - linear-layer and activation-function inputs: int4_g128_sym_rne_f32; a planner may raise
///   them to int8 or keep them precise;
/// - residual stream: int8_g128_sym_rne_f32 (outlier channels make 4 bits unsafe); a planner may
///   keep it precise;
/// - routing (a mixture-of-experts router's fp32 probabilities, 4 bytes a token per expert, and
///   its gated shared experts' bf16 gate score): precise; they scale each expert's output and
///   their gradient trains the router (the gate).
/// `o_proj_input` follows `attention_output` (it is that buffer, see is_alias).
struct default_policy {
  /// The storage used without a planner.
  static constexpr storage default_storage(tensor_kind k) noexcept {
    switch (category_of(storage_kind(k))) {
      case tensor_category::attention_core:
      case tensor_category::routing:
        return storage::precise();
      case tensor_category::residual_stream:
        return storage::with(int8_g128);
      default:
        return storage::with(int4_g128);
    }
  }
  /// The candidates a planner may choose from.
  static std::vector<storage> candidates(tensor_kind k) {
    switch (category_of(storage_kind(k))) {
      case tensor_category::attention_core:
      case tensor_category::routing:
        return {storage::precise()};
      case tensor_category::residual_stream:
        return {storage::with(int8_g128), storage::precise()};
      default:
        return {storage::with(int4_g128), storage::with(int8_g128), storage::precise()};
    }
  }
};
static_assert(activation_policy<default_policy>);

/// The run-time policy: per kind, the default storage and the planner's candidates. Built from a
/// compile-time policy and edited with `set`. Aliases (o_proj_input) always follow the kind whose
/// buffer they read; setting them throws.
class policy_table {
 public:
  /// The table of agoq::activation::default_policy.
  policy_table() : policy_table(from<default_policy>()) {}

  /// The table of a compile-time policy. Throws agoq::invalid_argument when a default is not
  /// among its kind's candidates or a candidate's spec is invalid.
  template <activation_policy P>
  static policy_table from() {
    policy_table t(0);
    for (tensor_kind const k : all_tensor_kinds) {
      if (is_alias(k)) continue;
      t.set(k, P::default_storage(k), P::candidates(k));
    }
    return t;
  }

  /// Sets kind `k`'s default and candidates (duplicates removed, order kept). Throws
  /// agoq::invalid_argument when `k` is an alias, the list is empty, the default is not in it, or
  /// a spec is invalid.
  void set(tensor_kind k, storage const& default_storage, std::vector<storage> candidates) {
    AGOQ_EXPECTS(!is_alias(k), "policy: " + std::string(name_of(k)) + " reads the buffer of " +
                                   std::string(name_of(storage_kind(k))) + "; set that instead");
    AGOQ_EXPECTS(!candidates.empty(),
                 "policy: " + std::string(name_of(k)) + " needs at least one candidate");
    std::vector<storage> unique;
    for (storage const& c : candidates) {
      if (c.quantized) c.quantized->validate();
      if (std::find(unique.begin(), unique.end(), c) == unique.end()) unique.push_back(c);
    }
    AGOQ_EXPECTS(std::find(unique.begin(), unique.end(), default_storage) != unique.end(),
                 "policy: the default " + default_storage.name() + " of " +
                     std::string(name_of(k)) + " is not among its candidates");
    auto& e = entries_[static_cast<std::size_t>(index_of(k))];
    e.default_storage = default_storage;
    e.candidates = std::move(unique);
  }

  /// Fixes kind `k` to one storage (default and only candidate).
  void fix(tensor_kind k, storage const& s) { set(k, s, {s}); }

  /// The storage of kind `k` without a planner (an alias: that of the kind it reads).
  storage const& default_storage(tensor_kind k) const noexcept {
    return entries_[static_cast<std::size_t>(index_of(storage_kind(k)))].default_storage;
  }
  /// The planner's candidates for kind `k` (an alias: those of the kind it reads).
  std::vector<storage> const& candidates(tensor_kind k) const noexcept {
    return entries_[static_cast<std::size_t>(index_of(storage_kind(k)))].candidates;
  }

  /// The table keeping every tensor precise (the bf16 baseline).
  static policy_table all_precise() {
    policy_table t(0);
    for (tensor_kind const k : all_tensor_kinds)
      if (!is_alias(k)) t.fix(k, storage::precise());
    return t;
  }

 private:
  struct entry {
    storage default_storage;
    std::vector<storage> candidates;
  };
  explicit policy_table(int) {}
  std::array<entry, tensor_kind_count> entries_{};
};

}  // namespace agoq::activation
