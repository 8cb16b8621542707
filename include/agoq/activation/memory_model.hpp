/// \file
/// A per-GPU memory model of one training step: weights (bf16 + fp32 master), gradients (fp32,
/// bf16 or 8-bit), optimizer states (fp32 or 8-bit Adam), and the saved activations (bf16 or as
/// planned) at the peak moment of the pipeline schedule (1F1B, or the interleaved schedule under
/// Megatron-Core's or the legacy rules, followed unit by unit) under tensor, pipeline, data (ZeRO
/// 0-3) and sequence parallelism, and the transient working memory at that moment (the largest
/// phase of a layer's or the output head's backward, gradient staging and reduction buffers, a
/// fixed allowance); and Megatron's published activation formula to check it against. Host only.
/// What is and is not counted is listed in docs/activations.md.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../gradient/payload.hpp"
#include "../layout/layout.hpp"
#include "layer_kind.hpp"
#include "policy.hpp"

namespace agoq::activation {

/// Which rules Megatron's interleaved pipeline schedule (v > 1) follows; 1F1B (v = 1) is the same
/// under both. docs/activations.md §4.1 gives the sources.
enum class interleaved_rules : std::uint8_t {
  /// Current Megatron-Core (megatron/core/pipeline_parallel/schedules.py: get_pp_rank_microbatches,
  /// get_schedule_table, forward_backward_pipelining_with_interleaving): the micro-batches go
  /// through the chunks in groups of g (microbatch_group_size_per_vp_stage, default p), the last
  /// group holding what is left; device s runs w = 2 (p - s - 1) + (v - 1) g warm-up forwards, and
  /// every forward first only where w >= m v. Needs p <= g <= m, and m mod g either 0 or >= p.
  megatron_core,
  /// Megatron-LM releases before the group size (and apex's schedules): groups of p, m a multiple
  /// of p, w = 2 (p - s - 1) + (v - 1) p, and every forward first on all devices when m == p.
  megatron_legacy,
};

/// The name of a rule set: "megatron-core" or "megatron-legacy".
inline std::string name_of(interleaved_rules r) {
  return r == interleaved_rules::megatron_core ? "megatron-core" : "megatron-legacy";
}

/// How the pipeline, tensor and data parallel groups are laid out.
struct parallel_config {
  std::int64_t tp = 1;              ///< tensor-parallel degree
  std::int64_t pp = 1;              ///< pipeline stages (devices along the pipeline)
  std::int64_t dp = 1;              ///< data-parallel degree
  std::int64_t virtual_stages = 1;  ///< model chunks per pipeline device (v; > 1: interleaved)
  int zero_stage = 0;               ///< ZeRO: 1 shards optimizer states and master weights over
                                    ///< dp x cp, 2 also gradients, 3 also the bf16 weights
  bool sp = false;                  ///< sequence parallelism
  std::int64_t vp_group = 0;        ///< interleaved schedule: micro-batches per group through each
                                    ///< chunk (Megatron-Core's microbatch_group_size_per_vp_stage,
                                    ///< g); 0: pp. Unused when virtual_stages == 1.
  interleaved_rules vp_rules = interleaved_rules::megatron_core;  ///< the interleaved schedule's
                                                                  ///< rules (unused for v = 1)
  /// Context parallelism (Megatron-Core's context_parallel_size): each sequence split over cp
  /// ranks, 2 cp chunks of seq / (2 cp) tokens, each rank holding two (the load-balanced causal
  /// split); the ranks hold the same weights, and gradients are reduced, and ZeRO shards, over
  /// dp x cp (gradient_ranks()).
  std::int64_t cp = 1;
  /// Uneven pipeline stages (Megatron-Core's num_layers_in_first_pipeline_stage and
  /// num_layers_in_last_pipeline_stage, `--decoder-first-pipeline-num-layers` and
  /// `--decoder-last-pipeline-num-layers`): the transformer layers of the first (last) pipeline
  /// device; 0 leaves that device to the even split. The devices between share the other layers
  /// evenly, and each device's layers split evenly into its virtual_stages chunks. A lighter
  /// first or last device makes room for the embedding and the output head: Llama 3 405B ran its
  /// 126 layers on 16 stages as 7, 14 x 8, 7. Needs pp >= 2.
  std::int64_t first_stage_layers = 0;
  std::int64_t last_stage_layers = 0;  ///< see first_stage_layers
  /// Megatron-Core's account_for_embedding_in_pipeline_split and
  /// account_for_loss_in_pipeline_split (`--account-for-embedding-in-pipeline-split`,
  /// `--account-for-loss-in-pipeline-split`): the embedding (the loss) counts as one layer in the
  /// even split (split_units), so that the first device's first model chunk (the last device's
  /// last chunk) holds one transformer layer fewer than every other chunk, which may leave it
  /// none. Without interleaving the same as first_stage_layers (last_stage_layers) one below the
  /// even share; under it only that one chunk is lighter. Exclude first_stage_layers and
  /// last_stage_layers.
  bool account_for_embedding = false;
  bool account_for_loss = false;  ///< see account_for_embedding
  /// Megatron-Core's pipeline_model_parallel_layout (`--pipeline-model-parallel-layout`): the
  /// transformer layers of every model chunk, given, in round order: chunk c of device s at
  /// c x pp + s, pp x virtual_stages entries (parse_pipeline_layout reads Megatron-Core's
  /// string). A chunk may hold none. Empty: the layers are split as the fields above say, which
  /// it excludes.
  std::vector<std::int64_t> pipeline_layout{};
  /// Expert parallelism of a mixture-of-experts model (Megatron-Core's
  /// expert_model_parallel_size): the ranks its experts are spread over, experts / ep on each.
  /// 1 for a dense model.
  std::int64_t ep = 1;
  /// Expert tensor parallelism (Megatron-Core's expert_tensor_parallel_size): the ranks each
  /// expert's inner width is split over; 0: tp, Megatron's default. 0 for a dense model.
  std::int64_t etp = 0;

  /// The ranks that hold the same weights and reduce their gradients together, which ZeRO shards
  /// over: dp x cp (Megatron-Core's data-parallel group with context parallelism).
  std::int64_t gradient_ranks() const noexcept { return dp * cp; }

  /// etp, or tp when it is 0.
  std::int64_t expert_tp() const noexcept { return etp > 0 ? etp : tp; }

  /// The ranks that hold the same experts and reduce their gradients together, which ZeRO shards
  /// the experts' states over: tp cp dp / (ep etp) (Megatron-Core's expert data-parallel group:
  /// the ranks of a pipeline stage, tp cp dp, laid out as ep x etp x this). Of a valid layout
  /// (validate); a dense model's is dp cp.
  std::int64_t expert_gradient_ranks() const noexcept { return tp * cp * dp / (ep * expert_tp()); }

  /// True when first_stage_layers or last_stage_layers sets a device's layers.
  bool uneven() const noexcept { return first_stage_layers > 0 || last_stage_layers > 0; }

  /// The devices that share the layers evenly: all but the first and the last where their layers
  /// are set.
  std::int64_t even_stages() const noexcept {
    return pp - (first_stage_layers > 0) - (last_stage_layers > 0);
  }

  /// What the even split divides into pp x virtual_stages equal model chunks: the layers, plus
  /// one for the embedding and one for the loss where account_for_embedding and account_for_loss
  /// count them.
  std::int64_t split_units(model_shape const& m) const noexcept {
    return m.layers + account_for_embedding + account_for_loss;
  }

  /// The transformer layers of pipeline device `stage` in [0, pp): its chunks' in pipeline_layout
  /// where given; else first_stage_layers on the first, last_stage_layers on the last where set,
  /// an even share of the rest on the others (layers / pp without uneven stages, less the
  /// embedding's and the loss's units where counted). `m` and this layout valid (validate).
  std::int64_t stage_layers(model_shape const& m, std::int64_t stage) const noexcept {
    if (!pipeline_layout.empty()) {
      std::int64_t n = 0;
      for (std::int64_t c = 0; c < virtual_stages; ++c) n += chunk_layers(m, stage, c);
      return n;
    }
    if (!uneven())
      return split_units(m) / pp - (account_for_embedding && stage == 0) -
             (account_for_loss && stage == pp - 1);
    if (stage == 0 && first_stage_layers > 0) return first_stage_layers;
    if (stage == pp - 1 && last_stage_layers > 0) return last_stage_layers;
    return (m.layers - first_stage_layers - last_stage_layers) / even_stages();
  }

  /// The transformer layers of local model chunk `chunk` in [0, virtual_stages) of pipeline
  /// device `stage`: pipeline_layout's where given, else stage_layers / virtual_stages, but one
  /// fewer in the first device's first chunk (the last device's last) under account_for_embedding
  /// (account_for_loss).
  std::int64_t chunk_layers(model_shape const& m, std::int64_t stage,
                            std::int64_t chunk) const noexcept {
    if (!pipeline_layout.empty())
      return pipeline_layout[static_cast<std::size_t>(chunk * pp + stage)];
    if (uneven()) return stage_layers(m, stage) / virtual_stages;
    return split_units(m) / (pp * virtual_stages) -
           (account_for_embedding && stage == 0 && chunk == 0) -
           (account_for_loss && stage == pp - 1 && chunk == virtual_stages - 1);
  }

  /// The most layers of any model chunk (chunk_layers of every device and chunk).
  std::int64_t max_chunk_layers(model_shape const& m) const noexcept {
    std::int64_t most = 0;
    for (std::int64_t s = 0; s < pp; ++s)
      for (std::int64_t c = 0; c < virtual_stages; ++c)
        most = std::max(most, chunk_layers(m, s, c));
    return most;
  }

  /// Sets pipeline_layout from Megatron-Core's layout string (parse_pipeline_layout, which throws
  /// as it says) and, where virtual_stages is 1, virtual_stages to its chunks / pp where they
  /// divide, as Megatron-Core derives it (another value must agree with it: validate). Set pp
  /// first.
  void use_pipeline_layout(std::string_view text);

  /// Throws agoq::invalid_argument naming the first field out of range, the group size the
  /// interleaved schedule refuses, or the layer count that does not split as asked. (Whether the
  /// step's micro-batches suit the schedule is checked where they meet: estimate_memory,
  /// in_flight_peaks.)
  void validate(model_shape const& m) const;
};

namespace detail {

/// Checks the interleaved schedule's group size `group` (0: pp) for pp devices and v chunks
/// under `rules`; nothing to check for v = 1.
inline void check_group(std::int64_t pp, std::int64_t v, std::int64_t group,
                        interleaved_rules rules) {
  AGOQ_EXPECTS(
      rules == interleaved_rules::megatron_core || rules == interleaved_rules::megatron_legacy,
      "pipeline schedule: unknown interleaved_rules value");
  AGOQ_EXPECTS(group >= 0,
               "pipeline schedule: the micro-batch group size (vp_group) must be >= 0 "
               "(0: pp), got " +
                   std::to_string(group));
  if (v == 1 || group == 0) return;
  if (rules == interleaved_rules::megatron_legacy)
    AGOQ_EXPECTS(group == pp,
                 "pipeline schedule: the legacy interleaved schedule runs groups of pp (" +
                     std::to_string(pp) + ") micro-batches, got vp_group " + std::to_string(group) +
                     "; use megatron-core rules for others");
  AGOQ_EXPECTS(group >= pp,
               "pipeline schedule: Megatron-Core's interleaved schedule needs a "
               "micro-batch group (vp_group) of at least pp (" +
                   std::to_string(pp) + "), got " + std::to_string(group));
}

}  // namespace detail

inline void parallel_config::validate(model_shape const& m) const {
  m.validate();
  AGOQ_EXPECTS(tp >= 1 && pp >= 1 && dp >= 1 && cp >= 1 && virtual_stages >= 1,
               "parallel_config: tp, pp, dp, cp and virtual_stages must be positive");
  AGOQ_EXPECTS(dp <= max_size_count / cp,
               "parallel_config: dp x cp = " +
                   detail::approx(static_cast<long double>(dp) * static_cast<long double>(cp)) +
                   " ranks are too many");
  AGOQ_EXPECTS(zero_stage >= 0 && zero_stage <= 3,
               "parallel_config: zero_stage is 0, 1, 2 or 3, got " + std::to_string(zero_stage));
  AGOQ_EXPECTS(virtual_stages == 1 || pp >= 2,
               "parallel_config: an interleaved schedule needs at least 2 pipeline stages");
  if (!m.moe()) {
    AGOQ_EXPECTS(ep == 1 && etp == 0,
                 "parallel_config: ep and etp are a mixture-of-experts model's (dense: 1 and 0)");
  } else {
    AGOQ_EXPECTS(ep >= 1 && etp >= 0, "parallel_config: ep must be positive and etp >= 0");
    AGOQ_EXPECTS(m.experts % ep == 0, "parallel_config: ep (" + std::to_string(ep) +
                                          ") must divide the experts (" +
                                          std::to_string(m.experts) + ")");
    AGOQ_EXPECTS(tp <= max_size_count / (dp * cp),
                 "parallel_config: tp x dp x cp ranks are too many");
    AGOQ_EXPECTS(
        expert_tp() <= tp * cp * dp / ep && (tp * cp * dp) % (ep * expert_tp()) == 0,
        "parallel_config: ep x etp (" + std::to_string(ep) + " x " + std::to_string(expert_tp()) +
            ") must divide the ranks of a pipeline stage, tp x cp x dp (" + std::to_string(tp) +
            " x " + std::to_string(cp) + " x " + std::to_string(dp) + ")");
  }
  detail::check_group(pp, virtual_stages, vp_group, vp_rules);
  if (!pipeline_layout.empty()) {
    AGOQ_EXPECTS(static_cast<std::int64_t>(pipeline_layout.size()) / pp == virtual_stages &&
                     static_cast<std::int64_t>(pipeline_layout.size()) % pp == 0,
                 "parallel_config: the pipeline layout's " +
                     std::to_string(pipeline_layout.size()) + " model chunks are not pp (" +
                     std::to_string(pp) + ") x virtual_stages (" + std::to_string(virtual_stages) +
                     ")");
    AGOQ_EXPECTS(first_stage_layers == 0 && last_stage_layers == 0 && !account_for_embedding &&
                     !account_for_loss,
                 "parallel_config: a pipeline layout gives every model chunk its layers; it "
                 "excludes first_stage_layers, last_stage_layers, account_for_embedding and "
                 "account_for_loss");
    std::int64_t total = 0;
    for (std::int64_t const n : pipeline_layout) {
      AGOQ_EXPECTS(n >= 0 && n <= m.layers, "parallel_config: a pipeline layout's chunk holds " +
                                                std::to_string(n) + " layers, not 0 to " +
                                                std::to_string(m.layers));
      total += n;
    }
    AGOQ_EXPECTS(total == m.layers,
                 "parallel_config: the pipeline layout places " + std::to_string(total) +
                     " transformer layers, not the model's " + std::to_string(m.layers));
    return;
  }
  AGOQ_EXPECTS(first_stage_layers >= 0 && last_stage_layers >= 0,
               "parallel_config: first_stage_layers and last_stage_layers must be >= 0 (0: an "
               "even split), got " +
                   std::to_string(first_stage_layers) + " and " +
                   std::to_string(last_stage_layers));
  if (!uneven()) {
    std::int64_t const units = split_units(m);
    std::string const counted = std::string(account_for_embedding ? " and the embedding" : "") +
                                (account_for_loss ? " and the loss" : "");
    AGOQ_EXPECTS(pp <= units / virtual_stages && units % (pp * virtual_stages) == 0,
                 "parallel_config: " + std::to_string(m.layers) + " layers" + counted +
                     " do not split into " + std::to_string(pp) + " stages x " +
                     std::to_string(virtual_stages) + " chunks evenly" +
                     (counted.empty() ? " (first_stage_layers and last_stage_layers split them "
                                        "unevenly)"
                                      : ""));
    return;
  }
  AGOQ_EXPECTS(!account_for_embedding && !account_for_loss,
               "parallel_config: account_for_embedding and account_for_loss count the embedding "
               "and the loss in the even split; they exclude first_stage_layers and "
               "last_stage_layers");
  AGOQ_EXPECTS(pp >= 2,
               "parallel_config: uneven pipeline stages (first_stage_layers, "
               "last_stage_layers) need at least 2 pipeline stages");
  AGOQ_EXPECTS(first_stage_layers <= m.layers && last_stage_layers <= m.layers &&
                   first_stage_layers + last_stage_layers <= m.layers,
               "parallel_config: first_stage_layers (" + std::to_string(first_stage_layers) +
                   ") and last_stage_layers (" + std::to_string(last_stage_layers) +
                   ") ask for more than the model's " + std::to_string(m.layers) + " layers");
  std::int64_t const others = even_stages();
  std::int64_t const rest = m.layers - first_stage_layers - last_stage_layers;
  AGOQ_EXPECTS(others == 0 ? rest == 0 : rest >= others && rest % others == 0,
               "parallel_config: the " + std::to_string(rest) + " layers left by " +
                   "first_stage_layers (" + std::to_string(first_stage_layers) +
                   ") and last_stage_layers (" + std::to_string(last_stage_layers) + ") of " +
                   std::to_string(m.layers) + " do not split evenly into the other " +
                   std::to_string(others) + " pipeline stages");
  for (std::int64_t s = 0; s < pp; ++s)
    AGOQ_EXPECTS(stage_layers(m, s) % virtual_stages == 0,
                 "parallel_config: pipeline stage " + std::to_string(s) + "'s " +
                     std::to_string(stage_layers(m, s)) + " layers do not split into " +
                     std::to_string(virtual_stages) + " chunks");
}

/// Megatron-Core's pipeline_model_parallel_layout string (`--pipeline-model-parallel-layout`)
/// read as the transformer layers of each model chunk, in the string's order, which is
/// parallel_config::pipeline_layout's round order (its length / pp is virtual_stages). Chunks are
/// separated by '|', each a run of 't' (a transformer layer), 'E' (the embedding) and 'L' (the
/// loss); as in Megatron-Core, commas are dropped first, then "(...)*n" repeats the text in
/// parentheses n times (not nested), then "X*n" the character X: "Et*3|(tt|)*29,t*3L" is
/// 31 chunks of 3, 2 x 29 and 3 layers. The embedding must open the first chunk and the loss close
/// the last, once each: where the embedding and the output head are modelled (the first and the
/// last device). Throws agoq::invalid_argument saying what it cannot read: another character ('m',
/// Megatron-Core's multi-token prediction layer, is not modelled), a '(' not closed or nested, a
/// ')' without one, a '*' without a character, a group or a count before it, a count past 2^24,
/// an expansion past 2^24 characters, the embedding or the loss missing, repeated or elsewhere.
inline std::vector<std::int64_t> parse_pipeline_layout(std::string_view text) {
  std::string const what = "pipeline layout '" + std::string(text) + "': ";
  constexpr std::size_t most = std::size_t{1} << 24;
  std::string in;
  for (char const ch : text)
    if (ch != ',') in += ch;
  // The count after the '*' at `at`, which it moves past the digits.
  auto const count = [&](std::string_view s, std::size_t& at) {
    std::size_t const from = ++at;
    std::size_t n = 0;
    for (; at < s.size() && s[at] >= '0' && s[at] <= '9'; ++at) {
      n = n * 10 + static_cast<std::size_t>(s[at] - '0');
      AGOQ_EXPECTS(n <= most, what + "a count past 2^24");
    }
    AGOQ_EXPECTS(at > from, what + "a '*' without a count");
    return n;
  };
  auto const repeat = [&](std::string& out, std::string_view piece, std::size_t n) {
    AGOQ_EXPECTS(piece.empty() || n <= (most - out.size()) / piece.size(),
                 what + "it expands past 2^24 characters");
    for (std::size_t i = 0; i < n; ++i) out += piece;
  };
  // The groups in parentheses.
  std::string groups;
  for (std::size_t i = 0; i < in.size();) {
    AGOQ_EXPECTS(in[i] != ')', what + "a ')' without its '('");
    if (in[i] != '(') {
      groups += in[i++];
      continue;
    }
    std::size_t const close = in.find(')', i);
    AGOQ_EXPECTS(close != std::string::npos, what + "a '(' is not closed");
    std::string_view const body = std::string_view(in).substr(i + 1, close - i - 1);
    AGOQ_EXPECTS(body.find('(') == std::string_view::npos, what + "parentheses do not nest");
    std::size_t at = close + 1;
    AGOQ_EXPECTS(at < in.size() && in[at] == '*', what + "a group in parentheses needs '*n'");
    repeat(groups, body, count(in, at));
    i = at;
  }
  // The repeated characters; a '*' right after a count repeats nothing (as in Megatron-Core).
  std::string flat;
  bool counted = false;  // flat's last character came from a count
  for (std::size_t i = 0; i < groups.size();) {
    if (groups[i] != '*') {
      flat += groups[i++];
      counted = false;
      continue;
    }
    AGOQ_EXPECTS(!flat.empty() && !counted,
                 what + "a '*' must follow the character or the group it repeats");
    char const ch = flat.back();
    flat.pop_back();
    repeat(flat, std::string_view(&ch, 1), count(groups, i));
    counted = true;
  }
  std::vector<std::int64_t> chunks{0};
  for (std::size_t i = 0; i < flat.size(); ++i) {
    char const ch = flat[i];
    if (ch == '|') {
      chunks.push_back(0);
    } else if (ch == 't') {
      ++chunks.back();
    } else if (ch == 'E') {
      AGOQ_EXPECTS(i == 0, what + "the embedding 'E' must open the first chunk, once");
    } else if (ch == 'L') {
      AGOQ_EXPECTS(i + 1 == flat.size(), what + "the loss 'L' must close the last chunk, once");
    } else {
      AGOQ_EXPECTS(ch != 'm', what + "multi-token prediction layers ('m') are not modelled");
      AGOQ_EXPECTS(false, what + "'" + std::string(1, ch) +
                              "' is not a layer ('E' embedding, 't' transformer layer, 'L' loss; "
                              "'|' between chunks)");
    }
  }
  AGOQ_EXPECTS(!flat.empty() && flat.front() == 'E',
               what + "the embedding 'E' must open the first chunk, once");
  AGOQ_EXPECTS(flat.back() == 'L', what + "the loss 'L' must close the last chunk, once");
  return chunks;
}

inline void parallel_config::use_pipeline_layout(std::string_view text) {
  pipeline_layout = parse_pipeline_layout(text);
  auto const chunks = static_cast<std::int64_t>(pipeline_layout.size());
  if (virtual_stages == 1 && pp >= 1 && chunks % pp == 0) virtual_stages = chunks / pp;
}

/// Megatron's full activation recomputation (`--recompute-granularity full`,
/// TransformerConfig.recompute_method; megatron/core/transformer/transformer_block.py,
/// _checkpointed_forward): the layers whose forward runs again in the backward keep only the
/// input of their checkpoint (the residual stream entering it, [T, h] bf16, T = tokens / tp under
/// SP) until then. Applied to each model chunk (Megatron's TransformerBlock of a pipeline device or
/// virtual stage), with N = step_config::recompute_layers.
enum class recompute_method : std::uint8_t {
  none,     ///< every layer saves its tensors
  uniform,  ///< every layer, in checkpoints of N consecutive layers from the chunk's first (the
            ///< last may hold fewer, as Megatron-Core clamps it at the chunk's end)
  block,    ///< the chunk's first N layers (all if N is larger), a checkpoint each; the others
            ///< save their tensors
};

/// The name of a recomputation method: "none", "uniform" or "block" (Megatron's values).
inline std::string name_of(recompute_method r) {
  return r == recompute_method::none      ? "none"
         : r == recompute_method::uniform ? "uniform"
                                          : "block";
}

/// Megatron-Core's selective recomputation (`--recompute-granularity selective
/// --recompute-modules ...`, TransformerConfig.recompute_modules;
/// megatron/core/transformer/transformer_layer.py): in every layer, the outputs of the chosen
/// modules are not kept for the backward but computed again at its start, from tensors the layer
/// does keep (recompute_sources). Megatron's names: core_attn and layernorm for every block, mlp
/// for a dense one, moe_act, moe and shared_experts for a mixture-of-experts one
/// (detail::check_selective refuses the others). Full recomputation (recompute_method) excludes
/// it, as in Megatron.
struct recompute_modules {
  /// `core_attn`: the core attention runs under a checkpoint of Q, K and V. With a fused (flash)
  /// attention only the logsumexp is then not kept: the output O is the output projection's input
  /// (o_proj_input), kept for it anyway. The backward runs the attention forward again (a second
  /// O, and the logsumexp).
  bool core_attn = false;
  /// `layernorm`: both norms discard their outputs once the next linear layer has run
  /// (CheckpointWithoutOutput): qkv_input and mlp_input (GPT: fc1_input) are not kept; each is
  /// computed again from the norm's input when the backward reaches its sub-block.
  bool layernorm = false;
  /// `mlp`: the MLP runs under a checkpoint of its input: gate_output, up_output and
  /// swiglu_output (GPT: gelu_input, fc2_input) are not kept; the MLP's backward first runs its
  /// forward again from mlp_input (GPT: fc1_input), itself recomputed under `layernorm`.
  bool mlp = false;
  /// `moe_act`: the routed experts' activation (Megatron-Core's grouped experts' SwiGLU) discards
  /// its output once their down projection has run (CheckpointWithoutOutput):
  /// expert_swiglu_output is not kept but computed again from their gate and up outputs.
  bool moe_act = false;
  /// `moe`: the whole mixture-of-experts MLP (router, dispatch, routed and shared experts,
  /// combine) runs under a checkpoint of its input, mlp_input: none of its tensors is kept; its
  /// backward first runs its forward again.
  bool moe = false;
  /// `shared_experts`: the shared experts (and their gate) run under a checkpoint of their input,
  /// mlp_input: their gate, up and SwiGLU outputs (and the gated ones' output and gate score) are
  /// not kept, computed again when the backward reaches them, as `mlp` does a dense MLP's.
  bool shared_experts = false;

  /// True when any module is recomputed.
  constexpr bool any() const noexcept {
    return core_attn || layernorm || mlp || moe_act || moe || shared_experts;
  }
  friend constexpr bool operator==(recompute_modules const&, recompute_modules const&) = default;
};

/// The names of recompute_modules' fields, in their order (Megatron's --recompute-modules values).
inline constexpr std::array<std::string_view, 6> recompute_module_names = {
    "core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts"};

/// The names of `r`'s modules, in recompute_module_names' order (none: empty).
inline std::vector<std::string_view> names_of(recompute_modules const& r) {
  bool const on[] = {r.core_attn, r.layernorm, r.mlp, r.moe_act, r.moe, r.shared_experts};
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < recompute_module_names.size(); ++i)
    if (on[i]) out.push_back(recompute_module_names[i]);
  return out;
}

/// names_of(r) comma-separated ("" for none).
inline std::string name_of(recompute_modules const& r) {
  std::string out;
  for (std::string_view const n : names_of(r)) {
    if (!out.empty()) out += ',';
    out += n;
  }
  return out;
}

/// Adds the module named `name` (one of recompute_module_names) to `r`. Throws
/// agoq::invalid_argument for any other name, naming the ones there are.
inline void add_recompute_module(recompute_modules& r, std::string_view name) {
  bool* const on[] = {&r.core_attn, &r.layernorm, &r.mlp, &r.moe_act, &r.moe, &r.shared_experts};
  for (std::size_t i = 0; i < recompute_module_names.size(); ++i)
    if (name == recompute_module_names[i]) {
      *on[i] = true;
      return;
    }
  agoq::detail::throw_invalid(__FILE__, __LINE__,
                              "recompute_modules: unknown module '" + std::string(name) +
                                  "' (modules: core_attn, layernorm, mlp, moe_act, moe, "
                                  "shared_experts)");
}

/// True when kind `k` is not kept under the modules `r` (computed again in the backward):
/// core_attn the logsumexp; layernorm the norm outputs qkv_input, mlp_input, fc1_input; mlp the
/// MLP's inner tensors gate_output, up_output, swiglu_output, gelu_input, fc2_input (a
/// mixture-of-experts model's shared experts' under shared_experts or moe); moe_act the routed
/// experts' expert_swiglu_output; moe every tensor of the mixture-of-experts MLP (router_probs,
/// the routed experts' four, the shared experts' and their gate's); shared_experts also the gated
/// shared experts' shared_expert_output and shared_gate_score.
inline constexpr bool recomputes(recompute_modules const& r, tensor_kind k) noexcept {
  switch (k) {
    case tensor_kind::softmax_lse:
      return r.core_attn;
    case tensor_kind::qkv_input:
    case tensor_kind::mlp_input:
    case tensor_kind::fc1_input:
      return r.layernorm;
    case tensor_kind::gate_output:
    case tensor_kind::up_output:
    case tensor_kind::swiglu_output:
      return r.mlp || r.shared_experts || r.moe;
    case tensor_kind::gelu_input:
    case tensor_kind::fc2_input:
      return r.mlp;
    case tensor_kind::expert_swiglu_output:
      return r.moe_act || r.moe;
    case tensor_kind::router_probs:
    case tensor_kind::expert_input:
    case tensor_kind::expert_gate_output:
    case tensor_kind::expert_up_output:
      return r.moe;
    case tensor_kind::shared_expert_output:
    case tensor_kind::shared_gate_score:
      return r.shared_experts || r.moe;
    default:
      return false;
  }
}

/// The kept tensors a kind recomputed under `r` is computed from (empty for a kind that is
/// kept), in block order: the logsumexp from Q and K; a norm output from its norm's input
/// (attn_norm_input / mlp_norm_input, GPT ln1_input / ln2_input); the routed experts' SwiGLU
/// output under moe_act alone from their gate and up outputs; the MLP's inner tensors (a
/// mixture-of-experts MLP's: the router's, the routed and shared experts') from the MLP's input,
/// or from the MLP norm's input where `layernorm` recomputes that input too.
/// The error model lets a recomputed tensor inherit its sources' quantization error, `factor`
/// times their relative errors' sum (docs/activations.md §5).
struct recompute_sources {
  std::array<tensor_kind, 2> kinds{};
  std::size_t count = 0;
  /// The recomputed tensor's relative error per unit of its sources' (to first order): 2 for the
  /// SwiGLU output, the product of the gate and up outputs, which each carry the MLP input's
  /// error (measured 1.9-2.5), and for what is computed from it (the gated shared experts'
  /// output); 1 for the others, computed by a norm, a linear layer or the GeLU from one quantized
  /// tensor (measured 0.9-1.2; docs/activations.md §5), or by SwiGLU from its two quantized
  /// inputs, each error entering once (moe_act).
  double factor = 1;

  /// The sources, in block order (iterate the object itself: a range-for over a temporary keeps
  /// it alive).
  constexpr tensor_kind const* begin() const noexcept { return kinds.data(); }
  constexpr tensor_kind const* end() const noexcept { return kinds.data() + count; }
  constexpr bool empty() const noexcept { return count == 0; }
};

/// recompute_sources of kind `k` of a block of style `s` under `r`.
inline constexpr recompute_sources sources_of(tensor_kind k, block_style s,
                                              recompute_modules const& r) noexcept {
  bool const llama = llama_like(s);
  if (!recomputes(r, k)) return {};
  switch (k) {
    case tensor_kind::softmax_lse:
      return {{tensor_kind::query, tensor_kind::key}, 2};
    case tensor_kind::qkv_input:
      return {{llama ? tensor_kind::attn_norm_input : tensor_kind::ln1_input}, 1};
    case tensor_kind::mlp_input:
    case tensor_kind::fc1_input:
      return {{llama ? tensor_kind::mlp_norm_input : tensor_kind::ln2_input}, 1};
    default: {  // the MLP's inner tensors, from the MLP's input
      if (k == tensor_kind::expert_swiglu_output && !r.moe)
        return {{tensor_kind::expert_gate_output, tensor_kind::expert_up_output}, 2};
      tensor_kind const input = llama ? tensor_kind::mlp_input : tensor_kind::fc1_input;
      recompute_sources out =
          recomputes(r, input) ? sources_of(input, s, r) : recompute_sources{{input}, 1};
      if (k == tensor_kind::swiglu_output || k == tensor_kind::expert_swiglu_output ||
          k == tensor_kind::shared_expert_output)
        out.factor = 2;
      return out;
    }
  }
}

/// The default of step_config::reserved_bytes: 1 GiB per GPU (docs/activations.md §4.2).
inline constexpr std::int64_t default_reserved_bytes = std::int64_t{1} << 30;

/// The size of one step, and the two settings of its transient working memory that the shapes do
/// not give (docs/activations.md §4.2).
struct step_config {
  std::int64_t micro_batch = 1;    ///< sequences per micro-batch (b)
  std::int64_t seq = 4096;         ///< tokens per sequence (s)
  std::int64_t micro_batches = 0;  ///< micro-batches per step per pipeline (m); 0: enough to
                                   ///< fill the pipeline (no cap on the in-flight counts)
  /// Parameters per gradient-reduction bucket (Megatron-Core's
  /// DistributedDataParallelConfig.bucket_size); 0: its default, max(40,000,000, 1,000,000 dp cp).
  std::int64_t bucket_parameters = 0;
  /// Fixed allowance per GPU for what the model does not size: the CUDA context, GEMM
  /// workspaces, NCCL's own buffers.
  std::int64_t reserved_bytes = default_reserved_bytes;
  /// Full activation recomputation (recompute_method): the method, and N, Megatron's
  /// recompute_num_layers per model chunk (at least 1 with a method, 0 without).
  recompute_method recompute = recompute_method::none;
  std::int64_t recompute_layers = 0;
  /// Selective recomputation (recompute_modules): the modules of every layer whose outputs are
  /// computed again in the backward instead of kept. Excludes `recompute`.
  recompute_modules selective{};
  /// A mixture-of-experts model's expert capacity factor (shard_shape::capacity_factor; 0:
  /// dropless routing at its mean).
  double expert_capacity_factor = 0;
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

/// The widths one tensor-parallel rank holds of a layer.
struct rank_widths {
  std::int64_t q = 0;  ///< queries (and attention output): heads / tp * head_dim
  std::int64_t k = 0;  ///< keys, and values: kv_heads_per_rank * head_dim
  std::int64_t f = 0;  ///< the MLP inner width: mlp_width() / tp (ffn, or the shared experts')
};

/// The widths of `m` on one rank of `tp`.
inline rank_widths widths_of(model_shape const& m, std::int64_t tp) {
  return {m.heads / tp * m.head_size(), kv_heads_per_rank(m, tp) * m.head_size(),
          m.mlp_width() / tp};
}

/// Parameters of one transformer layer held by one tensor-parallel rank but its experts (norm
/// weights are replicated): LLaMA-style Q, K, V, O without biases, gate, up, down and two RMSNorm
/// weights (Gemma-style four; Qwen3- and Gemma-3-style also the QK-norm's two of head_dim);
/// GPT-style QKV and O with biases, FC1 and FC2 with biases and two LayerNorms. A
/// mixture-of-experts layer has no dense MLP but the router's [hidden, experts] weight, replicated
/// on every rank as Megatron-Core keeps it, and its shared experts' gate, up and down, split over
/// tp as the dense MLP's (and their gate's [hidden, 1] weight, replicated); its routed experts are
/// expert_layer_parameters.
inline std::int64_t layer_parameters(model_shape const& m, std::int64_t tp) {
  m.validate();
  std::int64_t const h = m.hidden;
  auto const [qd, kvd, f] = widths_of(m, tp);
  std::int64_t const qk_norm = has_qk_norm(m.style) ? 2 * m.head_size() : 0;
  std::int64_t const norms = has_post_norms(m.style) ? 4 * h : 2 * h;
  if (llama_like(m.style))
    return h * qd + 2 * h * kvd + qd * h + 3 * h * f + norms + qk_norm + h * m.experts +
           (m.shared_expert_gate ? h : 0);
  return (h * 3 * qd + 3 * qd) + (qd * h + h) + (h * f + f) + (f * h + h) + 4 * h;
}

/// Parameters of the experts of one mixture-of-experts layer held by one rank of `p`:
/// experts / ep experts, each SwiGLU's gate, up and down without biases split over expert_tp(),
/// 3 h f_e / etp (f_e = expert_ffn); 0 for a dense model. Throws agoq::invalid_argument as
/// parallel_config::validate.
inline std::int64_t expert_layer_parameters(model_shape const& m, parallel_config const& p) {
  p.validate(m);
  return m.experts / p.ep * 3 * m.hidden * (m.expert_ffn / p.expert_tp());
}

/// Rows of the vocabulary one tensor-parallel rank holds (the vocabulary is split, padded).
inline std::int64_t vocab_per_rank(model_shape const& m, std::int64_t tp) {
  return agoq::detail::ceil_div(m.vocab, tp);
}

/// The pipeline device (rank along the pipeline) holding a global layer, and its local chunk
/// index. The layers run in v rounds (v = virtual_stages): round c holds local chunk c of every
/// device in device order, chunk_layers(m, s, c) layers of device s (Megatron-Core's
/// get_transformer_layer_offset, uneven stages and the embedding and loss counted in the split
/// included).
struct layer_place {
  std::int64_t stage = 0;  ///< pipeline device
  std::int64_t chunk = 0;  ///< local chunk index on that device (0 .. v - 1)
};

/// Where global layer `layer` in [0, layers) lives, in constant time (linear in the model chunks
/// with a pipeline_layout). `m` and `p` valid
/// (parallel_config::validate).
inline layer_place place_of(std::int64_t layer, model_shape const& m, parallel_config const& p) {
  if (!p.pipeline_layout.empty()) {  // the chunk whose layers reach past it, in round order
    std::int64_t i = 0;
    for (std::int64_t end = p.pipeline_layout[0]; end <= layer;)
      end += p.pipeline_layout[static_cast<std::size_t>(++i)];
    return {i % p.pp, i / p.pp};
  }
  if (!p.uneven()) {
    // The even split of split_units: the embedding's unit, where counted, comes before layer 0.
    std::int64_t const round = p.split_units(m) / p.virtual_stages;
    std::int64_t const unit = layer + p.account_for_embedding;
    return {unit % round / (round / p.pp), unit / round};
  }
  // Each round (layers / v): the first device's chunk where its layers are set, the evenly
  // split devices' chunks (one size), the last device's.
  std::int64_t const even = p.even_stages();
  layer_place at{0, layer / (m.layers / p.virtual_stages)};
  std::int64_t rest = layer % (m.layers / p.virtual_stages);
  if (p.first_stage_layers > 0) {
    if (rest < p.chunk_layers(m, 0, 0)) return at;
    rest -= p.chunk_layers(m, 0, 0);
    at.stage = 1;
  }
  if (even > 0) at.stage += std::min(rest / p.chunk_layers(m, at.stage, 0), even);
  return at;
}

/// The first global layer of local chunk `chunk` of pipeline device `stage`: the chunk holds it and
/// the chunk_layers(m, stage, chunk) - 1 that follow (place_of inverted; for a chunk that holds
/// none, the first layer after it).
inline std::int64_t first_layer_of(model_shape const& m, parallel_config const& p,
                                   std::int64_t stage, std::int64_t chunk) {
  if (!p.pipeline_layout.empty()) {
    auto const at = p.pipeline_layout.begin() + chunk * p.pp + stage;
    return std::accumulate(p.pipeline_layout.begin(), at, std::int64_t{0});
  }
  if (!p.uneven()) {
    std::int64_t const round = p.split_units(m) / p.virtual_stages;
    std::int64_t const unit = chunk * round + stage * (round / p.pp);
    return unit - (unit > 0 && p.account_for_embedding);
  }
  std::int64_t const even = p.even_stages();
  std::int64_t first = chunk * (m.layers / p.virtual_stages);
  if (stage == 0) return first;
  std::int64_t const set = p.first_stage_layers > 0 ? 1 : 0;  // the first device's, before them
  first += set * p.chunk_layers(m, 0, 0);
  if (even > 0) first += std::min(stage - set, even) * p.chunk_layers(m, set, 0);
  return first;
}

/// A pipeline schedule, the same for every device: what the in-flight functions below follow.
struct pipeline_schedule {
  std::int64_t pp = 1;              ///< pipeline devices (p)
  std::int64_t virtual_stages = 1;  ///< model chunks per device (v; > 1: interleaved)
  std::int64_t micro_batches = 0;   ///< micro-batches of the step (m); 0: no cap (the moments of
                                    ///< any m that is a multiple of the group size, >= 3 groups)
  std::int64_t group = 0;           ///< interleaved: micro-batches per group (g); 0: pp
  interleaved_rules rules = interleaved_rules::megatron_core;  ///< interleaved: whose rules
};

/// The schedule of a parallel layout running a step.
inline pipeline_schedule schedule_of(parallel_config const& p, step_config const& st) {
  return {p.pp, p.virtual_stages, st.micro_batches, p.vp_group, p.vp_rules};
}

namespace detail {

/// A checked pipeline_schedule with its defaults filled in and its last micro-batch group found.
struct resolved_schedule {
  std::int64_t pp = 1;
  std::int64_t v = 1;
  std::int64_t m = 0;           ///< micro-batches (no cap resolved to 3 groups)
  std::int64_t g = 1;           ///< group size
  std::int64_t last_start = 0;  ///< first micro-batch of the last group
  std::int64_t last_size = 0;   ///< micro-batches in the last group (1 .. g)
  std::int64_t total = 0;       ///< forward (and backward) units, m v
  interleaved_rules rules = interleaved_rules::megatron_core;
};

/// Checks `sc` and `stage` the way Megatron's schedules would refuse them and fills in the
/// defaults. Throws agoq::invalid_argument naming the problem.
inline resolved_schedule resolve(pipeline_schedule const& sc, std::int64_t stage) {
  std::int64_t const pp = sc.pp;
  std::int64_t const v = sc.virtual_stages;
  AGOQ_EXPECTS(pp >= 1 && v >= 1, "in_flight: pp and virtual_stages must be positive");
  AGOQ_EXPECTS(v == 1 || pp >= 2, "in_flight: an interleaved schedule needs at least 2 devices");
  AGOQ_EXPECTS(stage >= 0 && stage < pp, "in_flight: stage " + std::to_string(stage) +
                                             " outside [0, " + std::to_string(pp) + ")");
  AGOQ_EXPECTS(sc.micro_batches >= 0, "in_flight: micro_batches must be >= 0 (0: no cap), got " +
                                          std::to_string(sc.micro_batches));
  check_group(pp, v, sc.group, sc.rules);
  resolved_schedule r;
  r.pp = pp;
  r.v = v;
  r.rules = sc.rules;
  r.g = v == 1 || sc.group == 0 ? pp : sc.group;
  // Every count below (m v units, the warm-up's 2 (p - 1) + (v - 1) g, 3 g) is at most v g + 2 p
  // or v m. With v g + 2 p <= 2^62, 3 g fits too (g <= 2^61 for v >= 2, g = p for v = 1).
  auto const check_units = [](long double units) {
    AGOQ_EXPECTS(
        units <= static_cast<long double>(max_size_count),
        "in_flight: the schedule is too large to count in 64 bits: " + detail::approx(units) +
            " units (virtual_stages x micro_batches, or x the group size), more than 2^62");
  };
  check_units(static_cast<long double>(v) * r.g + 2 * static_cast<long double>(pp));
  r.m = sc.micro_batches > 0 ? sc.micro_batches : 3 * r.g;
  check_units(static_cast<long double>(v) * r.m);
  std::int64_t const m = r.m;
  if (v > 1 && sc.rules == interleaved_rules::megatron_legacy) {
    AGOQ_EXPECTS(m % pp == 0, "in_flight: the legacy interleaved schedule needs micro_batches (" +
                                  std::to_string(m) + ") to be a multiple of pp (" +
                                  std::to_string(pp) + ")");
  } else if (v > 1) {
    auto const g = [&] {
      return sc.group == 0 ? "pp (" + std::to_string(pp) + ", the default group size)"
                           : "the group size vp_group (" + std::to_string(r.g) + ")";
    };
    AGOQ_EXPECTS(m >= r.g, "in_flight: Megatron-Core's interleaved schedule needs micro_batches (" +
                               std::to_string(m) + ") >= " + g());
    AGOQ_EXPECTS(m % r.g == 0 || m % r.g >= pp,
                 "in_flight: Megatron-Core's interleaved schedule refuses micro_batches " +
                     std::to_string(m) + " in groups of " + g() + ": a last group of " +
                     std::to_string(m % r.g) + " micro-batches, fewer than pp (" +
                     std::to_string(pp) + "); choose a vp_group that divides micro_batches or " +
                     "leaves at least pp");
  }
  // Megatron-Core's get_schedule_table: groups start at 0, g, 2g, ...; the group that reaches m
  // is the last and holds the rest.
  r.last_start = (m - 1) / r.g * r.g;
  r.last_size = m - r.last_start;
  r.total = m * v;
  return r;
}

/// The forward units device `stage` runs before its first backward (Megatron's
/// num_warmup_microbatches): p - s - 1 for 1F1B; 2 (p - s - 1) + (v - 1) g for the interleaved
/// schedule (g = p under the legacy rules, which also run all m v when m == p); never more than
/// the m v units of the step.
inline std::int64_t warmup_units(resolved_schedule const& r, std::int64_t stage) {
  if (r.v == 1) return std::min(r.pp - stage - 1, r.total);
  if (r.rules == interleaved_rules::megatron_legacy && r.m == r.pp) return r.total;
  return std::min(2 * (r.pp - stage - 1) + (r.v - 1) * r.g, r.total);
}

/// How many of the first `n` units of a device's forward order run on local chunk `chunk`
/// (Megatron-Core's schedule table): each group of g micro-batches goes through chunk 0, then the
/// same micro-batches through chunk 1, ..., then the next group; the last group holds
/// last_size micro-batches. A device's backward order is the same with the chunks reversed.
inline std::int64_t units_on_chunk(std::int64_t n, resolved_schedule const& r, std::int64_t chunk) {
  std::int64_t const whole = r.last_start * r.v;  // units of the groups before the last
  if (n <= whole)
    return n / (r.g * r.v) * r.g + std::clamp<std::int64_t>(n % (r.g * r.v) - chunk * r.g, 0, r.g);
  return r.last_start + std::clamp<std::int64_t>(n - whole - chunk * r.last_size, 0, r.last_size);
}

/// The local chunk that forward unit `n` (from 0) of a device's forward order runs, in the
/// schedule table of units_on_chunk (whose count for that chunk it is the one to raise); backward
/// unit n runs chunk v - 1 - chunk_of_unit(n, r).
inline std::int64_t chunk_of_unit(std::int64_t n, resolved_schedule const& r) noexcept {
  std::int64_t const whole = r.last_start * r.v;  // units of the groups before the last
  return n < whole ? n % (r.g * r.v) / r.g : (n - whole) / r.last_size;
}

}  // namespace detail

/// The micro-batches each local model chunk of pipeline device `stage` holds (saved by a forward,
/// not yet freed by its backward) at the moments the device holds the most where its holdings
/// turn, one vector of v counts per distinct moment, in schedule order. These moments are all
/// that matter for memory: every other moment of the step holds at most as much in every chunk
/// as a moment of the same total, and every such moment lies on the segment between two of these
/// vectors, so for any per-chunk sizes the device's peak is the largest of these vectors' sums
/// weighted by the sizes (and each chunk's largest count is among them).
/// - 1F1B (v = 1; Narayanan et al. 2021, PipeDream-Flush): stage s of p runs w = p - s - 1
///   warm-up forwards, then alternates one forward and one backward; one moment, min(p - s, m).
/// - Interleaved (v > 1; Megatron's forward_backward_pipelining_with_interleaving): device s runs
///   w warm-up forward units (see interleaved_rules; all m v where w >= m v), then one forward and
///   one backward unit per step, then the last w backwards. Forward units follow the schedule
///   table: groups of g micro-batches through chunk 0, then chunk 1, ...; backward units likewise
///   from chunk v - 1. The peaks are the moments right after each steady-state forward, when
///   w + 1 units are alive (without a steady state, the end of the warm-up); after F forwards and
///   B backwards chunk c holds f_c(F) - f_{v-1-c}(B), f_c(n) the first n forward units on chunk
///   c (detail::units_on_chunk). From one steady step to the next the counts move by one unit
///   into the forward's chunk and one out of the backward's, the same move while neither crosses
///   into another chunk (every g units in the whole groups, every r in a last group of r); the
///   moments returned are the first and last steps and those where the move changes (p = 4,
///   v = 2, device 1: (5, 4) and (8, 1), not the (6, 3) and (7, 2) between them). Within the
///   whole groups the moments repeat every g v steps, so only the turns of one period there and
///   those of the last group are visited: O(v) turns of O(v) counts each, whatever m and g.
/// Throws agoq::invalid_argument for stage outside [0, pp) and for a schedule Megatron refuses
/// (detail::resolve: under Megatron-Core rules g < p, m < g, or a last group shorter than p;
/// under the legacy rules m not a multiple of p), and for one whose unit counts could exceed
/// max_size_count (v m, or v g + 2 p).
inline std::vector<std::vector<std::int64_t>> in_flight_peaks(pipeline_schedule const& sc,
                                                              std::int64_t stage) {
  detail::resolved_schedule const r = detail::resolve(sc, stage);
  std::int64_t const warmup = detail::warmup_units(r, stage);
  auto alive = [&](std::int64_t forwards, std::int64_t backwards) {
    std::vector<std::int64_t> n(static_cast<std::size_t>(r.v));
    for (std::int64_t c = 0; c < r.v; ++c)
      n[static_cast<std::size_t>(c)] = detail::units_on_chunk(forwards, r, c) -
                                       detail::units_on_chunk(backwards, r, r.v - 1 - c);
    return n;
  };
  if (warmup == r.total) return {alive(r.total, 0)};
  std::int64_t const whole = r.last_start * r.v;  // units of the groups before the last
  std::int64_t const period = r.g * r.v;
  std::int64_t const steps = r.total - warmup;
  auto chunk = [&](std::int64_t n) { return detail::chunk_of_unit(n, r); };
  // Step i runs forward unit warmup + i and backward unit i - 1 before it; the move from step i
  // to i + 1 is the same as from i - 1 to i unless one of them enters another chunk (a move with
  // the forward and backward on the same chunk is none).
  auto turns = [&](std::int64_t i) {
    if (i == 0 || i == steps - 1) return true;
    std::int64_t const f0 = chunk(warmup + i), f1 = chunk(warmup + i + 1);
    std::int64_t const b0 = r.v - 1 - chunk(i - 1), b1 = r.v - 1 - chunk(i);
    if (f0 == b0 && f1 == b1) return false;
    return f0 != f1 || b0 != b1;
  };
  // Units n in [lo, hi] where the chunk changes: the multiples of g in the whole groups (their
  // count is (hi - lo) / g + 1), every last_size units in the last group.
  std::vector<std::int64_t> candidates;
  auto add_turns = [&](std::int64_t lo, std::int64_t hi, std::int64_t step_of_unit) {
    for (std::int64_t n = (std::max<std::int64_t>(lo, 1) + r.g - 1) / r.g * r.g;
         n <= std::min(hi, whole); n += r.g)
      candidates.push_back(n + step_of_unit);
    for (std::int64_t k = 1; k < r.v; ++k) {
      std::int64_t const n = whole + k * r.last_size;
      if (n >= lo && n <= hi) candidates.push_back(n + step_of_unit);
    }
  };
  // The steps [begin, end): the first and last, and where the forward unit after a step
  // (warmup + i + 1) or the backward unit of a step (i) enters another chunk.
  auto visit = [&](std::int64_t begin, std::int64_t end) {
    candidates.push_back(begin);
    candidates.push_back(end - 1);
    add_turns(warmup + begin + 1, warmup + end, -warmup - 1);
    add_turns(begin, end - 1, 0);
  };
  // While both units stay in the whole groups, f_c(n + g v) = f_c(n) + g: step i repeats step
  // i - g v. Past the first period, skip to the first step whose forward enters the last group.
  std::int64_t const last_part = whole - warmup;
  if (last_part > period) {
    visit(0, period);
    visit(last_part, steps);
  } else {
    visit(0, steps);
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<std::vector<std::int64_t>> peaks;
  std::set<std::vector<std::int64_t>> seen;
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    std::int64_t const i = candidates[k];
    if ((k > 0 && i == candidates[k - 1]) || i < 0 || i >= steps || !turns(i)) continue;
    auto n = alive(warmup + i + 1, i);
    if (seen.insert(n).second) peaks.push_back(std::move(n));
  }
  return peaks;
}

/// in_flight_peaks of {pp, v, micro_batches} (Megatron-Core rules, groups of pp).
inline std::vector<std::vector<std::int64_t>> in_flight_peaks(std::int64_t pp, std::int64_t v,
                                                              std::int64_t stage,
                                                              std::int64_t micro_batches) {
  return in_flight_peaks(pipeline_schedule{pp, v, micro_batches}, stage);
}

/// The most micro-batches each local model chunk of device `stage` holds at once: per chunk, the
/// largest count of in_flight_peaks. For v > 1 the chunks reach these at different moments, so
/// their sum exceeds the device's peak (p = 4, v = 2, device 0: 8 + 4 = 12 against 11); the
/// memory model uses in_flight_peaks. Throws as in_flight_peaks.
inline std::vector<std::int64_t> in_flight_micro_batches(pipeline_schedule const& sc,
                                                         std::int64_t stage) {
  auto const peaks = in_flight_peaks(sc, stage);
  std::vector<std::int64_t> most = peaks.front();
  for (auto const& n : peaks)
    for (std::size_t c = 0; c < most.size(); ++c) most[c] = std::max(most[c], n[c]);
  return most;
}

/// in_flight_micro_batches of {pp, v, micro_batches} (Megatron-Core rules, groups of pp).
inline std::vector<std::int64_t> in_flight_micro_batches(std::int64_t pp, std::int64_t v,
                                                         std::int64_t stage,
                                                         std::int64_t micro_batches) {
  return in_flight_micro_batches(pipeline_schedule{pp, v, micro_batches}, stage);
}

/// The most model-chunk micro-batches device `stage` holds at one moment (the sum of any of
/// in_flight_peaks), in closed form: min(w + 1, m v) with w the warm-up units, i.e.
/// min(p - s, m) for 1F1B and, for the interleaved schedule, min(2 (p - s - 1) + (v - 1) g + 1,
/// m v) (m v on every device when m == p under the legacy rules). For the first device, g = p
/// and m >= 2p that is p v + p - 1 chunk units = L (1 + (p - 1) / (p v)) layers' worth,
/// Korthikanti et al. 2022, §4.2.3. Throws as in_flight_peaks.
inline std::int64_t peak_in_flight_units(pipeline_schedule const& sc, std::int64_t stage) {
  detail::resolved_schedule const r = detail::resolve(sc, stage);
  return std::min(detail::warmup_units(r, stage) + 1, r.total);
}

/// peak_in_flight_units of {pp, v, micro_batches} (Megatron-Core rules, groups of pp).
inline std::int64_t peak_in_flight_units(std::int64_t pp, std::int64_t v, std::int64_t stage,
                                         std::int64_t micro_batches) {
  return peak_in_flight_units(pipeline_schedule{pp, v, micro_batches}, stage);
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
  std::int64_t layers = 0;              ///< transformer layers it holds (stage_layers)
  std::int64_t parameters = 0;          ///< parameters of its chunks on one rank (unsharded)
  std::int64_t expert_parameters = 0;   ///< of which experts' (expert_layer_parameters)
  std::int64_t weights = 0;             ///< bf16 weights (sharded over dp x cp under ZeRO-3)
  std::int64_t master_weights = 0;      ///< fp32 master copy (sharded under ZeRO >= 1)
  std::int64_t gradients = 0;           ///< gradient buffer (sharded under ZeRO >= 2)
  std::int64_t optimizer = 0;           ///< Adam moments (sharded under ZeRO >= 1)
  std::int64_t gathered_weights = 0;    ///< ZeRO-3: bf16 weights gathered for compute, two
                                        ///< units (the one computing and the one prefetched)
  std::int64_t activations = 0;         ///< saved tensors of the transformer blocks at the peak
  std::int64_t head_activations = 0;    ///< final norm, LM head input and fp32 logits (last stage),
                                        ///< at the same moment
  std::vector<std::int64_t> in_flight;  ///< micro-batches in flight per local chunk at the
                                        ///< moment `activations` + `head_activations` peak (one
                                        ///< of in_flight_peaks)
  std::int64_t working = 0;             ///< the largest working set of one layer's backward (or,
                                        ///< last stage, the output head's), on top of the peak:
                                        ///< activation gradients, dequantized saved tensors,
                                        ///< gathered inputs, logits (layer_working_bytes,
                                        ///< head_working_bytes)
  std::int64_t gradient_buffers = 0;    ///< one bucket's bf16 gradient staging and agoq's 8-bit
                                        ///< collective workspace (gradient_buffer_bytes)
  std::int64_t reserved = 0;            ///< step_config::reserved_bytes
  std::int64_t recompute = 0;           ///< under recomputation (step_config::recompute), the
                                        ///< saved tensors of its largest checkpoint, for one
                                        ///< micro-batch: its layers' forward runs again in the
                                        ///< backward and holds them until their backward is done

  /// Everything but the activations and the transient memory: weights (stored and gathered) +
  /// master + gradients + optimizer.
  std::int64_t states() const noexcept {
    return weights + gathered_weights + master_weights + gradients + optimizer;
  }
  /// The transient working memory at the peak: working + gradient_buffers + reserved +
  /// recompute.
  std::int64_t transient() const noexcept {
    return working + gradient_buffers + reserved + recompute;
  }
  /// Everything counted.
  std::int64_t total() const noexcept {
    return states() + activations + head_activations + transient();
  }
};

/// The shard shape of the activations under `p` for a step `st`: seq / cp tokens of each
/// sequence. Throws agoq::invalid_argument for cp < 1, and when cp > 1 does not split seq into
/// 2 cp equal chunks (Megatron-Core's load-balanced split needs seq divisible by 2 cp).
inline shard_shape shard_of(parallel_config const& p, step_config const& st) {
  AGOQ_EXPECTS(p.cp >= 1, "context parallelism: cp must be positive, got " + std::to_string(p.cp));
  AGOQ_EXPECTS(p.cp == 1 || (st.seq >= 1 && st.seq % (2 * p.cp) == 0),
               "context parallelism: seq (" + std::to_string(st.seq) +
                   ") must split into 2 cp = " + std::to_string(2 * p.cp) + " equal chunks");
  return {st.micro_batch, st.seq / p.cp, p.tp, p.sp, p.cp, p.etp, st.expert_capacity_factor};
}

namespace detail {

/// Throws agoq::invalid_argument for a module the model does not have: `mlp` in a
/// mixture-of-experts model (Megatron-Core's `mlp` module is a dense MLP's; it skips it in an MoE
/// layer), `moe_act`, `moe` and `shared_experts` in a dense one, `shared_experts` without shared
/// experts.
inline void check_selective(model_shape const& m, recompute_modules const& selective) {
  AGOQ_EXPECTS(!m.moe() || !selective.mlp,
               "recompute_modules: mlp recomputes a dense MLP; a mixture-of-experts layer's are "
               "moe_act, moe and shared_experts");
  AGOQ_EXPECTS(m.moe() || !(selective.moe_act || selective.moe || selective.shared_experts),
               "recompute_modules: moe_act, moe and shared_experts recompute a mixture-of-experts "
               "MLP's tensors; a dense MLP's module is mlp");
  AGOQ_EXPECTS(!selective.shared_experts || m.shared_expert_ffn > 0,
               "recompute_modules: shared_experts recomputes the shared experts' tensors; this "
               "model has none");
}

}  // namespace detail

/// Bytes of one micro-batch's saved activations of one layer with the storage `choose(kind)`
/// gives each kind (aliases cost nothing: they read their kind's buffer, and neither do the kinds
/// `selective` recomputes: `choose` is not asked for them). Throws agoq::invalid_argument as
/// shape_of, and for `mlp` recomputed in a mixture-of-experts model.
template <class Choose>
std::int64_t layer_activation_bytes(model_shape const& m, shard_shape const& sh, Choose&& choose,
                                    recompute_modules const& selective = {}) {
  detail::check_selective(m, selective);
  std::int64_t bytes = 0;
  for (tensor_kind const k : m.saved_tensors()) {
    if (is_alias(k) || recomputes(selective, k)) continue;
    bytes += storage(choose(k)).bytes(shape_of(k, m, sh));
  }
  return bytes;
}

/// Bytes of one micro-batch's residual stream [T, h] in bf16 on one rank, T = tokens / tp under
/// SP, else tokens: what a checkpoint of recomputed layers keeps (its input), and each of the
/// output head's two saved inputs. Throws agoq::invalid_argument as shard_shape::validate.
inline std::int64_t residual_stream_bytes(model_shape const& m, shard_shape const& sh) {
  sh.validate(m);
  std::int64_t const rows = sh.sp ? sh.tokens() / sh.tp : sh.tokens();
  return 2 * rows * m.hidden;
}

/// Bytes the last pipeline device saves for the output head per micro-batch, kept precise: the
/// final norm's input [T, h] bf16, the LM head's input [T, h] bf16 (residual_stream_bytes) and
/// the fp32 softmax of the vocabulary-parallel cross entropy [tokens, vocab / tp] (Megatron's
/// 4 s b h / t (1 + v / h) with SP).
inline std::int64_t head_activation_bytes(model_shape const& m, shard_shape const& sh) {
  return 2 * residual_stream_bytes(m, sh) + 4 * sh.tokens() * vocab_per_rank(m, sh.tp);
}

/// Throws agoq::invalid_argument unless st.recompute_layers suits st.recompute: at least 1 with a
/// method (Megatron's recompute_num_layers), 0 without; and unless at most one of full
/// (st.recompute) and selective (st.selective) recomputation is asked for (Megatron's
/// recompute_granularity is one or the other).
inline void check_recompute(step_config const& st) {
  AGOQ_EXPECTS(
      st.recompute == recompute_method::none ? st.recompute_layers == 0 : st.recompute_layers >= 1,
      "step_config: recompute_layers (Megatron's recompute_num_layers) must be at least 1 "
      "with recompute " +
          name_of(st.recompute) + " and 0 without, got " + std::to_string(st.recompute_layers));
  AGOQ_EXPECTS(st.recompute == recompute_method::none || !st.selective.any(),
               "step_config: full recomputation (recompute " + name_of(st.recompute) +
                   ") and selective recomputation (modules " + name_of(st.selective) +
                   ") exclude each other, as Megatron's recompute_granularity is full or "
                   "selective");
}

/// How many of the first layers of a model chunk of `chunk_layers` layers are recomputed under
/// st.recompute (recompute_method): none 0, uniform all, block min(N, chunk_layers). Throws as
/// check_recompute.
inline std::int64_t recomputed_layers(step_config const& st, std::int64_t chunk_layers) {
  check_recompute(st);
  if (st.recompute == recompute_method::none) return 0;
  return st.recompute == recompute_method::uniform ? chunk_layers
                                                   : std::min(st.recompute_layers, chunk_layers);
}

/// True when global layer `layer` is recomputed (recomputed_layers of its model chunk). Throws
/// agoq::invalid_argument for a layer outside the model, or as check_recompute.
inline bool is_recomputed(model_shape const& m, parallel_config const& p, step_config const& st,
                          std::int64_t layer) {
  AGOQ_EXPECTS(layer >= 0 && layer < m.layers, "is_recomputed: layer " + std::to_string(layer) +
                                                   " outside [0, " + std::to_string(m.layers) +
                                                   ")");
  check_recompute(st);
  if (st.recompute == recompute_method::none) return false;
  layer_place const at = place_of(layer, m, p);
  return layer - first_layer_of(m, p, at.stage, at.chunk) <
         recomputed_layers(st, p.chunk_layers(m, at.stage, at.chunk));
}

/// The checkpoints of a model chunk of `chunk_layers` layers, in layer order, each as its number
/// of layers (recomputed in its backward all at once): uniform, N at a time (the last what is
/// left); block, one each. Throws as check_recompute.
inline std::vector<std::int64_t> recompute_checkpoints(step_config const& st,
                                                       std::int64_t chunk_layers) {
  std::int64_t const end = recomputed_layers(st, chunk_layers);
  std::int64_t const each = st.recompute == recompute_method::uniform ? st.recompute_layers : 1;
  std::vector<std::int64_t> out;
  for (std::int64_t j = 0; j < end; j += out.back()) out.push_back(std::min(each, end - j));
  return out;
}

/// Bytes of the checkpoints' inputs one micro-batch keeps in local model chunk `chunk` of pipeline
/// device `stage` under st.recompute: recompute_checkpoints of the chunk, times
/// residual_stream_bytes. Throws as those.
inline std::int64_t checkpoint_input_bytes(model_shape const& m, parallel_config const& p,
                                           step_config const& st, std::int64_t stage,
                                           std::int64_t chunk) {
  return static_cast<std::int64_t>(
             recompute_checkpoints(st, p.chunk_layers(m, stage, chunk)).size()) *
         residual_stream_bytes(m, shard_of(p, st));
}

/// Parameters of the largest weight matrix of one transformer layer on one tensor-parallel rank, in
/// Megatron-Core's fused layout: QKV [q + 2k, h], output projection [h, q], FC1 [2f, h] (SwiGLU's
/// gate and up together) or [f, h], FC2 [h, f], with q and k the query and key/value widths per
/// rank and f = ffn / tp. Megatron's and DeepSpeed's gradient buckets hold whole parameters, so a
/// bucket is never smaller.
inline std::int64_t largest_layer_matrix(model_shape const& m, std::int64_t tp) {
  m.validate();
  std::int64_t const h = m.hidden;
  auto const [q, k, f] = widths_of(m, tp);
  std::int64_t const fc1 = llama_like(m.style) ? 2 * f * h : f * h;
  return std::max({(q + 2 * k) * h, h * q, fc1, h * f});
}

/// Bytes of the transient working set of one transformer layer's backward pass for one
/// micro-batch on one rank (docs/activations.md §4.2 gives the sources): the residual-stream
/// gradient R = 2 T h, live through the layer's backward, plus the largest of its phases below.
/// T0 = micro_batch * seq; T = T0 / tp under SP, else T0; q and k the query and key/value widths
/// per rank; f = ffn / tp; G = 2 T0 h under SP (an all-gathered [T0, h] bf16 input or output
/// gradient), else 0; L the bytes of the fp32 logsumexp; D(x) the bf16 (precise) bytes of saved
/// tensor x when `quantized(x)`, else 0: its consumer, a cuBLAS GEMM or the attention kernel,
/// reads it from a dequantized buffer (agoq's fused norm, SwiGLU and GeLU backward ops read the
/// codes directly and need none).
/// - down projection / FC2: G + 2 T0 f + D(swiglu_output / fc2_input);
/// - SwiGLU: 6 T0 f (its input gradient, the gate and up gradients); GeLU: 4 T0 f;
/// - gate and up / FC1: 4 T0 f (GPT: 2 T0 f) + 2 T0 h + G + D(mlp_input / fc1_input);
/// - output projection: G + 2 T0 q + D(attention_output);
/// - flash attention: 2 T0 q (dO) + 2 T0 (q + 2k) (dQ, dK, dV) + 4 T0 q (the fp32 dQ accumulator)
///   + L (the fp32 softmax_d) + 4 T0 q where k < q (grouped-query attention: dK and dV at the
///   query width before they are summed) + D(query) + D(key) + D(value) + D(attention_output) +
///   D(softmax_lse);
/// - QKV projection: 2 T0 (q + 2k) + 2 T0 h + G + D(qkv_input);
/// - QK-norm (Qwen3, Gemma 3): 2 T0 (q + 2k) (the gradients of Q, K and V after it) + 2 T0 (q + k)
///   (of its inputs) + D(query_norm_input) + D(key_norm_input).
/// Gemma's post-norms (agoq's fused RMSNorm backward reads their inputs' codes) hold their input
/// gradient, 2 T h, never more than the gate and up phase's 2 T0 h and more.
/// A mixture-of-experts layer has the MLP's three for its shared experts (f = shared_expert_ffn /
/// tp; none without them); where they are gated, a phase for the gate's backward, 2 T h (their
/// output's gradient) + D(shared_expert_output) + D(shared_gate_score) (that gradient also lives
/// through their down projection's backward, whose phase then holds 2 T0 f + 2 T h + G +
/// D(swiglu_output), never more than their gate and up's); and these (R = expert_rows, the
/// (token, expert) pairs of this rank's experts, f_e = expert_ffn / etp, e = experts; the tokens
/// reach the experts by all-to-all, not gathered, so no G):
/// - experts' down projection: 2 R h (its output gradient, as the all-to-all brings it) + 2 R f_e
///   + D(expert_swiglu_output);
/// - experts' SwiGLU: 6 R f_e;
/// - experts' gate and up: 4 R f_e + 2 R h (their input gradient) + D(expert_input);
/// - router and combine: 2 R h (the routed input gradients, back from the all-to-all) + 2 T h
///   (their sum per token) + 4 T e (the fp32 gradient of the router's probabilities) +
///   D(router_probs) + D(mlp_input).
/// Each forward phase holds no more than one of these (its bf16 outputs are the backward's
/// gradients), but two, without the residual-stream gradient: the ring attention of context
/// parallelism (cp > 1; T0 is then this rank's tokens, seq / cp of each sequence), as Transformer
/// Engine's AttnFuncWithCPAndKVP2P runs it: its forward keeps every KV chunk the ring brings
/// ([T0, 2k] bf16, cp of them, its own copy included) and each step's output and fp32 logsumexp
/// until the last step merges them, cp (4 T0 k + 2 T0 q + L); its backward adds to the flash
/// attention phase two buffers that each hold a KV chunk and its gradient in flight, 16 T0 k; and
/// a mixture-of-experts layer's token movement, as Megatron-Core's alltoall dispatcher runs it:
/// at the combine the experts' output [R, h] beside what the all-to-all sends or receives,
/// [R / etp, h] (after the expert-TP reduce-scatter; the dispatch mirrors it, the all-to-all's
/// output beside the expert-TP all-gather's), 2 R h + 2 R h / etp, where the experts are narrow
/// (h / etp > f_e) and tokens go to several (k > 1) more than any backward phase.
///
/// Under selective recomputation (`selective`), D(x) is also the bf16 bytes of every kind it
/// recomputes (recomputes), and the tensors computed again at the start of a sub-block's backward
/// live until their consumer's phase:
/// - `layernorm`: D(qkv_input) in the output-projection and flash-attention phases (the norm's
///   forward again, from its input dequantized where that is quantized, holds at most
///   2 T h + D(norm output), less than its GEMM's phase);
/// - `layernorm` or `mlp`: D(mlp_input / fc1_input) in the down-projection and SwiGLU / GeLU
///   phases (a mixture-of-experts layer: `layernorm`, in its experts' three);
/// - `mlp`: the MLP's inner tensors in bf16, M = 6 T0 f (gate, up, SwiGLU output; GPT 4 T0 f),
///   replace D(swiglu_output / fc2_input) in the down-projection phase; the SwiGLU phase holds
///   the gate and up outputs (4 T0 f; GeLU its input, 2 T0 f) beside its gradients; and the MLP's
///   forward again is a phase of its own, D(mlp_input) + G + M + 2 T0 h (its output before the
///   reduction);
/// - `core_attn`: the flash-attention phase holds the recomputed output, 2 T0 q, and logsumexp,
///   D(softmax_lse).
/// Throws agoq::invalid_argument as shape_of.
template <class Quantized>
requires std::predicate<Quantized&, tensor_kind> std::int64_t layer_working_bytes(
    model_shape const& m, shard_shape const& sh, Quantized&& quantized,
    recompute_modules const& selective = {}) {
  std::int64_t const lse = shape_of(tensor_kind::softmax_lse, m, sh).bytes();  // checks m, sh
  auto const bf16 = [&](tensor_kind k) {
    return recomputes(selective, k) || quantized(k) ? shape_of(k, m, sh).bytes() : 0;
  };
  detail::check_selective(m, selective);
  bool const llama = llama_like(m.style);
  std::int64_t const t0 = sh.tokens();
  std::int64_t const rows = sh.sp ? t0 / sh.tp : t0;
  std::int64_t const h = m.hidden;
  auto const [q, k, f] = widths_of(m, sh.tp);
  std::int64_t const g = sh.sp ? 2 * t0 * h : 0;
  tensor_kind const mlp_in = llama ? tensor_kind::mlp_input : tensor_kind::fc1_input;
  std::int64_t const inner = (llama ? 6 : 4) * t0 * f;  // M: the MLP's inner tensors in bf16
  // Recomputed at the start of the attention's / the MLP's backward, alive until consumed.
  std::int64_t const early_attn = selective.layernorm ? bf16(tensor_kind::qkv_input) : 0;
  // The MLP's input, recomputed (layernorm) or dequantized for a forward computed again (mlp,
  // shared_experts, moe) at the start of the MLP's backward, lives until its last consumer: the
  // routed experts' phases see it under layernorm or moe, the dense (shared) MLP's under any.
  bool const moe_again = selective.moe;
  bool const mlp_again = selective.mlp || selective.shared_experts || moe_again;
  std::int64_t const early_mlp =
      selective.layernorm || mlp_again ? bf16(mlp_in) : 0;  // the dense (shared) MLP's phases
  std::int64_t const early_routed = selective.layernorm || moe_again ? bf16(mlp_in) : 0;
  std::int64_t const r = sh.expert_rows(m);
  std::int64_t const fe = m.moe() ? m.expert_ffn / sh.expert_tp() : 0;
  // The gated shared experts' output and gate score in bf16, computed again (shared_experts, moe).
  std::int64_t const gated = m.shared_expert_gate ? 2 * rows * h + 2 * rows : 0;
  // Under moe the shared experts' tensors computed again live through the routed experts'
  // backward (Megatron-Core runs the shared experts first, so their backward comes last).
  std::int64_t const shared_alive = moe_again && f > 0 ? inner + gated : 0;
  // The dense MLP's phases, or a mixture-of-experts layer's shared experts' (f = 0: none).
  std::array<std::int64_t, 4> const mlp =
      f > 0 ? std::array<std::int64_t, 4>{g + 2 * t0 * f + early_mlp +
                                              (mlp_again ? inner
                                                         : bf16(llama ? tensor_kind::swiglu_output
                                                                      : tensor_kind::fc2_input)),
                                          (llama ? 6 : 4) * t0 * f + early_mlp +
                                              (mlp_again ? (llama ? 4 : 2) * t0 * f : 0),
                                          (llama ? 4 : 2) * t0 * f + 2 * t0 * h + g + bf16(mlp_in),
                                          mlp_again && !moe_again
                                              ? early_mlp + g + inner + 2 * t0 * h +
                                                    (selective.shared_experts ? gated : 0)
                                              : 0}
            : std::array<std::int64_t, 4>{};
  // Under moe the routed experts' tensors computed again live until consumed: in their down
  // projection's phase their gate and up outputs, input and the router's probabilities, in their
  // SwiGLU's the same, in their gate and up's the probabilities.
  std::int64_t const probs = moe_again ? 4 * rows * m.experts : 0;
  std::array<std::int64_t, 6> const experts =
      m.moe()
          ? std::array<
                std::int64_t,
                6>{2 * r * h + 2 * r * fe + early_routed + bf16(tensor_kind::expert_swiglu_output) +
                       (moe_again ? 4 * r * fe + 2 * r * h + probs + shared_alive : 0),
                   6 * r * fe + early_routed +
                       (moe_again ? 4 * r * fe + 2 * r * h + probs + shared_alive : 0),
                   4 * r * fe + 2 * r * h + early_routed + bf16(tensor_kind::expert_input) +
                       (moe_again ? probs + shared_alive : 0),
                   2 * r * h + 2 * rows * h + 4 * rows * m.experts +
                       bf16(tensor_kind::router_probs) + bf16(mlp_in) + shared_alive,
                   m.shared_expert_gate
                       ? 2 * rows * h +
                             bf16(tensor_kind::shared_expert_output) +
                             bf16(tensor_kind::shared_gate_score) + early_mlp +
                             (selective.shared_experts || moe_again ? inner : 0)
                       : 0,
                   // The mixture-of-experts MLP's forward again (moe): every tensor it computes,
                   // with the routed experts' output before the combine and the shared experts'
                   // before their reduction, alive at once (an upper bound of its peak).
                   moe_again ? early_routed +
                                   probs + 2 * r * h + 6 * r * fe + 2 * r * h +
                                   (f > 0 ? g + inner + gated + 2 * t0 * h : 0)
                             : 0}
          : std::array<std::int64_t, 6>{};
  std::int64_t const phases[] = {
      mlp[0],
      mlp[1],
      mlp[2],
      mlp[3],
      experts[0],
      experts[1],
      experts[2],
      experts[3],
      experts[4],
      experts[5],
      g + 2 * t0 * q + bf16(tensor_kind::attention_output) + early_attn,
      2 * t0 * q + 2 * t0 * (q + 2 * k) + 4 * t0 * q + lse + (k < q ? 4 * t0 * q : 0) +
          (sh.cp > 1 ? 16 * t0 * k : 0) + bf16(tensor_kind::query) + bf16(tensor_kind::key) +
          bf16(tensor_kind::value) + bf16(tensor_kind::attention_output) +
          bf16(tensor_kind::softmax_lse) + (selective.core_attn ? 2 * t0 * q : 0) + early_attn,
      2 * t0 * (q + 2 * k) + 2 * t0 * h + g + bf16(tensor_kind::qkv_input),
      has_qk_norm(m.style)
          ? 2 * t0 * (q + 2 * k) + 2 * t0 * (q + k) + bf16(tensor_kind::query_norm_input) +
                bf16(tensor_kind::key_norm_input)
          : 0};
  std::int64_t const ring_forward = sh.cp > 1 ? sh.cp * (4 * t0 * k + 2 * t0 * q + lse) : 0;
  std::int64_t const combine_forward = m.moe() ? 2 * r * h + 2 * (r / sh.expert_tp()) * h : 0;
  return std::max({2 * rows * h + std::ranges::max(phases), ring_forward, combine_forward});
}

/// The two gradient buffers of a device, reduced over different groups: the dense parameters'
/// (every parameter of a dense model) over dp x cp, a mixture-of-experts model's experts' over
/// the expert data-parallel group (parallel_config::expert_gradient_ranks), as Megatron-Core
/// keeps them.
enum class parameter_group : std::uint8_t { dense, experts };

/// The ranks group `g`'s gradients are reduced, and ZeRO shards its states, over.
inline std::int64_t ranks_of(parallel_config const& p, parameter_group g) noexcept {
  return g == parameter_group::dense ? p.gradient_ranks() : p.expert_gradient_ranks();
}

/// True when the backward's weight gradients cannot go straight into the kept gradient (as
/// Megatron's gradient accumulation fusion adds them into a dense fp32 or bf16 buffer) and are
/// written in bf16 first: agoq's 8-bit buffer, or a buffer sharded over more than one rank of
/// group `group` (ranks_of; ZeRO-2, -3).
inline bool stages_gradients(parallel_config const& p, gradient_format g,
                             parameter_group group = parameter_group::dense) noexcept {
  return g == gradient_format::int8_g128 || (p.zero_stage >= 2 && ranks_of(p, group) > 1);
}

/// Bytes of the output head's transient working set on the last pipeline device, for one
/// micro-batch: the bf16 logits [T0, V/t] (in the forward beside their fp32 copy, which
/// head_activation_bytes counts; in the backward, their gradient), the head's input gradient
/// [T0, h], its all-gathered input under SP (G of layer_working_bytes), and, when `staged`
/// (stages_gradients), the bf16 gradient of the head's weight [V/t, h].
inline std::int64_t head_working_bytes(model_shape const& m, shard_shape const& sh, bool staged) {
  sh.validate(m);
  std::int64_t const t0 = sh.tokens();
  std::int64_t const v = vocab_per_rank(m, sh.tp);
  std::int64_t const h = m.hidden;
  return 2 * t0 * v + 2 * t0 * h + (sh.sp ? 2 * t0 * h : 0) + (staged ? 2 * v * h : 0);
}

/// Parameters of the largest weight of one mixture-of-experts layer's experts on one rank: an
/// expert's gate and up together, [2 f_e / etp, h] (Transformer Engine's grouped linear layers keep
/// one weight per expert); 0 for a dense model.
inline std::int64_t largest_expert_matrix(model_shape const& m, parallel_config const& p) {
  p.validate(m);
  return 2 * (m.expert_ffn / p.expert_tp()) * m.hidden;
}

/// Parameters per gradient bucket of group `group` on a device holding `parameters` of it:
/// step_config::bucket_parameters, or Megatron-Core's default max(40,000,000, 1,000,000 dp cp)
/// when it is 0 (one size for both groups, as its DistributedDataParallel sets it); never less
/// than the group's largest weight (largest_layer_matrix, largest_expert_matrix), never more than
/// the device holds.
inline std::int64_t bucket_parameters(model_shape const& m, parallel_config const& p,
                                      step_config const& st, std::int64_t parameters,
                                      parameter_group group = parameter_group::dense) {
  // Past parameters / 10^6 ranks the default exceeds the device's parameters (without overflow).
  std::int64_t const per_rank = 1'000'000;
  std::int64_t const bucket =
      st.bucket_parameters > 0 ? st.bucket_parameters
      : p.gradient_ranks() > parameters / per_rank
          ? parameters
          : std::max<std::int64_t>(40'000'000, per_rank * p.gradient_ranks());
  std::int64_t const largest =
      group == parameter_group::dense ? largest_layer_matrix(m, p.tp) : largest_expert_matrix(m, p);
  return std::min(std::max(bucket, largest), parameters);
}

/// Bytes of the gradient buffers of group `group` counted at the peak of a device holding
/// `parameters` of it, for a bucket of n = bucket_parameters: when stages_gradients, the bucket's
/// bf16 gradient (2 n); for agoq's 8-bit buffer over more than one rank (ranks_of), also the
/// device workspace of the 8-bit collective over them (gradient::collective_workspace, groups of
/// 128: the reduce-scatter under ZeRO >= 1, else the all-reduce). fp32 and bf16 buffers are
/// reduced in place (NCCL's own buffers are in the reserved allowance): 0. The collective runs
/// after the backward or, overlapped, during the last micro-batch's; counting it at the peak is an
/// upper bound (and so is counting both groups' of a mixture-of-experts model).
inline std::int64_t gradient_buffer_bytes(model_shape const& m, parallel_config const& p,
                                          step_config const& st, gradient_format g,
                                          std::int64_t parameters,
                                          parameter_group group = parameter_group::dense) {
  if (!stages_gradients(p, g, group)) return 0;
  std::int64_t const n = bucket_parameters(m, p, st, parameters, group);
  std::int64_t bytes = 2 * n;
  std::int64_t const ranks = ranks_of(p, group);
  if (g == gradient_format::int8_g128 && ranks > 1)
    bytes += gradient::collective_workspace(gradient::chunk_plan(n, 128, ranks), p.zero_stage == 0)
                 .total;
  return bytes;
}

namespace detail {

/// Throws agoq::invalid_argument unless every count estimate_memory forms fits 64 bits: an upper
/// bound of any device's total, 64 P + U (c (B/8 + 8 KiB) + B/8) + B + 512 (dp cp + e) + 4 KiB
/// + reserved, at most max_size_count, with P = model_shape::parameter_bound (64 bytes a
/// parameter bound the states, the head's staged weight gradient and the gradient buffers but for
/// their 512 bytes a rank, e = expert_gradient_ranks those of the experts'), B =
/// shard_shape::byte_bound (the working set; B/8 bounds one micro-batch's saved tensors of a layer,
/// 8 KiB their section alignments, or of the output head), c the most layers of a model chunk
/// (max_chunk_layers) and U the chunk units the first device holds at once, the most of any
/// (peak_in_flight_units), plus one under recomputation (its checkpoint's layers). The bound is
/// loose (LLaMA-3-8B with bf16 activations: about 21 times the total), so a device needing more
/// than about 2^57 bytes may be refused. `m`, `p` and `sh` are valid.
inline void check_step_size(model_shape const& m, parallel_config const& p, step_config const& st,
                            shard_shape const& sh) {
  auto const units = static_cast<long double>(peak_in_flight_units(schedule_of(p, st), 0));
  long double const b = sh.byte_bound(m);
  // Recomputation adds at most a chunk's layers of one micro-batch (and keeps less).
  long double const copies = units + (st.recompute == recompute_method::none ? 0 : 1);
  long double const bound =
      64 * m.parameter_bound() +
      copies * (static_cast<long double>(p.max_chunk_layers(m)) * (b / 8 + 8192) + b / 8) + b +
      512 * (static_cast<long double>(p.gradient_ranks()) +
             static_cast<long double>(p.expert_gradient_ranks())) +
      4096 + static_cast<long double>(st.reserved_bytes);
  AGOQ_EXPECTS(bound <= static_cast<long double>(max_size_count),
               "estimate_memory: the step is too large to count in 64-bit bytes: a device could "
               "need up to " +
                   detail::approx(bound) + " bytes, more than 2^62");
}

/// The bytes of saved activations a pipeline device holds at each of its peak moments `peaks`
/// (in_flight_peaks) when one micro-batch saves chunk_bytes[c] in local chunk c, plus
/// `head_bytes` in the last chunk (the output head's, on the last device).
inline std::vector<std::int64_t> bytes_at_peaks(std::vector<std::vector<std::int64_t>> const& peaks,
                                                std::vector<std::int64_t> const& chunk_bytes,
                                                std::int64_t head_bytes) {
  std::vector<std::int64_t> out;
  for (auto const& n : peaks) {
    std::int64_t bytes = n.back() * head_bytes;
    for (std::size_t c = 0; c < n.size(); ++c) bytes += n[c] * chunk_bytes[c];
    out.push_back(bytes);
  }
  return out;
}

/// Sets `s.in_flight`, `s.activations` and `s.head_activations` to the first of `peaks` that
/// holds the most bytes (bytes_at_peaks): the device's activation peak.
inline void set_activation_peak(stage_memory& s,
                                std::vector<std::vector<std::int64_t>> const& peaks,
                                std::vector<std::int64_t> const& chunk_bytes,
                                std::int64_t head_bytes) {
  auto const bytes = bytes_at_peaks(peaks, chunk_bytes, head_bytes);
  auto const at =
      static_cast<std::size_t>(std::max_element(bytes.begin(), bytes.end()) - bytes.begin());
  s.in_flight = peaks[at];
  s.head_activations = s.in_flight.back() * head_bytes;
  s.activations = bytes[at] - s.head_activations;
}

/// The working set of pipeline device `stage` (stage_memory::working): the largest
/// layer_working_bytes of its layers, with `quantized(l, k)` telling whether layer l stores kind k
/// quantized, under the selective recomputation `selective`, and on the last device also the
/// output head's (head_working_bytes, with the head weight's gradient staged when `staged`).
template <class Quantized>
std::int64_t device_working_bytes(model_shape const& m, parallel_config const& p,
                                  shard_shape const& sh, std::int64_t stage, bool staged,
                                  recompute_modules const& selective, Quantized&& quantized) {
  std::int64_t bytes = stage == p.pp - 1 ? head_working_bytes(m, sh, staged) : 0;
  for (std::int64_t c = 0; c < p.virtual_stages; ++c) {
    std::int64_t const first = first_layer_of(m, p, stage, c);
    for (std::int64_t l = first; l < first + p.chunk_layers(m, stage, c); ++l)
      bytes =
          std::max(bytes, layer_working_bytes(
                              m, sh, [&](tensor_kind k) { return quantized(l, k); }, selective));
  }
  return bytes;
}

}  // namespace detail

/// The memory of every pipeline device for one step with saved tensor `k` of global layer `l`
/// stored as `choose(l, k)` (a callable returning agoq::activation::storage). The activations are
/// those of the device's peak moment: of its in_flight_peaks, the one whose in-flight chunks
/// (and output head) hold the most bytes; chunks may differ in size when their layers are stored
/// differently, and the head lives in the last device's last chunk. The transient memory is that
/// of the same moment: the working set of the device's largest layer (or head) phase with the
/// storage chosen, the gradient buffers and the reserved allowance. Under recomputation
/// (step_config::recompute) the recomputed layers of each chunk keep their checkpoints' inputs
/// instead of their tensors; in the backward a checkpoint's layers save theirs again (as `choose`
/// stores them) for one micro-batch, the largest checkpoint's counted in the transient memory
/// (stage_memory::recompute). Under selective recomputation (step_config::selective) every layer
/// keeps the kinds it does not recompute (`choose` is not asked for the others) and its working
/// set holds the recomputed ones (layer_working_bytes). Throws
/// agoq::invalid_argument for an invalid configuration, and for one too large to count in 64-bit
/// bytes (detail::check_step_size: more than 2^62 bytes on a device, by a generous bound).
template <class Choose>
requires std::invocable<Choose&, std::int64_t, tensor_kind> std::vector<stage_memory>
estimate_memory(model_shape const& m, parallel_config const& p, step_config const& st,
                state_formats const& f, Choose&& choose) {
  p.validate(m);
  AGOQ_EXPECTS(st.micro_batch >= 1 && st.seq >= 1 && st.micro_batches >= 0 &&
                   st.bucket_parameters >= 0 && st.reserved_bytes >= 0,
               "step_config: micro_batch and seq must be positive, micro_batches, "
               "bucket_parameters and reserved_bytes >= 0");
  check_recompute(st);
  shard_shape const sh = shard_of(p, st);
  sh.validate(m);
  detail::check_step_size(m, p, st, sh);
  std::int64_t const per_layer = layer_parameters(m, p.tp);
  std::int64_t const per_layer_experts = expert_layer_parameters(m, p);
  std::int64_t const embedding = vocab_per_rank(m, p.tp) * m.hidden;
  std::int64_t const final_norm = llama_like(m.style) ? m.hidden : 2 * m.hidden;
  std::vector<stage_memory> out;
  for (std::int64_t r = 0; r < p.pp; ++r) {
    stage_memory s;
    s.stage = r;
    s.layers = p.stage_layers(m, r);
    s.expert_parameters = per_layer_experts * s.layers;
    s.parameters = per_layer * s.layers + s.expert_parameters;
    bool const first = r == 0;
    bool const last = r == p.pp - 1;
    if (first) s.parameters += embedding;
    // An untied head, or a tied one on a different stage (Megatron keeps a copy there).
    if (last && (!m.tied_embeddings || p.pp > 1)) s.parameters += embedding;
    if (last) s.parameters += final_norm;
    // The dense parameters sharded over dp x cp, the experts' over the expert data-parallel group.
    std::int64_t const dense = s.parameters - s.expert_parameters;
    auto shard = [&](int from_stage) {
      return p.zero_stage >= from_stage
                 ? agoq::detail::ceil_div(dense, p.gradient_ranks()) +
                       agoq::detail::ceil_div(s.expert_parameters, p.expert_gradient_ranks())
                 : s.parameters;
    };
    s.weights = 2 * shard(3);
    if (p.zero_stage == 3) {
      // The largest unit gathered at once: a transformer layer (its experts included), or the
      // embedding / head matrix this device holds.
      std::int64_t unit = per_layer + per_layer_experts;
      if (first || (last && (!m.tied_embeddings || p.pp > 1))) unit = std::max(unit, embedding);
      s.gathered_weights = 2 * 2 * unit;
    }
    s.master_weights = 4 * shard(1);
    s.gradients = gradient_bytes(f.gradients, shard(2));
    s.optimizer = optimizer_bytes(f.optimizer, shard(1));
    std::vector<std::int64_t> chunk_bytes(static_cast<std::size_t>(p.virtual_stages), 0);
    for (std::int64_t c = 0; c < p.virtual_stages; ++c) {
      std::int64_t const first = first_layer_of(m, p, r, c);
      std::int64_t const lc = p.chunk_layers(m, r, c);
      // Recomputation: the first `recomputed` layers of the chunk keep only their checkpoints'
      // inputs.
      std::int64_t const recomputed = recomputed_layers(st, lc);
      std::vector<std::int64_t> const checkpoints = recompute_checkpoints(st, lc);
      std::vector<std::int64_t> bytes;  // one micro-batch's saved tensors of each layer
      for (std::int64_t l = first; l < first + lc; ++l)
        bytes.push_back(layer_activation_bytes(
            m, sh, [&](tensor_kind k) { return choose(l, k); }, st.selective));
      chunk_bytes[static_cast<std::size_t>(c)] =
          checkpoint_input_bytes(m, p, st, r, c) +
          std::accumulate(bytes.begin() + recomputed, bytes.end(), std::int64_t{0});
      for (auto at = bytes.begin(); std::int64_t const n : checkpoints) {
        s.recompute = std::max(s.recompute, std::accumulate(at, at + n, std::int64_t{0}));
        at += n;
      }
    }
    detail::set_activation_peak(s, in_flight_peaks(schedule_of(p, st), r), chunk_bytes,
                                last ? head_activation_bytes(m, sh) : 0);
    s.working = detail::device_working_bytes(
        m, p, sh, r, stages_gradients(p, f.gradients), st.selective,
        [&](std::int64_t l, tensor_kind k) { return !choose(l, k).is_precise(); });
    s.gradient_buffers = gradient_buffer_bytes(m, p, st, f.gradients, dense);
    if (s.expert_parameters > 0)
      s.gradient_buffers += gradient_buffer_bytes(m, p, st, f.gradients, s.expert_parameters,
                                                  parameter_group::experts);
    s.reserved = st.reserved_bytes;
    out.push_back(std::move(s));
  }
  return out;
}

/// estimate_memory with every tensor stored as the policy table's default, but those of the
/// layers the step recomputes (is_recomputed), kept in bf16 as the planner keeps them.
inline std::vector<stage_memory> estimate_memory(model_shape const& m, parallel_config const& p,
                                                 step_config const& st, state_formats const& f,
                                                 policy_table const& policy) {
  return estimate_memory(m, p, st, f, [&](std::int64_t l, tensor_kind k) {
    return is_recomputed(m, p, st, l) ? storage::precise() : policy.default_storage(k);
  });
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
/// Exact integer arithmetic; t must divide 24 s b h + 5 a s^2 b (and 34 s b h under SP). Throws
/// agoq::invalid_argument for a non-positive argument, or where 34 s b h + 5 a s^2 b exceeds
/// max_size_count.
inline std::int64_t megatron_layer_activation_bytes(std::int64_t s, std::int64_t b, std::int64_t h,
                                                    std::int64_t a, std::int64_t t, bool sp) {
  AGOQ_EXPECTS(s >= 1 && b >= 1 && h >= 1 && a >= 1 && t >= 1,
               "megatron_layer_activation_bytes: s, b, h, a and t must be positive");
  long double const sb = static_cast<long double>(s) * static_cast<long double>(b);
  AGOQ_EXPECTS(sb * (34 * static_cast<long double>(h) + 5 * static_cast<long double>(a) * s) <=
                   static_cast<long double>(max_size_count),
               "megatron_layer_activation_bytes: more than 2^62 bytes");
  std::int64_t const sbh = s * b * h;
  std::int64_t const scores = 5 * a * s * s * b;
  if (sp) return (34 * sbh + scores) / t;
  return 10 * sbh + (24 * sbh + scores) / t;
}

}  // namespace agoq::activation
