#include <agoq/activation/layer_kind.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>

using namespace agoq::activation;

TEST_CASE("every kind has a name, a category and belongs to a block") {
  CHECK(all_tensor_kinds.size() == static_cast<std::size_t>(tensor_kind_count));
  for (int i = 0; i < tensor_kind_count; ++i) {
    tensor_kind const k = all_tensor_kinds[static_cast<std::size_t>(i)];
    CHECK(index_of(k) == i);
    CHECK(!name_of(k).empty());
    bool const llama = std::ranges::count(llama_block_tensors, k) == 1;
    bool const gpt = std::ranges::count(gpt_block_tensors, k) == 1;
    bool const qwen3 = std::ranges::count(qwen3_block_tensors, k) == 1;
    CHECK((llama || gpt || qwen3));
    CHECK(qwen3 == (llama || k == tensor_kind::query_norm_input ||
                    k == tensor_kind::key_norm_input));  // LLaMA's and the QK-norm's inputs
  }
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
  CHECK_THROWS_WITH_AS(block_style_named("qwen2"),
                       doctest::Contains("unknown block style 'qwen2' (styles: llama, gpt, qwen3)"),
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
  CHECK_THROWS_WITH_AS(preset_model("mixtral-8x7b"),
                       doctest::Contains("unknown preset 'mixtral-8x7b' (presets: llama3-8b, "
                                         "llama3-70b, llama3-405b, qwen2.5-32b, qwen3-8b, "
                                         "qwen3-32b, gpt3-1.3b)"),
                       agoq::invalid_argument);
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
  std::int64_t bytes = 0;
  for (tensor_kind k : llama_block_tensors)
    if (!is_alias(k)) bytes += shape_of(k, m, sh).bytes();
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
    bool const replicated = category_of(k) == tensor_category::residual_stream ||
                            k == tensor_kind::qkv_input || k == tensor_kind::mlp_input ||
                            k == tensor_kind::fc1_input;
    CHECK(split_by_tp(k) == !replicated);
  }
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
