// The in-process group: block semantics of all_to_all / all_gather for P = 1..8, zero-byte
// transfers, failure propagation (no hang), and argument checks.
#include <agoq/comm/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

using agoq::comm::comm_error;
using agoq::comm::in_process_group;

namespace {

// The byte rank `from` sends to rank `to` at position i of the block (distinct per triple).
std::byte pattern(int from, int to, std::size_t i) {
  return static_cast<std::byte>((from * 31 + to * 7 + static_cast<int>(i) * 3 + 1) & 0xff);
}

}  // namespace

TEST_CASE("in_process_group: all_to_all delivers block j of rank i to block i of rank j") {
  for (int p = 1; p <= 8; ++p) {
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{1001}}) {
      CAPTURE(p);
      CAPTURE(n);
      std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(p));
      in_process_group::run(p, [&](in_process_group::member c) {
        CHECK(c.size() == p);
        CHECK(c.memory() == agoq::comm::memory_space::host);
        int const me = c.rank();
        std::vector<std::byte> send(static_cast<std::size_t>(p) * n);
        for (int to = 0; to < p; ++to) {
          for (std::size_t i = 0; i < n; ++i)
            send[static_cast<std::size_t>(to) * n + i] = pattern(me, to, i);
        }
        std::vector<std::byte> recv(send.size(), std::byte{0xee});
        c.all_to_all(send.data(), recv.data(), n);
        got[static_cast<std::size_t>(me)] = recv;
      });
      for (int to = 0; to < p; ++to) {
        auto const& recv = got[static_cast<std::size_t>(to)];
        REQUIRE(recv.size() == static_cast<std::size_t>(p) * n);
        bool ok = true;
        for (int from = 0; from < p; ++from) {
          for (std::size_t i = 0; i < n; ++i) {
            ok = ok && recv[static_cast<std::size_t>(from) * n + i] == pattern(from, to, i);
          }
        }
        CHECK(ok);
      }
    }
  }
}

TEST_CASE("in_process_group: all_gather puts rank i's bytes in block i of every rank") {
  for (int p = 1; p <= 8; ++p) {
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{256}, std::size_t{777}}) {
      CAPTURE(p);
      CAPTURE(n);
      std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(p));
      in_process_group::run(p, [&](in_process_group::member c) {
        int const me = c.rank();
        std::vector<std::byte> send(n);
        for (std::size_t i = 0; i < n; ++i) send[i] = pattern(me, 0, i);
        std::vector<std::byte> recv(static_cast<std::size_t>(p) * n, std::byte{0xee});
        c.all_gather(send.data(), recv.data(), n);
        got[static_cast<std::size_t>(me)] = recv;
      });
      for (int r = 0; r < p; ++r) {
        auto const& recv = got[static_cast<std::size_t>(r)];
        bool ok = recv.size() == static_cast<std::size_t>(p) * n;
        for (int from = 0; ok && from < p; ++from) {
          for (std::size_t i = 0; i < n; ++i) {
            ok = ok && recv[static_cast<std::size_t>(from) * n + i] == pattern(from, 0, i);
          }
        }
        CHECK(ok);
      }
    }
  }
}

TEST_CASE("in_process_group: zero-byte transfers touch nothing and still synchronise") {
  for (int p = 1; p <= 8; ++p) {
    CAPTURE(p);
    std::atomic<int> before{0};
    std::atomic<bool> early{false};
    in_process_group::run(p, [&](in_process_group::member c) {
      ++before;
      c.all_to_all(nullptr, nullptr, 0);
      // Every rank arrived before any left: the zero-byte call is still a collective.
      if (before.load() != p) early = true;
      c.all_gather(nullptr, nullptr, 0);
    });
    CHECK_FALSE(early.load());
  }
}

TEST_CASE("in_process_group: repeated collectives reuse buffers safely") {
  int const p = 5;
  std::size_t const n = 16;
  in_process_group::run(p, [&](in_process_group::member c) {
    std::vector<std::byte> send(static_cast<std::size_t>(p) * n), recv(send.size());
    bool ok = true;
    for (int round = 0; round < 50; ++round) {
      // The send buffer is overwritten right after each call: the call must have finished with it.
      for (std::size_t i = 0; i < send.size(); ++i) {
        send[i] = static_cast<std::byte>((round + c.rank() * 13 + static_cast<int>(i)) & 0xff);
      }
      c.all_to_all(send.data(), recv.data(), n);
      for (int from = 0; from < p; ++from) {
        for (std::size_t i = 0; i < n; ++i) {
          std::size_t const sent_index = static_cast<std::size_t>(c.rank()) * n + i;
          auto const want =
              static_cast<std::byte>((round + from * 13 + static_cast<int>(sent_index)) & 0xff);
          ok = ok && recv[static_cast<std::size_t>(from) * n + i] == want;
        }
      }
    }
    CHECK(ok);
  });
}

TEST_CASE("in_process_group: an exception on one rank fails the others' collectives") {
  for (int p = 2; p <= 8; ++p) {
    CAPTURE(p);
    std::atomic<int> comm_errors{0};
    auto body = [&](in_process_group::member c) {
      std::vector<std::byte> send(static_cast<std::size_t>(p) * 4), recv(send.size());
      c.all_to_all(send.data(), recv.data(), 4);
      if (c.rank() == p - 1) throw std::runtime_error("rank failed");
      try {
        // The failed rank never arrives: without the abort these would wait forever.
        c.all_gather(send.data(), recv.data(), 4);
        c.all_to_all(send.data(), recv.data(), 4);
      } catch (comm_error const&) {
        ++comm_errors;
        throw;
      }
    };
    // run rethrows the original failure, not the comm_errors it caused.
    CHECK_THROWS_WITH_AS(in_process_group::run(p, body), "rank failed", std::runtime_error);
    CHECK(comm_errors.load() == p - 1);
  }
}

TEST_CASE("in_process_group: an aborted group fails every collective with comm_error") {
  in_process_group g(3);
  g.abort();
  auto m = g.at(0);
  std::byte b{};
  CHECK_THROWS_AS(m.all_gather(&b, &b, 0), comm_error);
}

TEST_CASE("in_process_group: ranks and sizes are checked") {
  CHECK_THROWS_AS(in_process_group(0), agoq::invalid_argument);
  CHECK_THROWS_AS(in_process_group(-2), agoq::invalid_argument);
  in_process_group g(3);
  CHECK(g.size() == 3);
  CHECK_THROWS_AS(g.at(-1), agoq::invalid_argument);
  CHECK_THROWS_AS(g.at(3), agoq::invalid_argument);
  CHECK(g.at(2).rank() == 2);
  CHECK(g.at(2).size() == 3);
}
