// Small helpers that the data-movement and indexing kernels' prepare
// functions share: reading a KernelSetup and phrasing its errors.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

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

// Whether every input present (omitted optional ones aside) is `dtype`.
inline bool presentInputsAre(const KernelSetup& setup, DType dtype) {
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    if (present(setup, i) && setup.inputs[i].dtype != dtype) return false;
  }
  return true;
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

// A Reduce* step's axes (input 1, a constant, or the attribute of older
// opsets), each in [0, rank), sorted; UsageError for a bad or repeated axis.
inline std::vector<int64_t> reduceAxes(std::string_view op, const KernelSetup& setup, size_t rank) {
  std::vector<int64_t> axes;
  if (setup.inputs.size() >= 2 && setup.inputs[1].dtype != DType::kUndefined) {
    const TensorInfo& info = setup.inputs[1];
    if (info.dtype != DType::kI64 || info.shape.size() > 1 || !info.isStatic()) {
      throw UsageError(fmt::format("{}: axes must be a 1-D i64 tensor, got {}", op, typeString(info)));
    }
    const std::byte* bytes = setup.constants.size() > 1 ? setup.constants[1] : nullptr;
    // An empty axes tensor needs no bytes (its data may even be null).
    if (bytes == nullptr && info.numElements() != 0) throw UsageError(fmt::format("{}: axes must be a constant", op));
    axes.resize(info.numElements());
    if (!axes.empty()) std::memcpy(axes.data(), bytes, axes.size() * sizeof(int64_t));
  } else {
    axes = setup.params.getInts("axes", {});
  }
  const int64_t r = static_cast<int64_t>(rank);
  for (int64_t& axis : axes) {
    if (axis < -r || axis >= r) throw UsageError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
    if (axis < 0) axis += r;
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    throw UsageError(fmt::format("{}: axes [{}] repeat an axis", op, fmt::join(axes, ", ")));
  }
  return axes;
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
