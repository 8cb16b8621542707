/// \file
/// Compiler configuration: the host/device annotations and the floating-point guarantees agoq
/// relies on to produce the same bits on the host and on the device.
#pragma once

#if defined(__CUDACC__)
/// Marks a function callable from host and device code; expands to nothing under a host compiler.
#define AGOQ_HOST_DEVICE __host__ __device__
/// Marks a device-only function.
#define AGOQ_DEVICE __device__
/// Declares a kernel with hidden visibility, so that two shared libraries instantiating the same
/// kernel template do not resolve to one another's copy.
#define AGOQ_KERNEL __global__ __attribute__((visibility("hidden")))
#else
#define AGOQ_HOST_DEVICE
#define AGOQ_DEVICE
#define AGOQ_KERNEL
#endif

#if defined(__CUDA_ARCH__)
/// Asks nvcc to unroll the next loop; nothing for host compilers, which unroll on their own.
#define AGOQ_UNROLL _Pragma("unroll")
#else
#define AGOQ_UNROLL
#endif

// agoq's format contract promises identical bits from every executor. Value-changing floating
// point optimisations (reassociation, reciprocal division, flushing subnormals) break that
// promise, so they are refused at compile time rather than left to corrupt codes silently.
#if defined(__FAST_MATH__)
#error "agoq: -ffast-math changes the rounding of the quantization math; build agoq code without it"
#endif
#if defined(__USE_FAST_MATH__)
#error "agoq: nvcc --use_fast_math approximates division; build agoq code without it"
#endif
