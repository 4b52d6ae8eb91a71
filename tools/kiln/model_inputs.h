// Input tensors for `kiln run` and `kiln bench`: from NAME=FILE.npy
// arguments, or random data with a fixed seed.
#pragma once

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kiln/executor.h"
#include "kiln/tensor_info.h"
#include "tools/kiln/npy.h"

namespace kiln::cli {

// Uniform values in [-1, 1) for float types, [0, 10) for integers, 0/1 for
// bool. Throws UsageError for other types.
std::vector<std::byte> randomTensor(const TensorInfo& info, std::mt19937& random);

// What the command line says of the inputs.
struct InputArguments {
  std::vector<std::string> files;   // --input NAME=FILE.npy
  std::vector<std::string> shapes;  // --shape NAME:DIMS, for random data where the package leaves dimensions unknown
};

// One array per model input, in `inputs` order: the .npy file named by a
// NAME=FILE.npy argument (checked against the input's dtype and shape, whose
// unknown dimensions take any size), else random data when `random_missing`
// and the shape is known (from the package, or a NAME:DIMS argument that
// agrees with it), else a UsageError that says how to provide it.
std::vector<NpyArray> loadInputs(const std::vector<TensorSlot>& inputs, const InputArguments& arguments,
                                 bool random_missing);

}  // namespace kiln::cli
