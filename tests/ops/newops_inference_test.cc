// Type and shape inference of LinearAttention and CausalConvWithState
// (src/ops/linear_attention_ops.cc), FlexAttention and its kiln parts
// (flex_attention_ops.cc) and the ai.onnx.ml operators (ml_ops.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kiln/graph_builder.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

using testing::failsWith;
using testing::inferredTypes;
using Strings = std::vector<std::string>;

TEST(LinearAttention, GatedDeltaWithGroupedHeads) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF32, {2, 5, 8 * 4});  // 8 query heads of d_k 4
  const ValueId k = b.input("k", DType::kF32, {2, 5, 2 * 4});
  const ValueId v = b.input("v", DType::kF32, {2, 5, 2 * 3});
  const ValueId decay = b.input("g", DType::kF32, {2, 5, 2});
  const ValueId beta = b.input("beta", DType::kF32, {2, 5, 1});
  const auto outs = b.ops("LinearAttention", {q, k, v, kNoValue, decay, beta}, 2,
                          {{"q_num_heads", int64_t{8}}, {"kv_num_heads", int64_t{2}}});
  EXPECT_EQ(inferredTypes(b, outs, 27), (Strings{"f32[2, 5, 24]", "f32[2, 2, 4, 3]"}));
}

TEST(LinearAttention, StateTypeFollowsPastState) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF16, {1, 1, 4});
  const ValueId past = b.input("past", DType::kF32, {1, 1, 4, 4});
  const auto outs = b.ops("LinearAttention", {q, q, q, past}, 2,
                          {{"q_num_heads", int64_t{1}}, {"kv_num_heads", int64_t{1}}, {"update_rule", std::string("linear")}});
  EXPECT_EQ(inferredTypes(b, outs, 27), (Strings{"f16[1, 1, 4]", "f32[1, 1, 4, 4]"}));
}

TEST(LinearAttention, RulesRequireAndForbidInputs) {
  GraphBuilder gated;
  const ValueId x = gated.input("x", DType::kF32, {1, 2, 4});
  gated.ops("LinearAttention", {x, x, x}, 2, {{"q_num_heads", int64_t{1}}, {"kv_num_heads", int64_t{1}},
                                               {"update_rule", std::string("gated")}});
  EXPECT_TRUE(failsWith(gated, "requires the decay input", 27));
  GraphBuilder linear;
  const ValueId y = linear.input("x", DType::kF32, {1, 2, 4});
  linear.ops("LinearAttention", {y, y, y, kNoValue, kNoValue, y}, 2,
             {{"q_num_heads", int64_t{1}}, {"kv_num_heads", int64_t{1}}, {"update_rule", std::string("linear")}});
  EXPECT_TRUE(failsWith(linear, "forbids the beta input", 27));
  GraphBuilder heads;
  const ValueId z = heads.input("x", DType::kF32, {1, 2, 4});
  heads.ops("LinearAttention", {z, z, z}, 2, {{"q_num_heads", int64_t{3}}, {"kv_num_heads", int64_t{2}},
                                              {"update_rule", std::string("linear")}});
  EXPECT_TRUE(failsWith(heads, "positive multiple", 27));
}

TEST(CausalConvWithState, OutputAndCarry) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 6, 9});
  const ValueId w = b.input("w", DType::kF32, {6, 1, 4});
  const auto outs = b.ops("CausalConvWithState", {x, w}, 2, {{"activation", std::string("silu")}});
  EXPECT_EQ(inferredTypes(b, outs, 27), (Strings{"f32[2, 6, 9]", "f32[2, 6, 3]"}));
  GraphBuilder bad;
  const ValueId bx = bad.input("x", DType::kF32, {2, 6, 9});
  bad.ops("CausalConvWithState", {bx, bx}, 2, {{"activation", std::string("relu")}});
  EXPECT_TRUE(failsWith(bad, "activation 'relu'", 27));
}

void inferAt(GraphBuilder& b, const std::map<std::string, int64_t>& opsets) {
  GraphPtr graph = b.build();
  inferTypes(*graph, opsets);
}

TEST(FlexAttention, GroupedHeadsAndParts) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF64, {2, 4, 3, 8});
  const ValueId k = b.input("k", DType::kF64, {2, 2, 5, 8});
  const ValueId v = b.input("v", DType::kF64, {2, 2, 5, 6});
  const ValueId y = b.op("FlexAttention", {q, k, v}, {}, "ai.onnx.preview");
  const ValueId scores = b.op("FlexAttentionScores", {q, k}, {}, "kiln");
  const ValueId out = b.op("FlexAttentionOutput", {scores, v}, {{"softmax", int64_t{1}}}, "kiln");
  GraphPtr graph = b.build();
  inferTypes(*graph, {{"", 26}, {"ai.onnx.preview", 1}});
  EXPECT_EQ(graph->value(y).type.toString(), "f64[2, 4, 3, 6]");
  EXPECT_EQ(graph->value(scores).type.toString(), "f64[2, 4, 3, 5]");
  EXPECT_EQ(graph->value(out).type.toString(), "f64[2, 4, 3, 6]");
}

TEST(FlexAttention, RejectsUnevenHeadsAndOtherPrecisions) {
  GraphBuilder heads;
  const ValueId q = heads.input("q", DType::kF32, {1, 3, 2, 4});
  const ValueId k = heads.input("k", DType::kF32, {1, 2, 2, 4});
  heads.op("FlexAttention", {q, k, k}, {}, "ai.onnx.preview");
  EXPECT_THROW(inferAt(heads, {{"ai.onnx.preview", 1}}), GraphError);
  GraphBuilder precision;
  const ValueId x = precision.input("x", DType::kF32, {1, 2, 2, 4});
  precision.op("FlexAttention", {x, x, x}, {{"softmax_precision", int64_t{11}}}, "ai.onnx.preview");
  try {
    inferAt(precision, {{"ai.onnx.preview", 1}});
    ADD_FAILURE() << "expected an error";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax_precision 11 is not supported"), std::string::npos) << e.what();
  }
}

ConstantPtr tensor(DType dtype, const std::vector<double>& values) {
  std::vector<std::byte> bytes(values.size() * dtypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      const auto v = static_cast<float>(values[i]);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else {
      bytes[i] = static_cast<std::byte>(values[i]);  // u8
    }
  }
  return makeConstant(TensorInfo{dtype, {static_cast<int64_t>(values.size())}}, std::move(bytes));
}

// One stump: feature 0 <= 0.5 goes to leaf 0, else leaf 1.
Attributes stump() {
  return {{"nodes_featureids", std::vector<int64_t>{0}},
          {"nodes_splits", tensor(DType::kF32, {0.5})},
          {"nodes_modes", tensor(DType::kU8, {0})},
          {"nodes_truenodeids", std::vector<int64_t>{0}},
          {"nodes_falsenodeids", std::vector<int64_t>{1}},
          {"nodes_trueleafs", std::vector<int64_t>{1}},
          {"nodes_falseleafs", std::vector<int64_t>{1}},
          {"leaf_targetids", std::vector<int64_t>{0, 2}},
          {"leaf_weights", tensor(DType::kF32, {1, 2})},
          {"tree_roots", std::vector<int64_t>{0}}};
}

TEST(MlOps, ShapesOfTheNumericOperators) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 5});
  const ValueId row = b.input("row", DType::kI64, {5});
  const ValueId indices = b.input("indices", DType::kI64, {1, 2});
  const ValueId picked = b.op("ArrayFeatureExtractor", {x, indices}, {}, "ai.onnx.ml");
  const ValueId picked_row = b.op("ArrayFeatureExtractor", {row, indices}, {}, "ai.onnx.ml");
  const ValueId binary = b.op("Binarizer", {x}, {{"threshold", 0.5f}}, "ai.onnx.ml");
  const ValueId trees = b.op("TreeEnsemble", {x}, stump(), "ai.onnx.ml");
  GraphPtr graph = b.build();
  inferTypes(*graph, {{"ai.onnx.ml", 5}});
  EXPECT_EQ(graph->value(picked).type.toString(), "f32[3, 2]");
  EXPECT_EQ(graph->value(picked_row).type.toString(), "i64[1, 2]");
  EXPECT_EQ(graph->value(binary).type.toString(), "f32[3, 5]");
  EXPECT_EQ(graph->value(trees).type.toString(), "f32[3, 3]");  // n_targets: the largest target id + 1
}

TEST(MlOps, TreeEnsembleChecksItsAttributes) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 5});
  Attributes attributes = stump();
  attributes["leaf_targetids"] = std::vector<int64_t>{0};
  b.op("TreeEnsemble", {x}, attributes, "ai.onnx.ml");
  try {
    inferAt(b, {{"ai.onnx.ml", 5}});
    ADD_FAILURE() << "expected an error";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("leaf_targetids has 1 entries, leaf_weights 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
