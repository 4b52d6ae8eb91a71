// NumPy .npy files (format versions 1.0 to 3.0): read and write one array.
// Only C-order (row-major), little-endian arrays of kiln's dtypes.
#pragma once

#include <cstddef>
#include <filesystem>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln::cli {

struct NpyArray {
  TensorInfo info;
  std::vector<std::byte> bytes;
};

// Throws UsageError naming the file and what is wrong with it.
NpyArray readNpy(const std::filesystem::path& path);
void writeNpy(const std::filesystem::path& path, const TensorInfo& info, const std::byte* data);

}  // namespace kiln::cli
