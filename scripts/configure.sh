#!/usr/bin/env bash
# Configures agoq's build tree in build/ (Release, warnings as errors). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_root="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda_root/bin:$PATH"
# The device benchmarks and tests for sm_90 alone (the H100/H200 their targets name;
# bench/device_check.sh builds its own tree), but device_test_float, which compiles the dispatch
# set for sm_80 and sm_90: the spill check on both (tests/CMakeLists.txt).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DAGOQ_WERROR=ON \
  -DAGOQ_BENCH_CUDA_ARCHITECTURES=90 -DAGOQ_DEVICE_TEST_CUDA_ARCHITECTURES=90 \
  -DCUDAToolkit_ROOT="$cuda_root" "$@" >/dev/null
