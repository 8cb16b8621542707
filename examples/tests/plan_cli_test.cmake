# The agoq_plan tool from the outside: its figures for the README's command, a config file and
# flags after it, the schedules and presets it prints, and each kind of bad input refused with exit
# status 1 and a message naming the problem. Run as
#   cmake -DPLAN=<agoq_plan> -DCONFIG=<plan.conf> -P plan_cli_test.cmake

# check(<name> <expected exit status> <regex> <args...>): runs agoq_plan with args and checks its
# exit status and that its output (stdout and stderr) matches regex.
function(check name status regex)
  execute_process(COMMAND ${PLAN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(NOT rc STREQUAL "${status}" OR NOT out MATCHES "${regex}")
    message(SEND_ERROR "${name}: exit status ${rc} (want ${status}); the output should match "
                       "'${regex}':\n${out}")
  else()
    message(STATUS "${name}: ok")
  endif()
endfunction()

# check_config(<name> <regex> <config text> <args...>): writes the text to a config file and
# checks that agoq_plan --config it <args...> succeeds with output matching regex.
function(check_config name regex text)
  set(file ${CMAKE_CURRENT_BINARY_DIR}/plan_cli_${name}.conf)
  file(WRITE ${file} "${text}")
  check(${name} 0 "${regex}" ${ARGN} --config ${file})
endfunction()

set(presets "llama3-8b, llama3-70b, llama3-405b, qwen2.5-32b, qwen3-8b, qwen3-32b, gpt3-1.3b,\
 mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b, qwen1.5-moe-a2.7b, qwen2-57b-a14b, gemma2-2b,\
 gemma2-9b, gemma2-27b, gemma3-1b")
check(help 0 "usage: agoq_plan \\[--config FILE\\].*published shape[^\n]*\n${presets}.\n" --help)

# The README's command: LLaMA-3-8B on 32 GPUs under 16 GiB. The peak figures are the memory
# model's (tests/activation/memory_model_test.cpp checks its terms by hand).
string(CONCAT readme "tp 2, pp 4 \\(1F1B\\), dp 4, ZeRO-1, sp on.*"
  "peak per-GPU memory: 27.91 GiB -> 14.87 GiB, saving 46.7%.*"
  "plan for a budget of 16.00 GiB per GPU.*stage 3: total")
check(readme 0 "${readme}"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 16)

# A config file (comments, blanks around '='), and a flag after it overriding one of its keys.
string(CONCAT config "model: llama, 64 layers, hidden 5120, ffn 27648, heads 40, kv_heads 8, "
  "head_dim 128, vocab 152064.*tp 4, pp 4 \\(1F1B\\), dp 4, ZeRO-1, sp on; "
  "micro-batch 1 x seq 8192")
check(config 0 "${config}" --config ${CONFIG})
check(config_then_flag 0 "tp 4, pp 2 \\(1F1B\\)" --config ${CONFIG} --pp 2)

# LLaMA-3-70B on 128 GPUs (docs/activations.md, section 4's results).
string(CONCAT llama3_70b "model: llama, 80 layers, hidden 8192, ffn 28672, heads 64, kv_heads 8.*"
  "peak per-GPU memory: 41.37 GiB -> 22.64 GiB, saving 45.3%")
check(llama3_70b 0 "${llama3_70b}"
  --preset llama3-70b --tp 8 --pp 4 --dp 4 --zero 1 --sp --seq 8192)
# LLaMA-3.1-405B on Meta's uneven 16 stages (7, 14 x 8, 7 layers; docs/activations.md, section 4's
# results), each stage's layers in the tables and the JSON document, block recomputation of 2
# layers of each chunk of 7 or 8, the same keys in a config file, and the splits refused.
set(l405_args --preset llama3-405b --tp 8 --pp 16 --dp 8 --zero 1 --sp --seq 8192)
string(CONCAT llama3_405b
  "model: llama, 126 layers, hidden 16384, ffn 53248, heads 128, kv_heads 8.*"
  "parallel: tp 8, pp 16 \\(1F1B; layers 7, 14 x 8, 7\\).*"
  " stage layers in-flight [^\n]*\n +0 +7 +16 [^\n]*\n +1 +8 +15 .*"
  "peak per-GPU memory: 83.59 GiB -> 39.64 GiB, saving 52.6%")
check(llama3_405b 0 "${llama3_405b}" ${l405_args} --first-stage-layers 7 --last-stage-layers 7)
string(CONCAT uneven_json "\"first_stage_layers\": 7, \"last_stage_layers\": 7.*"
  "\"baseline\": \\[{\"stage\": 0, \"layers\": 7,")
check(uneven_json 0 "${uneven_json}"
  ${l405_args} --first-stage-layers 7 --last-stage-layers 7 --json)
check(uneven_recompute 0
  "recompute: block, 1 layer a checkpoint, 2 of each model chunk's 7 or 8\n"
  ${l405_args} --first-stage-layers 7 --last-stage-layers 7 --recompute block --recompute-layers 2)
# Interleaved: 4 and 4 layers on the first and the last device, 12 on each other, in chunks of 2
# and 6 (memory_model_test checks the placement by hand).
string(CONCAT uneven_interleaved
  "pp 4 \\(interleaved, v = 2, megatron-core, groups of 4; layers 4, 2 x 12, 4\\).*"
  "\n +0 +4 +7,4 [^\n]*\n +1 +12 +5,4 .*"
  "fewest layers of each model chunk's 2 or 6 to recompute")
check(uneven_interleaved 0 "${uneven_interleaved}" --pp 4 --vp 2 --first-stage-layers 4
  --last-stage-layers 4 --micro-batches 8 --budget-gib 80 --fit-recompute)
check_config(uneven_config "pp 16 \\(1F1B; layers 6, 15 x 8\\)"
  "preset = llama3-405b\npp = 16\nfirst-stage-layers = 6   # the rest: 8 each\n")
check(uneven_needed 1
  "agoq_plan: .*126 layers do not split into 16 stages x 1 chunks evenly \\(first_stage_layers and "
  ${l405_args})
check(uneven_refused 1 "agoq_plan: .*the 29 layers left by first_stage_layers \\(3\\) and \
last_stage_layers \\(0\\) of 32 do not split evenly into the other 3 pipeline stages"
  --pp 4 --first-stage-layers 3)
# The embedding and the loss counted in the even split (Megatron-Core's
# --account-for-embedding/loss-in-pipeline-split): without interleaving the same 7, 14 x 8, 7 and
# figures as above; interleaved (v = 2, which 7 layers on a stage cannot be), chunks of 3 or 4; the
# JSON keys, a config file, and the splits refused.
string(CONCAT counted
  "pp 16 \\(1F1B; layers 7, 14 x 8, 7, the embedding and the loss counted in the split\\).*"
  "peak per-GPU memory: 83.59 GiB -> 39.64 GiB, saving 52.6%")
check(counted 0 "${counted}" ${l405_args} --account-for-embedding --account-for-loss)
string(CONCAT counted_interleaved
  "pp 16 \\(interleaved, v = 2, megatron-core, groups of 16; layers 7, 14 x 8, 7, the embedding "
  "and the loss counted in the split\\).*"
  "\n +0 +7 +31,16 [^\n]*\n +1 +8 +29,16 .*"
  "peak per-GPU memory: 113.39 GiB -> 51.44 GiB, saving 54.6%.*"
  "fewest layers of each model chunk's 3 or 4 to recompute \\(block\\) within 70.00 GiB: "
  "baseline 3, agoq 0")
check(counted_interleaved 0 "${counted_interleaved}" ${l405_args} --vp 2 --micro-batches 64
  --account-for-embedding --account-for-loss --budget-gib 70 --fit-recompute)
check(counted_json 0 "\"account_for_embedding\": true, \"account_for_loss\": false"
  ${l405_args} --layers 125 --pp 2 --account-for-embedding --json)
check_config(counted_config "pp 2 \\(1F1B; layers 62, 63, the embedding counted in the split\\)"
  "preset = llama3-405b\nlayers = 125\npp = 2\naccount-for-embedding = 1\n")
check(counted_refused 1
  "agoq_plan: .*126 layers and the embedding do not split into 16 stages x 2 chunks evenly"
  ${l405_args} --vp 2 --account-for-embedding)
check(counted_uneven 1 "agoq_plan: .*they exclude first_stage_layers and last_stage_layers"
  ${l405_args} --account-for-loss --last-stage-layers 7)
# Megatron-Core's --pipeline-model-parallel-layout: 405B's split given as a layout (the same
# figures), interleaved (vp from its chunks: 32 on 16 devices), the chunks in the JSON document, a
# config key, and what it refuses.
string(CONCAT layout
  "pp 16 \\(1F1B; layers 7, 14 x 8, 7, layout Et\\*7\\|\\(t\\*8\\|\\)\\*14,t\\*7L\\).*"
  "peak per-GPU memory: 83.59 GiB -> 39.64 GiB, saving 52.6%")
check(layout 0 "${layout}" ${l405_args} --pipeline-layout "Et*7|(t*8|)*14,t*7L")
check(layout_interleaved 0
  "interleaved, v = 2, megatron-core, groups of 16; layers 7, 14 x 8, 7, .*saving 54.6%"
  ${l405_args} --pipeline-layout "Et*3|(t*4|)*30,t*3L" --micro-batches 64)
check(layout_json 0 "\"vp\": 2, .*\"pipeline_layout\": \\[1, 2, 1, 0\\]"
  --layers 4 --pp 2 --pipeline-layout "Et|tt|t|L" --json)
check_config(layout_config
  "pp 2 \\(interleaved, v = 2, [^;]*; layers 2 x 2, layout Et\\|tt\\|t\\|L\\)"
  "layers = 4\npp = 2\npipeline-layout = Et|tt|t|L   # chunks 1, 2 / 1, 0\n")
check(layout_mtp 1 "agoq_plan: .*multi-token prediction layers \\('m'\\) are not modelled"
  --pp 2 --pipeline-layout "Et|tt|tm|L")
check(layout_chunks 1 "agoq_plan: .*the pipeline layout's 4 model chunks are not pp \\(3\\) x "
  --layers 4 --pp 3 --pipeline-layout "Et|tt|t|L")
check(layout_layers 1
  "agoq_plan: .*the pipeline layout places 4 transformer layers, not the model's 32"
  --pp 2 --pipeline-layout "Et|tt|t|L")
check(layout_excludes 1 "agoq_plan: .*it excludes first_stage_layers"
  --layers 4 --pp 2 --first-stage-layers 2 --pipeline-layout "Et|tt|t|L")
check(gpt_preset 0 "model: gpt, 24 layers, hidden 2048, ffn 8192, heads 16, kv_heads 16"
  --preset gpt3-1.3b --pp 2)

# Hugging Face config.json files: LLaMA-3-70B's (as released, token ids left out) gives the
# figures of its preset above; a flag after it changes the shape, a config file names it, GPT-2's
# keys give the gpt3-1.3b shape; mixture-of-experts and other blocks, a missing file and bad JSON
# refused.
# (tests/activation/hf_config_test.cpp checks the reading and the mapping field by field.)
function(hf_file name text)
  set(${name} ${CMAKE_CURRENT_BINARY_DIR}/plan_cli_${name}.json PARENT_SCOPE)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/plan_cli_${name}.json "${text}")
endfunction()
hf_file(hf_llama3_70b [=[{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 8192,
  "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256}]=])
check(hf_config 0 "model: llama, 80 layers, hidden 8192, ffn 28672, heads 64, kv_heads 8, head_dim \
128, vocab 128256.*peak per-GPU memory: 41.37 GiB -> 22.64 GiB, saving 45.3%"
  --hf-config ${hf_llama3_70b} --tp 8 --pp 4 --dp 4 --zero 1 --sp --seq 8192)
check(hf_config_then_flag 0 "model: llama, 16 layers, hidden 8192"
  --hf-config ${hf_llama3_70b} --layers 16)
check_config(hf_config_key "model: llama, 80 layers, hidden 8192.*tp 2, pp 4"
  "hf-config = ${hf_llama3_70b}\ntp = 2\npp = 4\n")
hf_file(hf_gpt2 [=[{"model_type": "gpt2", "activation_function": "gelu_new", "n_layer": 24,
  "n_embd": 2048, "n_head": 16, "n_inner": null, "vocab_size": 50257}]=])
check(hf_config_gpt2 0 "model: gpt, 24 layers, hidden 2048, ffn 8192, heads 16, kv_heads 16"
  --hf-config ${hf_gpt2} --pp 2)
check(hf_config_help 0 "--hf-config FILE takes the shape of a Hugging Face config.json" --help)
# Qwen3 (QK-norm): Qwen3-32B's config.json gives its preset's figures on 128 GPUs; the QK-norm's
# inputs are kept bf16 (attention core) in the plan; --style qwen3 turns a LLaMA shape into it.
hf_file(hf_qwen3_32b [=[{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 25600, "max_position_embeddings": 40960, "max_window_layers": 64,
  "model_type": "qwen3", "num_attention_heads": 64, "num_hidden_layers": 64,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936}]=])
string(CONCAT qwen3_32b "model: qwen3, 64 layers, hidden 5120, ffn 25600, heads 64, kv_heads 8, "
  "head_dim 128, vocab 151936.*peak per-GPU memory: 25.52 GiB -> 14.31 GiB, saving 43.9%.*"
  "query_norm_input +bf16\\[0-15\\]\n +key_norm_input +bf16\\[0-15\\]")
set(qwen3_args --tp 8 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 40)
check(qwen3_preset 0 "${qwen3_32b}" --preset qwen3-32b ${qwen3_args})
check(qwen3_hf_config 0 "${qwen3_32b}" --hf-config ${hf_qwen3_32b} ${qwen3_args})
check(qwen3_style 0 "model: qwen3, 64 layers, hidden 5120, ffn 27648, heads 40"
  --preset qwen2.5-32b --style qwen3)
check(unknown_style 1 "agoq_plan: .*unknown block style 'mixtral' \\(styles: llama, gpt, qwen3, \
gemma2, gemma3\\)"
  --style mixtral)
hf_file(hf_llama_moe [=[{"model_type": "llama", "num_local_experts": 8, "hidden_size": 4096}]=])
check(hf_config_moe 1
  "agoq_plan: .*'num_local_experts' is set: mixture-of-experts models \\(llama\\) are not"
  --hf-config ${hf_llama_moe})
# Mixture-of-experts models: Mixtral-8x7B's config.json gives its preset's figures on 128 GPUs
# (TP 2 + SP, EP 4 with etp = tp: one expert data-parallel rank), the router's probabilities kept
# fp32 and the experts' tensors planned; the flags build the same model from LLaMA-3-8B's
# attention; Qwen3-30B-A3B with etp 1; the layouts and flags Megatron-Core refuses.
hf_file(hf_mixtral [=[{"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
  "vocab_size": 32000}]=])
string(CONCAT mixtral "model: llama, 32 layers, hidden 4096, ffn 0, heads 32, kv_heads 8, "
  "head_dim 128, vocab 32000\nexperts: 8 of ffn 14336, 2 a token; ep 4, etp 2 \\(expert data "
  "parallel 1\\).*peak per-GPU memory: 58.79 GiB -> 33.74 GiB, saving 42.6%.*"
  "router_probs +fp32\\[0-7\\]\n +expert_input +int")
set(mixtral_args --tp 2 --sp --pp 4 --dp 4 --ep 4 --zero 1 --seq 8192 --budget-gib 40)
check(moe_preset 0 "${mixtral}" --preset mixtral-8x7b ${mixtral_args})
check(moe_hf_config 0 "${mixtral}" --hf-config ${hf_mixtral} ${mixtral_args})
check(moe_flags 0 "${mixtral}" --preset llama3-8b --vocab 32000 --ffn 0 --experts 8
  --experts-per-token 2 --expert-ffn 14336 ${mixtral_args})
check(moe_etp 0 "experts: 128 of ffn 768, 8 a token; ep 8, etp 1 \\(expert data parallel 2\\).*\
peak per-GPU memory: 34.20 GiB -> 20.17 GiB, saving 41.0%"
  --preset qwen3-30b-a3b --tp 2 --sp --pp 4 --dp 8 --ep 8 --etp 1 --zero 1 --seq 8192)
check(moe_json 0 "\"experts\": 128, \"experts_per_token\": 8, \"expert_ffn\": 768, \
\"shared_expert_ffn\": 0, \"shared_expert_gate\": false}.*\
\"sp\": true, \"ep\": 8, \"etp\": 1}"
  --preset qwen3-30b-a3b --tp 2 --sp --pp 4 --dp 8 --ep 8 --etp 1 --zero 1 --json)
check(moe_ep 1 "agoq_plan: .*ep \\(3\\) must divide the experts \\(8\\)"
  --preset mixtral-8x7b --ep 3)
check(moe_ranks 1 "agoq_plan: .*ep x etp \\(8 x 2\\) must divide the ranks of a pipeline stage"
  --preset mixtral-8x7b --tp 2 --sp --dp 4 --ep 8)
check(moe_no_sp 1 "agoq_plan: .*with tp > 1 needs sequence parallelism"
  --preset mixtral-8x7b --tp 2)
check(moe_dense 1 "agoq_plan: .*ep and etp are a mixture-of-experts model's" --ep 2)
check(moe_ffn 1 "agoq_plan: .*a mixture-of-experts model has ffn 0" --experts 8
  --experts-per-token 2 --expert-ffn 14336)
check(moe_help 0 "--experts N \\(with --experts-per-token K and --expert-ffn F" --help)
# A capacity factor pads each expert's pairs to ceil(1.25 x the mean): more activations.
check(moe_capacity 0 "ep 4, etp 2 \\(expert data parallel 1\\), capacity factor 1.25\n.*\
peak per-GPU memory: 65.20 GiB -> 35.58 GiB, saving 45.4%"
  --preset mixtral-8x7b ${mixtral_args} --expert-capacity-factor 1.25)
check(moe_capacity_json 0 "\"recompute_modules\": \\[\\], \"expert_capacity_factor\": 1.25}"
  --preset mixtral-8x7b --expert-capacity-factor 1.25 --json)
check(moe_capacity_bad 1 "agoq_plan: .*the expert capacity factor must be finite and >= 0"
  --preset mixtral-8x7b --expert-capacity-factor -1)
check(moe_capacity_dense 1 "agoq_plan: .*an expert capacity factor needs a mixture-of-experts"
  --expert-capacity-factor 1.25)
# Gated shared experts: Qwen2-57B-A14B's config.json gives its preset's figures on 128 GPUs, the
# shared experts' three tensors quantized, their output int4 and gate score bf16; the flags build
# the same model; ungated, the gate's two tensors and its weight are gone.
hf_file(hf_qwen2_moe [=[{"architectures": ["Qwen2MoeForCausalLM"], "hidden_act": "silu",
  "hidden_size": 3584, "intermediate_size": 18944, "model_type": "qwen2_moe",
  "moe_intermediate_size": 2560, "num_attention_heads": 28, "num_experts": 64,
  "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "shared_expert_intermediate_size": 20480, "tie_word_embeddings": false,
  "vocab_size": 151936}]=])
string(CONCAT qwen2_moe "experts: 64 of ffn 2560, 8 a token; ep 8, etp 1 \\(expert data parallel "
  "4\\); shared experts of ffn 20480, gated\n.*peak per-GPU memory: 37.21 GiB -> 18.67 GiB, "
  "saving 49.8%.*expert_swiglu_output +int[^\n]*\n +gate_output +int[^\n]*\n +up_output +int"
  "[^\n]*\n +swiglu_output +int[^\n]*\n +shared_expert_output +int[^\n]*\n +"
  "shared_gate_score +bf16")
set(qwen2_moe_args --tp 4 --sp --pp 4 --dp 8 --ep 8 --etp 1 --zero 1 --budget-gib 19)
check(shared_preset 0 "${qwen2_moe}" --preset qwen2-57b-a14b ${qwen2_moe_args})
check(shared_hf_config 0 "${qwen2_moe}" --hf-config ${hf_qwen2_moe} ${qwen2_moe_args})
check(shared_flags 0 "${qwen2_moe}" --preset qwen3-30b-a3b --style llama --layers 28
  --hidden 3584 --heads 28 --experts 64 --expert-ffn 2560 --shared-expert-ffn 20480
  --shared-expert-gate ${qwen2_moe_args})
check(shared_ungated 0 "shared experts of ffn 20480\n.*\n +swiglu_output +int[^\n]*\nstage 1:"
  --preset qwen2-57b-a14b --no-shared-expert-gate ${qwen2_moe_args})
check(shared_json 0 "\"shared_expert_ffn\": 20480, \"shared_expert_gate\": true}"
  --preset qwen2-57b-a14b ${qwen2_moe_args} --json)
check(shared_dense 1 "agoq_plan: .*shared_expert_ffn and shared_expert_gate need experts > 0"
  --shared-expert-ffn 4096)
check(shared_gate_alone 1 "agoq_plan: .*shared_expert_gate needs shared experts"
  --preset mixtral-8x7b --shared-expert-gate)
check(shared_tp 1 "agoq_plan: .*tp \\(8\\) must divide heads \\(32\\) and \
shared_expert_ffn \\(100\\)"
  --preset mixtral-8x7b --shared-expert-ffn 100 --tp 8 --sp)
check(shared_help 0 "--shared-expert-ffn N adds shared experts" --help)
check_config(shared_config "shared experts of ffn 5632, gated" "experts=60\nexperts-per-token=4\n\
expert-ffn=1408\nshared-expert-ffn=5632\nshared-expert-gate=1\n"
  --preset qwen3-30b-a3b --style llama)
# Megatron-Core's MoE recompute modules: moe_act drops the experts' SwiGLU output at no FLOPs;
# every set of a MoE model's modules is an option (no mlp), moe of least error within 30 GiB.
check(moe_act 0 "recompute modules: moe_act \\(in every layer, computed again in the backward: \
expert_swiglu_output\\)\n.*peak per-GPU memory: 51.79 GiB -> 31.88 GiB, saving 38.4%.*\
expert_swiglu_output recomputed\\[0-7\\]"
  --preset mixtral-8x7b ${mixtral_args} --recompute-modules moe_act)
check(moe_recompute_options 0 "\nmoe_act +\\+0.0% +31.88 +falls short by 1.88 GiB\n.*\
\ncore_attn,layernorm,moe +\\+29.8% +28.08 +0\n.*\
least error adding at most 100.0%: layernorm,moe \\(\\+27.2%, error 0\\)"
  --preset mixtral-8x7b ${mixtral_args} --budget-gib 30 --recompute-options)
check(shared_recompute_options 0 "\ncore_attn,layernorm,moe_act,shared_experts +\\+16.0% +"
  --preset qwen2-57b-a14b ${qwen2_moe_args} --budget-gib 17 --recompute-options)
check(moe_modules_dense 1 "agoq_plan: .*moe_act, moe and shared_experts recompute a \
mixture-of-experts MLP's tensors; a dense MLP's module is mlp" --recompute-modules moe)
check(moe_modules_mlp 1 "agoq_plan: .*mlp recomputes a dense MLP; a mixture-of-experts layer's \
are moe_act, moe and shared_experts" --preset mixtral-8x7b --recompute-modules mlp)
check(moe_modules_shared 1 "agoq_plan: .*shared_experts recomputes the shared experts' tensors; \
this model has none" --preset mixtral-8x7b --recompute-modules shared_experts)
hf_file(hf_gemma3n [=[{"model_type": "gemma3n", "hidden_size": 3072}]=])
check(hf_config_type 1 "agoq_plan: .*model_type 'gemma3n' is not modelled"
  --hf-config ${hf_gemma3n})
# Gemma: Gemma-2-27B on 64 GPUs; Gemma-2-9B's config.json, its post-norms' inputs planned at 8
# bits within 30 GiB; Gemma 3's multimodal config refused for its text_config.
check(gemma_preset 0 "model: gemma2, 46 layers, hidden 4608, ffn 36864, heads 32, kv_heads 16, \
head_dim 128, vocab 256000\n.*peak per-GPU memory: 52.67 GiB -> 26.18 GiB, saving 50.3%"
  --preset gemma2-27b --tp 4 --sp --pp 2 --dp 8 --zero 1)
hf_file(hf_gemma2 [=[{"architectures": ["Gemma2ForCausalLM"], "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
  "model_type": "gemma2", "num_attention_heads": 16, "num_hidden_layers": 42,
  "num_key_value_heads": 8, "vocab_size": 256000}]=])
check(gemma_hf_config 0 "model: gemma2, 42 layers.*47.26 GiB -> 27.63 GiB, saving 41.5%.*\
stage 0: [^\n]*\n(  [^\n]*\n)*  post_attn_norm_input int8_g128_sym_rne_f32\\[0-20\\]\n"
  --hf-config ${hf_gemma2} --tp 2 --sp --pp 2 --dp 4 --zero 1 --budget-gib 30)
check(gemma_style 0 "model: gemma3, 26 layers.*23.85 GiB -> 18.96 GiB, saving 20.5%"
  --preset gemma2-2b --style gemma3 --hidden 1152 --ffn 6912 --heads 4 --kv-heads 1
  --vocab 262144 --pp 2 --dp 8 --zero 1)
hf_file(hf_gemma3 [=[{"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}]=])
check(gemma3_nested 1 "agoq_plan: .*model_type 'gemma3' nests its text model: pass its \
text_config" --hf-config ${hf_gemma3})
hf_file(hf_bad [=[{"model_type": "llama",}]=])
check(hf_config_json 1 "agoq_plan: .*hf config: expected a string key at byte 23"
  --hf-config ${hf_bad})
check(hf_config_missing 1 "agoq_plan: cannot open hf-config file '/nonexistent/config.json'"
  --hf-config /nonexistent/config.json)
check(interleaved 0 "pp 4 \\(interleaved, v = 2, megatron-core, groups of 4\\).*micro-batches 8"
  --pp 4 --vp 2 --micro-batches 8)
check(verbose 0 "transient: working \\(layer or head backward\\) \\+ gradient buffers \\+ reserved"
  --pp 2 --verbose)

# Full activation recomputation (the memory model's terms: memory_model_test, "activation
# recomputation, by hand"): every layer its own checkpoint, then the plan under block recomputation
# of each chunk's first 2 layers, which it shows as recomputed.
string(CONCAT recompute "recompute: uniform, 1 layer a checkpoint, 8 of each model chunk's 8.*"
  "peak per-GPU memory: 14.42 GiB -> 11.99 GiB, saving 16.8%")
check(recompute 0 "${recompute}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192
  --recompute uniform --recompute-layers 1)
string(CONCAT recompute_plan "recompute: block, 1 layer a checkpoint, 2 of each model chunk's 8.*"
  "stage 0: total 14.00 GiB.*attn_norm_input   recomputed\\[0-1\\] int8_g128_sym_rne_f32\\[2-7\\]")
check(recompute_plan 0 "${recompute_plan}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp
  --seq 8192 --recompute block --recompute-layers 2 --budget-gib 14)
check(recompute_json 0 "\"recompute\": \"uniform\", \"recompute_layers\": 4.*\"recomputed\": true"
  --pp 2 --recompute uniform --recompute-layers 4 --budget-gib 80 --json)

# The fewest layers block recomputation needs for each side to fit (planner_test checks
# least_block_recompute against make_plan's boundary).
string(CONCAT fit "fewest layers of each model chunk's 8 to recompute \\(block\\) "
  "within 16.00 GiB: baseline 7, agoq 0")
check(fit_recompute 0 "${fit}"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 16 --fit-recompute)
check(fit_recompute_json 0 "\"fit_recompute\": {\"baseline\": null, \"agoq\": 2}"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 14
  --recompute block --recompute-layers 2 --fit-recompute --json)

# Selective recomputation (Megatron's --recompute-modules): the norms' outputs and the MLP's inner
# tensors of every layer are not kept but computed again in the backward, so the README's command
# keeps 7 of each layer's 12 saved tensors (the peaks are the memory model's). The plan shows the
# other 5 as recomputed in every layer of each stage (one run per kind).
set(selective_args --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192
  --recompute-modules layernorm,mlp)
string(CONCAT selective "recompute modules: layernorm,mlp \\(in every layer, computed again in the "
  "backward: qkv_input mlp_input gate_output up_output swiglu_output\\)\n.*"
  "peak per-GPU memory: 15.64 GiB -> 12.10 GiB, saving 22.6%.*"
  "stage 0: total 12.72 GiB[^\n]*\n  attn_norm_input   bf16\\[0-7\\]\n"
  "  qkv_input         recomputed\\[0-7\\]\n.*"
  "  mlp_input         recomputed\\[0-7\\]\n  gate_output       recomputed\\[0-7\\]\n.*"
  "stage 3: total 12.34 GiB.*  swiglu_output     recomputed\\[24-31\\]")
check(recompute_modules 0 "${selective}" ${selective_args} --budget-gib 14)
# Held only in the backward: no copy in flight.
check(recompute_modules_verbose 0
  "    layer   9 gate_output       recomputed  +112.00 MiB x 0  error 0\n"
  ${selective_args} --budget-gib 14 --verbose)
# A config file's key, and a flag after it replacing its modules.
check_config(recompute_modules_config
  "recompute modules: core_attn \\(in every layer, computed again in the backward: softmax_lse\\)"
  "preset = llama3-8b\nrecompute-modules = core_attn   # the logsumexp\n")
check(recompute_modules_config_then_flag 0
  "recompute modules: mlp \\([^\n]*backward: gate_output up_output swiglu_output\\)"
  --config ${CMAKE_CURRENT_BINARY_DIR}/plan_cli_recompute_modules_config.conf
  --recompute-modules mlp)
# GPT's kinds, and the modules printed in Megatron's order whatever the order given.
check(recompute_modules_gpt 0
  "recompute modules: layernorm,mlp \\([^\n]*backward: qkv_input fc1_input gelu_input fc2_input\\)"
  --preset gpt3-1.3b --pp 2 --recompute-modules mlp,layernorm)
string(CONCAT selective_json "\"recompute\": \"none\", \"recompute_layers\": 0, "
  "\"recompute_modules\": \\[\"layernorm\", \"mlp\"\\]")
check(recompute_modules_json 0 "${selective_json}" ${selective_args} --json)
# --fit-recompute tries full recomputation alone, without the modules: the figures of
# fit_recompute_json, and a note saying so.
string(CONCAT selective_fit "within 14.00 GiB: baseline none fits, agoq 2 \\(full recomputation "
  "alone, without the recompute modules\\)")
check(recompute_modules_fit 0 "${selective_fit}" ${selective_args} --budget-gib 14 --fit-recompute)
check(recompute_modules_fit_json 0 "\"fit_recompute\": {\"baseline\": null, \"agoq\": 2}"
  ${selective_args} --budget-gib 14 --fit-recompute --json)
check(recompute_modules_unknown 1
  "agoq_plan: .*unknown module 'bogus' \\(modules: core_attn, layernorm, mlp, moe_act, moe, \
shared_experts\\)"
  --recompute-modules bogus)
check(recompute_modules_empty_item 1 "agoq_plan: .*recompute_modules: unknown module ''"
  --recompute-modules layernorm,,mlp)
check(recompute_modules_trailing_comma 1 "agoq_plan: .*recompute_modules: unknown module ''"
  --recompute-modules mlp,)
string(CONCAT both "agoq_plan: .*full recomputation \\(recompute uniform\\) and selective "
  "recomputation \\(modules mlp\\) exclude each other")
check(recompute_modules_and_full 1 "${both}"
  --recompute uniform --recompute-layers 1 --recompute-modules mlp)

# --recompute-options: the README's layout within 15 GiB, each set of modules and each full
# recomputation planned (the planner's and layer_forward_flops' figures, which planner_test
# checks by hand), least error within 5% and 10% more matrix FLOPs (layernorm: recomputing the
# norms adds none; block 2: 8 of the 32 layers run twice), and in JSON.
string(CONCAT options_table "recompute +FLOPs +peak GiB +plan error\n"
  "none +\\+0.0% +15.00 +7.024\n"
  "layernorm +\\+0.0% +15.00 +3.197\n"
  "block 1 +\\+3.9% +14.98 +5.042\n"
  "core_attn +\\+4.2% +14.98 +7.024\n.*"
  "block 2 +\\+7.8% +15.00 +1.927\n.*"
  "layernorm,mlp +\\+21.9% +12.72 +0\n.*"
  "uniform 1 +\\+31.3% +11.99 +0\n.*"
  "uniform 8 +\\+31.3% +15.50 +falls short by 0.50 GiB\n"
  "least error adding at most 5.0%: layernorm \\(\\+0.0%, error 3.197\\)\n"
  "baseline \\(bf16 activations, fp32 gradients and Adam\\): least recomputation that fits: "
  "block 7 \\(\\+27.4%, peak 14.92 GiB\\)")
check(recompute_options 0 "${options_table}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1
  --sp --seq 8192 --budget-gib 15 --recompute-options --max-recompute-overhead 5)
check(recompute_options_full 0
  "least error adding at most 10.0%: block 2 \\(\\+7.8%, error 1.927\\)"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 15
  --recompute-options --max-recompute-overhead 10)
check(recompute_options_all 0 "least error adding at most 100.0%: mlp \\(\\+21.9%, error 0\\)"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 15
  --recompute-options)
string(CONCAT options_short "none +\\+0.0% +[0-9.]+ +falls short by [0-9.]+ GiB\n.*"
  "least error adding at most 100.0%: layernorm,mlp \\(\\+21.9%, error 0\\)\n"
  "baseline \\(bf16 activations, fp32 gradients and Adam\\): no recomputation fits\n\n"
  "the step as given: no plan fits the budget of 13.00 GiB per GPU: pipeline stage 0 needs 1.87 "
  "GiB more \\(14.87 GiB: ")
check(recompute_options_short 0 "${options_short}" --preset llama3-8b --tp 2 --pp 4 --dp 4
  --zero 1 --sp --seq 8192
  --budget-gib 13 --recompute-options)
string(CONCAT options_json "\"recompute_options\": {\"max_overhead\": 0.05[0-9]*, \"options\": \\[{"
  "\"recompute\": \"none\", \"recompute_layers\": 0, \"modules\": \\[\\], \"overhead\": 0, "
  "\"fits\": true, .*{\"recompute\": \"block\", \"recompute_layers\": 1, \"modules\": \\[\\], "
  "\"overhead\": 0.03[0-9]*, .*\"baseline\": {\"recompute\": \"block\", \"recompute_layers\": 7, "
  "\"modules\": \\[\\], \"overhead\": 0.27[0-9]*, \"fits\": true, \"error\": 0, .*"
  "\"least_error\": {\"recompute\": \"none\", "
  "\"recompute_layers\": 0, \"modules\": \\[\"layernorm\"\\], \"overhead\": 0, \"fits\": true, "
  "\"error\": 3.19[0-9]*, \"peak_bytes\": [0-9]+}}")
check(recompute_options_json 0 "${options_json}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1
  --sp --seq 8192 --budget-gib 15 --recompute-options --max-recompute-overhead 5 --json)
string(CONCAT options_short_json "\"plan_error\": \"no plan fits the budget of 13.00 GiB per GPU: "
  "pipeline stage 0 needs 1.87 GiB more.*\"baseline\": null, \"least_error\": {\"recompute\": "
  "\"none\", "
  "\"recompute_layers\": 0, \"modules\": \\[\"layernorm\", \"mlp\"\\], ")
check(recompute_options_short_json 0 "${options_short_json}" --preset llama3-8b --tp 2 --pp 4
  --dp 4 --zero 1 --sp --seq 8192 --budget-gib 13 --recompute-options --json)
check(recompute_options_without_budget 1 "agoq_plan: --recompute-options needs --budget-gib"
  --recompute-options)
check(bad_max_overhead 1
  "agoq_plan: max-recompute-overhead must be a finite percentage of at least 0, got '-1'"
  --budget-gib 15 --recompute-options --max-recompute-overhead -1)

# Context parallelism: CP 2 over 16384-token sequences keeps CP 1's activations at 8192 (17.02
# GiB on stage 0) with ZeRO-1 over dp x cp = 8 (memory_model_test checks it by hand).
string(CONCAT cp_table "parallel: tp 2, pp 4 \\(1F1B\\), dp 4, cp 2, ZeRO-1, sp on; "
  "micro-batch 1 x seq 16384.*\n"
  "     0      8         4     2.11     0.53     4.23     1.06     0.00       17.02")
check(context_parallel 0 "${cp_table}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --cp 2 --zero 1
  --sp --seq 16384)
check(context_parallel_json 0 "\"dp\": 4, \"cp\": 2, \"zero\": 1" --preset llama3-8b --pp 4
  --dp 4 --cp 2 --zero 1 --seq 16384 --json)
check(bad_cp_split 1 "agoq_plan: .*seq \\(8192\\) must split into 2 cp = 6 equal chunks"
  --cp 3 --seq 8192)
check(zero_cp 1 "agoq_plan: .*tp, pp, dp, cp and virtual_stages must be positive" --cp 0)

# Bad input: exit status 1 and a message naming the problem.
check(fit_without_budget 1 "agoq_plan: --fit-recompute needs --budget-gib" --fit-recompute)
check(bad_recompute 1 "agoq_plan: recompute: none\\|uniform\\|block" --recompute selective)
check(recompute_without_layers 1
  "agoq_plan: .*recompute_layers .* must be at least 1 with recompute uniform and 0 without, got 0"
  --recompute uniform)
check(layers_without_recompute 1
  "agoq_plan: .*must be at least 1 with recompute none and 0 without, got 2" --recompute-layers 2)
check(unknown_preset 1
  "agoq_plan: .*unknown preset 'deepseek-v3' \\(presets: ${presets}\\)"
  --preset deepseek-v3)
check(bad_integer 1 "agoq_plan: bad integer for tp: 'two'" --tp two)
check(trailing_garbage 1 "agoq_plan: bad integer for layers: '32x'" --layers 32x)
check(bad_number 1 "agoq_plan: bad number for budget-gib: 'lots'" --budget-gib lots)
check(negative_budget 1
  "agoq_plan: budget-gib must be a number of GiB above 0 and below 2\\^32, got '-5'"
  --budget-gib -5)
check(zero_budget 1 "agoq_plan: budget-gib must be a number of GiB above 0" --budget-gib 0)
check(infinite_budget 1 "agoq_plan: budget-gib must be a number of GiB above 0" --budget-gib inf)
check(nan_reserve 1
  "agoq_plan: reserved-gib must be a number of GiB of at least 0 and below 2\\^32, got 'nan'"
  --reserved-gib nan)
check(zero_stage_range 1 "agoq_plan: zero is 0, 1, 2 or 3, got 4294967297" --zero 4294967297)
check(missing_value 1 "agoq_plan: --layers needs a value" --layers)
check(unknown_key 1 "agoq_plan: unknown key 'frobnicate'" --frobnicate 3)
check(positional 1 "agoq_plan: unexpected argument 'llama'" llama)
check(missing_config 1 "agoq_plan: cannot open config file '/nonexistent/plan.conf'"
  --config /nonexistent/plan.conf)
check(bad_choice 1 "agoq_plan: grad: fp32\\|bf16\\|int8" --grad fp16)
check(invalid_parallel 1 "agoq_plan: .*tp \\(3\\) must divide heads \\(32\\) and ffn \\(14336\\)"
  --tp 3)
check(invalid_kv_heads 1 "agoq_plan: .*kv_heads \\(8\\) and tp \\(12\\) must divide one another"
  --tp 12 --kv-heads 8 --heads 48 --ffn 12288)
# Sizes past 64-bit byte counts: refused, where they used to wrap around into a negative extent or a
# planned peak of 0.00 GiB.
check(huge_model 1 "agoq_plan: .*model_shape: too large to count in 64-bit bytes"
  --hidden 99999999999999)
check(huge_tokens 1 "agoq_plan: .*tokens are too many to count in 64-bit bytes"
  --seq 4000000000000)
check(huge_dp 1 "agoq_plan: .*estimate_memory: the step is too large to count in 64-bit bytes"
  --dp 4000000000000000000 --zero 3)
check(huge_group 1 "agoq_plan: .*in_flight: the schedule is too large to count in 64 bits"
  --pp 4 --vp 2 --vp-group 4000000000000000000)
# The largest budget keeps every tensor in bf16 (the summed rooms of the peak moments used to wrap).
check(largest_budget 0 "stage 2: [^\n]*error 0 \\(optimum >= 0\\)"
  --pp 4 --vp 2 --budget-gib 4294967295)
# A budget below the least any plan needs: the tables, then the shortfall in GiB as the output's
# last line (no usage text after it), exit status 1; in JSON as plan_error.
string(CONCAT infeasible "peak per-GPU memory: 27.91 GiB -> 14.87 GiB, saving 46.7%\n"
  "agoq_plan: no plan fits the budget of 2.00 GiB per GPU: pipeline stage 0 needs 12.87 GiB more "
  "\\(14.87 GiB: [0-9.]+ of weights, gradients and optimizer states, [0-9.]+ of transient working "
  "memory and [0-9.]+ of activations with every saved tensor at its smallest candidate\\); "
  "--recompute-options says which recomputation would fit, --fit-recompute how many layers of "
  "block recomputation\n$")
check(infeasible_budget 1 "${infeasible}" --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp
  --seq 8192 --budget-gib 2)
check(infeasible_budget_json 1
  "\"plan_error\": \"no plan fits the budget of 2.00 GiB per GPU: [^\"]+\"}\nagoq_plan: no plan"
  --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 2 --json)

# The error model's per-kind weights: printed with the plan and steering it. With SwiGLU's output
# weighing nothing, stage 0 of the README's command stores it at int4 in every layer (int8 in layers
# 0-4 by default) and spends the bytes on the gate and up outputs. A config file says the same as
# the flags (the lines examples/pytorch/sensitivity.py --plan-config writes).
set(readme_args --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 --budget-gib 16)
string(CONCAT default_weights
  "kind sensitivity/outlier: attn_norm_input 4/6 qkv_input 1/3 query 8/2 .* swiglu_output 1/4\n.*"
  "swiglu_output     int8_g128_sym_rne_f32\\[0-4\\] int4_g128_sym_rne_f32\\[5-7\\]")
check(default_weights 0 "${default_weights}" ${readme_args})
string(CONCAT no_swiglu_weight "swiglu_output 0/4\n.*stage 0:[^\n]*\n.*"
  "gate_output       int8_g128_sym_rne_f32\\[0-2\\] int4_g128_sym_rne_f32\\[3-7\\].*"
  "swiglu_output     int4_g128_sym_rne_f32\\[0-7\\]\nstage 1")
check(sensitivity_flag 0 "${no_swiglu_weight}" ${readme_args} --sensitivity swiglu_output=0)
check_config(sensitivity_config "qkv_input 1/4.5 .*${no_swiglu_weight}"
  "# measured sensitivities\nsensitivity = swiglu_output=0\noutlier=qkv_input=4.5\n" ${readme_args})
# One layer's weight alone: layers 0 and 7 of stage 0 keep their gate outputs at int8.
string(CONCAT per_layer "sensitivity per layer, kind@layer: gate_output@0 40 gate_output@7 40\n"
  ".*gate_output       int8_g128_sym_rne_f32\\[0\\] int4_g128_sym_rne_f32\\[1-6\\] "
  "int8_g128_sym_rne_f32\\[7\\]\n")
check(sensitivity_per_layer 0 "${per_layer}" ${readme_args} --sensitivity gate_output@7=40
  --sensitivity gate_output@0=40)
check(sensitivity_past_the_layers 1
  "agoq_plan: .*per-layer sensitivity or statistics for layer 32, past the model's 32 layers"
  ${readme_args} --sensitivity gate_output@32=1)
check(sensitivity_negative_layer 1 "agoq_plan: .*the layer must be >= 0, got -1"
  --sensitivity gate_output@-1=1)
check(sensitivity_bad_layer 1 "agoq_plan: bad integer for sensitivity: 'x'"
  --sensitivity gate_output@x=1)
check(outlier_per_layer 1 "agoq_plan: outlier is KIND=X, got 'key@1=4'" --outlier key@1=4)
check(sensitivity_no_value 1
  "agoq_plan: sensitivity is KIND=X or KIND@LAYER=X, got 'qkv_input'" --sensitivity qkv_input)
check(sensitivity_unknown_kind 1 "agoq_plan: .*unknown tensor kind 'qkv'" --sensitivity qkv=1)
check(sensitivity_bad_number 1 "agoq_plan: bad number for sensitivity: '1x'"
  --sensitivity qkv_input=1x)
check(sensitivity_negative 1 "agoq_plan: .*sensitivity must be finite and >= 0"
  --sensitivity qkv_input=-1)
check(sensitivity_nan 1 "agoq_plan: .*sensitivity must be finite and >= 0"
  --sensitivity qkv_input=nan)
check(outlier_below_one 1 "agoq_plan: .*outlier factor must be >= 1" --outlier key=0.5)

# --json: the same figures in bytes, one document that CMake's own parser reads.
# json_get(<var> <args...>): string(JSON <var> GET <document> <args...>), an error if absent.
function(json_get var)
  string(JSON value ERROR_VARIABLE error GET "${doc}" ${ARGN})
  if(error)
    message(SEND_ERROR "json: ${ARGN}: ${error}")
  endif()
  set(${var} "${value}" PARENT_SCOPE)
endfunction()

execute_process(COMMAND ${PLAN} --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192
                  --budget-gib 16 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE doc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(SEND_ERROR "json: exit status ${rc}: ${err}")
else()
  # The peaks the table prints, 27.91 and 14.87 GiB, in hundredths of a GiB rounded.
  json_get(peak peak_bytes baseline)
  math(EXPR centi "(${peak} * 100 + (1 << 29)) >> 30")
  json_get(agoq_peak peak_bytes agoq)
  math(EXPR agoq_centi "(${agoq_peak} * 100 + (1 << 29)) >> 30")
  json_get(kv model kv_heads)
  json_get(rules parallel vp_rules)
  json_get(budget plan budget_bytes)
  string(JSON stages LENGTH "${doc}" plan stages)
  if(NOT centi EQUAL 2791 OR NOT agoq_centi EQUAL 1487 OR NOT kv EQUAL 8
     OR NOT rules STREQUAL "megatron-core" OR NOT budget EQUAL 17179869184 OR NOT stages EQUAL 4)
    message(SEND_ERROR "json: peaks ${centi}, ${agoq_centi} (1/100 GiB), kv_heads ${kv}, "
                       "vp_rules ${rules}, budget ${budget}, ${stages} stages")
  endif()
  # Each planned stage within the budget, its total the sum of its parts.
  math(EXPR last "${stages} - 1")
  foreach(i RANGE ${last})
    set(sum 0)
    foreach(part weights master_weights gradients optimizer gathered_weights activations
                 head_activations working gradient_buffers reserved recompute)
      json_get(bytes plan stages ${i} memory ${part})
      math(EXPR sum "${sum} + ${bytes}")
    endforeach()
    json_get(total plan stages ${i} memory total)
    if(NOT sum EQUAL total OR total GREATER budget)
      message(SEND_ERROR "json: stage ${i}: total ${total}, parts ${sum}, budget ${budget}")
    endif()
  endforeach()
  json_get(w error_model qkv_input sensitivity)
  json_get(k error_model attn_norm_input outlier)
  string(JSON lse_alias ERROR_VARIABLE no_alias GET "${doc}" error_model o_proj_input)
  string(JSON per_layer LENGTH "${doc}" error_model per_layer)
  if(NOT w EQUAL 1 OR NOT k EQUAL 6 OR NOT no_alias OR NOT per_layer EQUAL 0)
    message(SEND_ERROR "json: error model qkv_input sensitivity ${w}, attn_norm_input outlier "
                       "${k}, o_proj_input '${lse_alias}', ${per_layer} per layer")
  endif()
  json_get(kind plan stages 0 tensors 0 kind)
  json_get(layer plan stages 0 tensors 0 layer)
  if(NOT kind STREQUAL "attn_norm_input" OR NOT layer EQUAL 0)
    message(SEND_ERROR "json: the first planned tensor is ${kind} of layer ${layer}")
  endif()
  string(JSON modules_type TYPE "${doc}" step recompute_modules)
  string(JSON modules LENGTH "${doc}" step recompute_modules)
  if(NOT modules_type STREQUAL "ARRAY" OR NOT modules EQUAL 0)
    message(SEND_ERROR "json: recompute_modules is a ${modules_type} of ${modules}")
  endif()
  message(STATUS "json: ok")
endif()

# Without a budget the document holds no plan.
execute_process(COMMAND ${PLAN} --pp 2 --json RESULT_VARIABLE rc OUTPUT_VARIABLE doc)
string(JSON plan_type ERROR_VARIABLE missing TYPE "${doc}" plan)
string(JSON stages LENGTH "${doc}" agoq)
if(NOT rc EQUAL 0 OR NOT missing OR NOT stages EQUAL 2)
  message(SEND_ERROR "json_no_budget: exit status ${rc}, plan '${plan_type}', ${stages} stages")
else()
  message(STATUS "json_no_budget: ok")
endif()

# The per-layer weights in the JSON document.
execute_process(COMMAND ${PLAN} --pp 2 --json --sensitivity key@1=3 --sensitivity key=0.5
                RESULT_VARIABLE rc OUTPUT_VARIABLE doc)
string(JSON n ERROR_VARIABLE e1 LENGTH "${doc}" error_model per_layer)
string(JSON layer ERROR_VARIABLE e2 GET "${doc}" error_model per_layer 0 layer)
string(JSON kind ERROR_VARIABLE e3 GET "${doc}" error_model per_layer 0 kind)
string(JSON w ERROR_VARIABLE e4 GET "${doc}" error_model per_layer 0 sensitivity)
string(JSON kw ERROR_VARIABLE e5 GET "${doc}" error_model key sensitivity)
if(NOT rc EQUAL 0 OR NOT n EQUAL 1 OR NOT layer EQUAL 1 OR NOT kind STREQUAL "key" OR
   NOT w EQUAL 3 OR NOT kw STREQUAL "0.5")
  message(SEND_ERROR "json_per_layer: exit status ${rc}, ${n} entries, layer ${layer}, kind "
                     "${kind}, weight ${w}, the kind's ${kw}")
else()
  message(STATUS "json_per_layer: ok")
endif()

# Selective recomputation in the JSON document: the modules as a list, and in the plan the kinds
# they recompute, each recomputed in every layer, kept precise and never in flight.
execute_process(COMMAND ${PLAN} ${selective_args} --budget-gib 14 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE doc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(SEND_ERROR "json_recompute_modules: exit status ${rc}: ${err}")
else()
  json_get(first step recompute_modules 0)
  json_get(second step recompute_modules 1)
  string(JSON modules LENGTH "${doc}" step recompute_modules)
  set(recomputed_kinds "")
  string(JSON n LENGTH "${doc}" plan stages 0 tensors)
  math(EXPR last "${n} - 1")
  set(bad "")
  foreach(i RANGE ${last})
    json_get(kind plan stages 0 tensors ${i} kind)
    json_get(recomputed plan stages 0 tensors ${i} recomputed)
    json_get(in_flight plan stages 0 tensors ${i} in_flight)
    json_get(storage plan stages 0 tensors ${i} storage)
    if(recomputed)
      list(APPEND recomputed_kinds ${kind})
      if(NOT in_flight EQUAL 0 OR NOT storage STREQUAL "bf16")
        string(APPEND bad " ${kind}: ${storage} x ${in_flight}")
      endif()
    endif()
  endforeach()
  list(LENGTH recomputed_kinds recomputed_count)
  list(REMOVE_DUPLICATES recomputed_kinds)
  if(NOT first STREQUAL "layernorm" OR NOT second STREQUAL "mlp" OR NOT modules EQUAL 2
     OR NOT recomputed_kinds STREQUAL "qkv_input;mlp_input;gate_output;up_output;swiglu_output"
     OR NOT recomputed_count EQUAL 40 OR bad)
    message(SEND_ERROR "json_recompute_modules: modules ${first}, ${second} (${modules}); "
                       "${recomputed_count} recomputed on stage 0: ${recomputed_kinds};${bad}")
  else()
    message(STATUS "json_recompute_modules: ok")
  endif()
endif()
