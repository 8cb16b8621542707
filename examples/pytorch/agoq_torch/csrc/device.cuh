/// \file
/// The extension's device module (agoq_torch_device): ops.hpp's tensor calls on GPU tensors,
/// through agoq's CUDA executor on torch's current stream of the first tensor's device, compiled by
/// nvcc where torch has CUDA (agoq_torch/__init__.py builds it on the first call given a CUDA
/// tensor). Every call is stream-ordered and returns without synchronizing, as torch's own ops do;
/// its outputs are bit for bit the CPU module's for the same inputs.
///
/// Built for agoq's emulated device tier instead (AGOQ_DEVICE_EMULATION: the host compiler, with
/// tests/emulator/cuda_emulator.hpp included first and cuda_emulator.cpp linked), the same calls
/// run every kernel on the CPU: its "device tensors" are CPU tensors over the emulator's device
/// memory (to_device), which is how examples/pytorch/tests/test_device.py tests this module on a
/// machine without a GPU.
///
/// This header holds the module's backend (cuda_backend) for its four translation units, which
/// nvcc compiles in parallel: device.cu (the module, compress / decompress / fake_quantize /
/// measure and the non-finite totals), device_forward.cu and device_backward.cu (the fused ops),
/// device_gradients.cu (the 8-bit gradient buffer, collectives and AdamW).
#pragma once

#include <agoq/activation/fused.cuh>
#include <agoq/activation/statistics.cuh>
#include <agoq/quantize.cuh>

#include "ops.hpp"

#if !defined(AGOQ_DEVICE_EMULATION)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <map>
#include <mutex>
#include <utility>

namespace agoq_torch::device {

namespace act = agoq::activation;

/// The totals of the non-finite counts of this module's calls: an int64 [1] tensor per device
/// and stream, each added to in its stream's order, so that calls on different streams never
/// race on one. Reading or resetting them synchronizes their devices.
struct nonfinite_totals {
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, torch::Tensor> per_stream;
};

/// Never destroyed: its tensors would otherwise be freed during the process's exit, after the
/// CUDA runtime (or the emulator's memory table) they belong to.
inline nonfinite_totals& totals() {
  static nonfinite_totals* t = new nonfinite_totals;
  return *t;
}

#if defined(AGOQ_DEVICE_EMULATION)
constexpr bool emulated = true;

/// Whether t's data lies in the emulator's device memory. An empty CPU tensor counts as a device
/// tensor: torch gives it no data pointer, so nothing tells where it was made.
inline bool in_device_memory(torch::Tensor const& t) {
  if (!t.device().is_cpu()) return false;
  if (t.numel() == 0) return true;
  cudaPointerAttributes a{};
  return cudaPointerGetAttributes(&a, t.data_ptr()) == cudaSuccess &&
         a.type == cudaMemoryTypeDevice;
}

/// A CPU tensor over a new allocation of the emulator's device memory.
inline torch::Tensor device_empty(at::IntArrayRef sizes, torch::ScalarType st) {
  std::int64_t n = 1;
  for (std::int64_t e : sizes) n *= e;
  void* p = nullptr;
  AGOQ_CUDA_TRY(cudaMalloc(&p, static_cast<std::size_t>(n) * c10::elementSize(st)));
  return torch::from_blob(
      p, sizes, [](void* q) { cudaFree(q); }, torch::TensorOptions().dtype(st));
}
#else
constexpr bool emulated = false;
#endif

/// ops.hpp's backend for device tensors: tensors on the first tensor's GPU, the CUDA executor on
/// torch's current stream of that GPU (made current for the call), outputs allocated by torch's
/// caching allocator there, non-finite counts added in stream order to the total of the device
/// and stream.
class cuda_backend {
 public:
  explicit cuda_backend(torch::Tensor const& first) : cuda_backend(first.device()) {}

  /// The backend of `device` (a GPU without an index: the current one).
  explicit cuda_backend(torch::Device device) : device_(device) {
#if !defined(AGOQ_DEVICE_EMULATION)
    if (device_.is_cuda()) {
      if (!device_.has_index()) device_.set_index(c10::cuda::current_device());
      guard_.set_device(device_);
      stream_ = at::cuda::getCurrentCUDAStream(device_.index()).stream();
    }
#endif
  }

  /// The device of the call's tensors.
  torch::Device device() const { return device_; }

  /// The CUDA executor on the call's stream.
  agoq::cuda_executor executor() const { return agoq::cuda_executor{stream_}; }

  bool holds(torch::Tensor const& t) const {
#if defined(AGOQ_DEVICE_EMULATION)
    return in_device_memory(t);
#else
    return t.is_cuda() && t.device() == device_;
#endif
  }

  std::string expected() const {
    if (emulated) return "a tensor in the emulated device's memory";
    if (!device_.is_cuda()) return "a CUDA tensor";
    return "a tensor on " + device_.str() + " (the first tensor's device)";
  }

  torch::Tensor empty(at::IntArrayRef sizes, torch::ScalarType st) const {
#if defined(AGOQ_DEVICE_EMULATION)
    return device_empty(sizes, st);
#else
    return torch::empty(sizes, torch::TensorOptions().dtype(st).device(device_));
#endif
  }

  /// empty, then zeroed on the call's stream (an empty tensor has no data pointer to zero).
  torch::Tensor zeros(at::IntArrayRef sizes, torch::ScalarType st) const {
    torch::Tensor t = empty(sizes, st);
    if (t.nbytes() > 0) AGOQ_CUDA_TRY(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream_));
    return t;
  }

  template <class... A>
  void quantize(A&&... a) const {
    counted([&](std::int64_t* n) { agoq::quantize_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void dequantize(A&&... a) const {
    agoq::dequantize_async(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void fake_quantize(A&&... a) const {
    counted(
        [&](std::int64_t* n) { agoq::fake_quantize_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void rmsnorm_forward(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::rmsnorm_forward_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void rmsnorm_forward_plain(A&&... a) const {
    act::rmsnorm_forward_async(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void rmsnorm_backward(A&&... a) const {
    counted([&](std::int64_t* n) {
      act::rmsnorm_backward_async(executor(), std::forward<A>(a)..., n);
    });
  }
  template <class... A>
  void swiglu_forward(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::swiglu_forward_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void swiglu_forward_plain(A&&... a) const {
    act::swiglu_forward_async(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void swiglu_backward(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::swiglu_backward_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void gelu_forward(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::gelu_forward_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void gelu_forward_plain(A&&... a) const {
    act::gelu_forward_async(executor(), std::forward<A>(a)...);
  }
  template <class... A>
  void gelu_backward(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::gelu_backward_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void residual_add(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::residual_add_async(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void rmsnorm_forward_measured(A&&... a) const {
    counted([&](std::int64_t* n) {
      act::rmsnorm_forward_measured(executor(), std::forward<A>(a)..., n);
    });
  }
  template <class... A>
  void swiglu_forward_measured(A&&... a) const {
    counted([&](std::int64_t* n) {
      act::swiglu_forward_measured(executor(), std::forward<A>(a)..., n);
    });
  }
  template <class... A>
  void gelu_forward_measured(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::gelu_forward_measured(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  void residual_add_measured(A&&... a) const {
    counted(
        [&](std::int64_t* n) { act::residual_add_measured(executor(), std::forward<A>(a)..., n); });
  }
  template <class... A>
  act::tensor_stats measure(A&&... a) const {
    return act::measure(executor(), std::forward<A>(a)...);
  }
  /// quantize (its count added in stream order like every call's), then measure, which
  /// synchronizes: what agoq::activation::quantize_measured does on the device.
  template <class In>
  act::tensor_stats quantize_measured(agoq::matrix_view<In> x, agoq::quantized_view out,
                                      agoq::quantize_options opt) const {
    quantize(x, out, opt);
    return act::measure(executor(), x, out.spec);
  }

 private:
  /// Runs call(count) with a fresh device count, then adds the count to the total of the device
  /// and stream (both on the call's stream).
  template <class F>
  void counted(F const& call) const {
    torch::Tensor n = empty({1}, torch::kLong);
    call(n.data_ptr<std::int64_t>());
    nonfinite_totals& t = totals();
    std::lock_guard lock(t.mutex);
    auto [it, fresh] = t.per_stream.try_emplace({device_.index(), stream_});
    if (fresh) it->second = zeros({1}, torch::kLong);
    it->second.add_(n);  // on torch's current stream of the device: stream_
  }

  torch::Device device_;
  cudaStream_t stream_{};
#if !defined(AGOQ_DEVICE_EMULATION)
  c10::cuda::OptionalCUDAGuard guard_;
#endif
};

/// Register ops.hpp's fused forward (device_forward.cu) and backward (device_backward.cu) calls,
/// and the gradient buffer, collectives and AdamW on GPU memory (device_gradients.cu).
void register_forward(pybind11::module_& m);
void register_backward(pybind11::module_& m);
void register_gradients(pybind11::module_& m);

}  // namespace agoq_torch::device
