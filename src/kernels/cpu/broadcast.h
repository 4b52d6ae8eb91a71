// Numpy broadcasting for the elementwise kernels: the output shape of
// broadcast inputs, and a plan that walks the output row by row with each
// input's offset. Used by the binary kernels (elementwise.cc) and
// kiln.FusedElementwise (fused_elementwise.cc).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln {

// The numpy broadcast of the inputs' shapes; throws UsageError naming `op`
// when they do not broadcast.
std::vector<int64_t> broadcastShapes(std::string_view op, std::span<const TensorInfo> inputs);

// How a loop walks an output that its inputs broadcast to: `rank` collapsed
// dimensions and, per input, the stride in elements of each (0 along a
// broadcast dimension).
//
// Adjacent dimensions merge whenever every input walks them as one (all
// contiguous, or all broadcast), so the common cases come out as one or two
// dimensions: same shapes and scalars as [n]; a bias over the last dimension
// as [rows, n] with strides [n, 1] / [0, 1]; a per-channel NCHW operand as
// [N, C, H*W] with strides [C*H*W, H*W, 1] / [0, 1, 0]. The last dimension is
// the row; the innermost stride of every input is 1 or 0, so within a row an
// input is either a contiguous array or one repeated element.
//
// An output of at most one element has rank 1 and dims[0] = its element
// count (0 or 1), with every stride 0.
struct BroadcastPlan {
  uint32_t rank = 1;
  std::array<int64_t, kMaxRank> dims{};
  std::vector<std::array<int64_t, kMaxRank>> strides;  // one per input

  int64_t rowLength() const { return dims[rank - 1]; }
  int64_t innerStride(size_t input) const { return strides[input][rank - 1]; }
};

// The plan for `out`, the broadcast of `inputs` (shapes right-aligned to it).
BroadcastPlan planBroadcast(const std::vector<int64_t>& out, std::span<const std::vector<int64_t>> inputs);

// A position in a walk over a plan's rows, from any row to the next: the
// index of the current row in every outer dimension. Nothing allocates.
class BroadcastRows {
 public:
  // At the row holding output element `element` (which must exist).
  BroadcastRows(const BroadcastPlan& plan, int64_t element);

  // Where the current row starts in input `input`, in elements.
  int64_t offset(size_t input) const {
    int64_t offset = 0;
    for (uint32_t d = 0; d + 1 < plan_.rank; ++d) offset += index_[d] * plan_.strides[input][d];
    return offset;
  }
  // To the following row (past the last one, the walk starts over).
  void next() {
    for (uint32_t d = plan_.rank - 1; d-- > 0;) {
      if (++index_[d] < plan_.dims[d]) return;
      index_[d] = 0;
    }
  }

 private:
  const BroadcastPlan& plan_;
  std::array<int64_t, kMaxRank> index_{};
};

}  // namespace kiln
