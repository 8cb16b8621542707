/// \file
/// The device module's fused-op forward calls (with and without a saved copy) on GPU tensors
/// (device.cuh), a translation unit of their own so that nvcc compiles their kernels beside the
/// other units'.
#include "device.cuh"

void agoq_torch::device::register_forward(pybind11::module_& m) {
  ops::register_forward_ops<cuda_backend>(m);
}
