#include <agoq/scheme/dispatch.hpp>

#include <set>
#include <string>

#include <doctest/doctest.h>

using namespace agoq;

namespace {

template <class... Ts>
constexpr std::size_t list_size(type_list<Ts...>) {
  return sizeof...(Ts);
}

// Every spec of the dispatch set, built from the runtime side.
std::vector<spec> dispatch_set_specs() {
  std::vector<spec> out;
  for (char const* code : {"int2_", "int4_", "int8_", "fp8e4m3_", "fp8e5m2_"}) {
    for (char const* g : {"tensor", "row", "col", "g32", "g64", "g128", "g256", "b128x128"}) {
      bool const is_int = std::string(code).starts_with("int");
      for (char const* sym : {"_sym", "_asym"}) {
        if (!is_int && std::string(sym) == "_asym") continue;
        for (char const* r : {"_rne", "_sr"}) {
          for (char const* sc : {"_f32", "_bf16", "_e8m0"}) {
            out.push_back(spec::parse(std::string(code) + g + (is_int ? sym : "") + r + sc));
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

static_assert(quant_scheme<scheme<int_sym<4>, per_group<128>>>);
static_assert(!quant_scheme<int>);
static_assert(scheme<int_sym<4>, per_group<128>>::to_spec().group_cols == 128);
static_assert(mxfp8_e4m3::to_spec().scale == scale_format::e8m0);

TEST_CASE("dispatch maps every spec of the set onto its scheme type") {
  std::vector<spec> const all = dispatch_set_specs();
  CHECK(all.size() == list_size(dispatch_codes{}) * list_size(dispatch_groupings{}) *
                          list_size(dispatch_roundings{}) * list_size(dispatch_scales{}));
  std::set<std::string> names;
  for (spec const& s : all) {
    spec const back = dispatch(s, [](auto sch) { return decltype(sch)::to_spec(); });
    INFO(s.name());
    CHECK(back == s);
    names.insert(back.name());
  }
  CHECK(names.size() == all.size());
}

TEST_CASE("scheme::to_spec prints the expected names") {
  CHECK(scheme<int_sym<4>, per_group<128>>::to_spec().name() == "int4_g128_sym_rne_f32");
  CHECK(scheme<uint_asym<8>, per_row, round_stochastic, scale_bf16>::to_spec().name() ==
        "int8_row_asym_sr_bf16");
  CHECK(scheme<fp8_e5m2, per_block<128, 128>>::to_spec().name() == "fp8e5m2_b128x128_rne_f32");
  CHECK(mxint8::to_spec().name() == "int8_g32_sym_rne_e8m0");
}

TEST_CASE("specs outside the dispatch set throw unsupported_scheme") {
  CHECK_THROWS_WITH_AS(dispatch(spec::parse("int4_g48_sym_rne_f32"), [](auto) { return 0; }),
                       doctest::Contains("grouping outside the dispatch set"),
                       agoq::unsupported_scheme);
  CHECK_THROWS_WITH_AS(dispatch(spec::parse("int4_b64x64_sym_rne_f32"), [](auto) { return 0; }),
                       doctest::Contains("grouping outside the dispatch set"),
                       agoq::unsupported_scheme);
  spec bad;
  bad.bits = 3;
  CHECK_THROWS_AS(dispatch(bad, [](auto) { return 0; }), agoq::invalid_argument);
}

TEST_CASE("dispatch_code over a code list of the caller's") {
  using list = type_list<int_sym<4>, fp8_e4m3>;
  static_assert(code_list<list> && code_list<dispatch_codes>);
  static_assert(!code_list<type_list<>> && !code_list<type_list<float>> && !code_list<int_sym<4>>);
  CHECK(dispatch_code<list>(spec::parse("int4_g64_sym_sr_f32"),
                            [](auto c) { return decltype(c)::bits; }) == 4);
  CHECK(dispatch_code<list>(spec::parse("fp8e4m3_row_rne_f32"),
                            [](auto c) { return decltype(c)::kind == code_kind::fp8_e4m3; }));
  // int8 and int4 asymmetric share a kind or a width with the list's families, not both.
  for (char const* name : {"int8_g64_sym_rne_f32", "int4_g64_asym_rne_f32"}) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(dispatch_code<list>(spec::parse(name), [](auto) { return 0; }),
                         doctest::Contains("outside the code list the call was compiled for"),
                         agoq::unsupported_scheme);
    CHECK(dispatch_code(spec::parse(name), [](auto) { return 1; }) == 1);
  }
}

TEST_CASE("dispatch of a void callable") {
  int calls = 0;
  dispatch_code(spec::parse("fp8e5m2_row_rne_f32"), [&](auto c) {
    CHECK(decltype(c)::kind == code_kind::fp8_e5m2);
    ++calls;
  });
  CHECK(calls == 1);
}
