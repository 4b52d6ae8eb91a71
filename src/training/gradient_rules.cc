#include "training/gradient_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "kiln/error.h"
#include "ops/shape_inference.h"

namespace kiln {

// ------------------------------------------------------------------ helpers

ValueId GradientBuilder::add(const std::string& op_type, const std::vector<ValueId>& inputs, Attributes attributes) {
  const NodeId node = graph_.addNode(op_type, inputs, {""}, std::move(attributes));
  return graph_.node(node).outputs[0];
}

ValueId GradientBuilder::int64s(const std::vector<int64_t>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(int64_t));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return graph_.addInitializer(uniqueName(graph_, "grad_ints"),
                               makeConstant(TensorInfo{DType::kI64, {static_cast<int64_t>(values.size())}}, std::move(bytes)));
}

ValueId GradientBuilder::scalar(double value, DType dtype) {
  std::vector<std::byte> bytes(dtypeSize(dtype));
  if (dtype == DType::kF64) {
    std::memcpy(bytes.data(), &value, sizeof value);
  } else if (dtype == DType::kF32) {
    const auto f = static_cast<float>(value);
    std::memcpy(bytes.data(), &f, sizeof f);
  } else {
    throw UsageError(fmt::format("gradients are computed in f32 or f64, not {}", dtypeName(dtype)));
  }
  return graph_.addInitializer(uniqueName(graph_, "grad_scalar"), makeConstant(TensorInfo{dtype, {}}, std::move(bytes)));
}

GradientBuilder::GradientBuilder(Graph& graph, const std::map<std::string, int64_t>& opsets)
    : graph_(graph), opsets_(opsets), opset_(opsets.contains("") ? opsets.at("") : 1) {}

TensorInfo GradientBuilder::infoOf(ValueId value) {
  // Nodes a rule added have no types yet: infer them (the whole graph; the
  // forward part keeps its types).
  if (!graph_.value(value).type.tensorInfo()) inferTypes(graph_, opsets_);
  const std::optional<TensorInfo> info = graph_.value(value).type.tensorInfo();
  if (!info || !info->isStatic()) {
    throw GraphError(fmt::format("gradients need static shapes; value '{}' has {}", graph_.value(value).name,
                                 graph_.value(value).type.toString()));
  }
  return *info;
}

std::vector<int64_t> GradientBuilder::shapeOf(ValueId value) { return infoOf(value).shape; }
DType GradientBuilder::dtypeOf(ValueId value) { return infoOf(value).dtype; }

ValueId GradientBuilder::sumToShape(ValueId gradient, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> from = shapeOf(gradient);
  if (from == shape) return gradient;
  const size_t lead = from.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < from.size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  }
  const ValueId summed = axes.empty() ? gradient : add("ReduceSum", {gradient, int64s(axes)}, {{"keepdims", int64_t{1}}});
  return add("Reshape", {summed, int64s(shape)});
}

ValueId GradientBuilder::transposeLastTwo(ValueId value) {
  const size_t rank = shapeOf(value).size();
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return add("Transpose", {value}, {{"perm", perm}});
}

ValueId GradientBuilder::meanOver(ValueId value, const std::vector<int64_t>& axes) {
  return opset_ >= 18 ? add("ReduceMean", {value, int64s(axes)}, {{"keepdims", int64_t{1}}})
                      : add("ReduceMean", {value}, {{"axes", axes}, {"keepdims", int64_t{1}}});
}

namespace {

using Grads = std::vector<ValueId>;

// The axes of a reduction: its `axes` attribute (before opset 18 for most,
// 13 for ReduceSum) or its constant second input; all axes when neither.
std::vector<int64_t> reductionAxes(GradientBuilder& b, const Node& node, size_t rank) {
  std::vector<int64_t> axes = node.intsAttribute("axes", {});
  if (axes.empty() && inputOf(node, 1) != kNoValue) {
    const ConstantPtr& data = b.graph().value(node.inputs[1]).initializer;
    if (!data) throw GraphError(fmt::format("node '{}' ({}): gradients need constant axes", node.name, node.op_type));
    axes.resize(data->bytes.size() / sizeof(int64_t));
    std::memcpy(axes.data(), data->bytes.data(), data->bytes.size());
  }
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (int64_t& axis : axes) axis = axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
  return axes;
}

int64_t softmaxAxis(GradientBuilder& b, const Node& node) {
  if (b.opset() < 13) throw GraphError(fmt::format("node '{}' ({}): gradients need opset 13 semantics", node.name, node.op_type));
  const auto rank = static_cast<int64_t>(b.shapeOf(node.inputs[0]).size());
  const int64_t axis = node.intAttribute("axis", -1);
  return axis < 0 ? axis + rank : axis;
}

// dA and dB of Y = A @ B for A [..., M, K] and B [..., K, N] (ranks >= 2,
// batch axes broadcast).
Grads matmulGrads(GradientBuilder& b, ValueId a, ValueId bb, ValueId g) {
  const auto rank_a = b.shapeOf(a).size(), rank_b = b.shapeOf(bb).size();
  if (rank_a < 2 || rank_b < 2) {
    throw GraphError("the gradient of a MatMul with a rank-1 operand is not supported yet");
  }
  if (rank_a == 2 && rank_b == 2) {
    // Gemm reads a transposed operand in place: no transposed copy of the
    // weight (or of the activations) is made.
    return {b.add("Gemm", {g, bb}, {{"transB", int64_t{1}}}), b.add("Gemm", {a, g}, {{"transA", int64_t{1}}})};
  }
  const ValueId da = b.sumToShape(b.add("MatMul", {g, b.transposeLastTwo(bb)}), b.shapeOf(a));
  const ValueId db = b.sumToShape(b.add("MatMul", {b.transposeLastTwo(a), g}), b.shapeOf(bb));
  return {da, db};
}

// The constant int64 values of input `index` (Slice's starts, ...), or
// `fallback` when the input is omitted.
std::vector<int64_t> constantInts(GradientBuilder& b, const Node& node, size_t index, std::vector<int64_t> fallback) {
  if (inputOf(node, index) == kNoValue) return fallback;
  const ConstantPtr& data = b.graph().value(node.inputs[index]).initializer;
  if (!data || data->info.dtype != DType::kI64) {
    throw GraphError(fmt::format("node '{}' ({}): gradients need its input {} constant int64", node.name, node.op_type, index));
  }
  std::vector<int64_t> values(data->bytes.size() / sizeof(int64_t));
  std::memcpy(values.data(), data->bytes.data(), data->bytes.size());
  return values;
}

void addShapeRules(std::map<std::string, GradientRule>& rules) {
  rules["Concat"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Each input's slice of the gradient along the axis.
    const std::vector<int64_t> out = b.shapeOf(n.outputs[0]);
    int64_t axis = n.intAttribute("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(out.size());
    Grads grads;
    int64_t at = 0;
    for (ValueId input : n.inputs) {
      const int64_t size = b.shapeOf(input)[static_cast<size_t>(axis)];
      grads.push_back(b.add("Slice", {g[0], b.int64s({at}), b.int64s({at + size}), b.int64s({axis})}));
      at += size;
    }
    return grads;
  };
  rules["Slice"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Steps of 1: the gradient padded with zeros back to the input's shape.
    const std::vector<int64_t> shape = b.shapeOf(n.inputs[0]);
    const auto rank = static_cast<int64_t>(shape.size());
    const std::vector<int64_t> starts = constantInts(b, n, 1, {});
    const std::vector<int64_t> ends = constantInts(b, n, 2, {});
    std::vector<int64_t> axes = constantInts(b, n, 3, {});
    const std::vector<int64_t> steps = constantInts(b, n, 4, std::vector<int64_t>(starts.size(), 1));
    if (axes.empty()) {
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
    std::vector<int64_t> pads(static_cast<size_t>(2 * rank), 0);
    for (size_t i = 0; i < starts.size(); ++i) {
      if (steps[i] != 1) throw GraphError(fmt::format("node '{}' (Slice): gradients support steps of 1 yet", n.name));
      const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
      const int64_t dim = shape[static_cast<size_t>(axis)];
      const auto clamp = [dim](int64_t v) { return std::clamp(v < 0 ? v + dim : v, int64_t{0}, dim); };
      pads[static_cast<size_t>(axis)] = clamp(starts[i]);
      pads[static_cast<size_t>(axis + rank)] = dim - clamp(ends[i]);
    }
    Grads grads(n.inputs.size(), kNoValue);
    grads[0] = b.add("Pad", {g[0], b.int64s(pads)});
    return grads;
  };
  rules["Gather"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Rows of data picked by indices (an embedding, on axis 0): d data =
    // onehot(indices)^T @ g, the rows summed where an index repeats. On
    // axis k, the same with axis k of data moved to the front (and g's
    // index axes to the front too), then moved back.
    const std::vector<int64_t> shape = b.shapeOf(n.inputs[0]);
    const auto rank = static_cast<int64_t>(shape.size());
    int64_t axis = n.intAttribute("axis", 0);
    if (axis < 0) axis += rank;
    const auto index_rank = static_cast<int64_t>(b.shapeOf(n.inputs[1]).size());
    // data_t = data with axis first: [V, data[:axis], data[axis+1:]].
    std::vector<int64_t> to_front = {axis}, moved = {shape[static_cast<size_t>(axis)]};
    for (int64_t i = 0; i < rank; ++i) {
      if (i == axis) continue;
      to_front.push_back(i);
      moved.push_back(shape[static_cast<size_t>(i)]);
    }
    ValueId gy = g[0];
    if (axis > 0) {
      // g is data[:axis] + indices + data[axis+1:]: indices first.
      std::vector<int64_t> perm;
      for (int64_t i = 0; i < index_rank; ++i) perm.push_back(axis + i);
      for (int64_t i = 0; i < axis; ++i) perm.push_back(i);
      for (int64_t i = axis + index_rank; i < rank - 1 + index_rank; ++i) perm.push_back(i);
      gy = b.add("Transpose", {gy}, {{"perm", perm}});
    }
    int64_t row = 1;
    for (size_t i = 1; i < moved.size(); ++i) row *= moved[i];
    const DType dtype = b.dtypeOf(n.inputs[0]);
    const ValueId on_off = b.add("Concat", {b.add("Reshape", {b.scalar(0.0, dtype), b.int64s({1})}),
                                            b.add("Reshape", {b.scalar(1.0, dtype), b.int64s({1})})},
                                 {{"axis", int64_t{0}}});
    const ValueId onehot = b.add("OneHot", {n.inputs[1], b.int64s({moved[0]}), on_off}, {{"axis", int64_t{-1}}});
    const ValueId picks = b.add("Reshape", {onehot, b.int64s({-1, moved[0]})});
    const ValueId rows = b.add("Reshape", {gy, b.int64s({-1, row})});
    const ValueId summed = b.add("MatMul", {b.add("Transpose", {picks}, {{"perm", std::vector<int64_t>{1, 0}}}), rows});
    ValueId grad = b.add("Reshape", {summed, b.int64s(moved)});
    if (axis > 0) {
      std::vector<int64_t> back(static_cast<size_t>(rank));
      for (size_t i = 0; i < to_front.size(); ++i) back[static_cast<size_t>(to_front[i])] = static_cast<int64_t>(i);
      grad = b.add("Transpose", {grad}, {{"perm", back}});
    }
    return {grad, kNoValue};
  };
}

std::map<std::string, GradientRule> makeRules() {
  std::map<std::string, GradientRule> rules;
  const auto unary = [&](const std::string& op, std::function<ValueId(GradientBuilder&, const Node&, ValueId)> rule) {
    rules[op] = [rule](GradientBuilder& b, const Node& node, const Grads& g) -> Grads { return {rule(b, node, g[0])}; };
  };
  // Elementwise with broadcasting.
  rules["Add"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    return {b.sumToShape(g[0], b.shapeOf(n.inputs[0])), b.sumToShape(g[0], b.shapeOf(n.inputs[1]))};
  };
  rules["Sub"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    return {b.sumToShape(g[0], b.shapeOf(n.inputs[0])), b.sumToShape(b.add("Neg", {g[0]}), b.shapeOf(n.inputs[1]))};
  };
  rules["Mul"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    return {b.sumToShape(b.add("Mul", {g[0], n.inputs[1]}), b.shapeOf(n.inputs[0])),
            b.sumToShape(b.add("Mul", {g[0], n.inputs[0]}), b.shapeOf(n.inputs[1]))};
  };
  rules["Div"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // y = a / b: dy/db = -y / b.
    const ValueId ga = b.add("Div", {g[0], n.inputs[1]});
    const ValueId gb = b.add("Neg", {b.add("Div", {b.add("Mul", {g[0], n.outputs[0]}), n.inputs[1]})});
    return {b.sumToShape(ga, b.shapeOf(n.inputs[0])), b.sumToShape(gb, b.shapeOf(n.inputs[1]))};
  };
  rules["Pow"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // d(x^p)/dx = p x^(p-1); the exponent gets no gradient (constant in practice).
    const ValueId p = n.inputs[1];
    const ValueId one = b.scalar(1.0, b.dtypeOf(p));
    const ValueId dx = b.add("Mul", {g[0], b.add("Mul", {p, b.add("Pow", {n.inputs[0], b.add("Sub", {p, one})})})});
    return {b.sumToShape(dx, b.shapeOf(n.inputs[0])), kNoValue};
  };
  unary("Neg", [](GradientBuilder& b, const Node&, ValueId g) { return b.add("Neg", {g}); });
  unary("Identity", [](GradientBuilder&, const Node&, ValueId g) { return g; });
  unary("Relu", [](GradientBuilder& b, const Node& n, ValueId g) {
    const ValueId zero = b.scalar(0.0, b.dtypeOf(g));
    return b.add("Where", {b.add("Greater", {n.inputs[0], zero}), g, zero});
  });
  unary("Sigmoid", [](GradientBuilder& b, const Node& n, ValueId g) {
    const ValueId y = n.outputs[0];
    return b.add("Mul", {g, b.add("Mul", {y, b.add("Sub", {b.scalar(1.0, b.dtypeOf(y)), y})})});
  });
  unary("Tanh", [](GradientBuilder& b, const Node& n, ValueId g) {
    const ValueId y = n.outputs[0];
    return b.add("Mul", {g, b.add("Sub", {b.scalar(1.0, b.dtypeOf(y)), b.add("Mul", {y, y})})});
  });
  unary("Exp", [](GradientBuilder& b, const Node& n, ValueId g) { return b.add("Mul", {g, n.outputs[0]}); });
  unary("Log", [](GradientBuilder& b, const Node& n, ValueId g) { return b.add("Div", {g, n.inputs[0]}); });
  unary("Sqrt", [](GradientBuilder& b, const Node& n, ValueId g) {
    return b.add("Div", {g, b.add("Mul", {b.scalar(2.0, b.dtypeOf(g)), n.outputs[0]})});
  });
  // Shapes and layouts: the gradient takes the input's shape back.
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) {
    rules[op] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
      Grads grads(n.inputs.size(), kNoValue);
      grads[0] = b.add("Reshape", {g[0], b.int64s(b.shapeOf(n.inputs[0]))});
      return grads;
    };
  }
  unary("Transpose", [](GradientBuilder& b, const Node& n, ValueId g) {
    const size_t rank = b.shapeOf(n.inputs[0]).size();
    std::vector<int64_t> perm = n.intsAttribute("perm", {});
    if (perm.empty()) {
      for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(rank - 1 - i));
    }
    std::vector<int64_t> inverse(rank);
    for (size_t i = 0; i < rank; ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    return b.add("Transpose", {g}, {{"perm", inverse}});
  });
  unary("Cast", [](GradientBuilder& b, const Node& n, ValueId g) {
    return b.add("Cast", {g}, {{"to", static_cast<int64_t>(b.dtypeOf(n.inputs[0]))}});
  });
  // Products.
  rules["MatMul"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    return matmulGrads(b, n.inputs[0], n.inputs[1], g[0]);
  };
  rules["Gemm"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // Y = alpha op(A) op(B) + beta C.
    const bool trans_a = n.intAttribute("transA", 0) != 0, trans_b = n.intAttribute("transB", 0) != 0;
    const double alpha = n.floatAttribute("alpha", 1.0f), beta = n.floatAttribute("beta", 1.0f);
    const ValueId op_a = trans_a ? b.transposeLastTwo(n.inputs[0]) : n.inputs[0];
    const ValueId op_b = trans_b ? b.transposeLastTwo(n.inputs[1]) : n.inputs[1];
    ValueId gy = g[0];
    if (alpha != 1.0) gy = b.add("Mul", {gy, b.scalar(alpha, b.dtypeOf(gy))});
    Grads grads = matmulGrads(b, op_a, op_b, gy);
    if (trans_a) grads[0] = b.transposeLastTwo(grads[0]);
    if (trans_b) grads[1] = b.transposeLastTwo(grads[1]);
    if (inputOf(n, 2) != kNoValue) {
      const ValueId gc = beta == 1.0 ? g[0] : b.add("Mul", {g[0], b.scalar(beta, b.dtypeOf(g[0]))});
      grads.push_back(b.sumToShape(gc, b.shapeOf(n.inputs[2])));
    }
    return grads;
  };
  // Reductions: the gradient spread back over the reduced axes.
  for (const char* op : {"ReduceSum", "ReduceMean"}) {
    const bool mean = std::string(op) == "ReduceMean";
    rules[op] = [mean](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
      const std::vector<int64_t> shape = b.shapeOf(n.inputs[0]);
      std::vector<int64_t> kept = shape;
      int64_t count = 1;
      for (int64_t axis : reductionAxes(b, n, shape.size())) {
        count *= shape[static_cast<size_t>(axis)];
        kept[static_cast<size_t>(axis)] = 1;
      }
      ValueId spread = b.add("Expand", {b.add("Reshape", {g[0], b.int64s(kept)}), b.int64s(shape)});
      if (mean) spread = b.add("Div", {spread, b.scalar(static_cast<double>(count), b.dtypeOf(g[0]))});
      Grads grads(n.inputs.size(), kNoValue);
      grads[0] = spread;
      return grads;
    };
  }
  // Normalisations over one axis.
  unary("Softmax", [](GradientBuilder& b, const Node& n, ValueId g) {
    // dx = y * (g - sum(g * y))
    const ValueId y = n.outputs[0];
    const ValueId dot = b.add("ReduceSum", {b.add("Mul", {g, y}), b.int64s({softmaxAxis(b, n)})}, {{"keepdims", int64_t{1}}});
    return b.add("Mul", {y, b.add("Sub", {g, dot})});
  });
  unary("LogSoftmax", [](GradientBuilder& b, const Node& n, ValueId g) {
    // dx = g - exp(y) * sum(g)
    const ValueId total = b.add("ReduceSum", {g, b.int64s({softmaxAxis(b, n)})}, {{"keepdims", int64_t{1}}});
    return b.add("Sub", {g, b.add("Mul", {b.add("Exp", {n.outputs[0]}), total})});
  });
  // Losses.
  rules["SoftmaxCrossEntropyLoss"] = [](GradientBuilder& b, const Node& n, const Grads& g) -> Grads {
    // scores [N, C, D...], labels [N, D...], optional class weights [C]:
    // d scores = (softmax(scores) - onehot(labels)) * w[label] * dloss,
    // where w[label] is 0 at ignore_index (and 1 without weights), and
    // "mean" divides by the sum of the w[label].
    const std::vector<int64_t> shape = b.shapeOf(n.inputs[0]);
    const std::string reduction = n.stringAttribute("reduction", "mean");
    const DType dtype = b.dtypeOf(n.inputs[0]);
    ValueId labels = n.inputs[1];
    ValueId weight = kNoValue;  // per label: [N, D...]
    if (n.hasAttribute("ignore_index")) {
      const ValueId ignored = b.add("Equal", {labels, b.add("CastLike", {b.int64s({n.intAttribute("ignore_index", 0)}), labels})});
      labels = b.add("Where", {ignored, b.add("CastLike", {b.int64s({0}), labels}), labels});  // OneHot of a valid class
      weight = b.add("Cast", {b.add("Not", {ignored})}, {{"to", static_cast<int64_t>(dtype)}});
    }
    if (inputOf(n, 2) != kNoValue) {
      const ValueId picked = b.add("Gather", {n.inputs[2], labels}, {{"axis", int64_t{0}}});
      weight = weight == kNoValue ? picked : b.add("Mul", {weight, picked});
    }
    const ValueId probabilities = b.add("Softmax", {n.inputs[0]}, {{"axis", int64_t{1}}});
    const ValueId on_off = b.add("Concat", {b.add("Reshape", {b.scalar(0.0, dtype), b.int64s({1})}),
                                            b.add("Reshape", {b.scalar(1.0, dtype), b.int64s({1})})},
                                 {{"axis", int64_t{0}}});
    const ValueId onehot = b.add("OneHot", {labels, b.int64s({shape[1]}), on_off}, {{"axis", int64_t{1}}});
    // The factor of each label's row: dloss, times its weight, over the mean's divisor.
    ValueId factor = g[0];
    if (weight != kNoValue) factor = b.add("Mul", {factor, weight});
    if (reduction == "mean") {
      int64_t count = 1;  // labels: every axis but the classes'
      for (size_t i = 0; i < shape.size(); ++i) count *= i == 1 ? 1 : shape[i];
      const ValueId divisor = weight == kNoValue ? b.scalar(static_cast<double>(count), dtype)
                                                 : b.add("ReduceSum", {weight}, {{"keepdims", int64_t{0}}});
      factor = b.add("Div", {factor, divisor});
    }
    if (reduction == "none" || weight != kNoValue) factor = b.add("Unsqueeze", {factor, b.int64s({1})});
    return {b.add("Mul", {b.add("Sub", {probabilities, onehot}), factor}), kNoValue, kNoValue};
  };
  addShapeRules(rules);
  addConvolutionRules(rules);
  addNormalizationRules(rules);
  return rules;
}

const std::map<std::string, GradientRule>& rules() {
  static const std::map<std::string, GradientRule> all = makeRules();
  return all;
}

}  // namespace

const GradientRule* findGradientRule(const std::string& op_type) {
  const auto found = rules().find(op_type);
  return found == rules().end() ? nullptr : &found->second;
}

std::vector<std::string> gradientRuleNames() {
  std::vector<std::string> names;
  for (const auto& [name, rule] : rules()) names.push_back(name);
  return names;
}

}  // namespace kiln
