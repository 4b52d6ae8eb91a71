// Conversions between f32 and the narrow float formats kiln stores but does
// not compute in: IEEE binary16 (f16), bfloat16 (bf16) and the two ONNX float8 formats,
// FLOAT8E4M3FN (4 exponent bits, bias 7, no infinities, NaN = S.1111.111,
// largest finite 448) and FLOAT8E5M2 (5 exponent bits, bias 15, IEEE-like
// with infinities, largest finite 57344).
//
// Every conversion to a narrow format rounds to nearest, ties to even. The
// float8 ones follow ONNX's Cast/QuantizeLinear `saturate` rule: with
// saturate, out-of-range values (infinities included) become the largest
// finite value of their sign; without it they become NaN (E4M3FN) or
// infinity (E5M2). NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kiln {

// ----------------------------------------------------------------- f16

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal: mantissa * 2^-24, exact in float.
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &value, sizeof bits);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Overflow gives inf, NaN stays NaN.
inline uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: round abs / 2^-24 to an integer.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 16777216.0f;  // exact: a power of two
    const float rounded = std::nearbyint(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xFFFu + mantissa_odd;  // ties to even
  return static_cast<uint16_t>(sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13));
}

// ---------------------------------------------------------------- bf16

inline float bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Round to nearest, ties to even; NaN stays NaN.
inline uint16_t floatToBfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------- float8

// The layout of one float8 format.
struct Float8Format {
  int mantissa_bits;
  int bias;
  uint8_t max_code;  // the largest finite value's code, sign bit clear
  bool has_infinity;  // E5M2: exponent all ones and mantissa 0
};

inline constexpr Float8Format kFloat8E4M3{3, 7, 0x7E, false};
inline constexpr Float8Format kFloat8E5M2{2, 15, 0x7B, true};

inline float float8ToFloat(uint8_t code, const Float8Format& format) {
  const bool negative = (code & 0x80u) != 0;
  const int m_bits = format.mantissa_bits;
  const int exponent = (code & 0x7F) >> m_bits;
  const int mantissa = code & ((1 << m_bits) - 1);
  const int max_exponent = (1 << (7 - m_bits)) - 1;
  float value;
  if (format.has_infinity && exponent == max_exponent) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!format.has_infinity && (code & 0x7F) == 0x7F) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), 1 - format.bias - m_bits);  // subnormal
  } else {
    value = std::ldexp(static_cast<float>(mantissa + (1 << m_bits)), exponent - format.bias - m_bits);
  }
  return negative ? -value : value;
}

inline uint8_t floatToFloat8(float f, const Float8Format& format, bool saturate) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  constexpr uint8_t nan = 0x7F;  // E5M2: S.11111.11, E4M3FN: S.1111.111
  const uint8_t overflow = saturate ? format.max_code : (format.has_infinity ? 0x7C : nan);
  if (std::isnan(f)) return sign | nan;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | overflow;
  const int m_bits = format.mantissa_bits;
  const int min_normal_exponent = 1 - format.bias;
  int exponent;
  std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  --exponent;                // a = 1.xxx * 2^exponent
  uint32_t code;
  if (a == 0 || exponent < min_normal_exponent) {
    // Subnormal (or rounds up to the smallest normal: the code is the same).
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, format.bias - 1 + m_bits)));
  } else {
    auto mantissa = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, m_bits - exponent)));  // in [2^m, 2^(m+1)]
    if (mantissa == (1u << (m_bits + 1))) {
      mantissa >>= 1;
      ++exponent;
    }
    code = (static_cast<uint32_t>(exponent + format.bias) << m_bits) | (mantissa - (1u << m_bits));
  }
  if (code > format.max_code) return sign | overflow;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace kiln
