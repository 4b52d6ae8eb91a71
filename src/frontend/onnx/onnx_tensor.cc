#include "frontend/onnx/onnx_tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <fstream>

#include "kiln/error.h"

namespace kiln::onnx_import {
namespace {

[[noreturn]] void fail(const ModelSource& source, const onnx::TensorProto& tensor, const std::string& problem) {
  throw GraphError(fmt::format("{}: tensor '{}': {}", source.name, tensor.name(), problem));
}

// Copies typed-field values into `out`, each converted to the element type.
template <typename Element, typename Field>
void copyTyped(const Field& field, std::vector<std::byte>& out) {
  out.resize(static_cast<size_t>(field.size()) * sizeof(Element));
  for (int i = 0; i < field.size(); ++i) {
    const auto element = static_cast<Element>(field.Get(i));
    std::memcpy(out.data() + static_cast<size_t>(i) * sizeof(Element), &element, sizeof(Element));
  }
}

// ONNX packs 4-bit elements two to a byte and 2-bit ones four to a byte,
// the first element in the low bits; kiln keeps one element per byte (see
// kiln/dtype.h). Unpacks `count` elements of `bits` bits each.
std::vector<std::byte> unpackSubByte(const std::vector<std::byte>& packed, uint64_t count, size_t bits) {
  const size_t per_byte = 8 / bits;
  const auto mask = static_cast<unsigned>((1u << bits) - 1);
  std::vector<std::byte> elements(count);
  for (uint64_t i = 0; i < count; ++i) {
    const auto byte = static_cast<unsigned>(packed[i / per_byte]);
    elements[i] = static_cast<std::byte>((byte >> ((i % per_byte) * bits)) & mask);
  }
  return elements;
}

std::vector<std::byte> readExternal(const onnx::TensorProto& tensor, const ModelSource& source, uint64_t expected) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const auto& entry : tensor.external_data()) {
    try {
      if (entry.key() == "location") location = entry.value();
      if (entry.key() == "offset") offset = std::stoull(entry.value());
      if (entry.key() == "length") length = std::stoull(entry.value());
    } catch (const std::exception&) {
      fail(source, tensor, fmt::format("external data {} '{}' is not a number", entry.key(), entry.value()));
    }
  }
  if (source.base_directory.empty()) fail(source, tensor, "external data is not available for in-memory models");
  const std::filesystem::path relative(location);
  if (location.empty() || relative.is_absolute() ||
      std::any_of(relative.begin(), relative.end(), [](const auto& part) { return part == ".."; })) {
    fail(source, tensor, fmt::format("external data location '{}' must be a relative path inside the model's "
                                     "directory", location));
  }
  if (length && *length != expected) {
    fail(source, tensor, fmt::format("external data length {} differs from the {} bytes its shape needs", *length,
                                     expected));
  }
  const std::filesystem::path path = source.base_directory / relative;
  // The file, links followed, must be a regular file (a FIFO would block
  // open() forever) inside the model's directory: a symlink shipped with a
  // model must not read any other file of this machine into the package.
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    fail(source, tensor, fmt::format("external data {} is missing or not a regular file", path.string()));
  }
  const std::filesystem::path target = std::filesystem::canonical(path, error);
  const auto inside = [&](const std::filesystem::path& directory) {
    std::error_code ignored;
    const std::filesystem::path base = directory.empty() ? directory : std::filesystem::canonical(directory, ignored);
    if (base.empty() || ignored) return false;
    const std::filesystem::path rest = target.lexically_relative(base);
    return !rest.empty() && *rest.begin() != "..";
  };
  if (error || (!inside(source.base_directory) && !inside(source.resolved_directory))) {
    fail(source, tensor, fmt::format("external data {} leads to {}, outside the model's directory (a symbolic link "
                                     "out of it is refused)",
                                     path.string(), target.string()));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(source, tensor, fmt::format("cannot open external data file {}", path.string()));
  const auto file_size = static_cast<uint64_t>(in.tellg());
  if (offset > file_size || expected > file_size - offset) {
    fail(source, tensor, fmt::format("external data needs bytes {}..{} of {}, which has {}", offset, offset + expected,
                                     path.string(), file_size));
  }
  std::vector<std::byte> bytes(expected);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(expected));
  if (!in) fail(source, tensor, fmt::format("cannot read external data from {}", path.string()));
  return bytes;
}

}  // namespace

DType dtypeFromOnnx(int32_t onnx_type, const ModelSource& source, const std::string& what) {
  // kiln's codes are ONNX's, so a valid code converts as is.
  if (onnx_type > 0 && onnx_type < 256 && isValidDType(static_cast<uint8_t>(onnx_type))) {
    return static_cast<DType>(onnx_type);
  }
  throw GraphError(fmt::format("{}: {} has ONNX data type {}, which kiln does not support (string and complex "
                               "types are not tensor storage types in kiln)",
                               source.name, what, onnx_type));
}

ConstantPtr constantFromTensorProto(const onnx::TensorProto& tensor, const ModelSource& source) {
  TensorInfo info;
  info.dtype = dtypeFromOnnx(tensor.data_type(), source, fmt::format("tensor '{}'", tensor.name()));
  if (static_cast<size_t>(tensor.dims_size()) > kMaxRank) fail(source, tensor, "rank exceeds 32");
  for (int64_t dim : tensor.dims()) {
    if (dim < 0) fail(source, tensor, fmt::format("negative dimension {}", dim));
    info.shape.push_back(dim);
  }
  uint64_t expected = 0;
  uint64_t count = 0;
  try {
    expected = info.sizeInBytes();
    count = info.numElements();
  } catch (const UsageError&) {
    fail(source, tensor, "size overflows: shape " + info.shapeString());
  }
  // What the file holds: sub-byte types packed, the others as in memory.
  const size_t bits = dtypePackedBits(info.dtype);
  const bool packed = bits < 8;
  const uint64_t per_byte = packed ? 8 / bits : 1;
  const uint64_t stored = packed ? count / per_byte + (count % per_byte != 0 ? 1 : 0) : expected;  // no overflow

  std::vector<std::byte> bytes;
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    bytes = readExternal(tensor, source, stored);
  } else if (tensor.has_raw_data()) {
    const std::string& raw = tensor.raw_data();
    bytes.resize(raw.size());
    if (!raw.empty()) std::memcpy(bytes.data(), raw.data(), raw.size());  // an empty vector's data() may be null
  } else {
    switch (info.dtype) {
      case DType::kF32: copyTyped<float>(tensor.float_data(), bytes); break;
      case DType::kF64: copyTyped<double>(tensor.double_data(), bytes); break;
      case DType::kI64: copyTyped<int64_t>(tensor.int64_data(), bytes); break;
      case DType::kU32: copyTyped<uint32_t>(tensor.uint64_data(), bytes); break;
      case DType::kU64: copyTyped<uint64_t>(tensor.uint64_data(), bytes); break;
      case DType::kI32: copyTyped<int32_t>(tensor.int32_data(), bytes); break;
      case DType::kI16: copyTyped<int16_t>(tensor.int32_data(), bytes); break;
      case DType::kU16:
      case DType::kF16:
      case DType::kBF16: copyTyped<uint16_t>(tensor.int32_data(), bytes); break;  // bit patterns
      case DType::kI8: copyTyped<int8_t>(tensor.int32_data(), bytes); break;
      case DType::kU8:
      case DType::kBool:
      case DType::kF8E4M3:
      case DType::kF8E4M3FNUZ:
      case DType::kF8E5M2:
      case DType::kF8E5M2FNUZ:
      case DType::kF8E8M0:
      case DType::kF4E2M1:  // these four: one packed byte per int32
      case DType::kI4:
      case DType::kU4:
      case DType::kI2:
      case DType::kU2: copyTyped<uint8_t>(tensor.int32_data(), bytes); break;
      case DType::kUndefined: break;
    }
  }
  if (bytes.size() != stored) {
    fail(source, tensor, fmt::format("holds {} bytes of data but {} needs {}", bytes.size(), info.toString(), stored));
  }
  if (packed) bytes = unpackSubByte(bytes, count, bits);
  return makeConstant(std::move(info), std::move(bytes));
}

}  // namespace kiln::onnx_import
