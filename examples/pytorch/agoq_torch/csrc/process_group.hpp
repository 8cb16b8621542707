/// \file
/// agoq's communicator over a torch.distributed ProcessGroup, for the CPU module (host memory:
/// gloo, MPI) and the device module (GPU memory: NCCL), with agoq's byte counter around it, and its
/// Python class.
#pragma once

#include "common.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace agoq_torch {

/// agoq::comm::communicator over a c10d::ProcessGroup whose buffers live on `device` in memory
/// space `space`: the all-to-all is ProcessGroup::all_to_all_single (alltoall_base) with equal
/// splits, the all-gather ProcessGroup::allgather, each waited on before returning. For CPU tensors
/// (gloo, MPI) waiting means done (host semantics). For CUDA tensors (NCCL) the process group runs
/// the transfer on its own stream after the work already on the current stream, and waiting makes
/// the current stream wait for it, without blocking the host: stream-ordered on the current stream,
/// which is where agoq's device collectives run. The buffers are wrapped as uint8 tensors without
/// copies. A failed collective throws agoq::comm::comm_error with the process group's message.
class process_group_communicator {
 public:
  process_group_communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg, torch::Device device,
                             agoq::comm::memory_space space)
      : pg_(std::move(pg)), device_(device), space_(space) {
    TORCH_CHECK(pg_, "ProcessGroupCommunicator: expected a ProcessGroup, got None");
  }
  int rank() const { return pg_->getRank(); }
  int size() const { return pg_->getSize(); }
  agoq::comm::memory_space memory() const { return space_; }

  /// Drops this adapter's reference to the process group.
  void release() noexcept { pg_.reset(); }

  void all_to_all(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    auto const total = static_cast<std::int64_t>(n) * size();
    torch::Tensor in = bytes(const_cast<std::byte*>(send), total);
    torch::Tensor out = bytes(recv, total);
    std::vector<std::int64_t> equal_splits;
    run("all_to_all", [&] { return all_to_all_single(*pg_, out, in, equal_splits); });
  }

  void all_gather(std::byte const* send, std::byte* recv, std::size_t n) {
    if (n == 0) return;
    auto const len = static_cast<std::int64_t>(n);
    std::vector<torch::Tensor> in{bytes(const_cast<std::byte*>(send), len)};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < size(); ++r) out[0].push_back(bytes(recv + r * n, len));
    run("all_gather", [&] { return pg_->allgather(out, in); });
  }

 private:
  /// ProcessGroup::all_to_all_single where this torch has it (newer ones deprecate its old
  /// name), else alltoall_base, with the same splits both ways.
  template <class Group>
  static c10::intrusive_ptr<c10d::Work> all_to_all_single(Group& pg, torch::Tensor& out,
                                                          torch::Tensor& in,
                                                          std::vector<std::int64_t>& splits) {
    if constexpr (requires { pg.all_to_all_single(out, in, splits, splits); }) {
      return pg.all_to_all_single(out, in, splits, splits);
    } else {
      return pg.alltoall_base(out, in, splits, splits);
    }
  }

  torch::Tensor bytes(std::byte* p, std::int64_t n) const {
    return torch::from_blob(p, {n}, torch::TensorOptions().dtype(torch::kByte).device(device_));
  }

  template <class Start>
  void run(char const* what, Start&& start) {
    try {
      start()->wait();
    } catch (std::exception const& e) {
      throw agoq::comm::comm_error(std::string("ProcessGroupCommunicator: ") + what +
                                   " failed: " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  torch::Device device_;
  agoq::comm::memory_space space_;
};
static_assert(agoq::comm::communicator<process_group_communicator>);

/// The Python-facing communicator: the adapter and agoq's byte counter around it.
class counted_communicator {
 public:
  counted_communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg, torch::Device device,
                       agoq::comm::memory_space space)
      : inner_(std::move(pg), device, space), counted_(inner_) {}
  /// Drops the process group without the GIL: when this is the last reference, destroying a gloo
  /// group joins its threads, and one of them may be waiting for the GIL to free a tensor (a
  /// deadlock at process exit otherwise; torch's own bindings release the GIL there too).
  ~counted_communicator() {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      inner_.release();
    } else {
      inner_.release();
    }
  }
  counted_communicator(counted_communicator const&) = delete;
  counted_communicator& operator=(counted_communicator const&) = delete;
  agoq::comm::counting<process_group_communicator>& comm() { return counted_; }
  int rank() const { return counted_.rank(); }
  int size() const { return counted_.size(); }
  std::uint64_t bytes_sent() const { return counted_.sent(); }
  std::uint64_t bytes_received() const { return counted_.received(); }
  void reset_counts() { counted_.reset(); }

 private:
  process_group_communicator inner_;
  agoq::comm::counting<process_group_communicator> counted_;
};

/// Registers ProcessGroupCommunicator, made by `make(process_group, extra...)`, with the
/// docstring `doc`; `extra` names make's arguments after the process group (py::arg). `local`:
/// a module-local class (the device module's, since the CPU module registers this type too).
template <class Make, class... Extra>
void register_communicator(pybind11::module_& m, Make&& make, char const* doc, bool local,
                           Extra&&... extra) {
  namespace py = pybind11;
  py::class_<counted_communicator>(m, "ProcessGroupCommunicator", doc, py::module_local(local))
      .def(py::init(std::forward<Make>(make)), py::arg("process_group"),
           std::forward<Extra>(extra)...)
      .def_property_readonly("rank", &counted_communicator::rank)
      .def_property_readonly("size", &counted_communicator::size)
      .def_property_readonly("bytes_sent", &counted_communicator::bytes_sent)
      .def_property_readonly("bytes_received", &counted_communicator::bytes_received)
      .def("reset_counts", &counted_communicator::reset_counts);
}

/// Registers all_reduce_8bit(comm, input, output, ...) and reduce_scatter_8bit(comm, input,
/// shard, ...), the arguments and defaults the same in both modules.
template <class AllReduce, class ReduceScatter>
void register_collective_calls(pybind11::module_& m, AllReduce&& all_reduce,
                               char const* all_reduce_doc, ReduceScatter&& reduce_scatter,
                               char const* reduce_scatter_doc) {
  namespace py = pybind11;
  auto const options = [](auto... args) {
    return std::make_tuple(args..., py::arg("group_size") = 128, py::arg("average") = true,
                           py::arg("stochastic") = false, py::arg("seed") = 0, py::arg("step") = 0);
  };
  std::apply(
      [&](auto... a) {
        m.def("all_reduce_8bit", std::forward<AllReduce>(all_reduce), a..., all_reduce_doc);
      },
      options(py::arg("comm"), py::arg("input"), py::arg("output")));
  std::apply(
      [&](auto... a) {
        m.def("reduce_scatter_8bit", std::forward<ReduceScatter>(reduce_scatter), a...,
              reduce_scatter_doc);
      },
      options(py::arg("comm"), py::arg("input"), py::arg("shard")));
}

}  // namespace agoq_torch
