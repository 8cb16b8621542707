/// \file
/// The device module (device.cuh): its definition, compress / decompress / fake_quantize / measure
/// on GPU tensors, and the non-finite totals' reading and reset.
#include "device.cuh"

namespace agoq_torch::device {
namespace {

/// Calls f(total) for each total once its device has finished all its work, that device current
/// (the whole device is synchronized: a total's stream may be gone by now).
template <class F>
void for_each_total_synchronized(F const& f) {
  nonfinite_totals& t = totals();
  std::lock_guard lock(t.mutex);
  for (auto& [key, total] : t.per_stream) {
#if !defined(AGOQ_DEVICE_EMULATION)
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(key.first));
#endif
    AGOQ_CUDA_TRY(cudaDeviceSynchronize());
    f(total);
  }
}

/// The sum of the totals.
std::int64_t nonfinite_seen_on_devices() {
  std::int64_t sum = 0;
  for_each_total_synchronized([&](torch::Tensor const& total) {
    std::int64_t n = 0;
    AGOQ_CUDA_TRY(cudaMemcpy(&n, total.data_ptr(), sizeof(n), cudaMemcpyDeviceToHost));
    sum += n;
  });
  return sum;
}

void reset_nonfinite_on_devices() {
  for_each_total_synchronized([](torch::Tensor const& total) {
    // On the legacy default stream, which the non-blocking streams of torch do not wait for.
    AGOQ_CUDA_TRY(cudaMemset(total.data_ptr(), 0, sizeof(std::int64_t)));
    AGOQ_CUDA_TRY(cudaDeviceSynchronize());
  });
}

}  // namespace
}  // namespace agoq_torch::device

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() =
      "agoq: the tensor calls, GradientBuffer, 8-bit collectives and AdamW8bit of agoq_torch on "
      "GPU tensors (CUDA executor)";
  namespace device = agoq_torch::device;
  agoq_torch::ops::register_tensor_ops<device::cuda_backend>(m);
  device::register_forward(m);
  device::register_backward(m);
  device::register_gradients(m);
  m.attr("emulated") = device::emulated;
  m.def("nonfinite_seen", &device::nonfinite_seen_on_devices,
        "NaN/Inf values this module's calls have met since the last reset, over every device "
        "(synchronizes the devices the calls ran on).");
  m.def("reset_nonfinite", &device::reset_nonfinite_on_devices,
        "Sets every device's total to 0 (after synchronizing the devices).");
#if defined(AGOQ_DEVICE_EMULATION)
  m.def(
      "holds", [](torch::Tensor const& t) { return t.defined() && device::in_device_memory(t); },
      py::arg("t"), "Whether t lies in the emulated device's memory.");
  m.def(
      "to_device",
      [](torch::Tensor const& t) {
        torch::Tensor c = t.contiguous();
        torch::Tensor d = device::device_empty(c.sizes(), c.scalar_type());
        AGOQ_CUDA_TRY(cudaMemcpy(d.data_ptr(), c.data_ptr(), c.nbytes(), cudaMemcpyHostToDevice));
        return d;
      },
      py::arg("t"), "A copy of t in the emulated device's memory (a CPU tensor over it).");
#endif
}
