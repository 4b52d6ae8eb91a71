#include "kiln/tensor_info.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {
namespace {

// a * b, or throws when the product leaves [0, 2^63).
uint64_t checkedMultiply(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product > static_cast<uint64_t>(INT64_MAX)) {
    throw UsageError(fmt::format("tensor size overflows 63 bits ({} * {})", a, b));
  }
  return product;
}

}  // namespace

std::optional<int64_t> multiplySizes(int64_t a, int64_t b) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product)) return std::nullopt;
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
  // A zero anywhere makes it empty: [2^62, 2^62, 0] holds 0 elements, as
  // [0, 2^62, 2^62] does (multiplying in order overflowed on the first).
  for (int64_t dim : shape) {
    if (dim == 0) return 0;
  }
  uint64_t count = 1;
  for (int64_t dim : shape) count = checkedMultiply(count, static_cast<uint64_t>(dim));
  return count;
}

uint64_t TensorInfo::sizeInBytes() const { return checkedMultiply(numElements(), dtypeSize(dtype)); }

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
