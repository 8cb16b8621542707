/// \file
/// Host-side checking of CUDA runtime calls.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "error.hpp"

namespace agoq::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, char const* call, char const* file, int line) {
  throw cuda_error(std::string("agoq: ") + call + " failed: " + cudaGetErrorName(e) + " (" +
                   cudaGetErrorString(e) + ") (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace agoq::detail

/// Evaluates a CUDA runtime call and throws agoq::cuda_error with the CUDA error string, the call
/// and file:line when it fails. Host only.
#define AGOQ_CUDA_TRY(call)                                                     \
  do {                                                                          \
    cudaError_t const agoq_cuda_status_ = (call);                               \
    if (agoq_cuda_status_ != cudaSuccess)                                       \
      ::agoq::detail::throw_cuda(agoq_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
