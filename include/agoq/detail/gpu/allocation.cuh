/// \file
/// A stream-ordered device allocation (cudaMallocAsync / cudaFreeAsync on one stream), for the
/// workspaces of the collectives and the memory of device_gradient_buffer. Needs the CUDA runtime.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "../../cuda_check.hpp"

namespace agoq::detail::gpu {

/// `bytes` of device memory from the device's default pool, allocated on `stream` and freed on it
/// (after everything enqueued on it before the destructor). Movable, not copyable. Host only.
class stream_allocation {
 public:
  /// \throws agoq::cuda_error when the allocation fails.
  stream_allocation(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) AGOQ_CUDA_TRY(cudaMallocAsync(&p_, bytes, stream_));
  }
  ~stream_allocation() { reset(); }
  stream_allocation(stream_allocation&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), stream_(o.stream_) {}
  stream_allocation& operator=(stream_allocation&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      stream_ = o.stream_;
    }
    return *this;
  }
  stream_allocation(stream_allocation const&) = delete;
  stream_allocation& operator=(stream_allocation const&) = delete;

  /// The memory (null for 0 bytes).
  std::byte* get() const noexcept { return static_cast<std::byte*>(p_); }
  /// The stream it was allocated on and is freed on.
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  void reset() noexcept {
    if (p_ != nullptr) cudaFreeAsync(p_, stream_);
    p_ = nullptr;
  }

  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace agoq::detail::gpu
