// The byte-counting decorator: per-peer counts of all_to_all and all_gather, self-blocks left out,
// reset, and that it forwards the data unchanged.
#include <agoq/comm/counting.hpp>
#include <agoq/comm/in_process.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

using agoq::comm::counting;
using agoq::comm::in_process_group;

static_assert(agoq::comm::communicator<counting<in_process_group::member>>);

TEST_CASE("counting: per-peer bytes of all_to_all and all_gather, self-blocks not counted") {
  for (int p = 1; p <= 8; ++p) {
    CAPTURE(p);
    in_process_group::run(p, [&](in_process_group::member m) {
      counting<in_process_group::member> c(m);
      CHECK(c.rank() == m.rank());
      CHECK(c.size() == p);
      CHECK(c.memory() == agoq::comm::memory_space::host);
      std::size_t const a = 7, g = 3;
      // Room for the largest transfer below (p blocks of 11 bytes).
      std::vector<std::byte> send(static_cast<std::size_t>(p) * 11), recv(send.size());
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::byte>(i * 5 + 1);
      c.all_to_all(send.data(), recv.data(), a);
      c.all_to_all(send.data(), recv.data(), a);
      c.all_gather(send.data(), recv.data(), g);
      c.all_gather(send.data(), recv.data(), 0);
      std::uint64_t const per_peer = 2 * a + g;
      for (int q = 0; q < p; ++q) {
        CAPTURE(q);
        std::uint64_t const want = q == c.rank() ? 0 : per_peer;
        CHECK(c.sent_to(q) == want);
        CHECK(c.received_from(q) == want);
      }
      CHECK(c.sent() == static_cast<std::uint64_t>(p - 1) * per_peer);
      CHECK(c.received() == static_cast<std::uint64_t>(p - 1) * per_peer);
      // The data is forwarded unchanged: the last all_gather of 3 bytes.
      bool ok = true;
      for (int from = 0; from < p; ++from) {
        for (std::size_t i = 0; i < g; ++i) {
          ok = ok &&
               recv[static_cast<std::size_t>(from) * g + i] == static_cast<std::byte>(i * 5 + 1);
        }
      }
      CHECK(ok);
      c.reset();
      CHECK(c.sent() == 0);
      CHECK(c.received() == 0);
      c.all_gather(send.data(), recv.data(), 11);
      CHECK(c.sent() == static_cast<std::uint64_t>(p - 1) * 11);
    });
  }
}

TEST_CASE("counting: a failed transfer is not counted") {
  in_process_group g(2);
  g.abort();
  auto m = g.at(1);
  counting<in_process_group::member> c(m);
  std::byte b[2]{};
  CHECK_THROWS_AS(c.all_to_all(b, b + 1, 1), agoq::comm::comm_error);
  CHECK(c.sent() == 0);
  CHECK(c.received() == 0);
}
