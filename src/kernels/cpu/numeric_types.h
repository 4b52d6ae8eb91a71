// Element types for kernels that compute (indexing.cc, resize_general.cc):
// the 16-bit floats as bit patterns with arithmetic in f32 (Arith), and a
// dispatch from DType to the C++ type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/float_formats.h"
#include "kiln/dtype.h"

namespace kiln::numeric {

// The 16-bit floats, stored as their bits; arithmetic on them runs in f32.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The conversions are core's (core/float_formats.h): one definition of the
// rounding for every kernel.
using kiln::floatToHalf;
using kiln::halfToFloat;
inline float bfloatToFloat(uint16_t b) { return kiln::bfloat16ToFloat(b); }
inline uint16_t floatToBfloat(float f) { return kiln::floatToBfloat16(f); }

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
