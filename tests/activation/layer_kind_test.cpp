#include <agoq/activation/layer_kind.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <ranges>

using namespace agoq::activation;

namespace {

/// Bytes of one micro-batch's saved tensors of one layer of `m` on shard `sh`, all in bf16 (fp32
/// where they are), the alias o_proj_input not counted.
std::int64_t layer_bytes(model_shape const& m, shard_shape const& sh) {
  std::int64_t bytes = 0;
  for (tensor_kind const k : m.saved_tensors())
    if (!is_alias(k)) bytes += shape_of(k, m, sh).bytes();
  return bytes;
}

}  // namespace

TEST_CASE("every kind has a name, a category and belongs to a block") {
  CHECK(all_tensor_kinds.size() == static_cast<std::size_t>(tensor_kind_count));
  for (int i = 0; i < tensor_kind_count; ++i) {
    tensor_kind const k = all_tensor_kinds[static_cast<std::size_t>(i)];
    CHECK(index_of(k) == i);
    CHECK(!name_of(k).empty());
    bool const llama = std::ranges::count(llama_block_tensors, k) == 1;
    bool const gpt = std::ranges::count(gpt_block_tensors, k) == 1;
    bool const qwen3 = std::ranges::count(qwen3_block_tensors, k) == 1;
    bool const llama_moe = std::ranges::count(llama_moe_block_tensors, k) == 1;
    bool const qwen3_moe = std::ranges::count(qwen3_moe_block_tensors, k) == 1;
    bool const gated = std::ranges::count(llama_gated_shared_moe_block_tensors, k) == 1;
    bool const gemma3 = std::ranges::count(gemma3_block_tensors, k) == 1;
    CHECK((llama || gpt || qwen3 || llama_moe || gated || gemma3));
    // Gemma 2: LLaMA's and the post-norms' inputs; Gemma 3 also the QK-norm's inputs.
    bool const post_norm =
        k == tensor_kind::post_attn_norm_input || k == tensor_kind::post_mlp_norm_input;
    CHECK(std::ranges::count(gemma2_block_tensors, k) == (llama || post_norm));
    CHECK(gemma3 == (qwen3 || post_norm));
    CHECK(qwen3 == (llama || k == tensor_kind::query_norm_input ||
                    k == tensor_kind::key_norm_input));  // LLaMA's and the QK-norm's inputs
    // The MoE blocks: the dense ones' but the dense MLP's three inner tensors, and the router's
    // and the experts' four.
    bool const expert = k == tensor_kind::router_probs || k == tensor_kind::expert_input ||
                        k == tensor_kind::expert_gate_output ||
                        k == tensor_kind::expert_up_output ||
                        k == tensor_kind::expert_swiglu_output;
    bool const dense_mlp = k == tensor_kind::gate_output || k == tensor_kind::up_output ||
                           k == tensor_kind::swiglu_output;
    CHECK(llama_moe == ((llama && !dense_mlp) || expert));
    CHECK(qwen3_moe == ((qwen3 && !dense_mlp) || expert));
    // With shared experts: the MoE blocks' and the dense MLP's three (its tensors), gated also
    // the shared experts' output and gate score.
    bool const shared_gate =
        k == tensor_kind::shared_expert_output || k == tensor_kind::shared_gate_score;
    CHECK(std::ranges::count(llama_shared_moe_block_tensors, k) == (llama || expert));
    CHECK(std::ranges::count(qwen3_shared_moe_block_tensors, k) == (qwen3 || expert));
    CHECK(gated == (llama || expert || shared_gate));
    CHECK(std::ranges::count(qwen3_gated_shared_moe_block_tensors, k) ==
          (qwen3 || expert || shared_gate));
  }
  CHECK(tensor_kind_count == 29);
  CHECK(name_of(tensor_kind::post_mlp_norm_input) == "post_mlp_norm_input");
  // Gemma's post-norms' inputs follow their sub-block's output projection.
  CHECK(std::ranges::equal(
      block_tensors(block_style::gemma2),
      std::array{tensor_kind::attn_norm_input, tensor_kind::qkv_input, tensor_kind::query,
                 tensor_kind::key, tensor_kind::value, tensor_kind::attention_output,
                 tensor_kind::softmax_lse, tensor_kind::o_proj_input,
                 tensor_kind::post_attn_norm_input, tensor_kind::mlp_norm_input,
                 tensor_kind::mlp_input, tensor_kind::gate_output, tensor_kind::up_output,
                 tensor_kind::swiglu_output, tensor_kind::post_mlp_norm_input}));
  CHECK(std::ranges::equal(block_tensors(block_style::gemma3).subspan(0, 4),
                           block_tensors(block_style::qwen3).subspan(0, 4)));
  CHECK(std::ranges::equal(block_tensors(block_style::gemma2, true), gemma2_block_tensors));
  CHECK((has_qk_norm(block_style::gemma3) && has_qk_norm(block_style::qwen3) &&
         !has_qk_norm(block_style::gemma2) && !has_qk_norm(block_style::llama)));
  CHECK((has_post_norms(block_style::gemma2) && has_post_norms(block_style::gemma3) &&
         !has_post_norms(block_style::qwen3)));
  CHECK(llama_like(block_style::gemma2));
  CHECK((has_moe_form(block_style::llama) && has_moe_form(block_style::qwen3) &&
         !has_moe_form(block_style::gemma3) && !has_moe_form(block_style::gpt)));
  CHECK(name_of(tensor_kind::shared_gate_score) == "shared_gate_score");
  CHECK(name_of(tensor_kind::expert_swiglu_output) == "expert_swiglu_output");
  CHECK(name_of(tensor_kind::router_probs) == "router_probs");
  // The MoE lists keep the dense lists' order, the experts' in the MLP's place.
  CHECK(std::ranges::equal(block_tensors(block_style::llama, true).subspan(0, 10),
                           llama_block_tensors | std::views::take(10)));
  CHECK(std::ranges::equal(block_tensors(block_style::qwen3, true).subspan(0, 12),
                           qwen3_block_tensors | std::views::take(12)));
  CHECK(block_tensors(block_style::llama, true)[10] == tensor_kind::router_probs);
  CHECK(block_tensors(block_style::gpt, true).size() == gpt_block_tensors.size());
  CHECK(preset_model("mixtral-8x7b").saved_tensors().size() == 15);
  CHECK(preset_model("qwen3-30b-a3b").saved_tensors().size() == 17);
  CHECK(preset_model("qwen3-8b").saved_tensors().size() == 15);
  // Shared experts are listed after the routed ones (as transformers' Qwen2MoeSparseMoeBlock runs
  // them; Megatron-Core's MoELayer runs them first), their gate's two tensors last.
  using enum shared_expert_form;
  CHECK(std::ranges::equal(block_tensors(block_style::llama, true, plain),
                           detail::join(llama_moe_block_tensors, detail::swiglu_mlp)));
  CHECK(std::ranges::equal(block_tensors(block_style::qwen3, true, plain),
                           detail::join(qwen3_moe_block_tensors, detail::swiglu_mlp)));
  CHECK(std::ranges::equal(
      block_tensors(block_style::llama, true, gated),
      detail::join(llama_moe_block_tensors, detail::swiglu_mlp,
                   std::array{tensor_kind::shared_expert_output, tensor_kind::shared_gate_score})));
  CHECK(std::ranges::equal(block_tensors(block_style::qwen3, true, gated).last(2),
                           detail::shared_gate));
  CHECK(block_tensors(block_style::qwen3, true, gated).size() == 22);
  CHECK(std::ranges::equal(block_tensors(block_style::llama, false, gated), llama_block_tensors));
  CHECK(preset_model("qwen2-57b-a14b").saved_tensors().size() == 20);
  model_shape plain_shared = preset_model("qwen2-57b-a14b");
  plain_shared.shared_expert_gate = false;
  CHECK(plain_shared.shared_experts() == plain);
  CHECK(plain_shared.saved_tensors().size() == 18);
  plain_shared.shared_expert_ffn = 0;
  CHECK(plain_shared.shared_experts() == none);
  CHECK(plain_shared.saved_tensors().size() == 15);
  CHECK(preset_model("llama3-8b").shared_experts() == none);
  CHECK(name_of(tensor_kind::swiglu_output) == "swiglu_output");
  CHECK(name_of(tensor_kind::fc2_input) == "fc2_input");
  CHECK(name_of(tensor_kind::query_norm_input) == "query_norm_input");
  CHECK(name_of(block_style::llama) == "llama");
  CHECK(name_of(block_style::gpt) == "gpt");
  CHECK(name_of(block_style::qwen3) == "qwen3");
  for (block_style const s : all_block_styles) {
    CHECK(block_style_named(name_of(s)) == s);
    CHECK(llama_like(s) == (s != block_style::gpt));
  }
  CHECK_THROWS_WITH_AS(
      block_style_named("qwen2"),
      doctest::Contains("unknown block style 'qwen2' (styles: llama, gpt, qwen3, gemma2, gemma3)"),
      agoq::invalid_argument);
  // The QK-norm's inputs sit after the QKV projection's input.
  CHECK(std::ranges::equal(block_tensors(block_style::qwen3).subspan(0, 4),
                           std::array{tensor_kind::attn_norm_input, tensor_kind::qkv_input,
                                      tensor_kind::query_norm_input, tensor_kind::key_norm_input}));
}

TEST_CASE("tensor_kind_named: each kind by its name, and a clear error for any other name") {
  for (tensor_kind const k : all_tensor_kinds) CHECK(tensor_kind_named(name_of(k)) == k);
  CHECK_THROWS_WITH_AS(tensor_kind_named("qkv"), doctest::Contains("unknown tensor kind 'qkv'"),
                       agoq::invalid_argument);
  CHECK_THROWS_AS(tensor_kind_named(""), agoq::invalid_argument);
  CHECK_THROWS_AS(tensor_kind_named("QKV_INPUT"), agoq::invalid_argument);
}

TEST_CASE("model presets: published shapes by name, and a clear error for any other name") {
  for (model_preset const& p : model_presets) {
    CHECK_NOTHROW(p.shape.validate());
    CHECK(preset_model(p.name).layers == p.shape.layers);
  }
  model_shape const q = preset_model("qwen2.5-32b");
  CHECK((q.layers == 64 && q.hidden == 5120 && q.ffn == 27648 && q.heads == 40 && q.kv_heads == 8 &&
         q.head_size() == 128 && q.vocab == 152064 && !q.tied_embeddings));
  model_shape const g = preset_model("gpt3-1.3b");
  CHECK((g.style == block_style::gpt && g.layers == 24 && g.hidden == 2048 && g.ffn == 8192 &&
         g.heads == 16 && g.kv_heads == 16 && g.vocab == 50257 && g.tied_embeddings));
  model_shape const l = preset_model("llama3-70b");
  CHECK((l.style == block_style::llama && l.layers == 80 && l.hidden == 8192 && l.ffn == 28672 &&
         l.heads == 64 && l.kv_heads == 8 && l.head_size() == 128 && l.vocab == 128256 &&
         !l.tied_embeddings));
  model_shape const w = preset_model("qwen3-32b");
  CHECK((w.style == block_style::qwen3 && w.layers == 64 && w.hidden == 5120 && w.ffn == 25600 &&
         w.heads == 64 && w.kv_heads == 8 && w.head_size() == 128 && w.vocab == 151936 &&
         !w.tied_embeddings));
  model_shape const x = preset_model("llama3-405b");
  CHECK((x.style == block_style::llama && x.layers == 126 && x.hidden == 16384 && x.ffn == 53248 &&
         x.heads == 128 && x.kv_heads == 8 && x.head_size() == 128 && x.vocab == 128256 &&
         !x.tied_embeddings));
  // The mixture-of-experts presets (their config.json files: hf_config_test).
  model_shape const mx = preset_model("mixtral-8x7b");
  CHECK((mx.style == block_style::llama && mx.layers == 32 && mx.hidden == 4096 && mx.ffn == 0 &&
         mx.heads == 32 && mx.kv_heads == 8 && mx.head_size() == 128 && mx.vocab == 32000 &&
         !mx.tied_embeddings && mx.experts == 8 && mx.experts_per_token == 2 &&
         mx.expert_ffn == 14336 && mx.moe()));
  model_shape const qm = preset_model("qwen3-30b-a3b");
  CHECK((qm.style == block_style::qwen3 && qm.layers == 48 && qm.hidden == 2048 && qm.ffn == 0 &&
         qm.heads == 32 && qm.kv_heads == 4 && qm.head_size() == 128 && qm.vocab == 151936 &&
         qm.experts == 128 && qm.experts_per_token == 8 && qm.expert_ffn == 768));
  model_shape const qb = preset_model("qwen3-235b-a22b");
  CHECK((qb.style == block_style::qwen3 && qb.layers == 94 && qb.hidden == 4096 && qb.heads == 64 &&
         qb.kv_heads == 4 && qb.experts == 128 && qb.experts_per_token == 8 &&
         qb.expert_ffn == 1536));
  // Qwen's two with gated shared experts (Qwen1.5-MoE-A2.7B and Qwen2-57B-A14B's config.json).
  model_shape const q15 = preset_model("qwen1.5-moe-a2.7b");
  CHECK((q15.style == block_style::llama && q15.layers == 24 && q15.hidden == 2048 &&
         q15.ffn == 0 && q15.heads == 16 && q15.kv_heads == 16 && q15.head_size() == 128 &&
         q15.vocab == 151936 && !q15.tied_embeddings && q15.experts == 60 &&
         q15.experts_per_token == 4 && q15.expert_ffn == 1408 && q15.shared_expert_ffn == 5632 &&
         q15.shared_expert_gate && q15.mlp_width() == 5632));
  model_shape const q2 = preset_model("qwen2-57b-a14b");
  CHECK((q2.style == block_style::llama && q2.layers == 28 && q2.hidden == 3584 && q2.heads == 28 &&
         q2.kv_heads == 4 && q2.head_size() == 128 && q2.experts == 64 &&
         q2.experts_per_token == 8 && q2.expert_ffn == 2560 && q2.shared_expert_ffn == 20480 &&
         q2.shared_experts() == shared_expert_form::gated));
  CHECK(mx.mlp_width() == 0);
  // Gemma's (their config.json files: hf_config_test).
  model_shape const g9 = preset_model("gemma2-9b");
  CHECK((g9.style == block_style::gemma2 && g9.layers == 42 && g9.hidden == 3584 &&
         g9.ffn == 14336 && g9.heads == 16 && g9.kv_heads == 8 && g9.head_size() == 256 &&
         g9.vocab == 256000 && g9.tied_embeddings && !g9.moe()));
  model_shape const g1 = preset_model("gemma3-1b");
  CHECK((g1.style == block_style::gemma3 && g1.layers == 26 && g1.hidden == 1152 &&
         g1.ffn == 6912 && g1.heads == 4 && g1.kv_heads == 1 && g1.head_size() == 256 &&
         g1.vocab == 262144 && g1.tied_embeddings));
  CHECK(preset_model("gemma2-27b").head_size() == 128);
  CHECK(preset_model("gemma2-2b").saved_tensors().size() == 15);
  CHECK(g1.saved_tensors().size() == 17);
  CHECK(preset_model("llama3-8b").mlp_width() == 14336);
  CHECK(!preset_model("llama3-8b").moe());
  CHECK_THROWS_WITH_AS(preset_model("deepseek-v3"),
                       doctest::Contains("unknown preset 'deepseek-v3' (presets: llama3-8b, "
                                         "llama3-70b, llama3-405b, qwen2.5-32b, qwen3-8b, "
                                         "qwen3-32b, gpt3-1.3b, mixtral-8x7b, qwen3-30b-a3b, "
                                         "qwen3-235b-a22b, qwen1.5-moe-a2.7b, qwen2-57b-a14b, "
                                         "gemma2-2b, gemma2-9b, gemma2-27b, gemma3-1b)"),
                       agoq::invalid_argument);
}

TEST_CASE("model_shape::validate: a dense MLP or experts, not both") {
  model_shape m = preset_model("mixtral-8x7b");
  auto refused = [](model_shape const& x, char const* what) {
    CHECK_THROWS_WITH_AS(x.validate(), doctest::Contains(what), agoq::invalid_argument);
  };
  model_shape x = m;
  x.ffn = 14336;  // a dense MLP beside the experts
  refused(x,
          "a mixture-of-experts model has ffn 0 (no dense MLP) and expert_ffn >= 1, got ffn "
          "14336 and expert_ffn 14336");
  x = m;
  x.expert_ffn = 0;
  refused(x, "has ffn 0 (no dense MLP) and expert_ffn >= 1, got ffn 0 and expert_ffn 0");
  x = m;
  x.experts_per_token = 9;
  refused(x, "experts_per_token must be in [1, experts (8)], got 9");
  x.experts_per_token = 0;
  refused(x, "experts_per_token must be in [1, experts (8)], got 0");
  x = m;
  x.experts = -1;
  refused(x, "experts, experts_per_token, expert_ffn and shared_expert_ffn must be >= 0");
  x = m;
  x.shared_expert_ffn = -1;
  refused(x, "experts, experts_per_token, expert_ffn and shared_expert_ffn must be >= 0");
  x = m;
  x.shared_expert_gate = true;  // a gate without shared experts
  refused(x, "shared_expert_gate needs shared experts (shared_expert_ffn >= 1)");
  x.shared_expert_ffn = 4096;
  CHECK_NOTHROW(x.validate());
  x = preset_model("gpt3-1.3b");
  x.ffn = 0;
  x.experts = 8;
  x.experts_per_token = 2;
  x.expert_ffn = 8192;
  refused(x, "a mixture-of-experts MLP needs a LLaMA- or Qwen3-style block, not gpt");
  x.style = block_style::gemma2;
  x.kv_heads = 4;
  refused(x, "a mixture-of-experts MLP needs a LLaMA- or Qwen3-style block, not gemma2");
  x = preset_model("llama3-8b");
  x.ffn = 0;
  refused(x, "ffn must be positive (a dense MLP), got 0");
  x = preset_model("llama3-8b");
  x.experts_per_token = 2;
  refused(x,
          "experts_per_token, expert_ffn, shared_expert_ffn and shared_expert_gate need "
          "experts > 0");
  x = preset_model("llama3-8b");
  x.shared_expert_ffn = 4096;
  refused(x, "shared_expert_gate need experts > 0");
  x = preset_model("llama3-8b");
  x.shared_expert_gate = true;
  refused(x, "shared_expert_gate need experts > 0");
  // Too large to count: 2^40 experts of 2^20 on hidden 4096 (2^66 expert parameters a layer).
  x = m;
  x.experts = std::int64_t{1} << 40;
  x.expert_ffn = std::int64_t{1} << 20;
  refused(x, "too large to count in 64-bit bytes");
}

TEST_CASE("categories") {
  for (tensor_kind k :
       {tensor_kind::query, tensor_kind::key, tensor_kind::value, tensor_kind::attention_output,
        tensor_kind::softmax_lse, tensor_kind::query_norm_input, tensor_kind::key_norm_input})
    CHECK(category_of(k) == tensor_category::attention_core);
  for (tensor_kind k : {tensor_kind::qkv_input, tensor_kind::o_proj_input, tensor_kind::mlp_input,
                        tensor_kind::swiglu_output, tensor_kind::fc1_input, tensor_kind::fc2_input})
    CHECK(category_of(k) == tensor_category::linear_input);
  for (tensor_kind k : {tensor_kind::gate_output, tensor_kind::up_output, tensor_kind::gelu_input})
    CHECK(category_of(k) == tensor_category::activation_input);
  for (tensor_kind k : {tensor_kind::attn_norm_input, tensor_kind::mlp_norm_input,
                        tensor_kind::ln1_input, tensor_kind::ln2_input})
    CHECK(category_of(k) == tensor_category::residual_stream);
  for (tensor_kind k : {tensor_kind::expert_input, tensor_kind::expert_swiglu_output})
    CHECK(category_of(k) == tensor_category::linear_input);
  for (tensor_kind k : {tensor_kind::expert_gate_output, tensor_kind::expert_up_output})
    CHECK(category_of(k) == tensor_category::activation_input);
  CHECK(category_of(tensor_kind::router_probs) == tensor_category::routing);
  CHECK(category_of(tensor_kind::shared_gate_score) == tensor_category::routing);
  CHECK(category_of(tensor_kind::shared_expert_output) == tensor_category::activation_input);
  CHECK(precise_bytes_of(tensor_kind::shared_gate_score) == 2);  // bf16, as the gate's weight
  CHECK(name_of(tensor_category::routing) == "routing");
  CHECK(precise_bytes_of(tensor_kind::router_probs) == 4);  // fp32
  CHECK(is_alias(tensor_kind::o_proj_input));
  CHECK(storage_kind(tensor_kind::o_proj_input) == tensor_kind::attention_output);
  CHECK(storage_kind(tensor_kind::query) == tensor_kind::query);
  CHECK(precise_bytes_of(tensor_kind::softmax_lse) == 4);    // fp32
  CHECK(precise_bytes_of(tensor_kind::swiglu_output) == 2);  // bf16
}

TEST_CASE("LLaMA-3-8B shapes without tensor parallelism") {
  model_shape const m = preset_model("llama3-8b");
  shard_shape const sh{2, 4096, 1, false};  // 8192 tokens
  CHECK(shape_of(tensor_kind::attn_norm_input, m, sh) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::qkv_input, m, sh) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::query, m, sh) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::key, m, sh) == saved_shape{8192, 1024, 2});
  CHECK(shape_of(tensor_kind::value, m, sh) == saved_shape{8192, 1024, 2});
  CHECK(shape_of(tensor_kind::softmax_lse, m, sh) == saved_shape{64, 4096, 4});
  CHECK(shape_of(tensor_kind::gate_output, m, sh) == saved_shape{8192, 14336, 2});
  CHECK(shape_of(tensor_kind::swiglu_output, m, sh) == saved_shape{8192, 14336, 2});
  // Bytes per token per layer (o_proj_input is the attention output's buffer):
  // 2 residual 2*4096*2 + 2 norm outputs + Q + O 4096*2 each + K, V 1024*2 each + 3 * 14336*2
  // + lse 32 heads * 4 bytes.
  std::int64_t const bytes = layer_bytes(m, sh);
  CHECK(bytes == 8192 * (6 * 4096 * 2 + 2 * 1024 * 2 + 3 * 14336 * 2 + 32 * 4));
  CHECK(bytes == 8192 * std::int64_t{139392});
}

TEST_CASE("tensor parallelism splits heads and the MLP; sequence parallelism the rest") {
  model_shape const m = preset_model("llama3-8b");
  shard_shape const tp4{1, 8192, 4, false};
  CHECK(shape_of(tensor_kind::attn_norm_input, m, tp4) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::mlp_input, m, tp4) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::query, m, tp4) == saved_shape{8192, 1024, 2});
  CHECK(shape_of(tensor_kind::key, m, tp4) == saved_shape{8192, 256, 2});  // 2 kv heads
  CHECK(shape_of(tensor_kind::softmax_lse, m, tp4) == saved_shape{8, 8192, 4});
  CHECK(shape_of(tensor_kind::up_output, m, tp4) == saved_shape{8192, 3584, 2});
  shard_shape const sp4{1, 8192, 4, true};
  CHECK(shape_of(tensor_kind::attn_norm_input, m, sp4) == saved_shape{2048, 4096, 2});
  CHECK(shape_of(tensor_kind::qkv_input, m, sp4) == saved_shape{2048, 4096, 2});
  CHECK(shape_of(tensor_kind::query, m, sp4) == saved_shape{8192, 1024, 2});
  // More ranks than kv heads: one replicated kv head per rank.
  shard_shape const tp16{1, 8192, 16, false};
  CHECK(shape_of(tensor_kind::value, m, tp16) == saved_shape{8192, 128, 2});
  for (tensor_kind k : all_tensor_kinds) {
    // The experts' tensors are split by the expert-parallel layout, not by tp (expert_rows).
    bool const replicated =
        category_of(k) == tensor_category::residual_stream || k == tensor_kind::qkv_input ||
        k == tensor_kind::mlp_input || k == tensor_kind::fc1_input ||
        k == tensor_kind::router_probs || k == tensor_kind::expert_input ||
        k == tensor_kind::expert_gate_output || k == tensor_kind::expert_up_output ||
        k == tensor_kind::expert_swiglu_output || k == tensor_kind::shared_expert_output ||
        k == tensor_kind::shared_gate_score;
    CHECK(split_by_tp(k) == !replicated);
  }
}

TEST_CASE("mixture-of-experts shapes: the router's over the tokens, the experts' over R pairs") {
  model_shape const m = preset_model("mixtral-8x7b");  // 8 experts, 2 a token, f_e 14336
  // tp 1: every token of the micro-batch, R = 2 x 8192 pairs (routing balanced).
  shard_shape const one{2, 4096, 1, false};
  CHECK(one.expert_tp() == 1);
  CHECK(one.expert_rows(m) == 16384);
  CHECK(shape_of(tensor_kind::mlp_input, m, one) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::router_probs, m, one) == saved_shape{8192, 8, 4});
  CHECK(shape_of(tensor_kind::expert_input, m, one) == saved_shape{16384, 4096, 2});
  CHECK(shape_of(tensor_kind::expert_gate_output, m, one) == saved_shape{16384, 14336, 2});
  CHECK(shape_of(tensor_kind::expert_swiglu_output, m, one) == saved_shape{16384, 14336, 2});
  // tp 4 with SP, etp = tp (the default): 2048 tokens a rank routed, 4096 pairs, gathered over
  // the 4 expert-TP ranks: 16384 rows of 14336 / 4.
  shard_shape const sp4{2, 4096, 4, true};
  CHECK(sp4.expert_tp() == 4);
  CHECK(shape_of(tensor_kind::router_probs, m, sp4) == saved_shape{2048, 8, 4});
  CHECK(shape_of(tensor_kind::expert_input, m, sp4) == saved_shape{16384, 4096, 2});
  CHECK(shape_of(tensor_kind::expert_up_output, m, sp4) == saved_shape{16384, 3584, 2});
  // etp 1: each rank's own 4096 pairs at the full expert width.
  shard_shape sp4e1 = sp4;
  sp4e1.etp = 1;
  CHECK(shape_of(tensor_kind::expert_input, m, sp4e1) == saved_shape{4096, 4096, 2});
  CHECK(shape_of(tensor_kind::expert_gate_output, m, sp4e1) == saved_shape{4096, 14336, 2});
  // The experts' inner tensors take the same bytes whatever etp: R f_e / etp = tokens k f_e / tp.
  CHECK(shape_of(tensor_kind::expert_gate_output, m, sp4e1).bytes() ==
        shape_of(tensor_kind::expert_gate_output, m, sp4).bytes());
  // The attention's tensors are the dense model's.
  model_shape dense = m;
  dense.experts = dense.experts_per_token = dense.expert_ffn = 0;
  dense.ffn = 14336;
  for (tensor_kind k : llama_block_tensors)
    if (std::ranges::count(llama_moe_block_tensors, k) == 1)
      CHECK(shape_of(k, m, sp4) == shape_of(k, dense, sp4));
  CHECK(sp4.expert_rows(dense) == 0);
  CHECK_THROWS_WITH_AS(
      shape_of(tensor_kind::gate_output, m, sp4),
      doctest::Contains(
          "gate_output is not saved by a llama-style block with a mixture-of-experts MLP"),
      agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, dense, sp4),
                       doctest::Contains("expert_input is not saved by a llama-style block"),
                       agoq::invalid_argument);
  // Megatron-Core refuses MoE under tp > 1 without SP; etp must divide the experts' width.
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, m, shard_shape{2, 4096, 4, false}),
                       doctest::Contains("with tp > 1 needs sequence parallelism"),
                       agoq::invalid_argument);
  shard_shape odd = sp4;
  odd.etp = 3;
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, m, odd),
                       doctest::Contains("expert tensor-parallel degree (3) must divide "
                                         "expert_ffn (14336)"),
                       agoq::invalid_argument);
  odd.etp = -1;
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, m, odd), doctest::Contains("etp >= 0"),
                       agoq::invalid_argument);
  // A capacity factor (Megatron-Core's, padded to capacity): each of the 8 experts takes
  // ceil(2048 x 2 / 8 x C) pairs of each rank's 4096; R = etp 4 x 8 experts x that.
  shard_shape cap = sp4;
  cap.capacity_factor = 1.25;
  CHECK(cap.expert_rows(m) == 4 * 8 * 640);
  CHECK(shape_of(tensor_kind::expert_input, m, cap) == saved_shape{20480, 4096, 2});
  CHECK(shape_of(tensor_kind::expert_gate_output, m, cap) == saved_shape{20480, 3584, 2});
  CHECK(shape_of(tensor_kind::router_probs, m, cap) == saved_shape{2048, 8, 4});
  cap.capacity_factor = 1.1;  // 563.2 -> 564
  CHECK(cap.expert_rows(m) == 4 * 8 * 564);
  cap.capacity_factor = 1;  // exactly the mean when it divides
  CHECK(cap.expert_rows(m) == sp4.expert_rows(m));
  cap.capacity_factor = 0.5;  // half the pairs dropped
  CHECK(cap.expert_rows(m) == sp4.expert_rows(m) / 2);
  for (double const bad : {-0.5, std::nan(""), HUGE_VAL}) {
    cap.capacity_factor = bad;
    CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, m, cap),
                         doctest::Contains("the expert capacity factor must be finite and >= 0"),
                         agoq::invalid_argument);
  }
  cap.capacity_factor = 1e300;  // finite, but no byte count holds it
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::expert_input, m, cap),
                       doctest::Contains("too many to count in 64-bit bytes"),
                       agoq::invalid_argument);
  shard_shape dense_cap{2, 4096, 4, true};
  dense_cap.capacity_factor = 1.25;
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::query, dense, dense_cap),
                       doctest::Contains("an expert capacity factor needs a mixture-of-experts"),
                       agoq::invalid_argument);
  // The measured load factor as the capacity factor: a routing of this micro-batch's 4096 x 4
  // pairs (all 4 ranks' tokens) with 8 experts on EP 4; rank 1 (experts 2 and 3) takes the most,
  // 5120 of them against the mean's 4096: factor 1.25, and the padded rows bound its pairs.
  std::array<std::int64_t, 8> const routed = {2048, 1024, 2560, 2560, 1536, 2048, 2048, 2560};
  double const load = expert_load_factor(routed, 4);
  CHECK(load == 1.25);
  shard_shape measured = sp4;
  measured.etp = 1;
  measured.capacity_factor = load;
  CHECK(measured.expert_rows(m) >= 5120);
  CHECK(measured.expert_rows(m) == 8 * 640);
  CHECK(expert_load_factor(routed, 1) == 1.0);  // one rank holds them all
  CHECK(expert_load_factor(routed, 8) == 2560.0 * 8 / 16384);
  CHECK_THROWS_WITH_AS(expert_load_factor(routed, 3),
                       doctest::Contains("ep (3) must divide the experts (8)"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(expert_load_factor(std::array<std::int64_t, 2>{0, 0}, 1),
                       doctest::Contains("no pairs were routed"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(expert_load_factor(std::array<std::int64_t, 2>{4, -1}, 2),
                       doctest::Contains("counts must be >= 0"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(expert_load_factor(std::array<std::int64_t, 2>{std::int64_t{1} << 62, 1}, 1),
                       doctest::Contains("sum to at most 2^62"), agoq::invalid_argument);
  CHECK_THROWS_AS(expert_load_factor(std::span<std::int64_t const>{}, 1), agoq::invalid_argument);
  // Qwen3-MoE: Qwen3's attention tensors, 128 experts with 8 a token.  // Qwen3-MoE: Qwen3's
  // attention tensors, 128 experts with 8 a token.  // Qwen3-MoE: Qwen3's attention tensors, 128
  // experts with 8 a token.
  model_shape const q = preset_model("qwen3-30b-a3b");
  shard_shape const qs{1, 4096, 2, true};
  CHECK(shape_of(tensor_kind::query_norm_input, q, qs) == saved_shape{4096, 2048, 2});
  CHECK(shape_of(tensor_kind::router_probs, q, qs) == saved_shape{2048, 128, 4});
  CHECK(shape_of(tensor_kind::expert_input, q, qs) == saved_shape{32768, 2048, 2});
  CHECK(shape_of(tensor_kind::expert_swiglu_output, q, qs) == saved_shape{32768, 384, 2});
}

TEST_CASE("shared experts: the dense MLP's tensors at their width; gated, their output and gate") {
  model_shape const m = preset_model("qwen2-57b-a14b");  // hidden 3584, shared 20480, gated
  // tp 4 with SP: the shared experts' inner tensors over every token at 20480 / 4, as a dense
  // MLP's; their output and gate score over the rank's 8192 / 4 tokens.
  shard_shape const sp4{2, 4096, 4, true};
  CHECK(shape_of(tensor_kind::gate_output, m, sp4) == saved_shape{8192, 5120, 2});
  CHECK(shape_of(tensor_kind::up_output, m, sp4) == saved_shape{8192, 5120, 2});
  CHECK(shape_of(tensor_kind::swiglu_output, m, sp4) == saved_shape{8192, 5120, 2});
  CHECK(shape_of(tensor_kind::shared_expert_output, m, sp4) == saved_shape{2048, 3584, 2});
  CHECK(shape_of(tensor_kind::shared_gate_score, m, sp4) == saved_shape{2048, 1, 2});
  // The routed experts' are as without shared experts: 2048 tokens x 8 pairs, over 4 etp ranks.
  CHECK(shape_of(tensor_kind::expert_input, m, sp4) == saved_shape{65536, 3584, 2});
  CHECK(shape_of(tensor_kind::expert_up_output, m, sp4) == saved_shape{65536, 640, 2});
  // Bytes per token per layer without TP: attention (Q, O 3584, K, V 512, 2 residual and 2 norm
  // outputs 3584, lse 28 x 4), the router 64 x 4, the routed experts 8 x (3584 + 3 x 2560), the
  // shared experts 3 x 20480, their output 3584 and gate score 1, in bf16.
  shard_shape const one{1, 4096, 1, false};
  std::int64_t const bytes = layer_bytes(m, one);
  std::int64_t const per_token = 2 * (6 * 3584 + 2 * 512) + 28 * 4 + 64 * 4 +
                                 2 * 8 * (3584 + 3 * 2560) + 2 * 3 * 20480 + 2 * 3584 + 2;
  CHECK(bytes == 4096 * per_token);
  // Ungated: neither of the gate's two.
  model_shape plain = m;
  plain.shared_expert_gate = false;
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::shared_gate_score, plain, sp4),
                       doctest::Contains("shared_gate_score is not saved by a llama-style block "
                                         "with a mixture-of-experts MLP and shared experts"),
                       agoq::invalid_argument);
  CHECK(shape_of(tensor_kind::gate_output, plain, sp4) == saved_shape{8192, 5120, 2});
  // tp must divide the shared experts' width, as a dense MLP's.
  model_shape odd = m;
  odd.shared_expert_ffn = 20482;
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::query, odd, sp4),
                       doctest::Contains("tp (4) must divide heads (28) and shared_expert_ffn "
                                         "(20482)"),
                       agoq::invalid_argument);
}

TEST_CASE("Qwen3-style shapes: LLaMA's and the QK-norm's inputs, Q's and K's") {
  model_shape const m = preset_model("qwen3-32b");  // 64 heads of 128 on hidden 5120
  shard_shape const sh{1, 4096, 4, true};
  CHECK(shape_of(tensor_kind::query_norm_input, m, sh) == saved_shape{4096, 2048, 2});
  CHECK(shape_of(tensor_kind::query, m, sh) == saved_shape{4096, 2048, 2});
  CHECK(shape_of(tensor_kind::key_norm_input, m, sh) == saved_shape{4096, 256, 2});
  CHECK(shape_of(tensor_kind::qkv_input, m, sh) == saved_shape{1024, 5120, 2});
  for (tensor_kind k : llama_block_tensors)
    CHECK(shape_of(k, m, sh) ==
          shape_of(k, model_shape{block_style::llama, 64, 5120, 25600, 64, 8, 128, 151936}, sh));
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::query_norm_input, preset_model("llama3-8b"), sh),
                       doctest::Contains("query_norm_input is not saved by a llama-style block"),
                       agoq::invalid_argument);
  CHECK(split_by_tp(tensor_kind::key_norm_input));
}

TEST_CASE("Gemma-style shapes: LLaMA's, the post-norms' inputs and Gemma 3's QK-norm inputs") {
  model_shape const m = preset_model("gemma2-9b");  // 16 heads of 256 on hidden 3584, 8 kv heads
  // TP 4 + SP: the post-norms' inputs as the residual stream, the rank's 2048 tokens; Q at the
  // heads' width 4096 / 4 (not hidden / 4), the GeGLU's inner tensors at 14336 / 4.
  shard_shape const sp4{1, 8192, 4, true};
  CHECK(shape_of(tensor_kind::post_attn_norm_input, m, sp4) == saved_shape{2048, 3584, 2});
  CHECK(shape_of(tensor_kind::post_mlp_norm_input, m, sp4) == saved_shape{2048, 3584, 2});
  CHECK(shape_of(tensor_kind::query, m, sp4) == saved_shape{8192, 1024, 2});
  CHECK(shape_of(tensor_kind::key, m, sp4) == saved_shape{8192, 512, 2});
  CHECK(shape_of(tensor_kind::gate_output, m, sp4) == saved_shape{8192, 3584, 2});
  // Bytes per token per layer without TP, bf16: 6 tensors of 3584 (2 residual, 2 norm outputs,
  // 2 post-norm inputs), Q and O 4096, K and V 2048, GeGLU's 3 x 14336, 16 heads' fp32 lse.
  shard_shape const one{1, 4096, 1, false};
  CHECK(layer_bytes(m, one) == 4096 * (2 * (6 * 3584 + 2 * 4096 + 2 * 2048 + 3 * 14336) + 16 * 4));
  // Gemma 3: the QK-norm's inputs, at Q's and K's widths (one kv head of 256).
  model_shape const g3 = preset_model("gemma3-1b");
  CHECK(shape_of(tensor_kind::query_norm_input, g3, one) == saved_shape{4096, 1024, 2});
  CHECK(shape_of(tensor_kind::key_norm_input, g3, one) == saved_shape{4096, 256, 2});
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::query_norm_input, m, one),
                       doctest::Contains("query_norm_input is not saved by a gemma2-style block"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of(tensor_kind::post_mlp_norm_input, preset_model("llama3-8b"), one),
                       doctest::Contains("post_mlp_norm_input is not saved by a llama-style block"),
                       agoq::invalid_argument);
}

TEST_CASE("GPT-style shapes") {
  model_shape const m{block_style::gpt, 24, 2048, 8192, 16, 16, 0, 50257, true};
  shard_shape const sh{4, 2048, 2, true};
  CHECK(m.head_size() == 128);
  CHECK(shape_of(tensor_kind::ln1_input, m, sh) == saved_shape{4096, 2048, 2});
  CHECK(shape_of(tensor_kind::fc1_input, m, sh) == saved_shape{4096, 2048, 2});
  CHECK(shape_of(tensor_kind::gelu_input, m, sh) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::fc2_input, m, sh) == saved_shape{8192, 4096, 2});
  CHECK(shape_of(tensor_kind::key, m, sh) == saved_shape{8192, 1024, 2});
}

TEST_CASE("bad shapes are refused") {
  model_shape m = preset_model("llama3-8b");
  CHECK_THROWS_AS(shape_of(tensor_kind::gelu_input, m, {}), agoq::invalid_argument);
  CHECK_THROWS_AS(shape_of(tensor_kind::query, m, {1, 4096, 3, false}), agoq::invalid_argument);
  CHECK_THROWS_AS(shape_of(tensor_kind::query, m, {1, 4095, 2, true}), agoq::invalid_argument);
  m.kv_heads = 5;
  CHECK_THROWS_WITH_AS(m.validate(), doctest::Contains("multiple of kv_heads"),
                       agoq::invalid_argument);
}
