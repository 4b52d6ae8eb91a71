// The checks and lookups that prepare functions share: type strings for
// messages, omitted inputs, constant inputs, input and output counts. Used by
// quantization.cc, signal.cc and sampling.cc (the older kernel files keep
// their own copies of the same few lines).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kernels/kernel.h"

namespace kiln {

// "f32[2, 3]", for messages.
std::string typeString(const TensorInfo& info);

// False for an omitted optional input (dtype kUndefined).
inline bool present(const TensorInfo& info) { return info.dtype != DType::kUndefined; }

// Input `index`, or an omitted input when the node has fewer.
const TensorInfo& inputAt(const KernelSetup& setup, size_t index);

inline bool hasInput(const KernelSetup& setup, size_t index) { return present(inputAt(setup, index)); }

// The bytes of input `index` when it is a constant, else nullptr.
const std::byte* constantInput(const KernelSetup& setup, size_t index);

// Throws UsageError naming `op` unless there are min_inputs to max_inputs
// inputs (the first min_inputs present) and `outputs` outputs, every present
// input of a static shape.
void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs,
                  size_t outputs);

}  // namespace kiln
