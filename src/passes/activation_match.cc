#include "passes/activation_match.h"

#include <cmath>
#include <limits>
#include <string>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The graph, the pinned values and the queries the patterns need.
struct Matcher {
  const Graph& graph_;
  const std::set<ValueId>& pinned_;
  bool clip_ = true;  // Clip may be matched

  bool isOp(NodeId id, std::string_view op) const { return kiln::isOp(graph_, id, op); }
  std::optional<NodeId> onlyReader(ValueId value, std::string_view op) const {
    return kiln::onlyReader(graph_, pinned_, value, op);
  }
  ValueId otherOperand(NodeId id, ValueId value) const { return kiln::otherOperand(graph_, id, value); }
  const std::vector<Dim>& shapeOf(ValueId id) const { return *graph_.value(id).type.shape; }
  std::optional<float> scalar(ValueId id, size_t rank) const { return scalarConstant(graph_, id, rank); }
  bool isScalar(ValueId id, double expected, size_t rank) const {
    const std::optional<float> v = scalar(id, rank);
    return v && std::abs(*v - expected) <= 1e-6 * std::abs(expected);
  }
  // Binary `op` node `id` reading `value` and a scalar `expected`.
  bool isBinaryWithScalar(NodeId id, std::string_view op, ValueId value, double expected) const {
    return isOp(id, op) && isScalar(otherOperand(id, value), expected, shapeOf(value).size());
  }

  std::optional<ActivationMatch> matchActivation(ValueId x) const;
  std::optional<ActivationMatch> matchSingleNodeActivation(NodeId id) const;
  std::optional<ActivationMatch> matchGeluSubgraph(ValueId x) const;
  std::optional<ActivationMatch> matchHardSwishSubgraph(ValueId x) const;
  // `id` divides `value` by `divisor`, or multiplies it by 1 / divisor.
  bool dividesBy(NodeId id, ValueId value, double divisor) const {
    if (isOp(id, "Div")) {
      const Node& node = graph_.node(id);
      return node.inputs[0] == value && isScalar(node.inputs[1], divisor, shapeOf(value).size());
    }
    return isBinaryWithScalar(id, "Mul", value, 1.0 / divisor);
  }
};

std::optional<ActivationMatch> Matcher::matchSingleNodeActivation(NodeId id) const {
  const Node& node = graph_.node(id);
  if (!node.domain.empty() || node.outputs.size() != 1) return std::nullopt;
  const std::string& op = node.op_type;
  ActivationMatch match{FusedActivation::kNone, 0, 0, {id}, node.outputs[0]};
  if (op == "Relu") {
    match.kind = FusedActivation::kRelu;
  } else if (op == "LeakyRelu") {
    match.kind = FusedActivation::kLeakyRelu;
    match.alpha = node.floatAttribute("alpha", 0.01f);
  } else if (op == "Sigmoid") {
    match.kind = FusedActivation::kSigmoid;
  } else if (op == "Tanh") {
    match.kind = FusedActivation::kTanh;
  } else if (op == "HardSwish") {
    match.kind = FusedActivation::kHardSwish;
  } else if (op == "Gelu") {
    const std::string approximate = node.stringAttribute("approximate", "none");
    if (approximate != "none" && approximate != "tanh") return std::nullopt;
    match.kind = approximate == "none" ? FusedActivation::kGelu : FusedActivation::kGeluTanh;
  } else if (op == "Clip" && clip_) {
    // Bounds are inputs from opset 11, attributes before; absent is unbounded.
    auto bound = [&](size_t input, const char* attribute, float unbounded) -> std::optional<float> {
      if (input < node.inputs.size() && node.inputs[input] != kNoValue) return scalar(node.inputs[input], 0);
      return node.floatAttribute(attribute, unbounded);
    };
    const std::optional<float> low = bound(1, "min", std::numeric_limits<float>::lowest());
    const std::optional<float> high = bound(2, "max", std::numeric_limits<float>::max());
    if (!low || !high || !(*low <= *high)) return std::nullopt;
    match = {FusedActivation::kClip, *low, *high, {id}, node.outputs[0]};
  } else {
    return std::nullopt;
  }
  return match;
}

// x * 0.5 * (1 + Erf(x / sqrt 2)) in the forms listed in the header; x has
// exactly two readers, the first step and one of the products.
std::optional<ActivationMatch> Matcher::matchGeluSubgraph(ValueId x) const {
  const std::vector<Use>& users = graph_.value(x).users;
  for (const Use& scale_use : users) {
    const NodeId scale = scale_use.node;  // x / sqrt 2
    const bool divides = isOp(scale, "Div") && graph_.node(scale).inputs[0] == x &&
                         isScalar(graph_.node(scale).inputs[1], std::sqrt(2.0), shapeOf(x).size());
    if (!divides && !isBinaryWithScalar(scale, "Mul", x, std::sqrt(0.5))) continue;
    const auto erf = onlyReader(graph_.node(scale).outputs[0], "Erf");
    if (!erf) continue;
    const ValueId erf_out = graph_.node(*erf).outputs[0];
    const auto plus_one = onlyReader(erf_out, "Add");
    if (!plus_one || !isBinaryWithScalar(*plus_one, "Add", erf_out, 1.0)) continue;
    const ValueId one_plus_erf = graph_.node(*plus_one).outputs[0];
    const NodeId other = users[0].node == scale ? users[1].node : users[0].node;  // x's other reader
    if (!isOp(other, "Mul")) continue;
    const ValueId other_out = graph_.node(other).outputs[0];
    const std::vector<NodeId> start = {scale, *erf, *plus_one};
    auto matched = [&](NodeId a, NodeId b) {
      std::vector<NodeId> nodes = start;
      nodes.insert(nodes.end(), {a, b});
      return ActivationMatch{FusedActivation::kGelu, 0, 0, nodes, graph_.node(b).outputs[0]};
    };
    // Mul(Mul(x, 1 + erf), 0.5)
    if (otherOperand(other, x) == one_plus_erf && onlyReader(one_plus_erf, "Mul") == other) {
      const auto half = onlyReader(other_out, "Mul");
      if (half && isBinaryWithScalar(*half, "Mul", other_out, 0.5)) return matched(other, *half);
    }
    // Mul(Mul(x, 0.5), 1 + erf)
    if (isBinaryWithScalar(other, "Mul", x, 0.5)) {
      const auto product = onlyReader(other_out, "Mul");
      if (product && otherOperand(*product, other_out) == one_plus_erf && onlyReader(one_plus_erf, "Mul") == product) {
        return matched(other, *product);
      }
    }
    // Mul(x, Mul(1 + erf, 0.5))
    const auto half = onlyReader(one_plus_erf, "Mul");
    if (half && isBinaryWithScalar(*half, "Mul", one_plus_erf, 0.5) &&
        otherOperand(other, x) == graph_.node(*half).outputs[0] &&
        onlyReader(graph_.node(*half).outputs[0], "Mul") == other) {
      return matched(*half, other);
    }
  }
  return std::nullopt;
}

// HardSwish written out: x * Clip(x + 3, 0, 6) / 6, the division (or the
// product with 1/6) applied to the product or to the Clip (as Paddle and
// older PyTorch exports write it), or x * HardSigmoid(x) with alpha 1/6 and
// beta 0.5; x has exactly two readers, the first step and the product.
std::optional<ActivationMatch> Matcher::matchHardSwishSubgraph(ValueId x) const {
  const std::vector<Use>& users = graph_.value(x).users;
  for (const Use& use : users) {
    const NodeId first = use.node;
    const NodeId other = users[0].node == first ? users[1].node : users[0].node;  // x's other reader
    if (!isOp(other, "Mul")) continue;
    const ValueId other_out = graph_.node(other).outputs[0];
    auto matched = [&](std::vector<NodeId> nodes) {
      return ActivationMatch{FusedActivation::kHardSwish, 0, 0, nodes, graph_.node(nodes.back()).outputs[0]};
    };
    if (isOp(first, "HardSigmoid")) {
      const Node& hard_sigmoid = graph_.node(first);
      const ValueId gate = hard_sigmoid.outputs[0];
      if (std::abs(hard_sigmoid.floatAttribute("alpha", 0.2f) - 1.0f / 6.0f) <= 1e-6f &&
          hard_sigmoid.floatAttribute("beta", 0.5f) == 0.5f && onlyReader(gate, "Mul") == other &&
          otherOperand(other, x) == gate) {
        return matched({first, other});
      }
      continue;
    }
    if (!isBinaryWithScalar(first, "Add", x, 3.0)) continue;
    const auto clip = onlyReader(graph_.node(first).outputs[0], "Clip");
    if (!clip) continue;
    const std::optional<ActivationMatch> bounds = matchSingleNodeActivation(*clip);
    if (!bounds || bounds->alpha != 0.0f || bounds->beta != 6.0f) continue;
    const ValueId clipped = graph_.node(*clip).outputs[0];
    // (x * clip) / 6
    if (otherOperand(other, x) == clipped && onlyReader(clipped, "Mul") == other) {
      const std::vector<Use>& readers = graph_.value(other_out).users;
      if (readers.size() == 1 && !pinned_.contains(other_out) && dividesBy(readers[0].node, other_out, 6.0)) {
        return matched({first, *clip, other, readers[0].node});
      }
      continue;
    }
    // x * (clip / 6)
    const std::vector<Use>& readers = graph_.value(clipped).users;
    if (readers.size() != 1 || pinned_.contains(clipped) || !dividesBy(readers[0].node, clipped, 6.0)) continue;
    const ValueId scaled = graph_.node(readers[0].node).outputs[0];
    if (otherOperand(other, x) == scaled && onlyReader(scaled, "Mul") == other) {
      return matched({first, *clip, readers[0].node, other});
    }
  }
  return std::nullopt;
}

// The activation computed from `x` alone, if any; `x` itself must be free to
// disappear (not pinned).
std::optional<ActivationMatch> Matcher::matchActivation(ValueId x) const {
  const std::vector<Use>& users = graph_.value(x).users;
  if (pinned_.contains(x)) return std::nullopt;
  if (users.size() == 1) {
    const Node& node = graph_.node(users[0].node);
    if (node.inputs.empty() || node.inputs[0] != x) return std::nullopt;  // x must be the operand, not a bound
    return matchSingleNodeActivation(users[0].node);
  }
  if (users.size() != 2 || users[0].node == users[1].node) return std::nullopt;
  // Swish: Mul(x, Sigmoid(x)).
  for (const Use& use : users) {
    const NodeId other = users[0].node == use.node ? users[1].node : users[0].node;
    if (!isOp(use.node, "Sigmoid") || !isOp(other, "Mul")) continue;
    const ValueId sigmoid = graph_.node(use.node).outputs[0];
    if (onlyReader(sigmoid, "Mul") == other && otherOperand(other, x) == sigmoid) {
      return ActivationMatch{FusedActivation::kSwish, 0, 0, {use.node, other}, graph_.node(other).outputs[0]};
    }
  }
  if (auto gelu = matchGeluSubgraph(x)) return gelu;
  return matchHardSwishSubgraph(x);
}

}  // namespace

std::optional<ActivationMatch> matchActivation(const Graph& graph, const std::set<ValueId>& pinned, ValueId x,
                                               bool clip) {
  if (!graph.value(x).type.shape) return std::nullopt;
  return Matcher{graph, pinned, clip}.matchActivation(x);
}

void setActivation(Attributes& attributes, const ActivationMatch& activation) {
  attributes[std::string(kActivationAttribute)] = std::string(fusedActivationName(activation.kind));
  if (activation.kind == FusedActivation::kLeakyRelu || activation.kind == FusedActivation::kClip) {
    attributes[std::string(kActivationAlphaAttribute)] = activation.alpha;
    attributes[std::string(kActivationBetaAttribute)] = activation.beta;
  }
}

}  // namespace kiln
