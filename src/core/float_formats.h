// Conversions between float / double and the narrow floating-point formats
// kiln stores: IEEE binary16 (f16), bfloat16 (bf16), the float8 formats
// (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0) and float4 E2M1.
//
// Each conversion is exact where the value is representable and otherwise
// rounds to nearest, ties to even (E8M0 has its own modes), with the NaN,
// infinity and overflow rules of ONNX's Cast, which match ml_dtypes: the
// `saturate` flag turns overflow (and infinities) into the largest finite
// value of the sign; without it overflow gives infinity where the format has
// one, else NaN. float4 E2M1, which has neither, always saturates (and NaN
// becomes a zero, as in ml_dtypes).
//
// A value is held as its bits in the low bits of an integer. f16 and bf16
// from float have fast inline paths (kernels compute f16/bf16 elementwise
// ops in f32 and round on store); the other formats go through one generic
// encoder over double, which is exact for every source type since double
// holds every f32, f16 and narrower value exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

// --------------------------------------------------------------- f16, bf16

// Elements of f16 and bf16 tensors, as kernels read and write them: their
// bits, in types that templates tell apart from uint16_t.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint32_t floatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return bitsToFloat(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return bitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  return bitsToFloat(sign | floatToBits(static_cast<float>(mantissa) * 5.9604644775390625e-8f));
}

// Round to nearest, ties to even; overflow gives inf, NaN stays NaN.
inline uint16_t floatToHalf(float f) {
  const uint32_t bits = floatToBits(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // The result is subnormal or zero: abs / 2^-24 (exact: a power of two)
    // rounded to an integer, ties to even.
    const float rounded = std::nearbyint(bitsToFloat(abs) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xFFFu + mantissa_odd;  // ties to even
  return static_cast<uint16_t>(sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13));
}

inline float bfloat16ToFloat(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even; NaN becomes the quiet NaN of its sign
// (0x7FC0 or 0xFFC0, as ml_dtypes).
inline uint16_t floatToBfloat16(float f) {
  const uint32_t bits = floatToBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7FC0u);
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// ------------------------------------------------------ the generic formats

// Sign, exponent and mantissa formats. How each spends its special codes:
//   IEEE-like (f16, bf16, E5M2): all-ones exponent is inf (mantissa 0) or NaN
//   FN (E4M3FN): no inf; S.1111.111 is NaN
//   FNUZ (E4M3FNUZ, E5M2FNUZ): no inf, no -0; 0x80 is the one NaN
//   F4E2M1: no inf, no NaN
enum class MiniFloat { kF16, kBF16, kF8E4M3FN, kF8E4M3FNUZ, kF8E5M2, kF8E5M2FNUZ, kF4E2M1 };

// The value of `code` (its bits in the low bits).
double miniFloatToDouble(uint32_t code, MiniFloat format);

// `value` rounded to nearest even in `format`, with ONNX's overflow rules
// (see the top of this file).
uint32_t doubleToMiniFloat(double value, MiniFloat format, bool saturate);

// ------------------------------------------------------------------- E8M0

// FLOAT8E8M0: an unsigned power of two 2^(code - 127); 0xFF is NaN; no zero.
enum class E8M0Rounding { kUp, kDown, kNearest };

// The `round_mode` attribute of Cast ("up", "down", "nearest"); false for
// another name.
bool e8m0RoundingFromName(std::string_view name, E8M0Rounding& out);

float e8m0ToFloat(uint8_t code);

// As onnx.numpy_helper.to_float8e8m0 (the reference of ONNX's Cast): the
// value's f32 exponent, rounded up, down or to nearest by its mantissa bits;
// the sign is ignored; NaN and inf give 0xFF; with `saturate` rounding never
// carries past 2^127.
uint8_t floatToE8M0(float value, bool saturate, E8M0Rounding rounding);

}  // namespace kiln
