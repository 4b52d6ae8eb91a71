// Random input tensors for `kiln run --random-inputs` and `kiln bench`.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln::cli {

// Uniform values in [-1, 1) for float types, [0, 10) for integers, 0/1 for
// bool. Throws UsageError for other types.
std::vector<std::byte> randomTensor(const TensorInfo& info, std::mt19937& random);

}  // namespace kiln::cli
