#include "core/float_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct FormatCase {
  MiniFloat format;
  int bits;
  double max_finite;
  double min_subnormal;
};

const FormatCase kFormats[] = {
    {MiniFloat::kF8E4M3FN, 8, 448, 0x1p-9},
    {MiniFloat::kF8E4M3FNUZ, 8, 240, 0x1p-10},
    {MiniFloat::kF8E5M2, 8, 57344, 0x1p-16},
    {MiniFloat::kF8E5M2FNUZ, 8, 57344, 0x1p-17},
    {MiniFloat::kF4E2M1, 4, 6, 0.5},
    {MiniFloat::kF16, 16, 65504, 0x1p-24},
    {MiniFloat::kBF16, 16, 0x1.fep127, 0x1p-133},
};

TEST(MiniFloat, EveryCodeRoundTripsAndValuesAreMonotonic) {
  for (const FormatCase& c : kFormats) {
    const uint32_t codes = 1u << c.bits;
    const uint32_t sign_bit = codes >> 1;
    double previous = -1;
    for (uint32_t code = 0; code < codes; ++code) {
      const double value = miniFloatToDouble(code, c.format);
      if (std::isnan(value)) continue;
      EXPECT_EQ(doubleToMiniFloat(value, c.format, false), code) << static_cast<int>(c.format) << " code " << code;
      if (code < sign_bit && std::isfinite(value)) {
        EXPECT_GT(value, previous) << "code " << code;
        previous = value;
        EXPECT_LE(value, c.max_finite);
      }
    }
    EXPECT_EQ(previous, c.max_finite) << static_cast<int>(c.format);
    EXPECT_EQ(miniFloatToDouble(1, c.format), c.min_subnormal) << static_cast<int>(c.format);
  }
}

TEST(MiniFloat, RoundsToNearestEvenAndHandlesOverflow) {
  // Halfway between the two smallest subnormals of E4M3FN: to even (2^-8).
  EXPECT_EQ(doubleToMiniFloat(1.5 * 0x1p-9, MiniFloat::kF8E4M3FN, true), 0x02u);
  EXPECT_EQ(doubleToMiniFloat(0.5 * 0x1p-9, MiniFloat::kF8E4M3FN, true), 0x00u);
  EXPECT_EQ(doubleToMiniFloat(0.5000001 * 0x1p-9, MiniFloat::kF8E4M3FN, true), 0x01u);
  EXPECT_EQ(doubleToMiniFloat(-kInf, MiniFloat::kF8E4M3FN, true), 0xFEu);
  EXPECT_EQ(doubleToMiniFloat(-kInf, MiniFloat::kF8E4M3FN, false), 0xFFu);
  EXPECT_EQ(doubleToMiniFloat(1e6, MiniFloat::kF8E5M2, false), 0x7Cu);
  EXPECT_EQ(doubleToMiniFloat(1e6, MiniFloat::kF16, false), 0x7C00u);
  EXPECT_EQ(doubleToMiniFloat(-1e-30, MiniFloat::kF8E5M2FNUZ, false), 0x00u);  // no -0
  EXPECT_EQ(doubleToMiniFloat(std::nan(""), MiniFloat::kF8E5M2FNUZ, false), 0x80u);
  EXPECT_EQ(doubleToMiniFloat(std::nan(""), MiniFloat::kF8E5M2, false), 0x7Eu);
  EXPECT_EQ(doubleToMiniFloat(7, MiniFloat::kF4E2M1, false), 0x7u);
  EXPECT_EQ(doubleToMiniFloat(1.0 + 0x1p-8, MiniFloat::kBF16, false), 0x3F80u);
}

TEST(HalfAndBFloat16, FastPathsMatchTheGenericEncoder) {
  for (float x : {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, 3e-8f, 0.333333f, -7.25e-5f, 1e30f, 3.0e38f}) {
    EXPECT_EQ(floatToHalf(x), doubleToMiniFloat(x, MiniFloat::kF16, false)) << x;
    EXPECT_EQ(floatToBfloat16(x), doubleToMiniFloat(x, MiniFloat::kBF16, false)) << x;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double generic = miniFloatToDouble(h, MiniFloat::kF16);
    const float fast = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(generic)) {
      EXPECT_TRUE(std::isnan(fast));
    } else {
      EXPECT_EQ(static_cast<double>(fast), generic) << h;
    }
  }
}

TEST(E8M0, RoundingModesAndSpecials) {
  E8M0Rounding mode = E8M0Rounding::kUp;
  EXPECT_TRUE(e8m0RoundingFromName("nearest", mode));
  EXPECT_EQ(mode, E8M0Rounding::kNearest);
  EXPECT_FALSE(e8m0RoundingFromName("zero", mode));
  EXPECT_EQ(floatToE8M0(1.0f, true, E8M0Rounding::kUp), 127);
  EXPECT_EQ(floatToE8M0(1.5f, true, E8M0Rounding::kUp), 128);
  EXPECT_EQ(floatToE8M0(1.5f, true, E8M0Rounding::kDown), 127);
  EXPECT_EQ(floatToE8M0(1.25f, true, E8M0Rounding::kNearest), 127);
  EXPECT_EQ(floatToE8M0(std::numeric_limits<float>::infinity(), true, E8M0Rounding::kUp), 255);
  EXPECT_EQ(e8m0ToFloat(127), 1.0f);
  EXPECT_EQ(e8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0ToFloat(255)));
}

}  // namespace
}  // namespace kiln
