// The CUDA executor of the 8-bit collectives against the CPU executor, bit for bit: P ranks as
// threads sharing one GPU (in_process_device_group) against the same ranks over in_process_group,
// every rank's output, shard and flags; the hierarchical form over L x K such ranks; one bucket
// past 2^31 elements. Skips (77) where no CUDA device exists.
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

#include "device/node_world.cuh"
#include "gradient/support.hpp"

using namespace agoq;
using namespace agoq::gradient;
using agoq::comm::in_process_device_group;
using agoq::comm::in_process_group;
using agoq::test::device_bytes;

namespace {

template <class T>
std::vector<std::uint8_t> bytes_of(std::vector<T> const& x) {
  std::vector<std::uint8_t> b(x.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), x.data(), b.size());
  return b;
}

// Every rank's output bytes and flags.
struct ranks_result {
  std::vector<std::vector<std::uint8_t>> out;
  std::vector<std::int64_t> nonfinite, local;
  std::vector<std::int64_t> corrupt;
  explicit ranks_result(int p)
      : out(static_cast<std::size_t>(p)),
        nonfinite(static_cast<std::size_t>(p)),
        local(static_cast<std::size_t>(p)),
        corrupt(static_cast<std::size_t>(p)) {}

  /// Rank ri's result of a device run: `bytes` of output at device address y, and the status.
  void download(std::size_t ri, void const* y, std::size_t bytes, all_reduce_status const* status) {
    out[ri].resize(bytes);
    if (bytes > 0) AGOQ_CUDA_TRY(cudaMemcpy(out[ri].data(), y, bytes, cudaMemcpyDeviceToHost));
    all_reduce_status s;
    AGOQ_CUDA_TRY(cudaMemcpy(&s, status, sizeof(s), cudaMemcpyDeviceToHost));
    nonfinite[ri] = s.nonfinite;
    local[ri] = s.local_nonfinite;
    corrupt[ri] = s.corrupt;
  }
};

template <class In>
std::vector<std::vector<In>> rank_inputs(int p, std::int64_t n, std::uint64_t seed) {
  std::vector<std::vector<In>> in;
  for (int r = 0; r < p; ++r) in.push_back(test::random_input<In>(n, seed * 131 + r, false));
  return in;
}

// The output length of rank r: N for the all-reduce, its chunk for the reduce-scatter.
std::int64_t out_length(bool scatter, std::int64_t n, int p, int r, int g) {
  return scatter ? shard_range(n, p, r, g).end - shard_range(n, p, r, g).begin : n;
}

template <class In, class Out>
ranks_result host_run(std::vector<std::vector<In>> const& in, all_reduce_options const& opt,
                      bool scatter) {
  int const p = static_cast<int>(in.size());
  auto const n = static_cast<std::int64_t>(in[0].size());
  ranks_result rr(p);
  in_process_group::run(p, [&](in_process_group::member comm) {
    int const r = comm.rank();
    auto const ri = static_cast<std::size_t>(r);
    std::vector<Out> out(static_cast<std::size_t>(out_length(scatter, n, p, r, opt.group_size)));
    std::span<In const> const x(in[ri]);
    if (scatter) {
      reduce_scatter_result const res =
          reduce_scatter_8bit(host, comm, x, std::span<Out>(out), opt);
      rr.nonfinite[ri] = res.nonfinite ? 1 : 0;
      rr.local[ri] = res.local_nonfinite;
    } else {
      all_reduce_result const res = all_reduce_8bit(host, comm, x, std::span<Out>(out), opt);
      rr.nonfinite[ri] = res.nonfinite ? 1 : 0;
      rr.local[ri] = res.local_nonfinite;
    }
    rr.out[ri] = bytes_of(out);
  });
  return rr;
}

// The same collective on the device; `in_place` runs the all-reduce with output = input.
template <class In, class Out>
ranks_result device_run(std::vector<std::vector<In>> const& in, all_reduce_options const& opt,
                        bool scatter, bool in_place = false) {
  int const p = static_cast<int>(in.size());
  auto const n = static_cast<std::int64_t>(in[0].size());
  ranks_result rr(p);
  in_process_device_group::run(p, [&](in_process_device_group::member comm) {
    int const r = comm.rank();
    auto const ri = static_cast<std::size_t>(r);
    std::int64_t const m = out_length(scatter, n, p, r, opt.group_size);
    device_bytes x(static_cast<std::size_t>(n) * sizeof(In) + 16);
    device_bytes y(static_cast<std::size_t>(m) * sizeof(Out) + 16);
    device_bytes st(sizeof(all_reduce_status));
    if (n > 0) x.upload(in[ri].data(), static_cast<std::size_t>(n) * sizeof(In));
    auto* const xp = reinterpret_cast<In*>(x.get());
    auto* const yp = in_place ? reinterpret_cast<Out*>(x.get()) : reinterpret_cast<Out*>(y.get());
    auto* const status = reinterpret_cast<all_reduce_status*>(st.get());
    cuda_executor const ex{comm.stream()};
    std::span<In const> const xs(xp, static_cast<std::size_t>(n));
    std::span<Out> const ys(yp, static_cast<std::size_t>(m));
    if (scatter) {
      reduce_scatter_8bit_async(ex, comm, xs, ys, opt, status);
    } else {
      all_reduce_8bit_async(ex, comm, xs, ys, opt, status);
    }
    AGOQ_CUDA_TRY(cudaStreamSynchronize(comm.stream().get()));
    rr.download(ri, yp, static_cast<std::size_t>(m) * sizeof(Out), status);
  });
  return rr;
}

void check_same(ranks_result const& h, ranks_result const& d, std::string const& what) {
  INFO(what);
  for (std::size_t r = 0; r < h.out.size(); ++r) {
    INFO("rank " << r);
    CHECK(test::first_difference(d.out[r], h.out[r]) == -1);
    CHECK(d.nonfinite[r] == h.nonfinite[r]);
    CHECK(d.local[r] == h.local[r]);
    CHECK(d.corrupt[r] == 0);
  }
}

template <class In, class Out>
void sweep(char const* types, std::vector<int> const& ranks, std::vector<std::int64_t> const& ns,
           std::vector<int> const& groups, bool scatter) {
  for (int p : ranks) {
    for (std::int64_t n : ns) {
      for (int g : groups) {
        for (auto rounding : {rounding_kind::nearest, rounding_kind::stochastic}) {
          for (bool average : {false, true}) {
            all_reduce_options const opt{g, average, rounding, 1234 + static_cast<std::uint64_t>(n),
                                         7};
            auto const in = rank_inputs<In>(p, n, static_cast<std::uint64_t>(n * 8 + p));
            std::string const what = std::string(scatter ? "reduce_scatter " : "all_reduce ") +
                                     types + " P=" + std::to_string(p) + " N=" + std::to_string(n) +
                                     " G=" + std::to_string(g) +
                                     (rounding == rounding_kind::stochastic ? " sr" : " rne") +
                                     (average ? " average" : " sum");
            check_same(host_run<In, Out>(in, opt, scatter), device_run<In, Out>(in, opt, scatter),
                       what);
          }
        }
      }
    }
  }
}

std::vector<int> const all_ranks = {1, 2, 3, 4, 8};
std::vector<std::int64_t> const small_lengths = {0, 1, 127, 128, 7919, 65537};

}  // namespace

TEST_CASE("all_reduce_8bit_async: bit-identical to the CPU executor, every rank") {
  sweep<bfloat16, float>("bf16->f32", all_ranks, small_lengths, {128}, false);
  sweep<float, float>("f32->f32", all_ranks, small_lengths, {128}, false);
  sweep<half, half>("f16->f16", all_ranks, small_lengths, {128}, false);
  sweep<bfloat16, bfloat16>("bf16->bf16", all_ranks, small_lengths, {128}, false);
  // Other group sizes: the three-pass quantize path, runs straddling two groups (G = 33, 100).
  sweep<bfloat16, float>("bf16->f32", {2, 3}, {1, 127, 7919}, {32, 33, 100, 256}, false);
  // A length past a million, a prime (partial last group, uneven chunks).
  sweep<bfloat16, float>("bf16->f32", {1, 3, 8}, {1000003}, {128}, false);
  // Past 8 ranks the reduce kernel loads 16 ranks per round (reduce_rank_batch_wide): 12 ranks
  // (one partial round), 20 (a full round and a partial one).
  sweep<bfloat16, float>("bf16->f32", {12, 20}, {1, 7919, 65537}, {33, 128}, false);
}

TEST_CASE("reduce_scatter_8bit_async: bit-identical to the CPU executor, every rank") {
  sweep<bfloat16, float>("bf16->f32", all_ranks, small_lengths, {128}, true);
  sweep<float, bfloat16>("f32->bf16", all_ranks, small_lengths, {128}, true);
  sweep<half, float>("f16->f32", {2, 3}, {1, 127, 7919}, {33, 100}, true);
  sweep<bfloat16, float>("bf16->f32", {3, 8}, {1000003}, {128}, true);
  sweep<bfloat16, float>("bf16->f32", {12, 20}, {7919}, {128}, true);
}

TEST_CASE("all_reduce_8bit_async: output may be the input") {
  for (int p : {1, 3, 4}) {
    auto const in = rank_inputs<float>(p, 7919, 5);
    all_reduce_options const opt{128, true, rounding_kind::stochastic, 9, 3};
    check_same(host_run<float, float>(in, opt, false),
               device_run<float, float>(in, opt, false, true), "in place");
  }
}

TEST_CASE("all_reduce_8bit_async: a NaN on one rank sets the flag on every rank") {
  for (bool scatter : {false, true}) {
    int const p = 4;
    auto in = rank_inputs<bfloat16>(p, 1000, 11);
    in[2][517] = numeric::from_float<bfloat16>(std::numeric_limits<float>::quiet_NaN());
    in[2][3] = numeric::from_float<bfloat16>(std::numeric_limits<float>::infinity());
    all_reduce_options const opt{};
    ranks_result const h = host_run<bfloat16, float>(in, opt, scatter);
    ranks_result const d = device_run<bfloat16, float>(in, opt, scatter);
    check_same(h, d, scatter ? "reduce_scatter NaN" : "all_reduce NaN");
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      // Rank 2 flags every block it sends, so even the reduce-scatter flag reaches every rank.
      CHECK(d.nonfinite[ri] == 1);
      CHECK(d.local[ri] == (r == 2 ? 2 : 0));
    }
  }
}

TEST_CASE("all_reduce_8bit_async: mismatched lengths throw on every rank") {
  for (bool scatter : {false, true}) {
    int const p = 3;
    std::vector<int> threw(static_cast<std::size_t>(p), 0);
    in_process_device_group::run(p, [&](in_process_device_group::member comm) {
      int const r = comm.rank();
      std::int64_t const n = r == 1 ? 1001 : 1000;
      device_bytes x(static_cast<std::size_t>(n) * sizeof(float));
      device_bytes y(static_cast<std::size_t>(n) * sizeof(float));
      cuda_executor const ex{comm.stream()};
      std::span<float const> const xs(reinterpret_cast<float const*>(x.get()),
                                      static_cast<std::size_t>(n));
      std::span<float> const ys(reinterpret_cast<float*>(y.get()), static_cast<std::size_t>(n));
      try {
        if (scatter) {
          reduce_scatter_8bit_async(ex, comm, xs, ys);
        } else {
          all_reduce_8bit_async(ex, comm, xs, ys);
        }
      } catch (agoq::invalid_argument const&) {
        threw[static_cast<std::size_t>(r)] = 1;
      }
    });
    for (int t : threw) CHECK(t == 1);
  }
}

TEST_CASE("all_reduce_8bit_async: a host communicator is refused") {
  in_process_group g(1);
  in_process_group::member comm = g.at(0);
  device_bytes x(64);
  std::span<float const> const xs(reinterpret_cast<float const*>(x.get()), 16);
  std::span<float> const ys(reinterpret_cast<float*>(x.get()), 16);
  CHECK_THROWS_AS(all_reduce_8bit_async(cuda_executor{cudaStream_t{}}, comm, xs, ys),
                  agoq::invalid_argument);
}

TEST_CASE("in_process_device_group: all_to_all and all_gather move the bytes") {
  int const p = 3;
  std::size_t const n = 37;
  std::vector<std::vector<std::uint8_t>> got_a2a(p), got_ag(p);
  in_process_device_group::run(p, [&](in_process_device_group::member comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    std::vector<std::uint8_t> send(p * n);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::uint8_t>(r * 71 + i);
    device_bytes s(p * n), a(p * n), g(p * n);
    s.upload(send.data(), send.size());
    auto const* sp = reinterpret_cast<std::byte const*>(s.get());
    comm.all_to_all(sp, reinterpret_cast<std::byte*>(a.get()), n);
    comm.all_gather(sp, reinterpret_cast<std::byte*>(g.get()), n);
    AGOQ_CUDA_TRY(cudaStreamSynchronize(comm.stream().get()));
    got_a2a[r].resize(p * n);
    got_ag[r].resize(p * n);
    a.download(got_a2a[r].data(), p * n);
    g.download(got_ag[r].data(), p * n);
  });
  for (std::size_t r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < p; ++i) {
      for (std::size_t k = 0; k < n; ++k) {
        CHECK(got_a2a[r][i * n + k] == static_cast<std::uint8_t>(i * 71 + r * n + k));
        CHECK(got_ag[r][i * n + k] == static_cast<std::uint8_t>(i * 71 + k));
      }
    }
  }
}

namespace {

// The hierarchical all-reduce over nodes x per_node ranks on the CPU executor.
template <class In, class Out>
ranks_result host_hierarchical(int nodes, int per_node, std::vector<std::vector<In>> const& in,
                               all_reduce_options const& opt) {
  int const p = nodes * per_node;
  auto const n = static_cast<std::int64_t>(in[0].size());
  ranks_result rr(p);
  gradient_test::node_world world(nodes, per_node);
  world.run([&](int w, auto& intra, auto& inter) {
    auto const ri = static_cast<std::size_t>(w);
    std::vector<Out> out(static_cast<std::size_t>(n));
    all_reduce_result const res = all_reduce_8bit_hierarchical(
        host, intra, inter, std::span<In const>(in[ri]), std::span<Out>(out), opt);
    rr.nonfinite[ri] = res.nonfinite ? 1 : 0;
    rr.local[ri] = res.local_nonfinite;
    rr.out[ri] = bytes_of(out);
  });
  return rr;
}

// The same on the CUDA executor (output = input when in_place).
template <class In, class Out>
ranks_result device_hierarchical(int nodes, int per_node, std::vector<std::vector<In>> const& in,
                                 all_reduce_options const& opt, bool in_place = false) {
  int const p = nodes * per_node;
  auto const n = static_cast<std::int64_t>(in[0].size());
  ranks_result rr(p);
  test::device_node_world world(nodes, per_node);
  world.run([&](int w, auto& intra, auto& inter) {
    auto const ri = static_cast<std::size_t>(w);
    cudaStream_t const stream = intra.stream().get();
    device_bytes x(static_cast<std::size_t>(n) * sizeof(In) + 16);
    device_bytes y(static_cast<std::size_t>(n) * sizeof(Out) + 16);
    device_bytes st(sizeof(all_reduce_status));
    if (n > 0) {
      AGOQ_CUDA_TRY(cudaMemcpyAsync(x.get(), in[ri].data(),
                                    static_cast<std::size_t>(n) * sizeof(In),
                                    cudaMemcpyHostToDevice, stream));
    }
    auto* const xp = reinterpret_cast<In*>(x.get());
    auto* const yp = in_place ? reinterpret_cast<Out*>(x.get()) : reinterpret_cast<Out*>(y.get());
    auto* const status = reinterpret_cast<all_reduce_status*>(st.get());
    all_reduce_8bit_hierarchical_async(cuda_executor{intra.stream()}, intra, inter,
                                       std::span<In const>(xp, static_cast<std::size_t>(n)),
                                       std::span<Out>(yp, static_cast<std::size_t>(n)), opt,
                                       status);
    AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
    rr.download(ri, yp, static_cast<std::size_t>(n) * sizeof(Out), status);
  });
  return rr;
}

template <class In, class Out>
void hierarchical_sweep(char const* types, std::vector<std::pair<int, int>> const& shapes,
                        std::vector<std::int64_t> const& ns, std::vector<int> const& groups) {
  for (auto [nodes, per_node] : shapes) {
    for (std::int64_t n : ns) {
      for (int g : groups) {
        for (auto rounding : {rounding_kind::nearest, rounding_kind::stochastic}) {
          for (bool average : {false, true}) {
            all_reduce_options const opt{g, average, rounding, 77 + static_cast<std::uint64_t>(n),
                                         3};
            auto const in =
                rank_inputs<In>(nodes * per_node, n, static_cast<std::uint64_t>(n + nodes));
            std::string const what = std::string("hierarchical ") + types + " " +
                                     std::to_string(nodes) + "x" + std::to_string(per_node) +
                                     " N=" + std::to_string(n) + " G=" + std::to_string(g) +
                                     (rounding == rounding_kind::stochastic ? " sr" : " rne") +
                                     (average ? " average" : " sum");
            ranks_result const h = host_hierarchical<In, Out>(nodes, per_node, in, opt);
            check_same(h, device_hierarchical<In, Out>(nodes, per_node, in, opt), what);
            // Every rank ends with the same bits.
            for (auto const& o : h.out) CHECK(test::first_difference(o, h.out[0]) == -1);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("all_reduce_8bit_hierarchical_async: bit-identical to the CPU executor, every rank") {
  std::vector<std::pair<int, int>> const shapes = {{2, 2}, {2, 3}, {4, 2}, {1, 3}, {3, 1}, {1, 1}};
  std::vector<std::int64_t> const ns = {0, 1, 127, 1009, 40000, 65537};
  hierarchical_sweep<bfloat16, float>("bf16->f32", shapes, ns, {128});
  hierarchical_sweep<float, float>("f32->f32", {{2, 2}, {2, 3}}, ns, {128});
  hierarchical_sweep<half, bfloat16>("f16->bf16", {{4, 2}}, ns, {128});
  // Other group sizes (runs straddling two groups, three-pass quantization).
  hierarchical_sweep<bfloat16, float>("bf16->f32", {{2, 3}}, {1, 7919}, {32, 33, 100, 256});
  // A length past a million (prime: uneven shards and chunks at both levels).
  hierarchical_sweep<bfloat16, float>("bf16->f32", {{2, 3}}, {1000003}, {128});
}

TEST_CASE("all_reduce_8bit_hierarchical_async: output may be the input") {
  auto const in = rank_inputs<float>(6, 7919, 5);
  all_reduce_options const opt{128, true, rounding_kind::stochastic, 9, 3};
  check_same(host_hierarchical<float, float>(2, 3, in, opt),
             device_hierarchical<float, float>(2, 3, in, opt, true), "hierarchical in place");
}

TEST_CASE("all_reduce_8bit_hierarchical_async: a NaN on one rank sets the flag on every rank") {
  auto in = rank_inputs<bfloat16>(6, 1000, 13);
  in[4][517] = numeric::from_float<bfloat16>(std::numeric_limits<float>::quiet_NaN());
  in[4][3] = numeric::from_float<bfloat16>(-std::numeric_limits<float>::infinity());
  all_reduce_options const opt{};
  ranks_result const h = host_hierarchical<bfloat16, float>(2, 3, in, opt);
  ranks_result const d = device_hierarchical<bfloat16, float>(2, 3, in, opt);
  check_same(h, d, "hierarchical NaN");
  for (int w = 0; w < 6; ++w) {
    auto const wi = static_cast<std::size_t>(w);
    CHECK(d.nonfinite[wi] == 1);
    CHECK(d.local[wi] == (w == 4 ? 2 : 0));
  }
}

TEST_CASE("all_reduce_8bit_hierarchical_async: a bad argument on one rank throws on every rank") {
  for (int bad : {0, 4}) {  // a rank of each node
    std::vector<int> threw(6, 0);
    test::device_node_world world(2, 3);
    world.run([&](int w, auto& intra, auto& inter) {
      std::int64_t const n = w == bad ? 301 : 300;
      device_bytes x(static_cast<std::size_t>(n) * sizeof(float));
      device_bytes y(static_cast<std::size_t>(n) * sizeof(float));
      std::span<float const> const xs(reinterpret_cast<float const*>(x.get()),
                                      static_cast<std::size_t>(n));
      std::span<float> const ys(reinterpret_cast<float*>(y.get()), static_cast<std::size_t>(n));
      try {
        all_reduce_8bit_hierarchical_async(cuda_executor{intra.stream()}, intra, inter, xs, ys);
      } catch (agoq::invalid_argument const&) {
        threw[static_cast<std::size_t>(w)] = 1;
      }
    });
    for (int t : threw) CHECK(t == 1);
  }
  // A host communicator is refused (on this rank, before any transfer).
  in_process_group g(1);
  in_process_group::member comm = g.at(0);
  device_bytes x(64);
  std::span<float const> const xs(reinterpret_cast<float const*>(x.get()), 16);
  std::span<float> const ys(reinterpret_cast<float*>(x.get()), 16);
  in_process_device_group dg(1);
  auto dcomm = dg.at(0, ::cuda::stream_ref(cudaStream_t{}));
  CHECK_THROWS_AS(
      all_reduce_8bit_hierarchical_async(cuda_executor{cudaStream_t{}}, comm, dcomm, xs, ys),
      agoq::invalid_argument);
  CHECK_THROWS_AS(
      all_reduce_8bit_hierarchical_async(cuda_executor{cudaStream_t{}}, dcomm, comm, xs, ys),
      agoq::invalid_argument);
}

namespace {

// Rank r's input element i of the large test: a hash of (r, i) as a value in [-4, 4), a spike of
// 64x every 997 elements; the same bits on host and device (integer hash, exact float steps).
AGOQ_HOST_DEVICE inline float large_value(int r, std::int64_t i) {
  std::uint64_t const h = mix64(static_cast<std::uint64_t>(i) * 2 + static_cast<std::uint64_t>(r));
  float const v = static_cast<float>(h >> 40) * 0x1p-21f - 4.0f;
  return i % 997 == 0 ? v * 64.0f : v;
}

__global__ void fill_large_kernel(bfloat16* x, std::int64_t n, int r) {
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    x[i] = numeric::from_float<bfloat16>(large_value(r, i));
  }
}

// The all-reduce's output on elements [b, e) (whole groups from a group boundary) rebuilt on the
// host from its definition: each rank's quantization at its scatter stream positions, the fp32
// sum in rank order, the mean, the requantization at the gather positions, the dequantization.
std::vector<bfloat16> large_expected(int p, std::int64_t b, std::int64_t e,
                                     all_reduce_options const& opt) {
  std::int64_t const m = e - b;
  spec const s = payload_spec(opt.group_size, opt.rounding);
  quantized_tensor q(s, 1, m);
  std::vector<float> sum(static_cast<std::size_t>(m)), x(static_cast<std::size_t>(m));
  for (int r = 0; r < p; ++r) {
    std::vector<bfloat16> in(static_cast<std::size_t>(m));
    for (std::int64_t i = 0; i < m; ++i)
      in[static_cast<std::size_t>(i)] = numeric::from_float<bfloat16>(large_value(r, b + i));
    quantize(host, as_row(static_cast<bfloat16 const*>(in.data()), m), q.view(),
             {stream_key(opt.seed, opt.step, stream_tag::scatter, static_cast<std::uint32_t>(r)),
              static_cast<std::uint64_t>(b)});
    dequantize(host, q.view(), as_row(x.data(), m));
    for (std::int64_t i = 0; i < m; ++i) {
      auto const k = static_cast<std::size_t>(i);
      sum[k] = r == 0 ? x[k] : sum[k] + x[k];
    }
  }
  if (opt.average) {
    for (float& v : sum) v = v / static_cast<float>(p);
  }
  quantize(host, as_row(static_cast<float const*>(sum.data()), m), q.view(),
           {stream_key(opt.seed, opt.step, stream_tag::gather, 0), static_cast<std::uint64_t>(b)});
  std::vector<bfloat16> y(static_cast<std::size_t>(m));
  dequantize(host, q.view(), as_row(y.data(), m));
  return y;
}

}  // namespace

TEST_CASE("all_reduce_8bit_async: a bucket past 2^31 elements (P = 2, bf16, in place)") {
  int const p = 2;
  std::int64_t const n = (std::int64_t{1} << 31) + 37;
  all_reduce_options const opt{128, true, rounding_kind::stochastic, 2026, 11};
  chunk_plan const plan(n, opt.group_size, p);
  // Per rank: the bucket, 2 P blocks and the fp32 sums of a chunk, plus 1 GiB of slack.
  auto const need =
      static_cast<std::size_t>(p * (2 * n + 2 * p * plan.block_bytes() + 4 * plan.code_capacity()) +
                               (std::int64_t{1} << 30));
  std::size_t free_bytes = 0, total_bytes = 0;
  AGOQ_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < need) {
    MESSAGE("skipped: needs " << need / (1 << 20) << " MiB of device memory, "
                              << free_bytes / (1 << 20) << " MiB free");
    return;
  }
  // Windows of whole groups: the start, both sides of the chunk boundary, both sides of 2^31, the
  // ragged end.
  std::int64_t const w = 4096;
  std::int64_t const end_window = (n - w) / 128 * 128;
  std::vector<std::pair<std::int64_t, std::int64_t>> const windows = {
      {0, w},
      {plan.begin(1) - w, plan.begin(1) + w},
      {(std::int64_t{1} << 31) - w, (std::int64_t{1} << 31) + w},
      {end_window, n}};
  std::vector<std::vector<std::vector<bfloat16>>> got(p);
  std::vector<all_reduce_status> st(p);
  in_process_device_group::run(p, [&](in_process_device_group::member comm) {
    int const r = comm.rank();
    cudaStream_t const stream = comm.stream().get();
    auto const bytes = static_cast<std::size_t>(n) * sizeof(bfloat16);
    ::agoq::detail::gpu::stream_allocation x(bytes, stream);
    ::agoq::detail::gpu::stream_allocation status(sizeof(all_reduce_status), stream);
    auto* const xp = reinterpret_cast<bfloat16*>(x.get());
    ::agoq::detail::gpu::launch(fill_large_kernel, 4096, 256, 0, stream, xp, n, r);
    AGOQ_CUDA_TRY(cudaGetLastError());
    auto* const sp = reinterpret_cast<all_reduce_status*>(status.get());
    std::span<bfloat16> const xs(xp, static_cast<std::size_t>(n));
    all_reduce_8bit_async(cuda_executor{comm.stream()}, comm, xs, xs, opt, sp);
    for (auto [b, e] : windows) {
      std::vector<bfloat16> v(static_cast<std::size_t>(e - b));
      AGOQ_CUDA_TRY(cudaMemcpyAsync(v.data(), xp + b, v.size() * sizeof(bfloat16),
                                    cudaMemcpyDeviceToHost, stream));
      AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
      got[static_cast<std::size_t>(r)].push_back(std::move(v));
    }
    AGOQ_CUDA_TRY(cudaMemcpyAsync(&st[static_cast<std::size_t>(r)], sp, sizeof(all_reduce_status),
                                  cudaMemcpyDeviceToHost, stream));
    AGOQ_CUDA_TRY(cudaStreamSynchronize(stream));
  });
  for (std::size_t k = 0; k < windows.size(); ++k) {
    auto [b, e] = windows[k];
    INFO("window [" << b << ", " << e << ")");
    std::vector<std::uint8_t> const want = bytes_of(large_expected(p, b, e, opt));
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r);
      CHECK(test::first_difference(bytes_of(got[static_cast<std::size_t>(r)][k]), want) == -1);
    }
  }
  for (auto const& s : st) {
    CHECK(s.nonfinite == 0);
    CHECK(s.local_nonfinite == 0);
    CHECK(s.corrupt == 0);
  }
}
