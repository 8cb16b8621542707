#!/usr/bin/env bash
# Quick start, command 2: installs what is missing, builds everything and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/configure.sh
cmake --build build
cd build
ctest --output-on-failure -j "$(nproc)"
