// A world of L x K ranks as host threads sharing one GPU, split into nodes like the CPU tests'
// gradient_test::node_world: world rank w is rank w % L of node w / L; its intra communicator
// groups node w / L, its inter communicator rank w % L of every node. Both are
// in_process_device_group members on the rank's own stream.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <agoq/comm/in_process.cuh>
#include <agoq/cuda_check.hpp>

namespace agoq::test {

struct device_node_world {
  int nodes;
  int per_node;
  std::vector<std::unique_ptr<comm::in_process_device_group>> intra_groups;
  std::vector<std::unique_ptr<comm::in_process_device_group>> inter_groups;

  device_node_world(int n, int l) : nodes(n), per_node(l) {
    for (int a = 0; a < n; ++a)
      intra_groups.push_back(std::make_unique<comm::in_process_device_group>(l));
    for (int i = 0; i < l; ++i)
      inter_groups.push_back(std::make_unique<comm::in_process_device_group>(n));
  }

  /// Runs f(world rank, intra, inter) on every rank's thread and stream, synchronizes, and
  /// rethrows the first exception of a rank (a failing rank aborts every group first).
  template <class F>
  void run(F&& f) {
    int device = 0;
    AGOQ_CUDA_TRY(cudaGetDevice(&device));
    int const p = nodes * per_node;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(p));
    std::vector<std::thread> threads;
    for (int w = 0; w < p; ++w) {
      threads.emplace_back([&, w] {
        cudaStream_t stream = nullptr;
        try {
          AGOQ_CUDA_TRY(cudaSetDevice(device));
          AGOQ_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          ::cuda::stream_ref const s(stream);
          auto intra = intra_groups[static_cast<std::size_t>(w / per_node)]->at(w % per_node, s);
          auto inter = inter_groups[static_cast<std::size_t>(w % per_node)]->at(w / per_node, s);
          f(w, intra, inter);
          AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
        } catch (...) {
          errors[static_cast<std::size_t>(w)] = std::current_exception();
          for (auto& g : intra_groups) g->abort();
          for (auto& g : inter_groups) g->abort();
        }
        if (stream != nullptr) {
          cudaStreamSynchronize(stream);
          cudaStreamDestroy(stream);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto const& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }
};

}  // namespace agoq::test
