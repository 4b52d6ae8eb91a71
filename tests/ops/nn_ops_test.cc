// Type and shape inference of the neural-network operators
// (src/ops/nn_ops.cc): convolution, pooling, MatMul, Gemm, normalisation,
// Softmax.
#include <gtest/gtest.h>

#include <sstream>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

using testing::failsWith;
using testing::inferredType;
using testing::inferredTypes;
using testing::parseType;

using Ints = std::vector<int64_t>;

// Weights of the given shape, zero-filled (only the shape matters here).
ValueId weights(GraphBuilder& b, const std::string& name, const Ints& dims) {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;
  return b.constant<float>(name, dims, std::vector<float>(static_cast<size_t>(count)));
}

// ------------------------------------------------------------------- Conv

TEST(Conv, ResNetStem) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 3, 224, 224});
  const ValueId w = weights(b, "w", {64, 3, 7, 7});
  const ValueId bias = weights(b, "b", {64});
  const ValueId y = b.op("Conv", {x, w, bias}, {{"strides", Ints{2, 2}}, {"pads", Ints{3, 3, 3, 3}}});
  const ValueId explicit_kernel = b.op("Conv", {x, w}, {{"kernel_shape", Ints{7, 7}}});
  EXPECT_EQ(inferredTypes(b, {y, explicit_kernel}),
            (std::vector<std::string>{"f32[1, 64, 112, 112]", "f32[1, 64, 218, 218]"}));
}

TEST(Conv, AutoPadAndDilations) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 8, 15, 15});
  const ValueId w = weights(b, "w", {16, 8, 3, 3});
  const ValueId upper = b.op("Conv", {x, w}, {{"auto_pad", std::string("SAME_UPPER")}, {"strides", Ints{2, 2}}});
  const ValueId lower = b.op("Conv", {x, w}, {{"auto_pad", std::string("SAME_LOWER")}});
  const ValueId valid = b.op("Conv", {x, w}, {{"auto_pad", std::string("VALID")}, {"strides", Ints{2, 1}}});
  const ValueId dilated = b.op("Conv", {x, w}, {{"dilations", Ints{2, 3}}, {"pads", Ints{1, 0, 1, 0}}});
  EXPECT_EQ(
      inferredTypes(b, {upper, lower, valid, dilated}),
      (std::vector<std::string>{"f32[1, 16, 8, 8]", "f32[1, 16, 15, 15]", "f32[1, 16, 7, 13]", "f32[1, 16, 13, 9]"}));
}

TEST(Conv, SymbolicSizes) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 3, H, W]"));
  const ValueId w = weights(b, "w", {32, 3, 3, 3});
  const ValueId same = b.op("Conv", {x, w}, {{"pads", Ints{1, 1, 1, 1}}});
  const ValueId strided = b.op("Conv", {x, w}, {{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}});
  const ValueId auto_same = b.op("Conv", {x, w}, {{"auto_pad", std::string("SAME_UPPER")}});
  const ValueId unknown_weights = b.op("Conv", {x, b.input("v", parseType("f32[M, 3, ?, ?]"))});
  EXPECT_EQ(inferredTypes(b, {same, strided, auto_same, unknown_weights}),
            (std::vector<std::string>{"f32[N, 32, H, W]", "f32[N, 32, ?, ?]", "f32[N, 32, H, W]", "f32[N, M, ?, ?]"}));
}

TEST(Conv, GroupsOneAndThreeDimensions) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 32, 10, 10});
  const ValueId depthwise = b.op("Conv", {x, weights(b, "w", {32, 1, 3, 3})}, {{"group", int64_t{32}}});
  const ValueId grouped = b.op("Conv", {x, weights(b, "g", {64, 8, 1, 1})}, {{"group", int64_t{4}}});
  const ValueId one_d =
      b.op("Conv", {b.input("s", DType::kF32, {2, 4, 100}), weights(b, "k", {8, 4, 5})}, {{"strides", Ints{5}}});
  const ValueId three_d =
      b.op("Conv", {b.input("v", DType::kF16, {1, 2, 8, 8, 8}), b.input("kw", DType::kF16, {4, 2, 3, 3, 3})});
  EXPECT_EQ(
      inferredTypes(b, {depthwise, grouped, one_d, three_d}),
      (std::vector<std::string>{"f32[1, 32, 8, 8]", "f32[1, 64, 10, 10]", "f32[2, 8, 20]", "f16[1, 4, 6, 6, 6]"}));
}

TEST(Conv, InvalidInputsAreRefused) {
  GraphBuilder channels;
  channels.op("Conv", {channels.input("x", DType::kF32, {1, 3, 8, 8}), weights(channels, "w", {16, 4, 3, 3})});
  EXPECT_TRUE(failsWith(channels,
                        "the input [1, 3, 8, 8] has 3 channels but the weights [16, 4, 3, 3] take 4 "
                        "(4 per group x 1 groups)"));
  GraphBuilder groups;
  groups.op("Conv", {groups.input("x", DType::kF32, {1, 4, 8, 8}), weights(groups, "w", {6, 1, 3, 3})},
            {{"group", int64_t{4}}});
  EXPECT_TRUE(failsWith(groups, "the 6 output channels of the weights [6, 1, 3, 3] do not divide into 4 groups"));
  GraphBuilder rank;
  rank.op("Conv", {rank.input("x", DType::kF32, {3, 8}), weights(rank, "w", {4, 3})});
  EXPECT_TRUE(failsWith(rank, "needs an input [N, C, spatial...] of rank 3 or more, found [3, 8]"));
  GraphBuilder kernel;
  kernel.op("Conv", {kernel.input("x", DType::kF32, {1, 3, 8, 8}), weights(kernel, "w", {4, 3, 3, 3})},
            {{"kernel_shape", Ints{5, 5}}});
  EXPECT_TRUE(failsWith(kernel, "kernel_shape [5, 5] differs from the weights' spatial sizes [3, 3]"));
  GraphBuilder small;
  small.op("Conv", {small.input("x", DType::kF32, {1, 3, 2, 8}), weights(small, "w", {4, 3, 3, 3})});
  EXPECT_TRUE(failsWith(small,
                        "spatial axis 0: the kernel spans 3 elements (dilations included) but the padded "
                        "input has 2"));
  GraphBuilder strides;
  strides.op("Conv", {strides.input("x", DType::kF32, {1, 3, 8, 8}), weights(strides, "w", {4, 3, 3, 3})},
             {{"strides", Ints{2}}});
  EXPECT_TRUE(failsWith(strides, "attribute 'strides' has 1 values, but the input has 2 spatial axes"));
  GraphBuilder pad;
  pad.op("Conv", {pad.input("x", DType::kF32, {1, 3, 8, 8}), weights(pad, "w", {4, 3, 3, 3})},
         {{"auto_pad", std::string("SAME")}});
  EXPECT_TRUE(failsWith(pad, "auto_pad is 'SAME', not NOTSET, VALID, SAME_UPPER or SAME_LOWER"));
  GraphBuilder bias;
  bias.op("Conv",
          {bias.input("x", DType::kF32, {1, 3, 8, 8}), weights(bias, "w", {4, 3, 3, 3}), weights(bias, "b", {3})});
  EXPECT_TRUE(failsWith(bias, "the bias [3] must be [4], one value per output channel"));
}

TEST(ConvTranspose, UpsamplesBackToTheInputSize) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 16, 8, 8]"));
  const ValueId w = weights(b, "w", {16, 8, 4, 4});
  const ValueId y = b.op("ConvTranspose", {x, w}, {{"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}});
  const ValueId padded = b.op("ConvTranspose", {x, w}, {{"strides", Ints{2, 2}}, {"output_padding", Ints{1, 0}}});
  const ValueId shaped = b.op("ConvTranspose", {x, w}, {{"strides", Ints{2, 2}}, {"output_shape", Ints{17, 18}}});
  const ValueId same =
      b.op("ConvTranspose", {x, w}, {{"strides", Ints{3, 3}}, {"auto_pad", std::string("SAME_UPPER")}});
  const ValueId grouped = b.op("ConvTranspose", {x, weights(b, "g", {16, 4, 3, 3})}, {{"group", int64_t{4}}});
  EXPECT_EQ(inferredTypes(b, {y, padded, shaped, same, grouped}),
            (std::vector<std::string>{"f32[N, 8, 16, 16]", "f32[N, 8, 19, 18]", "f32[N, 8, 17, 18]",
                                      "f32[N, 8, 24, 24]", "f32[N, 16, 10, 10]"}));

  GraphBuilder symbolic;
  const ValueId z = symbolic.input("z", parseType("f32[1, 16, H, 8]"));
  const ValueId k3 = weights(symbolic, "w", {16, 8, 3, 3});
  const ValueId kept = symbolic.op("ConvTranspose", {z, k3}, {{"pads", Ints{1, 1, 1, 1}}});
  EXPECT_EQ(inferredType(symbolic, kept), "f32[1, 8, H, 8]");

  GraphBuilder bad;
  bad.op("ConvTranspose", {bad.input("x", DType::kF32, {1, 3, 8, 8}), weights(bad, "w", {16, 8, 3, 3})});
  EXPECT_TRUE(failsWith(bad, "the input [1, 3, 8, 8] has 3 channels but the weights [16, 8, 3, 3] take 16"));
}

// ---------------------------------------------------------------- Pooling

TEST(Pooling, MaxPoolWithIndices) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 64, 112, 112]"));
  const auto pooled =
      b.ops("MaxPool", {x}, 2, {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}});
  EXPECT_EQ(inferredTypes(b, pooled), (std::vector<std::string>{"f32[N, 64, 56, 56]", "i64[N, 64, 56, 56]"}));

  GraphBuilder old;  // the Indices output is opset 8's
  old.ops("MaxPool", {old.input("x", DType::kF32, {1, 1, 4, 4})}, 2, {{"kernel_shape", Ints{2, 2}}});
  EXPECT_TRUE(failsWith(old, "has 1 to 1 outputs, found 2", 7));
}

TEST(Pooling, CeilModeAndTheLastWindow) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 1, 5, 5});
  const Attributes floor{{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}};
  Attributes ceil = floor;
  ceil["ceil_mode"] = int64_t{1};
  Attributes padded = ceil;
  padded["pads"] = Ints{1, 1, 1, 1};  // a 4th window would start in the right padding: dropped
  const ValueId down = b.op("MaxPool", {x}, floor);
  const ValueId up = b.op("MaxPool", {x}, ceil);
  const ValueId last = b.op("AveragePool", {x}, padded);
  const ValueId dilated = b.op("MaxPool", {x}, {{"kernel_shape", Ints{2, 2}}, {"dilations", Ints{2, 3}}});
  EXPECT_EQ(inferredTypes(b, {down, up, last, dilated}),
            (std::vector<std::string>{"f32[1, 1, 2, 2]", "f32[1, 1, 3, 3]", "f32[1, 1, 3, 3]", "f32[1, 1, 3, 2]"}));
}

TEST(Pooling, AverageLpAndGlobal) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, C, 7, W]"));
  const ValueId avg = b.op("AveragePool", {x}, {{"kernel_shape", Ints{7, 1}}, {"count_include_pad", int64_t{1}}});
  const ValueId lp = b.op("LpPool", {x}, {{"kernel_shape", Ints{3, 3}}, {"auto_pad", std::string("VALID")}});
  const ValueId global_avg = b.op("GlobalAveragePool", {x});
  const ValueId global_max = b.op("GlobalMaxPool", {b.input("s", DType::kF32, {2, 4, 9})});
  EXPECT_EQ(inferredTypes(b, {avg, lp, global_avg, global_max}),
            (std::vector<std::string>{"f32[N, C, 1, W]", "f32[N, C, 5, ?]", "f32[N, C, 1, 1]", "f32[2, 4, 1]"}));

  GraphBuilder no_kernel;
  no_kernel.op("AveragePool", {no_kernel.input("x", DType::kF32, {1, 1, 4, 4})});
  EXPECT_TRUE(failsWith(no_kernel, "needs the 'kernel_shape' attribute"));
  GraphBuilder flat;
  flat.op("GlobalAveragePool", {flat.input("x", DType::kF32, {1, 4})});
  EXPECT_TRUE(failsWith(flat, "needs an input [N, C, spatial...] of rank 3 or more, found [1, 4]"));
}

// ------------------------------------------------------------ MatMul, Gemm

TEST(MatMul, NumpySemantics) {
  GraphBuilder b;
  const ValueId m = b.input("m", DType::kF32, {2, 3});
  const ValueId v = b.input("v", DType::kF32, {3});
  const ValueId w = b.input("w", DType::kF32, {3, 4});
  const ValueId batched = b.input("x", parseType("f32[batch, 1, 2, 3]"));
  const ValueId stack = b.input("y", DType::kF32, {5, 3, 4});
  EXPECT_EQ(inferredTypes(b, {b.op("MatMul", {m, w}), b.op("MatMul", {v, w}), b.op("MatMul", {m, v}),
                              b.op("MatMul", {v, v}), b.op("MatMul", {batched, stack}), b.op("MatMul", {batched, w})}),
            (std::vector<std::string>{"f32[2, 4]", "f32[4]", "f32[2]", "f32[]", "f32[batch, 5, 2, 4]",
                                      "f32[batch, 1, 2, 4]"}));
}

TEST(MatMul, SymbolicInnerAndErrors) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, seq, 768]"));
  const ValueId y = b.op("MatMul", {x, b.input("w", parseType("f32[768, hidden]"))});
  EXPECT_EQ(inferredType(b, y), "f32[batch, seq, hidden]");

  GraphBuilder inner;
  inner.op("MatMul", {inner.input("a", DType::kF32, {2, 3}), inner.input("b", DType::kF32, {4, 5})});
  EXPECT_TRUE(failsWith(inner, "cannot multiply [2, 3] by [4, 5]: the inner dimensions 3 and 4 differ"));
  GraphBuilder batch;
  batch.op("MatMul", {batch.input("a", DType::kF32, {2, 2, 3}), batch.input("b", DType::kF32, {3, 3, 4})});
  EXPECT_TRUE(failsWith(batch, "cannot broadcast [2] against [3]"));
  GraphBuilder scalar;
  scalar.op("MatMul", {scalar.input("a", DType::kF32, {}), scalar.input("b", DType::kF32, {3})});
  EXPECT_TRUE(failsWith(scalar, "needs inputs of rank 1 or more, found a scalar"));
  GraphBuilder dtype;
  dtype.op("MatMul", {dtype.input("a", DType::kF32, {2, 3}), dtype.input("b", DType::kF16, {3, 2})});
  EXPECT_TRUE(failsWith(dtype, "input 0 is f32 but input 1 is f16: they must match"));
}

TEST(Gemm, TransposesAndBroadcastsC) {
  GraphBuilder b;
  const ValueId a = b.input("a", parseType("f32[batch, 512]"));
  const ValueId w = weights(b, "w", {1000, 512});
  const ValueId c = weights(b, "c", {1000});
  const ValueId fc = b.op("Gemm", {a, w, c}, {{"transB", int64_t{1}}});
  const ValueId t =
      b.op("Gemm", {b.input("t", DType::kF32, {512, 7}), weights(b, "v", {512, 3})}, {{"transA", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {fc, t}), (std::vector<std::string>{"f32[batch, 1000]", "f32[7, 3]"}));

  GraphBuilder inner;
  inner.op("Gemm", {inner.input("a", DType::kF32, {2, 3}), inner.input("b", DType::kF32, {2, 3})});
  EXPECT_TRUE(failsWith(inner, "A [2, 3] (transA=0) and B [2, 3] (transB=0) have different inner dimensions, 3 and 2"));
  GraphBuilder bad_c;
  bad_c.op("Gemm", {bad_c.input("a", DType::kF32, {2, 3}), bad_c.input("b", DType::kF32, {3, 4}),
                    bad_c.input("c", DType::kF32, {3, 1})});
  EXPECT_TRUE(failsWith(bad_c, "C [3, 1] does not broadcast to the output [2, 4]"));
  GraphBuilder no_c;  // C is required before opset 11
  no_c.op("Gemm", {no_c.input("a", DType::kF32, {2, 3}), no_c.input("b", DType::kF32, {3, 4})});
  EXPECT_TRUE(failsWith(no_c, "takes 3 to 3 inputs, found 2", 10));
  GraphBuilder rank;
  rank.op("Gemm", {rank.input("a", DType::kF32, {2, 3, 4}), rank.input("b", DType::kF32, {4, 4})});
  EXPECT_TRUE(failsWith(rank, "input 0 must be 2-D, found [2, 3, 4]"));
}

// The kiln-domain fused forms (made by passes/matmul_fusion.cc) infer as the
// MatMul or Gemm they contain and check what they add.
TEST(FusedMatMul, InfersAsMatMulAndChecksBiasResidualAndActivation) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, seq, 64]"));
  const ValueId w = weights(b, "w", {64, 32});
  const ValueId residual = b.input("r", parseType("f32[batch, seq, 32]"));
  const Attributes gelu = {{"activation", std::string("Gelu")}};
  const ValueId y = b.op("FusedMatMul", {x, w, weights(b, "bias", {32}), residual}, gelu, "kiln");
  const ValueId no_bias = b.op("FusedMatMul", {x, w, kNoValue, residual}, {}, "kiln");
  const ValueId row_bias = b.op("FusedMatMul", {x, w, weights(b, "row", {1, 1, 32})}, {}, "kiln");
  const ValueId fc = b.op("FusedGemm", {b.input("a", DType::kF32, {3, 64}), weights(b, "v", {32, 64})},
                          {{"transB", int64_t{1}}, {"activation", std::string("Relu")}}, "kiln");
  EXPECT_EQ(inferredTypes(b, {y, no_bias, row_bias, fc}),
            (std::vector<std::string>{"f32[batch, seq, 32]", "f32[batch, seq, 32]", "f32[batch, seq, 32]", "f32[3, 32]"}));

  auto fused = [](const Ints& a, const Ints& bias, const Ints& added, const std::string& activation) {
    GraphBuilder g;
    std::vector<ValueId> inputs = {g.input("a", DType::kF32, a), weights(g, "w", {4, 5})};
    inputs.push_back(bias.empty() ? kNoValue : weights(g, "bias", bias));
    if (!added.empty()) inputs.push_back(g.input("r", DType::kF32, added));
    g.op("FusedMatMul", inputs, {{"activation", activation}}, "kiln");
    return g;
  };
  GraphBuilder bad_bias = fused({2, 4}, {2, 5}, {}, "Relu");
  EXPECT_TRUE(failsWith(bad_bias, "the bias [2, 5] must be [N] or [1, ..., N] for the output [2, 5]"));
  GraphBuilder long_bias = fused({2, 4}, {1, 1, 5}, {}, "Relu");
  EXPECT_TRUE(failsWith(long_bias, "the bias [1, 1, 5] must be [N] or [1, ..., N] for the output [2, 5]"));
  GraphBuilder bad_residual = fused({2, 4}, {5}, {1, 5}, "Relu");
  EXPECT_TRUE(failsWith(bad_residual, "the residual [1, 5] must have the output's shape [2, 5]"));
  GraphBuilder vector = fused({4}, {5}, {}, "Relu");
  EXPECT_TRUE(failsWith(vector, "input 0 must have rank 2 or more, found [4]"));
  GraphBuilder activation = fused({2, 4}, {5}, {}, "Softplus");
  EXPECT_TRUE(failsWith(activation, "activation 'Softplus' is not one kiln fuses"));
}

// ---------------------------------------------------------- Normalisation

TEST(Normalization, BatchNormalization) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 16, H, W]"));
  std::vector<ValueId> params;
  for (const char* name : {"scale", "bias", "mean", "var"}) params.push_back(weights(b, name, {16}));
  const ValueId y = b.op("BatchNormalization", {x, params[0], params[1], params[2], params[3]});
  const auto training =
      b.ops("BatchNormalization", {x, params[0], params[1], params[2], params[3]}, 3, {{"training_mode", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {y, training[0], training[1], training[2]}),
            (std::vector<std::string>{"f32[N, 16, H, W]", "f32[N, 16, H, W]", "f32[16]", "f32[16]"}));

  GraphBuilder bad;
  const ValueId x2 = bad.input("x", DType::kF32, {1, 8, 4, 4});
  const ValueId p = weights(bad, "p", {8});
  bad.op("BatchNormalization", {x2, p, p, weights(bad, "m", {4}), p});
  EXPECT_TRUE(failsWith(bad, "mean (input 3) is [4] but must be [8]"));
}

TEST(Normalization, InstanceNormalization) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f16[N, 3, L]"));
  const ValueId y = b.op("InstanceNormalization", {x, b.input("s", DType::kF16, {3}), b.input("b", DType::kF16, {3})});
  EXPECT_EQ(inferredType(b, y), "f16[N, 3, L]");

  GraphBuilder bad;
  const ValueId x2 = bad.input("x", DType::kF32, {1, 3, 4});
  bad.op("InstanceNormalization", {x2, weights(bad, "s", {3}), weights(bad, "b", {4})});
  EXPECT_TRUE(failsWith(bad, "B (input 2) is [4] but must be [3]"));
}

TEST(Normalization, LayerNormalizationStatistics) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f16[batch, seq, 768]"));
  const ValueId scale = b.input("scale", DType::kF16, {768});
  const auto last = b.ops("LayerNormalization", {x, scale, b.input("bias", DType::kF16, {768})}, 3);
  const auto two =
      b.ops("LayerNormalization", {x, b.input("s2", parseType("f16[seq, 768]"))}, 2, {{"axis", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {last[0], last[1], last[2], two[1]}),
            (std::vector<std::string>{"f16[batch, seq, 768]", "f32[batch, seq, 1]", "f32[batch, seq, 1]",
                                      "f32[batch, 1, 1]"}));

  GraphBuilder axis;
  axis.op("LayerNormalization", {axis.input("x", DType::kF32, {2, 4}), axis.input("s", DType::kF32, {4})},
          {{"axis", int64_t{2}}});
  EXPECT_TRUE(failsWith(axis, "axis 2 is out of range for rank 2"));
  // ONNX's LayerNormalization is opset 17's, but onnxruntime defines the same
  // operator in the default domain from version 1, and its transformer
  // optimizer writes it into older models: kiln takes it at any opset.
  GraphBuilder old;
  const ValueId y = old.op("LayerNormalization", {old.input("x", DType::kF32, {2, 4}), old.input("s", DType::kF32, {4})});
  EXPECT_EQ(inferredTypes(old, {y}, 11), (std::vector<std::string>{"f32[2, 4]"}));
}

TEST(Normalization, GroupNormalizationFromOpset18) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 32, H, W]"));
  const ValueId y =
      b.op("GroupNormalization", {x, weights(b, "s", {8}), weights(b, "b", {8})}, {{"num_groups", int64_t{8}}});
  EXPECT_EQ(inferredType(b, y, 18), "f32[N, 32, H, W]");

  GraphBuilder per_channel;  // opset 21: scale and bias per channel
  const ValueId x2 = per_channel.input("x", DType::kF32, {1, 32, 4});
  const ValueId s = weights(per_channel, "s", {32});
  EXPECT_EQ(
      inferredType(per_channel, per_channel.op("GroupNormalization", {x2, s, s}, {{"num_groups", int64_t{8}}}), 21),
      "f32[1, 32, 4]");

  GraphBuilder bad;
  const ValueId x3 = bad.input("x", DType::kF32, {1, 30, 4});
  const ValueId p = weights(bad, "p", {8});
  bad.op("GroupNormalization", {x3, p, p}, {{"num_groups", int64_t{8}}});
  EXPECT_TRUE(failsWith(bad, "the 30 channels do not divide into 8 groups", 18));
}

TEST(Softmax, AxisDefaultDependsOnTheOpset) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 10]"));
  EXPECT_EQ(
      inferredTypes(b, {b.op("Softmax", {x}), b.op("LogSoftmax", {x}, {{"axis", int64_t{0}}}), b.op("Hardmax", {x})}),
      (std::vector<std::string>{"f32[batch, 10]", "f32[batch, 10]", "f32[batch, 10]"}));

  // A vector: the default axis 1 of opsets before 13 does not exist; -1 does.
  GraphBuilder old;
  old.op("Softmax", {old.input("x", DType::kF32, {10})});
  EXPECT_TRUE(failsWith(old, "axis 1 is out of range for rank 1", 11));
  GraphBuilder current;
  const ValueId v = current.input("x", DType::kF32, {10});
  EXPECT_EQ(inferredType(current, current.op("LogSoftmax", {v}), 13), "f32[10]");
  GraphBuilder bad;
  bad.op("Softmax", {bad.input("x", DType::kF32, {2, 3})}, {{"axis", int64_t{-3}}});
  EXPECT_TRUE(failsWith(bad, "axis -3 is out of range for rank 2"));
}

TEST(Lrn, KeepsTheShape) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 96, 55, 55]"));
  EXPECT_EQ(inferredType(b, b.op("LRN", {x}, {{"size", int64_t{5}}})), "f32[N, 96, 55, 55]");
  GraphBuilder bad;
  bad.op("LRN", {bad.input("x", DType::kF32, {1, 3, 4, 4})});
  EXPECT_TRUE(failsWith(bad, "needs a positive 'size' attribute, found 0"));
}

TEST(NnOps, UnknownRankInputsGiveUnknownShapes) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[*]"));
  std::vector<ValueId> outputs{
      b.op("Conv", {x, weights(b, "w", {8, 3, 3, 3})}),
      b.op("MaxPool", {x}, {{"kernel_shape", Ints{2, 2}}}),
      b.op("MatMul", {x, b.input("m", DType::kF32, {3, 4})}),
      b.op("Gemm", {x, b.input("g", DType::kF32, {3, 4})}),
      b.op("Softmax", {x}),
      b.op("GlobalAveragePool", {x}),
  };
  EXPECT_EQ(inferredTypes(b, outputs),
            (std::vector<std::string>{"f32[?, 8, ?, ?]", "f32[*]", "f32[*]", "f32[?, 4]", "f32[*]", "f32[*]"}));
}

}  // namespace
}  // namespace kiln
