// Element data types.
//
// The numeric codes are those of ONNX's TensorProto.DataType, so that a type
// read from an ONNX model or written into a package keeps one number
// everywhere. The codes are part of the package format: never renumber.
//
// f8 types are storage types: they can be stored, copied and converted, but
// kernels compute in a wider type.
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
  kF8E4M3 = 17,  // ONNX FLOAT8E4M3FN
  kF8E5M2 = 19,  // ONNX FLOAT8E5M2
};

// Every valid DType, in a stable order (used by tests and tools).
std::span<const DType> allDTypes();

// True for the codes listed above except kUndefined.
bool isValidDType(uint8_t code);

// Bytes per element; 0 for kUndefined.
size_t dtypeSize(DType dtype);

// Short lower-case name: "f32", "bf16", "f8e4m3", "bool", ...
std::string_view dtypeName(DType dtype);

// Upper-case name as shown by `kiln dump` (after the reference tool): "F32".
std::string_view dtypeDisplayName(DType dtype);

// Inverse of dtypeName; std::nullopt for an unknown name.
std::optional<DType> dtypeFromName(std::string_view name);

// True for types that kernels do not compute in directly (f8).
bool isStorageOnly(DType dtype);

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
