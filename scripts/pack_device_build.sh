#!/usr/bin/env bash
# Builds the device tests, benchmarks and example for sm_90 here (no GPU needed) and packs them,
# stripped, with the shared libraries they need, into .devbin/ and its xz archive .devbin.tar.xz
# (both git-ignored), so a GPU machine with little time spends it running them. The archive is
# what to carry (about a third of the folder; the folder alone passes the device tool's 64 MiB
# carry limit): there, run
#   python3 -m tarfile -e .devbin.tar.xz . && bench/device_check.sh --prebuilt .devbin <out-dir>
# The host code is built for x86-64-v3 (AVX2, FMA), which any current GPU server runs; agoq's
# CPU reference then uses its portable loops, which give the same bits as the AVX-512 ones.
#
#   scripts/pack_device_build.sh [--variant NAME=REV=TARGET[,TARGET...]]...
#
# Each --variant also builds the listed test and benchmark targets from git revision REV (a branch
# with an unmeasured change, say) into .devbin/variants/NAME/, so that one device run measures
# the working tree and every variant side by side (device_check.sh runs them after the main
# tier and adds a section per variant to the summary).
set -euo pipefail
cd "$(dirname "$0")/.."
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variants+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--variant NAME=REV=TARGET[,TARGET...]]..." >&2; exit 2 ;;
  esac
done
cuda_root="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda_root/bin:$PATH"
configure() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DAGOQ_HOST_ARCH=x86-64-v3 -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
}
# Copies the stripped executables of targets $3... from build dir $1 into pack dir $2.
pack_targets() {
  local from="$1" to="$2"
  shift 2
  mkdir -p "$to/tests" "$to/bench"
  for t in "$@"; do
    if [ -x "$from/tests/$t" ]; then
      strip -o "$to/tests/$t" "$from/tests/$t"
    elif [ -x "$from/bench/$t" ]; then
      strip -o "$to/bench/$t" "$from/bench/$t"
    else
      echo "no test or benchmark executable $t in $from" >&2
      return 1
    fi
  done
}
build=build-dev
configure . "$build"
# The device tests' binaries (device_test_<element> holds the suites of one element type).
tests=(device_test_float device_test_bfloat16 device_test_half adamw_device_test
       all_reduce_device_test epilogue_device_test)
benches=(quantize_device_bench optim_device_bench all_reduce_device_bench fused_device_bench
         buffer_device_bench)
targets=("${tests[@]}" "${benches[@]}" quantized_matmul)
# nccl_test is built where CMake found NCCL.
if cmake --build "$build" --target help | grep -q '^nccl_test:'; then targets+=(nccl_test); fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
rm -rf .devbin
mkdir -p .devbin/examples .devbin/lib
pack_targets "$build" .devbin "${tests[@]}" "${benches[@]}"
[ -x "$build/tests/nccl_test" ] && strip -o .devbin/tests/nccl_test "$build/tests/nccl_test"
strip -o .devbin/examples/quantized_matmul "$build/examples/quantized_matmul"
for v in "${variants[@]}"; do
  IFS='=' read -r name rev list <<<"$v"
  [ -n "$name" ] && [ -n "$rev" ] && [ -n "$list" ] || { echo "bad --variant $v" >&2; exit 2; }
  IFS=',' read -r -a vtargets <<<"$list"
  src="build-variant-$name/src"
  rm -rf "$src"
  mkdir -p "$src"
  git archive "$rev" | tar -x -C "$src"
  configure "$src" "build-variant-$name/build"
  cmake --build "build-variant-$name/build" -j "$(nproc)" --target "${vtargets[@]}"
  pack_targets "build-variant-$name/build" ".devbin/variants/$name" "${vtargets[@]}"
  git log -1 --format='%H %s' "$rev" >".devbin/variants/$name/REVISION"
done
for exe in $(find .devbin \( -path '*/tests/*' -o -path '*/bench/*' \) -type f); do
  ldd "$exe" | awk '/libbenchmark|libcudart/ {print $3}'
done | sort -u | xargs -r -I{} cp -L {} .devbin/lib/
tar cf - .devbin | xz -T0 -6 > .devbin.tar.xz
du -sh .devbin .devbin.tar.xz
