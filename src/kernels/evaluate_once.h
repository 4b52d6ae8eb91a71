// Runs one CPU kernel once, on constant inputs, into fresh buffers: how the
// compiler folds a node whose inputs are all constants (passes/
// constant_folding.h) with the same code that would run it at run time.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/param_map.h"
#include "kiln/tensor_info.h"

namespace kiln {

// The outputs' bytes, or nullopt when there is no such kernel or its
// prepare refuses the inputs (the node is then left to run time).
std::optional<std::vector<std::vector<std::byte>>> evaluateOnce(const std::string& kernel, const ParamMap& params,
                                                               std::span<const TensorInfo> inputs,
                                                               std::span<const std::byte* const> data,
                                                               std::span<const TensorInfo> outputs);

}  // namespace kiln
