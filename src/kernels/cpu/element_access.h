// Reading and writing single elements of any numeric type as float or
// double, for the kernels that take many element types but compute in f32
// or f64 (quantization.cc, signal.cc, sampling.cc, conv.cc's loop): a switch
// per element, which keeps those kernels free of one template instance per
// type combination. Not for the hot loops of the main kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/float_formats.h"
#include "kiln/dtype.h"

namespace kiln {

template <typename T>
T loadElement(const std::byte* data, int64_t i) {
  T v;
  std::memcpy(&v, data + static_cast<size_t>(i) * sizeof(T), sizeof v);
  return v;
}

template <typename T>
void storeElement(std::byte* data, int64_t i, T v) {
  std::memcpy(data + static_cast<size_t>(i) * sizeof(T), &v, sizeof v);
}

// The value of a sub-byte integer element (i4, u4, i2, u2: one element per
// byte, in its low `bits` bits).
inline int32_t subByteValue(uint8_t byte, int bits, bool is_signed) {
  const int32_t v = byte & ((1 << bits) - 1);
  return is_signed && (v >> (bits - 1)) != 0 ? v - (1 << bits) : v;
}

// True for the types loadAsFloat reads.
inline bool isLoadableAsFloat(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kF64: case DType::kF16: case DType::kBF16:
    case DType::kU8: case DType::kI8: case DType::kU16: case DType::kI16:
    case DType::kI32: case DType::kI64: case DType::kF8E4M3: case DType::kF8E5M2:
    case DType::kU4: case DType::kI4: case DType::kU2: case DType::kI2: case DType::kF4E2M1:
      return true;
    default:
      return false;
  }
}

// Element i as float (integers convert exactly up to 2^24).
inline float loadAsFloat(const std::byte* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return loadElement<float>(data, i);
    case DType::kF64: return static_cast<float>(loadElement<double>(data, i));
    case DType::kF16: return halfToFloat(loadElement<uint16_t>(data, i));
    case DType::kBF16: return bfloat16ToFloat(loadElement<uint16_t>(data, i));
    case DType::kU8: return static_cast<float>(loadElement<uint8_t>(data, i));
    case DType::kI8: return static_cast<float>(loadElement<int8_t>(data, i));
    case DType::kU16: return static_cast<float>(loadElement<uint16_t>(data, i));
    case DType::kI16: return static_cast<float>(loadElement<int16_t>(data, i));
    case DType::kI32: return static_cast<float>(loadElement<int32_t>(data, i));
    case DType::kI64: return static_cast<float>(loadElement<int64_t>(data, i));
    case DType::kU4: return static_cast<float>(subByteValue(loadElement<uint8_t>(data, i), 4, false));
    case DType::kI4: return static_cast<float>(subByteValue(loadElement<uint8_t>(data, i), 4, true));
    case DType::kU2: return static_cast<float>(subByteValue(loadElement<uint8_t>(data, i), 2, false));
    case DType::kI2: return static_cast<float>(subByteValue(loadElement<uint8_t>(data, i), 2, true));
    case DType::kF4E2M1:
      return static_cast<float>(miniFloatToDouble(loadElement<uint8_t>(data, i) & 0xFu, MiniFloat::kF4E2M1));
    case DType::kF8E4M3:
      return static_cast<float>(miniFloatToDouble(loadElement<uint8_t>(data, i), MiniFloat::kF8E4M3FN));
    case DType::kF8E5M2:
      return static_cast<float>(miniFloatToDouble(loadElement<uint8_t>(data, i), MiniFloat::kF8E5M2));
    default: return 0;
  }
}

// Element i as double: exact for f64 (and everything loadAsFloat reads).
inline double loadAsDouble(const std::byte* data, DType dtype, int64_t i) {
  return dtype == DType::kF64 ? loadElement<double>(data, i) : static_cast<double>(loadAsFloat(data, dtype, i));
}

// True for the types storeFloat writes.
inline bool isFloatType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// Writes element i of a float tensor (f32, f64, f16, bf16), rounding to
// nearest even.
inline void storeFloat(std::byte* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32: storeElement(data, i, static_cast<float>(v)); return;
    case DType::kF64: storeElement(data, i, v); return;
    case DType::kF16: storeElement(data, i, floatToHalf(static_cast<float>(v))); return;
    case DType::kBF16: storeElement(data, i, floatToBfloat16(static_cast<float>(v))); return;
    default: return;
  }
}

}  // namespace kiln
