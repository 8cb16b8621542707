#!/usr/bin/env bash
# The device tier in one go, on a machine with a CUDA GPU: builds for sm_90 (or $CUDA_ARCH),
# runs the device tests (ctest label gpu) and the quantized-matmul example, runs the device
# benchmarks, and writes a summary (pass/fail per test, GB/s and ratio to copy per kernel) to
# <out>/summary.md. About 3-5 minutes on an H100/H200.
#
#   bench/device_check.sh [out-dir]
#
# doctest and Google Benchmark come from the system, or from .deps/ (scripts/stage_device_deps.sh
# prepares it on a Debian machine).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-device-check}"
mkdir -p "$out"
arch="${CUDA_ARCH:-90}"
build=build-device

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_PREFIX_PATH="$PWD/.deps" -DAGOQ_WERROR=ON 2>&1 | tail -n 3 | tee "$out/configure.log"
targets=(quantize_device_test_float quantize_device_test_bfloat16 quantize_device_test_half
         adamw_device_test all_reduce_device_test quantize_device_bench optim_device_bench
         all_reduce_device_bench quantized_matmul)
if ! cmake --build "$build" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log"
  echo "build failed" >"$out/summary.md"
  exit 1
fi

(cd "$build" && ctest -L gpu --output-on-failure --timeout 600) >"$out/tests.log" 2>&1
tests_rc=$?
"$build/examples/quantized_matmul" >"$out/example.log" 2>&1
example_rc=$?
"$build/bench/quantize_device_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json >"$out/bench.log" 2>&1
bench_rc=$?
"$build/bench/optim_device_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/optim_bench.json" --benchmark_out_format=json >"$out/optim_bench.log" 2>&1
optim_rc=$?
[ "$bench_rc" -eq 0 ] && bench_rc=$optim_rc
"$build/bench/all_reduce_device_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/all_reduce_bench.json" --benchmark_out_format=json \
  >"$out/all_reduce_bench.log" 2>&1
all_reduce_rc=$?
[ "$bench_rc" -eq 0 ] && bench_rc=$all_reduce_rc

python3 bench/summarize_device.py "$out" "$tests_rc" "$example_rc" "$bench_rc" >"$out/summary.md"
cat "$out/summary.md"
[ "$tests_rc" -eq 0 ] && [ "$example_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
