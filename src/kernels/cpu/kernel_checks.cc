#include "kernels/cpu/kernel_checks.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {

std::string typeString(const TensorInfo& info) { return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString()); }

const TensorInfo& inputAt(const KernelSetup& setup, size_t index) {
  static const TensorInfo kOmitted;
  return index < setup.inputs.size() ? setup.inputs[index] : kOmitted;
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs,
                  size_t outputs) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    throw UsageError(fmt::format("{}: expects {} to {} inputs, got {}", op, min_inputs, max_inputs, setup.inputs.size()));
  }
  for (size_t i = 0; i < min_inputs; ++i) {
    if (!present(setup.inputs[i])) throw UsageError(fmt::format("{}: input {} is required", op, i));
  }
  if (setup.outputs.size() != outputs) {
    throw UsageError(fmt::format("{}: expects {} output{}, got {}", op, outputs, outputs == 1 ? "" : "s",
                                 setup.outputs.size()));
  }
  for (const TensorInfo& info : setup.inputs) {
    if (present(info) && !info.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, got {}", op, typeString(info)));
    }
  }
}

}  // namespace kiln
