#include "server/datatype.h"

#include <array>

namespace kiln::server {
namespace {

struct DatatypeName {
  DType dtype;
  std::string_view protocol;  // the inference protocol's name
  std::string_view config;    // the model configuration's name
  int config_number;          // its value in the DataType enum
};

constexpr std::array<DatatypeName, 13> kDatatypes{{
    {DType::kBool, "BOOL", "TYPE_BOOL", 1},
    {DType::kU8, "UINT8", "TYPE_UINT8", 2},
    {DType::kU16, "UINT16", "TYPE_UINT16", 3},
    {DType::kU32, "UINT32", "TYPE_UINT32", 4},
    {DType::kU64, "UINT64", "TYPE_UINT64", 5},
    {DType::kI8, "INT8", "TYPE_INT8", 6},
    {DType::kI16, "INT16", "TYPE_INT16", 7},
    {DType::kI32, "INT32", "TYPE_INT32", 8},
    {DType::kI64, "INT64", "TYPE_INT64", 9},
    {DType::kF16, "FP16", "TYPE_FP16", 10},
    {DType::kF32, "FP32", "TYPE_FP32", 11},
    {DType::kF64, "FP64", "TYPE_FP64", 12},
    {DType::kBF16, "BF16", "TYPE_BF16", 14},
}};

const DatatypeName* find(DType dtype) {
  for (const DatatypeName& entry : kDatatypes) {
    if (entry.dtype == dtype) return &entry;
  }
  return nullptr;
}

}  // namespace

std::string_view protocolDatatype(DType dtype) {
  const DatatypeName* entry = find(dtype);
  return entry != nullptr ? entry->protocol : std::string_view{};
}

std::optional<DType> dtypeFromProtocol(std::string_view datatype) {
  for (const DatatypeName& entry : kDatatypes) {
    if (entry.protocol == datatype) return entry.dtype;
  }
  return std::nullopt;
}

std::string_view configDatatype(DType dtype) {
  const DatatypeName* entry = find(dtype);
  return entry != nullptr ? entry->config : std::string_view{"TYPE_INVALID"};
}

int configDatatypeNumber(DType dtype) {
  const DatatypeName* entry = find(dtype);
  return entry != nullptr ? entry->config_number : 0;
}

}  // namespace kiln::server
