/// \file
/// The device module's fused-op backward calls on GPU tensors (device.cuh), a translation unit of
/// their own so that nvcc compiles their kernels beside the other units'.
#include "device.cuh"

void agoq_torch::device::register_backward(pybind11::module_& m) {
  ops::register_backward_ops<cuda_backend>(m);
}
