// Cast and CastLike kernels: conversions between every pair of dtypes, with
// expected bits worked out from the formats (and checked against ml_dtypes,
// ONNX's reference, in python/tests/test_cast.py).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Cast of x (stored as From, holding dtype `from`) to dtype `to`, read back as To.
template <typename From, typename To>
std::vector<To> cast(const std::vector<From>& x, DType from = dtypeOf<From>(), DType to = dtypeOf<To>(),
                     ParamMap p = {}) {
  Operand in = operand<From>({static_cast<int64_t>(x.size())}, x);
  in.info.dtype = from;
  std::vector<Operand> inputs = {in};
  std::vector<Operand> outputs = {output(to, {static_cast<int64_t>(x.size())})};
  p.set("to", static_cast<int64_t>(to));
  PreparedKernel("Cast", inputs, outputs, p).run(inputs, outputs);
  return outputs[0].values<To>();
}

// f32 values to the 1-byte type `to`, as bits.
std::vector<uint8_t> toBits(const std::vector<float>& x, DType to, bool saturate = true) {
  return cast<float, uint8_t>(x, DType::kF32, to, params({{"saturate", int64_t{saturate ? 1 : 0}}}));
}

TEST(CastKernel, NumbersConvertLikeNumpy) {
  EXPECT_EQ((cast<float, int32_t>({1.9f, -1.9f, 0.0f, 1e10f, -1e10f, std::nanf("")})),
            (std::vector<int32_t>{1, -1, 0, INT32_MAX, INT32_MIN, 0}));
  EXPECT_EQ((cast<int64_t, float>({1, -3, 1 << 24})), (std::vector<float>{1, -3, 16777216.0f}));
  EXPECT_EQ((cast<int32_t, uint8_t>({1, 255, 256, -1})), (std::vector<uint8_t>{1, 255, 0, 255}));
  EXPECT_EQ((cast<int32_t, int8_t>({127, 128, -129})), (std::vector<int8_t>{127, -128, 127}));
  EXPECT_EQ((cast<double, float>({0.1, -2.5})), (std::vector<float>{0.1f, -2.5f}));
  EXPECT_EQ((cast<uint64_t, int64_t>({5, ~uint64_t{0}})), (std::vector<int64_t>{5, -1}));
  EXPECT_EQ((cast<float, uint8_t>({0.0f, 2.5f, -3.0f, std::nanf("")}, DType::kF32, DType::kBool)),
            (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ((cast<uint8_t, float>({0, 1, 1}, DType::kBool, DType::kF32)), (std::vector<float>{0, 1, 1}));
  EXPECT_EQ((cast<uint8_t, int64_t>({1, 0}, DType::kBool, DType::kI64)), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ((cast<float, float>({1.5f, 2.5f})), (std::vector<float>{1.5f, 2.5f}));
  const std::vector<float> x = randomValues<float>(100, 60, -1000, 1000);
  std::vector<double> want(x.begin(), x.end());
  EXPECT_EQ((cast<float, double>(x)), want);
}

TEST(CastKernel, HalfPrecisionRoundsToNearestEven) {
  // f32 -> f16 bits.
  const std::vector<float> x = {0.0f,           -0.0f,          1.0f,     -2.0f,           65504.0f,
                                65520.0f,       1e-8f,          5.96e-8f, 6.103515625e-5f, 1.0009765625f,
                                1.00048828125f, 1.00146484375f, kInf,     0.333333f,       3e-8f};
  const std::vector<uint16_t> want = {0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x7C00, 0x0000, 0x0001,
                                      0x0400, 0x3C01, 0x3C00, 0x3C02, 0x7C00, 0x3555, 0x0001};
  EXPECT_EQ((cast<float, uint16_t>(x, DType::kF32, DType::kF16)), want);
  EXPECT_EQ((cast<float, uint16_t>({std::nanf("")}, DType::kF32, DType::kF16))[0] & 0x7C00, 0x7C00);
  // f16 -> f32 of every finite half, then back: exact round trip.
  std::vector<uint16_t> halves;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) != 0x7C00) halves.push_back(static_cast<uint16_t>(h));
  }
  const std::vector<float> floats = cast<uint16_t, float>(halves, DType::kF16, DType::kF32);
  EXPECT_EQ(floats[1], 5.9604644775390625e-8f);
  EXPECT_EQ(floats[0x3C00], 1.0f);
  EXPECT_EQ((cast<float, uint16_t>(floats, DType::kF32, DType::kF16)), halves);
  EXPECT_EQ((cast<uint16_t, int32_t>({0x4900, 0xC500}, DType::kF16, DType::kI32)), (std::vector<int32_t>{10, -5}));
  // From f64 the rounding is done once: 1 + 2^-11 + 2^-40 is just above the
  // tie, so it rounds up (through f32 it would tie and round to even).
  EXPECT_EQ(
      (cast<double, uint16_t>({1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 1e6}, DType::kF64, DType::kF16)),
      (std::vector<uint16_t>{0x3C01, 0x7C00}));
}

TEST(CastKernel, BFloat16RoundsToNearestEven) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1; 1 + 3 * 2^-8 rounds up.
  EXPECT_EQ((cast<float, uint16_t>({1.0f, 1.00390625f, 1.01171875f, -2.0f, kInf, 3.4e38f}, DType::kF32, DType::kBF16)),
            (std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0x7F80}));
  const uint16_t nan = cast<float, uint16_t>({std::nanf("")}, DType::kF32, DType::kBF16)[0];
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x7F, 0);
  EXPECT_EQ((cast<uint16_t, float>({0x3F80, 0xC040, 0x0001}, DType::kBF16, DType::kF32)),
            (std::vector<float>{1.0f, -3.0f, std::ldexp(1.0f, -133)}));
  EXPECT_EQ((cast<int32_t, uint16_t>({257, 16777217}, DType::kI32, DType::kBF16)),
            (std::vector<uint16_t>{0x4380, 0x4B80}));
}

TEST(CastKernel, Float8FollowsOnnxSaturationRules) {
  const float nan = std::nanf("");
  // E4M3FN: max 448 (0x7E); 0x7F is NaN; no inf.
  EXPECT_EQ(toBits({448, 464, 465, 1e9f, kInf, -kInf, nan, -0.0f, 0.001953125f, 0.0009765625f}, DType::kF8E4M3),
            (std::vector<uint8_t>{0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x80, 0x01, 0x00}));
  EXPECT_EQ(toBits({448, 464, 465, 1e9f, kInf, -kInf}, DType::kF8E4M3, false),
            (std::vector<uint8_t>{0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0xFF}));
  // E5M2: max 57344 (0x7B), inf 0x7C.
  EXPECT_EQ(toBits({57344, 61440, kInf, -kInf, 1.5f}, DType::kF8E5M2),
            (std::vector<uint8_t>{0x7B, 0x7B, 0x7B, 0xFB, 0x3E}));
  EXPECT_EQ(toBits({57344, 61440, kInf, -kInf}, DType::kF8E5M2, false), (std::vector<uint8_t>{0x7B, 0x7C, 0x7C, 0xFC}));
  // FNUZ: no -0, 0x80 is the NaN.
  EXPECT_EQ(toBits({240, 1000, -0.0f, nan, 0.0009765625f, -1}, DType::kF8E4M3FNUZ),
            (std::vector<uint8_t>{0x7F, 0x7F, 0x00, 0x80, 0x01, 0xC0}));
  EXPECT_EQ(toBits({1000, kInf}, DType::kF8E4M3FNUZ, false), (std::vector<uint8_t>{0x80, 0x80}));
  EXPECT_EQ(toBits({57344, kInf, -1e-9f}, DType::kF8E5M2FNUZ, false), (std::vector<uint8_t>{0x7F, 0x80, 0x00}));
  // Back to f32, every code: exact values, NaN where the format has it.
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  const std::vector<float> e4m3 = cast<uint8_t, float>(codes, DType::kF8E4M3, DType::kF32);
  EXPECT_EQ(e4m3[0x7E], 448.0f);
  EXPECT_EQ(e4m3[0x01], std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3[0x38], 1.0f);
  EXPECT_TRUE(std::isnan(e4m3[0x7F]) && std::isnan(e4m3[0xFF]));
  const std::vector<float> e5m2 = cast<uint8_t, float>(codes, DType::kF8E5M2, DType::kF32);
  EXPECT_EQ(e5m2[0x7C], kInf);
  EXPECT_EQ(e5m2[0xFC], -kInf);
  EXPECT_TRUE(std::isnan(e5m2[0x7D]));
  const std::vector<float> fnuz = cast<uint8_t, float>(codes, DType::kF8E4M3FNUZ, DType::kF32);
  EXPECT_TRUE(std::isnan(fnuz[0x80]));
  EXPECT_EQ(fnuz[0x7F], 240.0f);
  // Every finite code round-trips through f32.
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2, DType::kF8E4M3FNUZ, DType::kF8E5M2FNUZ}) {
    const std::vector<float> values = cast<uint8_t, float>(codes, dtype, DType::kF32);
    const std::vector<uint8_t> back = toBits(values, dtype, false);
    for (size_t i = 0; i < 256; ++i) {
      if (!std::isnan(values[i])) {
        EXPECT_EQ(back[i], codes[i]) << dtypeName(dtype) << " code " << i;
      }
    }
  }
}

TEST(CastKernel, Float4E2M1AlwaysSaturates) {
  // Values 0, 0.5, 1, 1.5, 2, 3, 4, 6; ties to even codes.
  EXPECT_EQ(toBits({0.25f, 0.75f, 1.25f, 2.5f, 5, 6.5f, 100, -kInf, -0.0f, -4}, DType::kF4E2M1),
            (std::vector<uint8_t>{0x0, 0x2, 0x2, 0x4, 0x6, 0x7, 0x7, 0xF, 0x8, 0xE}));
  EXPECT_EQ(toBits({100, kInf}, DType::kF4E2M1, false), (std::vector<uint8_t>{0x7, 0x7}));
  EXPECT_EQ((cast<uint8_t, float>({0x1, 0x7, 0xF, 0x5}, DType::kF4E2M1, DType::kF32)),
            (std::vector<float>{0.5f, 6, -6, 3}));
}

TEST(CastKernel, Float8E8M0RoundsByRoundMode) {
  auto e8m0 = [](const std::vector<float>& x, const std::string& mode, bool saturate = true) {
    return cast<float, uint8_t>(x, DType::kF32, DType::kF8E8M0,
                                params({{"round_mode", mode}, {"saturate", int64_t{saturate ? 1 : 0}}}));
  };
  // 1 is 127; 3 = 1.5 * 2: up 128+1, down 128, nearest (guard bit set) 129.
  EXPECT_EQ(e8m0({1, 3, 2.5f, -4, kInf, std::nanf("")}, "up"), (std::vector<uint8_t>{127, 129, 129, 129, 255, 255}));
  EXPECT_EQ(e8m0({1, 3, 2.5f, -4}, "down"), (std::vector<uint8_t>{127, 128, 128, 129}));
  EXPECT_EQ(e8m0({1, 3, 2.5f, 2.75f, 3.5f}, "nearest"), (std::vector<uint8_t>{127, 129, 128, 128, 129}));
  EXPECT_EQ(e8m0({3e38f}, "up"), (std::vector<uint8_t>{254}));
  EXPECT_EQ(e8m0({3e38f}, "up", false), (std::vector<uint8_t>{255}));
  EXPECT_EQ((cast<uint8_t, float>({127, 0, 254, 255}, DType::kF8E8M0, DType::kF32))[0], 1.0f);
  const std::vector<float> back = cast<uint8_t, float>({127, 0, 130, 255}, DType::kF8E8M0, DType::kF32);
  EXPECT_EQ(back[1], std::ldexp(1.0f, -127));
  EXPECT_EQ(back[2], 8.0f);
  EXPECT_TRUE(std::isnan(back[3]));
}

TEST(CastKernel, SubByteIntegersTruncateThenWrap) {
  // One element per byte, low bits; as ml_dtypes: truncate toward zero, then
  // keep the low bits.
  const std::vector<float> x = {-9.5f, -8.7f, -0.5f, 2.5f, 7.6f, 8, 15.5f, 17, std::nanf(""), kInf};
  EXPECT_EQ(toBits(x, DType::kI4), (std::vector<uint8_t>{0x7, 0x8, 0x0, 0x2, 0x7, 0x8, 0xF, 0x1, 0x0, 0x0}));
  EXPECT_EQ(toBits(x, DType::kU4), (std::vector<uint8_t>{0x7, 0x8, 0x0, 0x2, 0x7, 0x8, 0xF, 0x1, 0x0, 0x0}));
  EXPECT_EQ(toBits({-3, -2, -1, 0, 1, 2, 3}, DType::kI2), (std::vector<uint8_t>{1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(toBits({-3, -2, -1, 0, 1, 2, 3}, DType::kU2), (std::vector<uint8_t>{1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ((cast<uint8_t, int8_t>({0x0, 0x7, 0x8, 0xF}, DType::kI4, DType::kI8)), (std::vector<int8_t>{0, 7, -8, -1}));
  EXPECT_EQ((cast<uint8_t, float>({0x8, 0xF, 0x3}, DType::kU4, DType::kF32)), (std::vector<float>{8, 15, 3}));
  EXPECT_EQ((cast<uint8_t, float>({0x2, 0x3, 0x1}, DType::kI2, DType::kF32)), (std::vector<float>{-2, -1, 1}));
  EXPECT_EQ((cast<int32_t, uint8_t>({200, -56, 16}, DType::kI32, DType::kU4)), (std::vector<uint8_t>{0x8, 0x8, 0x0}));
  // Only the low bits of an input byte count.
  EXPECT_EQ((cast<uint8_t, int8_t>({0xF7}, DType::kI4, DType::kI8)), (std::vector<int8_t>{7}));
}

TEST(CastKernel, EveryPairOfTypesHasAKernel) {
  for (DType from : allDTypes()) {
    for (DType to : allDTypes()) {
      std::vector<Operand> inputs = {output(from, {3})};
      EXPECT_EQ(prepareError("Cast", inputs, {output(to, {3})}, params({{"to", static_cast<int64_t>(to)}})),
                "(no error)")
          << dtypeName(from) << " to " << dtypeName(to);
    }
  }
}

TEST(CastLikeKernel, CastsToTheSecondInputsType) {
  std::vector<Operand> inputs = {operand<float>({3}, {1.5f, 465, -kInf}), output(DType::kF8E4M3, {1})};
  std::vector<Operand> outputs = {output(DType::kF8E4M3, {3})};
  PreparedKernel("CastLike", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<uint8_t>(), (std::vector<uint8_t>{0x3C, 0x7E, 0xFE}));
  PreparedKernel("CastLike", inputs, outputs, params({{"saturate", int64_t{0}}})).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<uint8_t>(), (std::vector<uint8_t>{0x3C, 0x7F, 0xFF}));
  EXPECT_EQ(prepareError("CastLike", {inputs[0]}, outputs), "CastLike: expects 2 inputs, got 1");
  EXPECT_EQ(prepareError("CastLike", inputs, {output(DType::kF16, {3})}),
            "CastLike: output is f16[3] but the inputs give f8e4m3[3]");
}

TEST(CastKernel, PrepareErrors) {
  EXPECT_EQ(prepareError("Cast", {operand<float>({1}, {1})}, {output(DType::kF32, {1})}),
            "Cast: needs the attribute to");
  EXPECT_EQ(prepareError("Cast", {operand<float>({1}, {1})}, {output(DType::kF32, {1})}, params({{"to", int64_t{99}}})),
            "Cast: to = 99 is not a known element type");
  EXPECT_EQ(prepareError("Cast", {operand<float>({1}, {1})}, {output(DType::kI32, {2})},
                         params({{"to", static_cast<int64_t>(DType::kI32)}})),
            "Cast: output is i32[2] but the inputs give i32[1]");
  EXPECT_EQ(prepareError("Cast", {operand<float>({1}, {1})}, {output(DType::kF8E8M0, {1})},
                         params({{"to", static_cast<int64_t>(DType::kF8E8M0)}, {"round_mode", std::string("odd")}})),
            "Cast: round_mode is 'odd', expected 'up', 'down' or 'nearest'");
  EXPECT_EQ(prepareError("Cast", {operand<float>({1}, {1})}, {output(DType::kF8E4M3, {1})},
                         params({{"to", static_cast<int64_t>(DType::kF8E4M3)}, {"saturate", int64_t{2}}})),
            "Cast: saturate is 2, expected 0 or 1");
}

}  // namespace
}  // namespace kiln
