// Type and shape inference of the transformer, loss, normalisation and
// recurrent operators (src/ops/transformer_ops.cc, loss_ops.cc,
// normalization_ops.cc, recurrent_ops.cc).
#include <gtest/gtest.h>

#include "kiln/graph_builder.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

using testing::failsWith;
using testing::inferredType;
using testing::inferredTypes;
using Ints = std::vector<int64_t>;
using Strings = std::vector<std::string>;

TEST(Attention, FourDimensionalWithPastAndScores) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF32, {2, 8, 3, 16});
  const ValueId k = b.input("k", DType::kF32, {2, 2, 3, 16});
  const ValueId v = b.input("v", DType::kF32, {2, 2, 3, 10});
  const ValueId pk = b.input("pk", DType::kF32, {2, 2, 5, 16});
  const ValueId pv = b.input("pv", DType::kF32, {2, 2, 5, 10});
  const auto outs = b.ops("Attention", {q, k, v, kNoValue, pk, pv}, 4);
  EXPECT_EQ(inferredTypes(b, outs, 23), (Strings{"f32[2, 8, 3, 10]", "f32[2, 2, 8, 16]", "f32[2, 2, 8, 10]",
                                                 "f32[2, 8, 3, 8]"}));
}

TEST(Attention, ThreeDimensionalNeedsHeadCounts) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF16, {1, 4, 24});
  const ValueId k = b.input("k", DType::kF16, {1, 6, 12});
  const ValueId v = b.input("v", DType::kF16, {1, 6, 6});
  const ValueId y = b.op("Attention", {q, k, v}, {{"q_num_heads", int64_t{4}}, {"kv_num_heads", int64_t{2}}});
  EXPECT_EQ(inferredType(b, y, 23), "f16[1, 4, 12]");
  GraphBuilder missing;
  const ValueId mq = missing.input("q", DType::kF32, {1, 4, 24});
  missing.op("Attention", {mq, mq, mq});
  EXPECT_TRUE(failsWith(missing, "q_num_heads", 23));
}

TEST(TransformerOps, RotaryRmsNormSwiglu) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 2, 3, 8});
  const ValueId cache = b.input("cache", DType::kF32, {1, 3, 4});
  const ValueId rotary = b.op("RotaryEmbedding", {x, cache, cache});
  const ValueId rms = b.op("RMSNormalization", {x, cache}, {{"axis", int64_t{-2}}});
  const ValueId swiglu = b.op("SwiGLU", {x, x});
  EXPECT_EQ(inferredTypes(b, {rotary, rms, swiglu}, 28), (Strings{"f32[1, 2, 3, 8]", "f32[1, 2, 3, 8]", "f32[1, 2, 3, 8]"}));
  GraphBuilder bad;
  const ValueId bx = bad.input("x", DType::kF32, {2, 3});
  bad.op("RMSNormalization", {bx, bx}, {{"axis", int64_t{2}}});
  EXPECT_TRUE(failsWith(bad, "axis", 23));
}

TEST(Losses, ReductionsAndLogProbabilities) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {4, 5, 6});
  const ValueId t = b.input("t", DType::kI64, {4, 6});
  const ValueId none = b.op("NegativeLogLikelihoodLoss", {x, t}, {{"reduction", std::string("none")}});
  const ValueId mean = b.op("NegativeLogLikelihoodLoss", {x, t});
  const auto sce = b.ops("SoftmaxCrossEntropyLoss", {x, t}, 2, {{"reduction", std::string("sum")}});
  EXPECT_EQ(inferredTypes(b, {none, mean, sce[0], sce[1]}, 13),
            (Strings{"f32[4, 6]", "f32[]", "f32[]", "f32[4, 5, 6]"}));
  GraphBuilder bad;
  const ValueId bx = bad.input("x", DType::kF32, {4, 5, 6});
  const ValueId bt = bad.input("t", DType::kI64, {4, 5});
  bad.op("NegativeLogLikelihoodLoss", {bx, bt});
  EXPECT_TRUE(failsWith(bad, "does not match the input", 13));
}

TEST(Normalizations, LpAndMeanVariance) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 4, 5});
  const ValueId lp = b.op("LpNormalization", {x}, {{"p", int64_t{1}}});
  const ValueId mvn = b.op("MeanVarianceNormalization", {x});
  EXPECT_EQ(inferredTypes(b, {lp, mvn}, 13), (Strings{"f32[2, 3, 4, 5]", "f32[2, 3, 4, 5]"}));
  GraphBuilder bad;
  bad.op("LpNormalization", {bad.input("x", DType::kF32, {2})}, {{"p", int64_t{3}}});
  EXPECT_TRUE(failsWith(bad, "p is 3", 13));
}

TEST(Recurrent, LayoutsAndDirections) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {7, 2, 3});  // [seq, batch, input]
  const ValueId w = b.input("w", DType::kF32, {2, 20, 3});
  const ValueId r = b.input("r", DType::kF32, {2, 20, 5});
  const auto lstm = b.ops("LSTM", {x, w, r}, 3, {{"hidden_size", int64_t{5}}, {"direction", std::string("bidirectional")}});
  const ValueId xb = b.input("xb", DType::kF32, {2, 7, 3});  // [batch, seq, input]
  const ValueId wg = b.input("wg", DType::kF32, {1, 15, 3});
  const ValueId rg = b.input("rg", DType::kF32, {1, 15, 5});
  const auto gru = b.ops("GRU", {xb, wg, rg}, 2, {{"hidden_size", int64_t{5}}, {"layout", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {lstm[0], lstm[1], lstm[2], gru[0], gru[1]}, 22),
            (Strings{"f32[7, 2, 2, 5]", "f32[2, 2, 5]", "f32[2, 2, 5]", "f32[2, 7, 1, 5]", "f32[2, 1, 5]"}));
  GraphBuilder bad;
  const ValueId bx = bad.input("x", DType::kF32, {7, 2, 3});
  bad.op("RNN", {bx, bad.input("w", DType::kF32, {1, 4, 3}), bad.input("r", DType::kF32, {1, 5, 5})},
         {{"hidden_size", int64_t{5}}});
  EXPECT_TRUE(failsWith(bad, "W [1, 4, 3] must be [1, 5, input size]", 22));
}

}  // namespace
}  // namespace kiln
