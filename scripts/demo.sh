#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds and runs the demo (CPU executor).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/configure.sh
cmake --build build --target agoq_demo
./build/examples/agoq_demo "$@"
