// The device tests of one element type (AGOQ_TEST_ELEMENT), one translation unit: quantize_async,
// the fused ops, the gradient buffer, measure() and the weight helpers. Their kernels overlap
// (the fused ops' second passes and the weight helpers are quantize_async's kernels, which the
// gradient buffer's collectives launch too), and so do their CPU references; in one translation
// unit nvcc compiles each once per architecture. Each suite keeps its names in a namespace of its
// own and its ctest entry (tests/CMakeLists.txt), which selects its file with --source-file.
#include "buffer_device_test.cu"
#include "fused_device_test.cu"
#include "quantize_device_test.cu"
#include "statistics_device_test.cu"
#include "weights_device_test.cu"
