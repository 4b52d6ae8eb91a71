// Type and shape inference of the quantization, signal-processing and
// spatial-sampling operators (src/ops/quantization_ops.cc, signal_ops.cc,
// sampling_ops.cc).
#include <gtest/gtest.h>

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

// ------------------------------------------------------------- quantization

TEST(QuantizationOps, QuantizeTakesTheZeroPointsTypeElseOutputDtypeElseU8) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4]"));
  const ValueId scale = b.input("scale", DType::kF32, {});
  const ValueId zero = b.input("zero", DType::kI8, {});
  const ValueId per_axis = b.input("per_axis", DType::kF32, {3});
  const ValueId blocked = b.input("blocked", DType::kF32, {1, 3, 2});
  EXPECT_EQ(inferredTypes(b,
                          {b.op("QuantizeLinear", {x, scale}), b.op("QuantizeLinear", {x, scale, zero}),
                           b.op("QuantizeLinear", {x, scale}, {{"output_dtype", int64_t{5}}}),
                           b.op("QuantizeLinear", {x, per_axis}),
                           b.op("QuantizeLinear", {x, blocked}, {{"axis", int64_t{2}}, {"block_size", int64_t{2}}})},
                          21),
            (std::vector<std::string>{"u8[batch, 3, 4]", "i8[batch, 3, 4]", "i16[batch, 3, 4]", "u8[batch, 3, 4]",
                                      "u8[batch, 3, 4]"}));
}

TEST(QuantizationOps, QuantizeRejectsMismatchedParameters) {
  GraphBuilder axis;
  const ValueId x = axis.input("x", DType::kF32, {2, 3});
  axis.op("QuantizeLinear", {x, axis.input("s", DType::kF32, {2})});
  EXPECT_TRUE(failsWith(axis, "must be a scalar, [1] or [3]", 21));

  GraphBuilder blocked;
  const ValueId y = blocked.input("y", DType::kF32, {2, 5});
  blocked.op("QuantizeLinear", {y, blocked.input("s", DType::kF32, {2, 2})}, {{"block_size", int64_t{2}}});
  EXPECT_TRUE(failsWith(blocked, "ceil(size / block_size)", 21));

  GraphBuilder types;
  const ValueId z = types.input("z", DType::kF32, {2});
  types.op("QuantizeLinear", {z, types.input("s", DType::kF32, {}), types.input("zp", DType::kU8, {})},
           {{"output_dtype", int64_t{3}}});
  EXPECT_TRUE(failsWith(types, "output_dtype is i8 but the zero point is u8", 21));
}

TEST(QuantizationOps, DequantizeGivesTheScalesTypeOrOutputDtype) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF8E4M3, {5});
  const ValueId half = b.input("half", DType::kF16, {});
  const ValueId single = b.input("single", DType::kF32, {});
  EXPECT_EQ(inferredTypes(b, {b.op("DequantizeLinear", {x, half}), b.op("DequantizeLinear", {x, single}),
                              b.op("DequantizeLinear", {x, half}, {{"output_dtype", int64_t{1}}})},
                          23),
            (std::vector<std::string>{"f16[5]", "f32[5]", "f32[5]"}));
  GraphBuilder mismatch;
  const ValueId q = mismatch.input("q", DType::kU8, {4});
  mismatch.op("DequantizeLinear", {q, mismatch.input("s", DType::kF32, {}), mismatch.input("z", DType::kI8, {})});
  EXPECT_TRUE(failsWith(mismatch, "the zero point is i8 but x is u8", 21));
}

TEST(QuantizationOps, DynamicQuantizeAndTheIntegerForms) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 4});
  const std::vector<ValueId> dq = b.ops("DynamicQuantizeLinear", {x}, 3);
  const ValueId a = b.input("a", DType::kU8, {2, 5, 4});
  const ValueId w = b.input("w", DType::kI8, {4, 3});
  const ValueId image = b.input("image", DType::kU8, {1, 2, 7, 7});
  const ValueId kernel = b.input("kernel", DType::kU8, {4, 2, 3, 3});
  const ValueId scale = b.input("scale", DType::kF32, {});
  const ValueId zero = b.input("zero", DType::kU8, {});
  const ValueId w_zero = b.input("w_zero", DType::kI8, {});
  const ValueId qmatmul = b.op("QLinearMatMul", {a, scale, zero, w, scale, w_zero, scale, w_zero});
  const ValueId qconv = b.op("QLinearConv", {image, scale, zero, kernel, scale, zero, scale, zero},
                             {{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}});
  EXPECT_EQ(inferredTypes(b, {dq[0], dq[1], dq[2], b.op("MatMulInteger", {a, w}), b.op("ConvInteger", {image, kernel}),
                              qmatmul, qconv},
                          21),
            (std::vector<std::string>{"u8[3, 4]", "f32[]", "u8[]", "i32[2, 5, 3]", "i32[1, 4, 5, 5]", "i8[2, 5, 3]",
                                      "u8[1, 4, 4, 4]"}));
}

TEST(QuantizationOps, IntegerFormsReportThePlainOperatorsShapeErrors) {
  GraphBuilder b;
  b.op("MatMulInteger", {b.input("a", DType::kU8, {2, 4}), b.input("b", DType::kU8, {3, 2})});
  EXPECT_TRUE(failsWith(b, "inner dimensions 4 and 3 differ (MatMulInteger takes its shape rule from MatMul)", 21));
  GraphBuilder f;
  f.op("MatMulInteger", {f.input("a", DType::kF32, {2, 4}), f.input("b", DType::kU8, {4, 2})});
  EXPECT_TRUE(failsWith(f, "input 0 must be u8 or i8, found f32", 21));
}

// ------------------------------------------------------------------- signal

TEST(SignalOps, DftShapes) {
  GraphBuilder b;
  const ValueId real = b.input("real", DType::kF32, {1, 10, 10, 1});
  const ValueId complex = b.input("complex", DType::kF32, {1, 6, 10, 2});
  const ValueId length = b.constant<int64_t>("length", {}, {16});
  EXPECT_EQ(inferredTypes(b,
                          {b.op("DFT", {real}, {{"axis", int64_t{1}}}),
                           b.op("DFT", {real}, {{"axis", int64_t{2}}, {"onesided", int64_t{1}}}),
                           b.op("DFT", {complex}, {{"axis", int64_t{1}}, {"inverse", int64_t{1}}, {"onesided", int64_t{1}}}),
                           b.op("DFT", {real, length}, {{"axis", int64_t{1}}})},
                          19),
            (std::vector<std::string>{"f32[1, 10, 10, 2]", "f32[1, 10, 6, 2]", "f32[1, 10, 10, 1]",
                                      "f32[1, 16, 10, 2]"}));
  // Opset 20: the axis is an input; without a constant its size is unknown
  // when the transform changes it.
  GraphBuilder input;
  const ValueId x = input.input("x", DType::kF32, {1, 10, 10, 1});
  const ValueId axis = input.input("axis", DType::kI64, {});
  const ValueId two = input.constant<int64_t>("two", {}, {2});
  EXPECT_EQ(inferredTypes(input,
                          {input.op("DFT", {x, kNoValue, axis}), input.op("DFT", {x, kNoValue, axis}, {{"onesided", int64_t{1}}}),
                           input.op("DFT", {x, kNoValue, two}, {{"onesided", int64_t{1}}}), input.op("DFT", {x})},
                          20),
            (std::vector<std::string>{"f32[1, 10, 10, 2]", "f32[?, ?, ?, 2]", "f32[1, 10, 6, 2]", "f32[1, 10, 10, 2]"}));
  GraphBuilder last;
  last.op("DFT", {last.input("x", DType::kF32, {4, 2})}, {{"axis", int64_t{-1}}});
  EXPECT_TRUE(failsWith(last, "is the last (complex) axis", 19));
}

TEST(SignalOps, StftWindowsAndMel) {
  GraphBuilder b;
  const ValueId signal = b.input("signal", DType::kF32, {1, 128, 1});
  const ValueId step = b.constant<int64_t>("step", {}, {8});
  const ValueId length = b.constant<int64_t>("length", {}, {16});
  const ValueId window = b.input("window", DType::kF32, {16});
  const ValueId size = b.constant<int32_t>("size", {}, {10});
  const ValueId runtime_size = b.input("runtime_size", DType::kI32, {});
  EXPECT_EQ(inferredTypes(b,
                          {b.op("STFT", {signal, step, kNoValue, length}), b.op("STFT", {signal, step, window}),
                           b.op("STFT", {signal, step, window}, {{"onesided", int64_t{0}}}),
                           b.op("HannWindow", {size}), b.op("BlackmanWindow", {size}, {{"output_datatype", int64_t{11}}}),
                           b.op("HammingWindow", {runtime_size}),
                           b.op("MelWeightMatrix", {b.constant<int32_t>("mel", {}, {8}), b.constant<int32_t>("dft", {}, {16}),
                                                    b.constant<int32_t>("rate", {}, {8192}),
                                                    b.constant<float>("lo", {}, {0}), b.constant<float>("hi", {}, {4096})})},
                          17),
            (std::vector<std::string>{"f32[1, 15, 9, 2]", "f32[1, 15, 9, 2]", "f32[1, 15, 16, 2]", "f32[10]", "f64[10]",
                                      "f32[?]", "f32[9, 8]"}));
  GraphBuilder bad;
  bad.op("HannWindow", {bad.constant<int64_t>("size", {}, {0})});
  EXPECT_TRUE(failsWith(bad, "size must be positive, found 0", 17));
}

// ----------------------------------------------------------------- sampling

TEST(SamplingOps, Shapes) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 8, 9});
  const ValueId grid = b.input("grid", DType::kF32, {2, 4, 5, 2});
  const ValueId volume = b.input("volume", DType::kF32, {1, 2, 3, 4, 5});
  const ValueId grid3 = b.input("grid3", DType::kF32, {1, 6, 7, 8, 3});
  const ValueId theta = b.input("theta", DType::kF32, {2, 2, 3});
  const ValueId size = b.constant<int64_t>("size", {4}, {2, 3, 5, 6});
  const ValueId rois = b.input("rois", DType::kF32, {7, 4});
  const ValueId indices = b.input("indices", DType::kI64, {7});
  const ValueId w = b.input("w", DType::kF32, {4, 3, 2, 2});
  const ValueId offset = b.input("offset", DType::kF32, {2, 8, 7, 8});
  EXPECT_EQ(inferredTypes(b,
                          {b.op("GridSample", {x, grid}), b.op("GridSample", {volume, grid3}),
                           b.op("AffineGrid", {theta, size}),
                           b.op("RoiAlign", {x, rois, indices}, {{"output_height", int64_t{3}}, {"output_width", int64_t{2}}}),
                           b.op("DeformConv", {x, w, offset})},
                          22),
            (std::vector<std::string>{"f32[2, 3, 4, 5]", "f32[1, 2, 6, 7, 8]", "f32[2, 5, 6, 2]", "f32[7, 3, 3, 2]",
                                      "f32[2, 4, 7, 8]"}));
  GraphBuilder bad;
  bad.op("GridSample", {bad.input("x", DType::kF32, {1, 1, 4, 4}), bad.input("g", DType::kF32, {1, 3, 3, 3})});
  EXPECT_TRUE(failsWith(bad, "must be [N, C, D1..Dr] and [N, O1..Or, r]", 22));
  GraphBuilder old;
  old.op("RoiAlign", {old.input("x", DType::kF32, {1, 1, 4, 4}), old.input("r", DType::kF32, {1, 4}),
                      old.input("i", DType::kI64, {1})});
  // Opset 10 behaves as output_half_pixel without saying so: not supported.
  EXPECT_TRUE(failsWith(old, "without a schema in kiln: RoiAlign (ai.onnx, opset 10)", 10));
}

}  // namespace
}  // namespace kiln
