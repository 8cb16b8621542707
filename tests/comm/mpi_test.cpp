// mpi_communicator over real MPI processes (run by ctest under mpiexec with 2, 3 and 4 ranks):
// block semantics of all_to_all / all_gather for many sizes, the split of large blocks (with an
// artificially small message limit), sub-communicators, argument and error checks, and agoq's
// 8-bit all-reduce over MPI. Exits non-zero when any check failed on any rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <agoq/comm/mpi.hpp>
#include <agoq/gradient/all_reduce.hpp>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <mpi.h>

using agoq::comm::comm_error;
using agoq::comm::memory_space;
using agoq::comm::mpi_communicator;
using agoq::comm::mpi_options;

namespace {

// The byte rank `from` sends to rank `to` at position i of the block (distinct per triple, and
// not periodic in i with any small period, so a misplaced piece is caught).
std::byte pattern(int from, int to, std::size_t i) {
  std::uint64_t h =
      (static_cast<std::uint64_t>(from) << 40) ^ (static_cast<std::uint64_t>(to) << 20) ^ i;
  h *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::byte>(h >> 56);
}

// Checks all_to_all of n bytes per peer on c against the pattern; true when every byte is right.
bool check_all_to_all(mpi_communicator& c, std::size_t n) {
  int const p = c.size();
  std::vector<std::byte> send(static_cast<std::size_t>(p) * n);
  for (int to = 0; to < p; ++to) {
    for (std::size_t i = 0; i < n; ++i)
      send[static_cast<std::size_t>(to) * n + i] = pattern(c.rank(), to, i);
  }
  // One guard byte past the end catches a write beyond the last block.
  std::vector<std::byte> recv(send.size() + 1, std::byte{0xee});
  c.all_to_all(send.data(), recv.data(), n);
  bool ok = recv.back() == std::byte{0xee};
  for (int from = 0; from < p; ++from) {
    for (std::size_t i = 0; i < n; ++i) {
      ok = ok && recv[static_cast<std::size_t>(from) * n + i] == pattern(from, c.rank(), i);
    }
  }
  return ok;
}

// Checks all_gather of n bytes on c against the pattern; true when every byte is right.
bool check_all_gather(mpi_communicator& c, std::size_t n) {
  int const p = c.size();
  std::vector<std::byte> send(n);
  for (std::size_t i = 0; i < n; ++i) send[i] = pattern(c.rank(), -1, i);
  std::vector<std::byte> recv(static_cast<std::size_t>(p) * n + 1, std::byte{0xee});
  c.all_gather(send.data(), recv.data(), n);
  bool ok = recv.back() == std::byte{0xee};
  for (int from = 0; from < p; ++from) {
    for (std::size_t i = 0; i < n; ++i) {
      ok = ok && recv[static_cast<std::size_t>(from) * n + i] == pattern(from, -1, i);
    }
  }
  return ok;
}

std::vector<std::size_t> const sizes = {0, 1, 2, 3, 7, 8, 64, 127, 1000, 4099, 65537};

}  // namespace

TEST_CASE("mpi_communicator: rank, size, memory space") {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mpi_communicator c(MPI_COMM_WORLD);
  CHECK(c.rank() == rank);
  CHECK(c.size() == size);
  CHECK(c.memory() == memory_space::host);
  CHECK(c.native_handle() == MPI_COMM_WORLD);
  // The flag only says where buffers live (no transfer is made here: this MPI may not be
  // CUDA-aware).
  CHECK(mpi_communicator(MPI_COMM_WORLD, {.cuda_aware = true}).memory() == memory_space::device);
}

TEST_CASE("mpi_communicator: all_to_all moves block j of rank i to block i of rank j") {
  mpi_communicator c(MPI_COMM_WORLD);
  for (std::size_t n : sizes) {
    CAPTURE(n);
    CHECK(check_all_to_all(c, n));
  }
}

TEST_CASE("mpi_communicator: all_gather puts rank i's bytes in block i") {
  mpi_communicator c(MPI_COMM_WORLD);
  for (std::size_t n : sizes) {
    CAPTURE(n);
    CHECK(check_all_gather(c, n));
  }
}

TEST_CASE("mpi_communicator: blocks above max_message_bytes are split into pieces") {
  // Limits far below the block sizes make every transfer take the split path: several full
  // pieces, with and without a shorter last piece, and one-byte pieces.
  for (std::size_t limit : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
    mpi_communicator c(MPI_COMM_WORLD, {.max_message_bytes = limit});
    for (std::size_t n : {std::size_t{1}, std::size_t{6}, std::size_t{7}, std::size_t{8},
                          std::size_t{14}, std::size_t{15}, std::size_t{100}, std::size_t{1000}}) {
      CAPTURE(limit);
      CAPTURE(n);
      CHECK(check_all_to_all(c, n));
      CHECK(check_all_gather(c, n));
    }
  }
  // The largest limit allowed is accepted (it is MPI's int count).
  mpi_communicator big(MPI_COMM_WORLD, {.max_message_bytes = static_cast<std::size_t>(INT_MAX)});
  CHECK(check_all_to_all(big, 33));
}

TEST_CASE("mpi_communicator: sub-communicators (not owned) keep their own ranks") {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm half = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half) == MPI_SUCCESS);
  {
    mpi_communicator c(half);
    CHECK(c.rank() == world_rank / 2);
    CHECK(check_all_to_all(c, 13));
    int const me = world_rank;
    std::vector<int> ranks(static_cast<std::size_t>(c.size()), -1);
    c.all_gather(reinterpret_cast<std::byte const*>(&me),
                 reinterpret_cast<std::byte*>(ranks.data()), sizeof(int));
    for (int i = 0; i < c.size(); ++i)
      CHECK(ranks[static_cast<std::size_t>(i)] == 2 * i + world_rank % 2);
  }
  // The wrapper did not free the communicator: it is still ours to free.
  CHECK(MPI_Comm_free(&half) == MPI_SUCCESS);
}

TEST_CASE("mpi_communicator: bad arguments and MPI errors throw") {
  CHECK_THROWS_AS(mpi_communicator(MPI_COMM_NULL), agoq::invalid_argument);
  CHECK_THROWS_AS(mpi_communicator(MPI_COMM_WORLD, {.max_message_bytes = 0}),
                  agoq::invalid_argument);
  CHECK_THROWS_AS(mpi_communicator(MPI_COMM_WORLD,
                                   {.max_message_bytes = static_cast<std::size_t>(INT_MAX) + 1}),
                  agoq::invalid_argument);
  agoq::comm::detail::mpi_check(MPI_SUCCESS, "MPI_Alltoall");
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(MPI_ERR_TRUNCATE, text, &length);
  std::string const want =
      "agoq: MPI_Alltoall failed: " + std::string(text, static_cast<std::size_t>(length));
  CHECK_THROWS_WITH_AS(agoq::comm::detail::mpi_check(MPI_ERR_TRUNCATE, "MPI_Alltoall"),
                       want.c_str(), comm_error);
  // A real MPI failure under MPI_ERRORS_RETURN (set by main): an invalid datatype handle.
  int const code = MPI_Type_commit(nullptr);
  CHECK(code != MPI_SUCCESS);
  CHECK_THROWS_AS(agoq::comm::detail::mpi_check(code, "MPI_Type_commit"), comm_error);
}

namespace {

// FNV-1a of the bytes of v.
std::uint64_t hash_bytes(std::vector<float> const& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  unsigned char const* p = reinterpret_cast<unsigned char const*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// True when every rank of c holds the same 64-bit value.
bool same_on_every_rank(mpi_communicator& c, std::uint64_t mine) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  c.all_gather(reinterpret_cast<std::byte const*>(&mine), reinterpret_cast<std::byte*>(all.data()),
               sizeof(mine));
  for (std::uint64_t v : all) {
    if (v != all[0]) return false;
  }
  return true;
}

// Rank r's gradient: normal values whose magnitude changes from group to group (2^-6 .. 2^6), so
// group scales differ, with exact zeros sprinkled in.
std::vector<float> gradient_of(int rank, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed * 1000003 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    float const magnitude = std::ldexp(1.0f, static_cast<int>((i / 32) % 13) - 6);
    x[i] = gen() % 17 == 0 ? 0.0f : normal(gen) * magnitude;
  }
  return x;
}

struct all_reduce_case {
  std::size_t n;
  int group_size;
  bool average;
  agoq::rounding_kind rounding;
};

// Runs all_reduce_8bit on c and checks: identical bits on every rank, no non-finite flag, and
// |out - ref| within the error bound of two quantizations, where ref is the fp64 sum (or mean).
//
// The bound, per group g of G elements (groups are the same in both quantizations): with
// a_r = max |x_r| over the group on rank r and step = (sum_r a_r) / 127,
// - the first quantization (each rank, scale a_r / 127) errs by at most half its step with
//   nearest rounding (less than one step with stochastic rounding): in total step / 2 (step);
// - the requantization of the fp32 sum, whose magnitude is at most step (1 + 1/254) * 127, errs by
//   at most step (1 + 1/254) / 2 (step (1 + 1/127) stochastic);
// - fp32 rounding of the P additions and of the dequantization adds (P + 2) eps sum_r a_r.
// Averaging divides everything by P.
void check_all_reduce(mpi_communicator& c, all_reduce_case const& k, std::uint64_t seed) {
  int const p = c.size();
  std::size_t const n = k.n;
  CAPTURE(n);
  CAPTURE(k.group_size);
  CAPTURE(k.average);
  CAPTURE(static_cast<int>(k.rounding));
  std::vector<float> const in = gradient_of(c.rank(), n, seed);
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  agoq::gradient::all_reduce_options opt;
  opt.group_size = k.group_size;
  opt.average = k.average;
  opt.rounding = k.rounding;
  opt.seed = seed;
  opt.step = 3;
  auto const r = agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(in),
                                                 std::span<float>(out), opt);
  CHECK_FALSE(r.nonfinite);
  CHECK(r.local_nonfinite == 0);
  CHECK(same_on_every_rank(c, hash_bytes(out)));

  // Everyone's input, to compute the reference on every rank.
  std::vector<float> all(static_cast<std::size_t>(p) * n);
  c.all_gather(reinterpret_cast<std::byte const*>(in.data()),
               reinterpret_cast<std::byte*>(all.data()), n * sizeof(float));
  bool const stochastic = k.rounding == agoq::rounding_kind::stochastic;
  double const divisor = k.average ? p : 1.0;
  std::size_t const g = static_cast<std::size_t>(k.group_size);
  std::size_t bad = 0;
  double worst = 0.0;  // the largest error as a fraction of its bound
  for (std::size_t begin = 0; begin < n; begin += g) {
    std::size_t const end = std::min(n, begin + g);
    double absmax_sum = 0.0;
    for (int q = 0; q < p; ++q) {
      double a = 0.0;
      for (std::size_t i = begin; i < end; ++i) {
        a = std::max(a, std::fabs(static_cast<double>(all[static_cast<std::size_t>(q) * n + i])));
      }
      absmax_sum += a;
    }
    double const step = absmax_sum / 127.0;
    double const quantization =
        stochastic ? step + step * (1.0 + 1.0 / 127) : step / 2 + step * (1.0 + 1.0 / 254) / 2;
    double const bound = (quantization + (p + 2) * double{FLT_EPSILON} * absmax_sum) / divisor;
    for (std::size_t i = begin; i < end; ++i) {
      double ref = 0.0;
      for (int q = 0; q < p; ++q) ref += all[static_cast<std::size_t>(q) * n + i];
      ref /= divisor;
      double const err = std::fabs(static_cast<double>(out[i]) - ref);
      if (!(err <= bound)) ++bad;
      if (bound > 0) worst = std::max(worst, err / bound);
    }
  }
  CAPTURE(worst);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("all_reduce_8bit over MPI: every rank gets the same bits, within two quantizations") {
  std::vector<all_reduce_case> cases;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{127}, std::size_t{128},
                        std::size_t{1000}, std::size_t{12305}, std::size_t{100003}}) {
    cases.push_back({n, 128, false, agoq::rounding_kind::nearest});
  }
  cases.push_back({4099, 32, false, agoq::rounding_kind::nearest});
  cases.push_back({4099, 256, true, agoq::rounding_kind::nearest});
  cases.push_back({20000, 64, false, agoq::rounding_kind::stochastic});
  cases.push_back({20000, 128, true, agoq::rounding_kind::stochastic});
  mpi_communicator c(MPI_COMM_WORLD);
  std::uint64_t seed = 1;
  for (auto const& k : cases) check_all_reduce(c, k, seed++);
  // The same collective through blocks split into 1000-byte pieces.
  mpi_communicator split(MPI_COMM_WORLD, {.max_message_bytes = 1000});
  check_all_reduce(split, {30011, 128, false, agoq::rounding_kind::nearest}, 77);
}

TEST_CASE("all_reduce_8bit over MPI: a non-finite input on one rank is flagged on every rank") {
  mpi_communicator c(MPI_COMM_WORLD);
  std::vector<float> in = gradient_of(c.rank(), 1000, 5);
  int const culprit = c.size() - 1;
  if (c.rank() == culprit) in[517] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(in.size());
  auto const r = agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(in),
                                                 std::span<float>(out));
  CHECK(r.nonfinite);
  CHECK(r.local_nonfinite == (c.rank() == culprit ? 1 : 0));
  CHECK(same_on_every_rank(c, hash_bytes(out)));
}

TEST_CASE("all_reduce_8bit over MPI: mismatched arguments throw invalid_argument on every rank") {
  mpi_communicator c(MPI_COMM_WORLD);
  // Every rank passes a different length: each must throw, none may hang.
  std::size_t const n = 100 + static_cast<std::size_t>(c.rank());
  std::vector<float> in(n, 1.0f), out(n);
  CHECK_THROWS_AS(agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(in),
                                                  std::span<float>(out)),
                  agoq::invalid_argument);
  // Only rank 0 passes another length.
  std::size_t const m = c.rank() == 0 ? 64 : 65;
  std::vector<float> in2(m, 1.0f), out2(m);
  CHECK_THROWS_AS(agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(in2),
                                                  std::span<float>(out2)),
                  agoq::invalid_argument);
  // Different group sizes.
  agoq::gradient::all_reduce_options opt;
  opt.group_size = c.rank() == 0 ? 64 : 128;
  std::vector<float> in3(256, 1.0f), out3(256);
  CHECK_THROWS_AS(agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(in3),
                                                  std::span<float>(out3), opt),
                  agoq::invalid_argument);
  // The ranks are still in step: a correct call works afterwards.
  std::vector<float> ones(300, 1.0f), sum(300);
  agoq::gradient::all_reduce_8bit(agoq::host, c, std::span<float const>(ones),
                                  std::span<float>(sum));
  bool exact = true;
  for (float v : sum) exact = exact && v == static_cast<float>(c.size());
  CHECK(exact);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Errors return to agoq, which throws, instead of aborting the job (MPI's default).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  // Only rank 0 prints the summary; every rank prints its failures.
  if (rank != 0) ctx.setOption("minimal", true);
  int const failed = ctx.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  bool const exit_only = ctx.shouldExit();
  MPI_Finalize();
  if (exit_only) return failed;
  return any_failed != 0 ? 1 : 0;
}
