// Small checks that kernels' prepare functions share: input and output
// counts, presence of optional tensors, dtypes, and type text for messages.
// Each throws UsageError with the op's name first.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln::checks {

// "f32[2, 3]", for messages.
inline std::string typeText(const TensorInfo& info) { return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString()); }

// False for an omitted optional tensor (or one past the end).
inline bool present(std::span<const TensorInfo> infos, size_t index) {
  return index < infos.size() && infos[index].dtype != DType::kUndefined;
}
inline bool present(const TensorInfo& info) { return info.dtype != DType::kUndefined; }

// Input `index`, or an omitted input when the node has fewer.
inline const TensorInfo& inputAt(const KernelSetup& setup, size_t index) {
  static const TensorInfo kOmitted;
  return index < setup.inputs.size() ? setup.inputs[index] : kOmitted;
}

// The bytes of input `index` when it is a constant of the executable, else
// nullptr.
inline const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// The bytes of input `index`, which must be a constant of the executable
// (weights a kernel packs at prepare); UsageError naming `what` otherwise.
inline const std::byte* requireConstantInput(std::string_view op, const KernelSetup& setup, size_t index,
                                             std::string_view what) {
  const std::byte* bytes = constantInput(setup, index);
  if (bytes == nullptr) throw UsageError(fmt::format("{}: {} (input {}) must be a constant", op, what, index));
  return bytes;
}

inline int64_t elementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Checks the input and output counts and that the first `required` inputs are
// present and every present input has a static shape.
inline void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs,
                         size_t min_outputs, size_t max_outputs) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    throw UsageError(fmt::format("{}: expects {} to {} inputs, got {}", op, min_inputs, max_inputs, setup.inputs.size()));
  }
  if (setup.outputs.size() < min_outputs || setup.outputs.size() > max_outputs) {
    throw UsageError(
        fmt::format("{}: expects {} to {} outputs, got {}", op, min_outputs, max_outputs, setup.outputs.size()));
  }
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    if (!present(setup.inputs, i)) {
      if (i < min_inputs) throw UsageError(fmt::format("{}: input {} is required", op, i));
      continue;
    }
    if (!setup.inputs[i].isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeText(setup.inputs[i])));
    }
  }
}

// Fails unless `info` has `dtype`.
inline void expectDType(std::string_view op, std::string_view what, const TensorInfo& info, DType dtype) {
  if (info.dtype != dtype) {
    throw UsageError(fmt::format("{}: {} must be {}, found {}", op, what, dtypeName(dtype), typeText(info)));
  }
}

// Fails unless output `index` is `dtype` with `shape`.
inline void expectOutput(std::string_view op, const KernelSetup& setup, size_t index, DType dtype,
                         const std::vector<int64_t>& shape) {
  const TensorInfo expected{dtype, shape};
  if (setup.outputs[index] != expected) {
    throw UsageError(fmt::format("{}: output {} is {} but the inputs give {}", op, index, typeText(setup.outputs[index]),
                                 typeText(expected)));
  }
}

// `axis` in [-rank, rank) as a value in [0, rank).
inline size_t normalizeAxis(std::string_view op, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) throw UsageError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

}  // namespace kiln::checks
