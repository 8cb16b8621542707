/// \file
/// The 8-bit gradient all-reduce on the CPU executor.
///
/// - `reduce_step/P<P>/threads:<T>`: the fused step a chunk's owner runs (dequantize the P
///   received int8 chunks, sum in fp32 in rank order, requantize into the block it all-gathers),
///   on T threads of the host executor, beside a memcpy of the same bytes: the P received blocks
///   (what the step must read).
///   SetBytesProcessed counts those bytes, and `vs_memcpy` is memcpy time over step time,
///   measured in-run (each iteration times the step, then, timing paused, the memcpy).
/// - `all_reduce_8bit/P<P>` and `all_reduce_fp32/P<P>`: the whole collective over an
///   in_process_group of P threads (N = 4 Mi floats per rank), against a plain fp32 reduce-scatter
///   + all-gather written below over the same group (same all_to_all / all_gather pattern, fp32
///   payloads, the same rank-order sum). `vs_fp32` of the 8-bit benchmark is fp32 time over 8-bit
///   time, measured in-run the same way. On a machine with fewer cores than P the threads share
///   cores; the ratio then compares work, not a network.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include <agoq/agoq.hpp>
#include <agoq/comm/in_process.hpp>
#include <agoq/gradient/all_reduce.hpp>

namespace {

using agoq::comm::in_process_group;
namespace gr = agoq::gradient;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<float> normal(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

/// The fused dequantize-sum-requantize step of chunk 0 (4 Mi elements) from P blocks, on
/// state.range(1) threads.
void bm_reduce_step(benchmark::State& state) {
  int const p = static_cast<int>(state.range(0));
  agoq::host_executor const ex{.threads = static_cast<int>(state.range(1))};
  std::int64_t const chunk = std::int64_t{4} << 20;
  gr::chunk_plan const plan(chunk * p, 128, p);
  agoq::spec const s = gr::payload_spec(128, agoq::rounding_kind::nearest);
  std::int64_t const bb = plan.block_bytes();
  std::vector<std::byte> recv(static_cast<std::size_t>(p * bb)), out(static_cast<std::size_t>(bb));
  std::vector<std::byte> scratch_copy(static_cast<std::size_t>(p * bb));
  for (int r = 0; r < p; ++r) {
    std::vector<float> const x = normal(chunk, 100 + static_cast<unsigned>(r));
    std::byte* block = recv.data() + r * bb;
    agoq::quantize(agoq::host, agoq::as_row(x.data(), chunk),
                   gr::payload_view(s, plan, block, chunk));
    gr::write_payload_header(block, 0, 128, chunk);
  }
  std::vector<float> scratch;
  auto step = [&] {
    return gr::detail::requantize_chunk(plan, 0, s, 0, 0, out.data(), [&](auto&& emit) {
      return gr::detail::reduce_blocks(ex, plan, 0, recv.data(), s, 1.0f, scratch, emit);
    });
  };
  step();
  std::memcpy(scratch_copy.data(), recv.data(), recv.size());
  double kernel_s = 0.0, memcpy_s = 0.0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step());
    benchmark::ClobberMemory();
    kernel_s += seconds_since(t0);
    state.PauseTiming();
    auto const t1 = std::chrono::steady_clock::now();
    std::memcpy(scratch_copy.data(), recv.data(), recv.size());
    benchmark::ClobberMemory();
    memcpy_s += seconds_since(t1);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * p * bb);
  state.counters["vs_memcpy"] = kernel_s > 0 ? memcpy_s / kernel_s : 0.0;
  state.counters["memcpy_GB/s"] =
      memcpy_s > 0 ? static_cast<double>(state.iterations() * p * bb) / memcpy_s * 1e-9 : 0.0;
}

/// fp32 all-reduce over a host communicator: all_to_all of fp32 chunks, the rank-order sum,
/// all_gather of the reduced chunks (what a plain reduce-scatter + all-gather moves and computes).
template <class C>
void all_reduce_fp32(C& comm, std::span<float const> in, std::span<float> out) {
  int const p = comm.size();
  auto const n = static_cast<std::int64_t>(in.size());
  std::int64_t const per = (n + p - 1) / p;
  std::vector<float> send(static_cast<std::size_t>(per * p)), recv(send.size());
  std::memcpy(send.data(), in.data(), in.size_bytes());
  comm.all_to_all(reinterpret_cast<std::byte const*>(send.data()),
                  reinterpret_cast<std::byte*>(recv.data()), static_cast<std::size_t>(per * 4));
  float* acc = send.data();
  std::memcpy(acc, recv.data(), static_cast<std::size_t>(per * 4));
  for (int r = 1; r < p; ++r) {
    float const* x = recv.data() + r * per;
    for (std::int64_t i = 0; i < per; ++i) acc[i] = acc[i] + x[i];
  }
  comm.all_gather(reinterpret_cast<std::byte const*>(acc),
                  reinterpret_cast<std::byte*>(recv.data()), static_cast<std::size_t>(per * 4));
  std::memcpy(out.data(), recv.data(), out.size_bytes());
}

struct collective_inputs {
  std::vector<std::vector<float>> in, out;
  collective_inputs(int p, std::int64_t n) {
    for (int r = 0; r < p; ++r) {
      in.push_back(normal(n, 7 + static_cast<unsigned>(r)));
      out.emplace_back(static_cast<std::size_t>(n));
    }
  }
};

constexpr std::int64_t bucket = std::int64_t{4} << 20;

double time_8bit(collective_inputs& d, int p) {
  auto const t0 = std::chrono::steady_clock::now();
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    gr::all_reduce_8bit(agoq::host, c, std::span<float const>(d.in[r]), std::span<float>(d.out[r]));
  });
  return seconds_since(t0);
}

double time_fp32(collective_inputs& d, int p) {
  auto const t0 = std::chrono::steady_clock::now();
  in_process_group::run(p, [&](auto c) {
    auto const r = static_cast<std::size_t>(c.rank());
    all_reduce_fp32(c, std::span<float const>(d.in[r]), std::span<float>(d.out[r]));
  });
  return seconds_since(t0);
}

void bm_all_reduce_8bit(benchmark::State& state) {
  int const p = static_cast<int>(state.range(0));
  collective_inputs d(p, bucket);
  time_8bit(d, p);
  time_fp32(d, p);
  double t8 = 0, t32 = 0;
  for (auto _ : state) {
    t8 += time_8bit(d, p);
    state.PauseTiming();
    t32 += time_fp32(d, p);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * bucket * 4);
  state.counters["vs_fp32"] = t8 > 0 ? t32 / t8 : 0.0;
  state.counters["bytes_sent_per_rank"] =
      static_cast<double>(gr::all_reduce_bytes_sent(bucket, p, 128));
}

void bm_all_reduce_fp32(benchmark::State& state) {
  int const p = static_cast<int>(state.range(0));
  collective_inputs d(p, bucket);
  time_fp32(d, p);
  for (auto _ : state) benchmark::DoNotOptimize(time_fp32(d, p));
  state.SetBytesProcessed(state.iterations() * bucket * 4);
  state.counters["bytes_sent_per_rank"] =
      2.0 * (p - 1) * static_cast<double>((bucket + p - 1) / p) * 4;
}

// The collectives' group sizes, in wall-clock milliseconds (the ranks are threads).
void ranks(benchmark::internal::Benchmark* b) {
  b->ArgName("P")->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(bm_reduce_step)
    ->Name("reduce_step")
    ->ArgNames({"P", "threads"})
    ->Args({4, 1})
    ->Args({8, 1})
    ->Args({4, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(bm_all_reduce_8bit)->Name("all_reduce_8bit")->Apply(ranks);
BENCHMARK(bm_all_reduce_fp32)->Name("all_reduce_fp32")->Apply(ranks);

BENCHMARK_MAIN();
