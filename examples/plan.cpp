/// \file
/// agoq_plan: prints the per-GPU training memory of a model under a parallel layout (bf16
/// activations + fp32 gradients against AGoQ's layer-aware activations + 8-bit gradients) and,
/// given a budget, the activation plan the planner chooses; with --json, all of it as one JSON
/// document (figures in bytes).
///
///   agoq_plan --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 60
///   agoq_plan --config model.cfg        (key=value lines, the flag names without "--")
///   agoq_plan --hf-config config.json --tp 8 --pp 4 --sp --budget-gib 70
///
/// Host only, single-threaded.

#include <agoq/activation/hf_config.hpp>
#include <agoq/activation/planner.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace act = agoq::activation;

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

struct options {
  act::model_shape model;
  act::parallel_config parallel;
  act::step_config step;
  act::state_formats agoq_states{act::gradient_format::int8_g128, act::optimizer_format::fp32};
  act::error_model errors;
  double budget_gib = 0;
  bool verbose = false;
  bool json = false;
  bool fit_recompute = false;
  bool recompute_options = false;
  double max_recompute_overhead = 1.0;  ///< a share (--max-recompute-overhead is in percent)
  std::string pipeline_layout;          ///< --pipeline-layout as given (use_pipeline_layout)
};

/// --fit-recompute's answers: the fewest layers of each model chunk to recompute (block) for the
/// baseline and for AGoQ to fit the budget (none: not even every layer), where it was asked.
struct recompute_fit {
  bool asked = false;
  std::optional<std::int64_t> baseline;
  std::optional<std::int64_t> agoq;
};

/// --recompute-options' answers: every set of recompute modules and every full recomputation
/// planned for AGoQ, and the one of least error within --max-recompute-overhead, where it was
/// asked.
struct recompute_choice {
  bool asked = false;
  std::vector<act::recompute_option> options;
  std::optional<act::recompute_option> least_error;
  /// The baseline's recomputation of least overhead that fits (every plan of the baseline keeps
  /// its tensors in bf16: error 0).
  std::optional<act::recompute_option> baseline;
};

void usage() {
  std::puts(
      "usage: agoq_plan [--config FILE] [--preset NAME] [--hf-config FILE]\n"
      "  [--style llama|gpt|qwen3|gemma2|gemma3] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
      "  [--kv-heads N] [--head-dim N] [--vocab N] [--experts N] [--experts-per-token N]\n"
      "  [--expert-ffn N]\n"
      "  [--shared-expert-ffn N] [--shared-expert-gate] [--no-shared-expert-gate]\n"
      "  [--tp N] [--pp N] [--vp N] [--vp-group N] [--ep N] [--etp N]\n"
      "  [--expert-capacity-factor X]\n"
      "  [--vp-rules core|legacy] [--first-stage-layers N] [--last-stage-layers N]\n"
      "  [--account-for-embedding] [--account-for-loss] [--pipeline-layout TEXT]\n"
      "  [--dp N] [--cp N] [--zero 0-3] [--sp] [--no-sp]\n"
      "  [--micro-batch N] [--seq N] [--micro-batches N] [--grad fp32|bf16|int8]\n"
      "  [--optim fp32|int8] [--bucket N] [--reserved-gib X] [--recompute none|uniform|block]\n"
      "  [--recompute-layers N] [--recompute-modules LIST] [--budget-gib X]\n"
      "  [--sensitivity KIND[@LAYER]=W]...\n"
      "  [--outlier KIND=K]... [--fit-recompute] [--recompute-options]\n"
      "  [--max-recompute-overhead PCT] [--verbose] [--json]\n"
      "--vp N > 1 runs Megatron's interleaved schedule: by default Megatron-Core's, in groups of\n"
      "--vp-group micro-batches (its microbatch_group_size_per_vp_stage; default pp), which\n"
      "needs pp <= group <= micro-batches and micro-batches mod group either 0 or >= pp;\n"
      "--vp-rules legacy follows older Megatron-LM (micro-batches a multiple of pp, every\n"
      "forward first when they equal pp). --micro-batches 0 (default) fills the pipeline.\n"
      "--first-stage-layers and --last-stage-layers N give the first (last) pipeline stage N\n"
      "layers, the other stages an even share of the rest (Megatron-Core's\n"
      "--decoder-first/last-pipeline-num-layers; default 0: an even split).\n"
      "--account-for-embedding and --account-for-loss count the embedding (the loss) as a\n"
      "layer in the even split, one layer fewer in the first stage's first model chunk (the\n"
      "last stage's last): Megatron-Core's --account-for-embedding/loss-in-pipeline-split.\n"
      "--pipeline-layout TEXT gives every model chunk its layers, as Megatron-Core's\n"
      "--pipeline-model-parallel-layout: chunks in round order separated by '|', 'E' the\n"
      "embedding, 't' a layer, 'L' the loss, X*n and (...)*n repeated, e.g. Et*7|(t*8|)*14,t*7L;\n"
      "--vp is its chunks / pp. It excludes the three options above.\n"
      "The transient column is the working memory at the peak: the largest layer (or output\n"
      "head) backward phase, gradient staging and 8-bit reduction buffers of one --bucket of\n"
      "parameters (default 0: Megatron-Core's max(40M, 1M dp cp)), and --reserved-gib (default\n"
      "1) for the CUDA context, GEMM workspaces and NCCL; --verbose splits it.\n"
      "--experts N (with --experts-per-token K and --expert-ffn F, and --ffn 0) makes every\n"
      "layer's MLP a mixture of N SwiGLU experts of width F, K a token (llama or qwen3 style;\n"
      "routing balanced, no token dropped). --ep N spreads the experts over N ranks, --etp N\n"
      "splits each over N (default: tp), as Megatron-Core's expert model/tensor parallel\n"
      "sizes; ep x etp divides tp x cp x dp, the rest is the experts' data parallelism, which\n"
      "ZeRO shards their states over. Under tp > 1 it needs --sp. --expert-capacity-factor X\n"
      "gives each expert exactly ceil(X x its mean) of a rank's pairs (Megatron-Core's\n"
      "--moe-expert-capacity-factor, padded to capacity; default 0: dropless, the mean).\n"
      "--shared-expert-ffn N adds shared experts: a SwiGLU MLP of width N (all of them\n"
      "together) every token passes through beside its routed experts, split over tp as a\n"
      "dense MLP (Megatron-Core's --moe-shared-expert-intermediate-size); --shared-expert-gate\n"
      "scales their output by a per-token sigmoid gate (Qwen2-MoE).\n"
      "--cp N is context parallelism: each sequence split over N ranks (seq / N tokens a rank,\n"
      "seq a multiple of 2N), with ring attention's buffers in the transient memory; ZeRO and\n"
      "the gradient reduction run over dp x cp ranks.\n"
      "--recompute uniform|block with --recompute-layers N is Megatron's full activation\n"
      "recomputation (recompute_method, recompute_num_layers; per model chunk): uniform, every\n"
      "layer in checkpoints of N; block, the first N layers, one checkpoint each. A recomputed\n"
      "layer keeps its checkpoint's input; its largest checkpoint's tensors, saved again in its\n"
      "backward, are transient; the plan keeps them in bf16 and shows them as 'recomputed'.\n"
      "--recompute-modules LIST (comma-separated: core_attn, layernorm, mlp; a\n"
      "mixture-of-experts model's moe_act, moe, shared_experts in place of mlp) is Megatron's\n"
      "selective recomputation (--recompute-granularity selective): in every layer those\n"
      "modules' outputs are not kept but computed again in the backward (core_attn the\n"
      "logsumexp; layernorm qkv_input and mlp_input, GPT fc1_input; mlp the MLP's inner\n"
      "tensors; moe_act the experts' SwiGLU output; moe all of the MoE MLP's; shared_experts\n"
      "the shared experts'). The plan shows them as 'recomputed': bf16 in the layer's working\n"
      "memory, with the error of the kept tensors they are computed from. It excludes\n"
      "--recompute.\n"
      "--fit-recompute (with --budget-gib) prints the fewest layers of each model chunk that\n"
      "block recomputation must recompute for the baseline and for AGoQ to fit the budget; it\n"
      "tries full recomputation alone, in place of --recompute and --recompute-modules.\n"
      "--recompute-options (with --budget-gib) plans AGoQ with each set of the model's recompute\n"
      "modules (8 for a dense model) and each full recomputation (block N for N below the\n"
      "layers of the largest model chunk, uniform N up to them) and prints, for each, the share\n"
      "of a step's matrix FLOPs it adds, its peak and the plan's modelled error (or by how much\n"
      "it falls short), and the one of least error among those adding at most\n"
      "--max-recompute-overhead percent (default 100), then the baseline's recomputation of\n"
      "least overhead that fits the budget.\n"
      "--sensitivity and --outlier set one saved tensor kind's weight in the planner's\n"
      "objective and its outlier factor (docs/activations.md section 3; measured sensitivities:\n"
      "examples/pytorch/sensitivity.py --plan-config); KIND@LAYER=W weighs one layer's tensor\n"
      "alone. Repeat them for more kinds and layers.\n"
      "A config file holds the same keys as key=value lines (sp=1, verbose=1; # comments).");
  std::string names;
  for (act::model_preset const& p : act::model_presets)
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  std::printf("--preset NAME takes a published shape (the shape flags after it change it):\n%s.\n",
              names.c_str());
  std::puts(
      "--hf-config FILE takes the shape of a Hugging Face config.json (model_type llama,\n"
      "mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe or gpt2;\n"
      "the shape flags after it change it).\n"
      "--style qwen3 is\n"
      "LLaMA's block with QK-norm (Qwen3), which keeps Q and K before it for its backward;\n"
      "--style gemma2 LLaMA's with GeGLU and a norm on each sub-block's output (Gemma 2),\n"
      "which keeps those outputs; gemma3 the same with QK-norm (Gemma 3).");
}

/// The whole of v read by `read` (std::stoll or std::stod), or an error naming the key.
template <class Read>
auto parse_whole(std::string const& key, std::string const& v, char const* what, Read read) {
  std::size_t used = 0;
  try {
    auto const x = read(v, &used);
    if (used == v.size()) return x;
  } catch (std::logic_error const&) {  // std::invalid_argument, std::out_of_range
  }
  throw std::invalid_argument(std::string("bad ") + what + " for " + key + ": '" + v + "'");
}

std::int64_t to_int(std::string const& key, std::string const& v) {
  return parse_whole(key, v, "integer",
                     [](std::string const& s, std::size_t* used) { return std::stoll(s, used); });
}

double to_number(std::string const& key, std::string const& v) {
  return parse_whole(key, v, "number",
                     [](std::string const& s, std::size_t* used) { return std::stod(s, used); });
}

/// A finite number of GiB below 2^32 from v: above 0 where `positive`, else at least 0.
double to_gib(std::string const& key, std::string const& v, bool positive) {
  double const x = to_number(key, v);
  if (!std::isfinite(x) || x < 0.0 || (positive && x == 0.0) || x >= 0x1p32) {
    throw std::invalid_argument(key + " must be a number of GiB " +
                                (positive ? "above 0" : "of at least 0") +
                                " and below 2^32, got '" + v + "'");
  }
  return x;
}

/// KIND=X or, where `per_layer`, KIND@LAYER=X from v.
struct kind_value {
  act::tensor_kind kind;
  std::optional<std::int64_t> layer;  ///< none: every layer
  double value;
};

/// v read as a kind_value, or an error naming the key and the form it takes.
kind_value read_kind_value(std::string const& key, std::string const& v, bool per_layer) {
  std::string const form = per_layer ? "KIND=X or KIND@LAYER=X" : "KIND=X";
  auto const eq = v.find('=');
  if (eq == std::string::npos)
    throw std::invalid_argument(key + " is " + form + ", got '" + v + "'");
  std::string name = v.substr(0, eq);
  std::optional<std::int64_t> layer;
  if (auto const at = name.find('@'); at != std::string::npos) {
    if (!per_layer) throw std::invalid_argument(key + " is " + form + ", got '" + v + "'");
    layer = to_int(key, name.substr(at + 1));
    name.resize(at);
  }
  return {act::tensor_kind_named(name), layer, to_number(key, v.substr(eq + 1))};
}

/// The modules of a comma-separated list of recompute_module_names (replacing any set before);
/// an empty item or an unknown name is an error naming it (add_recompute_module).
act::recompute_modules read_recompute_modules(std::string const& v) {
  act::recompute_modules r;
  std::size_t begin = 0;
  for (;;) {
    std::size_t const comma = v.find(',', begin);
    act::add_recompute_module(r, std::string_view(v).substr(begin, comma - begin));
    if (comma == std::string::npos) return r;
    begin = comma + 1;
  }
}

void apply(options& o, std::string const& key, std::string const& v) {
  if (key == "preset") {
    o.model = act::preset_model(v);
  } else if (key == "hf-config") {
    std::ifstream in(v, std::ios::binary);
    if (!in) throw std::invalid_argument("cannot open hf-config file '" + v + "'");
    std::string const text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    o.model = act::model_from_hf_config(text);
  } else if (key == "style") {
    o.model.style = act::block_style_named(v);
  } else if (key == "layers") {
    o.model.layers = to_int(key, v);
  } else if (key == "hidden") {
    o.model.hidden = to_int(key, v);
  } else if (key == "ffn") {
    o.model.ffn = to_int(key, v);
  } else if (key == "heads") {
    o.model.heads = to_int(key, v);
  } else if (key == "kv-heads") {
    o.model.kv_heads = to_int(key, v);
  } else if (key == "head-dim") {
    o.model.head_dim = to_int(key, v);
  } else if (key == "vocab") {
    o.model.vocab = to_int(key, v);
  } else if (key == "experts") {
    o.model.experts = to_int(key, v);
  } else if (key == "experts-per-token") {
    o.model.experts_per_token = to_int(key, v);
  } else if (key == "expert-ffn") {
    o.model.expert_ffn = to_int(key, v);
  } else if (key == "shared-expert-ffn") {
    o.model.shared_expert_ffn = to_int(key, v);
  } else if (key == "shared-expert-gate") {
    o.model.shared_expert_gate = v != "0";
  } else if (key == "ep") {
    o.parallel.ep = to_int(key, v);
  } else if (key == "etp") {
    o.parallel.etp = to_int(key, v);
  } else if (key == "expert-capacity-factor") {
    o.step.expert_capacity_factor = to_number(key, v);
  } else if (key == "tp") {
    o.parallel.tp = to_int(key, v);
  } else if (key == "pp") {
    o.parallel.pp = to_int(key, v);
  } else if (key == "vp") {
    o.parallel.virtual_stages = to_int(key, v);
  } else if (key == "vp-group") {
    o.parallel.vp_group = to_int(key, v);
  } else if (key == "vp-rules") {
    o.parallel.vp_rules = v == "core"     ? act::interleaved_rules::megatron_core
                          : v == "legacy" ? act::interleaved_rules::megatron_legacy
                                          : throw std::invalid_argument("vp-rules: core|legacy");
  } else if (key == "first-stage-layers") {
    o.parallel.first_stage_layers = to_int(key, v);
  } else if (key == "last-stage-layers") {
    o.parallel.last_stage_layers = to_int(key, v);
  } else if (key == "account-for-embedding") {
    o.parallel.account_for_embedding = v != "0";
  } else if (key == "account-for-loss") {
    o.parallel.account_for_loss = v != "0";
  } else if (key == "pipeline-layout") {
    o.pipeline_layout = v;  // read once pp is known (use_pipeline_layout)
  } else if (key == "dp") {
    o.parallel.dp = to_int(key, v);
  } else if (key == "cp") {
    o.parallel.cp = to_int(key, v);
  } else if (key == "zero") {
    std::int64_t const stage = to_int(key, v);
    if (stage < 0 || stage > 3) throw std::invalid_argument("zero is 0, 1, 2 or 3, got " + v);
    o.parallel.zero_stage = static_cast<int>(stage);
  } else if (key == "sp") {
    o.parallel.sp = v != "0";
  } else if (key == "micro-batch") {
    o.step.micro_batch = to_int(key, v);
  } else if (key == "seq") {
    o.step.seq = to_int(key, v);
  } else if (key == "micro-batches") {
    o.step.micro_batches = to_int(key, v);
  } else if (key == "grad") {
    o.agoq_states.gradients = v == "fp32"   ? act::gradient_format::fp32
                              : v == "bf16" ? act::gradient_format::bf16
                              : v == "int8" ? act::gradient_format::int8_g128
                                            : throw std::invalid_argument("grad: fp32|bf16|int8");
  } else if (key == "optim") {
    o.agoq_states.optimizer = v == "fp32"   ? act::optimizer_format::fp32
                              : v == "int8" ? act::optimizer_format::int8_g128
                                            : throw std::invalid_argument("optim: fp32|int8");
  } else if (key == "bucket") {
    o.step.bucket_parameters = to_int(key, v);
  } else if (key == "reserved-gib") {
    o.step.reserved_bytes = static_cast<std::int64_t>(to_gib(key, v, false) * gib);
  } else if (key == "recompute") {
    o.step.recompute = v == "none"      ? act::recompute_method::none
                       : v == "uniform" ? act::recompute_method::uniform
                       : v == "block"
                           ? act::recompute_method::block
                           : throw std::invalid_argument("recompute: none|uniform|block");
  } else if (key == "recompute-layers") {
    o.step.recompute_layers = to_int(key, v);
  } else if (key == "recompute-modules") {
    o.step.selective = read_recompute_modules(v);
  } else if (key == "budget-gib") {
    o.budget_gib = to_gib(key, v, true);
  } else if (key == "sensitivity") {
    auto const [k, layer, w] = read_kind_value(key, v, true);
    if (layer) {
      o.errors.set_sensitivity(*layer, k, w);
    } else {
      o.errors.set_sensitivity(k, w);
    }
  } else if (key == "outlier") {
    kind_value const kv = read_kind_value(key, v, false);
    o.errors.set_outlier(kv.kind, kv.value);
  } else if (key == "verbose") {
    o.verbose = v != "0";
  } else if (key == "json") {
    o.json = v != "0";
  } else if (key == "fit-recompute") {
    o.fit_recompute = v != "0";
  } else if (key == "recompute-options") {
    o.recompute_options = v != "0";
  } else if (key == "max-recompute-overhead") {
    double const pct = to_number(key, v);
    if (!std::isfinite(pct) || pct < 0.0)
      throw std::invalid_argument(key + " must be a finite percentage of at least 0, got '" + v +
                                  "'");
    o.max_recompute_overhead = pct / 100.0;
  } else {
    throw std::invalid_argument("unknown key '" + key + "'");
  }
}

void read_config(options& o, std::string const& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open config file '" + path + "'");
  std::string line;
  while (std::getline(in, line)) {
    if (auto const hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    auto const trim = [](std::string s) {
      auto const b = s.find_first_not_of(" \t\r");
      auto const e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    auto const eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("config line without '=': " + line);
    apply(o, trim(line.substr(0, eq)), trim(line.substr(eq + 1)));
  }
}

double g(std::int64_t bytes) { return static_cast<double>(bytes) / gib; }

/// The distinct values of f(stage, chunk) over the model chunks of p, in increasing order, as
/// text: "8", "7 or 8", "1, 2 or 3".
template <class F>
std::string chunk_values(act::parallel_config const& p, F&& f) {
  std::set<std::int64_t> values;
  for (std::int64_t s = 0; s < p.pp; ++s)
    for (std::int64_t c = 0; c < p.virtual_stages; ++c) values.insert(f(s, c));
  std::string out;
  for (auto it = values.begin(); it != values.end(); ++it) {
    if (it != values.begin()) out += std::next(it) == values.end() ? " or " : ", ";
    out += std::to_string(*it);
  }
  return out;
}

/// The layers of each pipeline stage of p, runs of equal counts shortened: "7, 14 x 8, 7".
std::string stage_layout(act::model_shape const& m, act::parallel_config const& p) {
  std::string out;
  for (std::int64_t s = 0; s < p.pp;) {
    std::int64_t const n = p.stage_layers(m, s);
    std::int64_t run = 1;
    while (s + run < p.pp && p.stage_layers(m, s + run) == n) ++run;
    out += (out.empty() ? "" : ", ") + (run > 1 ? std::to_string(run) + " x " : "") +
           std::to_string(n);
    s += run;
  }
  return out;
}

/// The shortfall in GiB, said as the tool says it (the library's budget_shortfall::message() is
/// in bytes).
std::string shortfall_text(act::budget_shortfall const& s) {
  char text[512];
  std::snprintf(text, sizeof text,
                "no plan fits the budget of %.2f GiB per GPU: pipeline stage %lld needs %.2f GiB "
                "more (%.2f GiB: %.2f of weights, gradients and optimizer states, %.2f of "
                "transient working memory and %.2f of activations with every saved tensor at its "
                "smallest candidate)",
                g(s.budget_bytes), static_cast<long long>(s.stage), g(s.bytes()), g(s.need.total()),
                g(s.need.states()), g(s.need.transient()),
                g(s.need.activations + s.need.head_activations));
  return text;
}

void print_table(options const& o, char const* title,
                 std::vector<act::stage_memory> const& stages) {
  std::printf("\n%s (GiB per GPU)\n", title);
  std::printf("%6s %6s %9s %8s %8s %8s %8s %8s %11s %8s %9s %8s\n", "stage", "layers", "in-flight",
              "weights", "master", "grads", "optim", "gathered", "activations", "head", "transient",
              "total");
  for (auto const& s : stages) {
    std::string flight;
    for (std::size_t i = 0; i < s.in_flight.size(); ++i)
      flight += (i ? "," : "") + std::to_string(s.in_flight[i]);
    std::printf("%6lld %6lld %9s %8.2f %8.2f %8.2f %8.2f %8.2f %11.2f %8.2f %9.2f %8.2f\n",
                static_cast<long long>(s.stage), static_cast<long long>(s.layers), flight.c_str(),
                g(s.weights), g(s.master_weights), g(s.gradients), g(s.optimizer),
                g(s.gathered_weights), g(s.activations), g(s.head_activations), g(s.transient()),
                g(s.total()));
  }
  std::printf("%6s %6s %9s %8s %8s %8s %8s %8s %11s %8s %9s %8.2f\n", "peak", "", "", "", "", "",
              "", "", "", "", "", g(act::peak_total(stages)));
  if (!o.verbose) return;
  std::printf(
      "transient: working (layer or head backward) + gradient buffers + reserved + recompute\n");
  for (auto const& s : stages)
    std::printf("%6lld %8.3f + %8.3f + %8.3f + %8.3f\n", static_cast<long long>(s.stage),
                g(s.working), g(s.gradient_buffers), g(s.reserved), g(s.recompute));
}

/// A planned tensor's storage by name ("bf16" or "fp32" where kept precise: precise_bytes_of).
std::string storage_name(act::planned_tensor const& t) {
  return t.choice.name(act::precise_bytes_of(t.kind));
}

/// What the plan's text shows of a tensor: "recomputed", or its storage_name.
std::string shown_name(act::planned_tensor const& t) {
  return t.recomputed ? "recomputed" : storage_name(t);
}

/// The layers of a model chunk, as chunk_values gives them ("8", "7 or 8").
std::string chunk_sizes(options const& o) {
  return chunk_values(o.parallel, [&](std::int64_t s, std::int64_t c) {
    return o.parallel.chunk_layers(o.model, s, c);
  });
}

void print_recompute_options(options const& o, recompute_choice const& choice) {
  int width = 26;  // the names' column: the longest name (a mixture-of-experts model's are longer)
  for (act::recompute_option const& c : choice.options)
    width = std::max(width, static_cast<int>(act::name_of(c).size()));
  std::printf(
      "\nrecomputation within %.2f GiB per GPU (agoq): each set of modules (selective) and each\n"
      "full recomputation (block/uniform N: N layers of each model chunk of %s), with the\n"
      "share of a step's matrix FLOPs it adds (layernorm's norms add none: a read of their\n"
      "inputs):\n%-*s %9s %9s %12s\n",
      o.budget_gib, chunk_sizes(o).c_str(), width, "recompute", "FLOPs", "peak GiB", "plan error");
  for (act::recompute_option const& c : choice.options) {
    std::string const name = act::name_of(c);
    if (c.fits) {
      std::printf("%-*s %+8.1f%% %9.2f %12.4g\n", width, name.c_str(), 100.0 * c.overhead,
                  g(c.peak_bytes), c.error);
    } else {
      std::printf("%-*s %+8.1f%% %9.2f   falls short by %.2f GiB\n", width, name.c_str(),
                  100.0 * c.overhead, g(c.peak_bytes), g(c.peak_bytes) - o.budget_gib);
    }
  }
  if (choice.least_error) {
    act::recompute_option const& c = *choice.least_error;
    std::printf("least error adding at most %.1f%%: %s (%+.1f%%, error %.4g)\n",
                100.0 * o.max_recompute_overhead, act::name_of(c).c_str(), 100.0 * c.overhead,
                c.error);
  } else {
    std::printf("least error adding at most %.1f%%: none fits\n", 100.0 * o.max_recompute_overhead);
  }
  if (choice.baseline) {
    std::printf(
        "baseline (bf16 activations, fp32 gradients and Adam): least recomputation that fits: %s "
        "(%+.1f%%, peak %.2f GiB)\n",
        act::name_of(*choice.baseline).c_str(), 100.0 * choice.baseline->overhead,
        g(choice.baseline->peak_bytes));
  } else {
    std::printf("baseline (bf16 activations, fp32 gradients and Adam): no recomputation fits\n");
  }
}

void print_plan(options const& o, act::activation_plan const& plan) {
  std::printf("\nplan for a budget of %.2f GiB per GPU\n", g(plan.budget_bytes()));
  std::printf("error model, kind sensitivity/outlier:");
  for (act::tensor_kind const k : o.model.saved_tensors()) {
    if (!act::is_alias(k))
      std::printf(" %s %g/%g", std::string(act::name_of(k)).c_str(), o.errors.sensitivity(k),
                  o.errors.outlier(k));
  }
  std::printf("\n");
  if (!o.errors.layer_sensitivities().empty()) {
    std::printf("sensitivity per layer, kind@layer:");
    for (auto const& [at, w] : o.errors.layer_sensitivities())
      std::printf(" %s@%lld %g", std::string(act::name_of(at.second)).c_str(),
                  static_cast<long long>(at.first), w);
    std::printf("\n");
  }
  for (auto const& s : plan.stages()) {
    std::printf(
        "stage %lld: total %.2f GiB (activations %.2f, transient %.2f), unused %.2f GiB, "
        "error %.4g (optimum >= %.4g)\n",
        static_cast<long long>(s.memory.stage), g(s.memory.total()), g(s.memory.activations),
        g(s.memory.transient()), g(s.unused_bytes), s.error, s.error_lower_bound);
    // Per kind: the layers holding each choice, as runs.
    for (act::tensor_kind const k : o.model.saved_tensors()) {
      if (act::is_alias(k)) continue;
      std::string line;
      std::string run_name;
      std::int64_t run_first = -1;
      std::int64_t run_last = -1;
      auto flush = [&] {
        if (run_first < 0) return;
        line += " " + run_name + "[" + std::to_string(run_first) +
                (run_last > run_first ? "-" + std::to_string(run_last) : "") + "]";
      };
      for (auto const& t : s.tensors) {
        if (t.kind != k) continue;
        std::string const name = shown_name(t);
        if (name == run_name && t.layer == run_last + 1) {
          run_last = t.layer;
        } else {
          flush();
          run_name = name;
          run_first = run_last = t.layer;
        }
      }
      flush();
      std::printf("  %-17s%s\n", std::string(act::name_of(k)).c_str(), line.c_str());
    }
    if (o.verbose) {
      for (auto const& t : s.tensors)
        std::printf("    layer %3lld %-17s %-22s %10.2f MiB x %lld  error %.4g\n",
                    static_cast<long long>(t.layer), std::string(act::name_of(t.kind)).c_str(),
                    shown_name(t).c_str(), static_cast<double>(t.bytes) / (1024.0 * 1024.0),
                    static_cast<long long>(t.in_flight), t.error);
    }
  }
}

// --json: one JSON document holding what the tables and the plan show, in bytes.

/// s as a JSON string (s is one of agoq's names: no control characters to escape).
std::string json_string(std::string_view s) {
  std::string r = "\"";
  for (char const c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

std::string json_number(std::int64_t x) { return std::to_string(x); }

/// A double to 17 significant digits (read back exactly), null where it is not finite.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

std::string json_bool(bool x) { return x ? "true" : "false"; }

/// {"key": value, ...} from keys and values already written as JSON.
std::string json_object(std::vector<std::pair<std::string_view, std::string>> const& fields) {
  std::string r = "{";
  for (auto const& [k, v] : fields) r += (r.size() > 1 ? ", " : "") + json_string(k) + ": " + v;
  return r + "}";
}

/// [value, ...] from values already written as JSON.
std::string json_array(std::vector<std::string> const& items) {
  std::string r = "[";
  for (auto const& v : items) r += (r.size() > 1 ? ", " : "") + v;
  return r + "]";
}

/// ["name", ...] of `r`'s modules ([] for none).
std::string json_modules(act::recompute_modules const& r) {
  std::vector<std::string> names;
  for (std::string_view const n : act::names_of(r)) names.push_back(json_string(n));
  return json_array(names);
}

std::string json_stage(act::stage_memory const& s) {
  std::vector<std::string> flight;
  for (std::int64_t f : s.in_flight) flight.push_back(json_number(f));
  return json_object({{"stage", json_number(s.stage)},
                      {"layers", json_number(s.layers)},
                      {"in_flight", json_array(flight)},
                      {"parameters", json_number(s.parameters)},
                      {"weights", json_number(s.weights)},
                      {"master_weights", json_number(s.master_weights)},
                      {"gradients", json_number(s.gradients)},
                      {"optimizer", json_number(s.optimizer)},
                      {"gathered_weights", json_number(s.gathered_weights)},
                      {"activations", json_number(s.activations)},
                      {"head_activations", json_number(s.head_activations)},
                      {"working", json_number(s.working)},
                      {"gradient_buffers", json_number(s.gradient_buffers)},
                      {"reserved", json_number(s.reserved)},
                      {"recompute", json_number(s.recompute)},
                      {"transient", json_number(s.transient())},
                      {"total", json_number(s.total())}});
}

std::string json_stages(std::vector<act::stage_memory> const& stages) {
  std::vector<std::string> r;
  for (auto const& s : stages) r.push_back(json_stage(s));
  return json_array(r);
}

std::string json_plan(act::activation_plan const& plan) {
  std::vector<std::string> stages;
  for (auto const& s : plan.stages()) {
    std::vector<std::string> tensors;
    for (auto const& t : s.tensors) {
      tensors.push_back(json_object({{"layer", json_number(t.layer)},
                                     {"kind", json_string(act::name_of(t.kind))},
                                     {"storage", json_string(storage_name(t))},
                                     {"bytes", json_number(t.bytes)},
                                     {"in_flight", json_number(t.in_flight)},
                                     {"error", json_number(t.error)},
                                     {"recomputed", json_bool(t.recomputed)}}));
    }
    stages.push_back(json_object({{"memory", json_stage(s.memory)},
                                  {"unused_bytes", json_number(s.unused_bytes)},
                                  {"error", json_number(s.error)},
                                  {"error_lower_bound", json_number(s.error_lower_bound)},
                                  {"tensors", json_array(tensors)}}));
  }
  return json_object(
      {{"budget_bytes", json_number(plan.budget_bytes())}, {"stages", json_array(stages)}});
}

/// {kind: {"sensitivity": w, "outlier": k}} of the block's saved kinds (aliases left out), and
/// "per_layer": [{"layer", "kind", "sensitivity"}] of the weights set per layer.
std::string json_error_model(options const& o) {
  std::vector<std::pair<std::string_view, std::string>> kinds;
  for (act::tensor_kind const k : o.model.saved_tensors()) {
    if (act::is_alias(k)) continue;
    kinds.emplace_back(act::name_of(k),
                       json_object({{"sensitivity", json_number(o.errors.sensitivity(k))},
                                    {"outlier", json_number(o.errors.outlier(k))}}));
  }
  std::vector<std::string> layers;
  for (auto const& [at, w] : o.errors.layer_sensitivities()) {
    layers.push_back(json_object({{"layer", json_number(at.first)},
                                  {"kind", json_string(act::name_of(at.second))},
                                  {"sensitivity", json_number(w)}}));
  }
  kinds.emplace_back("per_layer", json_array(layers));
  return json_object(kinds);
}

void print_json(options const& o, std::vector<act::stage_memory> const& baseline,
                std::vector<act::stage_memory> const& agoq, act::activation_plan const* plan,
                recompute_fit const& fit, recompute_choice const& choice,
                std::string const& plan_error) {
  act::model_shape const& m = o.model;
  act::parallel_config const& p = o.parallel;
  std::vector<std::string> layout;  // the layers of each model chunk, where given
  for (std::int64_t const n : p.pipeline_layout) layout.push_back(json_number(n));
  std::vector<std::pair<std::string_view, std::string>> doc = {
      {"model", json_object({{"style", json_string(act::name_of(m.style))},
                             {"layers", json_number(m.layers)},
                             {"hidden", json_number(m.hidden)},
                             {"ffn", json_number(m.ffn)},
                             {"heads", json_number(m.heads)},
                             {"kv_heads", json_number(m.kv_heads)},
                             {"head_dim", json_number(m.head_size())},
                             {"vocab", json_number(m.vocab)},
                             {"tied_embeddings", json_bool(m.tied_embeddings)},
                             {"experts", json_number(m.experts)},
                             {"experts_per_token", json_number(m.experts_per_token)},
                             {"expert_ffn", json_number(m.expert_ffn)},
                             {"shared_expert_ffn", json_number(m.shared_expert_ffn)},
                             {"shared_expert_gate", json_bool(m.shared_expert_gate)}})},
      {"parallel", json_object({{"tp", json_number(p.tp)},
                                {"pp", json_number(p.pp)},
                                {"vp", json_number(p.virtual_stages)},
                                {"vp_group", json_number(p.vp_group > 0 ? p.vp_group : p.pp)},
                                {"vp_rules", json_string(act::name_of(p.vp_rules))},
                                {"first_stage_layers", json_number(p.first_stage_layers)},
                                {"last_stage_layers", json_number(p.last_stage_layers)},
                                {"account_for_embedding", json_bool(p.account_for_embedding)},
                                {"account_for_loss", json_bool(p.account_for_loss)},
                                {"pipeline_layout", json_array(layout)},
                                {"dp", json_number(p.dp)},
                                {"cp", json_number(p.cp)},
                                {"zero", json_number(std::int64_t{p.zero_stage})},
                                {"sp", json_bool(p.sp)},
                                {"ep", json_number(p.ep)},
                                {"etp", json_number(m.moe() ? p.expert_tp() : 0)}})},
      {"step",
       json_object({{"micro_batch", json_number(o.step.micro_batch)},
                    {"seq", json_number(o.step.seq)},
                    {"micro_batches", json_number(o.step.micro_batches)},
                    {"bucket_parameters", json_number(o.step.bucket_parameters)},
                    {"reserved_bytes", json_number(o.step.reserved_bytes)},
                    {"recompute", json_string(act::name_of(o.step.recompute))},
                    {"recompute_layers", json_number(o.step.recompute_layers)},
                    {"recompute_modules", json_modules(o.step.selective)},
                    {"expert_capacity_factor", json_number(o.step.expert_capacity_factor)}})},
      {"agoq_states",
       json_object({{"gradients", json_string(act::name_of(o.agoq_states.gradients))},
                    {"optimizer", json_string(act::name_of(o.agoq_states.optimizer))}})},
      {"error_model", json_error_model(o)},
      {"baseline", json_stages(baseline)},
      {"agoq", json_stages(agoq)},
      {"peak_bytes", json_object({{"baseline", json_number(act::peak_total(baseline))},
                                  {"agoq", json_number(act::peak_total(agoq))}})},
      {"saving", json_number(1.0 - static_cast<double>(act::peak_total(agoq)) /
                                       static_cast<double>(act::peak_total(baseline)))}};
  if (plan != nullptr) doc.emplace_back("plan", json_plan(*plan));
  if (!plan_error.empty()) doc.emplace_back("plan_error", json_string(plan_error));
  if (fit.asked) {
    auto const layers = [](std::optional<std::int64_t> n) {
      return n ? json_number(*n) : std::string("null");
    };
    doc.emplace_back("fit_recompute",
                     json_object({{"baseline", layers(fit.baseline)}, {"agoq", layers(fit.agoq)}}));
  }
  if (choice.asked) {
    auto const option = [](act::recompute_option const& c) {
      return json_object({{"recompute", json_string(act::name_of(c.method))},
                          {"recompute_layers", json_number(c.layers)},
                          {"modules", json_modules(c.modules)},
                          {"overhead", json_number(c.overhead)},
                          {"fits", json_bool(c.fits)},
                          {"error", json_number(c.error)},
                          {"peak_bytes", json_number(c.peak_bytes)}});
    };
    std::vector<std::string> options;
    for (act::recompute_option const& c : choice.options) options.push_back(option(c));
    doc.emplace_back(
        "recompute_options",
        json_object({{"max_overhead", json_number(o.max_recompute_overhead)},
                     {"options", json_array(options)},
                     {"baseline", choice.baseline ? option(*choice.baseline) : std::string("null")},
                     {"least_error",
                      choice.least_error ? option(*choice.least_error) : std::string("null")}}));
  }
  std::printf("%s\n", json_object(doc).c_str());
}

/// The tables, then what was asked besides, as text.
void print_text(options const& o, std::vector<act::stage_memory> const& baseline,
                std::vector<act::stage_memory> const& agoq, act::activation_plan const* planned,
                recompute_fit const& fit, recompute_choice const& choice,
                std::string const& plan_error) {
  act::model_shape const& m = o.model;
  act::parallel_config const& p = o.parallel;
  std::printf(
      "model: %s, %lld layers, hidden %lld, ffn %lld, heads %lld, kv_heads %lld, "
      "head_dim %lld, vocab %lld\n",
      std::string(act::name_of(m.style)).c_str(), static_cast<long long>(m.layers),
      static_cast<long long>(m.hidden), static_cast<long long>(m.ffn),
      static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads),
      static_cast<long long>(m.head_size()), static_cast<long long>(m.vocab));
  if (m.moe()) {
    std::printf(
        "experts: %lld of ffn %lld, %lld a token; ep %lld, etp %lld (expert data parallel "
        "%lld)",
        static_cast<long long>(m.experts), static_cast<long long>(m.expert_ffn),
        static_cast<long long>(m.experts_per_token), static_cast<long long>(p.ep),
        static_cast<long long>(p.expert_tp()), static_cast<long long>(p.expert_gradient_ranks()));
    if (o.step.expert_capacity_factor > 0)
      std::printf(", capacity factor %g", o.step.expert_capacity_factor);
    if (m.shared_expert_ffn > 0)
      std::printf("; shared experts of ffn %lld%s", static_cast<long long>(m.shared_expert_ffn),
                  m.shared_expert_gate ? ", gated" : "");
    std::puts("");
  }
  std::string schedule = p.virtual_stages == 1
                             ? "1F1B"
                             : "interleaved, v = " + std::to_string(p.virtual_stages) + ", " +
                                   act::name_of(p.vp_rules) + ", groups of " +
                                   std::to_string(p.vp_group > 0 ? p.vp_group : p.pp);
  if (p.uneven() || p.account_for_embedding || p.account_for_loss || !o.pipeline_layout.empty())
    schedule += "; layers " + stage_layout(m, p);
  if (!o.pipeline_layout.empty()) schedule += ", layout " + o.pipeline_layout;
  if (p.account_for_embedding || p.account_for_loss)
    schedule += std::string(", the ") +
                (p.account_for_embedding && p.account_for_loss ? "embedding and the loss"
                 : p.account_for_embedding                     ? "embedding"
                                                               : "loss") +
                " counted in the split";
  std::printf(
      "parallel: tp %lld, pp %lld (%s), dp %lld%s, ZeRO-%d, sp %s; micro-batch %lld x seq "
      "%lld, micro-batches %s\n",
      static_cast<long long>(p.tp), static_cast<long long>(p.pp), schedule.c_str(),
      static_cast<long long>(p.dp), p.cp > 1 ? (", cp " + std::to_string(p.cp)).c_str() : "",
      p.zero_stage, p.sp ? "on" : "off", static_cast<long long>(o.step.micro_batch),
      static_cast<long long>(o.step.seq),
      o.step.micro_batches > 0 ? std::to_string(o.step.micro_batches).c_str()
                               : "fill the pipeline");
  if (o.step.recompute != act::recompute_method::none)
    std::printf(
        "recompute: %s, %lld layer%s a checkpoint, %s of each model chunk's %s\n",
        act::name_of(o.step.recompute).c_str(),
        static_cast<long long>(
            o.step.recompute == act::recompute_method::uniform ? o.step.recompute_layers : 1),
        o.step.recompute == act::recompute_method::uniform && o.step.recompute_layers > 1 ? "s"
                                                                                          : "",
        chunk_values(p,
                     [&](std::int64_t s, std::int64_t c) {
                       return act::recomputed_layers(o.step, p.chunk_layers(m, s, c));
                     })
            .c_str(),
        chunk_sizes(o).c_str());
  if (o.step.selective.any()) {
    std::string kinds;
    for (act::tensor_kind const k : m.saved_tensors())
      if (act::recomputes(o.step.selective, k)) {
        kinds += ' ';
        kinds += act::name_of(k);
      }
    std::printf("recompute modules: %s (in every layer, computed again in the backward:%s)\n",
                act::name_of(o.step.selective).c_str(), kinds.c_str());
  }
  print_table(o, "baseline: bf16 activations, fp32 gradients, fp32 Adam", baseline);
  std::printf(
      "\nagoq default policy: residual int8_g128, linear/activation inputs int4_g128, "
      "attention bf16; gradients %s, Adam %s\n",
      act::name_of(o.agoq_states.gradients).c_str(), act::name_of(o.agoq_states.optimizer).c_str());
  print_table(o, "agoq", agoq);
  double const saving = 1.0 - static_cast<double>(act::peak_total(agoq)) /
                                  static_cast<double>(act::peak_total(baseline));
  std::printf("\npeak per-GPU memory: %.2f GiB -> %.2f GiB, saving %.1f%%\n",
              g(act::peak_total(baseline)), g(act::peak_total(agoq)), 100.0 * saving);
  if (fit.asked) {
    auto const layers = [](std::optional<std::int64_t> n) {
      return n ? std::to_string(*n) : std::string("none fits");
    };
    std::printf(
        "fewest layers of each model chunk's %s to recompute (block) within %.2f GiB: baseline "
        "%s, agoq %s%s\n",
        chunk_sizes(o).c_str(), o.budget_gib, layers(fit.baseline).c_str(),
        layers(fit.agoq).c_str(),
        o.step.selective.any() ? " (full recomputation alone, without the recompute modules)" : "");
  }
  if (choice.asked) print_recompute_options(o, choice);
  if (planned != nullptr) print_plan(o, *planned);
  if (choice.asked && !plan_error.empty())
    std::printf("\nthe step as given: %s\n", plan_error.c_str());
}

int run(int argc, char** argv) {
  options o;
  o.model = act::preset_model("llama3-8b");
  o.step.seq = 8192;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      return 0;
    }
    if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
    a = a.substr(2);
    if (a == "sp" || a == "verbose" || a == "json" || a == "fit-recompute" ||
        a == "recompute-options" || a == "account-for-embedding" || a == "account-for-loss" ||
        a == "shared-expert-gate") {
      apply(o, a, "1");
    } else if (a == "no-sp" || a == "no-shared-expert-gate") {
      apply(o, a.substr(3), "0");
    } else {
      if (i + 1 >= argc) throw std::invalid_argument("--" + a + " needs a value");
      std::string const v = argv[++i];
      if (a == "config") {
        read_config(o, v);
      } else {
        apply(o, a, v);
      }
    }
  }
  if (!o.pipeline_layout.empty()) o.parallel.use_pipeline_layout(o.pipeline_layout);
  o.parallel.validate(o.model);
  act::model_shape const& m = o.model;
  act::parallel_config const& p = o.parallel;
  auto const baseline =
      act::estimate_memory(m, p, o.step, act::state_formats{}, act::policy_table::all_precise());
  auto const agoq = act::estimate_memory(m, p, o.step, o.agoq_states, act::policy_table{});
  // The planner's question for AGoQ (its policy, states and error model), or for the baseline
  // (every tensor bf16, fp32 states).
  auto const input = [&](bool for_agoq) {
    act::planner_input in;
    in.model = m;
    in.parallel = p;
    in.step = o.step;
    in.budget_bytes = static_cast<std::int64_t>(o.budget_gib * gib);
    if (for_agoq) {
      in.states = o.agoq_states;
      in.errors = o.errors;
    } else {
      in.policy = act::policy_table::all_precise();
    }
    return in;
  };
  if (o.fit_recompute && o.budget_gib <= 0)
    throw std::invalid_argument("--fit-recompute needs --budget-gib");
  recompute_fit fit;
  if (o.fit_recompute) {
    fit = {true, act::least_block_recompute(input(false)), act::least_block_recompute(input(true))};
  }
  if (o.recompute_options && o.budget_gib <= 0)
    throw std::invalid_argument("--recompute-options needs --budget-gib");
  recompute_choice choice;
  if (o.recompute_options) {
    choice.asked = true;
    choice.options = act::recompute_options(input(true));
    choice.least_error = act::least_error_recompute(choice.options, o.max_recompute_overhead);
    for (act::recompute_option const& c : act::recompute_options(input(false))) {
      if (c.fits) {
        choice.baseline = c;
        break;
      }
    }
  }
  // The plan of the step as given. A budget below the least any plan needs is an answer about
  // the step, not a usage error: the tables are printed, the plan is left out, and the shortfall
  // said in GiB; the exit status is 1, but under --recompute-options, whose table is the answer.
  std::optional<act::activation_plan> planned;
  std::string plan_error;
  if (o.budget_gib > 0) {
    act::planner_input const in = input(true);
    if (auto const s = act::find_shortfall(in)) {
      plan_error = shortfall_text(*s);
    } else {
      planned = act::make_plan(in);
    }
  }
  if (o.json) {
    print_json(o, baseline, agoq, planned ? &*planned : nullptr, fit, choice, plan_error);
  } else {
    print_text(o, baseline, agoq, planned ? &*planned : nullptr, fit, choice, plan_error);
  }
  if (plan_error.empty() || choice.asked) return 0;
  std::fflush(stdout);  // the tables, then the message
  std::fprintf(stderr,
               "agoq_plan: %s; --recompute-options says which recomputation would fit, "
               "--fit-recompute how many layers of block recomputation\n",
               plan_error.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "agoq_plan: %s\n", e.what());
    usage();
    return 1;
  }
}
