// Where a Slice reads: ONNX's starts/ends/axes/steps, clamped as the
// specification says, resolved per dimension. Shared by the CPU and cuda
// Slice kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "kiln/tensor_info.h"

namespace kiln {

// The slice of `in_dims` (rank dims) given starts/ends/axes/steps read through
// `get(input, i)` with `count` entries each: per dimension, the first index
// and the step (defaults: everything, step 1). Returns false on a bad axis or
// a zero step. Allocates nothing, so run can call it.
template <typename Get>
bool resolveSlice(uint32_t rank, const std::array<int64_t, kMaxRank>& in_dims, uint64_t count, bool has_axes,
                  bool has_steps, Get get, std::array<int64_t, kMaxRank>& first, std::array<int64_t, kMaxRank>& step,
                  std::array<int64_t, kMaxRank>& size) {
  for (uint32_t d = 0; d < rank; ++d) {
    first[d] = 0;
    step[d] = 1;
    size[d] = in_dims[d];
  }
  std::array<bool, kMaxRank> seen{};
  for (uint64_t i = 0; i < count; ++i) {
    int64_t axis = has_axes ? get(3, i) : static_cast<int64_t>(i);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(axis)]) return false;
    seen[static_cast<size_t>(axis)] = true;
    const int64_t dim = in_dims[static_cast<size_t>(axis)];
    const int64_t st = has_steps ? get(4, i) : 1;
    if (st == 0) return false;
    int64_t start = get(1, i);
    int64_t end = get(2, i);
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    int64_t n = 0;
    if (dim == 0) {
      start = 0;
    } else if (st > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      n = end > start ? (end - start - 1) / st + 1 : 0;  // ceil((end - start) / st), never overflowing
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      n = start > end ? 1 - (start - end - 1) / st : 0;  // st < 0, INT64_MIN included
    }
    first[static_cast<size_t>(axis)] = n > 0 ? start : 0;
    step[static_cast<size_t>(axis)] = st;
    size[static_cast<size_t>(axis)] = n;
  }
  return true;
}

}  // namespace kiln
