#!/usr/bin/env bash
# The device tier in one go, on a machine with a CUDA GPU: builds for sm_90 (or $CUDA_ARCH),
# runs the device tests (ctest label gpu) and the quantized-matmul example, runs the device
# benchmarks and the PyTorch extension's device tests, and writes a summary (pass/fail per test,
# GB/s and ratio to copy per kernel) to <out>/summary.md and every log, JSON and the summary to
# one archive, <out>.tar.xz (for a machine that returns few files). About 3-5 minutes on an
# H100/H200. The PyTorch modules build (nvcc, a few minutes) in the background from the start,
# beside the device tier, and their tests run last (AGOQ_CHECK_TORCH=0 leaves them out).
#
#   bench/device_check.sh [out-dir]
#   bench/device_check.sh --prebuilt DIR [out-dir]
#
# doctest and Google Benchmark come from the system, or from .deps/ (scripts/stage_device_deps.sh
# prepares it on a Debian machine). With --prebuilt, nothing is built: DIR holds the binaries
# scripts/pack_device_build.sh built on another machine (tests/, bench/, examples/ and the shared
# libraries they need in lib/), which saves the GPU machine's time. Where DIR also holds
# variants/NAME/ (pack_device_build.sh --variant), each variant's tests and benchmarks run after
# the main tier (benchmarks with $VARIANT_BENCH_FILTER when set), each with a summary section of
# its own: one run compares unmeasured branches with the working tree.
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=""
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt="$2"
  shift 2
fi
out="${1:-device-check}"
out="${out%/}"
mkdir -p "$out"
arch="${CUDA_ARCH:-90}"
# The tests in ctest's names: <suite>_device_test_<element> runs one suite of the binary
# device_test_<element> (tests/CMakeLists.txt), the others are binaries of their own. nccl_test
# stays last (built only where CMake finds NCCL).
elements=(float bfloat16 half)
gpu_tests=()
for e in "${elements[@]}"; do
  for suite in quantize fused buffer statistics weights; do gpu_tests+=("${suite}_device_test_$e"); done
done
gpu_tests+=(adamw_device_test all_reduce_device_test epilogue_device_test nccl_test)
gpu_binaries=(device_test_float device_test_bfloat16 device_test_half adamw_device_test
              all_reduce_device_test epilogue_device_test)
benches=(quantize_device_bench optim_device_bench all_reduce_device_bench fused_device_bench
         buffer_device_bench)

# Runs the tests named after $2 from the binaries in $1/tests (a suite of device_test_<element>
# where no binary has its name, as above; variants built from older revisions have one binary per
# suite), output to $2, reported in ctest's line format (in $2/tests.log) for the summary; 77
# means skipped. Returns 1 when one failed.
run_test_binaries() {
  local dir="$1" to="$2" rc=0 i=0 t start ms secs verdict status cmd
  shift 2
  for t in "$@"; do
    i=$((i + 1))
    cmd=("$dir/tests/$t")
    if [ ! -x "$dir/tests/$t" ] && [[ $t =~ ^([a-z]+)_device_test_([a-z0-9]+)$ ]]; then
      cmd=("$dir/tests/device_test_${BASH_REMATCH[2]}" "--source-file=*/${BASH_REMATCH[1]}_device_test.cu")
    fi
    [ -x "${cmd[0]}" ] || continue
    start=$(date +%s%N)
    timeout 300 "${cmd[@]}" >"$to/$t.log" 2>&1
    status=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    case $status in
      0) verdict="Passed" ;;
      77) verdict="***Skipped" ;;
      *) verdict="***Failed (exit $status)"; rc=1; tail -n 30 "$to/$t.log" ;;
    esac
    # A suite that selects no test case (renamed or lost) fails, as under ctest.
    if [ "$status" -eq 0 ] && grep -Eq "test cases: +0 [|]" "$to/$t.log"; then
      verdict="***Failed (no test case)"
      rc=1
    fi
    echo "Test #$i: $t ..... $verdict $secs sec" | tee -a "$to/tests.log"
  done
  return $rc
}

# The PyTorch extension's CPU and device modules (examples/pytorch/agoq_torch, into build-torch/;
# the device module is four nvcc translation units of 2-6 minutes each, compiled in parallel)
# build in the background while the device tier runs; their tests wait for it at the end. The
# build shares the CPU with the benchmarks' launches, not the GPU.
torch_build_pid=""
if [ "${AGOQ_CHECK_TORCH:-1}" != 0 ] &&
    python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  # torch's name of the architecture: 90 -> 9.0, 100 -> 10.0; the tests' load then finds the
  # modules built for it.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${arch%?}.${arch: -1}}"
  AGOQ_TORCH_BUILD_DIR="$PWD/build-torch" PYTHONPATH="$PWD/examples/pytorch${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 900 python3 -c "import agoq_torch; agoq_torch.device_module()" \
    >"$out/torch_build.log" 2>&1 &
  torch_build_pid=$!
fi

if [ -n "$prebuilt" ]; then
  build="$prebuilt"
  export LD_LIBRARY_PATH="$PWD/$prebuilt/lib:${LD_LIBRARY_PATH:-}"
  run_test_binaries "$build" "$out" "${gpu_tests[@]}"
  tests_rc=$?
else
  build=build-device
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_PREFIX_PATH="$PWD/.deps" -DAGOQ_WERROR="${AGOQ_WERROR:-ON}" 2>&1 | tail -n 3 | tee "$out/configure.log"
  # nccl_test exists only where CMake finds NCCL (ctest -L gpu runs it there); the prebuilt mode
  # runs it when it was built.
  cmake --build "$build" --target help | grep -q '^nccl_test:' && gpu_binaries+=(nccl_test)
  if ! cmake --build "$build" --target "${gpu_binaries[@]}" "${benches[@]}" \
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
# Runs the benchmark binaries present in $1/bench, JSON and logs to $2, extra flags after them;
# prints the first non-zero exit status (0 when all passed).
run_benches() {
  local dir="$1" to="$2" rc=0 b status
  shift 2
  for b in quantize_device_bench:bench optim_device_bench:optim_bench \
           all_reduce_device_bench:all_reduce_bench fused_device_bench:fused_bench \
           buffer_device_bench:buffer_bench; do
    [ -x "$dir/bench/${b%%:*}" ] || continue
    "$dir/bench/${b%%:*}" --benchmark_min_time=0.2 --benchmark_out="$to/${b#*:}.json" \
      --benchmark_out_format=json "$@" >"$to/${b#*:}.log" 2>&1
    status=$?
    [ "$rc" -eq 0 ] && rc=$status
  done
  echo "$rc"
}
bench_rc=$(run_benches "$build" "$out")
python3 bench/summarize_device.py "$out" "$tests_rc" "$example_rc" "$bench_rc" >"$out/summary.md"

# The PyTorch extension's calls on CUDA tensors (examples/pytorch/tests/test_device.py: every
# result against the CPU module's, bit for bit), once the background build above has ended. It
# runs after everything else: a lease that ends during it keeps the rest of the summary.
torch_rc=0
if [ -n "$torch_build_pid" ]; then
  wait "$torch_build_pid"
  torch_build_rc=$?
  if [ "$torch_build_rc" -eq 0 ]; then
    AGOQ_TORCH_BUILD_DIR="$PWD/build-torch" timeout 600 python3 -m unittest discover \
      -s examples/pytorch/tests -p test_device.py -v >"$out/torch_device.log" 2>&1
    torch_rc=$?
  else
    torch_rc=$torch_build_rc
    tail -n 40 "$out/torch_build.log" >"$out/torch_device.log"
  fi
  {
    echo
    echo "## PyTorch extension on CUDA tensors (build exit code $torch_build_rc, test_device.py" \
      "exit code $torch_rc)"
    echo
    grep -E "^(test_|Ran |OK|FAILED)|rror" "$out/torch_device.log" | sed 's/^/    /'
  } >>"$out/summary.md"
fi

# Variants (prebuilt only): their tests, their benchmarks, a summary section each.
variants_rc=0
if [ -n "$prebuilt" ] && [ -d "$build/variants" ]; then
  for vdir in "$build"/variants/*/; do
    name=$(basename "$vdir")
    vout="$out/variants/$name"
    mkdir -p "$vout"
    vtests=()
    for t in "$vdir"tests/*; do [ -x "$t" ] && vtests+=("$(basename "$t")"); done
    run_test_binaries "${vdir%/}" "$vout" "${vtests[@]}"
    vtests_rc=$?
    filter=()
    [ -n "${VARIANT_BENCH_FILTER:-}" ] && filter=(--benchmark_filter="$VARIANT_BENCH_FILTER")
    vbench_rc=$(run_benches "${vdir%/}" "$vout" "${filter[@]}")
    {
      echo
      echo "# Variant $name: $(cat "$vdir/REVISION" 2>/dev/null)"
      echo
      python3 bench/summarize_device.py "$vout" "$vtests_rc" 0 "$vbench_rc" | tail -n +2
    } >>"$out/summary.md"
    [ "$vtests_rc" -eq 0 ] && [ "$vbench_rc" -eq 0 ] || variants_rc=1
  done
fi
tar cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")"
cat "$out/summary.md"
[ "$tests_rc" -eq 0 ] && [ "$example_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$torch_rc" -eq 0 ] &&
  [ "$variants_rc" -eq 0 ]
