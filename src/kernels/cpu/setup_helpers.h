// Small helpers that the data-movement and indexing kernels' prepare
// functions share: reading a KernelSetup and phrasing its errors.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln::setup_helpers {

// "f32[2, 3]", for error messages.
inline std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

// Output `got` must be `dtype` with `shape`, as the inputs give it.
inline void expectOutput(std::string_view op, const TensorInfo& got, DType dtype, const std::vector<int64_t>& shape) {
  const TensorInfo expected{dtype, shape};
  if (got != expected) {
    throw UsageError(fmt::format("{}: output is {} but the inputs give {}", op, typeString(got), typeString(expected)));
  }
}

// False for an omitted optional input (or one past the end).
inline bool present(const KernelSetup& setup, size_t index) {
  return index < setup.inputs.size() && setup.inputs[index].dtype != DType::kUndefined;
}

// The bytes of input `index` when it is a constant of the executable.
inline const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// `axis` in [-rank, rank) as a value in [0, rank); UsageError otherwise.
inline int64_t normalizeAxis(std::string_view op, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) throw UsageError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  return axis < 0 ? axis + r : axis;
}

// The product of shape[begin, end).
inline int64_t product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

// Element `i` of an integer tensor (i32 or i64).
inline int64_t readInt(const std::byte* data, DType dtype, uint64_t i) {
  if (dtype == DType::kI32) {
    int32_t v;
    std::memcpy(&v, data + i * sizeof v, sizeof v);
    return v;
  }
  int64_t v;
  std::memcpy(&v, data + i * sizeof v, sizeof v);
  return v;
}

// Kernels that only move elements handle them by size: 1, 2, 4 or 8 bytes.
inline void refuseElementSize(std::string_view op, DType dtype) {
  const size_t size = dtypeSize(dtype);
  if (size != 1 && size != 2 && size != 4 && size != 8) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs", op, dtypeName(dtype)));
  }
}

// Calls f(T{}) with the unsigned type of `size` bytes.
template <typename F>
auto withElementSize(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

}  // namespace kiln::setup_helpers
