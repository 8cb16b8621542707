#!/usr/bin/env bash
# The device tier in one go, on a machine with a CUDA GPU: builds for sm_90 (or $CUDA_ARCH),
# runs the device tests (ctest label gpu) and the quantized-matmul example, runs the device
# benchmarks, and writes a summary (pass/fail per test, GB/s and ratio to copy per kernel) to
# <out>/summary.md. About 3-5 minutes on an H100/H200.
#
#   bench/device_check.sh [out-dir]
#   bench/device_check.sh --prebuilt DIR [out-dir]
#
# doctest and Google Benchmark come from the system, or from .deps/ (scripts/stage_device_deps.sh
# prepares it on a Debian machine). With --prebuilt, nothing is built: DIR holds the binaries
# scripts/pack_device_build.sh built on another machine (tests/, bench/, examples/ and the shared
# libraries they need in lib/), which saves the GPU machine's time.
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=""
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt="$2"
  shift 2
fi
out="${1:-device-check}"
mkdir -p "$out"
arch="${CUDA_ARCH:-90}"
# nccl_test stays last (built only where CMake finds NCCL).
gpu_tests=(quantize_device_test_float quantize_device_test_bfloat16 quantize_device_test_half
           adamw_device_test all_reduce_device_test fused_device_test_float
           fused_device_test_bfloat16 fused_device_test_half buffer_device_test_float
           buffer_device_test_bfloat16 buffer_device_test_half statistics_device_test_float
           statistics_device_test_bfloat16 statistics_device_test_half weights_device_test_float
           weights_device_test_bfloat16 weights_device_test_half nccl_test)
benches=(quantize_device_bench optim_device_bench all_reduce_device_bench fused_device_bench
         buffer_device_bench)

if [ -n "$prebuilt" ]; then
  build="$prebuilt"
  export LD_LIBRARY_PATH="$PWD/$prebuilt/lib:${LD_LIBRARY_PATH:-}"
  # Each test binary in turn, reported in ctest's line format for the summary; 77 means skipped.
  tests_rc=0
  i=0
  for t in "${gpu_tests[@]}"; do
    i=$((i + 1))
    [ -x "$build/tests/$t" ] || continue
    start=$(date +%s%N)
    timeout 300 "$build/tests/$t" >"$out/$t.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    case $rc in
      0) verdict="Passed" ;;
      77) verdict="***Skipped" ;;
      *) verdict="***Failed (exit $rc)"; tests_rc=1; tail -n 30 "$out/$t.log" ;;
    esac
    echo "Test #$i: $t ..... $verdict $secs sec" | tee -a "$out/tests.log"
  done
else
  build=build-device
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_PREFIX_PATH="$PWD/.deps" -DAGOQ_WERROR="${AGOQ_WERROR:-ON}" 2>&1 | tail -n 3 | tee "$out/configure.log"
  # nccl_test exists only where CMake finds NCCL; the prebuilt mode runs it when it was built.
  if ! cmake --build "$build" --target "${gpu_tests[@]:0:${#gpu_tests[@]}-1}" "${benches[@]}" \
      quantized_matmul \
      >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log"
    echo "build failed" >"$out/summary.md"
    exit 1
  fi
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 600) >"$out/tests.log" 2>&1
  tests_rc=$?
fi
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
"$build/bench/fused_device_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/fused_bench.json" --benchmark_out_format=json >"$out/fused_bench.log" 2>&1
fused_rc=$?
[ "$bench_rc" -eq 0 ] && bench_rc=$fused_rc
"$build/bench/buffer_device_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/buffer_bench.json" --benchmark_out_format=json >"$out/buffer_bench.log" 2>&1
buffer_rc=$?
[ "$bench_rc" -eq 0 ] && bench_rc=$buffer_rc

python3 bench/summarize_device.py "$out" "$tests_rc" "$example_rc" "$bench_rc" >"$out/summary.md"
cat "$out/summary.md"
[ "$tests_rc" -eq 0 ] && [ "$example_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
