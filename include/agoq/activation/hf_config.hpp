/// \file
/// Model shapes from Hugging Face `config.json` files: a strict JSON reader of a config's
/// top-level keys (parse_hf_config) and the mapping of LLaMA-style (`llama`, `mistral`, `qwen2`),
/// Qwen3, mixture-of-experts (`mixtral`, `qwen3_moe`) and GPT-2 configs onto model_shape
/// (model_from_hf_config). Host only, no dependency.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "../error.hpp"
#include "layer_kind.hpp"

namespace agoq::activation {

/// One top-level value of a config: JSON's null, true or false, a number, a string, or an object
/// or array (`nested`: checked as JSON, its contents not kept but their count, its members or
/// elements, in `number`; model_from_hf_config reads only that of Qwen3-MoE's `mlp_only_layers`).
struct config_value {
  enum class type : std::uint8_t { null, boolean, number, string, nested };
  type kind = type::null;
  bool boolean = false;
  double number = 0;
  std::string text;

  static config_value of_bool(bool b) { return {type::boolean, b, 0, {}}; }
  static config_value of_number(double x) { return {type::number, false, x, {}}; }
  static config_value of_string(std::string s) { return {type::string, false, 0, std::move(s)}; }
  static config_value of_nested(std::size_t size = 0) {
    return {type::nested, false, static_cast<double>(size), {}};
  }
  friend bool operator==(config_value const&, config_value const&) = default;
};

/// A config's top-level keys and their values.
using hf_config = std::map<std::string, config_value, std::less<>>;

namespace hf_detail {

/// Objects and arrays nested deeper than this are refused (the reader recurses).
inline constexpr int max_depth = 256;

/// A strict RFC 8259 reader of one JSON object (whitespace around it), keeping its top-level
/// members. Refuses, naming the byte offset: anything but an object at the top, trailing commas,
/// comments, single quotes, control characters and bad escapes in strings, unpaired surrogates,
/// leading zeros, `+`, `NaN` and `Infinity`, numbers out of double's range, duplicate top-level
/// keys, nesting deeper than max_depth, text after the object.
class reader {
 public:
  explicit reader(std::string_view s) noexcept : s_(s) {}

  hf_config document() {
    hf_config c;
    space();
    if (peek() != '{') fail("expected a JSON object");
    members([&](std::string key) {
      config_value v = value(1);
      if (c.contains(key)) fail("duplicate key '" + key + "'");
      c.emplace(std::move(key), std::move(v));
    });
    space();
    if (i_ != s_.size()) fail("text after the top-level object");
    return c;
  }

 private:
  [[noreturn]] void fail(std::string const& what) const {
    agoq::detail::throw_invalid(__FILE__, __LINE__,
                                "hf config: " + what + " at byte " + std::to_string(i_));
  }

  char peek() const noexcept { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool at_end() const noexcept { return i_ >= s_.size(); }

  void space() noexcept {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }

  void expect(char c, char const* what) {
    if (peek() != c) fail(std::string("expected ") + what);
    ++i_;
  }

  /// An object at i_ ('{'): calls member(key) with i_ at each member's value.
  template <class Member>
  void members(Member&& member) {
    expect('{', "'{'");
    space();
    if (peek() == '}') {
      ++i_;
      return;
    }
    for (;;) {
      space();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      space();
      expect(':', "':'");
      space();
      member(std::move(key));
      space();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}', "',' or '}'");
      return;
    }
  }

  config_value value(int depth) {
    if (depth > max_depth) fail("nesting deeper than " + std::to_string(max_depth));
    char const c = peek();
    if (at_end()) fail("expected a value");
    if (c == '{') {
      std::size_t size = 0;
      members([&](std::string) {
        value(depth + 1);
        ++size;
      });
      return config_value::of_nested(size);
    }
    if (c == '[') {
      ++i_;
      space();
      if (peek() == ']') {
        ++i_;
        return config_value::of_nested();
      }
      for (std::size_t size = 1;; ++size) {
        space();
        value(depth + 1);
        space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']', "',' or ']'");
        return config_value::of_nested(size);
      }
    }
    if (c == '"') return config_value::of_string(string());
    if (literal("true")) return config_value::of_bool(true);
    if (literal("false")) return config_value::of_bool(false);
    if (literal("null")) return {};
    return config_value::of_number(number());
  }

  bool literal(std::string_view word) noexcept {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      char const c = peek();
      if (at_end()) fail("unterminated \\u escape");
      unsigned const d = c >= '0' && c <= '9'   ? static_cast<unsigned>(c - '0')
                         : c >= 'a' && c <= 'f' ? static_cast<unsigned>(c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? static_cast<unsigned>(c - 'A' + 10)
                                                : 16u;
      if (d == 16u) fail("bad \\u escape");
      u = u * 16 + d;
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  /// A string at i_ ('"'), its escapes decoded (\uXXXX to UTF-8, surrogate pairs joined).
  std::string string() {
    ++i_;
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      char const c = s_[i_];
      if (c == '"') {
        ++i_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      ++i_;
      char const e = peek();
      if (at_end()) fail("unterminated string");
      ++i_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail("unpaired low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!literal("\\u")) fail("unpaired high surrogate");
            unsigned const low = hex4();
            if (low < 0xdc00 || low > 0xdfff) fail("unpaired high surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --i_;
          fail("bad escape in a string");
      }
    }
  }

  /// A number at i_ in JSON's grammar, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, as the
  /// nearest double.
  double number() {
    std::size_t const begin = i_;
    auto const digits = [&] {
      std::size_t const from = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else if (digits() == 0) {
      i_ = begin;
      fail("expected a value");
    }
    if (peek() == '.') {
      ++i_;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (digits() == 0) fail("expected digits in the exponent");
    }
    double x = 0;
    auto const [end, ec] = std::from_chars(s_.data() + begin, s_.data() + i_, x);
    if (ec != std::errc() || end != s_.data() + i_) {
      i_ = begin;
      fail("number out of range");
    }
    return x;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

/// The model_types model_from_hf_config reads as llama_like blocks (gpt2 besides): qwen3 as
/// block_style::qwen3, gemma2 as gemma2, gemma3_text as gemma3, the others as block_style::llama
/// (Gemma 1's GeGLU MLP saves what SwiGLU's does).
inline constexpr std::array<std::string_view, 7> llama_like_types = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"};

/// The Gemma model_types (GeGLU; transformers' defaults: head_dim 256, tied embeddings).
inline constexpr std::array<std::string_view, 3> gemma_types = {"gemma", "gemma2", "gemma3_text"};

/// The mixture-of-experts model_types read (LLaMA-like blocks with routed SwiGLU experts; Qwen2-MoE
/// with gated shared experts).
inline constexpr std::array<std::string_view, 3> moe_types = {"mixtral", "qwen2_moe", "qwen3_moe"};

/// Keys that only mixture-of-experts configs set (Mixtral, Qwen-MoE, DeepSeek, OLMoE, DBRX),
/// refused in the configs of the dense model_types.
inline constexpr std::array<std::string_view, 5> expert_keys = {
    "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "ffn_config"};

/// Value of `key` of `c` where it is present and not null.
inline config_value const* find(hf_config const& c, std::string_view key) {
  auto const it = c.find(key);
  return it == c.end() || it->second.kind == config_value::type::null ? nullptr : &it->second;
}

/// The positive integer at `key` (which must be present), or, where absent or null and
/// `fallback` >= 0, `fallback`.
inline std::int64_t integer(hf_config const& c, std::string_view key, std::int64_t fallback = -1) {
  config_value const* v = find(c, key);
  if (v == nullptr) {
    AGOQ_EXPECTS(fallback >= 0, "hf config: no '" + std::string(key) + "'");
    return fallback;
  }
  AGOQ_EXPECTS(v->kind == config_value::type::number && v->number >= 1 && v->number <= 0x1p53 &&
                   std::floor(v->number) == v->number,
               "hf config: '" + std::string(key) + "' must be a positive integer");
  return static_cast<std::int64_t>(v->number);
}

/// The boolean at `key`, or `fallback` where it is absent or null.
inline bool boolean(hf_config const& c, std::string_view key, bool fallback) {
  config_value const* v = find(c, key);
  if (v == nullptr) return fallback;
  AGOQ_EXPECTS(v->kind == config_value::type::boolean,
               "hf config: '" + std::string(key) + "' must be true or false");
  return v->boolean;
}

/// The string at `key`, or "" where it is absent or null.
inline std::string text(hf_config const& c, std::string_view key) {
  config_value const* v = find(c, key);
  if (v == nullptr) return {};
  AGOQ_EXPECTS(v->kind == config_value::type::string,
               "hf config: '" + std::string(key) + "' must be a string");
  return v->text;
}

}  // namespace hf_detail

/// The top-level keys of the JSON object `json` (a `config.json`'s text). Strict JSON
/// (RFC 8259): anything else throws agoq::invalid_argument naming the byte offset
/// (hf_detail::reader lists what is refused, duplicate keys included).
inline hf_config parse_hf_config(std::string_view json) {
  return hf_detail::reader(json).document();
}

/// The model_shape of a Hugging Face config, as transformers reads it:
/// - `model_type` `llama`, `mistral` or `qwen2` (RMSNorm, grouped-query attention, SwiGLU MLP),
///   and `qwen3` (the same with QK-norm: block_style::qwen3):
///   `num_hidden_layers`, `hidden_size`, `intermediate_size`, `num_attention_heads`,
///   `vocab_size`; `num_key_value_heads` (absent or null: the heads), `head_dim` (absent or null:
///   hidden_size / num_attention_heads), `tie_word_embeddings` (default false), `hidden_act`
///   (where given, `silu`);
/// - `gemma` (LLaMA's block with GeGLU: block_style::llama), `gemma2` (with post-norms:
///   block_style::gemma2) and `gemma3_text` (also QK-norm: block_style::gemma3), read as `llama`
///   but with transformers' Gemma defaults, `head_dim` 256 and `tie_word_embeddings` true, and the
///   activation `hidden_activation` (or `hidden_act`) a tanh GeLU where given
///   (`gelu_pytorch_tanh`, `gelu`); `gemma3` (Gemma 3's multimodal config, its text model nested)
///   is refused: pass its `text_config`;
/// - the mixture-of-experts `mixtral` (LLaMA's block) and `qwen3_moe` (Qwen3's), read as
///   `llama` and `qwen3` but for the MLP: `num_experts_per_tok` (default 2 / 8) of
///   `num_local_experts` (Mixtral, default 8) or `num_experts` (Qwen3-MoE, default 128) experts of
///   inner width `intermediate_size` (Mixtral) or `moe_intermediate_size` (Qwen3-MoE, default
///   768) in every layer: Qwen3-MoE's `decoder_sparse_step` must be 1 (where given) and its
///   `mlp_only_layers` empty (a dense MLP in some layers is not modelled);
/// - `qwen2_moe` (Qwen1.5-MoE, Qwen2-MoE: LLaMA's block, as `qwen2`), as `qwen3_moe` (defaults 60
///   experts, 4 a token, `moe_intermediate_size` 1408) with gated shared experts of inner width
///   `shared_expert_intermediate_size` (default 5632) in every layer;
/// - `gpt2`: `n_layer`, `n_embd`, `n_head`, `vocab_size`; `n_inner` (absent or null: 4 n_embd),
///   `tie_word_embeddings` (default true), `activation_function` (where given, a GeLU: `gelu_new`,
///   `gelu`, `gelu_fast` or `gelu_pytorch_tanh`).
/// head_dim is always set. Other keys are ignored: Qwen2's QKV biases and the bias flags
/// (`attention_bias`, `mlp_bias`: a layer's parameters gain 3-5 widths, under 0.01% of it) are
/// not counted, as in the qwen2.5-32b preset; a sliding window (Mistral's `sliding_window`)
/// leaves the saved tensors as they are (flash attention) but recompute_overhead counts full
/// causal attention.
/// \throws agoq::invalid_argument for any other model_type (other mixture-of-experts models,
/// with dense layers or multi-head latent attention as DeepSeek's, and the blocks with norms or
/// gates of their own, e.g. Gemma's GeGLU and extra norms, are not modelled), a dense model_type's
/// config setting the expert keys (hf_detail::expert_keys), a missing or malformed field, another
/// activation, and a shape model_shape::validate refuses.
inline model_shape model_from_hf_config(hf_config const& c) {
  namespace h = hf_detail;
  std::string const type = h::text(c, "model_type");
  AGOQ_EXPECTS(!type.empty(), "hf config: no 'model_type'");
  bool const moe = std::ranges::find(h::moe_types, type) != h::moe_types.end();
  for (std::string_view const key : h::expert_keys) {
    config_value const* v = h::find(c, key);
    AGOQ_EXPECTS(moe || v == nullptr || (v->kind == config_value::type::number && v->number == 0),
                 "hf config: '" + std::string(key) + "' is set: mixture-of-experts models (" +
                     type + ") are not modelled but mixtral, qwen2_moe and qwen3_moe");
  }
  model_shape m;
  bool const llama =
      moe || std::ranges::find(h::llama_like_types, type) != h::llama_like_types.end();
  if (llama) {
    bool const gemma = std::ranges::find(h::gemma_types, type) != h::gemma_types.end();
    m.style = type == "qwen3" || type == "qwen3_moe" ? block_style::qwen3
              : type == "gemma2"                     ? block_style::gemma2
              : type == "gemma3_text"                ? block_style::gemma3
                                                     : block_style::llama;
    m.layers = h::integer(c, "num_hidden_layers");
    m.hidden = h::integer(c, "hidden_size");
    if (type == "mixtral") {
      m.ffn = 0;
      m.experts = h::integer(c, "num_local_experts", 8);
      m.experts_per_token = h::integer(c, "num_experts_per_tok", 2);
      m.expert_ffn = h::integer(c, "intermediate_size");
    } else if (type == "qwen3_moe" || type == "qwen2_moe") {
      bool const qwen3 = type == "qwen3_moe";
      m.ffn = 0;
      m.experts = h::integer(c, "num_experts", qwen3 ? 128 : 60);
      m.experts_per_token = h::integer(c, "num_experts_per_tok", qwen3 ? 8 : 4);
      m.expert_ffn = h::integer(c, "moe_intermediate_size", qwen3 ? 768 : 1408);
      if (!qwen3) {
        m.shared_expert_ffn = h::integer(c, "shared_expert_intermediate_size", 5632);
        m.shared_expert_gate = true;
      }
      AGOQ_EXPECTS(h::integer(c, "decoder_sparse_step", 1) == 1,
                   "hf config: decoder_sparse_step is not 1: a " + type +
                       " model with dense MLPs in some layers is not modelled");
      config_value const* dense = h::find(c, "mlp_only_layers");
      AGOQ_EXPECTS(
          dense == nullptr || (dense->kind == config_value::type::nested && dense->number == 0),
          "hf config: mlp_only_layers is not an empty list: a " + type +
              " model with dense MLPs in some layers is not modelled");
    } else {
      m.ffn = h::integer(c, "intermediate_size");
    }
    m.heads = h::integer(c, "num_attention_heads");
    m.kv_heads = h::integer(c, "num_key_value_heads", m.heads);
    m.vocab = h::integer(c, "vocab_size");
    m.tied_embeddings = h::boolean(c, "tie_word_embeddings", gemma);
    if (gemma) {
      std::string act = h::text(c, "hidden_activation");
      if (act.empty()) act = h::text(c, "hidden_act");
      AGOQ_EXPECTS(act.empty() || act == "gelu_pytorch_tanh" || act == "gelu",
                   "hf config: hidden_activation '" + act + "' of a " + type +
                       " config: agoq models its MLP as GeGLU (a tanh GeLU)");
      if (h::find(c, "head_dim") == nullptr) m.head_dim = 256;
    } else {
      std::string const act = h::text(c, "hidden_act");
      AGOQ_EXPECTS(act.empty() || act == "silu",
                   "hf config: hidden_act '" + act + "' of a " + type +
                       " config: agoq models its MLP as SwiGLU (silu)");
    }
  } else if (type == "gpt2") {
    m.style = block_style::gpt;
    m.layers = h::integer(c, "n_layer");
    m.hidden = h::integer(c, "n_embd");
    m.heads = h::integer(c, "n_head");
    m.kv_heads = m.heads;
    m.ffn = h::integer(c, "n_inner", 4 * m.hidden);
    m.vocab = h::integer(c, "vocab_size");
    m.tied_embeddings = h::boolean(c, "tie_word_embeddings", true);
    std::string const act = h::text(c, "activation_function");
    AGOQ_EXPECTS(act.empty() || act == "gelu_new" || act == "gelu" || act == "gelu_fast" ||
                     act == "gelu_pytorch_tanh",
                 "hf config: activation_function '" + act +
                     "' of a gpt2 config: agoq models its MLP as GeLU");
  } else if (type == "gemma3") {
    agoq::detail::throw_invalid(__FILE__, __LINE__,
                                "hf config: model_type 'gemma3' nests its text model: pass its "
                                "text_config (model_type gemma3_text)");
  } else {
    agoq::detail::throw_invalid(__FILE__, __LINE__,
                                "hf config: model_type '" + type +
                                    "' is not modelled (agoq reads llama, mistral, qwen2, "
                                    "qwen3, gemma, gemma2, gemma3_text, mixtral, qwen2_moe, "
                                    "qwen3_moe and gpt2 configs)");
  }
  if (llama && h::find(c, "head_dim") != nullptr) {
    m.head_dim = h::integer(c, "head_dim");
  } else if (m.head_dim == 0) {  // hidden / heads (a Gemma config's default, 256, is set above)
    AGOQ_EXPECTS(m.hidden % m.heads == 0,
                 "hf config: the hidden size (" + std::to_string(m.hidden) +
                     ") is not a multiple of the heads (" + std::to_string(m.heads) +
                     ") and no head_dim is given");
    m.head_dim = m.hidden / m.heads;
  }
  m.validate();
  return m;
}

/// model_from_hf_config of the JSON text of a `config.json`.
inline model_shape model_from_hf_config(std::string_view json) {
  return model_from_hf_config(parse_hf_config(json));
}

}  // namespace agoq::activation
