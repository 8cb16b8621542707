/// \file
/// The device module's gradient path and optimizer (device.cuh): GradientBuffer over
/// agoq::gradient::device_gradient_buffer, the 8-bit all-reduce and reduce-scatter of
/// gradient/all_reduce.cuh over a ProcessGroup with CUDA tensors (process_group.hpp; NCCL), and
/// AdamW8bit over agoq::optim's device step, with the API of the CPU module's (collectives.cpp)
/// and, for the same inputs and options, its bits. Every call runs on torch's current stream of
/// the GPU of its tensors or object and returns without synchronizing, except those that return
/// host values (nonfinite_count, state_bytes) and the collectives' argument check (one
/// synchronization of the stream per call, as agoq's).
#include "device.cuh"
#include "process_group.hpp"

#include <agoq/gradient/all_reduce.cuh>
#include <agoq/gradient/buffer.cuh>
#include <agoq/optim/adamw.cuh>

#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace agoq_torch::device {
namespace {

namespace py = pybind11;
namespace grad = agoq::gradient;
namespace optim = agoq::optim;

/// Checks that `device` can hold the module's objects: a GPU (any device when emulated, whose
/// device memory is the host's).
void check_object_device(torch::Device device, char const* what) {
  TORCH_CHECK(emulated || device.is_cuda(), what, ": expected a CUDA device, got ", device);
}

/// Checks that a call's tensors (backend b) are on the object's device.
void check_same_device(cuda_backend const& b, torch::Device device, char const* what) {
  TORCH_CHECK(b.device() == device, what, ": the tensors are on ", b.device(), ", the object on ",
              device);
}

/// A one-element int64 tensor on the backend's device that a call sets (a count).
torch::Tensor device_count(cuda_backend const& b) { return b.empty({}, torch::kLong); }

/// GradientBuffer on a GPU: a device_gradient_buffer whose memory is allocated, at construction,
/// on the current stream of its device, and freed on that stream when the buffer goes.
class device_buffer {
 public:
  device_buffer(std::int64_t n, int group_size, bool stochastic, std::uint64_t seed,
                torch::Device device)
      : device_buffer(cuda_backend(device), n, buffer_options(group_size, stochastic, seed)) {}

  ~device_buffer() {
    cuda_backend const b(device_);  // the buffer's device current while its memory is freed
    buffer_.reset();
  }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;

  /// Adds a 1-D gradient on the buffer's device; returns its non-finite count as a one-element
  /// int64 tensor there, set once the stream reaches the end of the call.
  torch::Tensor accumulate(torch::Tensor const& g) {
    char const* what = "GradientBuffer.accumulate";
    cuda_backend const b(g.defined() ? g.device() : device_);
    check_vector(g, buffer_->size(), what, b);
    check_same_device(b, device_, what);
    torch::Tensor n = device_count(b);
    dispatch_element(g.scalar_type(), [&]<class T>(T) {
      buffer_->accumulate_async(b.executor(), span_of<T const>(g), n.data_ptr<std::int64_t>());
    });
    return n;
  }

  void zero() { buffer_->zero_async(cuda_backend(device_).executor()); }

  /// The dequantized values as a float32 1-D tensor on the buffer's device.
  torch::Tensor values() const {
    cuda_backend const b(device_);
    torch::Tensor out = b.empty({buffer_->size()}, torch::kFloat);
    agoq::dequantize_async(b.executor(), buffer_->view(),
                           agoq::as_row(out.data_ptr<float>(), buffer_->size()));
    return out;
  }

  /// The non-finite sums met since construction (synchronizes the current stream).
  std::int64_t nonfinite_count() const {
    cuda_backend const b(device_);
    std::int64_t n = 0;
    cudaStream_t const stream = b.executor().stream.get();
    AGOQ_CUDA_TRY(
        cudaMemcpyAsync(&n, buffer_->nonfinite_count(), sizeof(n), cudaMemcpyDeviceToHost, stream));
    AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
    return n;
  }

  grad::device_gradient_buffer const& buffer() const { return *buffer_; }
  torch::Device device() const { return device_; }

 private:
  device_buffer(cuda_backend const& b, std::int64_t n, grad::buffer_options const& opt)
      : device_(b.device()) {
    check_object_device(device_, "GradientBuffer");
    buffer_.emplace(n, opt, b.executor().stream);
  }

  torch::Device device_;
  std::optional<grad::device_gradient_buffer> buffer_;
};

/// Calls f(source) with the GIL released, source being the device GradientBuffer or the 1-D span
/// of the tensor (of n elements; n < 0: any length) `input` is (the gradient operands of the
/// device collectives and AdamW step), on b's device.
template <class F>
void with_device_source(py::object const& input, std::int64_t n, cuda_backend const& b,
                        char const* what, F&& f) {
  if (py::isinstance<device_buffer>(input)) {
    auto const& buffer = input.cast<device_buffer const&>();
    check_same_device(b, buffer.device(), what);
    py::gil_scoped_release nogil;
    f(buffer.buffer());
    return;
  }
  TORCH_CHECK(THPVariable_Check(input.ptr()), what,
              ": expected a tensor or a GradientBuffer of this module");
  auto const in = input.cast<torch::Tensor>();
  check_vector(in, n, what, b);
  py::gil_scoped_release nogil;
  dispatch_element(in.scalar_type(), [&]<class I>(I) { f(span_of<I const>(in)); });
}

/// The result dict of a device collective: its all_reduce_status as one-element int64 tensors
/// on the device ('nonfinite', 'local_nonfinite', 'corrupt'), set when the stream reaches the end
/// of the call.
py::dict status_dict(torch::Tensor const& status) {
  py::dict d;
  d["nonfinite"] = status[0];
  d["local_nonfinite"] = status[1];
  d["corrupt"] = status[2];
  return d;
}

/// A device tensor for an all_reduce_status.
torch::Tensor new_status(cuda_backend const& b) {
  static_assert(sizeof(grad::all_reduce_status) == 3 * sizeof(std::int64_t));
  return b.empty({3}, torch::kLong);
}

grad::all_reduce_status* status_of(torch::Tensor const& status) {
  return reinterpret_cast<grad::all_reduce_status*>(status.data_ptr<std::int64_t>());
}

/// all_reduce_8bit from a tensor or device GradientBuffer into a 1-D tensor, on the GPU of the
/// output.
py::dict all_reduce(counted_communicator& c, py::object const& input, torch::Tensor const& output,
                    int group_size, bool average, bool stochastic, std::uint64_t seed,
                    std::uint64_t step) {
  cuda_backend const b(output.defined() ? output.device() : torch::Device(torch::kCUDA));
  check_vector(output, -1, "all_reduce_8bit (output)", b);
  auto const opt = reduce_options(group_size, average, stochastic, seed, step);
  torch::Tensor status = new_status(b);
  with_device_source(input, -1, b, "all_reduce_8bit (input)", [&](auto const& src) {
    dispatch_element(output.scalar_type(), [&]<class O>(O) {
      grad::all_reduce_8bit_async(b.executor(), c.comm(), src, span_of<O>(output), opt,
                                  status_of(status));
    });
  });
  return status_dict(status);
}

/// reduce_scatter_8bit from a tensor or device GradientBuffer into this rank's shard, on the GPU
/// of the shard.
py::dict reduce_scatter(counted_communicator& c, py::object const& input,
                        torch::Tensor const& shard, int group_size, bool average, bool stochastic,
                        std::uint64_t seed, std::uint64_t step) {
  cuda_backend const b(shard.defined() ? shard.device() : torch::Device(torch::kCUDA));
  check_vector(shard, -1, "reduce_scatter_8bit (shard)", b);
  auto const opt = reduce_options(group_size, average, stochastic, seed, step);
  torch::Tensor status = new_status(b);
  std::int64_t n = 0;
  with_device_source(input, -1, b, "reduce_scatter_8bit (input)", [&](auto const& src) {
    n = static_cast<std::int64_t>(src.size());
    dispatch_element(shard.scalar_type(), [&]<class O>(O) {
      grad::reduce_scatter_8bit_async(b.executor(), c.comm(), src, span_of<O>(shard), opt,
                                      status_of(status));
    });
  });
  auto const r = grad::shard_range(n, c.size(), c.rank(), group_size);
  py::dict d = status_dict(status);
  d["begin"] = r.begin;
  d["end"] = r.end;
  return d;
}

/// AdamW8bit on a GPU: both moments in uint8 tensors of the device (torch's caching allocator),
/// zeroed on the current stream at construction, and the adamw_device_state over them.
class device_adamw {
 public:
  device_adamw(std::int64_t n, std::int64_t block, std::uint64_t seed, std::string const& m_format,
               std::string const& v_format, torch::Device device)
      : device_adamw(cuda_backend(device), n, adamw_options(block, seed, m_format, v_format)) {}

  /// The state of an AdamW state record (state_bytes, or the CPU class's), on `device`.
  static std::unique_ptr<device_adamw> of_record(py::bytes const& data, torch::Device device) {
    optim::adamw_state const h = adamw_of_record(data);
    cuda_backend const b(device);
    auto d = std::unique_ptr<device_adamw>(new device_adamw(b, h.size(), h.options()));
    optim::copy_state(b.executor(), h, d->state_);
    return d;
  }

  /// One step on float32 parameters (in place) with a 1-D tensor or device GradientBuffer
  /// gradient; returns the number of elements skipped for a non-finite gradient as a one-element
  /// int64 tensor on the device, set once the stream reaches the end of the step.
  torch::Tensor step(torch::Tensor const& params, py::object const& grad, double lr, double beta1,
                     double beta2, double eps, double weight_decay) {
    cuda_backend const b(params.defined() ? params.device() : device_);
    std::span<float> const p = adamw_params(params, state_.size(), b);
    check_same_device(b, device_, "AdamW8bit.step (params)");
    optim::adamw_hyper const h = adamw_hyper_of(lr, beta1, beta2, eps, weight_decay);
    torch::Tensor skipped = device_count(b);
    std::int64_t* const count = skipped.data_ptr<std::int64_t>();
    with_device_source(grad, state_.size(), b, "AdamW8bit.step (grad)", [&](auto const& g) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(g)>,
                                   agoq::gradient::device_gradient_buffer>) {
        optim::adamw_step_async(b.executor(), state_, h, p, g.view(), count);
      } else {
        optim::adamw_step_async(b.executor(), state_, h, p, g, count);
      }
    });
    return skipped;
  }

  /// The state as an AdamW state record (synchronizes the current stream).
  py::bytes record() const {
    optim::adamw_state h(state_.size(), options_);
    optim::copy_state(cuda_backend(device_).executor(), state_, h);
    return adamw_record(h);
  }

  std::int64_t size() const { return state_.size(); }
  std::int64_t bytes() const { return m_.numel() + v_.numel(); }
  double bytes_per_parameter() const {
    return size() == 0 ? 0.0 : static_cast<double>(bytes()) / static_cast<double>(size());
  }
  std::int64_t step_count() const { return state_.step; }
  torch::Device device() const { return device_; }

 private:
  device_adamw(cuda_backend const& b, std::int64_t n, optim::adamw_state_options const& opt)
      : options_(opt), device_(b.device()) {
    check_object_device(device_, "AdamW8bit");
    m_ = b.zeros({optim::moment_bytes(opt.m, n, opt.block)}, torch::kByte);
    v_ = b.zeros({optim::moment_bytes(opt.v, n, opt.block)}, torch::kByte);
    state_ = optim::adamw_device_state_of_buffers(n, opt, m_.numel() ? m_.data_ptr() : nullptr,
                                                  v_.numel() ? v_.data_ptr() : nullptr);
  }

  optim::adamw_state_options options_;
  torch::Device device_;
  torch::Tensor m_, v_;
  optim::adamw_device_state state_;
};

}  // namespace

void register_gradients(py::module_& m) {
  // Objects on the emulated device live in host memory: their default device is the CPU's.
  torch::Device const default_device =
      emulated ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA);
  py::class_<device_buffer>(
      m, "GradientBuffer",
      "The CPU module's GradientBuffer in GPU memory (made on the current stream of `device`, "
      "the current GPU by default), with its bits: accumulate() adds a gradient on the device "
      "in one kernel pass.")
      .def(py::init<std::int64_t, int, bool, std::uint64_t, torch::Device>(), py::arg("n"),
           py::arg("group_size") = 128, py::arg("stochastic") = true, py::arg("seed") = 0,
           py::arg("device") = default_device)
      .def("accumulate", &device_buffer::accumulate, py::arg("gradient"),
           "Adds a 1-D float32/bfloat16/float16 gradient of size elements on the buffer's device; "
           "returns its non-finite count as a one-element int64 tensor there.")
      .def("zero", &device_buffer::zero, "Sets every element to zero.")
      .def("to_tensor", &device_buffer::values,
           "The dequantized values as a float32 1-D tensor on the buffer's device.")
      .def_property_readonly("size", [](device_buffer const& b) { return b.buffer().size(); })
      .def_property_readonly("group_size",
                             [](device_buffer const& b) { return b.buffer().group_size(); })
      .def_property_readonly(
          "bytes", [](device_buffer const& b) { return b.buffer().bytes(); }, "Bytes held.")
      .def_property_readonly("nonfinite_count", &device_buffer::nonfinite_count,
                             "Non-finite sums since construction (synchronizes the stream).")
      .def_property_readonly("spec",
                             [](device_buffer const& b) { return b.buffer().spec().name(); })
      .def_property_readonly("device", &device_buffer::device);

  register_communicator(
      m,
      [](c10::intrusive_ptr<c10d::ProcessGroup> pg, torch::Device device) {
        check_object_device(device, "ProcessGroupCommunicator");
        return std::make_unique<counted_communicator>(std::move(pg), cuda_backend(device).device(),
                                                      agoq::comm::memory_space::device);
      },
      "agoq's communicator over a torch.distributed ProcessGroup with CUDA tensors (NCCL) on "
      "`device` (the current GPU by default), counting the bytes this rank sends to and "
      "receives from its peers; its transfers are ordered on the current stream.",
      true, py::arg("device") = default_device);
  register_collective_calls(
      m, &all_reduce,
      "The CPU module's all_reduce_8bit on the GPU, with its bits: a 1-D tensor or device "
      "GradientBuffer into a 1-D tensor, over this module's ProcessGroupCommunicator. Returns "
      "{'nonfinite', 'local_nonfinite', 'corrupt'} as one-element int64 tensors on the device.",
      &reduce_scatter,
      "The reduce-scatter form: this rank's shard [begin, end) of the reduced bucket. Returns "
      "the all-reduce's dict plus 'begin' and 'end' (ints).");

  py::class_<device_adamw>(
      m, "AdamW8bit",
      "The CPU module's AdamW8bit with its moments in GPU memory (made on the current stream of "
      "`device`, the current GPU by default), with its bits and state records.")
      .def(py::init<std::int64_t, std::int64_t, std::uint64_t, std::string const&,
                    std::string const&, torch::Device>(),
           py::arg("n"), py::arg("block") = 128, py::arg("seed") = 0,
           py::arg("m_format") = "int8_linear", py::arg("v_format") = "e4m3_sqrt",
           py::arg("device") = default_device)
      .def("step", &device_adamw::step, py::arg("params"), py::arg("grad"), py::arg("lr"),
           py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 0.0,
           "One step on float32 parameters (in place) with a 1-D tensor or GradientBuffer "
           "gradient on the device; returns the number of elements skipped for a non-finite "
           "gradient as a one-element int64 tensor there.")
      .def_property_readonly("size", &device_adamw::size)
      .def_property_readonly("bytes", &device_adamw::bytes)
      .def_property_readonly("bytes_per_parameter", &device_adamw::bytes_per_parameter)
      .def_property_readonly("step_count", &device_adamw::step_count)
      .def_property_readonly("device", &device_adamw::device)
      .def("state_bytes", &device_adamw::record,
           "The whole state as an agoq AdamW state record, the CPU class's format "
           "(synchronizes the stream).")
      .def_static("from_state_bytes", &device_adamw::of_record, py::arg("data"),
                  py::arg("device") = default_device,
                  "The state of a record (from either class) on `device`: it continues the run "
                  "bit for bit.");
}

}  // namespace agoq_torch::device
