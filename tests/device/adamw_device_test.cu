// The CUDA AdamW step against the host step, bit for bit: parameters, moment codes and scales,
// skipped counts, over several steps.
#include "device_support.cuh"
#include "optim/problem.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <vector>

#include <agoq/optim/adamw.cuh>
#include <agoq/optim/checkpoint.hpp>

using namespace agoq;
using namespace agoq::optim;
using agoq::test::device_bytes;

namespace {

cuda_executor const ex{cudaStream_t{}};

// The bytes of a host moment: the sections of an 8-bit format, the values (as `codes`) of an f32
// or bf16 one.
test::sections host_moment(moment_storage const& h) {
  if (is_quantized(h.format())) return test::host_sections(h.quantized().view());
  auto const* p = h.format() == moment_format::f32
                      ? reinterpret_cast<std::uint8_t const*>(h.f32().data())
                      : reinterpret_cast<std::uint8_t const*>(h.bf16().data());
  test::sections s;
  s.codes.assign(p, p + moment_bytes(h.format(), h.size(), 1));
  return s;
}

// The same bytes of a device moment, downloaded.
test::sections download_moment(device_moment const& d) {
  if (is_quantized(d.format)) return test::download(d.codes);
  test::sections s;
  s.codes.resize(static_cast<std::size_t>(moment_bytes(d.format, d.size(), 1)));
  if (!s.codes.empty()) {
    AGOQ_CUDA_TRY(cudaMemcpy(s.codes.data(), d.values, s.codes.size(), cudaMemcpyDeviceToHost));
  }
  return s;
}

// A device copy of a host adamw_state (its formats, block size, roundings and seed), each moment
// `shift` bytes (8-bit formats) or elements (f32, bf16) past an aligned address.
struct device_state {
  device_bytes m_buf, v_buf;
  adamw_device_state s;

  device_state(adamw_state const& h, int shift)
      : m_buf(moment_bytes(h.options().m, h.size(), h.options().block) + 16),
        v_buf(moment_bytes(h.options().v, h.size(), h.options().block) + 16) {
    adamw_state_options const& o = h.options();
    s = adamw_device_state_of_buffers(h.size(), o, m_buf.get() + shift_bytes(o.m, shift),
                                      v_buf.get() + shift_bytes(o.v, shift));
    s.step = h.step();
    upload(h.m(), s.m);
    upload(h.v(), s.v);
  }

  static int shift_bytes(moment_format f, int shift) {
    return is_quantized(f) ? shift : shift * static_cast<int>(moment_bytes(f, 1, 1));
  }

  static void upload(moment_storage const& from, device_moment const& to) {
    if (is_quantized(from.format())) {
      upload(from.quantized().view(), to.codes);
      return;
    }
    test::sections const b = host_moment(from);
    if (!b.codes.empty()) {
      AGOQ_CUDA_TRY(cudaMemcpy(to.values, b.codes.data(), b.codes.size(), cudaMemcpyHostToDevice));
    }
  }

  static void upload(const_quantized_view from, quantized_view to) {
    test::sections const b = test::host_sections(from);
    auto copy = [](void* dst, std::vector<std::uint8_t> const& src) {
      if (!src.empty())
        AGOQ_CUDA_TRY(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
    };
    copy(to.codes, b.codes);
    copy(to.scales, b.scales);
    copy(to.zero_points, b.zero_points);
  }
};

void check_same_moment(moment_storage const& h, device_moment const& d) {
  test::sections const got = download_moment(d), want = host_moment(h);
  CHECK(test::first_difference(got.codes, want.codes) == -1);
  CHECK(test::first_difference(got.scales, want.scales) == -1);
  CHECK(test::first_difference(got.zero_points, want.zero_points) == -1);
}

void check_same_state(adamw_state const& h, device_state const& d) {
  CHECK(d.s.step == h.step());
  check_same_moment(h.m(), d.s.m);
  check_same_moment(h.v(), d.s.v);
}

template <class T>
std::vector<std::uint8_t> bytes_of(std::vector<T> const& x) {
  std::vector<std::uint8_t> b(x.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), x.data(), b.size());
  return b;
}

// Random gradients scaled by `scale` (tiny scales reach subnormals), with NaN/Inf when asked.
template <class G>
std::vector<G> gradients(std::int64_t n, std::uint64_t seed, float scale, bool non_finite) {
  std::vector<float> const f = test::random_input<float>(n, seed, non_finite);
  std::vector<G> g(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) g[i] = numeric::from_float<G>(f[i] * scale);
  return g;
}

adamw_hyper const hyper = agoq_test::test_hyper();

// A host state of n elements stored as `opt` says, with stream seed `seed`.
adamw_state seeded_state(std::int64_t n, std::uint64_t seed, adamw_state_options opt = {}) {
  opt.seed = seed;
  return adamw_state(n, opt);
}

std::vector<bfloat16> to_bfloat16(std::vector<float> const& x) {
  std::vector<bfloat16> w(x.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = numeric::from_float<bfloat16>(x[i]);
  return w;
}

// Checks that `d`, from element `shift` on, holds the bytes of `want`.
template <class T>
void check_download(device_bytes const& d, std::vector<T> const& want, int shift = 0) {
  std::vector<T> got(want.size());
  d.download(got.data(), want.size() * sizeof(T), shift * sizeof(T));
  CHECK(test::first_difference(bytes_of(got), bytes_of(want)) == -1);
}

// `steps` steps of fp32 parameters with a gradient of type G on both executors; parameters and
// gradients `shift` elements past an aligned address, codes `code_shift` bytes past one.
template <class G>
void compare_float(std::int64_t n, int steps, float scale, int shift, int code_shift,
                   std::uint64_t seed, adamw_state_options const& opt = {}) {
  INFO("n " << n << " scale " << scale << " shift " << shift << " code shift " << code_shift);
  adamw_state h = seeded_state(n, seed, opt);
  device_state d(h, code_shift);
  std::vector<float> p = test::random_input<float>(n, seed + 1, false);
  device_bytes dp((n + shift) * sizeof(float)), dg((n + shift) * sizeof(G)),
      dskipped(sizeof(std::int64_t));
  dp.upload(p.data(), n * sizeof(float), shift * sizeof(float));
  auto* pd = reinterpret_cast<float*>(dp.get()) + shift;
  auto* gd = reinterpret_cast<G*>(dg.get()) + shift;
  auto* skipped = reinterpret_cast<std::int64_t*>(dskipped.get());
  for (int t = 0; t < steps; ++t) {
    std::vector<G> const g = gradients<G>(n, seed * 31 + t, scale, true);
    dg.upload(g.data(), n * sizeof(G), shift * sizeof(G));
    std::int64_t const want =
        adamw_step(host, h, hyper, std::span<float>(p), std::span<G const>(g));
    adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n), std::span<G const>(gd, n), skipped);
    std::int64_t got = -1;
    dskipped.download(&got, sizeof(got));
    CHECK(got == want);
    check_download(dp, p, shift);
    check_same_state(h, d);
  }
}

// The same with bfloat16 weights, with or without an fp32 master copy.
template <class G>
void compare_bf16(std::int64_t n, int steps, bool with_master, std::uint64_t seed,
                  adamw_state_options const& opt = {}) {
  INFO("n " << n << " master " << with_master);
  adamw_state h = seeded_state(n, seed, opt);
  device_state d(h, 0);
  std::vector<float> master = test::random_input<float>(n, seed + 1, false);
  std::vector<bfloat16> w = to_bfloat16(master);
  if (!with_master) master.clear();
  device_bytes dw(n * sizeof(bfloat16)), dm(n * sizeof(float)), dg(n * sizeof(G));
  dw.upload(w.data(), n * sizeof(bfloat16));
  if (with_master) dm.upload(master.data(), n * sizeof(float));
  auto* wd = reinterpret_cast<bfloat16*>(dw.get());
  std::span<float> md =
      with_master ? std::span<float>(reinterpret_cast<float*>(dm.get()), n) : std::span<float>();
  for (int t = 0; t < steps; ++t) {
    std::vector<G> const g = gradients<G>(n, seed * 17 + t, 1.0f, true);
    dg.upload(g.data(), n * sizeof(G));
    adamw_step(host, h, hyper, std::span<bfloat16>(w), std::span<float>(master),
               std::span<G const>(g));
    adamw_step_async(ex, d.s, hyper, std::span<bfloat16>(wd, n), md,
                     std::span<G const>(reinterpret_cast<G const*>(dg.get()), n));
    check_download(dw, w);
    if (with_master) check_download(dm, master);
    check_same_state(h, d);
  }
}

// A gradient given as an 8-bit quantized [rows, cols] view (runs may cross its rows).
void compare_quantized(char const* name, std::int64_t rows, std::int64_t cols, bool bf16_weights,
                       std::uint64_t seed, adamw_state_options const& opt = {}) {
  INFO(name << " " << rows << "x" << cols << " bf16 " << bf16_weights);
  spec const s = spec::parse(name);
  std::int64_t const n = rows * cols;
  adamw_state h = seeded_state(n, seed, opt);
  device_state d(h, 0);
  std::vector<float> p = test::random_input<float>(n, seed + 1, false);
  std::vector<bfloat16> w = to_bfloat16(p);
  device_bytes dp(n * sizeof(float)), dw(n * sizeof(bfloat16));
  dp.upload(p.data(), n * sizeof(float));
  dw.upload(w.data(), n * sizeof(bfloat16));
  quantized_layout const l = make_layout(s, rows, cols);
  device_bytes dq(l.total_bytes);
  quantized_view const gq = view_of_buffer(s, rows, cols, dq.get());
  auto* pd = reinterpret_cast<float*>(dp.get());
  auto* wd = reinterpret_cast<bfloat16*>(dw.get());
  for (int t = 0; t < 3; ++t) {
    std::vector<float> const g = test::random_input<float>(n, seed * 13 + t, true);
    quantized_tensor hq(s, rows, cols);
    quantize(host, matrix_view<float const>(g.data(), rows, cols), hq.view(), {seed, 0});
    device_state::upload(hq.view(), gq);
    if (bf16_weights) {
      adamw_step(host, h, hyper, std::span<bfloat16>(w), std::span<float>(p),
                 const_quantized_view(hq.view()));
      adamw_step_async(ex, d.s, hyper, std::span<bfloat16>(wd, n), std::span<float>(pd, n),
                       const_quantized_view(gq));
      check_download(dw, w);
    } else {
      adamw_step(host, h, hyper, std::span<float>(p), const_quantized_view(hq.view()));
      adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n), const_quantized_view(gq));
    }
    check_download(dp, p);
    check_same_state(h, d);
  }
}

}  // namespace

TEST_CASE("device AdamW steps equal the host step bit for bit (fp32 parameters)") {
  std::uint64_t seed = 1;
  for (std::int64_t n : {1, 7, 127, 128, 129, 300, 4097, 8192 + 5, 100003}) {
    compare_float<float>(n, 4, 1.0f, 0, 0, seed++);
    compare_float<bfloat16>(n, 2, 1.0f, 0, 0, seed++);
    compare_float<half>(n, 2, 1.0f, 0, 0, seed++);
  }
}

TEST_CASE("tiny and huge gradients, NaN and Inf skip like the host") {
  for (float scale : {1e-30f, 1e-20f, 1e-3f, 1e18f}) compare_float<float>(1000, 3, scale, 0, 0, 5);
}

TEST_CASE("misaligned parameters, gradients and codes give the same bits") {
  for (int shift : {1, 3}) {
    for (int code_shift : {1, 2, 5}) {
      compare_float<float>(1031, 2, 1.0f, shift, code_shift, 11);
      compare_float<bfloat16>(1031, 2, 1.0f, shift, code_shift, 12);
    }
  }
}

TEST_CASE("bfloat16 weights with and without a master copy") {
  for (std::int64_t n : {5, 128, 3001}) {
    compare_bf16<float>(n, 3, true, 21);
    compare_bf16<float>(n, 3, false, 22);
    compare_bf16<bfloat16>(n, 2, true, 23);
  }
}

TEST_CASE("quantized gradients of any grouping, decoded in row-major order") {
  compare_quantized("int8_g128_sym_sr_f32", 1, 1000, false, 31);
  compare_quantized("int8_g128_sym_sr_f32", 7, 300, true, 32);
  compare_quantized("fp8e4m3_g32_rne_e8m0", 33, 129, false, 33);
  compare_quantized("int8_row_asym_rne_bf16", 5, 77, true, 34);
  compare_quantized("fp8e5m2_g128_sr_bf16", 3, 1001, false, 35);
  // Groups of a power of two that tile the elements: whole runs take one load of codes and one
  // of parameters (a gradient_buffer's [1, n] view; rows of whole groups; per-row scales of
  // power-of-two rows; zero points, bf16 and e8m0 scales).
  compare_quantized("int8_g64_sym_rne_f32", 1, 4099, false, 36);
  compare_quantized("fp8e4m3_g32_rne_e8m0", 4, 256, true, 37);
  compare_quantized("int8_row_asym_rne_bf16", 3, 512, false, 38);
}

// Every other state takes the formats kernel: f32 and bf16 moments, the other 8-bit codes (zero
// points included), nearest rounding, blocks of 32, 64 and 256.
std::vector<adamw_state_options> other_formats() {
  using f = moment_format;
  auto const sr = rounding_kind::stochastic, rne = rounding_kind::nearest;
  auto make = [](f m, f v, std::int64_t block, rounding_kind mr, rounding_kind vr) {
    adamw_state_options o;
    o.m = m;
    o.v = v;
    o.block = block;
    o.m_rounding = mr;
    o.v_rounding = vr;
    return o;
  };
  return {make(f::f32, f::f32, 128, sr, sr),
          make(f::bf16, f::bf16, 128, sr, sr),
          make(f::int8_linear, f::f32, 128, sr, sr),
          make(f::f32, f::e4m3_sqrt, 64, sr, sr),
          make(f::bf16, f::uint8_sqrt, 32, rne, rne),
          make(f::int8_linear, f::uint8_sqrt, 128, sr, sr),
          make(f::int8_linear, f::int8_linear, 256, sr, rne),
          make(f::int8_linear, f::e4m3, 128, sr, sr),
          make(f::int8_linear, f::e4m3_sqrt, 128, rne, rne),
          make(f::int8_linear, f::e4m3_sqrt, 32, sr, sr),
          make(f::int8_linear, f::e4m3_sqrt, 256, sr, sr)};
}

TEST_CASE("every moment format, block size and rounding equals the host step bit for bit") {
  std::uint64_t seed = 101;
  for (adamw_state_options const& o : other_formats()) {
    INFO("m " << format_name(o.m) << " v " << format_name(o.v) << " block " << o.block);
    for (std::int64_t n : {1, 31, 257, 3001}) compare_float<float>(n, 3, 1.0f, 0, 0, seed++, o);
    compare_float<bfloat16>(1031, 2, 1.0f, 1, 3, seed++, o);
    compare_float<float>(1000, 2, 1e18f, 0, 0, seed++, o);
    compare_bf16<half>(777, 2, true, seed++, o);
    compare_bf16<float>(777, 2, false, seed++, o);
    compare_quantized("int8_g128_sym_sr_f32", 3, 300, false, seed++, o);
  }
}

TEST_CASE("bad arguments throw before any launch") {
  std::int64_t const n = 256;
  adamw_state h(n);
  device_state d(h, 0);
  device_bytes dp(n * sizeof(float)), dg(n * sizeof(float));
  auto* pd = reinterpret_cast<float*>(dp.get());
  auto* gd = reinterpret_cast<float const*>(dg.get());
  std::vector<float> host_p(n), host_g(n);
  CHECK_THROWS_WITH_AS(adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n - 1),
                                        std::span<float const>(gd, n - 1)),
                       doctest::Contains("the parameters have 255"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n), std::span<float const>(gd, 7)),
      doctest::Contains("the gradient has 7"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n),
                                        std::span<float const>(host_g.data(), n)),
                       doctest::Contains("pageable host pointer"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_step_async(ex, d.s, hyper, std::span<float>(host_p.data(), n),
                                        std::span<float const>(gd, n)),
                       doctest::Contains("pageable host pointer"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      adamw_step_async(ex, d.s, hyper, std::span<float>(static_cast<float*>(nullptr), n),
                       std::span<float const>(gd, n)),
      doctest::Contains("null parameter"), agoq::invalid_argument);
  adamw_hyper bad = hyper;
  bad.beta2 = 1.0f;
  CHECK_THROWS_WITH_AS(
      adamw_step_async(ex, d.s, bad, std::span<float>(pd, n), std::span<float const>(gd, n)),
      doctest::Contains("beta2"), agoq::invalid_argument);
  // States whose moments do not match their formats, or that the device step does not take.
  auto refused = [&](adamw_device_state const& bad_state) {
    adamw_device_state other = bad_state;
    adamw_step_async(ex, other, hyper, std::span<float>(pd, n), std::span<float const>(gd, n));
  };
  adamw_device_state other = d.s;
  other.v.codes.spec = moment_spec(moment_format::int8_linear, 128, rounding_kind::stochastic);
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("is stored as e4m3_sqrt"),
                       agoq::invalid_argument);
  other = d.s;
  other.m.codes.spec = moment_spec(moment_format::int8_linear, 100, rounding_kind::stochastic);
  other.v.codes.spec = moment_spec(moment_format::e4m3_sqrt, 100, rounding_kind::stochastic);
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("blocks of 32, 64, 128 or 256"),
                       agoq::unsupported_scheme);
  other = d.s;
  other.m.codes.spec = moment_spec(moment_format::int8_linear, 64, rounding_kind::stochastic);
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("they must share one"),
                       agoq::invalid_argument);
  other = d.s;
  other.m.format = moment_format::e4m3;
  other.m.codes.spec = moment_spec(moment_format::e4m3, 128, rounding_kind::stochastic);
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("the first moment is signed"),
                       agoq::invalid_argument);
  other = d.s;
  other.v.format = static_cast<moment_format>(17);
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("unknown moment format 17"),
                       agoq::invalid_argument);
  other = d.s;
  other.v = device_moment{moment_format::f32, {}, nullptr, n};
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("null values"), agoq::invalid_argument);
  other.v.values = dg.get() + 2;
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("not aligned"), agoq::invalid_argument);
  other.v.values = host_g.data();
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("pageable host pointer"),
                       agoq::invalid_argument);
  other.v = device_moment{moment_format::bf16, {}, dg.get(), n - 1};
  CHECK_THROWS_WITH_AS(refused(other), doctest::Contains("the second moment 255"),
                       agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(
      moment_of_buffer(moment_format::f32, n, 128, rounding_kind::nearest, dg.get() + 2),
      doctest::Contains("4-byte aligned"), agoq::invalid_argument);
  adamw_state_options unsigned_m;
  unsigned_m.m = moment_format::uint8_sqrt;
  CHECK_THROWS_WITH_AS(adamw_device_state_of_buffers(n, unsigned_m, dp.get(), dg.get()),
                       doctest::Contains("the first moment is signed"), agoq::invalid_argument);
  quantized_tensor hq(spec::parse("int4_g128_sym_rne_f32"), 1, n);
  CHECK_THROWS_WITH_AS(
      adamw_step_async(ex, d.s, hyper, std::span<float>(pd, n), const_quantized_view(hq.view())),
      doctest::Contains("8-bit codes"), agoq::invalid_argument);
  // Nothing was enqueued and the step count did not move.
  CHECK(d.s.step == 0);
  check_same_state(h, d);
}

TEST_CASE("an empty state only counts the step") {
  adamw_state h(0);
  device_state d(h, 0);
  device_bytes dskipped(sizeof(std::int64_t));
  auto* skipped = reinterpret_cast<std::int64_t*>(dskipped.get());
  adamw_step_async(ex, d.s, hyper, std::span<float>(), std::span<float const>(), skipped);
  std::int64_t got = -1;
  dskipped.download(&got, sizeof(got));
  CHECK(got == 0);
  CHECK(d.s.step == 1);
}

// The checkpoint round trip of a state stored as `opt` says.
void check_checkpoint(adamw_state_options const& opt) {
  INFO("m " << format_name(opt.m) << " v " << format_name(opt.v) << " block " << opt.block);
  std::int64_t const n = 3001;
  adamw_state h = seeded_state(n, 41, opt);
  device_state d(h, 0);
  std::vector<float> p = test::random_input<float>(n, 42, false);
  device_bytes dp(n * sizeof(float)), dg(n * sizeof(float));
  dp.upload(p.data(), n * sizeof(float));
  auto* pd = reinterpret_cast<float*>(dp.get());
  auto step = [&](adamw_device_state& s, int t) {
    std::vector<float> const g = gradients<float>(n, 43 + t, 1.0f, false);
    dg.upload(g.data(), n * sizeof(float));
    adamw_step_async(ex, s, hyper, std::span<float>(pd, n),
                     std::span<float const>(reinterpret_cast<float const*>(dg.get()), n));
    return g;
  };
  for (int t = 0; t < 2; ++t) {
    std::vector<float> const g = step(d.s, t);
    adamw_step(host, h, hyper, std::span<float>(p), std::span<float const>(g));
  }
  // Device -> host state -> record -> host state -> fresh device buffers.
  adamw_state saved = seeded_state(n, 41, opt);
  copy_state(ex, d.s, saved);
  CHECK(saved.step() == 2);
  std::stringstream io;
  write_adamw_state(io, saved);
  adamw_state const loaded = read_adamw_state(io);
  device_state resumed(seeded_state(n, 41, opt), 1);
  copy_state(ex, loaded, resumed.s);
  CHECK(resumed.s.step == 2);
  check_same_state(h, resumed);
  // Both device states continue with the host reference, bit for bit.
  std::vector<float> const p_saved = p;
  for (int t = 2; t < 4; ++t) {
    std::vector<float> const g = step(d.s, t);
    adamw_step(host, h, hyper, std::span<float>(p), std::span<float const>(g));
  }
  check_download(dp, p);
  check_same_state(h, d);
  dp.upload(p_saved.data(), n * sizeof(float));
  for (int t = 2; t < 4; ++t) step(resumed.s, t);
  check_download(dp, p);
  check_same_state(h, resumed);
  // Mismatched states are refused before anything is copied.
  adamw_state other_seed = seeded_state(n, 7, opt);
  CHECK_THROWS_AS(copy_state(ex, d.s, other_seed), agoq::invalid_argument);
  adamw_state other_size = seeded_state(n - 1, 41, opt);
  CHECK_THROWS_AS(copy_state(ex, other_size, d.s), agoq::invalid_argument);
  adamw_state_options other_format = opt;
  other_format.v = opt.v == moment_format::f32 ? moment_format::bf16 : moment_format::f32;
  adamw_state plain = seeded_state(n, 41, other_format);
  CHECK_THROWS_WITH_AS(copy_state(ex, d.s, plain), doctest::Contains("the device state m as"),
                       agoq::invalid_argument);
  adamw_state_options other_block = opt;
  other_block.block = opt.block == 64 ? 128 : 64;
  adamw_state blocks = seeded_state(n, 41, other_block);
  if (is_quantized(opt.m) || is_quantized(opt.v)) {
    CHECK_THROWS_AS(copy_state(ex, blocks, d.s), agoq::invalid_argument);
  }
}

TEST_CASE("a device state checkpointed through a host state resumes bit for bit") {
  check_checkpoint({});
  for (adamw_state_options const& o : other_formats()) check_checkpoint(o);
}
