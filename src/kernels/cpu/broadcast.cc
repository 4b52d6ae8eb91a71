#include "kernels/cpu/broadcast.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "kiln/error.h"

namespace kiln {

std::vector<int64_t> broadcastShapes(std::string_view op, std::span<const TensorInfo> inputs) {
  size_t rank = 0;
  for (const TensorInfo& input : inputs) rank = std::max(rank, input.shape.size());
  std::vector<int64_t> out(rank, 1);
  for (const TensorInfo& input : inputs) {
    const size_t offset = rank - input.shape.size();
    for (size_t d = 0; d < input.shape.size(); ++d) {
      int64_t& target = out[offset + d];
      const int64_t dim = input.shape[d];
      if (dim == target || dim == 1) continue;
      if (target != 1) {
        std::string shapes;
        for (const TensorInfo& other : inputs) shapes += (shapes.empty() ? "" : " and ") + other.shapeString();
        throw UsageError(
            fmt::format("{}: input shapes {} do not broadcast: output dimension {} would be both {} and {}", op, shapes,
                        offset + d, target, dim));
      }
      target = dim;
    }
  }
  return out;
}

BroadcastPlan planBroadcast(const std::vector<int64_t>& out, std::span<const std::vector<int64_t>> inputs) {
  BroadcastPlan plan;
  const size_t rank = out.size();
  plan.strides.assign(inputs.size(), {});
  uint64_t elements = 1;
  for (int64_t dim : out) elements *= static_cast<uint64_t>(dim);
  if (elements <= 1) {
    plan.dims[0] = static_cast<int64_t>(elements);  // a scalar, or nothing to do
    return plan;
  }
  // Strides of each input over the output's dimensions, right-aligned.
  std::vector<std::array<int64_t, kMaxRank>> full(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::vector<int64_t>& shape = inputs[k];
    const size_t offset = rank - shape.size();
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t dim = d >= offset ? shape[d - offset] : 1;
      full[k][d] = dim == 1 ? 0 : stride;
      stride *= dim;
    }
  }
  plan.rank = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    if (plan.rank > 0) {
      const uint32_t last = plan.rank - 1;
      bool mergeable = true;
      for (size_t k = 0; k < inputs.size() && mergeable; ++k) {
        mergeable = plan.strides[k][last] == full[k][d] * out[d];
      }
      if (mergeable) {
        plan.dims[last] *= out[d];
        for (size_t k = 0; k < inputs.size(); ++k) plan.strides[k][last] = full[k][d];
        continue;
      }
    }
    plan.dims[plan.rank] = out[d];
    for (size_t k = 0; k < inputs.size(); ++k) plan.strides[k][plan.rank] = full[k][d];
    ++plan.rank;
  }
  return plan;
}

BroadcastRows::BroadcastRows(const BroadcastPlan& plan, int64_t element) : plan_(plan) {
  int64_t rest = element / plan.rowLength();
  for (uint32_t d = plan.rank - 1; d-- > 0;) {
    index_[d] = rest % plan.dims[d];
    rest /= plan.dims[d];
  }
}

}  // namespace kiln
