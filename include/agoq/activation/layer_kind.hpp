/// \file
/// The tensors a transformer block saves for its backward pass (LLaMA-style, Qwen3-style and
/// GPT-style, the first two also with a mixture-of-experts MLP), their categories, and their
/// per-rank shapes as functions of the model shape and the tensor- and sequence-parallel
/// configuration. Host only.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "../error.hpp"
#include "../layout/layout.hpp"

namespace agoq::activation {

namespace detail {

/// `x` to three significant digits ("1.23e+20"), for messages about sizes.
inline std::string approx(long double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3Le", x);
  return text;
}

}  // namespace detail

/// The block a model is built from.
enum class block_style : std::uint8_t {
  llama,  ///< pre-RMSNorm, grouped-query attention, SwiGLU MLP (gate, up, down), no dropout
  gpt,    ///< pre-LayerNorm, multi-head attention, GeLU MLP (fc1, fc2)
  /// LLaMA's block with QK-norm (Qwen3): a per-head RMSNorm of the projected Q and K before the
  /// rotary embedding, which saves its inputs
  qwen3,
  /// LLaMA's block with a GeGLU MLP (gelu_tanh(gate) * up) and a second RMSNorm on each
  /// sub-block's output before the residual add (Gemma 2), which saves its input
  gemma2,
  /// Gemma 2's block with QK-norm (Gemma 3)
  gemma3,
};

/// True for the styles with RMSNorm and a gated MLP without biases (SwiGLU: llama, qwen3; GeGLU:
/// gemma2, gemma3), whose MLP saves the same three inner tensors.
inline constexpr bool llama_like(block_style s) noexcept { return s != block_style::gpt; }

/// True for the styles whose attention normalizes Q and K per head (qwen3, gemma3).
inline constexpr bool has_qk_norm(block_style s) noexcept {
  return s == block_style::qwen3 || s == block_style::gemma3;
}

/// True for the styles that normalize each sub-block's output before the residual add (gemma2,
/// gemma3).
inline constexpr bool has_post_norms(block_style s) noexcept {
  return s == block_style::gemma2 || s == block_style::gemma3;
}

/// One tensor a block saves in the forward pass for the backward pass. Attention is assumed to
/// be a fused (flash) kernel: it saves Q, K, V, its output and the per-row logsumexp, never the
/// [seq, seq] probabilities.
enum class tensor_kind : std::uint8_t {
  // LLaMA-style block.
  attn_norm_input,   ///< residual stream entering the attention RMSNorm [tokens, hidden]
  qkv_input,         ///< attention norm output, input of the QKV projection [tokens, hidden]
  query,             ///< Q after rotary embedding [tokens, heads * head_dim]
  key,               ///< K after rotary embedding [tokens, kv_heads * head_dim]
  value,             ///< V [tokens, kv_heads * head_dim]
  attention_output,  ///< attention output O, read by the attention backward (rowsum(dO * O))
  softmax_lse,     ///< per-row logsumexp of the attention softmax, fp32 [micro_batch * heads, seq]
  o_proj_input,    ///< input of the output projection: the same values as attention_output
  mlp_norm_input,  ///< residual stream entering the MLP RMSNorm [tokens, hidden]
  mlp_input,       ///< MLP norm output, input of the gate and up projections [tokens, hidden]
  gate_output,     ///< gate projection output, the SiLU input of SwiGLU [tokens, ffn]
  up_output,       ///< up projection output, the linear input of SwiGLU [tokens, ffn]
  swiglu_output,   ///< silu(gate) * up, input of the down projection [tokens, ffn]
  // GPT-style block (shares qkv_input .. o_proj_input with the LLaMA-style block).
  ln1_input,   ///< residual stream entering the attention LayerNorm [tokens, hidden]
  ln2_input,   ///< residual stream entering the MLP LayerNorm [tokens, hidden]
  fc1_input,   ///< MLP LayerNorm output, input of FC1 [tokens, hidden]
  gelu_input,  ///< FC1 output, the GeLU input [tokens, ffn]
  fc2_input,   ///< GeLU output, input of FC2 [tokens, ffn]
  // Qwen3-style block (the LLaMA-style block's kinds and these two).
  query_norm_input,  ///< Q projection output, the input of the QK-norm [tokens, heads * head_dim]
  key_norm_input,  ///< K projection output, the input of the QK-norm [tokens, kv_heads * head_dim]
  // Mixture-of-experts MLP (in place of gate_output .. swiglu_output; mlp_input is the router's
  // and the dispatcher's input). R = the (token, expert) pairs one rank's experts process.
  router_probs,          ///< the router's softmax over the experts, fp32 [tokens, experts]
  expert_input,          ///< the routed tokens in expert order, input of gate and up [R, hidden]
  expert_gate_output,    ///< the experts' gate projection outputs, SwiGLU's SiLU input [R, f_e]
  expert_up_output,      ///< the experts' up projection outputs, SwiGLU's linear input [R, f_e]
  expert_swiglu_output,  ///< the experts' silu(gate) * up, input of their down projection [R, f_e]
  // Gated shared experts (Qwen2-MoE): their output y, scaled per token by sigmoid(x w_gate).
  shared_expert_output,  ///< the shared experts' down projection output y [tokens, hidden]
  shared_gate_score,     ///< the shared experts' gate sigmoid(x w_gate) [tokens, 1]
  // Gemma-style blocks (the LLaMA-style block's kinds, the QK-norm's with gemma3, and these two).
  post_attn_norm_input,  ///< the output projection's output, the post-attention RMSNorm's input
                         ///< [tokens, hidden]
  post_mlp_norm_input,   ///< the down projection's output, the post-MLP RMSNorm's input
                         ///< [tokens, hidden]
};

/// Number of tensor kinds.
inline constexpr int tensor_kind_count = 29;
static_assert(static_cast<int>(tensor_kind::post_mlp_norm_input) == tensor_kind_count - 1,
              "tensor_kind_count counts the enumerators of tensor_kind");

/// What a saved tensor is, which decides its default precision and its sensitivity.
enum class tensor_category : std::uint8_t {
  attention_core,    ///< Q, K, V (and before QK-norm), attention output, softmax stats: precise
  linear_input,      ///< the input X of a linear layer, read only for its weight gradient
  activation_input,  ///< the input of an elementwise nonlinearity (SiLU / SwiGLU, GeLU)
  residual_stream,   ///< the residual stream (or Gemma's sub-block output) entering a normalization
  routing,  ///< the router's probabilities, the shared experts' gate: they scale experts; precise
};

/// Every tensor kind, in declaration order (enumerator values 0, 1, ..., tensor_kind_count - 1).
inline constexpr std::array<tensor_kind, tensor_kind_count> all_tensor_kinds = [] {
  std::array<tensor_kind, tensor_kind_count> kinds{};
  for (int i = 0; i < tensor_kind_count; ++i) {
    kinds[static_cast<std::size_t>(i)] = static_cast<tensor_kind>(i);
  }
  return kinds;
}();

namespace detail {

/// The arrays `parts` one after the other.
template <std::size_t... N>
constexpr std::array<tensor_kind, (N + ...)> join(std::array<tensor_kind, N> const&... parts) {
  std::array<tensor_kind, (N + ...)> out{};
  auto at = out.begin();
  ((at = std::ranges::copy(parts, at).out), ...);
  return out;
}

// The runs the LLaMA-like blocks are made of, in forward order.
inline constexpr std::array<tensor_kind, 2> block_inputs = {tensor_kind::attn_norm_input,
                                                            tensor_kind::qkv_input};
inline constexpr std::array<tensor_kind, 2> qk_norm_inputs = {tensor_kind::query_norm_input,
                                                              tensor_kind::key_norm_input};
inline constexpr std::array<tensor_kind, 6> attention = {
    tensor_kind::query,       tensor_kind::key,
    tensor_kind::value,       tensor_kind::attention_output,
    tensor_kind::softmax_lse, tensor_kind::o_proj_input};
inline constexpr std::array<tensor_kind, 2> mlp_inputs = {tensor_kind::mlp_norm_input,
                                                          tensor_kind::mlp_input};
inline constexpr std::array<tensor_kind, 8> attention_to_mlp = join(attention, mlp_inputs);
inline constexpr std::array<tensor_kind, 1> post_attn_norm = {tensor_kind::post_attn_norm_input};
inline constexpr std::array<tensor_kind, 1> post_mlp_norm = {tensor_kind::post_mlp_norm_input};
inline constexpr std::array<tensor_kind, 3> swiglu_mlp = {
    tensor_kind::gate_output, tensor_kind::up_output, tensor_kind::swiglu_output};
inline constexpr std::array<tensor_kind, 5> moe_mlp = {
    tensor_kind::router_probs, tensor_kind::expert_input, tensor_kind::expert_gate_output,
    tensor_kind::expert_up_output, tensor_kind::expert_swiglu_output};
inline constexpr std::array<tensor_kind, 2> shared_gate = {tensor_kind::shared_expert_output,
                                                           tensor_kind::shared_gate_score};

}  // namespace detail

/// The shared experts of a mixture-of-experts MLP (model_shape::shared_experts).
enum class shared_expert_form : std::uint8_t {
  none,   ///< routed experts alone (Mixtral, Qwen3-MoE)
  plain,  ///< a SwiGLU MLP every token passes through, added to the routed experts' output
          ///< (DeepSeek-V3, Llama 4)
  gated,  ///< that MLP's output scaled per token by sigmoid(x w_gate), w_gate [hidden, 1]
          ///< (Qwen2-MoE)
};

/// The tensors a LLaMA-style block saves, in forward order.
inline constexpr std::array<tensor_kind, 13> llama_block_tensors =
    detail::join(detail::block_inputs, detail::attention_to_mlp, detail::swiglu_mlp);

/// The tensors a Qwen3-style block saves, in forward order: the LLaMA-style block's, with the
/// QK-norm's inputs after the QKV projection's input.
inline constexpr std::array<tensor_kind, 15> qwen3_block_tensors = detail::join(
    detail::block_inputs, detail::qk_norm_inputs, detail::attention_to_mlp, detail::swiglu_mlp);

/// The tensors a LLaMA-style block with a mixture-of-experts MLP saves (Mixtral), in forward order:
/// the LLaMA-style block's up to the MLP's input, then the router's and the experts'.
inline constexpr std::array<tensor_kind, 15> llama_moe_block_tensors =
    detail::join(detail::block_inputs, detail::attention_to_mlp, detail::moe_mlp);

/// The tensors a Qwen3-style block with a mixture-of-experts MLP saves (Qwen3-MoE), in forward
/// order: llama_moe_block_tensors with the QK-norm's inputs after the QKV projection's input.
inline constexpr std::array<tensor_kind, 17> qwen3_moe_block_tensors = detail::join(
    detail::block_inputs, detail::qk_norm_inputs, detail::attention_to_mlp, detail::moe_mlp);

/// The tensors a LLaMA-style block with a mixture-of-experts MLP and shared experts saves, in
/// forward order: llama_moe_block_tensors, then the shared experts' SwiGLU MLP's inner tensors
/// (the dense block's kinds, of width shared_expert_ffn).
inline constexpr std::array<tensor_kind, 18> llama_shared_moe_block_tensors = detail::join(
    detail::block_inputs, detail::attention_to_mlp, detail::moe_mlp, detail::swiglu_mlp);

/// llama_shared_moe_block_tensors with the gated shared experts' output and gate score after them
/// (Qwen2-MoE).
inline constexpr std::array<tensor_kind, 20> llama_gated_shared_moe_block_tensors =
    detail::join(detail::block_inputs, detail::attention_to_mlp, detail::moe_mlp,
                 detail::swiglu_mlp, detail::shared_gate);

/// The Qwen3-style (QK-norm) forms of the two lists above.
inline constexpr std::array<tensor_kind, 20> qwen3_shared_moe_block_tensors =
    detail::join(detail::block_inputs, detail::qk_norm_inputs, detail::attention_to_mlp,
                 detail::moe_mlp, detail::swiglu_mlp);
inline constexpr std::array<tensor_kind, 22> qwen3_gated_shared_moe_block_tensors =
    detail::join(detail::block_inputs, detail::qk_norm_inputs, detail::attention_to_mlp,
                 detail::moe_mlp, detail::swiglu_mlp, detail::shared_gate);

/// The tensors a Gemma-2-style block saves, in forward order: LLaMA's, with the post-attention
/// norm's input after the output projection's and the post-MLP norm's input last.
inline constexpr std::array<tensor_kind, 15> gemma2_block_tensors =
    detail::join(detail::block_inputs, detail::attention, detail::post_attn_norm,
                 detail::mlp_inputs, detail::swiglu_mlp, detail::post_mlp_norm);

/// The tensors a Gemma-3-style block saves, in forward order: Gemma 2's, with the QK-norm's inputs
/// after the QKV projection's input.
inline constexpr std::array<tensor_kind, 17> gemma3_block_tensors = detail::join(
    detail::block_inputs, detail::qk_norm_inputs, detail::attention, detail::post_attn_norm,
    detail::mlp_inputs, detail::swiglu_mlp, detail::post_mlp_norm);

/// The tensors a GPT-style block saves, in forward order.
inline constexpr std::array<tensor_kind, 12> gpt_block_tensors = {
    tensor_kind::ln1_input,   tensor_kind::qkv_input,    tensor_kind::query,
    tensor_kind::key,         tensor_kind::value,        tensor_kind::attention_output,
    tensor_kind::softmax_lse, tensor_kind::o_proj_input, tensor_kind::ln2_input,
    tensor_kind::fc1_input,   tensor_kind::gelu_input,   tensor_kind::fc2_input};

/// True for the styles with a mixture-of-experts form (llama, qwen3).
inline constexpr bool has_moe_form(block_style s) noexcept {
  return s == block_style::llama || s == block_style::qwen3;
}

/// The tensors a block of the given style saves, in forward order; with `moe`, those of its
/// mixture-of-experts form with the `shared` experts given (has_moe_form: llama and qwen3; the
/// other styles have none: their dense lists; `shared` is ignored without `moe`).
inline constexpr std::span<tensor_kind const> block_tensors(
    block_style s, bool moe = false,
    shared_expert_form shared = shared_expert_form::none) noexcept {
  if (moe && has_moe_form(s)) {
    bool const llama = s == block_style::llama;
    switch (shared) {
      case shared_expert_form::plain:
        return llama ? std::span<tensor_kind const>(llama_shared_moe_block_tensors)
                     : qwen3_shared_moe_block_tensors;
      case shared_expert_form::gated:
        return llama ? std::span<tensor_kind const>(llama_gated_shared_moe_block_tensors)
                     : qwen3_gated_shared_moe_block_tensors;
      default:
        return llama ? std::span<tensor_kind const>(llama_moe_block_tensors)
                     : qwen3_moe_block_tensors;
    }
  }
  switch (s) {
    case block_style::llama:
      return llama_block_tensors;
    case block_style::qwen3:
      return qwen3_block_tensors;
    case block_style::gemma2:
      return gemma2_block_tensors;
    case block_style::gemma3:
      return gemma3_block_tensors;
    default:
      return gpt_block_tensors;
  }
}

/// The index of a kind in all_tensor_kinds (its enumerator value).
inline constexpr int index_of(tensor_kind k) noexcept { return static_cast<int>(k); }

/// The style's name: "llama", "gpt", "qwen3", "gemma2" or "gemma3".
inline constexpr std::string_view name_of(block_style s) noexcept {
  switch (s) {
    case block_style::llama:
      return "llama";
    case block_style::qwen3:
      return "qwen3";
    case block_style::gemma2:
      return "gemma2";
    case block_style::gemma3:
      return "gemma3";
    default:
      return "gpt";
  }
}

/// Every block style, in declaration order.
inline constexpr std::array<block_style, 5> all_block_styles = {
    block_style::llama, block_style::gpt, block_style::qwen3, block_style::gemma2,
    block_style::gemma3};

/// The style whose name_of is `name`; throws agoq::invalid_argument naming the styles for any
/// other name.
inline block_style block_style_named(std::string_view name) {
  std::string names;
  for (block_style const s : all_block_styles) {
    if (name_of(s) == name) return s;
    names += (names.empty() ? "" : ", ") + std::string(name_of(s));
  }
  agoq::detail::throw_invalid(
      __FILE__, __LINE__,
      "unknown block style '" + std::string(name) + "' (styles: " + names + ")");
}

/// The short name of a kind (its enumerator name).
inline constexpr std::string_view name_of(tensor_kind k) noexcept {
  constexpr std::array<std::string_view, tensor_kind_count> names = {
      "attn_norm_input",
      "qkv_input",
      "query",
      "key",
      "value",
      "attention_output",
      "softmax_lse",
      "o_proj_input",
      "mlp_norm_input",
      "mlp_input",
      "gate_output",
      "up_output",
      "swiglu_output",
      "ln1_input",
      "ln2_input",
      "fc1_input",
      "gelu_input",
      "fc2_input",
      "query_norm_input",
      "key_norm_input",
      "router_probs",
      "expert_input",
      "expert_gate_output",
      "expert_up_output",
      "expert_swiglu_output",
      "shared_expert_output",
      "shared_gate_score",
      "post_attn_norm_input",
      "post_mlp_norm_input",
  };
  return names[static_cast<std::size_t>(index_of(k))];
}

/// The kind whose name_of is `name`; throws agoq::invalid_argument for any other name.
inline tensor_kind tensor_kind_named(std::string_view name) {
  for (tensor_kind const k : all_tensor_kinds)
    if (name_of(k) == name) return k;
  agoq::detail::throw_invalid(__FILE__, __LINE__,
                              "unknown tensor kind '" + std::string(name) + "'");
}

/// The name of a category.
inline constexpr std::string_view name_of(tensor_category c) noexcept {
  switch (c) {
    case tensor_category::attention_core:
      return "attention_core";
    case tensor_category::linear_input:
      return "linear_input";
    case tensor_category::activation_input:
      return "activation_input";
    case tensor_category::routing:
      return "routing";
    default:
      return "residual_stream";
  }
}

/// The category of a kind. The gate and up outputs are both inputs of the SwiGLU nonlinearity;
/// the SwiGLU and GeLU outputs are the inputs of the down projection and FC2; the QK-norm's
/// inputs are Q and K before it (attention core, kept precise as Q and K are); the experts'
/// tensors are those of the dense SwiGLU MLP's counterparts (the shared experts' are that MLP's
/// kinds); the gated shared experts' output is the gate's multiplicand, as up is SiLU's, and their
/// gate score scales it, as the router's probabilities scale the routed experts'; Gemma's
/// post-norms' inputs enter a normalization, as the residual stream does (GeGLU's gate output is
/// the GeLU's input, as SwiGLU's is SiLU's).
inline constexpr tensor_category category_of(tensor_kind k) noexcept {
  switch (k) {
    case tensor_kind::query:
    case tensor_kind::key:
    case tensor_kind::value:
    case tensor_kind::attention_output:
    case tensor_kind::softmax_lse:
    case tensor_kind::query_norm_input:
    case tensor_kind::key_norm_input:
      return tensor_category::attention_core;
    case tensor_kind::qkv_input:
    case tensor_kind::o_proj_input:
    case tensor_kind::mlp_input:
    case tensor_kind::swiglu_output:
    case tensor_kind::fc1_input:
    case tensor_kind::fc2_input:
    case tensor_kind::expert_input:
    case tensor_kind::expert_swiglu_output:
      return tensor_category::linear_input;
    case tensor_kind::gate_output:
    case tensor_kind::up_output:
    case tensor_kind::gelu_input:
    case tensor_kind::expert_gate_output:
    case tensor_kind::expert_up_output:
    case tensor_kind::shared_expert_output:
      return tensor_category::activation_input;
    case tensor_kind::router_probs:
    case tensor_kind::shared_gate_score:
      return tensor_category::routing;
    default:
      return tensor_category::residual_stream;
  }
}

/// True for the kind that owns no storage of its own: the output projection reads the attention
/// output O that the attention backward keeps anyway, so `o_proj_input` is that buffer (stored
/// with the scheme of `attention_output`). Frameworks save it once too (Megatron's accounting
/// counts it once). It is listed so every consumer of a saved tensor has a name.
inline constexpr bool is_alias(tensor_kind k) noexcept { return k == tensor_kind::o_proj_input; }

/// Bytes of one element of kind `k` kept precise: 4 for the fp32 logsumexp and router
/// probabilities, 2 (bf16) for every other kind.
inline constexpr int precise_bytes_of(tensor_kind k) noexcept {
  return k == tensor_kind::softmax_lse || k == tensor_kind::router_probs ? 4 : 2;
}

/// The kind whose buffer an alias reads (the kind itself when it is not an alias).
inline constexpr tensor_kind storage_kind(tensor_kind k) noexcept {
  return is_alias(k) ? tensor_kind::attention_output : k;
}

/// The shape of a model, independent of how it is parallelized. A mixture-of-experts model
/// (experts > 0; LLaMA- or Qwen3-style) has in every layer, in place of the dense MLP (ffn 0), a
/// router (a [hidden, experts] linear layer without bias, then a softmax) sending each token to
/// experts_per_token of `experts` SwiGLU MLPs of inner width expert_ffn (Mixtral, Qwen3-MoE), and
/// optionally shared experts: one SwiGLU MLP of inner width shared_expert_ffn that every token
/// passes through, its output added to the routed experts' (Megatron-Core's
/// moe_shared_expert_intermediate_size; DeepSeek-V3, Llama 4), with shared_expert_gate scaled per
/// token by a sigmoid gate (Qwen2-MoE).
struct model_shape {
  block_style style = block_style::llama;
  std::int64_t layers = 32;
  std::int64_t hidden = 4096;
  std::int64_t ffn = 14336;   ///< dense MLP inner width (SwiGLU: of gate and up each); MoE: 0
  std::int64_t heads = 32;    ///< query heads
  std::int64_t kv_heads = 8;  ///< key/value heads (= heads without grouped-query attention)
  std::int64_t head_dim = 0;  ///< 0: hidden / heads
  std::int64_t vocab = 128256;
  bool tied_embeddings = false;        ///< input embedding and output head share one matrix
  std::int64_t experts = 0;            ///< routed experts per layer; 0: a dense MLP
  std::int64_t experts_per_token = 0;  ///< experts each token is routed to (top-k); dense: 0
  std::int64_t expert_ffn = 0;         ///< an expert's inner width (of gate and up); dense: 0
  /// The shared experts' inner width, all of them together (DeepSeek's n_shared_experts x
  /// moe_intermediate_size); 0: none. Dense: 0.
  std::int64_t shared_expert_ffn = 0;
  /// The shared experts' output scaled by sigmoid(x w_gate) per token (Qwen2-MoE; Megatron-Core's
  /// moe_shared_expert_gate), w_gate a [hidden, 1] weight replicated on every rank.
  bool shared_expert_gate = false;

  /// True for a mixture-of-experts model (experts > 0).
  constexpr bool moe() const noexcept { return experts > 0; }

  /// The form of the shared experts (none for a dense model).
  constexpr shared_expert_form shared_experts() const noexcept {
    if (!moe() || shared_expert_ffn == 0) return shared_expert_form::none;
    return shared_expert_gate ? shared_expert_form::gated : shared_expert_form::plain;
  }

  /// The inner width of the SwiGLU or GeLU MLP every token of a layer passes through: ffn, or a
  /// mixture-of-experts model's shared_expert_ffn (0: none). Its tensors are the dense block's
  /// gate_output, up_output and swiglu_output (gelu_input, fc2_input).
  constexpr std::int64_t mlp_width() const noexcept { return moe() ? shared_expert_ffn : ffn; }

  /// The tensors one block saves, in forward order (block_tensors of the style, moe() and
  /// shared_experts()).
  constexpr std::span<tensor_kind const> saved_tensors() const noexcept {
    return block_tensors(style, moe(), shared_experts());
  }

  /// head_dim, or hidden / heads when it is 0.
  constexpr std::int64_t head_size() const noexcept {
    return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0);
  }

  /// An upper bound of the parameters of the whole model: layers * (4 h (q + k + f) + ... +
  /// e (3 h f_e + h)) + 2 vocab * h, with q = heads * head_size(), k = kv_heads * head_size(),
  /// f = mlp_width(), e = experts, f_e = expert_ffn; at least the parameters any rank holds of a
  /// layer (its experts included), an embedding and a head (of any style), in long double so that
  /// no field's size overflows it.
  long double parameter_bound() const noexcept {
    auto const [h, q, k, f] = width_bounds();
    long double const e = static_cast<long double>(experts);
    long double const layer = 4 * h * (q + k + f) + 4 * (q + f) + 8 * h +
                              e * (3 * h * static_cast<long double>(expert_ffn) + h);
    return static_cast<long double>(layers) * layer + 2 * static_cast<long double>(vocab) * h;
  }

  /// hidden, q = heads * head_size(), k = kv_heads * head_size() and mlp_width() in long double:
  /// the widths of a layer on one rank are at most these, and no field's size overflows them.
  std::array<long double, 4> width_bounds() const noexcept {
    long double const d = static_cast<long double>(head_size());
    return {static_cast<long double>(hidden), static_cast<long double>(heads) * d,
            static_cast<long double>(kv_heads) * d, static_cast<long double>(mlp_width())};
  }

  /// Throws agoq::invalid_argument naming the first field out of range, or when the model is too
  /// large for 64-bit byte counts: parameter_bound() above 2^56 (its states take at most 64
  /// bytes a parameter, max_size_count). A dense model has ffn >= 1, experts, experts_per_token,
  /// expert_ffn and shared_expert_ffn 0 and no shared_expert_gate; a mixture-of-experts model ffn
  /// 0, expert_ffn >= 1, 1 <= experts_per_token <= experts, shared_expert_ffn >= 0 (> 0 under
  /// shared_expert_gate), and a LLaMA- or Qwen3-style block.
  void validate() const {
    AGOQ_EXPECTS(layers >= 1,
                 "model_shape: layers must be at least 1, got " + std::to_string(layers));
    AGOQ_EXPECTS(hidden >= 1 && heads >= 1 && kv_heads >= 1 && vocab >= 1,
                 "model_shape: hidden, heads, kv_heads and vocab must be positive");
    AGOQ_EXPECTS(
        experts >= 0 && experts_per_token >= 0 && expert_ffn >= 0 && shared_expert_ffn >= 0,
        "model_shape: experts, experts_per_token, expert_ffn and shared_expert_ffn must "
        "be >= 0");
    if (moe()) {
      AGOQ_EXPECTS(has_moe_form(style),
                   "model_shape: a mixture-of-experts MLP needs a LLaMA- or "
                   "Qwen3-style block, not " +
                       std::string(name_of(style)));
      AGOQ_EXPECTS(ffn == 0 && expert_ffn >= 1,
                   "model_shape: a mixture-of-experts model has ffn 0 (no dense MLP) and "
                   "expert_ffn >= 1, got ffn " +
                       std::to_string(ffn) + " and expert_ffn " + std::to_string(expert_ffn));
      AGOQ_EXPECTS(experts_per_token >= 1 && experts_per_token <= experts,
                   "model_shape: experts_per_token must be in [1, experts (" +
                       std::to_string(experts) + ")], got " + std::to_string(experts_per_token));
      AGOQ_EXPECTS(!shared_expert_gate || shared_expert_ffn >= 1,
                   "model_shape: shared_expert_gate needs shared experts (shared_expert_ffn >= 1)");
    } else {
      AGOQ_EXPECTS(ffn >= 1,
                   "model_shape: ffn must be positive (a dense MLP), got " + std::to_string(ffn));
      AGOQ_EXPECTS(experts_per_token == 0 && expert_ffn == 0 && shared_expert_ffn == 0 &&
                       !shared_expert_gate,
                   "model_shape: experts_per_token, expert_ffn, shared_expert_ffn and "
                   "shared_expert_gate need experts > 0");
    }
    AGOQ_EXPECTS(heads % kv_heads == 0, "model_shape: heads (" + std::to_string(heads) +
                                            ") must be a multiple of kv_heads (" +
                                            std::to_string(kv_heads) + ")");
    AGOQ_EXPECTS(head_size() >= 1, "model_shape: head_dim must be positive");
    AGOQ_EXPECTS(style != block_style::gpt || kv_heads == heads,
                 "model_shape: a GPT-style block has kv_heads == heads");
    AGOQ_EXPECTS(parameter_bound() <= static_cast<long double>(max_size_count / 64),
                 "model_shape: too large to count in 64-bit bytes: up to " +
                     detail::approx(parameter_bound()) + " parameters, more than 2^56");
  }

  friend constexpr bool operator==(model_shape const&, model_shape const&) = default;
};

/// A published model's shape, by name.
struct model_preset {
  std::string_view name;
  model_shape shape;
};

/// The shapes of published models: LLaMA-3-8B, LLaMA-3-70B, LLaMA-3.1-405B (126 layers, which
/// split over 16 pipeline stages only unevenly: parallel_config::first_stage_layers), Qwen-2.5-32B,
/// Qwen3-8B and Qwen3-32B (QK-norm; 64 heads of 128 on a hidden width of 5120), GPT-3 XL (1.3B
/// parameters, input embedding and output head tied), and the mixture-of-experts Mixtral-8x7B
/// (8 experts, 2 a token), Qwen3-30B-A3B and Qwen3-235B-A22B (128 experts, 8 a token),
/// Qwen1.5-MoE-A2.7B (60 experts, 4 a token) and Qwen2-57B-A14B (64, 8), the last two with gated
/// shared experts; Gemma-2-2B, -9B and -27B and Gemma-3-1B (post-norms, GeGLU, tied embeddings;
/// Gemma 3 with QK-norm).
inline constexpr std::array<model_preset, 16> model_presets{{
    {"llama3-8b", {block_style::llama, 32, 4096, 14336, 32, 8, 128, 128256, false}},
    {"llama3-70b", {block_style::llama, 80, 8192, 28672, 64, 8, 128, 128256, false}},
    {"llama3-405b", {block_style::llama, 126, 16384, 53248, 128, 8, 128, 128256, false}},
    {"qwen2.5-32b", {block_style::llama, 64, 5120, 27648, 40, 8, 128, 152064, false}},
    {"qwen3-8b", {block_style::qwen3, 36, 4096, 12288, 32, 8, 128, 151936, false}},
    {"qwen3-32b", {block_style::qwen3, 64, 5120, 25600, 64, 8, 128, 151936, false}},
    {"gpt3-1.3b", {block_style::gpt, 24, 2048, 8192, 16, 16, 128, 50257, true}},
    {"mixtral-8x7b", {block_style::llama, 32, 4096, 0, 32, 8, 128, 32000, false, 8, 2, 14336}},
    {"qwen3-30b-a3b", {block_style::qwen3, 48, 2048, 0, 32, 4, 128, 151936, false, 128, 8, 768}},
    {"qwen3-235b-a22b", {block_style::qwen3, 94, 4096, 0, 64, 4, 128, 151936, false, 128, 8, 1536}},
    {"qwen1.5-moe-a2.7b",
     {block_style::llama, 24, 2048, 0, 16, 16, 128, 151936, false, 60, 4, 1408, 5632, true}},
    {"qwen2-57b-a14b",
     {block_style::llama, 28, 3584, 0, 28, 4, 128, 151936, false, 64, 8, 2560, 20480, true}},
    {"gemma2-2b", {block_style::gemma2, 26, 2304, 9216, 8, 4, 256, 256000, true}},
    {"gemma2-9b", {block_style::gemma2, 42, 3584, 14336, 16, 8, 256, 256000, true}},
    {"gemma2-27b", {block_style::gemma2, 46, 4608, 36864, 32, 16, 128, 256000, true}},
    {"gemma3-1b", {block_style::gemma3, 26, 1152, 6912, 4, 1, 256, 262144, true}},
}};

/// The shape of the preset named `name` (model_presets); throws agoq::invalid_argument naming the
/// presets for any other name.
inline model_shape preset_model(std::string_view name) {
  std::string names;
  for (model_preset const& p : model_presets) {
    if (p.name == name) return p.shape;
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  agoq::detail::throw_invalid(
      __FILE__, __LINE__,
      "preset_model: unknown preset '" + std::string(name) + "' (presets: " + names + ")");
}

/// Tensor and sequence parallelism of one micro-batch's activations, and its size.
struct shard_shape {
  std::int64_t micro_batch = 1;  ///< sequences per micro-batch (b)
  std::int64_t seq = 4096;       ///< tokens per sequence on this rank (s; s_total / cp)
  std::int64_t tp = 1;           ///< tensor-parallel degree (t)
  bool sp = false;               ///< sequence parallelism (Korthikanti et al. 2022)
  /// Context-parallel degree: the ranks a sequence is split over (seq is one rank's part); it
  /// sizes the ring attention's transient buffers (layer_working_bytes).
  std::int64_t cp = 1;
  /// Expert tensor parallelism (Megatron-Core's expert_tensor_parallel_size) of a
  /// mixture-of-experts model: the ranks each expert's inner width is split over; 0: tp (Megatron's
  /// default). Unused by a dense model.
  std::int64_t etp = 0;
  /// Megatron-Core's expert capacity factor C (`--moe-expert-capacity-factor` with
  /// `--moe-pad-expert-input-to-capacity`) of a mixture-of-experts model: each expert takes
  /// exactly ceil(n / e C) of a rank's n = tokens k / tp (token, expert) pairs, dropped or padded
  /// (expert_rows); 0: dropless routing, counted at its mean. A dense model has 0.
  double capacity_factor = 0;

  /// Tokens of one micro-batch, b * s.
  constexpr std::int64_t tokens() const noexcept { return micro_batch * seq; }

  /// etp, or tp when it is 0.
  constexpr std::int64_t expert_tp() const noexcept { return etp > 0 ? etp : tp; }

  /// The (token, expert) pairs one rank's experts process for one micro-batch of model `m`: each
  /// rank routes its tokens / tp tokens (mixture-of-experts layers run under sequence
  /// parallelism) to k = experts_per_token experts each, n = tokens k / tp pairs, the all-to-all of
  /// the expert-parallel group brings as many to each rank, and the expert-tensor-parallel group
  /// gathers its etp ranks' (Megatron-Core's MoEAlltoAllTokenDispatcher): R = n etp, routing
  /// balanced (dropless, the mean). With a capacity factor C > 0 each of the e experts takes
  /// ceil(n / e C) pairs of every rank (Megatron-Core's get_capacity, in double as it computes
  /// it), R = etp e ceil(n / e C). 0 for a dense model.
  std::int64_t expert_rows(model_shape const& m) const noexcept {
    if (!m.moe()) return 0;
    std::int64_t const n = tokens() / tp * m.experts_per_token;
    if (capacity_factor <= 0) return n * expert_tp();
    auto const capacity = static_cast<std::int64_t>(
        std::ceil(static_cast<double>(n) / static_cast<double>(m.experts) * capacity_factor));
    return expert_tp() * m.experts * capacity;
  }

  /// 64 tokens cp W, W = 5 h + 2 q + 2 k + 4 f + heads + 2 vocab + experts + 4 (k max(1, C) + e)
  /// (etp h + f_e) (the widths of model_shape::parameter_bound; k = experts_per_token, e =
  /// experts, f_e = expert_ffn, C = capacity_factor: the padding adds under e etp rows), in
  /// long double: an upper bound of the bytes of one micro-batch's saved tensors of one layer (at
  /// most 6 bytes an element, plus 8 KiB of section alignment), of those of the output head, and of
  /// the working set of either's backward pass (and of the ring attention's forward, whose buffers
  /// grow with cp).
  long double byte_bound(model_shape const& m) const noexcept {
    auto const [h, q, k, f] = m.width_bounds();
    auto const ld = [](std::int64_t x) { return static_cast<long double>(x); };
    long double const pairs =
        ld(m.experts_per_token) * std::max(1.0L, static_cast<long double>(capacity_factor)) +
        (capacity_factor > 0 ? ld(m.experts) : 0);
    long double const width = 5 * h + 2 * q + 2 * k + 4 * f + ld(m.heads) + 2 * ld(m.vocab) +
                              ld(m.experts) + 4 * pairs * (ld(expert_tp()) * h + ld(m.expert_ffn));
    return 64 * ld(micro_batch) * ld(seq) * ld(cp) * width;
  }

  /// Throws agoq::invalid_argument unless the shard suits model `m` (which it validates):
  /// micro_batch, seq, tp and cp positive, etp >= 0, capacity_factor finite and >= 0; tp dividing
  /// heads and mlp_width(), and micro_batch * seq under sequence parallelism; for a
  /// mixture-of-experts model, sequence parallelism where tp > 1 (as Megatron requires) and
  /// expert_tp() dividing expert_ffn, for a dense one no capacity factor; and few enough tokens for
  /// 64-bit byte counts: byte_bound(m) <= max_size_count.
  void validate(model_shape const& m) const;
};

inline void shard_shape::validate(model_shape const& m) const {
  m.validate();
  AGOQ_EXPECTS(micro_batch >= 1 && seq >= 1 && tp >= 1 && cp >= 1 && etp >= 0,
               "shapes: micro_batch, seq, tp and cp must be positive, etp >= 0");
  AGOQ_EXPECTS(std::isfinite(capacity_factor) && capacity_factor >= 0,
               "shapes: the expert capacity factor must be finite and >= 0 (0: dropless), got " +
                   std::to_string(capacity_factor));
  AGOQ_EXPECTS(m.moe() || capacity_factor == 0,
               "shapes: an expert capacity factor needs a mixture-of-experts model");
  AGOQ_EXPECTS(
      byte_bound(m) <= static_cast<long double>(max_size_count),
      "shapes: micro_batch x seq = " + detail::approx(static_cast<long double>(micro_batch) * seq) +
          " tokens are too many to count in 64-bit bytes (a layer's tensors could take "
          "up to " +
          detail::approx(byte_bound(m)) + " bytes, more than 2^62)");
  AGOQ_EXPECTS(m.heads % tp == 0 && m.mlp_width() % tp == 0,
               "shapes: tp (" + std::to_string(tp) + ") must divide heads (" +
                   std::to_string(m.heads) + ") and " + (m.moe() ? "shared_expert_ffn" : "ffn") +
                   " (" + std::to_string(m.mlp_width()) + ")");
  AGOQ_EXPECTS(!sp || tokens() % tp == 0,
               "shapes: with sequence parallelism tp must divide micro_batch * seq");
  if (!m.moe()) return;
  AGOQ_EXPECTS(sp || tp == 1,
               "shapes: a mixture-of-experts model with tp > 1 needs sequence "
               "parallelism (as Megatron-Core requires)");
  AGOQ_EXPECTS(m.expert_ffn % expert_tp() == 0,
               "shapes: the expert tensor-parallel degree (" + std::to_string(expert_tp()) +
                   ") must divide expert_ffn (" + std::to_string(m.expert_ffn) + ")");
}

/// The load factor of a mixture-of-experts layer's routing as measured: `pairs[i]` the (token,
/// expert) pairs expert i took (of one layer and step, or summed over several), the experts laid
/// out on `ep` ranks as Megatron-Core places them (rank r holds experts [r e / ep, (r + 1) e / ep),
/// e = pairs.size()): the busiest rank's pairs over the mean rank's, at least 1. Given as the
/// capacity factor (shard_shape::capacity_factor, step_config::expert_capacity_factor), it sizes
/// every rank's expert tensors for the busiest one (expert_rows: e ceil(n / e C) >= n C pairs).
/// Throws agoq::invalid_argument for no experts, ep < 1 or not dividing them, a negative count,
/// no pairs at all, or a total past 2^62.
inline double expert_load_factor(std::span<std::int64_t const> pairs, std::int64_t ep) {
  auto const e = static_cast<std::int64_t>(pairs.size());
  AGOQ_EXPECTS(e >= 1 && ep >= 1 && e % ep == 0, "expert_load_factor: ep (" + std::to_string(ep) +
                                                     ") must divide the experts (" +
                                                     std::to_string(e) + "), at least one");
  std::int64_t total = 0;
  std::int64_t busiest = 0;
  std::int64_t const local = e / ep;
  for (std::int64_t r = 0; r < ep; ++r) {
    std::int64_t rank = 0;
    for (std::int64_t const n :
         pairs.subspan(static_cast<std::size_t>(r * local), static_cast<std::size_t>(local))) {
      AGOQ_EXPECTS(n >= 0 && n <= max_size_count - total,
                   "expert_load_factor: counts must be >= 0 and sum to at most 2^62, got " +
                       std::to_string(n));
      rank += n;
      total += n;
    }
    busiest = std::max(busiest, rank);
  }
  AGOQ_EXPECTS(total > 0, "expert_load_factor: no pairs were routed");
  return static_cast<double>(busiest) * static_cast<double>(ep) / static_cast<double>(total);
}

/// The per-rank shape of one saved tensor of one layer and one micro-batch: a row-major
/// [rows, cols] matrix (the layout agoq quantizes, groups running along a row) and the bytes of one
/// element when kept precise (bf16: 2, the fp32 logsumexp and router probabilities: 4).
struct saved_shape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  int precise_bytes = 2;

  /// rows * cols.
  constexpr std::int64_t elements() const noexcept { return rows * cols; }
  /// Bytes kept precise.
  constexpr std::int64_t bytes() const noexcept { return elements() * precise_bytes; }
  friend constexpr bool operator==(saved_shape const&, saved_shape const&) = default;
};

/// True when tensor parallelism splits the kind: the heads (Q, K, V, O, logsumexp) and the MLP
/// inner width (the shared experts' too). The others (residual stream, norm inputs and outputs,
/// the router's probabilities, the gated shared experts' output and gate score) are
/// replicated across the tensor-parallel group unless sequence parallelism splits them along the
/// tokens. The experts' tensors are split by the expert-parallel layout instead (expert_rows).
inline constexpr bool split_by_tp(tensor_kind k) noexcept {
  switch (k) {
    case tensor_kind::attn_norm_input:
    case tensor_kind::qkv_input:
    case tensor_kind::mlp_norm_input:
    case tensor_kind::mlp_input:
    case tensor_kind::ln1_input:
    case tensor_kind::ln2_input:
    case tensor_kind::fc1_input:
    case tensor_kind::router_probs:
    case tensor_kind::expert_input:
    case tensor_kind::expert_gate_output:
    case tensor_kind::expert_up_output:
    case tensor_kind::expert_swiglu_output:
    case tensor_kind::shared_expert_output:
    case tensor_kind::shared_gate_score:
    case tensor_kind::post_attn_norm_input:
    case tensor_kind::post_mlp_norm_input:
      return false;
    default:
      return true;
  }
}

/// Key/value heads held by one tensor-parallel rank: kv_heads / tp, or one replicated head when
/// there are fewer key/value heads than ranks (Megatron's convention).
inline std::int64_t kv_heads_per_rank(model_shape const& m, std::int64_t tp) {
  AGOQ_EXPECTS(m.kv_heads % tp == 0 || tp % m.kv_heads == 0,
               "shapes: kv_heads (" + std::to_string(m.kv_heads) + ") and tp (" +
                   std::to_string(tp) + ") must divide one another");
  return m.kv_heads >= tp ? m.kv_heads / tp : 1;
}

/// The shape of tensor `k` of one layer and one micro-batch on one rank. Throws
/// agoq::invalid_argument when the model or the shard is invalid (shard_shape::validate: tp not
/// dividing heads and mlp_width(), or the tokens under sequence parallelism; too many tokens), or
/// when the kind does not belong to the model's block style.
///
/// tokens = micro_batch * seq; h = hidden; f = mlp_width() (ffn, or shared_expert_ffn); a = heads;
/// g = kv_heads; d = head_dim; t = tp; T = tokens / t with sequence parallelism, else tokens:
/// - residual stream, norm inputs (Gemma's post-norms': the output projection's and the down
///   projection's outputs, as their reduce-scatter leaves them) and outputs: [T, h] (split along
///   the tokens only under SP; without
///   SP the QKV and FC1 inputs are the gathered sequence, and with SP the framework saves its
///   own shard and all-gathers it again in the backward, as Megatron does);
/// - Q, O and the QK-norm's Q input: [tokens, a d / t]; K, V and its K input: [tokens, g d / t]
///   (or one head); logsumexp fp32: [b a / t, s];
/// - gate, up, SwiGLU output, GeLU input and output: [tokens, f / t];
/// - the router's probabilities, fp32: [T, experts]; the gated shared experts' output [T, h] (as
///   their down projection's reduce-scatter leaves it) and gate score [T, 1];
/// - the experts' input: [R, h], their gate, up and SwiGLU outputs: [R, f_e / etp], with
///   R = shard_shape::expert_rows and f_e = expert_ffn.
inline saved_shape shape_of(tensor_kind k, model_shape const& m, shard_shape const& p) {
  p.validate(m);
  bool const in_block = [&] {
    for (tensor_kind const b : m.saved_tensors())
      if (b == k) return true;
    return false;
  }();
  AGOQ_EXPECTS(in_block,
               "shapes: " + std::string(name_of(k)) + " is not saved by a " +
                   std::string(name_of(m.style)) + "-style block" +
                   (m.moe() ? " with a mixture-of-experts MLP" : "") +
                   (m.shared_experts() == shared_expert_form::plain   ? " and shared experts"
                    : m.shared_experts() == shared_expert_form::gated ? " and gated shared experts"
                                                                      : ""));
  std::int64_t const tokens = p.tokens();
  std::int64_t const t = p.tp;
  std::int64_t const d = m.head_size();
  std::int64_t const seq_rows = p.sp ? tokens / t : tokens;
  int const pb = precise_bytes_of(k);
  switch (k) {
    case tensor_kind::query:
    case tensor_kind::query_norm_input:
    case tensor_kind::attention_output:
    case tensor_kind::o_proj_input:
      return {tokens, m.heads / t * d, pb};
    case tensor_kind::key:
    case tensor_kind::key_norm_input:
    case tensor_kind::value:
      return {tokens, kv_heads_per_rank(m, t) * d, pb};
    case tensor_kind::softmax_lse:
      return {p.micro_batch * (m.heads / t), p.seq, pb};
    case tensor_kind::gate_output:
    case tensor_kind::up_output:
    case tensor_kind::swiglu_output:
    case tensor_kind::gelu_input:
    case tensor_kind::fc2_input:
      return {tokens, m.mlp_width() / t, pb};
    case tensor_kind::router_probs:
      return {seq_rows, m.experts, pb};
    case tensor_kind::shared_gate_score:
      return {seq_rows, 1, pb};
    case tensor_kind::expert_input:
      return {p.expert_rows(m), m.hidden, pb};
    case tensor_kind::expert_gate_output:
    case tensor_kind::expert_up_output:
    case tensor_kind::expert_swiglu_output:
      return {p.expert_rows(m), m.expert_ffn / p.expert_tp(), pb};
    default:
      return {seq_rows, m.hidden, pb};
  }
}

}  // namespace agoq::activation
