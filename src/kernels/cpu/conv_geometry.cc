#include "kernels/cpu/conv_geometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/window_attributes.h"
#include "kiln/error.h"

namespace kiln {

ConvGeometry convGeometry(std::string_view op, const ParamMap& params, const TensorInfo& x, const TensorInfo& w,
                          const TensorInfo& y) {
  using Ints = std::vector<int64_t>;
  if (x.shape.size() < 3 || x.shape.size() > 5) {
    throw UsageError(fmt::format("{}: needs an input [N, C, spatial...] with 1 to 3 spatial axes, got {}", op,
                                 x.shapeString()));
  }
  const size_t n = x.shape.size() - 2;
  if (w.shape.size() != x.shape.size() || y.shape.size() != x.shape.size()) {
    throw UsageError(fmt::format("{}: the weights {} and the output {} must have the rank of the input {}", op,
                                 w.shapeString(), y.shapeString(), x.shapeString()));
  }
  ConvGeometry g;
  g.batch = x.shape[0];
  g.in_channels = x.shape[1];
  g.out_channels = w.shape[0];
  g.group = params.getInt("group", 1);
  if (g.group < 1 || g.in_channels % g.group != 0 || g.out_channels % g.group != 0 ||
      w.shape[1] * g.group != g.in_channels) {
    throw UsageError(fmt::format("{}: the input {}, the weights {} and group {} do not fit together", op,
                                 x.shapeString(), w.shapeString(), g.group));
  }
  if (y.shape[0] != g.batch || y.shape[1] != g.out_channels) {
    throw UsageError(fmt::format("{}: the output {} must be [{}, {}, ...]", op, y.shapeString(), g.batch,
                                 g.out_channels));
  }
  const Ints kernel = sizedInts(op, params, "kernel_shape", n, 1, Ints(w.shape.begin() + 2, w.shape.end()));
  const Ints strides = sizedInts(op, params, "strides", n, 1, Ints(n, 1));
  const Ints dilations = sizedInts(op, params, "dilations", n, 1, Ints(n, 1));
  const Ints pads = sizedInts(op, params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const std::string auto_pad = params.getString("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      !auto_pad.empty()) {
    throw UsageError(fmt::format("{}: auto_pad '{}' is not NOTSET, VALID, SAME_UPPER or SAME_LOWER", op, auto_pad));
  }
  g.in.fill(1);
  g.out.fill(1);
  g.kernel.fill(1);
  g.strides.fill(1);
  g.dilations.fill(1);
  g.pad_begin.fill(0);
  const size_t offset = 3 - n;
  for (size_t i = 0; i < n; ++i) {
    const size_t d = offset + i;
    if (kernel[i] != w.shape[i + 2]) {
      throw UsageError(fmt::format("{}: kernel_shape [{}] differs from the weights {}", op, fmt::join(kernel, ", "),
                                   w.shapeString()));
    }
    g.in[d] = x.shape[i + 2];
    g.out[d] = y.shape[i + 2];
    g.kernel[d] = kernel[i];
    g.strides[d] = strides[i];
    g.dilations[d] = dilations[i];
    const int64_t extent = (kernel[i] - 1) * dilations[i] + 1;
    int64_t begin = pads[i];
    int64_t end = pads[i + n];
    if (auto_pad == "VALID") {
      begin = end = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t total = std::max<int64_t>(0, (g.out[d] - 1) * strides[i] + extent - g.in[d]);
      begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end = total - begin;
    }
    g.pad_begin[d] = begin;
    const int64_t expected = (g.in[d] + begin + end - extent) / strides[i] + 1;
    if (auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && expected != g.out[d]) {
      throw UsageError(fmt::format("{}: spatial axis {}: the output has {} elements but the input, kernel, strides "
                                   "and pads give {}",
                                   op, i, g.out[d], expected));
    }
  }
  return g;
}

}  // namespace kiln
