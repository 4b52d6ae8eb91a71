// TensorInfo: the element type and shape of a tensor.
//
// A dimension is a non-negative size, or kDynamicDim for a size known only at
// run time (only anchors may have dynamic dimensions; stored tensor data is
// always fully static). A rank-0 shape is a scalar with one element.
//
// Thread safety: a plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln {

inline constexpr int64_t kDynamicDim = -1;

// The largest rank the package format accepts.
inline constexpr size_t kMaxRank = 32;

struct TensorInfo {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;

  // True when no dimension is kDynamicDim.
  bool isStatic() const;

  // Product of the dimensions: 0 when any is 0, whatever the others.
  // Requires isStatic(). Throws UsageError when the product does not fit in
  // 63 bits.
  uint64_t numElements() const;

  // numElements() * dtypeSize(dtype), with the same overflow check.
  uint64_t sizeInBytes() const;

  // "{ dtype: F32, sizeInBytes: 8, shape [2] }", the reference dump's form;
  // dynamic dimensions print as "?" and sizeInBytes as "?".
  std::string toString() const;

  // "[2, 3, ?]"
  std::string shapeString() const;

  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

// Checked arithmetic for every size, offset and shape formula computed
// from a file, a model or a request (issue 12): the result, or nullopt
// where it would overflow, never undefined behaviour.
//   multiplySizes  a * b for sizes and element counts; nullopt also when
//                  a or b is negative
//   elementCount   the product of a shape's dimensions (all >= 0): 0 when
//                  any is 0, but nullopt whenever the others (the non-zero
//                  ones) multiply past int64, in any order, so that every
//                  partial product a kernel takes of a valid shape fits
//   checkedAdd, checkedSubtract, checkedMultiply   signed a + b, a - b, a * b
std::optional<int64_t> multiplySizes(int64_t a, int64_t b);
std::optional<int64_t> elementCount(std::span<const int64_t> shape);
std::optional<int64_t> checkedAdd(int64_t a, int64_t b);
std::optional<int64_t> checkedSubtract(int64_t a, int64_t b);
std::optional<int64_t> checkedMultiply(int64_t a, int64_t b);

}  // namespace kiln
