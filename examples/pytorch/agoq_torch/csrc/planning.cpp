/// \file
/// The activation planner, its measured statistics and the training memory model
/// (agoq/activation/) for Python: models, policies, statistics and plans as plain dicts keyed by
/// agoq's tensor-kind names.
#include "common.hpp"

#include <agoq/activation/hf_config.hpp>

#include <array>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace agoq_torch {
namespace {

namespace py = pybind11;
namespace act = agoq::activation;

/// A storage name: "bf16", "fp32" or "precise" (kept as produced), else an agoq spec name.
act::storage storage_of(std::string const& name) {
  if (name == "fp32") return act::storage::precise();
  act::storage s = act::storage::parse(name);
  if (s.quantized) s.quantized->validate();
  return s;
}

/// A model from a dict with the keys of agoq::activation::model_shape (missing keys keep the
/// struct's defaults, which describe LLaMA-3-8B; unknown keys are an error).
act::model_shape model_of(py::dict const& d) {
  act::model_shape m;
  for (auto const& [key, value] : d) {
    auto const k = key.cast<std::string>();
    if (k == "style") {
      m.style = act::block_style_named(value.cast<std::string>());
    } else if (k == "layers") {
      m.layers = value.cast<std::int64_t>();
    } else if (k == "hidden") {
      m.hidden = value.cast<std::int64_t>();
    } else if (k == "ffn") {
      m.ffn = value.cast<std::int64_t>();
    } else if (k == "heads") {
      m.heads = value.cast<std::int64_t>();
    } else if (k == "kv_heads") {
      m.kv_heads = value.cast<std::int64_t>();
    } else if (k == "head_dim") {
      m.head_dim = value.cast<std::int64_t>();
    } else if (k == "vocab") {
      m.vocab = value.cast<std::int64_t>();
    } else if (k == "tied_embeddings") {
      m.tied_embeddings = value.cast<bool>();
    } else if (k == "experts") {
      m.experts = value.cast<std::int64_t>();
    } else if (k == "experts_per_token") {
      m.experts_per_token = value.cast<std::int64_t>();
    } else if (k == "expert_ffn") {
      m.expert_ffn = value.cast<std::int64_t>();
    } else if (k == "shared_expert_ffn") {
      m.shared_expert_ffn = value.cast<std::int64_t>();
    } else if (k == "shared_expert_gate") {
      m.shared_expert_gate = value.cast<bool>();
    } else {
      throw agoq::invalid_argument("unknown model key '" + k + "'");
    }
  }
  m.validate();
  return m;
}

/// The dict of a model (model_of's keys, every one of them).
py::dict model_dict(act::model_shape const& m) {
  py::dict d;
  d["style"] = std::string(act::name_of(m.style));
  d["layers"] = m.layers;
  d["hidden"] = m.hidden;
  d["ffn"] = m.ffn;
  d["heads"] = m.heads;
  d["kv_heads"] = m.kv_heads;
  d["head_dim"] = m.head_dim;
  d["vocab"] = m.vocab;
  d["tied_embeddings"] = m.tied_embeddings;
  d["experts"] = m.experts;
  d["experts_per_token"] = m.experts_per_token;
  d["expert_ffn"] = m.expert_ffn;
  d["shared_expert_ffn"] = m.shared_expert_ffn;
  d["shared_expert_gate"] = m.shared_expert_gate;
  return d;
}

/// {name: model} of agoq::activation::model_presets.
py::dict model_presets() {
  py::dict d;
  for (act::model_preset const& p : act::model_presets) d[py::str(p.name)] = model_dict(p.shape);
  return d;
}

/// The top-level keys of a Hugging Face config as a dict (transformers' to_dict(), json.load's):
/// None, bools, numbers and strings as they are, dicts, lists and tuples as nested values.
act::hf_config hf_config_of(py::dict const& d) {
  act::hf_config c;
  for (auto const& [key, value] : d) {
    auto const k = key.cast<std::string>();
    act::config_value v;
    if (py::isinstance<py::bool_>(value)) {
      v = act::config_value::of_bool(value.cast<bool>());
    } else if (py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value)) {
      v = act::config_value::of_number(value.cast<double>());
    } else if (py::isinstance<py::str>(value)) {
      v = act::config_value::of_string(value.cast<std::string>());
    } else if (py::isinstance<py::dict>(value) || py::isinstance<py::list>(value) ||
               py::isinstance<py::tuple>(value)) {
      v = act::config_value::of_nested(py::len(value));
    } else if (!value.is_none()) {
      throw agoq::invalid_argument("hf config: the value of '" + k +
                                   "' is not a JSON value (None, bool, number, str, dict, list)");
    }
    c.emplace(k, std::move(v));
  }
  return c;
}

/// model_from_hf_config of a config given as a dict, as an object with to_dict() (transformers'
/// configs) or as the path of a config.json or of a directory holding one (read by agoq's JSON
/// reader, as agoq_plan --hf-config reads it).
py::dict model_from_hf_config(py::object const& config) {
  if (py::isinstance<py::dict>(config))
    return model_dict(act::model_from_hf_config(hf_config_of(config)));
  if (py::hasattr(config, "to_dict")) return model_from_hf_config(config.attr("to_dict")());
  py::module_ const os = py::module_::import("os");
  auto path = os.attr("fspath")(config).cast<std::string>();
  if (os.attr("path").attr("isdir")(path).cast<bool>())
    path = os.attr("path").attr("join")(path, "config.json").cast<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw agoq::invalid_argument("hf config: cannot open '" + path + "'");
  std::string const text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return model_dict(act::model_from_hf_config(text));
}

/// A policy from {kind: (default, [candidates])}; kinds not named keep agoq's default policy.
act::policy_table policy_of(py::object const& p) {
  act::policy_table t;
  if (p.is_none()) return t;
  for (auto const& [key, value] : p.cast<py::dict>()) {
    auto const entry = value.cast<py::tuple>();
    TORCH_CHECK(entry.size() == 2, "policy: each entry is (default, [candidates])");
    std::vector<act::storage> candidates;
    for (auto const& c : entry[1].cast<py::list>())
      candidates.push_back(storage_of(c.cast<std::string>()));
    t.set(act::tensor_kind_named(key.cast<std::string>()), storage_of(entry[0].cast<std::string>()),
          candidates);
  }
  return t;
}

act::gradient_format gradient_format_of(std::string const& s) {
  if (s == "fp32") return act::gradient_format::fp32;
  if (s == "bf16") return act::gradient_format::bf16;
  if (s == "int8" || s == "int8_g128") return act::gradient_format::int8_g128;
  throw agoq::invalid_argument("gradients are 'fp32', 'bf16' or 'int8', got '" + s + "'");
}

act::optimizer_format optimizer_format_of(std::string const& s) {
  if (s == "fp32") return act::optimizer_format::fp32;
  if (s == "int8" || s == "int8_g128") return act::optimizer_format::int8_g128;
  throw agoq::invalid_argument("optimizer states are 'fp32' or 'int8', got '" + s + "'");
}

py::dict memory_dict(act::stage_memory const& s) {
  py::dict d;
  d["stage"] = s.stage;
  d["layers"] = s.layers;
  d["parameters"] = s.parameters;
  d["expert_parameters"] = s.expert_parameters;
  d["weights"] = s.weights;
  d["master_weights"] = s.master_weights;
  d["gradients"] = s.gradients;
  d["optimizer"] = s.optimizer;
  d["gathered_weights"] = s.gathered_weights;
  d["activations"] = s.activations;
  d["head_activations"] = s.head_activations;
  d["working"] = s.working;
  d["gradient_buffers"] = s.gradient_buffers;
  d["reserved"] = s.reserved;
  d["recompute"] = s.recompute;
  d["states"] = s.states();
  d["transient"] = s.transient();
  d["total"] = s.total();
  d["in_flight"] = s.in_flight;
  return d;
}

struct layout_args {
  act::parallel_config parallel;
  act::step_config step;
};

act::interleaved_rules rules_of(std::string const& name) {
  if (name == "core") return act::interleaved_rules::megatron_core;
  if (name == "legacy") return act::interleaved_rules::megatron_legacy;
  throw agoq::invalid_argument("vp_rules: 'core' or 'legacy', got '" + name + "'");
}

act::recompute_method recompute_of(std::string const& name) {
  for (auto const r :
       {act::recompute_method::none, act::recompute_method::uniform, act::recompute_method::block})
    if (name == act::name_of(r)) return r;
  throw agoq::invalid_argument("recompute: 'none', 'uniform' or 'block', got '" + name + "'");
}

/// Selective recomputation's modules from their names (agoq::activation::recompute_module_names);
/// an unknown name raises ValueError (add_recompute_module).
act::recompute_modules recompute_modules_of(std::vector<std::string> const& names) {
  act::recompute_modules r;
  for (std::string const& n : names) act::add_recompute_module(r, n);
  return r;
}

layout_args layout_of(std::int64_t micro_batch, std::int64_t seq, std::int64_t micro_batches,
                      std::int64_t tp, std::int64_t pp, std::int64_t vp, std::int64_t dp, int zero,
                      bool sp, std::int64_t vp_group, std::string const& vp_rules,
                      std::int64_t bucket_parameters, std::int64_t reserved_bytes,
                      std::string const& recompute, std::int64_t recompute_layers, std::int64_t cp,
                      std::vector<std::string> const& recompute_modules,
                      std::int64_t first_stage_layers, std::int64_t last_stage_layers,
                      bool account_for_embedding, bool account_for_loss,
                      std::string const& pipeline_layout, std::int64_t ep, std::int64_t etp,
                      double expert_capacity_factor) {
  layout_args a;
  a.parallel = {.tp = tp,
                .pp = pp,
                .dp = dp,
                .virtual_stages = vp,
                .zero_stage = zero,
                .sp = sp,
                .vp_group = vp_group,
                .vp_rules = rules_of(vp_rules),
                .cp = cp,
                .first_stage_layers = first_stage_layers,
                .last_stage_layers = last_stage_layers,
                .account_for_embedding = account_for_embedding,
                .account_for_loss = account_for_loss};
  a.parallel.ep = ep;
  a.parallel.etp = etp;
  if (!pipeline_layout.empty()) a.parallel.use_pipeline_layout(pipeline_layout);
  a.step = {micro_batch, seq, micro_batches, bucket_parameters, reserved_bytes};
  a.step.recompute = recompute_of(recompute);
  a.step.recompute_layers = recompute_layers;
  a.step.selective = recompute_modules_of(recompute_modules);
  a.step.expert_capacity_factor = expert_capacity_factor;
  return a;
}

py::list tensor_kinds(std::string const& style, bool moe, std::string const& shared) {
  act::shared_expert_form form = act::shared_expert_form::none;
  if (shared == "plain") {
    form = act::shared_expert_form::plain;
  } else if (shared == "gated") {
    form = act::shared_expert_form::gated;
  } else if (shared != "none") {
    throw agoq::invalid_argument("tensor_kinds: shared is 'none', 'plain' or 'gated', got '" +
                                 shared + "'");
  }
  py::list out;
  for (act::tensor_kind const k : act::block_tensors(act::block_style_named(style), moe, form))
    out.append(std::string(act::name_of(k)));
  return out;
}

py::dict saved_shapes(py::dict const& model, std::int64_t micro_batch, std::int64_t seq,
                      std::int64_t tp, bool sp, std::int64_t etp, double expert_capacity_factor) {
  act::model_shape const m = model_of(model);
  py::dict out;
  for (act::tensor_kind const k : m.saved_tensors()) {
    act::saved_shape const s =
        act::shape_of(k, m, {micro_batch, seq, tp, sp, 1, etp, expert_capacity_factor});
    out[py::str(std::string(act::name_of(k)))] = py::make_tuple(s.rows, s.cols, s.precise_bytes);
  }
  return out;
}

py::dict default_policy() {
  act::policy_table const t;
  py::dict out;
  for (act::tensor_kind const k : act::all_tensor_kinds) {
    if (act::is_alias(k)) continue;
    py::list candidates;
    int const pb = act::precise_bytes_of(k);
    for (act::storage const& c : t.candidates(k)) candidates.append(c.name(pb));
    out[py::str(std::string(act::name_of(k)))] =
        py::make_tuple(t.default_storage(k).name(pb), candidates);
  }
  return out;
}

py::dict error_model_defaults() {
  py::dict out;
  for (act::tensor_kind const k : act::all_tensor_kinds) {
    if (act::is_alias(k)) continue;
    act::tensor_category const c = act::category_of(k);
    out[py::str(std::string(act::name_of(k)))] = py::make_tuple(
        std::string(act::name_of(c)), act::default_sensitivity(c), act::default_outlier(k));
  }
  return out;
}

std::int64_t layer_activation_bytes(py::dict const& model, std::int64_t micro_batch,
                                    std::int64_t seq, py::dict const& storages) {
  act::model_shape const m = model_of(model);
  std::vector<act::storage> chosen(act::tensor_kind_count);
  std::vector<bool> given(act::tensor_kind_count, false);
  for (auto const& [key, value] : storages) {
    act::tensor_kind const k = act::tensor_kind_named(key.cast<std::string>());
    chosen[static_cast<std::size_t>(act::index_of(k))] = storage_of(value.cast<std::string>());
    given[static_cast<std::size_t>(act::index_of(k))] = true;
  }
  return act::layer_activation_bytes(m, {micro_batch, seq, 1, false}, [&](act::tensor_kind k) {
    auto const i = static_cast<std::size_t>(act::index_of(k));
    if (!given[i])
      throw agoq::invalid_argument("layer_activation_bytes: no storage for " +
                                   std::string(act::name_of(k)));
    return chosen[i];
  });
}

/// A triple of a statistics dict: per bit width (2, 4, 8) or per scale format (f32, bf16, e8m0),
/// as `what` says.
std::array<double, 3> triple_of(py::handle const& v, char const* key, char const* what) {
  auto const t = v.cast<py::tuple>();
  if (t.size() != 3)
    throw agoq::invalid_argument(std::string("statistics: '") + key + "' has 3 values (" + what +
                                 ")");
  return {t[0].cast<double>(), t[1].cast<double>(), t[2].cast<double>()};
}

act::tensor_stats stats_of(py::dict const& d) {
  for (char const* key :
       {"tile", "elements", "sum_squares", "sum_group_absmax_sq", "sum_group_range_sq"})
    if (!d.contains(key))
      throw agoq::invalid_argument(std::string("statistics: missing key '") + key + "'");
  act::tensor_stats st;
  auto const tile = d["tile"].cast<py::tuple>();
  if (tile.size() != 2) throw agoq::invalid_argument("statistics: 'tile' is (rows, cols)");
  st.tile = {tile[0].cast<std::int64_t>(), tile[1].cast<std::int64_t>()};
  st.elements = d["elements"].cast<std::int64_t>();
  st.sum_squares = d["sum_squares"].cast<double>();
  st.sum_group_absmax_sq = d["sum_group_absmax_sq"].cast<double>();
  st.sum_group_range_sq = d["sum_group_range_sq"].cast<double>();
  if (d.contains("dead_energy") != d.contains("live_absmax_sq") ||
      d.contains("dead_energy") != d.contains("live_error_2bit"))
    throw agoq::invalid_argument(
        "statistics: 'dead_energy', 'live_absmax_sq' and 'live_error_2bit' come together");
  if (d.contains("dead_energy")) {
    st.has_dead_zones = true;
    st.dead_energy = triple_of(d["dead_energy"], "dead_energy", "2, 4, 8 bits");
    st.live_absmax_sq = triple_of(d["live_absmax_sq"], "live_absmax_sq", "2, 4, 8 bits");
    st.live_error_2bit = triple_of(d["live_error_2bit"], "live_error_2bit", "f32, bf16, e8m0");
  }
  return st;
}

/// The planner's input but for its error model: the model, layout, states, budget and policy.
act::planner_input planner_input_of(
    py::dict const& model, std::int64_t micro_batch, std::int64_t seq, std::int64_t budget_bytes,
    py::object const& policy, std::int64_t dp, std::int64_t pp, std::int64_t tp, std::int64_t vp,
    int zero, bool sp, std::int64_t micro_batches, std::string const& gradients,
    std::string const& optimizer, std::int64_t vp_group, std::string const& vp_rules,
    std::int64_t bucket_parameters, std::int64_t reserved_bytes, std::string const& recompute,
    std::int64_t recompute_layers, std::int64_t cp,
    std::vector<std::string> const& recompute_modules, std::int64_t first_stage_layers,
    std::int64_t last_stage_layers, bool account_for_embedding, bool account_for_loss,
    std::string const& pipeline_layout, std::int64_t ep, std::int64_t etp,
    double expert_capacity_factor) {
  act::planner_input in;
  in.model = model_of(model);
  auto const l =
      layout_of(micro_batch, seq, micro_batches, tp, pp, vp, dp, zero, sp, vp_group, vp_rules,
                bucket_parameters, reserved_bytes, recompute, recompute_layers, cp,
                recompute_modules, first_stage_layers, last_stage_layers, account_for_embedding,
                account_for_loss, pipeline_layout, ep, etp, expert_capacity_factor);
  in.parallel = l.parallel;
  in.step = l.step;
  in.states = {gradient_format_of(gradients), optimizer_format_of(optimizer)};
  in.budget_bytes = budget_bytes;
  in.policy = policy_of(policy);
  return in;
}

/// Sets the error model of `in` from make_plan's arguments: `sensitivity` {kind or (layer, kind):
/// weight}, `outlier` {kind: factor} and `statistics` {(layer, kind): measure()'s dict}.
void apply_error_model(act::planner_input& in, py::object const& statistics,
                       py::object const& sensitivity, py::object const& outlier) {
  if (!sensitivity.is_none()) {
    for (auto const& [key, value] : sensitivity.cast<py::dict>()) {
      double const w = value.cast<double>();
      if (py::isinstance<py::tuple>(key)) {
        auto const k = key.cast<py::tuple>();
        if (k.size() != 2)
          throw agoq::invalid_argument("sensitivity: keys are kind or (layer, kind)");
        in.errors.set_sensitivity(k[0].cast<std::int64_t>(),
                                  act::tensor_kind_named(k[1].cast<std::string>()), w);
      } else {
        in.errors.set_sensitivity(act::tensor_kind_named(key.cast<std::string>()), w);
      }
    }
  }
  if (!outlier.is_none()) {
    for (auto const& [key, value] : outlier.cast<py::dict>())
      in.errors.set_outlier(act::tensor_kind_named(key.cast<std::string>()), value.cast<double>());
  }
  if (!statistics.is_none()) {
    for (auto const& [key, value] : statistics.cast<py::dict>()) {
      auto const k = key.cast<py::tuple>();
      if (k.size() != 2) throw agoq::invalid_argument("statistics: keys are (layer, kind)");
      in.errors.set_statistics(k[0].cast<std::int64_t>(),
                               act::tensor_kind_named(k[1].cast<std::string>()),
                               stats_of(value.cast<py::dict>()));
    }
  }
}

py::dict make_plan(py::dict const& model, std::int64_t micro_batch, std::int64_t seq,
                   std::int64_t budget_bytes, py::object const& policy, std::int64_t dp,
                   std::int64_t pp, std::int64_t tp, std::int64_t vp, int zero, bool sp,
                   std::int64_t micro_batches, std::string const& gradients,
                   std::string const& optimizer, py::object const& statistics,
                   std::int64_t vp_group, std::string const& vp_rules,
                   std::int64_t bucket_parameters, std::int64_t reserved_bytes,
                   py::object const& sensitivity, py::object const& outlier,
                   std::string const& recompute, std::int64_t recompute_layers, std::int64_t cp,
                   std::vector<std::string> const& recompute_modules,
                   std::int64_t first_stage_layers, std::int64_t last_stage_layers,
                   bool account_for_embedding, bool account_for_loss,
                   std::string const& pipeline_layout, std::int64_t ep, std::int64_t etp,
                   double expert_capacity_factor) {
  act::planner_input in = planner_input_of(
      model, micro_batch, seq, budget_bytes, policy, dp, pp, tp, vp, zero, sp, micro_batches,
      gradients, optimizer, vp_group, vp_rules, bucket_parameters, reserved_bytes, recompute,
      recompute_layers, cp, recompute_modules, first_stage_layers, last_stage_layers,
      account_for_embedding, account_for_loss, pipeline_layout, ep, etp, expert_capacity_factor);
  apply_error_model(in, statistics, sensitivity, outlier);
  act::activation_plan const plan = act::make_plan(in);
  py::list layers;
  py::list recomputed;
  for (std::int64_t layer = 0; layer < in.model.layers; ++layer) {
    py::dict kinds;
    for (act::tensor_kind const k : in.model.saved_tensors()) {
      int const pb = act::precise_bytes_of(k);
      kinds[py::str(std::string(act::name_of(k)))] = plan.storage_of(layer, k).name(pb);
    }
    layers.append(kinds);
    if (act::is_recomputed(in.model, in.parallel, in.step, layer)) recomputed.append(layer);
  }
  py::list stages;
  for (act::stage_plan const& s : plan.stages()) {
    py::dict d = memory_dict(s.memory);
    d["error"] = s.error;
    d["error_lower_bound"] = s.error_lower_bound;
    d["unused_bytes"] = s.unused_bytes;
    stages.append(d);
  }
  // Selective recomputation: the kinds no layer keeps (bf16 in `layers`, as recomputed layers).
  py::list recomputed_kinds;
  for (act::tensor_kind const k : in.model.saved_tensors())
    if (act::recomputes(in.step.selective, k))
      recomputed_kinds.append(std::string(act::name_of(k)));
  py::dict out;
  out["layers"] = layers;
  out["recomputed"] = recomputed;
  py::list modules;
  for (std::string_view const n : act::names_of(in.step.selective)) modules.append(std::string(n));
  out["recompute_modules"] = modules;
  out["recomputed_kinds"] = recomputed_kinds;
  out["stages"] = stages;
  out["error"] = plan.total_error();
  return out;
}

py::object least_block_recompute(py::dict const& model, std::int64_t micro_batch, std::int64_t seq,
                                 std::int64_t budget_bytes, py::object const& policy,
                                 std::int64_t dp, std::int64_t pp, std::int64_t tp, std::int64_t vp,
                                 int zero, bool sp, std::int64_t micro_batches,
                                 std::string const& gradients, std::string const& optimizer,
                                 std::int64_t vp_group, std::string const& vp_rules,
                                 std::int64_t bucket_parameters, std::int64_t reserved_bytes,
                                 std::int64_t cp, std::int64_t first_stage_layers,
                                 std::int64_t last_stage_layers, bool account_for_embedding,
                                 bool account_for_loss, std::string const& pipeline_layout,
                                 std::int64_t ep, std::int64_t etp, double expert_capacity_factor) {
  auto const n = act::least_block_recompute(planner_input_of(
      model, micro_batch, seq, budget_bytes, policy, dp, pp, tp, vp, zero, sp, micro_batches,
      gradients, optimizer, vp_group, vp_rules, bucket_parameters, reserved_bytes, "none", 0, cp,
      {}, first_stage_layers, last_stage_layers, account_for_embedding, account_for_loss,
      pipeline_layout, ep, etp, expert_capacity_factor));
  return n ? py::object(py::int_(*n)) : py::object(py::none());
}

py::object find_shortfall(py::dict const& model, std::int64_t micro_batch, std::int64_t seq,
                          std::int64_t budget_bytes, py::object const& policy, std::int64_t dp,
                          std::int64_t pp, std::int64_t tp, std::int64_t vp, int zero, bool sp,
                          std::int64_t micro_batches, std::string const& gradients,
                          std::string const& optimizer, std::int64_t vp_group,
                          std::string const& vp_rules, std::int64_t bucket_parameters,
                          std::int64_t reserved_bytes, std::string const& recompute,
                          std::int64_t recompute_layers, std::int64_t cp,
                          std::vector<std::string> const& recompute_modules,
                          std::int64_t first_stage_layers, std::int64_t last_stage_layers,
                          bool account_for_embedding, bool account_for_loss,
                          std::string const& pipeline_layout, std::int64_t ep, std::int64_t etp,
                          double expert_capacity_factor) {
  auto const s = act::find_shortfall(planner_input_of(
      model, micro_batch, seq, budget_bytes, policy, dp, pp, tp, vp, zero, sp, micro_batches,
      gradients, optimizer, vp_group, vp_rules, bucket_parameters, reserved_bytes, recompute,
      recompute_layers, cp, recompute_modules, first_stage_layers, last_stage_layers,
      account_for_embedding, account_for_loss, pipeline_layout, ep, etp, expert_capacity_factor));
  if (!s) return py::none();
  py::dict d;
  d["stage"] = s->stage;
  d["budget_bytes"] = s->budget_bytes;
  d["bytes"] = s->bytes();
  d["need"] = memory_dict(s->need);
  d["message"] = s->message();
  return d;
}

/// A recompute_option as a dict.
py::dict option_dict(act::recompute_option const& o) {
  py::list modules;
  for (std::string_view const n : act::names_of(o.modules)) modules.append(std::string(n));
  py::dict d;
  d["recompute"] = act::name_of(o.method);
  d["recompute_layers"] = o.layers;
  d["modules"] = modules;
  d["overhead"] = o.overhead;
  d["fits"] = o.fits;
  d["error"] = o.error;
  d["peak_bytes"] = o.peak_bytes;
  return d;
}

/// The options `options_of` (act::selective_options or act::recompute_options) gives for
/// make_plan's arguments, and the one of least error within max_overhead.
template <auto options_of>
py::dict planned_options(py::dict const& model, std::int64_t micro_batch, std::int64_t seq,
                         std::int64_t budget_bytes, py::object const& policy, std::int64_t dp,
                         std::int64_t pp, std::int64_t tp, std::int64_t vp, int zero, bool sp,
                         std::int64_t micro_batches, std::string const& gradients,
                         std::string const& optimizer, py::object const& statistics,
                         std::int64_t vp_group, std::string const& vp_rules,
                         std::int64_t bucket_parameters, std::int64_t reserved_bytes,
                         py::object const& sensitivity, py::object const& outlier, std::int64_t cp,
                         double max_overhead, std::int64_t first_stage_layers,
                         std::int64_t last_stage_layers, bool account_for_embedding,
                         bool account_for_loss, std::string const& pipeline_layout, std::int64_t ep,
                         std::int64_t etp, double expert_capacity_factor) {
  act::planner_input in = planner_input_of(
      model, micro_batch, seq, budget_bytes, policy, dp, pp, tp, vp, zero, sp, micro_batches,
      gradients, optimizer, vp_group, vp_rules, bucket_parameters, reserved_bytes, "none", 0, cp,
      {}, first_stage_layers, last_stage_layers, account_for_embedding, account_for_loss,
      pipeline_layout, ep, etp, expert_capacity_factor);
  apply_error_model(in, statistics, sensitivity, outlier);
  std::vector<act::recompute_option> const all = options_of(in);
  py::list options;
  for (act::recompute_option const& o : all) options.append(option_dict(o));
  auto const best = act::least_error_recompute(all, max_overhead);
  py::dict out;
  out["options"] = options;
  out["least_error"] = best ? py::object(option_dict(*best)) : py::object(py::none());
  return out;
}

py::list estimate_memory(
    py::dict const& model, std::int64_t micro_batch, std::int64_t seq, std::string const& gradients,
    std::string const& optimizer, py::object const& policy, std::int64_t dp, std::int64_t pp,
    std::int64_t tp, std::int64_t vp, int zero, bool sp, std::int64_t micro_batches,
    std::int64_t vp_group, std::string const& vp_rules, std::int64_t bucket_parameters,
    std::int64_t reserved_bytes, std::string const& recompute, std::int64_t recompute_layers,
    std::int64_t cp, std::vector<std::string> const& recompute_modules,
    std::int64_t first_stage_layers, std::int64_t last_stage_layers, bool account_for_embedding,
    bool account_for_loss, std::string const& pipeline_layout, std::int64_t ep, std::int64_t etp,
    double expert_capacity_factor) {
  act::model_shape const m = model_of(model);
  auto const l =
      layout_of(micro_batch, seq, micro_batches, tp, pp, vp, dp, zero, sp, vp_group, vp_rules,
                bucket_parameters, reserved_bytes, recompute, recompute_layers, cp,
                recompute_modules, first_stage_layers, last_stage_layers, account_for_embedding,
                account_for_loss, pipeline_layout, ep, etp, expert_capacity_factor);
  py::list out;
  for (act::stage_memory const& s : act::estimate_memory(
           m, l.parallel, l.step, {gradient_format_of(gradients), optimizer_format_of(optimizer)},
           policy_of(policy)))
    out.append(memory_dict(s));
  return out;
}

}  // namespace

void register_planning(py::module_& m) {
  m.def("model_presets", &model_presets,
        "{name: model} of the published shapes agoq knows (llama3-8b, llama3-70b, llama3-405b, "
        "qwen2.5-32b, qwen3-8b, qwen3-32b, gemma2-2b, gemma2-9b, gemma2-27b, gemma3-1b, "
        "gpt3-1.3b, and the mixture-of-experts mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b, "
        "qwen1.5-moe-a2.7b, qwen2-57b-a14b), each a dict with every key a model takes (style "
        "'llama', 'gpt', 'qwen3', 'gemma2' or 'gemma3'; experts, experts_per_token, "
        "expert_ffn and shared_expert_ffn 0 and shared_expert_gate False for a dense model, ffn "
        "0 for a mixture-of-experts one; the planning calls' ep and etp place its experts).");
  m.def("model_from_hf_config", &model_from_hf_config, py::arg("config"),
        "The model dict of a Hugging Face config (model_type llama, mistral, qwen2, qwen3, "
        "gemma, gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe or gpt2): a dict "
        "(json.load's or a transformers config's to_dict()), an object with to_dict(), or the "
        "path of a config.json or of a directory holding one. Other mixture-of-experts models "
        "and other blocks raise ValueError (docs/activations.md, section 6).");
  m.def(
      "expert_load_factor",
      [](std::vector<std::int64_t> const& pairs, std::int64_t ep) {
        return act::expert_load_factor(pairs, ep);
      },
      py::arg("pairs"), py::arg("ep") = 1,
      "The busiest expert-parallel rank's (token, expert) pairs over the mean rank's, from the "
      "pairs each expert took (e.g. torch.bincount(topk_indices.flatten(), minlength=experts)."
      "tolist()), experts laid out on ep ranks as Megatron-Core places them: given as "
      "expert_capacity_factor, it sizes every rank's expert tensors for the busiest one.");
  m.def("tensor_kinds", &tensor_kinds, py::arg("style") = "llama", py::arg("moe") = false,
        py::arg("shared") = "none",
        "The tensors a block of the style (with moe, its mixture-of-experts form, with shared "
        "experts 'none', 'plain' or 'gated') saves for backward, in forward order (o_proj_input "
        "reads the attention_output buffer).");
  m.def("saved_shapes", &saved_shapes, py::arg("model"), py::arg("micro_batch"), py::arg("seq"),
        py::arg("tp") = 1, py::arg("sp") = false, py::arg("etp") = 0,
        py::arg("expert_capacity_factor") = 0.0,
        "{kind: (rows, cols, precise_bytes)} of one layer's saved tensors for one micro-batch "
        "(etp, expert_capacity_factor: a mixture-of-experts model's expert tensor parallelism, "
        "0: tp, and capacity factor, 0: dropless).");
  m.def("default_policy", &default_policy,
        "agoq's default policy: {kind: (default storage, [candidates])}.");
  m.def("error_model_defaults", &error_model_defaults,
        "The error model's defaults: {kind: (category, sensitivity, outlier factor)} "
        "(docs/activations.md section 3).");
  m.def("layer_activation_bytes", &layer_activation_bytes, py::arg("model"), py::arg("micro_batch"),
        py::arg("seq"), py::arg("storages"),
        "Bytes one layer saves for one micro-batch with {kind: storage} (precise: bf16, the "
        "logsumexp fp32; aliases free).");
  m.def(
      "make_plan", &make_plan, py::arg("model"), py::arg("micro_batch"), py::arg("seq"),
      py::arg("budget_bytes"), py::arg("policy") = py::none(), py::arg("dp") = 1, py::arg("pp") = 1,
      py::arg("tp") = 1, py::arg("vp") = 1, py::arg("zero") = 0, py::arg("sp") = false,
      py::arg("micro_batches") = 0, py::arg("gradients") = "int8", py::arg("optimizer") = "fp32",
      py::arg("statistics") = py::none(), py::arg("vp_group") = 0, py::arg("vp_rules") = "core",
      py::arg("bucket_parameters") = 0, py::arg("reserved_bytes") = act::default_reserved_bytes,
      py::arg("sensitivity") = py::none(), py::arg("outlier") = py::none(),
      py::arg("recompute") = "none", py::arg("recompute_layers") = 0, py::arg("cp") = 1,
      py::arg("recompute_modules") = std::vector<std::string>{}, py::arg("first_stage_layers") = 0,
      py::arg("last_stage_layers") = 0, py::arg("account_for_embedding") = false,
      py::arg("account_for_loss") = false, py::arg("pipeline_layout") = "", py::arg("ep") = 1,
      py::arg("etp") = 0, py::arg("expert_capacity_factor") = 0.0,
      "The activation plan under a per-GPU budget: {'layers': [{kind: storage}], "
      "'recomputed': [layer], 'recompute_modules': [module], 'recomputed_kinds': [kind], "
      "'stages': [memory], 'error': float}. The budget holds each "
      "stage's transient working memory "
      "too (memory keys 'working', 'gradient_buffers', 'reserved', summed in 'transient'; "
      "bucket_parameters: the gradient bucket, 0: Megatron-Core's default; reserved_bytes: "
      "the fixed allowance, 1 GiB by default). `statistics` maps (layer, kind) to a dict from "
      "measure(), which replaces the Gaussian prior of that tensor's error; `sensitivity` maps "
      "kinds, or (layer, kind) for one layer's tensor, to the error model's weights and "
      "`outlier` kinds to its outlier factors (defaults: docs/activations.md section 3; "
      "measured ones: examples/pytorch/sensitivity.py). With "
      "vp > 1, "
      "Megatron's interleaved schedule: Megatron-Core's ('core') in groups of vp_group "
      "micro-batches (0: pp), or older Megatron-LM's ('legacy'). Raises ValueError with the "
      "shortfall when nothing fits, and for a schedule Megatron refuses. recompute "
      "('uniform' or 'block') with recompute_layers is Megatron's full activation "
      "recomputation (recompute_method, recompute_num_layers per model chunk): the "
      "recomputed layers are kept in bf16 while their checkpoint's backward runs (memory key "
      "'recompute', in 'transient') and their checkpoints' inputs in between. "
      "recompute_modules (names of 'core_attn', 'layernorm', 'mlp') is Megatron's selective "
      "recomputation, which excludes recompute: in every layer the kinds those modules output "
      "(listed in 'recomputed_kinds', bf16 in 'layers') are not kept but computed again in the "
      "backward, in the layer's working memory, with the error of the kept tensors they come "
      "from; an unknown name raises ValueError. cp > 1 is "
      "context parallelism: each sequence split over cp ranks (seq a multiple of 2 cp), ZeRO "
      "and the gradient reduction over dp x cp. first_stage_layers and last_stage_layers "
      "give the first (last) pipeline stage that many layers and the others an even share of "
      "the rest (Megatron-Core's num_layers_in_first/last_pipeline_stage; 0: an even split); "
      "account_for_embedding and account_for_loss count the embedding (the loss) as a layer "
      "in the even split, one layer fewer in the first stage's first model chunk (the last "
      "stage's last; Megatron-Core's account_for_embedding/loss_in_pipeline_split); "
      "pipeline_layout (Megatron-Core's pipeline_model_parallel_layout string, e.g. "
      "'Et*3|(tt|)*29,t*3L') gives every model chunk its layers, vp its chunks / pp, and "
      "excludes the three; each stage's memory says its 'layers'. ep and etp place a "
      "mixture-of-experts model's experts (Megatron-Core's expert_model_parallel_size and "
      "expert_tensor_parallel_size; etp 0: tp): experts / ep on each rank, each split over etp, "
      "their states sharded under ZeRO over tp cp dp / (ep etp) ranks; each stage's memory says "
      "its 'expert_parameters'. expert_capacity_factor is Megatron-Core's "
      "moe_expert_capacity_factor, padded to capacity (0: dropless routing at its mean).");
  m.def("least_block_recompute", &least_block_recompute, py::arg("model"), py::arg("micro_batch"),
        py::arg("seq"), py::arg("budget_bytes"), py::arg("policy") = py::none(), py::arg("dp") = 1,
        py::arg("pp") = 1, py::arg("tp") = 1, py::arg("vp") = 1, py::arg("zero") = 0,
        py::arg("sp") = false, py::arg("micro_batches") = 0, py::arg("gradients") = "int8",
        py::arg("optimizer") = "fp32", py::arg("vp_group") = 0, py::arg("vp_rules") = "core",
        py::arg("bucket_parameters") = 0, py::arg("reserved_bytes") = act::default_reserved_bytes,
        py::arg("cp") = 1, py::arg("first_stage_layers") = 0, py::arg("last_stage_layers") = 0,
        py::arg("account_for_embedding") = false, py::arg("account_for_loss") = false,
        py::arg("pipeline_layout") = "", py::arg("ep") = 1, py::arg("etp") = 0,
        py::arg("expert_capacity_factor") = 0.0,
        "The fewest layers of each model chunk that block recomputation must recompute for "
        "make_plan (same arguments) to fit budget_bytes: 0 when it fits without, None when not "
        "even every layer fits. Full recomputation alone: no selective recomputation "
        "(recompute_modules) is tried beside it.");
  m.def("find_shortfall", &find_shortfall, py::arg("model"), py::arg("micro_batch"), py::arg("seq"),
        py::arg("budget_bytes"), py::arg("policy") = py::none(), py::arg("dp") = 1,
        py::arg("pp") = 1, py::arg("tp") = 1, py::arg("vp") = 1, py::arg("zero") = 0,
        py::arg("sp") = false, py::arg("micro_batches") = 0, py::arg("gradients") = "int8",
        py::arg("optimizer") = "fp32", py::arg("vp_group") = 0, py::arg("vp_rules") = "core",
        py::arg("bucket_parameters") = 0, py::arg("reserved_bytes") = act::default_reserved_bytes,
        py::arg("recompute") = "none", py::arg("recompute_layers") = 0, py::arg("cp") = 1,
        py::arg("recompute_modules") = std::vector<std::string>{},
        py::arg("first_stage_layers") = 0, py::arg("last_stage_layers") = 0,
        py::arg("account_for_embedding") = false, py::arg("account_for_loss") = false,
        py::arg("pipeline_layout") = "", py::arg("ep") = 1, py::arg("etp") = 0,
        py::arg("expert_capacity_factor") = 0.0,
        "Where make_plan (the same arguments, but the error model's) would find no plan: "
        "{'stage': the device short by the most, 'budget_bytes', 'bytes': by how many it falls "
        "short, 'need': that device's memory dict with every planned tensor at its smallest "
        "candidate, 'message': make_plan's ValueError text}, or None where a plan fits.");
  // selective_options and recompute_options: make_plan's arguments, then max_overhead.
  auto const def_options = [&m](char const* name, auto fn, char const* doc) {
    std::apply(
        [&](auto&&... args) { m.def(name, fn, args...); },
        std::make_tuple(
            py::arg("model"), py::arg("micro_batch"), py::arg("seq"), py::arg("budget_bytes"),
            py::arg("policy") = py::none(), py::arg("dp") = 1, py::arg("pp") = 1, py::arg("tp") = 1,
            py::arg("vp") = 1, py::arg("zero") = 0, py::arg("sp") = false,
            py::arg("micro_batches") = 0, py::arg("gradients") = "int8",
            py::arg("optimizer") = "fp32", py::arg("statistics") = py::none(),
            py::arg("vp_group") = 0, py::arg("vp_rules") = "core", py::arg("bucket_parameters") = 0,
            py::arg("reserved_bytes") = act::default_reserved_bytes,
            py::arg("sensitivity") = py::none(), py::arg("outlier") = py::none(), py::arg("cp") = 1,
            py::arg("max_overhead") = 1.0, py::arg("first_stage_layers") = 0,
            py::arg("last_stage_layers") = 0, py::arg("account_for_embedding") = false,
            py::arg("account_for_loss") = false, py::arg("pipeline_layout") = "", py::arg("ep") = 1,
            py::arg("etp") = 0, py::arg("expert_capacity_factor") = 0.0, doc));
  };
  def_options("selective_options", &planned_options<&act::selective_options>,
              "Every set of Megatron's recompute modules (core_attn, layernorm, mlp) planned as "
              "make_plan (same arguments) plans it: {'options': [{'recompute' ('none'), "
              "'recompute_layers' (0), 'modules', 'overhead' (the share of a step's matrix FLOPs "
              "it adds), 'fits', 'error' (the plan's), 'peak_bytes'}] by overhead, 'least_error': "
              "the option that fits with the least error among those adding at most "
              "max_overhead, or None}.");
  def_options(
      "recompute_options", &planned_options<&act::recompute_options>,
      "selective_options' sets and every full recomputation of Megatron's ('recompute' "
      "'block' with 'recompute_layers' N below the layers of the largest model chunk, "
      "'uniform' with N up to them; 'modules' empty), planned as make_plan (same arguments) plans "
      "them, in the same form: {'options': [...] by overhead, 'least_error': ... or "
      "None}.");
  m.def("estimate_memory", &estimate_memory, py::arg("model"), py::arg("micro_batch"),
        py::arg("seq"), py::arg("gradients") = "fp32", py::arg("optimizer") = "fp32",
        py::arg("policy") = py::none(), py::arg("dp") = 1, py::arg("pp") = 1, py::arg("tp") = 1,
        py::arg("vp") = 1, py::arg("zero") = 0, py::arg("sp") = false, py::arg("micro_batches") = 0,
        py::arg("vp_group") = 0, py::arg("vp_rules") = "core", py::arg("bucket_parameters") = 0,
        py::arg("reserved_bytes") = act::default_reserved_bytes, py::arg("recompute") = "none",
        py::arg("recompute_layers") = 0, py::arg("cp") = 1,
        py::arg("recompute_modules") = std::vector<std::string>{},
        py::arg("first_stage_layers") = 0, py::arg("last_stage_layers") = 0,
        py::arg("account_for_embedding") = false, py::arg("account_for_loss") = false,
        py::arg("pipeline_layout") = "", py::arg("ep") = 1, py::arg("etp") = 0,
        py::arg("expert_capacity_factor") = 0.0,
        "Per-pipeline-device memory of one step with every tensor at its policy default "
        "(vp_group, vp_rules: the interleaved schedule; bucket_parameters, reserved_bytes: the "
        "transient memory's settings; recompute, recompute_layers: full recomputation; cp: "
        "context parallelism; recompute_modules: selective recomputation; first_stage_layers, "
        "last_stage_layers: uneven pipeline stages; account_for_embedding, account_for_loss: "
        "the embedding and the loss counted in the split; pipeline_layout: Megatron-Core's "
        "layout string; as make_plan).");
}

}  // namespace agoq_torch
