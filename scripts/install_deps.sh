#!/usr/bin/env bash
# Installs what agoq's build, tests, benchmarks and demo need on Debian 12, when it is missing.
# The CUDA 13 toolkit (nvcc, CCCL) is a prerequisite and is not installed here. clang (Debian's
# clang 14) builds the consumer_clang test: the public headers under a second host compiler. The
# PyTorch example (examples/pytorch) uses Debian's torch: python3-torch, with libopenblas0-pthread
# (without it Debian's torch multiplies matrices with the reference BLAS, about 30x slower),
# python3-dev (the extension's build) and python3-matplotlib (the results plot).
set -euo pipefail

packages=(cmake ninja-build g++ clang doctest-dev libbenchmark-dev libboost-context-dev openmpi-bin
  libopenmpi-dev python3-torch libopenblas0-pthread python3-dev python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "agoq: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cuda_root="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$cuda_root/lib64/cmake/cccl/cccl-config.cmake" ] && [ ! -f "$cuda_root/lib/cmake/cccl/cccl-config.cmake" ]; then
  echo "agoq: the CUDA toolkit (with CCCL) was not found under $cuda_root; install CUDA 13 or set CUDA_HOME" >&2
  exit 1
fi
