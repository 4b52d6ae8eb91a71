#include "kiln/tensor_info.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {

std::optional<int64_t> multiplySizes(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return std::nullopt;
  return checkedMultiply(a, b);
}

std::optional<int64_t> elementCount(std::span<const int64_t> shape) {
  // A zero anywhere makes it empty: [2^62, 2^62, 0] holds 0 elements, as
  // [0, 2^62, 2^62] does (multiplying in order overflowed on the first).
  for (int64_t dim : shape) {
    if (dim == 0) return 0;
  }
  int64_t count = 1;
  for (int64_t dim : shape) {
    const std::optional<int64_t> product = multiplySizes(count, dim);
    if (!product) return std::nullopt;
    count = *product;
  }
  return count;
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
  const std::optional<int64_t> bytes = multiplySizes(static_cast<int64_t>(numElements()), int64_t(dtypeSize(dtype)));
  if (!bytes) throw UsageError(fmt::format("tensor size overflows 63 bits: {} elements of {} bytes", numElements(), dtypeSize(dtype)));
  return static_cast<uint64_t>(*bytes);
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
