#include "kernels/cpu/channels_last.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {
namespace {

TensorInfo toNchw(const char* op, const char* what, const TensorInfo& info, ActivationLayout layout) {
  const auto& d = info.shape;
  if (layout == ActivationLayout::kBlocked16) {
    if (d.size() != 5 || d[4] != 16) {
      throw UsageError(fmt::format("{}: needs a 5-D {} [N, C/16, H, W, 16], got {}{}", op, what, dtypeName(info.dtype),
                                   info.shapeString()));
    }
    return TensorInfo{info.dtype, {d[0], d[1] * 16, d[2], d[3]}};
  }
  if (d.size() != 4) {
    throw UsageError(fmt::format("{}: needs a 4-D {} [N, H, W, C], got {}{}", op, what, dtypeName(info.dtype),
                                 info.shapeString()));
  }
  return TensorInfo{info.dtype, {d[0], d[3], d[1], d[2]}};
}

}  // namespace

NchwSetup::NchwSetup(const char* op, const KernelSetup& setup, ActivationLayout layout)
    : inputs_(setup.inputs.begin(), setup.inputs.end()),
      outputs_(setup.outputs.begin(), setup.outputs.end()),
      setup_{setup.params, inputs_, outputs_, setup.constants} {
  if (inputs_.empty() || outputs_.empty()) throw UsageError(fmt::format("{}: needs an input and an output", op));
  inputs_[0] = toNchw(op, "input", inputs_[0], layout);
  outputs_[0] = toNchw(op, "output", outputs_[0], layout);
}

}  // namespace kiln
