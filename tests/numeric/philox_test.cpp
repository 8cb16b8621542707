#include <agoq/numeric/philox.hpp>

#include <cstdint>
#include <set>

#include <doctest/doctest.h>

using namespace agoq::numeric;

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  CHECK(philox4x32_10({0u, 0u, 0u, 0u}, 0u, 0u) ==
        philox_block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu,
                      0xffffffffu) ==
        philox_block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u,
                      0x299f31d0u) ==
        philox_block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("stream positions map to blocks and words") {
  std::uint64_t const seed = 0x0123456789abcdefull;
  for (std::uint64_t p = 0; p < 64; ++p) {
    philox_block const b =
        philox4x32_10({static_cast<std::uint32_t>(p / 4), 0u, 0u, 0u}, 0x89abcdefu, 0x01234567u);
    REQUIRE(uniform_at(seed, p) == uniform24(b[p % 4]));
  }
  // Positions beyond 2^32 blocks use the counter's second word.
  std::uint64_t const far = (std::uint64_t{1} << 34) + 5;
  philox_block const b = philox4x32_10({1u, 1u, 0u, 0u}, 0x89abcdefu, 0x01234567u);
  CHECK(uniform_at(seed, far) == uniform24(b[1]));
}

TEST_CASE("uniform24 spans [0, 1) with 24 bits") {
  CHECK(uniform24(0u) == 0.0f);
  CHECK(uniform24(0xffffffffu) == 1.0f - 5.9604644775390625e-8f);
  CHECK(uniform24(0x00000100u) == 5.9604644775390625e-8f);
  CHECK(uniform24(0x000000ffu) == 0.0f);  // the low 8 bits are dropped
}

TEST_CASE("different seeds and positions give different draws") {
  std::set<float> seen;
  for (std::uint64_t p = 0; p < 1000; ++p) seen.insert(uniform_at(7, p));
  CHECK(seen.size() > 990);
  int same = 0;
  for (std::uint64_t p = 0; p < 1000; ++p) same += uniform_at(7, p) == uniform_at(8, p);
  CHECK(same < 5);
}
