#!/usr/bin/env bash
# Regenerates docs/results.md and docs/results_loss.png from scratch: installs what is missing, then
# trains every configuration of the PyTorch end-to-end proof (examples/pytorch/results.py; about
# 20 minutes on 2 cores). Extra arguments go to results.py (--steps N, --only NAME..., --report-only).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
python="$(scripts/torch_python.sh)"
exec "$python" examples/pytorch/results.py "$@"
