// Element types for kernels that compute (indexing.cc, resize_general.cc):
// the 16-bit floats as bit patterns with arithmetic in f32 (Arith), and a
// dispatch from DType to the C++ type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kiln/dtype.h"

namespace kiln::numeric {

// The 16-bit floats, stored as their bits; arithmetic on them runs in f32.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24
    std::memcpy(&bits, &value, sizeof bits);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Round to nearest, ties to even.
inline uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs < 0x38800000u) {
    float a;
    std::memcpy(&a, &abs, sizeof a);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13));
}

inline float bfloatToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline uint16_t floatToBfloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// How a kernel computes in element type T: in Acc, loading and storing
// through these.
template <typename T>
struct Arith {
  using Acc = T;
  static Acc load(T v) { return v; }
  static T store(Acc v) { return v; }
};
template <>
struct Arith<Half> {
  using Acc = float;
  static float load(Half v) { return halfToFloat(v.bits); }
  static Half store(float v) { return Half{floatToHalf(v)}; }
};
template <>
struct Arith<BFloat16> {
  using Acc = float;
  static float load(BFloat16 v) { return bfloatToFloat(v.bits); }
  static BFloat16 store(float v) { return BFloat16{floatToBfloat(v)}; }
};

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the arithmetic type of `dtype`; false for the
// types without one (bool, the 8-bit floats).
template <typename F>
bool withNumericType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(TypeTag<float>{}); return true;
    case DType::kF64: f(TypeTag<double>{}); return true;
    case DType::kF16: f(TypeTag<Half>{}); return true;
    case DType::kBF16: f(TypeTag<BFloat16>{}); return true;
    case DType::kI8: f(TypeTag<int8_t>{}); return true;
    case DType::kU8: f(TypeTag<uint8_t>{}); return true;
    case DType::kI16: f(TypeTag<int16_t>{}); return true;
    case DType::kU16: f(TypeTag<uint16_t>{}); return true;
    case DType::kI32: f(TypeTag<int32_t>{}); return true;
    case DType::kU32: f(TypeTag<uint32_t>{}); return true;
    case DType::kI64: f(TypeTag<int64_t>{}); return true;
    case DType::kU64: f(TypeTag<uint64_t>{}); return true;
    default: return false;
  }
}

template <typename F>
bool withFloatType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(TypeTag<float>{}); return true;
    case DType::kF64: f(TypeTag<double>{}); return true;
    case DType::kF16: f(TypeTag<Half>{}); return true;
    case DType::kBF16: f(TypeTag<BFloat16>{}); return true;
    default: return false;
  }
}

}  // namespace kiln::numeric
