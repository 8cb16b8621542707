// The NCCL adapter on one rank (NCCL refuses two ranks on one GPU): all_to_all and all_gather
// move the bytes, are stream-ordered, and NCCL's rejections become comm_error. Skips (77) where no
// CUDA device exists.
#include <agoq/comm/nccl.cuh>
#include <agoq/cuda_check.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

using agoq::comm::comm_error;
using agoq::comm::memory_space;
using agoq::comm::nccl_communicator;

namespace {

// A one-rank NCCL communicator on device 0 and a stream, destroyed at scope exit.
struct one_rank {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  one_rank() {
    int const devices[1] = {0};
    REQUIRE(ncclCommInitAll(&comm, 1, devices) == ncclSuccess);
    AGOQ_CUDA_TRY(cudaSetDevice(0));
    AGOQ_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~one_rank() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    ncclCommDestroy(comm);
  }
  one_rank(one_rank const&) = delete;
  one_rank& operator=(one_rank const&) = delete;
};

// A device buffer of n bytes.
struct device_buffer {
  std::byte* p = nullptr;
  explicit device_buffer(std::size_t n) { AGOQ_CUDA_TRY(cudaMalloc(&p, n)); }
  ~device_buffer() { cudaFree(p); }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
};

std::vector<std::byte> pattern(std::size_t n, unsigned salt) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + salt) >> 1);
  return v;
}

}  // namespace

TEST_CASE("nccl_communicator: one rank, device memory, the stream it was given") {
  one_rank r;
  nccl_communicator c(r.comm, r.stream);
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.memory() == memory_space::device);
  CHECK(c.native_handle() == r.comm);
  CHECK(c.stream().get() == r.stream);
  CHECK_NOTHROW(c.check_async());
  CHECK_THROWS_AS(nccl_communicator(nullptr, r.stream), agoq::invalid_argument);
}

TEST_CASE("nccl_communicator: all_to_all and all_gather move the bytes (stream-ordered)") {
  one_rank r;
  nccl_communicator c(r.comm, r.stream);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4096}, std::size_t{1000003}}) {
    CAPTURE(n);
    if (n == 0) {
      // Nothing is enqueued; the buffers are not touched.
      CHECK_NOTHROW(c.all_to_all(nullptr, nullptr, 0));
      CHECK_NOTHROW(c.all_gather(nullptr, nullptr, 0));
      continue;
    }
    std::vector<std::byte> const in = pattern(n, static_cast<unsigned>(n));
    device_buffer send(n), recv(n);
    // The upload and the clearing are ordered on the communicator's stream, like the transfers.
    AGOQ_CUDA_TRY(cudaMemcpyAsync(send.p, in.data(), n, cudaMemcpyHostToDevice, r.stream));
    // Clears recv, runs `transfer` and checks that recv then holds `in`.
    auto check_transfer = [&](auto const& transfer) {
      AGOQ_CUDA_TRY(cudaMemsetAsync(recv.p, 0xee, n, r.stream));
      transfer();
      std::vector<std::byte> out(n, std::byte{0});
      AGOQ_CUDA_TRY(cudaMemcpyAsync(out.data(), recv.p, n, cudaMemcpyDeviceToHost, r.stream));
      AGOQ_CUDA_TRY(cudaStreamSynchronize(r.stream));
      CHECK(out == in);
    };
    check_transfer([&] { c.all_to_all(send.p, recv.p, n); });
    check_transfer([&] { c.all_gather(send.p, recv.p, n); });
    CHECK_NOTHROW(c.check_async());
  }
}

TEST_CASE("nccl_communicator: NCCL failures become comm_error with NCCL's message") {
  one_rank r;
  // A real rejection would need a broken argument NCCL checks only with NCCL_CHECK_POINTERS set
  // (otherwise the device faults), so the checker is driven with NCCL's own result codes.
  CHECK_NOTHROW(agoq::comm::detail::nccl_check(ncclSuccess, "ncclAllGather", r.comm));
  std::string const want =
      std::string("agoq: ncclAllGather failed: ") + ncclGetErrorString(ncclInvalidArgument);
  try {
    agoq::comm::detail::nccl_check(ncclInvalidArgument, "ncclAllGather", r.comm);
    FAIL("nccl_check did not throw");
  } catch (comm_error const& e) {
    CHECK(std::string(e.what()).rfind(want, 0) == 0);
  }
}
