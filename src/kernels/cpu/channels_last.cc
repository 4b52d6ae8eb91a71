#include "kernels/cpu/channels_last.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {
namespace {

TensorInfo toNchw(const char* op, const char* what, const TensorInfo& info) {
  if (info.shape.size() != 4) {
    throw UsageError(fmt::format("{}: needs a 4-D {} [N, H, W, C], got {}{}", op, what, dtypeName(info.dtype),
                                 info.shapeString()));
  }
  const auto& d = info.shape;
  return TensorInfo{info.dtype, {d[0], d[3], d[1], d[2]}};
}

}  // namespace

NchwSetup::NchwSetup(const char* op, const KernelSetup& setup)
    : inputs_(setup.inputs.begin(), setup.inputs.end()),
      outputs_(setup.outputs.begin(), setup.outputs.end()),
      setup_{setup.params, inputs_, outputs_, setup.constants} {
  if (inputs_.empty() || outputs_.empty()) throw UsageError(fmt::format("{}: needs an input and an output", op));
  inputs_[0] = toNchw(op, "input", inputs_[0]);
  outputs_[0] = toNchw(op, "output", outputs_[0]);
}

}  // namespace kiln
