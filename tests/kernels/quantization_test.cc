// Quantization kernels (src/kernels/cpu/quantization.cc, and the 8-bit
// table kernels kiln.Lookup8 and kiln.QLinearConcat) against values worked
// out by hand or taken from the ONNX operator documentation's examples. (The float8 and f16 conversions themselves are tested in
// tests/core/float_formats_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

// Runs `op` and returns output `index`'s values.
template <typename T>
std::vector<T> runKernel(const std::string& op, std::vector<Operand> inputs, std::vector<Operand> outputs,
                         const ParamMap& p = {}, size_t index = 0) {
  const PreparedKernel kernel(op, inputs, outputs, p);
  kernel.run(inputs, outputs);
  return outputs[index].values<T>();
}

// The operand with its bytes reinterpreted as `dtype` (float8, f16).
Operand retyped(Operand op, DType dtype) {
  op.info.dtype = dtype;
  return op;
}

// ------------------------------------------------------- QuantizeLinear

TEST(QuantizeLinearKernel, PerTensorRoundsHalfToEvenAndSaturates) {
  // The ONNX example: x / 2 + 128.
  const std::vector<float> x{0, 2, 3, 1000, -254, -1000};
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear",
                               {operand<float>({6}, x), operand<float>({}, {2}), operand<uint8_t>({}, {128})},
                               {output(DType::kU8, {6})}),
            (std::vector<uint8_t>{128, 129, 130, 255, 1, 0}));
  // Without a zero point: u8, zero point 0; 2.5 -> 2 and 3.5 -> 4 (even).
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear", {operand<float>({4}, {2.5f, 3.5f, -1, 7}), operand<float>({1}, {1})},
                               {output(DType::kU8, {4})}),
            (std::vector<uint8_t>{2, 4, 0, 7}));
}

TEST(QuantizeLinearKernel, PerAxisAndBlocked) {
  // x [2, 3], axis 1: scales 1, 2, 4 and zero points 0, 10, -10 (i8).
  const std::vector<float> x{1, 2, 4, -3, -8, 16};
  EXPECT_EQ(runKernel<int8_t>("QuantizeLinear",
                              {operand<float>({2, 3}, x), operand<float>({3}, {1, 2, 4}),
                               operand<int8_t>({3}, {0, 10, -10})},
                              {output(DType::kI8, {2, 3})}),
            (std::vector<int8_t>{1, 11, -9, -3, 6, -6}));
  // Blocked along axis 1 with block_size 2 (the last block holds one
  // column): scales [2, 2] for x [2, 3]; output_dtype i16, no zero point.
  EXPECT_EQ(runKernel<int16_t>("QuantizeLinear", {operand<float>({2, 3}, x), operand<float>({2, 2}, {1, 4, 2, 8})},
                               {output(DType::kI16, {2, 3})},
                               params({{"axis", int64_t{1}}, {"block_size", int64_t{2}}, {"output_dtype", int64_t{5}}})),
            (std::vector<int16_t>{1, 2, 1, -2, -4, 2}));
}

TEST(QuantizeLinearKernel, Float8AndHalfScale) {
  const std::vector<float> x{0, 0.5f, 300, 1000, -1000};
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear",
                               {operand<float>({5}, x), operand<float>({}, {1}),
                                retyped(operand<uint8_t>({1}, {0}), DType::kF8E4M3)},
                               {output(DType::kF8E4M3, {5})}),
            (std::vector<uint8_t>{0x00, 0x30, 0x79, 0x7E, 0xFE}));
  // saturate = 0: out of range becomes NaN.
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear", {operand<float>({5}, x), operand<float>({}, {1})},
                               {output(DType::kF8E4M3, {5})},
                               params({{"saturate", int64_t{0}}, {"output_dtype", int64_t{17}}})),
            (std::vector<uint8_t>{0x00, 0x30, 0x79, 0x7F, 0xFF}));
  // An f16 scale sets the division's precision (the ONNX spec; onnx's
  // reference divides in f32 instead): 1000 / 0.333251953125 = 3000.73
  // rounds to the f16 3000 before the integer rounding; precision = f32
  // keeps 3000.73 -> 3001.
  const Operand scale = retyped(operand<uint16_t>({}, {floatToHalf(1.0f / 3.0f)}), DType::kF16);
  EXPECT_EQ(runKernel<int16_t>("QuantizeLinear", {operand<float>({1}, {1000}), scale, operand<int16_t>({}, {0})},
                               {output(DType::kI16, {1})}),
            (std::vector<int16_t>{3000}));
  EXPECT_EQ(runKernel<int16_t>("QuantizeLinear", {operand<float>({1}, {1000}), scale, operand<int16_t>({}, {0})},
                               {output(DType::kI16, {1})}, params({{"precision", int64_t{1}}})),
            (std::vector<int16_t>{3001}));
}

// Sub-byte types hold one element per byte, in its low bits (as Cast).
TEST(QuantizeLinearKernel, SubByteTypes) {
  // i4 per axis: [2, 3] with scales 1 and 2 along axis 0; clamped to [-8, 7].
  const std::vector<uint8_t> i4 = runKernel<uint8_t>(
      "QuantizeLinear",
      {operand<float>({2, 3}, {1, -9, 20, 3, -5, 15}), operand<float>({2}, {1, 2}),
       retyped(operand<uint8_t>({2}, {0, 0x0F}), DType::kI4)},  // zero points 0 and -1
      {output(DType::kI4, {2, 3})}, params({{"axis", int64_t{0}}}));
  // 1, -8 (clamped), 7 (clamped); 2 - 1 = 1, -2 (-2.5 to even) - 1 = -3, 8 - 1 = 7.
  EXPECT_EQ(i4, (std::vector<uint8_t>{0x1, 0x8, 0x7, 0x1, 0xD, 0x7}));
  EXPECT_EQ(runKernel<float>("DequantizeLinear",
                             {retyped(operand<uint8_t>({3}, {0x1, 0x8, 0xD}), DType::kI4), operand<float>({}, {0.5f}),
                              retyped(operand<uint8_t>({}, {0x1}), DType::kI4)},
                             {output(DType::kF32, {3})}),
            (std::vector<float>{0, -4.5f, -2}));
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear", {operand<float>({4}, {0, 1, 3.5f, 9}), operand<float>({}, {1})},
                               {output(DType::kU2, {4})}, params({{"output_dtype", int64_t{25}}})),
            (std::vector<uint8_t>{0, 1, 3, 3}));
  // f4e2m1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6): 2.5 -> 2 (even), 100 -> 6.
  EXPECT_EQ(runKernel<uint8_t>("QuantizeLinear", {operand<float>({4}, {2.5f, -1.25f, 100, 0.2f}), operand<float>({}, {1})},
                               {output(DType::kF4E2M1, {4})}, params({{"output_dtype", int64_t{23}}})),
            (std::vector<uint8_t>{0x4, 0xA, 0x7, 0x0}));
}

TEST(QuantizeLinearKernel, Errors) {
  const Operand x = operand<float>({2, 3}, std::vector<float>(6));
  EXPECT_THAT(prepareError("QuantizeLinear", {x, operand<float>({2}, {1, 1})}, {output(DType::kU8, {2, 3})}),
              HasSubstr("must be a scalar, [1] or [3]"));
  EXPECT_THAT(prepareError("QuantizeLinear", {x, operand<float>({}, {1})}, {output(DType::kF32, {2, 3})}),
              HasSubstr("no kernel for output f32[2, 3]"));
  EXPECT_THAT(prepareError("QuantizeLinear", {x, operand<float>({}, {1}), operand<int8_t>({}, {0})},
                           {output(DType::kU8, {2, 3})}),
              HasSubstr("must have one type"));
  EXPECT_THAT(prepareError("QuantizeLinear", {x, operand<float>({2, 1}, {1, 1})}, {output(DType::kU8, {2, 3})},
                           params({{"block_size", int64_t{2}}})),
              HasSubstr("blocked (block_size 2)"));
}

// ----------------------------------------------------- DequantizeLinear

TEST(DequantizeLinearKernel, PerTensorPerAxisAndFloat8) {
  EXPECT_EQ(runKernel<float>("DequantizeLinear",
                             {operand<uint8_t>({4}, {0, 3, 128, 255}), operand<float>({}, {2}),
                              operand<uint8_t>({}, {128})},
                             {output(DType::kF32, {4})}),
            (std::vector<float>{-256, -250, 0, 254}));
  // [1, 3, 2] along axis 1.
  EXPECT_EQ(runKernel<float>("DequantizeLinear",
                             {operand<int8_t>({1, 3, 2}, {-1, 1, 10, 20, 0, -128}), operand<float>({3}, {1, 0.5f, 2}),
                              operand<int8_t>({3}, {0, 10, -1})},
                             {output(DType::kF32, {1, 3, 2})}),
            (std::vector<float>{-1, 1, 0, 5, 2, -254}));
  // E5M2 codes 0x3C (1.0), 0xC2 (-3.0), 0x7B (57344) times 0.5, into f16.
  const std::vector<uint16_t> half = runKernel<uint16_t>(
      "DequantizeLinear", {retyped(operand<uint8_t>({3}, {0x3C, 0xC2, 0x7B}), DType::kF8E5M2), operand<float>({}, {0.5f})},
      {output(DType::kF16, {3})}, params({{"output_dtype", int64_t{10}}}));
  EXPECT_EQ(half, (std::vector<uint16_t>{floatToHalf(0.5f), floatToHalf(-1.5f), floatToHalf(28672.0f)}));
}

TEST(DequantizeLinearKernel, Errors) {
  EXPECT_THAT(prepareError("DequantizeLinear", {operand<float>({2}, {1, 2}), operand<float>({}, {1})},
                           {output(DType::kF32, {2})}),
              HasSubstr("no kernel for x f32[2]"));
  EXPECT_THAT(prepareError("DequantizeLinear",
                           {operand<uint8_t>({2}, {1, 2}), operand<float>({}, {1}), operand<int8_t>({}, {0})},
                           {output(DType::kF32, {2})}),
              HasSubstr("must have one type"));
}

// -------------------------------------------------- DynamicQuantizeLinear

TEST(DynamicQuantizeLinearKernel, OnnxExamples) {
  {
    std::vector<Operand> inputs{operand<float>({6}, {0, 2, -3, -2.5f, 1.34f, 0.5f})};
    std::vector<Operand> outputs{output(DType::kU8, {6}), output(DType::kF32, {}), output(DType::kU8, {})};
    const PreparedKernel kernel("DynamicQuantizeLinear", inputs, outputs);
    kernel.run(inputs, outputs);
    EXPECT_EQ(outputs[0].values<uint8_t>(), (std::vector<uint8_t>{153, 255, 0, 26, 221, 179}));
    EXPECT_FLOAT_EQ(outputs[1].values<float>()[0], 0.0196078438f);
    EXPECT_EQ(outputs[2].values<uint8_t>()[0], 153);
  }
  {
    // All negative: the range widens to include 0, the zero point is 255.
    std::vector<Operand> inputs{operand<float>({6}, {-1, -2.1f, -1.3f, -2.5f, -3.34f, -4})};
    std::vector<Operand> outputs{output(DType::kU8, {6}), output(DType::kF32, {}), output(DType::kU8, {})};
    const PreparedKernel kernel("DynamicQuantizeLinear", inputs, outputs);
    kernel.run(inputs, outputs);
    EXPECT_EQ(outputs[0].values<uint8_t>(), (std::vector<uint8_t>{191, 121, 172, 96, 42, 0}));
    EXPECT_EQ(outputs[2].values<uint8_t>()[0], 255);
  }
  EXPECT_THAT(prepareError("DynamicQuantizeLinear", {operand<float>({2}, {1, 2})},
                           {output(DType::kU8, {2}), output(DType::kF32, {1}), output(DType::kU8, {})}),
              HasSubstr("output 1 is f32[1] but must be f32[]"));
}

// ------------------------------------------------ MatMulInteger, ConvInteger

TEST(MatMulIntegerKernel, OnnxExampleAndPerColumnZeroPoints) {
  const Operand a = operand<uint8_t>({4, 3}, {11, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0});
  const Operand b = operand<uint8_t>({3, 2}, {1, 4, 2, 5, 3, 6});
  EXPECT_EQ(runKernel<int32_t>("MatMulInteger", {a, b, operand<uint8_t>({}, {12}), operand<uint8_t>({}, {0})},
                               {output(DType::kI32, {4, 2})}),
            (std::vector<int32_t>{-38, -83, -44, -98, -50, -113, -56, -128}));
  // Batched, broadcasting B, signed B with a zero point per column.
  const Operand a3 = operand<int8_t>({2, 1, 2}, {1, -2, 3, 4});
  const Operand b2 = operand<int8_t>({2, 2}, {5, 6, 7, 8});
  EXPECT_EQ(runKernel<int32_t>("MatMulInteger", {a3, b2, omitted(), operand<int8_t>({2}, {1, -1})},
                               {output(DType::kI32, {2, 1, 2})}),
            (std::vector<int32_t>{(1 * 4 - 2 * 6), (1 * 7 - 2 * 9), (3 * 4 + 4 * 6), (3 * 7 + 4 * 9)}));
  EXPECT_THAT(prepareError("MatMulInteger", {a, b}, {output(DType::kI32, {4, 3})}), HasSubstr("must be [4, 2]"));
  EXPECT_THAT(prepareError("MatMulInteger", {a, b, operand<int8_t>({}, {0})}, {output(DType::kI32, {4, 2})}),
              HasSubstr("must have the type of input 0"));
}

TEST(ConvIntegerKernel, OnnxExamples) {
  const Operand x = operand<uint8_t>({1, 1, 3, 3}, {2, 3, 4, 5, 6, 7, 8, 9, 10});
  const Operand w = operand<uint8_t>({1, 1, 2, 2}, {1, 1, 1, 1});
  EXPECT_EQ(runKernel<int32_t>("ConvInteger", {x, w, operand<uint8_t>({}, {1})}, {output(DType::kI32, {1, 1, 2, 2})}),
            (std::vector<int32_t>{12, 16, 24, 28}));
  // Padding reads the zero point (contributes 0).
  EXPECT_EQ(runKernel<int32_t>("ConvInteger", {x, w, operand<uint8_t>({}, {1})}, {output(DType::kI32, {1, 1, 4, 4})},
                               params({{"pads", Ints{1, 1, 1, 1}}})),
            (std::vector<int32_t>{1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9}));
  EXPECT_THAT(prepareError("ConvInteger", {x, w}, {output(DType::kI32, {1, 1, 3, 3})}),
              HasSubstr("the output has 3 elements but the input, kernel, strides and pads give 2"));
}

// ------------------------------------------------ QLinearMatMul, QLinearConv

TEST(QLinearMatMulKernel, OnnxExample) {
  // The ONNX documentation's example (u8, f32 scales).
  const Operand a = operand<uint8_t>({2, 4}, {208, 236, 0, 238, 3, 214, 255, 29});
  const Operand b = operand<uint8_t>({4, 3}, {152, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247});
  EXPECT_EQ(runKernel<uint8_t>("QLinearMatMul",
                               {a, operand<float>({1}, {0.0066f}), operand<uint8_t>({1}, {113}), b,
                                operand<float>({1}, {0.00705f}), operand<uint8_t>({1}, {114}),
                                operand<float>({1}, {0.0107f}), operand<uint8_t>({1}, {118})},
                               {output(DType::kU8, {2, 3})}),
            (std::vector<uint8_t>{168, 115, 255, 1, 66, 151}));
  EXPECT_THAT(prepareError("QLinearMatMul",
                           {a, operand<float>({1}, {1}), operand<uint8_t>({1}, {0}), b, operand<float>({1}, {1}),
                            operand<uint8_t>({1}, {0}), operand<float>({1}, {1}), operand<int8_t>({1}, {0})},
                           {output(DType::kU8, {2, 3})}),
              HasSubstr("must have the type of y_zero_point"));
}

TEST(QLinearConvKernel, RequantizesWithBiasAndPerChannelScales) {
  // x [1, 1, 2, 2] with zero point 10, w [2, 1, 1, 1] (1x1) with per-channel
  // scales: y[m] = round((x - 10) * w[m] * 0.5 * w_scale[m] / 0.25 + bias * ...)
  const Operand x = operand<uint8_t>({1, 1, 2, 2}, {10, 12, 14, 30});
  const Operand w = operand<int8_t>({2, 1, 1, 1}, {3, -2});
  const std::vector<uint8_t> y = runKernel<uint8_t>(
      "QLinearConv",
      {x, operand<float>({}, {0.5f}), operand<uint8_t>({}, {10}), w, operand<float>({2}, {1, 0.25f}),
       operand<int8_t>({2}, {0, 0}), operand<float>({}, {0.25f}), operand<uint8_t>({}, {100}),
       operand<int32_t>({2}, {4, -8})},
      {output(DType::kU8, {1, 2, 2, 2})});
  // Channel 0: multiplier 2, sums (x - 10) * 3 + 4 = 4, 10, 16, 64 -> 108, 120, 132, 228.
  // Channel 1: multiplier 0.5, sums (x - 10) * -2 - 8 = -8, -12, -16, -48 -> 96, 94, 92, 76.
  EXPECT_EQ(y, (std::vector<uint8_t>{108, 120, 132, 228, 96, 94, 92, 76}));
}

TEST(Lookup8Kernel, LooksUpEveryByteAndRefusesWhatItCannotRun) {
  // u8 in, i8 out: table[v] = 100 - v as i8 (wrapping), over a length with a tail.
  std::vector<int8_t> table(256);
  for (int v = 0; v < 256; ++v) table[static_cast<size_t>(v)] = static_cast<int8_t>(static_cast<uint8_t>(100 - v));
  std::vector<uint8_t> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 7);
  const std::vector<int8_t> y = runKernel<int8_t>("kiln.Lookup8", {operand<uint8_t>({3, 100}, x),
                                                                   operand<int8_t>({256}, table, /*constant=*/true)},
                                                  {output(DType::kI8, {3, 100})});
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], table[x[i]]) << i;
  const Operand x8 = operand<uint8_t>({4}, {1, 2, 3, 4});
  EXPECT_THAT(prepareError("kiln.Lookup8", {x8, operand<int8_t>({256}, table)}, {output(DType::kI8, {4})}),
              HasSubstr("must be a constant"));
  EXPECT_THAT(prepareError("kiln.Lookup8", {x8, operand<int8_t>({4}, {1, 2, 3, 4}, true)}, {output(DType::kI8, {4})}),
              HasSubstr("256 u8 or i8 values"));
  EXPECT_THAT(prepareError("kiln.Lookup8", {x8, operand<int8_t>({256}, table, true)}, {output(DType::kU8, {4})}),
              HasSubstr("the output is u8[4]"));
}

TEST(QLinearConcatKernel, RequantizesEachInputAsDequantizeThenQuantize) {
  // Along axis 1 of [2, c, 2]: input 0 (scale 0.5, zero 10) requantized to
  // the output's (scale 0.25, zero 0): (v - 10) * 2, saturating at 0 and 255;
  // input 1 already has the output's parameters: copied.
  const Operand a = operand<uint8_t>({2, 1, 2}, {10, 11, 200, 5});
  const Operand b = operand<uint8_t>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  ParamMap p = params({{"axis", int64_t{1}}});
  p.set("scales", std::vector<double>{0.5, 0.25, 0.25});
  p.set("zero_points", std::vector<int64_t>{10, 0, 0});
  EXPECT_EQ(runKernel<uint8_t>("kiln.QLinearConcat", {a, b}, {output(DType::kU8, {2, 3, 2})}, p),
            (std::vector<uint8_t>{0, 2, 1, 2, 3, 4, 255, 0, 5, 6, 7, 8}));
  ParamMap bad = p;
  bad.set("zero_points", std::vector<int64_t>{10, 0, 300});
  EXPECT_THAT(prepareError("kiln.QLinearConcat", {a, b}, {output(DType::kU8, {2, 3, 2})}, bad),
              HasSubstr("zero points of the type's range"));
  bad.set("scales", std::vector<double>{0.5, 0.25});
  EXPECT_THAT(prepareError("kiln.QLinearConcat", {a, b}, {output(DType::kU8, {2, 3, 2})}, bad),
              HasSubstr("take 3 values each"));
}

}  // namespace
}  // namespace kiln
