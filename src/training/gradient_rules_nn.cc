// Gradient rules of the neural-network layers: convolution and pooling,
// the normalisations (LayerNormalization, BatchNormalization in both
// modes) and Dropout. See gradient_rules.h for what a rule gets and gives.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "kiln/error.h"
#include "training/gradient_rules.h"

namespace kiln {
namespace {

using Grads = std::vector<ValueId>;

// Pooling windows that tile the input (kernel == stride, no padding or
// dilation, the size a multiple): the gradient spread back by repeating
// each output over its window.
ValueId spreadOverWindows(GradientBuilder& b, const Node& n, ValueId value, const std::vector<int64_t>& input) {
  const std::vector<int64_t> kernel = n.intsAttribute("kernel_shape", {});
  const std::vector<int64_t> strides = n.intsAttribute("strides", std::vector<int64_t>(kernel.size(), 1));
  const std::vector<int64_t> pads = n.intsAttribute("pads", std::vector<int64_t>(2 * kernel.size(), 0));
  const std::vector<int64_t> dilations = n.intsAttribute("dilations", std::vector<int64_t>(kernel.size(), 1));
  const bool tiles = kernel.size() + 2 == input.size() && strides == kernel &&
                     std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; }) &&
                     std::all_of(dilations.begin(), dilations.end(), [](int64_t d) { return d == 1; }) &&
                     n.stringAttribute("auto_pad", "NOTSET") == "NOTSET";
  for (size_t i = 0; tiles && i < kernel.size(); ++i) {
    if (input[i + 2] % kernel[i] != 0) throw GraphError(fmt::format("node '{}' ({}): gradients need windows that tile the input", n.name, n.op_type));
  }
  if (!tiles) {
    throw GraphError(fmt::format("node '{}' ({}): gradients support windows that tile the input (kernel == strides, "
                                 "no pads or dilations) yet",
                                 n.name, n.op_type));
  }
  // [N, C, h, w] -> [N, C, h, 1, w, 1] -> [N, C, h, kh, w, kw] -> [N, C, H, W]
  std::vector<int64_t> split = {input[0], input[1]}, expanded = {input[0], input[1]};
  for (size_t i = 0; i < kernel.size(); ++i) {
    split.insert(split.end(), {input[i + 2] / kernel[i], 1});
    expanded.insert(expanded.end(), {input[i + 2] / kernel[i], kernel[i]});
  }
  const ValueId wide = b.add("Expand", {b.add("Reshape", {value, b.int64s(split)}), b.int64s(expanded)});
  return b.add("Reshape", {wide, b.int64s(input)});
}

// dW of a 2-D convolution of `groups` groups, X [N, C, H, W] and dY [N, M,
// h, w], W [M, C/g, kh, kw]:
//   dW[o, i, k] = sum over n and y of dY[n, o, y] X[n, group(o) C/g + i, y s + k d - p],
// itself a grouped convolution with batch and channels exchanged: the
// input X as [C/g, g N, H, W] (channel (group, n)), the weights dY as [M, N,
// h, w], stride and dilation exchanged; its output [C/g, M, kh', kw'] is
// cropped to the kernel and transposed to W's layout. With one group it is
// the textbook "convolve the input with the output gradient".
ValueId convolutionWeightGradient(GradientBuilder& b, const Node& n, ValueId g, int64_t groups) {
  const std::vector<int64_t> x = b.shapeOf(n.inputs[0]), w = b.shapeOf(n.inputs[1]);
  const int64_t per_group_in = x[1] / groups;
  const ValueId xs = b.add("Reshape", {b.add("Transpose", {b.add("Reshape", {n.inputs[0], b.int64s({x[0], groups, per_group_in, x[2], x[3]})})},
                                            {{"perm", std::vector<int64_t>{2, 1, 0, 3, 4}}}),
                                       b.int64s({per_group_in, groups * x[0], x[2], x[3]})});
  const ValueId gs = b.add("Transpose", {g}, {{"perm", std::vector<int64_t>{1, 0, 2, 3}}});  // [M, N, h, w]
  const ValueId z = b.add("Conv", {xs, gs},
                          {{"strides", n.intsAttribute("dilations", {1, 1})},
                           {"dilations", n.intsAttribute("strides", {1, 1})},
                           {"pads", n.intsAttribute("pads", {0, 0, 0, 0})},
                           {"group", groups}});
  const ValueId cropped = b.add("Slice", {z, b.int64s({0, 0}), b.int64s({w[2], w[3]}), b.int64s({2, 3})});
  return b.add("Transpose", {cropped}, {{"perm", std::vector<int64_t>{1, 0, 2, 3}}});
}

// Normalising `x` over `axes` (xhat = (x - mean) * rstd): given dxhat, the
// gradient of the loss by xhat, returns (dx, xhat):
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
std::pair<ValueId, ValueId> normalizationGradient(GradientBuilder& b, ValueId x, ValueId dxhat,
                                                  const std::vector<int64_t>& axes, float epsilon) {
  const DType dtype = b.dtypeOf(x);
  const ValueId centered = b.add("Sub", {x, b.meanOver(x, axes)});
  const ValueId variance = b.meanOver(b.add("Mul", {centered, centered}), axes);
  const ValueId rstd = b.add("Reciprocal", {b.add("Sqrt", {b.add("Add", {variance, b.scalar(epsilon, dtype)})})});
  const ValueId xhat = b.add("Mul", {centered, rstd});
  const ValueId dx = b.add("Mul", {rstd, b.add("Sub", {b.add("Sub", {dxhat, b.meanOver(dxhat, axes)}),
                                                        b.add("Mul", {xhat, b.meanOver(b.add("Mul", {dxhat, xhat}), axes)})})});
  return {dx, xhat};
}

// A floating-point scalar constant (Dropout's ratio).
double constantScalar(GradientBuilder& b, const Node& n, ValueId value, const char* what) {
  const ConstantPtr& data = b.graph().value(value).initializer;
  if (data && data->info.dtype == DType::kF32 && data->bytes.size() == sizeof(float)) {
    float v;
    std::memcpy(&v, data->bytes.data(), sizeof v);
    return v;
  }
  if (data && data->info.dtype == DType::kF64 && data->bytes.size() == sizeof(double)) {
    double v;
    std::memcpy(&v, data->bytes.data(), sizeof v);
    return v;
  }
  throw GraphError(fmt::format("node '{}' ({}): gradients need its {} to be a constant f32 or f64 scalar", n.name,
                               n.op_type, what));
}

}  // namespace

bool dropoutTrains(const Graph& graph, const Node& node) {
  const ValueId mode = inputOf(node, 2);
  if (mode == kNoValue) return false;
  const ConstantPtr& data = graph.value(mode).initializer;
  if (!data || data->info.dtype != DType::kBool || data->bytes.size() != 1) {
    throw GraphError(fmt::format("node '{}' (Dropout): gradients need training_mode to be a constant bool", node.name));
  }
  return data->bytes[0] != std::byte{0};
}

void addConvolutionRules(std::map<std::string, GradientRule>& rules) {
  rules["Conv"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]), w = b.shapeOf(n.inputs[1]), y = b.shapeOf(n.outputs[0]);
    const size_t spatial = x.size() - 2;
    if (n.stringAttribute("auto_pad", "NOTSET") != "NOTSET" || spatial != 2) {
      throw GraphError(fmt::format("node '{}' (Conv): gradients support 2-D convolutions with explicit pads yet", n.name));
    }
    const int64_t groups = n.intAttribute("group", 1);
    const std::vector<int64_t> strides = n.intsAttribute("strides", {1, 1});
    const std::vector<int64_t> dilations = n.intsAttribute("dilations", {1, 1});
    const std::vector<int64_t> pads = n.intsAttribute("pads", {0, 0, 0, 0});
    // dX: the transposed convolution of dY by W (ConvTranspose reads W
    // [M, C/g, kh, kw] as its [C_in, C_out/g, ...] of the same groups),
    // padded out to X's size.
    std::vector<int64_t> output_padding;
    for (size_t i = 0; i < spatial; ++i) {
      const int64_t reach = strides[i] * (y[i + 2] - 1) + (w[i + 2] - 1) * dilations[i] + 1 - pads[i] - pads[i + spatial];
      output_padding.push_back(x[i + 2] - reach);
    }
    const ValueId dx = b.add("ConvTranspose", {g[0], n.inputs[1]},
                             {{"strides", strides}, {"dilations", dilations}, {"pads", pads},
                              {"output_padding", output_padding}, {"group", groups}});
    Grads grads = {dx, convolutionWeightGradient(b, n, g[0], groups)};
    if (inputOf(n, 2) != kNoValue) {
      grads.push_back(b.add("ReduceSum", {g[0], b.int64s({0, 2, 3})}, {{"keepdims", int64_t{0}}}));
    }
    return grads;
  };
  rules["MaxPool"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // To the window's maximum (every tied one: a measure-zero case).
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]);
    const ValueId is_max = b.add("Equal", {n.inputs[0], spreadOverWindows(b, n, n.outputs[0], x)});
    return {b.add("Where", {is_max, spreadOverWindows(b, n, g[0], x), b.scalar(0.0, b.dtypeOf(g[0]))})};
  };
  rules["AveragePool"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]);
    int64_t window = 1;
    for (int64_t k : n.intsAttribute("kernel_shape", {})) window *= k;
    return {b.add("Div", {spreadOverWindows(b, n, g[0], x), b.scalar(static_cast<double>(window), b.dtypeOf(g[0]))})};
  };
  rules["GlobalAveragePool"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]);
    int64_t count = 1;
    for (size_t i = 2; i < x.size(); ++i) count *= x[i];
    const ValueId spread = b.add("Expand", {g[0], b.int64s(x)});
    return {b.add("Div", {spread, b.scalar(static_cast<double>(count), b.dtypeOf(g[0]))})};
  };
}

void addNormalizationRules(std::map<std::string, GradientRule>& rules) {
  rules["LayerNormalization"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Over the axes from `axis` on: y = xhat * gamma + beta.
    const auto rank = static_cast<int64_t>(b.shapeOf(n.inputs[0]).size());
    int64_t axis = n.intAttribute("axis", -1);
    if (axis < 0) axis += rank;
    std::vector<int64_t> normalized, kept;
    for (int64_t i = 0; i < rank; ++i) (i >= axis ? normalized : kept).push_back(i);
    const auto [dx, xhat] = normalizationGradient(b, n.inputs[0], b.add("Mul", {g[0], n.inputs[1]}), normalized,
                                                  n.floatAttribute("epsilon", 1e-5f));
    const auto sumKept = [&](ValueId v) {
      return kept.empty() ? v : b.add("ReduceSum", {v, b.int64s(kept)}, {{"keepdims", int64_t{0}}});
    };
    Grads grads = {dx, sumKept(b.add("Mul", {g[0], xhat}))};
    if (inputOf(n, 2) != kNoValue) grads.push_back(sumKept(g[0]));
    return grads;
  };
  rules["BatchNormalization"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // x [N, C, ...], per channel: y = xhat * scale + B, xhat normalised
    // by the batch's statistics (training_mode) or the running ones given.
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]);
    std::vector<int64_t> axes = {0}, channel_shape(x.size(), 1);
    for (size_t i = 2; i < x.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    channel_shape[1] = x[1];
    const auto perChannel = [&](ValueId v) { return b.add("Reshape", {v, b.int64s(channel_shape)}); };
    const float epsilon = n.floatAttribute("epsilon", 1e-5f);
    const ValueId scale = perChannel(n.inputs[1]);
    Grads grads(n.inputs.size(), kNoValue);  // the running statistics get none
    ValueId xhat = kNoValue;
    if (n.intAttribute("training_mode", 0) != 0) {
      std::tie(grads[0], xhat) = normalizationGradient(b, n.inputs[0], b.add("Mul", {g[0], scale}), axes, epsilon);
    } else {
      const DType dtype = b.dtypeOf(n.inputs[0]);
      const ValueId rstd = b.add("Reciprocal", {b.add("Sqrt", {b.add("Add", {perChannel(n.inputs[4]), b.scalar(epsilon, dtype)})})});
      xhat = b.add("Mul", {b.add("Sub", {n.inputs[0], perChannel(n.inputs[3])}), rstd});
      grads[0] = b.add("Mul", {g[0], b.add("Mul", {scale, rstd})});
    }
    grads[1] = b.add("ReduceSum", {b.add("Mul", {g[0], xhat}), b.int64s(axes)}, {{"keepdims", int64_t{0}}});
    grads[2] = b.add("ReduceSum", {g[0], b.int64s(axes)}, {{"keepdims", int64_t{0}}});
    return grads;
  };
  rules["Dropout"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Training: dx = g * mask / (1 - ratio), the mask Dropout drew this
    // run (its second output); otherwise Dropout passes x through.
    Grads grads(n.inputs.size(), kNoValue);
    if (!dropoutTrains(b.graph(), n)) {
      grads[0] = g[0];
      return grads;
    }
    if (n.outputs.size() < 2 || n.outputs[1] == kNoValue) {
      throw GraphError(fmt::format("node '{}' (Dropout): a training Dropout needs its mask output for its gradient",
                                   n.name));
    }
    const double ratio = inputOf(n, 1) != kNoValue ? constantScalar(b, n, n.inputs[1], "ratio")
                                                   : n.floatAttribute("ratio", 0.5f);
    const DType dtype = b.dtypeOf(g[0]);
    const ValueId kept = b.add("Cast", {n.outputs[1]}, {{"to", static_cast<int64_t>(dtype)}});
    grads[0] = b.add("Mul", {g[0], b.add("Mul", {kept, b.scalar(ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio), dtype)})});
    return grads;
  };
}

}  // namespace kiln
