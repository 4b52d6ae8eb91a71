// Gradient rules of the neural-network layers: convolution and pooling,
// the normalisations (LayerNormalization, BatchNormalization in both
// modes) and Dropout. See gradient_rules.h for what a rule gets and gives.
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <utility>

#include "kiln/error.h"
#include "training/gradient_rules.h"

namespace kiln {
namespace {

using Grads = std::vector<ValueId>;

struct WindowGeometry {
  std::vector<int64_t> kernel, strides, pads, dilations;
};

WindowGeometry windowGeometry(const Node& n) {
  WindowGeometry w;
  w.kernel = n.intsAttribute("kernel_shape", {});
  w.strides = n.intsAttribute("strides", std::vector<int64_t>(w.kernel.size(), 1));
  w.pads = n.intsAttribute("pads", std::vector<int64_t>(2 * w.kernel.size(), 0));
  w.dilations = n.intsAttribute("dilations", std::vector<int64_t>(w.kernel.size(), 1));
  if (n.stringAttribute("auto_pad", "NOTSET") != "NOTSET") {
    throw GraphError(fmt::format("node '{}' ({}): gradients need explicit pads (auto_pad NOTSET)", n.name, n.op_type));
  }
  return w;
}

// Windows that tile the input: kernel == stride, no padding or dilation,
// each size a multiple of the kernel.
bool windowsTile(const WindowGeometry& w, const std::vector<int64_t>& input) {
  if (w.kernel.size() + 2 != input.size() || w.strides != w.kernel) return false;
  for (size_t i = 0; i < w.kernel.size(); ++i) {
    if (w.pads[i] != 0 || w.pads[i + w.kernel.size()] != 0 || w.dilations[i] != 1 || input[i + 2] % w.kernel[i] != 0) return false;
  }
  return true;
}

// Over tiling windows: `value` (of the pooled shape) spread back by
// repeating each element over its window.
ValueId spreadOverWindows(GradientBuilder& b, const WindowGeometry& w, ValueId value, const std::vector<int64_t>& input) {
  // [N, C, h, w] -> [N, C, h, 1, w, 1] -> [N, C, h, kh, w, kw] -> [N, C, H, W]
  std::vector<int64_t> split = {input[0], input[1]}, expanded = {input[0], input[1]};
  for (size_t i = 0; i < w.kernel.size(); ++i) {
    split.insert(split.end(), {input[i + 2] / w.kernel[i], 1});
    expanded.insert(expanded.end(), {input[i + 2] / w.kernel[i], w.kernel[i]});
  }
  const ValueId wide = b.add("Expand", {b.add("Reshape", {value, b.int64s(split)}), b.int64s(expanded)});
  return b.add("Reshape", {wide, b.int64s(input)});
}

// The output_padding that makes a ConvTranspose of `output` by windows
// `w` (a pooling's, or a convolution's geometry) come back to `input`'s
// size.
std::vector<int64_t> outputPadding(const WindowGeometry& w, const std::vector<int64_t>& input,
                                   const std::vector<int64_t>& output) {
  std::vector<int64_t> padding;
  const size_t spatial = w.kernel.size();
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t reach = w.strides[i] * (output[i + 2] - 1) + (w.kernel[i] - 1) * w.dilations[i] + 1 -
                          w.pads[i] - w.pads[i + spatial];
    padding.push_back(input[i + 2] - reach);
  }
  return padding;
}

// Over any windows: `value` (pooled shape) summed back onto the input
// positions each window covers: a depthwise ConvTranspose by a kernel of
// ones.
ValueId sumOverWindows(GradientBuilder& b, const Node& n, const WindowGeometry& w, ValueId value,
                       const std::vector<int64_t>& input, const std::vector<int64_t>& output) {
  if (w.kernel.size() != 2) {
    throw GraphError(fmt::format("node '{}' ({}): gradients of overlapping or padded windows support 2-D pooling yet",
                                 n.name, n.op_type));
  }
  const DType dtype = b.dtypeOf(value);
  std::vector<int64_t> ones_shape = {input[1], 1};
  ones_shape.insert(ones_shape.end(), w.kernel.begin(), w.kernel.end());
  const ValueId ones = b.add("Expand", {b.scalar(1.0, dtype), b.int64s(ones_shape)});
  return b.add("ConvTranspose", {value, ones},
               {{"strides", w.strides}, {"dilations", w.dilations}, {"pads", w.pads}, {"group", input[1]},
                {"output_padding", outputPadding(w, input, output)}});
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
    const WindowGeometry geometry{{w[2], w[3]}, n.intsAttribute("strides", {1, 1}), n.intsAttribute("pads", {0, 0, 0, 0}),
                              n.intsAttribute("dilations", {1, 1})};
    // dX: the transposed convolution of dY by W (ConvTranspose reads W
    // [M, C/g, kh, kw] as its [C_in, C_out/g, ...] of the same groups),
    // padded out to X's size.
    const ValueId dx = b.add("ConvTranspose", {g[0], n.inputs[1]},
                             {{"strides", geometry.strides}, {"dilations", geometry.dilations}, {"pads", geometry.pads},
                              {"output_padding", outputPadding(geometry, x, y)}, {"group", groups}});
    Grads grads = {dx, convolutionWeightGradient(b, n, g[0], groups)};
    if (inputOf(n, 2) != kNoValue) {
      grads.push_back(b.add("ReduceSum", {g[0], b.int64s({0, 2, 3})}, {{"keepdims", int64_t{0}}}));
    }
    return grads;
  };
  rules["MaxPool"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]);
    const WindowGeometry w = windowGeometry(n);
    if (windowsTile(w, x)) {
      // To the window's maximum (every tied one: a measure-zero case).
      const ValueId is_max = b.add("Equal", {n.inputs[0], spreadOverWindows(b, w, n.outputs[0], x)});
      return {b.add("Where", {is_max, spreadOverWindows(b, w, g[0], x), b.scalar(0.0, b.dtypeOf(g[0]))})};
    }
    // Overlapping, padded, dilated or ceil_mode windows: each output's
    // gradient added at the position of its maximum, from the Indices
    // output of the same pooling (flat positions in x).
    Graph& graph = b.graph();
    Attributes attributes = n.attributes;
    attributes["storage_order"] = int64_t{0};  // row-major positions, as the scatter reads them
    const NodeId argmax = graph.addNode("MaxPool", {n.inputs[0]}, {"", ""}, std::move(attributes));
    const ValueId indices = graph.node(argmax).outputs[1];
    int64_t size = 1;
    for (int64_t d : x) size *= d;
    const ValueId zeros = b.add("Expand", {b.scalar(0.0, b.dtypeOf(g[0])), b.int64s({size})});
    const ValueId flat = b.add("ScatterElements", {zeros, b.add("Reshape", {indices, b.int64s({-1})}),
                                                   b.add("Reshape", {g[0], b.int64s({-1})})},
                               {{"axis", int64_t{0}}, {"reduction", std::string("add")}});
    return {b.add("Reshape", {flat, b.int64s(x)})};
  };
  rules["AveragePool"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    const std::vector<int64_t> x = b.shapeOf(n.inputs[0]), y = b.shapeOf(n.outputs[0]);
    const WindowGeometry w = windowGeometry(n);
    const DType dtype = b.dtypeOf(g[0]);
    int64_t window = 1;
    for (int64_t k : w.kernel) window *= k;
    if (windowsTile(w, x)) {
      return {b.add("Div", {spreadOverWindows(b, w, g[0], x), b.scalar(static_cast<double>(window), dtype)})};
    }
    if (n.intAttribute("ceil_mode", 0) != 0) {
      throw GraphError(fmt::format("node '{}' (AveragePool): gradients of overlapping or padded windows with "
                                   "ceil_mode are not supported yet",
                                   n.name));
    }
    // Each output divided by its divisor (the window, or the part of it
    // inside the input without count_include_pad), then summed back.
    ValueId divisor = b.scalar(static_cast<double>(window), dtype);
    if (n.intAttribute("count_include_pad", 0) == 0) {
      std::vector<int64_t> plane = {1, 1};
      plane.insert(plane.end(), x.begin() + 2, x.end());
      const ValueId ones = b.add("Expand", {b.scalar(1.0, dtype), b.int64s(plane)});
      std::vector<int64_t> kernel_shape = {1, 1};
      kernel_shape.insert(kernel_shape.end(), w.kernel.begin(), w.kernel.end());
      divisor = b.add("Conv", {ones, b.add("Expand", {b.scalar(1.0, dtype), b.int64s(kernel_shape)})},
                      {{"strides", w.strides}, {"dilations", w.dilations}, {"pads", w.pads}});
    }
    return {sumOverWindows(b, n, w, b.add("Div", {g[0], divisor}), x, y)};
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
