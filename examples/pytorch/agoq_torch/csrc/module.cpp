/// \file
/// The agoq PyTorch extension module (agoq_torch._C): CPU executor bindings of agoq's saved-tensor
/// compression, fused ops, gradient buffer and 8-bit collectives, 8-bit AdamW, planner and memory
/// model. docs/pytorch.md describes the API.
#include "common.hpp"

namespace agoq_torch {
void register_tensors(pybind11::module_& m);
void register_collectives(pybind11::module_& m);
void register_planning(pybind11::module_& m);
}  // namespace agoq_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "agoq: quantized activations, gradients and optimizer states for training (CPU)";
  m.attr("version") = std::to_string(agoq::version_major) + "." +
                      std::to_string(agoq::version_minor) + "." +
                      std::to_string(agoq::version_patch);
  agoq_torch::register_tensors(m);
  agoq_torch::register_collectives(m);
  agoq_torch::register_planning(m);
}
