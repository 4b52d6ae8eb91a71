#include "core/float_formats.h"

#include <algorithm>
#include <cmath>

namespace kiln {
namespace {

enum class Specials { kIeee, kFn, kFnuz, kNone };

struct Layout {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  double max_finite;
  Specials specials;
};

constexpr Layout layoutOf(MiniFloat format) {
  switch (format) {
    case MiniFloat::kF16: return {5, 10, 15, 65504.0, Specials::kIeee};
    case MiniFloat::kBF16: return {8, 7, 127, 3.38953138925153547590e38, Specials::kIeee};
    case MiniFloat::kF8E4M3FN: return {4, 3, 7, 448.0, Specials::kFn};
    case MiniFloat::kF8E4M3FNUZ: return {4, 3, 8, 240.0, Specials::kFnuz};
    case MiniFloat::kF8E5M2: return {5, 2, 15, 57344.0, Specials::kIeee};
    case MiniFloat::kF8E5M2FNUZ: return {5, 2, 16, 57344.0, Specials::kFnuz};
    case MiniFloat::kF4E2M1: return {2, 1, 1, 6.0, Specials::kNone};
  }
  return {};
}

// The code of value `r` >= 0, which must be representable in `layout`.
uint32_t encodeExact(double r, const Layout& layout) {
  if (r == 0) return 0;
  const int min_exponent = 1 - layout.bias;
  int e = 0;
  std::frexp(r, &e);  // r = f * 2^e, f in [0.5, 1): the leading bit's exponent is e - 1
  const int exponent = e - 1;
  if (exponent < min_exponent) {  // subnormal: r = mantissa * 2^(min_exponent - M)
    return static_cast<uint32_t>(std::ldexp(r, layout.mantissa_bits - min_exponent));
  }
  const auto significand = static_cast<uint32_t>(std::ldexp(r, layout.mantissa_bits - exponent));
  const auto biased = static_cast<uint32_t>(exponent + layout.bias);
  return (biased << layout.mantissa_bits) | (significand - (1u << layout.mantissa_bits));
}

}  // namespace

double miniFloatToDouble(uint32_t code, MiniFloat format) {
  const Layout layout = layoutOf(format);
  const int M = layout.mantissa_bits;
  const uint32_t sign_bit = 1u << (layout.exponent_bits + M);
  const uint32_t exponent_ones = (1u << layout.exponent_bits) - 1;
  code &= (sign_bit << 1) - 1;
  const bool negative = (code & sign_bit) != 0;
  const uint32_t biased = (code >> M) & exponent_ones;
  const uint32_t mantissa = code & ((1u << M) - 1);
  switch (layout.specials) {
    case Specials::kIeee:
      if (biased == exponent_ones) {
        if (mantissa != 0) return std::nan("");
        return negative ? -HUGE_VAL : HUGE_VAL;
      }
      break;
    case Specials::kFn:
      if (biased == exponent_ones && mantissa == (1u << M) - 1) return std::nan("");
      break;
    case Specials::kFnuz:
      if (code == sign_bit) return std::nan("");
      break;
    case Specials::kNone: break;
  }
  const double magnitude =
      biased == 0 ? std::ldexp(static_cast<double>(mantissa), 1 - layout.bias - M)
                  : std::ldexp(static_cast<double>(mantissa | (1u << M)), static_cast<int>(biased) - layout.bias - M);
  return negative ? -magnitude : magnitude;
}

uint32_t doubleToMiniFloat(double value, MiniFloat format, bool saturate) {
  const Layout layout = layoutOf(format);
  const int M = layout.mantissa_bits;
  const uint32_t sign_bit = 1u << (layout.exponent_bits + M);
  const uint32_t exponent_ones = (1u << layout.exponent_bits) - 1;
  const bool negative = std::signbit(value);
  const uint32_t sign = negative ? sign_bit : 0;
  const uint32_t max_code = encodeExact(layout.max_finite, layout);
  if (std::isnan(value)) {
    switch (layout.specials) {
      case Specials::kIeee: return sign | (exponent_ones << M) | (1u << (M - 1));  // quiet NaN
      case Specials::kFn: return sign | (exponent_ones << M) | ((1u << M) - 1);
      case Specials::kFnuz: return sign_bit;
      case Specials::kNone:
        // float4 E2M1 has no NaN. ml_dtypes, the reference, gives a zero
        // of the opposite sign bit; kiln gives the same bits.
        return negative ? 0 : sign_bit;
    }
  }
  // Round |value| to a multiple of the quantum of its binade (of the
  // subnormal binade below the smallest normal): exact scaling by powers of
  // two, one rounding, to nearest even.
  const double magnitude = std::fabs(value);
  double rounded = HUGE_VAL;
  if (std::isfinite(magnitude)) {
    int e = 0;
    std::frexp(magnitude, &e);
    const int quantum_exponent = std::max(e - 1, 1 - layout.bias) - M;
    rounded = std::ldexp(std::nearbyint(std::ldexp(magnitude, -quantum_exponent)), quantum_exponent);
  }
  if (rounded > layout.max_finite) {
    if (saturate || layout.specials == Specials::kNone) return sign | max_code;
    if (layout.specials == Specials::kIeee) return sign | (exponent_ones << M);  // inf
    if (layout.specials == Specials::kFn) return sign | (exponent_ones << M) | ((1u << M) - 1);
    return sign_bit;  // FNUZ NaN
  }
  const uint32_t code = encodeExact(rounded, layout);
  if (code == 0 && layout.specials == Specials::kFnuz) return 0;  // no -0: 0x80 is NaN
  return sign | code;
}

bool e8m0RoundingFromName(std::string_view name, E8M0Rounding& out) {
  if (name == "up") {
    out = E8M0Rounding::kUp;
  } else if (name == "down") {
    out = E8M0Rounding::kDown;
  } else if (name == "nearest") {
    out = E8M0Rounding::kNearest;
  } else {
    return false;
  }
  return true;
}

float e8m0ToFloat(uint8_t code) {
  if (code == 0xFF) return std::nanf("");
  // Made from bits, not by ldexp: 2^-127 is subnormal, and runs flush
  // subnormal results of arithmetic to zero (kernels/cpu/denormals.h).
  if (code == 0) return bitsToFloat(0x00400000u);
  return bitsToFloat(static_cast<uint32_t>(code) << 23);
}

uint8_t floatToE8M0(float value, bool saturate, E8M0Rounding rounding) {
  const uint32_t bits = floatToBits(value);
  uint32_t exponent = (bits >> 23) & 0xFFu;
  if (exponent == 0xFF) return 0xFF;
  bool round_up = false;
  switch (rounding) {
    case E8M0Rounding::kUp: round_up = (bits & 0x7FFFFFu) != 0; break;
    case E8M0Rounding::kDown: break;
    case E8M0Rounding::kNearest: {
      // The reference's rule, kept as it is: guard bit set, and round bit,
      // sticky bits or a non-zero exponent.
      const bool guard = (bits & 0x400000u) != 0;
      const bool round = (bits & 0x200000u) != 0;
      const bool sticky = (bits & 0x1FFFFFu) != 0;
      round_up = guard && (round || sticky || exponent > 0);
      break;
    }
  }
  if (round_up && !(saturate && exponent == 0xFE)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

}  // namespace kiln
