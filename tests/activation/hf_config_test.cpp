#include <agoq/activation/hf_config.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace agoq::activation;

namespace hf_test {

/// Published config.json files (their text as released, trimmed of token ids and dtype fields
/// where noted): Llama-3-8B, Llama-3.1-405B (its rope_scaling object kept), Qwen2.5-32B.
constexpr char const* llama3_8b = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char const* llama31_405b = R"({"architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 16384,
  "initializer_range": 0.02, "intermediate_size": 53248, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 128,
  "num_hidden_layers": 126, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
  "rope_type": "llama3"}, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": true,
  "vocab_size": 128256})";

constexpr char const* qwen25_32b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
  "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 27648,
  "max_position_embeddings": 131072, "max_window_layers": 64, "model_type": "qwen2",
  "num_attention_heads": 40, "num_hidden_layers": 64, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": 131072,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064
})";

/// Qwen3-8B's config.json as released (QK-norm: block_style::qwen3; head_dim given).
constexpr char const* qwen3_8b = R"({"architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
  "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32,
  "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

/// Mixtral-8x7B-v0.1's config.json as released (8 experts of 14336, 2 a token).
constexpr char const* mixtral_8x7b = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

/// Qwen3-30B-A3B's config.json as released (intermediate_size is the dense MLP's, which no layer
/// has: mlp_only_layers is empty).
constexpr char const* qwen3_30b_a3b = R"({"architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

/// Qwen1.5-MoE-A2.7B's config.json, its model fields (intermediate_size is the dense MLP's, which
/// no layer has; every layer has 4 of 60 experts and gated shared experts of 5632).
constexpr char const* qwen15_moe_a27b = R"({"architectures": ["Qwen2MoeForCausalLM"],
  "attention_dropout": 0.0, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "model_type": "qwen2_moe",
  "moe_intermediate_size": 1408, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "vocab_size": 151936})";

/// Qwen2-57B-A14B's config.json, its model fields (8 of 64 experts of 2560, shared 20480).
constexpr char const* qwen2_57b_a14b = R"({"architectures": ["Qwen2MoeForCausalLM"],
  "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
  "model_type": "qwen2_moe", "moe_intermediate_size": 2560, "num_attention_heads": 28,
  "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "shared_expert_intermediate_size": 20480,
  "tie_word_embeddings": false, "vocab_size": 151936})";

/// Gemma-2-9B's config.json, its model fields (head_dim 256 on hidden 3584; tied embeddings).
constexpr char const* gemma2_9b = R"({"architectures": ["Gemma2ForCausalLM"],
  "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 3584, "intermediate_size": 14336, "model_type": "gemma2",
  "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
  "query_pre_attn_scalar": 256, "sliding_window": 4096, "vocab_size": 256000})";

/// Gemma-3-1B's config.json, its model fields (one kv head; QK-norm).
constexpr char const* gemma3_1b = R"({"architectures": ["Gemma3ForCausalLM"], "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
  "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "sliding_window": 512,
  "sliding_window_pattern": 6, "vocab_size": 262144})";

/// GPT-3 XL's shape in GPT-2's config keys (n_inner null: 4 n_embd; ties by default).
constexpr char const* gpt3_xl = R"({"model_type": "gpt2", "activation_function": "gelu_new",
  "n_layer": 24, "n_embd": 2048, "n_head": 16, "n_inner": null, "n_positions": 2048,
  "vocab_size": 50257, "layer_norm_epsilon": 1e-05})";

/// What model_from_hf_config refuses, by a piece of its message.
void refused(std::string const& json, char const* why) {
  CAPTURE(json);
  CHECK_THROWS_WITH_AS(model_from_hf_config(json), doctest::Contains(why), agoq::invalid_argument);
}

/// What parse_hf_config refuses, by a piece of its message.
void malformed(std::string const& json, char const* why) {
  CAPTURE(json);
  CHECK_THROWS_WITH_AS(parse_hf_config(json), doctest::Contains(why), agoq::invalid_argument);
}

}  // namespace hf_test

TEST_CASE("model_from_hf_config: published configs give the presets' shapes") {
  CHECK(model_from_hf_config(hf_test::llama3_8b) == preset_model("llama3-8b"));
  CHECK(model_from_hf_config(hf_test::llama31_405b) == preset_model("llama3-405b"));
  CHECK(model_from_hf_config(hf_test::qwen25_32b) == preset_model("qwen2.5-32b"));
  CHECK(model_from_hf_config(hf_test::gpt3_xl) == preset_model("gpt3-1.3b"));
  CHECK(model_from_hf_config(hf_test::qwen3_8b) == preset_model("qwen3-8b"));
  CHECK(model_from_hf_config(hf_test::mixtral_8x7b) == preset_model("mixtral-8x7b"));
  CHECK(model_from_hf_config(hf_test::qwen3_30b_a3b) == preset_model("qwen3-30b-a3b"));
  CHECK(model_from_hf_config(hf_test::qwen15_moe_a27b) == preset_model("qwen1.5-moe-a2.7b"));
  CHECK(model_from_hf_config(hf_test::qwen2_57b_a14b) == preset_model("qwen2-57b-a14b"));
  CHECK(model_from_hf_config(hf_test::gemma2_9b) == preset_model("gemma2-9b"));
  CHECK(model_from_hf_config(hf_test::gemma3_1b) == preset_model("gemma3-1b"));
  // transformers' Gemma defaults: head_dim 256 whatever hidden / heads, tied embeddings; Gemma 1's
  // block is LLaMA's (GeGLU saves what SwiGLU saves).
  model_shape const gm = model_from_hf_config(
      R"({"model_type": "gemma", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
          "hidden_act": "gelu"})");
  CHECK((gm.style == block_style::llama && gm.head_dim == 256 && gm.tied_embeddings &&
         gm.kv_heads == 6));
  model_shape const g2 = model_from_hf_config(
      R"({"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
          "head_dim": 32, "tie_word_embeddings": false})");
  CHECK((g2.style == block_style::gemma2 && g2.head_dim == 32 && !g2.tied_embeddings));
  // transformers' defaults of the expert fields: Mixtral 8 experts, 2 a token; Qwen3-MoE 128 of
  // 768, 8 a token.
  model_shape const mx = model_from_hf_config(
      R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000})");
  CHECK((mx.experts == 8 && mx.experts_per_token == 2 && mx.expert_ffn == 256 && mx.ffn == 0 &&
         mx.style == block_style::llama));
  model_shape const qm = model_from_hf_config(
      R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
          "mlp_only_layers": null, "decoder_sparse_step": null})");
  CHECK((qm.experts == 128 && qm.experts_per_token == 8 && qm.expert_ffn == 768 && qm.ffn == 0 &&
         qm.style == block_style::qwen3 && qm.shared_experts() == shared_expert_form::none));
  // Qwen2-MoE (transformers' Qwen2MoeConfig): 60 experts of 1408, 4 a token, gated shared experts
  // of 5632; LLaMA's block.
  model_shape const q2 = model_from_hf_config(
      R"({"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000})");
  CHECK((q2.experts == 60 && q2.experts_per_token == 4 && q2.expert_ffn == 1408 &&
         q2.shared_expert_ffn == 5632 && q2.shared_expert_gate && q2.ffn == 0 &&
         q2.style == block_style::llama));

  // The defaults: no num_key_value_heads (multi-head attention), no head_dim, no tie flag.
  model_shape const m = model_from_hf_config(
      R"({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
          "sliding_window": 4096})");
  CHECK(m.style == block_style::llama);
  CHECK(m.kv_heads == 6);
  CHECK(m.head_dim == 16);
  CHECK(!m.tied_embeddings);
  // An explicit head_dim other than hidden / heads (as Qwen3 and Mistral-Nemo have), and ties.
  model_shape const n = model_from_hf_config(
      R"({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 96,
          "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "vocab_size": 1000, "tie_word_embeddings": true})");
  CHECK(n.head_dim == 32);
  CHECK(n.kv_heads == 2);
  CHECK(n.tied_embeddings);
  model_shape const g = model_from_hf_config(
      R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": 1000,
          "vocab_size": 50257, "tie_word_embeddings": false})");
  CHECK(g.style == block_style::gpt);
  CHECK(g.ffn == 1000);
  CHECK(g.head_dim == 64);
  CHECK(!g.tied_embeddings);
}

TEST_CASE("model_from_hf_config: what it does not model, and malformed fields, are refused") {
  using hf_test::refused;
  refused(R"({"model_type": "llama", "num_local_experts": 8, "hidden_size": 4096})",
          "'num_local_experts' is set: mixture-of-experts models (llama) are not modelled but "
          "mixtral, qwen2_moe and qwen3_moe");
  refused(R"({"model_type": "qwen2", "num_experts": 60})", "'num_experts' is set");
  refused(R"({"model_type": "deepseek_v3", "n_routed_experts": 256})", "'n_routed_experts'");
  refused(R"({"model_type": "dbrx", "ffn_config": {"moe_num_experts": 16}})", "'ffn_config'");
  refused(R"({"model_type": "deepseek_v2", "num_experts": 60})", "'num_experts' is set");
  refused(R"({"model_type": "gemma3n", "hidden_size": 4096})",
          "model_type 'gemma3n' is not modelled (agoq reads llama, mistral, qwen2, qwen3, gemma, "
          "gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe and gpt2");
  refused(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})",
          "model_type 'gemma3' nests its text model: pass its text_config (model_type "
          "gemma3_text)");
  refused(R"({"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 96,
              "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
              "hidden_activation": "silu"})",
          "hidden_activation 'silu' of a gemma2 config: agoq models its MLP as GeGLU");
  refused(R"({"model_type": "gemma", "num_hidden_layers": 2, "hidden_size": 96,
              "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
              "hidden_act": "relu"})",
          "hidden_activation 'relu' of a gemma config");
  // The mixture-of-experts configs: dense layers, and malformed expert fields.
  std::string const moe =
      R"("model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 96,
         "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000)";
  CHECK(model_from_hf_config("{" + moe + R"(, "mlp_only_layers": [], "decoder_sparse_step": 1})")
            .experts == 128);
  refused("{" + moe + R"(, "mlp_only_layers": [0]})",
          "mlp_only_layers is not an empty list: a qwen3_moe model with dense MLPs");
  refused("{" + moe + R"(, "mlp_only_layers": 0})", "mlp_only_layers is not an empty list");
  refused("{" + moe + R"(, "decoder_sparse_step": 2})",
          "decoder_sparse_step is not 1: a qwen3_moe model with dense MLPs");
  refused("{" + moe + R"(, "num_experts": 0})", "'num_experts' must be a positive integer");
  refused("{" + moe + R"(, "num_experts": 4, "num_experts_per_tok": 8})",
          "experts_per_token must be in [1, experts (4)], got 8");
  refused("{" + moe + R"(, "moe_intermediate_size": 1.5})",
          "'moe_intermediate_size' must be a positive integer");
  // Qwen2-MoE: its dense layers as Qwen3-MoE's, and its shared experts' width.
  std::string const qwen2_moe =
      R"("model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 96,
         "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000)";
  refused("{" + qwen2_moe + R"(, "mlp_only_layers": [1]})",
          "mlp_only_layers is not an empty list: a qwen2_moe model with dense MLPs");
  refused("{" + qwen2_moe + R"(, "decoder_sparse_step": 2})",
          "decoder_sparse_step is not 1: a qwen2_moe model with dense MLPs");
  refused("{" + qwen2_moe + R"(, "shared_expert_intermediate_size": 0})",
          "'shared_expert_intermediate_size' must be a positive integer");

  refused(R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 96,
              "num_attention_heads": 6, "vocab_size": 1000})",
          "no 'intermediate_size'");
  refused(R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 96,
              "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000,
              "hidden_act": "gelu"})",
          "hidden_act 'gelu' of a mixtral config");
  refused(R"({"hidden_size": 4096})", "no 'model_type'");
  refused(R"({"model_type": 3})", "'model_type' must be a string");

  std::string const base =
      R"("model_type": "llama", "num_hidden_layers": 2, "hidden_size": 96,
         "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000)";
  CHECK(model_from_hf_config("{" + base + "}").layers == 2);
  refused(R"({"model_type": "llama", "hidden_size": 96})", "no 'num_hidden_layers'");
  refused("{" + base + R"(, "num_key_value_heads": 2.5})",
          "'num_key_value_heads' must be a positive integer");
  refused("{" + base + R"(, "head_dim": 0})", "'head_dim' must be a positive integer");
  refused("{" + base + R"(, "head_dim": -16})", "'head_dim' must be a positive integer");
  refused("{" + base + R"(, "head_dim": "16"})", "'head_dim' must be a positive integer");
  refused("{" + base + R"(, "head_dim": 1e20})", "'head_dim' must be a positive integer");
  refused("{" + base + R"(, "tie_word_embeddings": 0})", "must be true or false");
  refused("{" + base + R"(, "hidden_act": "gelu"})",
          "hidden_act 'gelu' of a llama config: agoq models its MLP as SwiGLU");
  refused("{" + base + R"(, "num_key_value_heads": 4})",  // 6 heads
          "heads (6) must be a multiple of kv_heads (4)");
  refused(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 100,
              "intermediate_size": 256, "num_attention_heads": 6, "vocab_size": 1000})",
          "the hidden size (100) is not a multiple of the heads (6) and no head_dim");
  refused(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 96, "n_head": 6,
              "vocab_size": 1000, "activation_function": "relu"})",
          "activation_function 'relu' of a gpt2 config");
  refused(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 96, "vocab_size": 1000})",
          "no 'n_head'");
  // A config whose MoE keys are present but 0 or null is a dense model.
  CHECK(
      model_from_hf_config("{" + base + R"(, "num_experts": 0, "num_local_experts": null})").ffn ==
      256);
}

TEST_CASE("parse_hf_config: strict JSON, top-level members kept, nested values checked") {
  hf_config const c = parse_hf_config(
      R"( {"a": 1, "b": -2.5e3, "c": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "d": true,
           "e": false, "f": null, "g": {"h": [1, {"i": []}, "j"]}, "k": [], "l": {},
           "m": 0, "n": -0.0, "o": 1E+2} )");
  CHECK(c.size() == 12);
  CHECK(c.at("a") == config_value::of_number(1));
  CHECK(c.at("b") == config_value::of_number(-2500));
  CHECK(c.at("c") == config_value::of_string("x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80"));
  CHECK(c.at("d") == config_value::of_bool(true));
  CHECK(c.at("e") == config_value::of_bool(false));
  CHECK(c.at("f") == config_value{});
  // Nested values keep their member or element count.
  CHECK(c.at("g") == config_value::of_nested(1));
  CHECK(c.at("k") == config_value::of_nested());
  CHECK(c.at("l") == config_value::of_nested());
  CHECK(parse_hf_config(R"({"a": [1, [2, 3], {}], "b": {"x": 1, "y": [], "z": null}})") ==
        hf_config{{"a", config_value::of_nested(3)}, {"b", config_value::of_nested(3)}});
  CHECK(c.at("m").number == 0);
  CHECK(c.at("o").number == 100);
  CHECK(parse_hf_config("{}").empty());
  CHECK(parse_hf_config(" \t\r\n{ } \n").empty());
  CHECK(parse_hf_config(R"({"x": 0.1})").at("x").number == 0.1);

  using hf_test::malformed;
  malformed("", "expected a JSON object at byte 0");
  malformed("[1]", "expected a JSON object");
  malformed(R"({"a": 1,})", "expected a string key");
  malformed(R"({"a": 1 "b": 2})", "expected ',' or '}' at byte 8");
  malformed(R"({"a" 1})", "expected ':'");
  malformed(R"({a: 1})", "expected a string key");
  malformed(R"({'a': 1})", "expected a string key");
  malformed(R"({"a": [1, 2,]})", "expected a value");
  malformed(R"({"a": [1 2]})", "expected ',' or ']'");
  malformed(R"({"a": 1} x)", "text after the top-level object");
  malformed(R"({"a": 1}{})", "text after the top-level object");
  malformed(R"({"a": 1)", "expected ',' or '}'");
  malformed(R"({"a": "x)", "unterminated string");
  malformed("{\"a\": \"x\ny\"}", "control character in a string");
  malformed(R"({"a": "\x"})", "bad escape in a string");
  malformed(R"({"a": "\u12g4"})", "bad \\u escape");
  malformed(R"({"a": "\u12)", "unterminated \\u escape");
  malformed(R"({"a": "\ud83d"})", "unpaired high surrogate");
  malformed(R"({"a": "\ud83dx"})", "unpaired high surrogate");
  malformed(R"({"a": "\ud83d\u0041"})", "unpaired high surrogate");
  malformed(R"({"a": "\ude00"})", "unpaired low surrogate");
  malformed(R"({"a": 01})", "expected ',' or '}'");
  malformed(R"({"a": +1})", "expected a value");
  malformed(R"({"a": .5})", "expected a value");
  malformed(R"({"a": 1.})", "expected digits after '.'");
  malformed(R"({"a": 1e})", "expected digits in the exponent");
  malformed(R"({"a": -})", "expected a value");
  malformed(R"({"a": NaN})", "expected a value");
  malformed(R"({"a": Infinity})", "expected a value");
  malformed(R"({"a": 1e999})", "number out of range");
  malformed(R"({"a": tru})", "expected a value");
  malformed(R"({"a": 1, "a": 2})", "duplicate key 'a'");
  malformed(R"({"a": 1 // comment
  })",
            "expected ',' or '}'");
  malformed(std::string("{\"a\": 1}\0", 9), "text after the top-level object");
  std::string deep = R"({"a": )";
  for (int i = 0; i < 300; ++i) deep += "[";
  malformed(deep, "nesting deeper than 256");
  std::string ok = R"({"a": )";
  for (int i = 0; i < 255; ++i) ok += "[";
  for (int i = 0; i < 255; ++i) ok += "]";
  CHECK(parse_hf_config(ok + "}").at("a") == config_value::of_nested(1));
}
