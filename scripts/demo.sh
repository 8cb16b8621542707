#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds and runs the demo on the CPU (about 5
# minutes on 2 cores, most of it building the PyTorch extension the first time):
#   1. quantization schemes, the LLaMA-3-8B memory table and an 8-bit all-reduce (agoq_demo);
#   2. the activation plan agoq's planner picks for LLaMA-3-8B on 32 GPUs under 16 GiB (agoq_plan);
#   3. a small GPT trained data-parallel on 4 processes, fp32 against AGoQ (examples/pytorch).
# Arguments go to agoq_demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/configure.sh
cmake --build build --target agoq_demo agoq_plan
echo "== 1/3 schemes, memory, 8-bit all-reduce"
./build/examples/agoq_demo "$@"
echo
echo "== 2/3 LLaMA-3-8B: TP 2, PP 4, DP 4, ZeRO-1, sequence parallel, 8192 tokens, 16 GiB per GPU"
./build/examples/agoq_plan --preset llama3-8b --tp 2 --pp 4 --dp 4 --zero 1 --sp --seq 8192 \
  --budget-gib 16
echo
echo "== 3/3 data-parallel training in PyTorch: fp32 baseline against AGoQ"
python="$(scripts/torch_python.sh)"
"$python" examples/pytorch/demo.py
