// Where each output pixel of a 2-D Resize reads from, as the CPU kernel
// computes it (data_movement.cc): per output row and column, the one source
// (nearest) or the two sources and the weight of the second (linear). The
// cuda Resize uses the same tables, so that both devices resize alike.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/kernel.h"

namespace kiln {

struct ResizeTables {
  bool linear = false;
  DType dtype = DType::kF32;
  int64_t planes = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  std::vector<int64_t> row0, row1, col0, col1;
  std::vector<float> row_w, col_w;
};

// The tables of Resize step `setup` (NCHW), or nullopt when the CPU runs it
// otherwise: the general kernel (cubic, antialias, more than two resized
// axes, ...) or scales known only at run time. Throws UsageError as the CPU
// kernel's prepare does.
std::optional<ResizeTables> resizeTables(const KernelSetup& setup);

}  // namespace kiln
