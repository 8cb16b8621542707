#include <agoq/gradient/reduce_map.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include <agoq/gradient/payload.hpp>

using namespace agoq::gradient;
using namespace agoq::gradient::detail;

TEST_CASE("reduce_run_of: every chunk element is covered once, under its own group") {
  for (std::int64_t g : {32, 33, 64, 100, 128, 255, 256}) {
    for (std::int64_t count : {0, 1, 7, 8, 9, 31, 32, 33, 127, 128, 129, 1000, 7919}) {
      INFO("G = " << g << ", count = " << count);
      std::vector<int> seen(static_cast<std::size_t>(count), 0);
      std::int64_t const threads = reduce_thread_count(count);
      bool ok = true;
      for (std::int64_t t = 0; t < threads + 3; ++t) {
        reduce_run const r = reduce_run_of(t, count, g);
        if (t >= threads) {
          ok &= r.count == 0;
          continue;
        }
        ok &= r.count > 0 && r.count <= reduce_run_elements && r.begin == t * reduce_run_elements;
        ok &= r.split >= 1 && r.split <= r.count;
        for (int i = 0; i < r.count; ++i) {
          std::int64_t const e = r.begin + i;
          ++seen[static_cast<std::size_t>(e)];
          ok &= (i < r.split ? r.group : r.group + 1) == e / g;
        }
      }
      CHECK(ok);
      for (int s : seen) CHECK(s == 1);
    }
  }
  CHECK(reduce_run_of(-1, 100, 32).count == 0);
}

TEST_CASE("reduce_run_of: 64-bit chunks") {
  std::int64_t const count = (std::int64_t{1} << 33) + 5;
  std::int64_t const t = reduce_thread_count(count) - 1;
  reduce_run const r = reduce_run_of(t, count, 128);
  CHECK(r.begin == (std::int64_t{1} << 33));
  CHECK(r.count == 5);
  CHECK(r.group == (std::int64_t{1} << 33) / 128);
  CHECK(r.split == 5);
}

TEST_CASE("encode_payload_header: the bytes write_payload_header writes") {
  for (std::uint8_t flags : {std::uint8_t{0}, payload_flag_nonfinite}) {
    for (std::int64_t g : {32, 128, 256}) {
      for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000003},
                             (std::int64_t{1} << 40) + 17}) {
        std::byte want[payload_header_bytes];
        std::uint8_t got[payload_header_bytes] = {};
        write_payload_header(want, flags, g, n);
        encode_payload_header(got, flags, g, n);
        CHECK(std::memcmp(want, got, payload_header_bytes) == 0);
        CHECK(payload_header_matches(got, g, n));
        CHECK_FALSE(payload_header_matches(got, g, n + 1));
        CHECK_FALSE(payload_header_matches(got, g == 32 ? 33 : 32, n));
        payload_header const h = read_payload_header(want);
        CHECK(h.flags == flags);
        std::uint8_t bad[payload_header_bytes];
        std::memcpy(bad, got, payload_header_bytes);
        bad[4] = static_cast<std::uint8_t>(payload_version + 1);
        CHECK_FALSE(payload_header_matches(bad, g, n));
        std::memcpy(bad, got, payload_header_bytes);
        bad[0] = 0;
        CHECK_FALSE(payload_header_matches(bad, g, n));
      }
    }
  }
}
