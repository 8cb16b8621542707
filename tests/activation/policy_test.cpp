#include <agoq/activation/policy.hpp>

#include <doctest/doctest.h>

#include <vector>

using namespace agoq::activation;
using agoq::spec;

namespace {
/// Every tensor at int8, with int2/int8/precise candidates for the MLP.
struct int8_everywhere {
  static storage default_storage(tensor_kind) { return storage::with(int8_g128); }
  static std::vector<storage> candidates(tensor_kind k) {
    if (category_of(k) == tensor_category::activation_input)
      return {storage::parse("int2_g128_sym_rne_f32"), storage::with(int8_g128),
              storage::precise()};
    return {storage::with(int8_g128)};
  }
};
}  // namespace

TEST_CASE("the default policy follows the categories") {
  policy_table const t;
  CHECK(t.default_storage(tensor_kind::query).is_precise());
  CHECK(t.default_storage(tensor_kind::softmax_lse).is_precise());
  CHECK(t.default_storage(tensor_kind::attention_output).is_precise());
  CHECK(t.default_storage(tensor_kind::o_proj_input).is_precise());  // the attention output
  CHECK(t.default_storage(tensor_kind::qkv_input).name() == "int4_g128_sym_rne_f32");
  CHECK(t.default_storage(tensor_kind::swiglu_output).name() == "int4_g128_sym_rne_f32");
  CHECK(t.default_storage(tensor_kind::gate_output).name() == "int4_g128_sym_rne_f32");
  CHECK(t.default_storage(tensor_kind::gelu_input).name() == "int4_g128_sym_rne_f32");
  CHECK(t.default_storage(tensor_kind::attn_norm_input).name() == "int8_g128_sym_rne_f32");
  CHECK(t.default_storage(tensor_kind::ln2_input).name() == "int8_g128_sym_rne_f32");
  CHECK(t.candidates(tensor_kind::key).size() == 1);
  CHECK(t.candidates(tensor_kind::mlp_input).size() == 3);
  CHECK(t.candidates(tensor_kind::mlp_norm_input).size() == 2);
  CHECK(storage::precise().name() == "bf16");
  CHECK(storage::precise().name(4) == "fp32");
  CHECK(storage::precise().bits() == 16);
  CHECK(storage::with(int4_g128).bits() == 4);
}

TEST_CASE("a compile-time policy and run-time edits") {
  static_assert(activation_policy<int8_everywhere>);
  policy_table t = policy_table::from<int8_everywhere>();
  CHECK(t.default_storage(tensor_kind::query) == storage::with(int8_g128));
  CHECK(t.candidates(tensor_kind::up_output).front().name() == "int2_g128_sym_rne_f32");
  t.fix(tensor_kind::query, storage::precise());
  CHECK(t.candidates(tensor_kind::query) == std::vector<storage>{storage::precise()});
  t.set(tensor_kind::value, storage::precise(),
        {storage::precise(), storage::with(int8_g128), storage::precise()});
  CHECK(t.candidates(tensor_kind::value).size() == 2);  // duplicate removed
  CHECK_THROWS_WITH_AS(t.set(tensor_kind::key, storage::precise(), {storage::with(int4_g128)}),
                       doctest::Contains("not among its candidates"), agoq::invalid_argument);
  CHECK_THROWS_WITH_AS(t.fix(tensor_kind::o_proj_input, storage::precise()),
                       doctest::Contains("attention_output"), agoq::invalid_argument);
  CHECK_THROWS_AS(t.set(tensor_kind::key, storage::precise(), {}), agoq::invalid_argument);
  spec bad = int4_g128;
  bad.bits = 3;
  CHECK_THROWS_AS(t.fix(tensor_kind::key, storage::with(bad)), agoq::invalid_argument);
  policy_table const p = policy_table::all_precise();
  for (tensor_kind k : all_tensor_kinds) CHECK(p.default_storage(k).is_precise());
}

TEST_CASE("storage bytes follow the layout") {
  saved_shape const s{8, 4096, 2};
  CHECK(storage::precise().bytes(s) == 8 * 4096 * 2);
  // int4: 8 rows x 2048 code bytes, then 8 x 32 f32 scales.
  CHECK(storage::with(int4_g128).bytes(s) == 16384 + 1024);
  // int8: 32768 code bytes, then the scales.
  CHECK(storage::with(int8_g128).bytes(s) == 32768 + 1024);
  CHECK(storage::parse("bf16").is_precise());
  CHECK(storage::parse("int4_g128_sym_rne_f32") == storage::with(int4_g128));
  CHECK_THROWS_AS(storage::parse("int5_g128_sym_rne_f32"), agoq::invalid_argument);
}
