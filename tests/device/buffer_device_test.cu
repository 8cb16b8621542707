// The CUDA gradient buffer (gradient/buffer.cuh) against the CPU executor's gradient_buffer, bit
// for bit, and the CUDA 8-bit collectives taking it as operand against the CPU ones taking a
// gradient_buffer. Built once per gradient element type (AGOQ_TEST_ELEMENT); skips (77) where no
// CUDA device exists.
#include "device_support.cuh"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <agoq/comm/in_process.cuh>
#include <agoq/comm/in_process.hpp>
#include <agoq/gradient/all_reduce.cuh>
#include <agoq/gradient/buffer.cuh>

#include "device/node_world.cuh"
#include "gradient/support.hpp"

// The suite's names, apart from the other suites of tests/device/device_tests.cu.
namespace buffer_device_test {

using namespace agoq;
using namespace agoq::gradient;
using agoq::comm::in_process_device_group;
using agoq::comm::in_process_group;
using agoq::test::device_bytes;

using element = AGOQ_TEST_ELEMENT;

namespace {

// The codes, padding and scales of a host or device buffer.
std::vector<std::uint8_t> host_bytes(gradient_buffer const& b) {
  auto const* p = b.view().codes;
  return std::vector<std::uint8_t>(p, p + b.bytes());
}

std::vector<std::uint8_t> device_buffer_bytes(device_gradient_buffer const& b) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(b.bytes()));
  AGOQ_CUDA_TRY(cudaStreamSynchronize(b.stream().get()));
  if (!out.empty()) {
    AGOQ_CUDA_TRY(cudaMemcpy(out.data(), b.view().codes, out.size(), cudaMemcpyDeviceToHost));
  }
  return out;
}

std::int64_t read_count(std::int64_t const* p) {
  std::int64_t v = -1;
  AGOQ_CUDA_TRY(cudaMemcpy(&v, p, sizeof(v), cudaMemcpyDeviceToHost));
  return v;
}

// K micro-batches of n elements; the last ones carry NaN and ±Inf when `non_finite`.
std::vector<std::vector<element>> micro_batches(int k, std::int64_t n, std::uint64_t seed,
                                                bool non_finite) {
  std::vector<std::vector<element>> g;
  for (int i = 0; i < k; ++i) {
    g.push_back(test::random_input<element>(n, seed * 31 + static_cast<std::uint64_t>(i),
                                            non_finite && i + 1 == k));
  }
  return g;
}

// Accumulates the batches into a host and a device buffer (the device gradient at element offset
// `shift`, so 16-byte loads are misaligned when shift is odd) and compares the bytes, the
// per-call and the running non-finite counts after every step; zero() / zero_async() once midway.
void compare_accumulate(std::int64_t n, buffer_options const& opt, int k, bool non_finite,
                        int shift) {
  INFO("n=" << n << " G=" << opt.group_size << " "
            << (opt.rounding == rounding_kind::stochastic ? "sr" : "rne") << " K=" << k
            << " shift=" << shift);
  auto const batches =
      micro_batches(k, n, static_cast<std::uint64_t>(n + opt.group_size), non_finite);
  gradient_buffer want(n, opt);
  cudaStream_t stream = nullptr;
  AGOQ_CUDA_TRY(cudaStreamCreate(&stream));
  {
    device_gradient_buffer got(n, opt, ::cuda::stream_ref(stream));
    CHECK(got.bytes() == want.bytes());
    CHECK(got.spec() == want.spec());
    device_bytes g(static_cast<std::size_t>(n + shift) * sizeof(element));
    device_bytes count(sizeof(std::int64_t));
    auto* const call = reinterpret_cast<std::int64_t*>(count.get());
    cuda_executor const ex{::cuda::stream_ref(stream)};
    for (int step = 0; step < k; ++step) {
      INFO("step " << step);
      if (step == 2) {
        want.zero();
        got.zero_async(ex);
      }
      std::int64_t const want_call = want.accumulate(std::span<element const>(batches[step]));
      if (n > 0) {
        AGOQ_CUDA_TRY(cudaMemcpy(g.get() + shift * sizeof(element), batches[step].data(),
                                 static_cast<std::size_t>(n) * sizeof(element),
                                 cudaMemcpyHostToDevice));
      }
      auto const* gp = reinterpret_cast<element const*>(g.get()) + shift;
      got.accumulate_async(ex, std::span<element const>(gp, static_cast<std::size_t>(n)), call);
      REQUIRE(test::first_difference(device_buffer_bytes(got), host_bytes(want)) == -1);
      CHECK(read_count(call) == want_call);
      CHECK(read_count(got.nonfinite_count()) == want.nonfinite_count());
      CHECK(got.counter() == want.counter());
    }
    if (non_finite && n > 1000) CHECK(want.nonfinite_count() > 0);
  }
  AGOQ_CUDA_TRY(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("device_gradient_buffer: accumulate writes the CPU buffer's bits") {
  for (auto rounding : {rounding_kind::stochastic, rounding_kind::nearest}) {
    for (int g : {128, 32, 64, 256, 33, 100}) {
      buffer_options const opt{g, rounding, 0x5eed + static_cast<std::uint64_t>(g)};
      for (std::int64_t n :
           {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{127}, std::int64_t{128},
            std::int64_t{129}, std::int64_t{7919}, std::int64_t{65537}}) {
        compare_accumulate(n, opt, 4, false, 0);
      }
      // A length past a million (prime: a short last group), misaligned gradients, NaN and ±Inf;
      // NaN and ±Inf on the aligned path (whole groups in slots of four runs where G is a power
      // of two).
      compare_accumulate(1000003, opt, 3, true, 1);
      compare_accumulate(4099, opt, 5, true, 3);
      compare_accumulate(40961, opt, 3, true, 0);
    }
  }
}

TEST_CASE("device_gradient_buffer: NaN and ±Inf sums are encoded and counted as on the CPU") {
  std::int64_t const n = 300;
  std::vector<element> g(static_cast<std::size_t>(n), numeric::from_float<element>(0.5f));
  g[3] = numeric::from_float<element>(std::numeric_limits<float>::quiet_NaN());
  g[130] = numeric::from_float<element>(std::numeric_limits<float>::infinity());
  g[299] = numeric::from_float<element>(-std::numeric_limits<float>::infinity());
  gradient_buffer want(n, {128, rounding_kind::nearest, 0});
  device_gradient_buffer got(n, {128, rounding_kind::nearest, 0},
                             ::cuda::stream_ref(cudaStream_t{}));
  device_bytes d(static_cast<std::size_t>(n) * sizeof(element));
  d.upload(g.data(), static_cast<std::size_t>(n) * sizeof(element));
  device_bytes count(sizeof(std::int64_t));
  auto* const call = reinterpret_cast<std::int64_t*>(count.get());
  cuda_executor const ex{cudaStream_t{}};
  for (int step = 0; step < 2; ++step) {
    CHECK(want.accumulate(std::span<element const>(g)) == 3);
    got.accumulate_async(
        ex, std::span<element const>(reinterpret_cast<element const*>(d.get()), g.size()), call);
    CHECK(read_count(call) == 3);
    CHECK(test::first_difference(device_buffer_bytes(got), host_bytes(want)) == -1);
  }
  CHECK(read_count(got.nonfinite_count()) == 6);
  // NaN -> code 0, +Inf -> 127, -Inf -> -127.
  std::vector<std::uint8_t> const bytes = device_buffer_bytes(got);
  CHECK(bytes[3] == 0);
  CHECK(bytes[130] == 127);
  CHECK(bytes[299] == static_cast<std::uint8_t>(-127));
  got.zero_async(ex);
  CHECK(read_count(got.nonfinite_count()) == 0);
}

TEST_CASE("device_gradient_buffer: bad arguments throw agoq::invalid_argument") {
  ::cuda::stream_ref const s(cudaStream_t{});
  CHECK_THROWS_AS(device_gradient_buffer(10, {16}, s), agoq::invalid_argument);
  CHECK_THROWS_AS(device_gradient_buffer(10, {257}, s), agoq::invalid_argument);
  CHECK_THROWS_AS(device_gradient_buffer(-1, {}, s), agoq::invalid_argument);
  device_gradient_buffer b(100, {}, s);
  device_bytes d(100 * sizeof(element));
  auto const* dp = reinterpret_cast<element const*>(d.get());
  cuda_executor const ex{s};
  CHECK_THROWS_AS(b.accumulate_async(ex, std::span<element const>(dp, 99)), agoq::invalid_argument);
  CHECK_THROWS_AS(
      b.accumulate_async(ex, std::span<element const>(static_cast<element const*>(nullptr), 100)),
      agoq::invalid_argument);
  std::vector<element> pageable(100);
  CHECK_THROWS_AS(b.accumulate_async(ex, std::span<element const>(pageable)),
                  agoq::invalid_argument);
  std::int64_t host_count = 0;
  CHECK_THROWS_AS(b.accumulate_async(ex, std::span<element const>(dp, 100), &host_count),
                  agoq::invalid_argument);
  CHECK(b.counter() == 0);  // nothing was enqueued
  // A buffer of another group size is refused by the collectives on every rank.
  std::vector<int> threw(2, 0);
  in_process_device_group::run(2, [&](in_process_device_group::member comm) {
    device_gradient_buffer in(256, {comm.rank() == 1 ? 64 : 128}, comm.stream());
    device_bytes y(256 * sizeof(float));
    try {
      all_reduce_8bit_async(cuda_executor{comm.stream()}, comm, in,
                            std::span<float>(reinterpret_cast<float*>(y.get()), 256));
    } catch (agoq::invalid_argument const&) {
      threw[static_cast<std::size_t>(comm.rank())] = 1;
    }
  });
  CHECK(threw[0] == 1);
  CHECK(threw[1] == 1);
}

namespace {

// What one rank ends with: the float output, the 8-bit buffer bytes and the flags.
struct rank_out {
  std::vector<std::uint8_t> out, buffer;
  std::int64_t nonfinite = -1, local = -1, buffer_count = -1, corrupt = 0;
};

enum class op { buffer_to_span, span_to_buffer, buffer_to_buffer, scatter, hierarchical };

char const* name(op o) {
  switch (o) {
    case op::buffer_to_span:
      return "buffer->span";
    case op::span_to_buffer:
      return "span->buffer";
    case op::buffer_to_buffer:
      return "buffer->buffer (in place)";
    case op::scatter:
      return "reduce_scatter buffer";
    default:
      return "hierarchical buffer";
  }
}

template <class T>
std::vector<std::uint8_t> raw(std::vector<T> const& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::int64_t out_length(op o, std::int64_t n, int p, int r, int g) {
  if (o == op::span_to_buffer || o == op::buffer_to_buffer) return 0;  // the output is a buffer
  if (o != op::scatter) return n;
  reduce_scatter_result const s = shard_range(n, p, r, g);
  return s.end - s.begin;
}

// Runs body(rank, comm, inter) on every rank of `o`: a World of `nodes` nodes of `per_node` ranks
// for op::hierarchical (comm inside the node, inter among the nodes), else one Group of all the
// ranks (inter null).
template <class World, class Group, class Body>
void run_ranks(op o, int nodes, int per_node, Body const& body) {
  if (o == op::hierarchical) {
    World world(nodes, per_node);
    world.run([&](int w, auto& intra, auto& inter) { body(w, intra, &inter); });
  } else {
    Group::run(nodes * per_node, [&](typename Group::member comm) {
      body(comm.rank(), comm, static_cast<typename Group::member*>(nullptr));
    });
  }
}

// The CPU executor: each rank accumulates its batches into a gradient_buffer, then runs `o`.
std::vector<rank_out> host_side(op o, int nodes, int per_node,
                                std::vector<std::vector<std::vector<element>>> const& batches,
                                buffer_options const& bopt, all_reduce_options const& opt) {
  int const p = nodes * per_node;
  auto const n = static_cast<std::int64_t>(batches[0][0].size());
  std::vector<rank_out> res(static_cast<std::size_t>(p));
  auto body = [&](int r, auto& comm, auto* inter) {
    auto const ri = static_cast<std::size_t>(r);
    buffer_options b = bopt;
    b.seed += static_cast<std::uint64_t>(r);
    gradient_buffer buf(n, b);
    for (auto const& g : batches[ri]) buf.accumulate(std::span<element const>(g));
    std::vector<float> out(static_cast<std::size_t>(out_length(o, n, p, r, opt.group_size)));
    rank_out& ro = res[ri];
    if (o == op::buffer_to_span) {
      all_reduce_result const x = all_reduce_8bit(host, comm, buf, std::span<float>(out), opt);
      ro.nonfinite = x.nonfinite;
      ro.local = x.local_nonfinite;
    } else if (o == op::span_to_buffer) {
      gradient_buffer dst(n, b);
      all_reduce_result const x =
          all_reduce_8bit(host, comm, std::span<element const>(batches[ri][0]), dst, opt);
      ro.nonfinite = x.nonfinite;
      ro.local = x.local_nonfinite;
      // The next accumulate adds to the reduced gradient.
      dst.accumulate(std::span<element const>(batches[ri].back()));
      ro.buffer = host_bytes(dst);
      ro.buffer_count = dst.nonfinite_count();
    } else if (o == op::buffer_to_buffer) {
      all_reduce_result const x = all_reduce_8bit(host, comm, buf, buf, opt);
      ro.nonfinite = x.nonfinite;
      ro.local = x.local_nonfinite;
      ro.buffer = host_bytes(buf);
      ro.buffer_count = buf.nonfinite_count();
    } else if (o == op::scatter) {
      reduce_scatter_result const x =
          reduce_scatter_8bit(host, comm, buf, std::span<float>(out), opt);
      ro.nonfinite = x.nonfinite;
      ro.local = x.local_nonfinite;
    } else {
      all_reduce_result const x =
          all_reduce_8bit_hierarchical(host, comm, *inter, buf, std::span<float>(out), opt);
      ro.nonfinite = x.nonfinite;
      ro.local = x.local_nonfinite;
    }
    ro.out = raw(out);
  };
  run_ranks<gradient_test::node_world, in_process_group>(o, nodes, per_node, body);
  return res;
}

// The same on the CUDA executor with device_gradient_buffer.
std::vector<rank_out> device_side(op o, int nodes, int per_node,
                                  std::vector<std::vector<std::vector<element>>> const& batches,
                                  buffer_options const& bopt, all_reduce_options const& opt) {
  int const p = nodes * per_node;
  auto const n = static_cast<std::int64_t>(batches[0][0].size());
  std::vector<rank_out> res(static_cast<std::size_t>(p));
  auto body = [&](int r, auto& comm, auto* inter) {
    auto const ri = static_cast<std::size_t>(r);
    ::cuda::stream_ref const stream = comm.stream();
    cuda_executor const ex{stream};
    buffer_options b = bopt;
    b.seed += static_cast<std::uint64_t>(r);
    device_gradient_buffer buf(n, b, stream);
    device_bytes g(static_cast<std::size_t>(n) * sizeof(element) + 16);
    auto* const gp = reinterpret_cast<element*>(g.get());
    std::span<element const> const gs(gp, static_cast<std::size_t>(n));
    // Ordered on the rank's (non-blocking) stream, and complete before `x` may change.
    auto upload = [&](std::vector<element> const& x) {
      if (n > 0) {
        AGOQ_CUDA_TRY(cudaMemcpyAsync(gp, x.data(), static_cast<std::size_t>(n) * sizeof(element),
                                      cudaMemcpyHostToDevice, stream.get()));
      }
      AGOQ_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    };
    for (auto const& x : batches[ri]) {
      upload(x);
      buf.accumulate_async(ex, gs);
    }
    std::int64_t const m = out_length(o, n, p, r, opt.group_size);
    device_bytes y(static_cast<std::size_t>(m) * sizeof(float) + 16);
    std::span<float> const ys(reinterpret_cast<float*>(y.get()), static_cast<std::size_t>(m));
    device_bytes st(sizeof(all_reduce_status));
    auto* const status = reinterpret_cast<all_reduce_status*>(st.get());
    rank_out& ro = res[ri];
    if (o == op::buffer_to_span) {
      all_reduce_8bit_async(ex, comm, buf, ys, opt, status);
    } else if (o == op::span_to_buffer) {
      device_gradient_buffer dst(n, b, stream);
      upload(batches[ri][0]);
      all_reduce_8bit_async(ex, comm, gs, dst, opt, status);
      upload(batches[ri].back());
      dst.accumulate_async(ex, gs);
      ro.buffer = device_buffer_bytes(dst);
      ro.buffer_count = read_count(dst.nonfinite_count());
    } else if (o == op::buffer_to_buffer) {
      all_reduce_8bit_async(ex, comm, buf, buf, opt, status);
      ro.buffer = device_buffer_bytes(buf);
      ro.buffer_count = read_count(buf.nonfinite_count());
    } else if (o == op::scatter) {
      reduce_scatter_8bit_async(ex, comm, buf, ys, opt, status);
    } else {
      all_reduce_8bit_hierarchical_async(ex, comm, *inter, buf, ys, opt, status);
    }
    AGOQ_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    ro.out.resize(static_cast<std::size_t>(m) * sizeof(float));
    if (m > 0) y.download(ro.out.data(), ro.out.size());
    all_reduce_status s;
    AGOQ_CUDA_TRY(cudaMemcpy(&s, status, sizeof(s), cudaMemcpyDeviceToHost));
    ro.nonfinite = s.nonfinite;
    ro.local = s.local_nonfinite;
    ro.corrupt = s.corrupt;
  };
  run_ranks<test::device_node_world, in_process_device_group>(o, nodes, per_node, body);
  return res;
}

}  // namespace

TEST_CASE("the CUDA collectives take device_gradient_buffer operands like the CPU ones") {
  for (op o : {op::buffer_to_span, op::span_to_buffer, op::buffer_to_buffer, op::scatter,
               op::hierarchical}) {
    for (auto [nodes, per_node] :
         {std::pair{1, 1}, std::pair{1, 3}, std::pair{2, 2}, std::pair{2, 3}}) {
      if (o != op::hierarchical && nodes > 1) continue;
      int const p = nodes * per_node;
      for (std::int64_t n :
           {std::int64_t{0}, std::int64_t{1}, std::int64_t{1009}, std::int64_t{40000}}) {
        for (auto rounding : {rounding_kind::stochastic, rounding_kind::nearest}) {
          for (bool non_finite : {false, true}) {
            std::string const what = std::string(name(o)) + " " + std::to_string(nodes) + "x" +
                                     std::to_string(per_node) + " N=" + std::to_string(n) +
                                     (rounding == rounding_kind::stochastic ? " sr" : " rne") +
                                     (non_finite ? " nan" : "");
            INFO(what);
            std::vector<std::vector<std::vector<element>>> batches;
            for (int r = 0; r < p; ++r) {
              // Rank 1's last batch carries NaN / ±Inf when non_finite.
              batches.push_back(micro_batches(3, n, static_cast<std::uint64_t>(n * 7 + r),
                                              non_finite && r == p - 1));
            }
            buffer_options const bopt{128, rounding, 99};
            all_reduce_options const opt{128, true, rounding, 4242, 5};
            std::vector<rank_out> const want = host_side(o, nodes, per_node, batches, bopt, opt);
            std::vector<rank_out> const got = device_side(o, nodes, per_node, batches, bopt, opt);
            for (int r = 0; r < p; ++r) {
              INFO("rank " << r);
              auto const ri = static_cast<std::size_t>(r);
              CHECK(test::first_difference(got[ri].out, want[ri].out) == -1);
              CHECK(test::first_difference(got[ri].buffer, want[ri].buffer) == -1);
              CHECK(got[ri].nonfinite == want[ri].nonfinite);
              CHECK(got[ri].local == want[ri].local);
              CHECK(got[ri].buffer_count == want[ri].buffer_count);
              CHECK(got[ri].corrupt == 0);
              if (non_finite && n > 1000 && o != op::span_to_buffer) CHECK(want[ri].nonfinite == 1);
            }
          }
        }
      }
    }
  }
}

}  // namespace buffer_device_test
