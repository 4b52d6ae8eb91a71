#include "kiln/tensor_info.h"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {

std::optional<int64_t> multiplySizes(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return std::nullopt;
  return checkedMultiply(a, b);
}

std::optional<int64_t> elementCount(std::span<const int64_t> shape) {
  // The non-zero dimensions must multiply within int64 even when a zero
  // empties the tensor: kernels take partial products of the dimensions
  // (strides, row counts), and [0, 2^62, 4] would overflow them. Order does
  // not matter: [2^62, 2^62, 0] and [0, 2^62, 2^62] are both refused.
  bool empty = false;
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim == 0) {
      empty = true;
      continue;
    }
    const std::optional<int64_t> product = multiplySizes(count, dim);
    if (!product) return std::nullopt;
    count = *product;
  }
  return empty ? 0 : count;
}

std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

std::optional<int64_t> checkedSubtract(int64_t a, int64_t b) {
  int64_t difference = 0;
  if (__builtin_sub_overflow(a, b, &difference)) return std::nullopt;
  return difference;
}

std::optional<int64_t> checkedMultiply(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

bool TensorInfo::isStatic() const {
  for (int64_t dim : shape) {
    if (dim < 0) return false;
  }
  return true;
}

uint64_t TensorInfo::numElements() const {
  if (!isStatic()) throw UsageError("numElements() of a tensor with dynamic dimensions " + shapeString());
  const std::optional<int64_t> count = elementCount(shape);
  if (!count) throw UsageError("tensor size overflows 63 bits: " + shapeString());
  return static_cast<uint64_t>(*count);
}

uint64_t TensorInfo::sizeInBytes() const {
  // As for the element count, the bytes of the non-zero dimensions must fit
  // even when a zero empties the tensor (kernels compute byte strides).
  const uint64_t elements = numElements();
  std::optional<int64_t> bytes = static_cast<int64_t>(dtypeSize(dtype));
  for (size_t d = 0; d < shape.size() && bytes; ++d) bytes = multiplySizes(*bytes, std::max<int64_t>(shape[d], 1));
  if (!bytes) throw UsageError(fmt::format("tensor size overflows 63 bits: {} of {}-byte elements", shapeString(), dtypeSize(dtype)));
  return elements * dtypeSize(dtype);
}

std::string TensorInfo::shapeString() const {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += shape[i] == kDynamicDim ? std::string("?") : std::to_string(shape[i]);
  }
  return out + "]";
}

std::string TensorInfo::toString() const {
  std::string size = "?";
  if (isStatic()) {
    try {
      size = std::to_string(sizeInBytes());
    } catch (const UsageError&) {
      size = "overflow";
    }
  }
  return fmt::format("{{ dtype: {}, sizeInBytes: {}, shape {} }}", dtypeDisplayName(dtype), size, shapeString());
}

}  // namespace kiln
