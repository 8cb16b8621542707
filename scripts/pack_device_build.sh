#!/usr/bin/env bash
# Builds the device tests, benchmarks and example for sm_90 here (no GPU needed) and packs them,
# stripped, with the shared libraries they need, into .devbin/ and its xz archive .devbin.tar.xz
# (both git-ignored), so a GPU machine with little time spends it running them. The archive is
# what to carry (about a third of the folder; the folder alone passes the device tool's 64 MiB
# carry limit): there, run
#   python3 -m tarfile -e .devbin.tar.xz . && bench/device_check.sh --prebuilt .devbin <out-dir>
# The host code is built for x86-64-v3 (AVX2, FMA), which any current GPU server runs; agoq's
# CPU reference then uses its portable loops, which give the same bits as the AVX-512 ones.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_root="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda_root/bin:$PATH"
build=build-dev
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DAGOQ_HOST_ARCH=x86-64-v3 -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
tests=(quantize_device_test_float quantize_device_test_bfloat16 quantize_device_test_half
       adamw_device_test all_reduce_device_test fused_device_test_float
       fused_device_test_bfloat16 fused_device_test_half buffer_device_test_float
       buffer_device_test_bfloat16 buffer_device_test_half statistics_device_test_float
       statistics_device_test_bfloat16 statistics_device_test_half weights_device_test_float
       weights_device_test_bfloat16 weights_device_test_half)
benches=(quantize_device_bench optim_device_bench all_reduce_device_bench fused_device_bench
         buffer_device_bench)
targets=("${tests[@]}" "${benches[@]}" quantized_matmul)
# nccl_test is built where CMake found NCCL.
if cmake --build "$build" --target help | grep -q '^nccl_test:'; then targets+=(nccl_test); fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
rm -rf .devbin
mkdir -p .devbin/tests .devbin/bench .devbin/examples .devbin/lib
for t in "${tests[@]}" nccl_test; do
  [ -x "$build/tests/$t" ] && strip -o ".devbin/tests/$t" "$build/tests/$t"
done
for b in "${benches[@]}"; do strip -o ".devbin/bench/$b" "$build/bench/$b"; done
strip -o .devbin/examples/quantized_matmul "$build/examples/quantized_matmul"
for exe in .devbin/tests/* .devbin/bench/*; do
  ldd "$exe" | awk '/libbenchmark|libcudart/ {print $3}'
done | sort -u | xargs -r -I{} cp -L {} .devbin/lib/
tar cf - .devbin | xz -T0 -6 > .devbin.tar.xz
du -sh .devbin .devbin.tar.xz
