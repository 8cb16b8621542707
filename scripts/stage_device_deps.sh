#!/usr/bin/env bash
# Copies doctest and Google Benchmark (headers, CMake configs, library) from this machine's Debian
# packages into .deps/ (git-ignored), for a GPU machine that has nvcc and CMake but no Debian
# packages: carry .deps/ there and bench/device_check.sh finds them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
rm -rf .deps
mkdir -p .deps/include .deps/lib/cmake .deps/lib/x86_64-linux-gnu/cmake
cp -r /usr/include/doctest /usr/include/benchmark .deps/include/
cp -r /usr/lib/cmake/doctest .deps/lib/cmake/
cp -r /usr/lib/x86_64-linux-gnu/cmake/benchmark .deps/lib/x86_64-linux-gnu/cmake/
cp -a /usr/lib/x86_64-linux-gnu/libbenchmark.so* /usr/lib/x86_64-linux-gnu/libbenchmark_main.a \
  .deps/lib/x86_64-linux-gnu/
du -sh .deps
