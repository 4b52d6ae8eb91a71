#include "kiln/dtype.h"

#include <array>

namespace kiln {
namespace {

struct DTypeRow {
  DType dtype;
  size_t size;
  std::string_view name;
  std::string_view display;
  size_t packed_bits = 8 * size;  // in ONNX's packed storage
};

constexpr std::array<DTypeRow, 23> kRows = {{
    {DType::kBool, 1, "bool", "BOOL"},
    {DType::kF16, 2, "f16", "F16"},
    {DType::kBF16, 2, "bf16", "BF16"},
    {DType::kF32, 4, "f32", "F32"},
    {DType::kF64, 8, "f64", "F64"},
    {DType::kI8, 1, "i8", "I8"},
    {DType::kU8, 1, "u8", "U8"},
    {DType::kI16, 2, "i16", "I16"},
    {DType::kU16, 2, "u16", "U16"},
    {DType::kI32, 4, "i32", "I32"},
    {DType::kU32, 4, "u32", "U32"},
    {DType::kI64, 8, "i64", "I64"},
    {DType::kU64, 8, "u64", "U64"},
    {DType::kF8E4M3, 1, "f8e4m3", "F8E4M3"},
    {DType::kF8E5M2, 1, "f8e5m2", "F8E5M2"},
    {DType::kF8E4M3FNUZ, 1, "f8e4m3fnuz", "F8E4M3FNUZ"},
    {DType::kF8E5M2FNUZ, 1, "f8e5m2fnuz", "F8E5M2FNUZ"},
    {DType::kF8E8M0, 1, "f8e8m0", "F8E8M0"},
    {DType::kF4E2M1, 1, "f4e2m1", "F4E2M1", 4},
    {DType::kI4, 1, "i4", "I4", 4},
    {DType::kU4, 1, "u4", "U4", 4},
    {DType::kI2, 1, "i2", "I2", 2},
    {DType::kU2, 1, "u2", "U2", 2},
}};

constexpr std::array<DType, kRows.size()> kAll = [] {
  std::array<DType, kRows.size()> all{};
  for (size_t i = 0; i < kRows.size(); ++i) all[i] = kRows[i].dtype;
  return all;
}();

const DTypeRow* findRow(DType dtype) {
  for (const DTypeRow& row : kRows) {
    if (row.dtype == dtype) return &row;
  }
  return nullptr;
}

}  // namespace

std::span<const DType> allDTypes() { return kAll; }

bool isValidDType(uint8_t code) { return findRow(static_cast<DType>(code)) != nullptr; }

size_t dtypeSize(DType dtype) {
  const DTypeRow* row = findRow(dtype);
  return row ? row->size : 0;
}

std::string_view dtypeName(DType dtype) {
  const DTypeRow* row = findRow(dtype);
  return row ? row->name : "undefined";
}

std::string_view dtypeDisplayName(DType dtype) {
  const DTypeRow* row = findRow(dtype);
  return row ? row->display : "UNDEFINED";
}

std::optional<DType> dtypeFromName(std::string_view name) {
  for (const DTypeRow& row : kRows) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

size_t dtypePackedBits(DType dtype) {
  const DTypeRow* row = findRow(dtype);
  return row ? row->packed_bits : 0;
}

bool isStorageOnly(DType dtype) {
  switch (dtype) {
    case DType::kF8E4M3:
    case DType::kF8E4M3FNUZ:
    case DType::kF8E5M2:
    case DType::kF8E5M2FNUZ:
    case DType::kF8E8M0:
    case DType::kF4E2M1:
    case DType::kI4:
    case DType::kU4:
    case DType::kI2:
    case DType::kU2:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln
