// Element data types.
//
// The numeric codes are those of ONNX's TensorProto.DataType, so that a type
// read from an ONNX model or written into a package keeps one number
// everywhere. The codes are part of the package format: never renumber.
//
// The 8-, 4- and 2-bit types (f8*, f4e2m1, i4, u4, i2, u2) are storage
// types: they can be stored, copied and converted (Cast), but kernels compute
// in a wider type. In memory every element takes one byte, its bits in the
// low bits of that byte and the high bits zero (ml_dtypes' layout, so numpy
// arrays pass as they are); ONNX files pack two 4-bit or four 2-bit elements
// per byte, which the ONNX importer unpacks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

namespace kiln {

enum class DType : uint8_t {
  kUndefined = 0,
  kF32 = 1,
  kU8 = 2,
  kI8 = 3,
  kU16 = 4,
  kI16 = 5,
  kI32 = 6,
  kI64 = 7,
  kBool = 9,
  kF16 = 10,
  kF64 = 11,
  kU32 = 12,
  kU64 = 13,
  kBF16 = 16,
  kF8E4M3 = 17,      // ONNX FLOAT8E4M3FN
  kF8E4M3FNUZ = 18,  // ONNX FLOAT8E4M3FNUZ
  kF8E5M2 = 19,      // ONNX FLOAT8E5M2
  kF8E5M2FNUZ = 20,  // ONNX FLOAT8E5M2FNUZ
  kU4 = 21,          // ONNX UINT4
  kI4 = 22,          // ONNX INT4
  kF4E2M1 = 23,      // ONNX FLOAT4E2M1
  kF8E8M0 = 24,      // ONNX FLOAT8E8M0
  kU2 = 25,          // ONNX UINT2
  kI2 = 26,          // ONNX INT2
};

// Every valid DType, in a stable order (used by tests and tools).
std::span<const DType> allDTypes();

// True for the codes listed above except kUndefined.
bool isValidDType(uint8_t code);

// Bytes per element in memory (1 for the 4- and 2-bit types); 0 for
// kUndefined.
size_t dtypeSize(DType dtype);

// Short lower-case name: "f32", "bf16", "f8e4m3", "bool", ...
std::string_view dtypeName(DType dtype);

// Upper-case name as shown by `kiln dump` (after the reference tool): "F32".
std::string_view dtypeDisplayName(DType dtype);

// Inverse of dtypeName; std::nullopt for an unknown name.
std::optional<DType> dtypeFromName(std::string_view name);

// Bits per element in ONNX's packed storage: 4 or 2 for the sub-byte types,
// else 8 * dtypeSize.
size_t dtypePackedBits(DType dtype);

// True for types that kernels do not compute in directly (the 8-, 4- and
// 2-bit types).
bool isStorageOnly(DType dtype);

// u8 or i8: the types of quantized activations and weights.
constexpr bool isInteger8(DType dtype) { return dtype == DType::kU8 || dtype == DType::kI8; }

// The DType of a C++ element type: dtypeOf<float>() == DType::kF32.
template <typename T>
constexpr DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  else if constexpr (std::is_same_v<T, double>) return DType::kF64;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::kI8;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::kU8;
  else if constexpr (std::is_same_v<T, int16_t>) return DType::kI16;
  else if constexpr (std::is_same_v<T, uint16_t>) return DType::kU16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::kU32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  else if constexpr (std::is_same_v<T, uint64_t>) return DType::kU64;
  else if constexpr (std::is_same_v<T, bool>) return DType::kBool;
  else static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

}  // namespace kiln
