// The AdamW step on the vector loops (host executor) against the portable loops (host_executor
// {false}), bit for bit: the update loop alone on adversarial values, and whole steps over every
// moment format, weight type and gradient source, comparing parameters and every state byte.
#include <agoq/optim/adamw.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "optim/problem.hpp"

using namespace agoq;
using namespace agoq::optim;

namespace {

using agoq_test::test_hyper;

constexpr host_executor portable{false};

// Gradients over many binades with zeros, float subnormals, values whose square overflows, NaN
// and ±Inf.
std::vector<float> gradients(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& x : g) {
    x = normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 30);
    switch (gen() % 32) {
      case 0:
        x = std::numeric_limits<float>::quiet_NaN();
        break;
      case 1:
        x = (gen() & 1 ? 1.0f : -1.0f) * HUGE_VALF;
        break;
      case 2:
        x = (gen() & 1) ? 0.0f : -0.0f;
        break;
      case 3:
        x = std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 5000);
        break;
      case 4:
        x = (gen() & 1 ? 1.0f : -1.0f) * 3e30f;
        break;
      default:
        break;
    }
  }
  return g;
}

std::vector<std::uint32_t> bits(std::vector<float> const& x) {
  std::vector<std::uint32_t> b;
  for (float v : x) b.push_back(numeric::float_bits(v));
  return b;
}

std::vector<std::uint16_t> bits(std::vector<bfloat16> const& x) {
  std::vector<std::uint16_t> b;
  for (bfloat16 const& v : x)
    b.push_back(static_cast<std::uint16_t>(agoq::detail::host::bits_of(v)));
  return b;
}

// Every stored byte of a moment (codes, scales, zero points, padding) or its stored numbers.
std::vector<std::uint8_t> state_bytes(moment_storage const& m) {
  std::vector<std::uint8_t> b;
  if (is_quantized(m.format())) {
    quantized_tensor const& q = m.quantized();
    b.assign(q.data(), q.data() + q.bytes());
  } else {
    for (float v : m.values()) {
      std::uint32_t const u = numeric::float_bits(v);
      for (int k = 0; k < 4; ++k) b.push_back(static_cast<std::uint8_t>(u >> (8 * k)));
    }
  }
  return b;
}

void require_same_state(adamw_state const& a, adamw_state const& b) {
  REQUIRE(a.step() == b.step());
  REQUIRE(state_bytes(a.m()) == state_bytes(b.m()));
  REQUIRE(state_bytes(a.v()) == state_bytes(b.v()));
}

std::vector<adamw_state_options> state_options() {
  std::vector<adamw_state_options> r;
  struct formats {
    moment_format m, v;
  };
  for (formats f : {formats{moment_format::int8_linear, moment_format::e4m3_sqrt},
                    formats{moment_format::f32, moment_format::f32},
                    formats{moment_format::bf16, moment_format::bf16},
                    formats{moment_format::int8_linear, moment_format::uint8_sqrt},
                    formats{moment_format::int8_linear, moment_format::e4m3},
                    formats{moment_format::f32, moment_format::int8_linear}}) {
    for (rounding_kind rk : {rounding_kind::stochastic, rounding_kind::nearest}) {
      adamw_state_options o;
      o.m = f.m;
      o.v = f.v;
      o.m_rounding = rk;
      o.v_rounding = rk;
      o.block = 128;
      o.seed = 99;
      r.push_back(o);
    }
  }
  return r;
}

}  // namespace

TEST_CASE("the vector update loop equals the portable one on adversarial values") {
  std::mt19937_64 gen(5);
  adamw_coefficients const c = make_coefficients(test_hyper(), 3);
  for (std::int64_t k : {1, 15, 16, 17, 100, 1000}) {
    CAPTURE(k);
    std::vector<float> const g = gradients(k, static_cast<std::uint64_t>(k));
    std::vector<float> p0(g.size()), m0(g.size()), v0(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      // Parameters and moments from raw bits: any sign, binade, subnormal, NaN or Inf, v >= 0.
      p0[i] = numeric::bits_float(static_cast<std::uint32_t>(gen()));
      m0[i] = numeric::bits_float(static_cast<std::uint32_t>(gen()) & 0xbfffffffu);
      v0[i] = numeric::bits_float(static_cast<std::uint32_t>(gen()) & 0x3fffffffu);
      if (gen() % 8 == 0) v0[i] = 0.0f;
    }
    for (int sqrt_v = 0; sqrt_v < 2; ++sqrt_v) {
      CAPTURE(sqrt_v);
      auto const run = [&](bool simd, auto* w, float* master, std::vector<float>& m,
                           std::vector<float>& v) {
        return sqrt_v ? optim::detail::adamw_update_run<true>(c, g.data(), w, master, m.data(),
                                                              v.data(), k, simd)
                      : optim::detail::adamw_update_run<false>(c, g.data(), w, master, m.data(),
                                                               v.data(), k, simd);
      };
      // float parameters
      std::vector<float> pa = p0, ma = m0, va = v0, pb = p0, mb = m0, vb = v0;
      REQUIRE(run(false, pa.data(), nullptr, ma, va) == run(true, pb.data(), nullptr, mb, vb));
      REQUIRE(bits(pa) == bits(pb));
      REQUIRE(bits(ma) == bits(mb));
      REQUIRE(bits(va) == bits(vb));
      // bfloat16 weights, with and without a master copy (signalling NaN weights included)
      for (int with_master = 0; with_master < 2; ++with_master) {
        CAPTURE(with_master);
        std::vector<bfloat16> wa(g.size()), wb(g.size());
        for (std::size_t i = 0; i < g.size(); ++i) {
          wa[i] = numeric::from_float<bfloat16>(p0[i]);
          if (i % 13 == 0) std::memcpy(&wa[i], "\x81\x7f", 2);  // a signalling NaN
          wb[i] = wa[i];
        }
        ma = m0, va = v0, mb = m0, vb = v0, pa = p0, pb = p0;
        REQUIRE(run(false, wa.data(), with_master ? pa.data() : nullptr, ma, va) ==
                run(true, wb.data(), with_master ? pb.data() : nullptr, mb, vb));
        REQUIRE(bits(wa) == bits(wb));
        REQUIRE(bits(pa) == bits(pb));
        REQUIRE(bits(ma) == bits(mb));
        REQUIRE(bits(va) == bits(vb));
      }
    }
  }
}

TEST_CASE("vector AdamW steps equal portable steps bit for bit over every moment format") {
  std::int64_t const n = 9000 + 37;  // more than one chunk, a partial block and a vector tail
  for (adamw_state_options const& o : state_options()) {
    CAPTURE(format_name(o.m));
    CAPTURE(format_name(o.v));
    CAPTURE(static_cast<int>(o.v_rounding));
    std::vector<float> const p0 = gradients(n, 1);
    // float parameters, float and int8-view gradients
    {
      adamw_state a(n, o), b(n, o);
      std::vector<float> pa = p0, pb = p0;
      for (int t = 0; t < 4; ++t) {
        std::vector<float> g = gradients(n, 10 + static_cast<std::uint64_t>(t));
        if (t == 0) {
          for (float& x : g) x = numeric::is_finite(x) ? x : 0.0f;  // every moment non-zero
        }
        if (t == 3) {
          quantized_tensor gq(spec::parse("int8_g128_sym_sr_f32"), 1, n);
          for (float& x : g) x = numeric::is_finite(x) ? x : 1.0f;
          quantize(host, as_row(g.data(), n), gq.view(), {7, 0});
          REQUIRE(adamw_step(portable, a, test_hyper(), std::span<float>(pa),
                             std::as_const(gq).view()) == adamw_step(host, b, test_hyper(),
                                                                     std::span<float>(pb),
                                                                     std::as_const(gq).view()));
        } else {
          REQUIRE(adamw_step(portable, a, test_hyper(), std::span<float>(pa),
                             std::span<float const>(g)) == adamw_step(host, b, test_hyper(),
                                                                      std::span<float>(pb),
                                                                      std::span<float const>(g)));
        }
        REQUIRE(bits(pa) == bits(pb));
        require_same_state(a, b);
      }
    }
    // bfloat16 weights with and without a master copy, bfloat16 gradients
    for (int with_master = 0; with_master < 2; ++with_master) {
      CAPTURE(with_master);
      adamw_state a(n, o), b(n, o);
      std::vector<bfloat16> wa(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < wa.size(); ++i) wa[i] = numeric::from_float<bfloat16>(p0[i]);
      std::vector<bfloat16> wb = wa;
      std::vector<float> ma = p0, mb = p0;
      std::span<float> const sa = with_master ? std::span<float>(ma) : std::span<float>();
      std::span<float> const sb = with_master ? std::span<float>(mb) : std::span<float>();
      for (int t = 0; t < 3; ++t) {
        std::vector<float> const gf = gradients(n, 20 + static_cast<std::uint64_t>(t));
        std::vector<bfloat16> g(gf.size());
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = numeric::from_float<bfloat16>(gf[i]);
        REQUIRE(adamw_step(portable, a, test_hyper(), std::span<bfloat16>(wa), sa,
                           std::span<bfloat16 const>(g)) ==
                adamw_step(host, b, test_hyper(), std::span<bfloat16>(wb), sb,
                           std::span<bfloat16 const>(g)));
        REQUIRE(bits(wa) == bits(wb));
        REQUIRE(bits(ma) == bits(mb));
        require_same_state(a, b);
      }
    }
  }
}
