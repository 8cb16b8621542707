#!/usr/bin/env bash
# Configures agoq's build tree in build/ (Release, warnings as errors). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_root="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda_root/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DAGOQ_WERROR=ON \
  -DCUDAToolkit_ROOT="$cuda_root" "$@" >/dev/null
