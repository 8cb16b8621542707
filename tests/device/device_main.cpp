// Main of the device tier: runs the doctest suite when a CUDA device exists, and otherwise exits
// with code 77, which ctest reports as skipped (SKIP_RETURN_CODE), saying why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <cuda_runtime_api.h>

int main(int argc, char** argv) {
  int devices = 0;
  cudaError_t const e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("agoq: no CUDA device (%s): skipping the device tier\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
