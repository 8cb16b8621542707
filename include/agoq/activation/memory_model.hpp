/// \file
/// A per-GPU memory model of one training step: weights (bf16 + fp32 master), gradients (fp32,
/// bf16 or 8-bit), optimizer states (fp32 or 8-bit Adam), and the saved activations (bf16 or as
/// planned) under tensor, pipeline (1F1B, interleaved), data (ZeRO 0-3) and sequence
/// parallelism; and Megatron's published activation formula to check it against. Host only.
/// What is and is not counted is listed in docs/activations.md.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/layout.hpp"
#include "layer_kind.hpp"
#include "policy.hpp"

namespace agoq::activation {

/// How the pipeline, tensor and data parallel groups are laid out.
struct parallel_config {
  std::int64_t tp = 1;              ///< tensor-parallel degree
  std::int64_t pp = 1;              ///< pipeline stages (devices along the pipeline)
  std::int64_t dp = 1;              ///< data-parallel degree
  std::int64_t virtual_stages = 1;  ///< model chunks per pipeline device (v; > 1: interleaved)
  int zero_stage = 0;               ///< ZeRO: 1 shards optimizer states and master weights over
                                    ///< dp, 2 also gradients, 3 also the bf16 weights
  bool sp = false;                  ///< sequence parallelism

  /// Layers per model chunk, layers / (pp * virtual_stages).
  std::int64_t layers_per_chunk(model_shape const& m) const noexcept {
    return m.layers / (pp * virtual_stages);
  }

  /// Throws agoq::invalid_argument naming the first field out of range or the layer count that
  /// does not split evenly.
  void validate(model_shape const& m) const {
    m.validate();
    AGOQ_EXPECTS(tp >= 1 && pp >= 1 && dp >= 1 && virtual_stages >= 1,
                 "parallel_config: tp, pp, dp and virtual_stages must be positive");
    AGOQ_EXPECTS(zero_stage >= 0 && zero_stage <= 3,
                 "parallel_config: zero_stage is 0, 1, 2 or 3, got " + std::to_string(zero_stage));
    AGOQ_EXPECTS(virtual_stages == 1 || pp >= 2,
                 "parallel_config: an interleaved schedule needs at least 2 pipeline stages");
    AGOQ_EXPECTS(m.layers % (pp * virtual_stages) == 0,
                 "parallel_config: " + std::to_string(m.layers) + " layers do not split into " +
                     std::to_string(pp) + " stages x " + std::to_string(virtual_stages) +
                     " chunks");
  }
};

/// The size of one step.
struct step_config {
  std::int64_t micro_batch = 1;    ///< sequences per micro-batch (b)
  std::int64_t seq = 4096;         ///< tokens per sequence (s)
  std::int64_t micro_batches = 0;  ///< micro-batches per step per pipeline (m); 0: enough to
                                   ///< fill the pipeline (no cap on the in-flight counts)
};

/// How gradients are kept between the backward pass and the optimizer.
enum class gradient_format : std::uint8_t {
  fp32,       ///< 4 bytes per parameter (Megatron's main-grad buffer)
  bf16,       ///< 2 bytes per parameter
  int8_g128,  ///< agoq's 8-bit buffer: 1 byte + a 4-byte scale per 128 (1.03125 B/param)
};

/// How Adam's two moments are kept.
enum class optimizer_format : std::uint8_t {
  fp32,       ///< 8 bytes per parameter
  int8_g128,  ///< two int8_g128 states, 2.0625 bytes per parameter
};

/// Weights are bf16 with an fp32 master copy; gradients and optimizer states as chosen.
struct state_formats {
  gradient_format gradients = gradient_format::fp32;
  optimizer_format optimizer = optimizer_format::fp32;
};

/// The name of a gradient format.
inline std::string name_of(gradient_format g) {
  return g == gradient_format::fp32 ? "fp32" : g == gradient_format::bf16 ? "bf16" : "int8_g128";
}
/// The name of an optimizer format.
inline std::string name_of(optimizer_format o) {
  return o == optimizer_format::fp32 ? "fp32" : "int8_g128";
}

/// Parameters of one transformer layer held by one tensor-parallel rank (norm weights are
/// replicated): LLaMA-style Q, K, V, O without biases, gate, up, down and two RMSNorm weights;
/// GPT-style QKV and O with biases, FC1 and FC2 with biases and two LayerNorms.
inline std::int64_t layer_parameters(model_shape const& m, std::int64_t tp) {
  m.validate();
  std::int64_t const h = m.hidden;
  std::int64_t const qd = m.heads / tp * m.head_size();
  std::int64_t const kvd = kv_heads_per_rank(m, tp) * m.head_size();
  std::int64_t const f = m.ffn / tp;
  if (m.style == block_style::llama) return h * qd + 2 * h * kvd + qd * h + 3 * h * f + 2 * h;
  return (h * 3 * qd + 3 * qd) + (qd * h + h) + (h * f + f) + (f * h + h) + 4 * h;
}

/// Rows of the vocabulary one tensor-parallel rank holds (the vocabulary is split, padded).
inline std::int64_t vocab_per_rank(model_shape const& m, std::int64_t tp) {
  return detail::ceil_div(m.vocab, tp);
}

/// The pipeline device (rank along the pipeline) holding global layer `layer`, and its local
/// chunk index: layers are cut into pp * v chunks of equal size, chunk c on device c % pp.
struct layer_place {
  std::int64_t stage = 0;  ///< pipeline device
  std::int64_t chunk = 0;  ///< local chunk index on that device (0 .. v - 1)
};

/// Where global layer `layer` lives.
inline layer_place place_of(std::int64_t layer, model_shape const& m, parallel_config const& p) {
  std::int64_t const global_chunk = layer / p.layers_per_chunk(m);
  return {global_chunk % p.pp, global_chunk / p.pp};
}

/// The largest number of micro-batches whose activations each local model chunk of pipeline
/// device `stage` holds at once during one step (saved by a forward, not yet freed by its
/// backward).
/// - 1F1B (v = 1; Narayanan et al. 2021, PipeDream-Flush): stage s of p runs p - s - 1 warm-up
///   forwards, then alternates one forward and one backward, so it holds min(p - s, m).
/// - Interleaved (v > 1; Megatron-LM's schedule): device r runs 2 (p - r - 1) + (v - 1) p warm-up
///   forward units (all m v units when m == p), then one forward and one backward per step; units
///   go through the chunks in groups of p micro-batches (forward: chunk 0 first; backward: chunk
///   v - 1 first). The schedule is replayed and each chunk's maximum is returned. Their sum is an
///   upper bound on the peak (different chunks peak at different times); the peak count itself
///   is peak_in_flight_units().
/// `micro_batches` = 0 means enough micro-batches that the cap never binds. Throws
/// agoq::invalid_argument for stage outside [0, pp), or an interleaved m that is not a multiple
/// of pp.
inline std::vector<std::int64_t> in_flight_micro_batches(std::int64_t pp, std::int64_t v,
                                                         std::int64_t stage,
                                                         std::int64_t micro_batches) {
  AGOQ_EXPECTS(pp >= 1 && v >= 1, "in_flight: pp and virtual_stages must be positive");
  AGOQ_EXPECTS(stage >= 0 && stage < pp, "in_flight: stage " + std::to_string(stage) +
                                             " outside [0, " + std::to_string(pp) + ")");
  AGOQ_EXPECTS(micro_batches >= 0, "in_flight: micro_batches must be >= 0");
  if (v == 1) {
    std::int64_t const n = pp - stage;
    return {micro_batches > 0 ? std::min(n, micro_batches) : n};
  }
  AGOQ_EXPECTS(micro_batches == 0 || micro_batches % pp == 0,
               "in_flight: the interleaved schedule needs micro_batches (" +
                   std::to_string(micro_batches) + ") to be a multiple of pp (" +
                   std::to_string(pp) + ")");
  // Without a cap, replay enough micro-batches for the steady state to show every chunk's peak.
  std::int64_t const m = micro_batches > 0 ? micro_batches : pp * (2 * v + 2);
  std::int64_t const total = m * v;
  std::int64_t const warmup =
      m == pp ? total : std::min(2 * (pp - stage - 1) + (v - 1) * pp, total);
  std::vector<std::int64_t> now(static_cast<std::size_t>(v), 0);
  std::vector<std::int64_t> peak(static_cast<std::size_t>(v), 0);
  auto forward = [&](std::int64_t k) {
    auto const c = static_cast<std::size_t>((k % (pp * v)) / pp);
    peak[c] = std::max(peak[c], ++now[c]);
  };
  auto backward = [&](std::int64_t j) {
    --now[static_cast<std::size_t>(v - 1 - (j % (pp * v)) / pp)];
  };
  for (std::int64_t k = 0; k < warmup; ++k) forward(k);
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  return peak;
}

/// The most model-chunk micro-batches device `stage` holds at one moment: min(p - s, m) for
/// 1F1B; for the interleaved schedule min(2 (p - s - 1) + (v - 1) p + 1, m v) (m v when m == p),
/// which for the first stage is p v + p - 1 chunk units = L (1 + (p - 1) / (p v)) layers' worth,
/// Korthikanti et al. 2022, §4.2.3. Throws as in_flight_micro_batches.
inline std::int64_t peak_in_flight_units(std::int64_t pp, std::int64_t v, std::int64_t stage,
                                         std::int64_t micro_batches) {
  auto const per_chunk = in_flight_micro_batches(pp, v, stage, micro_batches);
  if (v == 1) return per_chunk[0];
  std::int64_t const m = micro_batches > 0 ? micro_batches : pp * (2 * v + 2);
  if (m == pp) return m * v;
  return std::min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v);
}

/// Bytes of `n` parameters' gradients in format `g` (the 8-bit buffer as one flat
/// int8_g128_sym_rne_f32 tensor, make_layout).
inline std::int64_t gradient_bytes(gradient_format g, std::int64_t n) {
  switch (g) {
    case gradient_format::fp32:
      return 4 * n;
    case gradient_format::bf16:
      return 2 * n;
    default:
      return make_layout(int8_g128, 1, n).total_bytes;
  }
}

/// Bytes of Adam's two moments for `n` parameters in format `o`.
inline std::int64_t optimizer_bytes(optimizer_format o, std::int64_t n) {
  return o == optimizer_format::fp32 ? 8 * n : 2 * make_layout(int8_g128, 1, n).total_bytes;
}

/// The memory of one pipeline device (one GPU; every tensor- and data-parallel peer of it holds
/// the same) during one step, in bytes.
struct stage_memory {
  std::int64_t stage = 0;
  std::int64_t parameters = 0;          ///< parameters of its chunks on one TP rank (unsharded)
  std::int64_t weights = 0;             ///< bf16 weights (sharded over dp under ZeRO-3)
  std::int64_t master_weights = 0;      ///< fp32 master copy (sharded under ZeRO >= 1)
  std::int64_t gradients = 0;           ///< gradient buffer (sharded under ZeRO >= 2)
  std::int64_t optimizer = 0;           ///< Adam moments (sharded under ZeRO >= 1)
  std::int64_t activations = 0;         ///< saved tensors of the transformer blocks, all in flight
  std::int64_t head_activations = 0;    ///< final norm, LM head input and fp32 logits (last stage)
  std::vector<std::int64_t> in_flight;  ///< micro-batches in flight per local chunk

  /// States: weights + master + gradients + optimizer.
  std::int64_t states() const noexcept { return weights + master_weights + gradients + optimizer; }
  /// Everything counted.
  std::int64_t total() const noexcept { return states() + activations + head_activations; }
};

/// The shard shape of the activations under `p` for a step `st`.
inline shard_shape shard_of(parallel_config const& p, step_config const& st) {
  return {st.micro_batch, st.seq, p.tp, p.sp};
}

/// Bytes of one micro-batch's saved activations of one layer with the storage `choose(kind)`
/// gives each kind (aliases cost nothing: they read their kind's buffer).
template <class Choose>
std::int64_t layer_activation_bytes(model_shape const& m, shard_shape const& sh, Choose&& choose) {
  std::int64_t bytes = 0;
  for (tensor_kind const k : block_tensors(m.style)) {
    if (is_alias(k)) continue;
    bytes += storage(choose(k)).bytes(shape_of(k, m, sh));
  }
  return bytes;
}

/// Bytes the last pipeline device saves for the output head per micro-batch, kept precise: the
/// final norm's input [T, h] bf16, the LM head's input [T, h] bf16 (T = tokens / tp under SP,
/// else tokens) and the fp32 softmax of the vocabulary-parallel cross entropy
/// [tokens, vocab / tp] (Megatron's 4 s b h / t (1 + v / h) with SP).
inline std::int64_t head_activation_bytes(model_shape const& m, shard_shape const& sh) {
  std::int64_t const rows = sh.sp ? sh.tokens() / sh.tp : sh.tokens();
  return 2 * 2 * rows * m.hidden + 4 * sh.tokens() * vocab_per_rank(m, sh.tp);
}

/// The memory of every pipeline device for one step with saved tensor `k` of global layer `l`
/// stored as `choose(l, k)` (a callable returning agoq::activation::storage). Throws
/// agoq::invalid_argument for an invalid configuration.
template <class Choose>
requires std::invocable<Choose&, std::int64_t, tensor_kind> std::vector<stage_memory>
estimate_memory(model_shape const& m, parallel_config const& p, step_config const& st,
                state_formats const& f, Choose&& choose) {
  p.validate(m);
  AGOQ_EXPECTS(st.micro_batch >= 1 && st.seq >= 1 && st.micro_batches >= 0,
               "step_config: micro_batch and seq must be positive, micro_batches >= 0");
  shard_shape const sh = shard_of(p, st);
  std::int64_t const lc = p.layers_per_chunk(m);
  std::int64_t const per_layer = layer_parameters(m, p.tp);
  std::int64_t const embedding = vocab_per_rank(m, p.tp) * m.hidden;
  std::int64_t const final_norm = m.style == block_style::llama ? m.hidden : 2 * m.hidden;
  std::vector<stage_memory> out;
  for (std::int64_t r = 0; r < p.pp; ++r) {
    stage_memory s;
    s.stage = r;
    s.in_flight = in_flight_micro_batches(p.pp, p.virtual_stages, r, st.micro_batches);
    s.parameters = per_layer * lc * p.virtual_stages;
    bool const first = r == 0;
    bool const last = r == p.pp - 1;
    if (first) s.parameters += embedding;
    // An untied head, or a tied one on a different stage (Megatron keeps a copy there).
    if (last && (!m.tied_embeddings || p.pp > 1)) s.parameters += embedding;
    if (last) s.parameters += final_norm;
    auto shard = [&](int from_stage) {
      return p.zero_stage >= from_stage ? detail::ceil_div(s.parameters, p.dp) : s.parameters;
    };
    s.weights = 2 * shard(3);
    s.master_weights = 4 * shard(1);
    s.gradients = gradient_bytes(f.gradients, shard(2));
    s.optimizer = optimizer_bytes(f.optimizer, shard(1));
    for (std::int64_t c = 0; c < p.virtual_stages; ++c) {
      std::int64_t const first_layer = (c * p.pp + r) * lc;
      std::int64_t chunk_bytes = 0;
      for (std::int64_t l = first_layer; l < first_layer + lc; ++l)
        chunk_bytes += layer_activation_bytes(m, sh, [&](tensor_kind k) { return choose(l, k); });
      s.activations += chunk_bytes * s.in_flight[static_cast<std::size_t>(c)];
    }
    if (last) s.head_activations = head_activation_bytes(m, sh) * s.in_flight.back();
    out.push_back(std::move(s));
  }
  return out;
}

/// estimate_memory with every tensor stored as the policy table's default.
inline std::vector<stage_memory> estimate_memory(model_shape const& m, parallel_config const& p,
                                                 step_config const& st, state_formats const& f,
                                                 policy_table const& policy) {
  return estimate_memory(m, p, st, f,
                         [&](std::int64_t, tensor_kind k) { return policy.default_storage(k); });
}

/// The largest total over the pipeline devices.
inline std::int64_t peak_total(std::vector<stage_memory> const& stages) noexcept {
  std::int64_t peak = 0;
  for (auto const& s : stages) peak = std::max(peak, s.total());
  return peak;
}

/// Megatron's activation memory of one transformer layer and one micro-batch in bytes
/// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
/// Table 2), for a GPT block with ffn = 4h, 16-bit activations, 1-byte dropout masks, and the
/// attention scores materialized (no flash attention), without recomputation:
/// - no tensor parallelism: s b h (34 + 5 a s / h);
/// - tensor parallelism t: s b h (10 + 24 / t + 5 a s / (h t));
/// - tensor and sequence parallelism: s b h (34 / t + 5 a s / (h t)).
/// Exact integer arithmetic; t must divide 24 s b h + 5 a s^2 b (and 34 s b h under SP).
inline std::int64_t megatron_layer_activation_bytes(std::int64_t s, std::int64_t b, std::int64_t h,
                                                    std::int64_t a, std::int64_t t, bool sp) {
  std::int64_t const sbh = s * b * h;
  std::int64_t const scores = 5 * a * s * s * b;
  if (sp) return (34 * sbh + scores) / t;
  return 10 * sbh + (24 * sbh + scores) / t;
}

}  // namespace agoq::activation
