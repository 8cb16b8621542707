// The CUDA kernels' thread-to-element maps, checked on the host: every element exactly once.
#include <agoq/device/partition.hpp>

#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include <agoq/layout/layout.hpp>

using namespace agoq;
using namespace agoq::device;

namespace {
std::vector<std::pair<std::int64_t, std::int64_t>> const shapes = {
    {1, 1}, {1, 7}, {1, 8}, {1, 9}, {3, 5}, {7, 300}, {2, 4097}, {5, 128}, {4, 127}, {1, 1000}};
}

TEST_CASE("unit_run covers every element exactly once, never across rows") {
  for (auto [rows, cols] : shapes) {
    std::vector<int> hits(static_cast<std::size_t>(rows * cols), 0);
    std::int64_t const units = unit_count(rows, cols);
    for (std::int64_t u = 0; u < units + 70; ++u) {  // threads past the end cover nothing
      element_run const r = unit_run(u, rows, cols);
      if (u >= units) {
        REQUIRE(r.count == 0);
        continue;
      }
      REQUIRE(r.count >= 1);
      REQUIRE(r.count <= elements_per_thread);
      REQUIRE(r.col % elements_per_thread == 0);
      REQUIRE(r.col + r.count <= cols);
      for (int i = 0; i < r.count; ++i) ++hits[static_cast<std::size_t>(r.row * cols + r.col + i)];
    }
    for (int h : hits) REQUIRE(h == 1);
  }
  CHECK(unit_count(0, 5) == 0);
  CHECK(unit_run(0, 0, 5).count == 0);
  CHECK(unit_run(0, 3, 0).count == 0);
}

TEST_CASE("group_lane_run covers every element once and names its layout group") {
  for (std::int64_t g : {32, 64, 128, 256}) {
    spec s = spec::parse("int8_g32_sym_rne_f32");
    s.group_cols = g;
    for (auto [rows, cols] : shapes) {
      quantized_layout const l = make_layout(s, rows, cols);
      std::int64_t const lanes = g / elements_per_thread;
      int const lanes_log2 = group_lanes_log2(g);
      REQUIRE((std::int64_t{1} << lanes_log2) == lanes);
      std::int64_t const threads = l.groups() * lanes;
      REQUIRE(lane_groups_per_row(cols, lanes_log2) == l.group_grid_cols);
      REQUIRE(group_lane_threads(rows, cols, lanes_log2) == threads);
      std::vector<int> hits(static_cast<std::size_t>(rows * cols), 0);
      for (std::int64_t t = 0; t < threads + 64; ++t) {
        std::int64_t group = -1;
        element_run const r = group_lane_run(t, lanes_log2, rows, cols, group);
        REQUIRE(group == t / lanes);
        if (t >= threads) {
          REQUIRE(r.count == 0);
          continue;
        }
        for (int i = 0; i < r.count; ++i) {
          REQUIRE(l.group_of(r.row, r.col + i) == group);
          ++hits[static_cast<std::size_t>(r.row * cols + r.col + i)];
        }
      }
      for (int h : hits) REQUIRE(h == 1);
    }
  }
}

TEST_CASE("group_lanes_log2: the power of two of lanes holding a group of 8-element runs") {
  static_assert(group_lanes_log2(32) == 2 && group_lanes_log2(64) == 3 &&
                group_lanes_log2(128) == 4 && group_lanes_log2(256) == 5);
  CHECK(group_lanes_log2(33) == 3);   // 5 runs
  CHECK(group_lanes_log2(100) == 4);  // 13 runs
  CHECK(group_lanes_log2(129) == 5);  // 17 runs
  for (std::int64_t g = 32; g <= 256; ++g) {
    std::int64_t const lanes = std::int64_t{1} << group_lanes_log2(g);
    REQUIRE(lanes * elements_per_thread >= g);
    REQUIRE((lanes / 2) * elements_per_thread < g);
  }
}

TEST_CASE("padded_group_lane_run covers every element once, inside its own group") {
  for (std::int64_t g : {32, 33, 40, 64, 100, 127, 128, 129, 200, 255, 256}) {
    int const lanes_log2 = group_lanes_log2(g);
    std::int64_t const lanes = std::int64_t{1} << lanes_log2;
    spec s = spec::parse("int8_g32_sym_rne_f32");
    s.group_cols = g;
    for (auto [rows, cols] : shapes) {
      quantized_layout const l = make_layout(s, rows, cols);
      std::int64_t const threads = l.groups() * lanes;
      std::vector<int> hits(static_cast<std::size_t>(rows * cols), 0);
      for (std::int64_t t = 0; t < threads + 64; ++t) {
        std::int64_t group = -1;
        element_run const r =
            padded_group_lane_run(t, g, (cols + g - 1) / g, lanes_log2, rows, cols, group);
        REQUIRE(group == t / lanes);
        REQUIRE(r.count >= 0);
        REQUIRE(r.count <= elements_per_thread);
        if (t >= threads) {
          REQUIRE(r.count == 0);
          continue;
        }
        // Lane 0 of every group has elements (it stores the group's scale).
        if (t % lanes == 0) REQUIRE(r.count > 0);
        for (int i = 0; i < r.count; ++i) {
          REQUIRE(l.group_of(r.row, r.col + i) == group);
          ++hits[static_cast<std::size_t>(r.row * cols + r.col + i)];
        }
      }
      for (int h : hits) REQUIRE(h == 1);
    }
  }
}

TEST_CASE("launch policies fill an SM") {
  static_assert(policy_for(80).block_threads % 32 == 0);
  static_assert(policy_for(90).block_threads * policy_for(90).blocks_per_sm == 2048);
  static_assert(policy_for(80).block_threads * policy_for(80).blocks_per_sm == 2048);
  CHECK(policy_for(90).block_threads == 256);
}

TEST_CASE("64-bit runs beyond 2^31 elements") {
  std::int64_t const rows = 3, cols = (std::int64_t{1} << 31) + 5;
  std::int64_t const units = unit_count(rows, cols);
  element_run const last = unit_run(units - 1, rows, cols);
  CHECK(last.row == 2);
  CHECK(last.col + last.count == cols);
  CHECK(last.count == 5);
  std::int64_t group = 0;
  element_run const r = group_lane_run(units - 1, 4, rows, cols, group);
  CHECK(r.row == 2);
  // The buffer pass over a flat bucket past 2^31 elements, G = 100 (16 lanes).
  std::int64_t const n = (std::int64_t{1} << 31) + 37;
  std::int64_t const groups = (n + 99) / 100;
  std::int64_t const last_group_first = (groups - 1) * 16;
  element_run const a = padded_group_lane_run(last_group_first, 100, groups, 4, 1, n, group);
  CHECK(group == groups - 1);
  CHECK(a.col == (groups - 1) * 100);
  // That group holds n - (groups - 1) 100 = 85 elements: lanes 0..10, the last one 5.
  element_run const b = padded_group_lane_run(last_group_first + 10, 100, groups, 4, 1, n, group);
  CHECK(b.count == 5);
  CHECK(b.col + b.count == n);
  CHECK(padded_group_lane_run(last_group_first + 11, 100, groups, 4, 1, n, group).count == 0);
  CHECK(padded_group_lane_run(groups * 16, 100, groups, 4, 1, n, group).count == 0);
}

TEST_CASE("divmod takes the 32-bit path when it can and agrees with 64-bit division") {
  for (std::int64_t a : {std::int64_t{0}, std::int64_t{7}, std::int64_t{4294967295},
                         std::int64_t{4294967296}, (std::int64_t{1} << 40) + 3}) {
    for (std::int64_t b :
         {std::int64_t{1}, std::int64_t{3}, std::int64_t{128}, std::int64_t{4294967297}}) {
      std::int64_t q = -1, r = -1;
      divmod(a, b, q, r);
      REQUIRE(q == a / b);
      REQUIRE(r == a % b);
    }
  }
}

TEST_CASE("group_cursor walks a run's groups like quantized_layout::group_of") {
  for (char const* name : {"int8_g128_sym_rne_f32", "int4_col_sym_rne_f32", "int2_g3_sym_rne_f32",
                           "int8_b3x5_asym_rne_f32", "int8_row_sym_rne_f32",
                           "int8_tensor_sym_rne_f32", "int4_g7_sym_rne_f32"}) {
    for (auto [rows, cols] : shapes) {
      quantized_layout const l = make_layout(spec::parse(name), rows, cols);
      for (std::int64_t u = 0; u < unit_count(rows, cols); ++u) {
        element_run const r = unit_run(u, rows, cols);
        group_cursor cursor(r.row, r.col, l.tile, l.group_grid_cols);
        for (int i = 0; i < r.count; ++i) {
          cursor.advance(r.col + i);
          REQUIRE(cursor.group == l.group_of(r.row, r.col + i));
        }
      }
    }
  }
}

namespace {

// Every run of `groups` whole groups exactly once, each inside its slot's group, and each load k
// of a group's slots one contiguous piece of runs.
void check_linear_slots(std::int64_t groups, int runs_log2, int slot_log2) {
  std::int64_t const runs = std::int64_t{1} << runs_log2, lanes = runs >> slot_log2;
  std::vector<int> hits(static_cast<std::size_t>(groups * runs), 0);
  for (std::int64_t t = 0; t < groups * lanes; ++t) {
    linear_slot const s = linear_group_slot(t, runs_log2, slot_log2);
    REQUIRE(s.lanes == lanes);
    REQUIRE(s.group == t / lanes);
    REQUIRE(s.place == t % lanes);
    for (int k = 0; k < (1 << slot_log2); ++k) {
      std::int64_t const u = s.first + k * lanes;
      REQUIRE(u / runs == s.group);
      REQUIRE(u % runs == k * lanes + s.place);
      ++hits[static_cast<std::size_t>(u)];
    }
  }
  for (int h : hits) REQUIRE(h == 1);
}

}  // namespace

TEST_CASE("linear_group_slot covers every run of whole groups once, inside its group") {
  for (std::int64_t groups : {1, 2, 3, 7, 64, 1001}) {
    for (int runs_log2 = 2; runs_log2 <= 7; ++runs_log2) {  // G = 32 ... 1024
      check_linear_slots(groups, runs_log2, 2);             // four runs per slot
      check_linear_slots(groups, runs_log2, 0);
      check_linear_slots(groups, runs_log2, runs_log2);  // one slot per group
    }
  }
  // 64-bit slots: the last slot of 2^31 + 3 groups of 128 elements.
  std::int64_t const groups = (std::int64_t{1} << 31) + 3;
  linear_slot const last = linear_group_slot(groups * 4 - 1, 4, 2);
  CHECK(last.group == groups - 1);
  CHECK(last.place == 3);
  CHECK(last.first + 3 * 4 == groups * 16 - 1);
}
