// Checkpoint records: quantized tensors and AdamW states written to a stream and read back bit for
// bit, a restored AdamW state (and a gradient buffer restored through its view) continuing the run
// exactly, and every malformed or truncated record refused with agoq::invalid_argument.
#include <agoq/optim/checkpoint.hpp>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <span>
#include <sstream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "optim/problem.hpp"

#include <agoq/gradient/buffer.hpp>
#include <agoq/layout/serialize.hpp>
#include <agoq/quantize.hpp>

using namespace agoq;
using namespace agoq::optim;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = normal(gen) * (1.0f + 50.0f * static_cast<float>(gen() % 37 == 0));
  return x;
}

// The bytes of every section of a host view (codes, scales, zero points), for comparisons.
std::vector<std::uint8_t> sections(const_quantized_view const& v) {
  quantized_layout const l = v.layout();
  std::vector<std::uint8_t> out;
  auto add = [&](std::uint8_t const* p, std::int64_t n) {
    if (n > 0) out.insert(out.end(), p, p + n);
  };
  add(v.codes, l.codes_bytes);
  add(v.scales, l.scales_bytes);
  add(v.zero_points, l.zero_points_bytes);
  return out;
}

std::string record_of(const_quantized_view const& v) {
  std::ostringstream out;
  write_quantized(out, v);
  return out.str();
}

// One altered byte of a record: byte `at` set to `value`.
struct alteration {
  std::size_t at;
  char value;
  char const* what;
};

// Every proper prefix of `record`, and `record` with each alteration, fail to read with
// agoq::invalid_argument.
template <class Read>
void check_refused(std::string const& record, std::initializer_list<alteration> alterations,
                   Read read) {
  for (std::size_t k = 0; k < record.size(); k += (k < 64 ? 1 : 1 + record.size() / 97)) {
    CAPTURE(k);
    std::istringstream in(record.substr(0, k));
    CHECK_THROWS_AS(read(in), agoq::invalid_argument);
  }
  for (alteration const& a : alterations) {
    CAPTURE(a.what);
    std::string bad = record;
    bad[a.at] = a.value;
    std::istringstream in(bad);
    CHECK_THROWS_AS(read(in), agoq::invalid_argument);
  }
}

}  // namespace

TEST_CASE("checkpoint: a quantized tensor record reads back bit for bit") {
  struct shape {
    char const* spec;
    std::int64_t rows, cols;
  };
  for (shape const& c :
       {shape{"int4_g128_sym_rne_f32", 3, 1000}, shape{"int8_g32_asym_sr_bf16", 5, 77},
        shape{"fp8e4m3_g32_rne_e8m0", 2, 64}, shape{"int2_row_sym_rne_f32", 4, 9},
        shape{"int8_col_asym_rne_f32", 7, 5}, shape{"fp8e5m2_tensor_sr_bf16", 6, 6},
        shape{"int4_b32x32_sym_rne_f32", 70, 40}, shape{"int8_g128_sym_rne_f32", 0, 5},
        shape{"int8_g128_sym_rne_f32", 1, 1}}) {
    CAPTURE(c.spec);
    spec const s = spec::parse(c.spec);
    quantized_tensor q(s, c.rows, c.cols);
    std::vector<float> const x = random_values(c.rows * c.cols, 3);
    quantize(host, matrix_view<float const>(x.data(), c.rows, c.cols), q.view(), {11, 0});
    std::string const record = record_of(q.view());
    std::istringstream in(record);
    quantized_tensor const back = read_quantized(in);
    CHECK(back.spec() == s);
    CHECK(back.rows() == c.rows);
    CHECK(back.cols() == c.cols);
    CHECK(sections(back.view()) == sections(q.view()));
    CHECK(in.peek() == std::char_traits<char>::eof());  // the whole record, nothing more
    // In place, into a tensor of the same spec and extents.
    quantized_tensor into(s, c.rows, c.cols);
    std::istringstream again(record);
    read_quantized_into(again, into.view());
    CHECK(sections(into.view()) == sections(q.view()));
  }
}

TEST_CASE("checkpoint: records follow each other in one stream") {
  quantized_tensor a(spec::parse("int4_g64_sym_rne_f32"), 2, 200);
  quantized_tensor b(spec::parse("fp8e4m3_g32_sr_f32"), 1, 33);
  std::vector<float> const x = random_values(400, 5);
  quantize(host, matrix_view<float const>(x.data(), 2, 200), a.view());
  quantize(host, matrix_view<float const>(x.data(), 1, 33), b.view(), {2, 0});
  std::stringstream io;
  write_quantized(io, a.view());
  write_quantized(io, b.view());
  quantized_tensor const a2 = read_quantized(io);
  quantized_tensor const b2 = read_quantized(io);
  CHECK(sections(a2.view()) == sections(a.view()));
  CHECK(sections(b2.view()) == sections(b.view()));
}

TEST_CASE("checkpoint: malformed and truncated tensor records are refused") {
  quantized_tensor q(spec::parse("int8_g128_asym_rne_f32"), 2, 300);
  std::vector<float> const x = random_values(600, 9);
  quantize(host, matrix_view<float const>(x.data(), 2, 300), q.view());
  std::string const record = record_of(q.view());
  std::size_t const counts = 32 + q.spec().name().size();  // the byte counts after the extents
  check_refused(
      record,
      {{0, 'X', "magic"},
       {8, 2, "version"},
       {16, 'q', "spec name (\"qnt8_...\" is no spec)"},
       {13, 1, "a spec name longer than any (256 bytes more)"},
       {counts, static_cast<char>(record[counts] + 1), "codes' byte count"},
       {counts + 16, static_cast<char>(record[counts + 16] + 1), "zero points' byte count"}},
      [](std::istream& in) { return read_quantized(in); });
  // Another spec or other extents than the destination's.
  quantized_tensor other(spec::parse("int8_g128_sym_rne_f32"), 2, 300);
  std::istringstream in(record);
  CHECK_THROWS_AS(read_quantized_into(in, other.view()), agoq::invalid_argument);
  quantized_tensor shorter(q.spec(), 2, 299);
  std::istringstream in2(record);
  CHECK_THROWS_AS(read_quantized_into(in2, shorter.view()), agoq::invalid_argument);
  // A stream that fails while writing.
  std::ostringstream closed;
  closed.setstate(std::ios::badbit);
  CHECK_THROWS_AS(write_quantized(closed, q.view()), agoq::invalid_argument);
}

TEST_CASE("checkpoint: extents whose sizes would wrap around 64 bits are refused") {
  // A crafted header: int8 codes per tensor of [2^32, 2^32], whose 2^64 code bytes wrap around to
  // 0 in 64-bit arithmetic, with the byte counts of that wrapped layout (no codes, one 4-byte
  // scale). Read, it would be a view of 2^64 elements over a buffer of 4 bytes.
  quantized_tensor q(spec::parse("int8_tensor_sym_rne_f32"), 1, 4);
  std::vector<float> const x = random_values(4, 3);
  quantize(host, matrix_view<float const>(x.data(), 1, 4), q.view());
  std::string record = record_of(q.view());
  std::size_t const extents = 16 + q.spec().name().size();
  auto const put = [&](std::size_t at, std::uint64_t v) {
    for (std::size_t i = 0; i < 8; ++i) record[at + i] = static_cast<char>((v >> (8 * i)) & 0xffu);
  };
  put(extents, std::uint64_t{1} << 32);
  put(extents + 8, std::uint64_t{1} << 32);
  put(extents + 16, 0);
  std::istringstream in(record);
  CHECK_THROWS_WITH_AS(read_quantized(in), doctest::Contains("too large"), agoq::invalid_argument);
  // Negative extents (the top bit set) are refused as well.
  put(extents, std::uint64_t{1} << 63);
  std::istringstream in2(record);
  CHECK_THROWS_WITH_AS(read_quantized(in2), doctest::Contains("non-negative"),
                       agoq::invalid_argument);
}

namespace {

adamw_hyper const hyper = agoq_test::test_hyper();

// Steps `steps` times from step `first` on with the seeded gradients of the test.
void run(adamw_state& s, std::vector<float>& w, int first, int steps) {
  for (int t = first; t < first + steps; ++t) {
    std::vector<float> const g = random_values(static_cast<std::int64_t>(w.size()), 100 + t);
    adamw_step(host, s, hyper, std::span<float>(w), std::span<float const>(g));
  }
}

// Runs `steps` steps of `s` from weights seeded by `seed` and returns its record.
std::string record_after(adamw_state& s, std::uint32_t seed, int steps) {
  std::vector<float> w = random_values(s.size(), seed);
  run(s, w, 0, steps);
  std::ostringstream out;
  write_adamw_state(out, s);
  return out.str();
}

void check_same(adamw_state const& a, adamw_state const& b) {
  CHECK(a.size() == b.size());
  CHECK(a.step() == b.step());
  CHECK(a.options().seed == b.options().seed);
  auto same = [](moment_storage const& x, moment_storage const& y) {
    CHECK(x.format() == y.format());
    CHECK(std::vector<float>(x.f32().begin(), x.f32().end()) ==
          std::vector<float>(y.f32().begin(), y.f32().end()));
    CHECK(std::vector<std::uint16_t>(x.bf16().begin(), x.bf16().end()) ==
          std::vector<std::uint16_t>(y.bf16().begin(), y.bf16().end()));
    if (is_quantized(x.format())) {
      CHECK(sections(x.quantized().view()) == sections(y.quantized().view()));
    }
  };
  same(a.m(), b.m());
  same(a.v(), b.v());
}

}  // namespace

TEST_CASE("checkpoint: a restored AdamW state continues the run bit for bit") {
  for (moment_format const m :
       {moment_format::int8_linear, moment_format::f32, moment_format::bf16}) {
    for (moment_format const v :
         {moment_format::e4m3_sqrt, moment_format::f32, moment_format::bf16,
          moment_format::int8_linear, moment_format::uint8_sqrt, moment_format::e4m3}) {
      for (std::int64_t const n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}}) {
        CAPTURE(format_name(m));
        CAPTURE(format_name(v));
        CAPTURE(n);
        adamw_state_options o;
        o.m = m;
        o.v = v;
        o.block = 64;
        o.v_rounding = v == moment_format::e4m3 ? rounding_kind::nearest : o.v_rounding;
        o.seed = 77;
        adamw_state s(n, o);
        std::vector<float> w = random_values(n, 1);
        run(s, w, 0, 3);
        std::stringstream io;
        write_adamw_state(io, s);
        adamw_state r = read_adamw_state(io);
        CHECK(r.options().m == m);
        CHECK(r.options().v == v);
        CHECK(r.options().block == 64);
        CHECK(r.options().v_rounding == o.v_rounding);
        check_same(s, r);
        // Both continue from step 3: the same weights and states at every later step.
        std::vector<float> w2 = w;
        run(s, w, 3, 2);
        run(r, w2, 3, 2);
        CHECK(w == w2);
        check_same(s, r);
      }
    }
  }
}

TEST_CASE("checkpoint: malformed and truncated AdamW state records are refused") {
  adamw_state s(300);
  std::string const record = record_after(s, 2, 2);
  // The header: magic 0-7, version 8-11, size 12-19, step 20-27, seed 28-35, block 36-43, then
  // one byte each for m's and v's formats and roundings (44-47).
  check_refused(record,
                {{3, 'x', "magic"},
                 {19, static_cast<char>(0x80), "a negative size"},
                 {27, static_cast<char>(0x80), "a negative step"},
                 {36, 0, "block size 0"},
                 {44, 9, "an unknown first-moment format"},
                 {44, static_cast<char>(moment_format::e4m3_sqrt), "an unsigned first moment"},
                 {47, 2, "an unknown rounding"},
                 {45, static_cast<char>(moment_format::uint8_sqrt), "v's record of another spec"}},
                [](std::istream& in) { return read_adamw_state(in); });
  // A quantized tensor record is not an AdamW state record, nor the reverse.
  quantized_tensor q(spec::parse("int8_g128_sym_rne_f32"), 1, 10);
  std::istringstream tensor(record_of(q.view()));
  CHECK_THROWS_AS(read_adamw_state(tensor), agoq::invalid_argument);
  std::istringstream state(record);
  CHECK_THROWS_AS(read_quantized(state), agoq::invalid_argument);
}

namespace {

// A stream that cannot seek (as a pipe): std::streambuf's seekoff reports -1.
struct unseekable : std::streambuf {
  explicit unseekable(std::string s) : data(std::move(s)) {
    setg(data.data(), data.data(), data.data() + data.size());
  }
  std::string data;
};

void put_le(std::string& record, std::size_t at, std::uint64_t v) {
  for (std::size_t i = 0; i < 8; ++i) record[at + i] = static_cast<char>((v >> (8 * i)) & 0xffu);
}

}  // namespace

TEST_CASE("checkpoint: sizes beyond what a seekable stream holds are refused before allocating") {
  // An AdamW record claiming 2^40 elements (8 TiB of f32 moments) in a stream of a few KiB: refused
  // from the stream's length, where it used to allocate (or fail to) first.
  adamw_state s(300);
  std::string record = record_after(s, 4, 1);
  put_le(record, 12, std::uint64_t{1} << 40);
  std::istringstream big(record);
  CHECK_THROWS_WITH_AS(read_adamw_state(big), doctest::Contains("bytes announced"),
                       agoq::invalid_argument);
  put_le(record, 12, std::uint64_t{1} << 60);
  std::istringstream huge(record);
  CHECK_THROWS_WITH_AS(read_adamw_state(huge), doctest::Contains("more than 2^59"),
                       agoq::invalid_argument);
  // A tensor record whose extents and byte counts agree on 2^40 elements.
  spec const sp = spec::parse("int8_g128_sym_rne_f32");
  quantized_tensor q(sp, 2, 300);
  std::vector<float> const x = random_values(600, 5);
  quantize(host, matrix_view<float const>(x.data(), 2, 300), q.view());
  std::string tensor = record_of(q.view());
  std::size_t const extents = 16 + sp.name().size();
  quantized_layout const l = make_layout(sp, std::int64_t{1} << 20, std::int64_t{1} << 20);
  put_le(tensor, extents, std::uint64_t{1} << 20);
  put_le(tensor, extents + 8, std::uint64_t{1} << 20);
  put_le(tensor, extents + 16, static_cast<std::uint64_t>(l.codes_bytes));
  put_le(tensor, extents + 24, static_cast<std::uint64_t>(l.scales_bytes));
  std::istringstream claimed(tensor);
  CHECK_THROWS_WITH_AS(read_quantized(claimed), doctest::Contains("bytes announced"),
                       agoq::invalid_argument);
  // The check leaves the stream where it was: valid records read on from a seekable stream, and
  // from one that cannot seek (not checked; its reads fail where it ends).
  std::stringstream both;
  write_quantized(both, q.view());
  write_adamw_state(both, s);
  CHECK(sections(read_quantized(both).view()) == sections(q.view()));
  check_same(read_adamw_state(both), s);
  unseekable pipe(record_of(q.view()));
  std::istream piped(&pipe);
  CHECK(sections(read_quantized(piped).view()) == sections(q.view()));
  unseekable cut(record_of(q.view()).substr(0, 100));
  std::istream short_pipe(&cut);
  CHECK_THROWS_WITH_AS(read_quantized(short_pipe), doctest::Contains("ends inside"),
                       agoq::invalid_argument);
}

TEST_CASE("checkpoint: a gradient buffer restored through its view accumulates on bit for bit") {
  std::int64_t const n = 1000;
  gradient::buffer_options const opt{128, rounding_kind::stochastic, 21};
  gradient::gradient_buffer a(n, opt);
  for (std::uint32_t k = 0; k < 3; ++k) {
    a.accumulate(std::span<float const>(random_values(n, 200 + k)));
  }
  std::stringstream io;
  write_quantized(io, a.view());
  gradient::gradient_buffer b(n, opt);
  read_quantized_into(io, b.view());
  b.mark_written(a.nonfinite_count());
  b.set_counter(a.counter());
  for (std::uint32_t k = 3; k < 5; ++k) {
    std::vector<float> const g = random_values(n, 200 + k);
    a.accumulate(std::span<float const>(g));
    b.accumulate(std::span<float const>(g));
  }
  CHECK(sections(a.view()) == sections(b.view()));
  CHECK(a.counter() == b.counter());
}
