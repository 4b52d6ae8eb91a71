#include "passes/matmul_fusion.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/fused_activation.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// oneDNN's DNNL_MAX_NDIMS: the fused kernels have no path beyond it.
constexpr size_t kMaxFusedRank = 12;

// An activation found after the chain's value, and the nodes that compute it
// (producers first; the last one defines `end`).
struct ActivationMatch {
  FusedActivation kind = FusedActivation::kNone;
  float alpha = 0;
  float beta = 0;
  std::vector<NodeId> nodes;
  ValueId end = kNoValue;
};

// The fused node's activation attributes (core/fused_activation.h).
void setActivation(Attributes& attributes, const ActivationMatch& activation) {
  attributes[std::string(kActivationAttribute)] = std::string(fusedActivationName(activation.kind));
  if (activation.kind == FusedActivation::kLeakyRelu || activation.kind == FusedActivation::kClip) {
    attributes[std::string(kActivationAlphaAttribute)] = activation.alpha;
    attributes[std::string(kActivationBetaAttribute)] = activation.beta;
  }
}

class MatMulFusion {
 public:
  explicit MatMulFusion(Graph& graph) : graph_(graph), pinned_(pinnedValues(graph)) {}

  size_t run() {
    size_t fused = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed) continue;  // absorbed by an earlier chain
      if (isOp(id, "MatMul")) {
        fused += fuseMatMul(id) ? 1 : 0;
      } else if (isOp(id, "Gemm")) {
        fused += fuseGemm(id) ? 1 : 0;
      }
    }
    return fused;
  }

 private:
  bool isOp(NodeId id, std::string_view op) const {
    const Node& node = graph_.node(id);
    return node.domain.empty() && node.op_type == op && node.outputs.size() == 1;
  }

  const std::vector<Dim>& shapeOf(ValueId id) const { return *graph_.value(id).type.shape; }

  // f32 with a static shape, and no zero-sized dimension when `nonempty`.
  bool isStaticF32(ValueId id, bool nonempty = false) const {
    if (id == kNoValue) return false;
    const ValueType& type = graph_.value(id).type;
    if (type.dtype != DType::kF32 || !type.hasStaticShape()) return false;
    for (const Dim& dim : *type.shape) {
      if (nonempty && dim.size == 0) return false;
    }
    return true;
  }

  // The node that is the only reader of `value`, if it is `op` and `value`
  // may disappear into a fused node (it is not pinned).
  std::optional<NodeId> onlyReader(ValueId value, std::string_view op) const {
    const Value& v = graph_.value(value);
    if (pinned_.contains(value) || v.users.size() != 1 || !isOp(v.users[0].node, op)) return std::nullopt;
    return v.users[0].node;
  }

  // The other input of binary node `id` when one input is `value`.
  ValueId otherOperand(NodeId id, ValueId value) const {
    const std::vector<ValueId>& in = graph_.node(id).inputs;
    if (in.size() != 2) return kNoValue;
    if (in[0] == value && in[1] != value) return in[1];
    if (in[1] == value && in[0] != value) return in[0];
    return kNoValue;
  }

  // The value of a one-element f32 initializer of at most `rank` dimensions.
  std::optional<float> scalar(ValueId id, size_t rank) const {
    if (id == kNoValue) return std::nullopt;
    const ConstantPtr& c = graph_.value(id).initializer;
    if (!c || c->info.dtype != DType::kF32 || c->info.numElements() != 1 || c->info.shape.size() > rank) {
      return std::nullopt;
    }
    float v;
    std::memcpy(&v, c->bytes.data(), sizeof v);
    return v;
  }

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

  bool fuseMatMul(NodeId id);
  bool fuseGemm(NodeId id);
  void rewrite(const std::vector<NodeId>& chain, const std::string& op, Attributes attributes,
               const std::vector<ValueId>& inputs);

  Graph& graph_;
  const std::set<ValueId> pinned_;
};

// ------------------------------------------------------------ activations

std::optional<ActivationMatch> MatMulFusion::matchSingleNodeActivation(NodeId id) const {
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
  } else if (op == "Clip") {
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
std::optional<ActivationMatch> MatMulFusion::matchGeluSubgraph(ValueId x) const {
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

// The activation computed from `x` alone, if any; `x` itself must be free to
// disappear (not pinned).
std::optional<ActivationMatch> MatMulFusion::matchActivation(ValueId x) const {
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
  return matchGeluSubgraph(x);
}

// ------------------------------------------------------------------ chains

bool MatMulFusion::fuseMatMul(NodeId id) {
  const Node& matmul = graph_.node(id);
  const ValueId a = matmul.inputs[0], b = matmul.inputs[1];
  ValueId value = matmul.outputs[0];
  if (!isStaticF32(a, true) || !isStaticF32(b, true) || !isStaticF32(value)) return false;
  if (shapeOf(a).size() < 2 || shapeOf(b).size() < 2 || shapeOf(value).size() > kMaxFusedRank) return false;
  const std::vector<Dim>& out = shapeOf(value);

  std::vector<NodeId> chain = {id};
  ValueId bias = kNoValue, residual = kNoValue;
  if (const auto add = onlyReader(value, "Add")) {
    const ValueId other = otherOperand(*add, value);
    const ConstantPtr constant = other == kNoValue ? nullptr : graph_.value(other).initializer;
    bool row = constant && isStaticF32(other) && !shapeOf(other).empty() && shapeOf(other).size() <= out.size() &&
               shapeOf(other).back() == out.back();
    for (size_t d = 0; row && d + 1 < shapeOf(other).size(); ++d) row = shapeOf(other)[d].size == 1;
    if (row) {
      bias = other;
      chain.push_back(*add);
      value = graph_.node(*add).outputs[0];
    }
  }
  if (const auto add = onlyReader(value, "Add")) {
    const ValueId other = otherOperand(*add, value);
    if (isStaticF32(other) && shapeOf(other) == out) {
      residual = other;
      chain.push_back(*add);
      value = graph_.node(*add).outputs[0];
    }
  }
  Attributes attributes;
  if (const auto activation = matchActivation(value)) {
    chain.insert(chain.end(), activation->nodes.begin(), activation->nodes.end());
    setActivation(attributes, *activation);
  }
  if (chain.size() == 1) return false;
  std::vector<ValueId> inputs = {a, b};
  if (bias != kNoValue || residual != kNoValue) inputs.push_back(bias);
  if (residual != kNoValue) inputs.push_back(residual);
  rewrite(chain, "FusedMatMul", std::move(attributes), inputs);
  return true;
}

bool MatMulFusion::fuseGemm(NodeId id) {
  const Node& gemm = graph_.node(id);
  const std::vector<ValueId> inputs = gemm.inputs;
  for (ValueId input : inputs) {
    if (input != kNoValue && !isStaticF32(input, true)) return false;
  }
  if (!isStaticF32(gemm.outputs[0])) return false;
  const auto activation = matchActivation(gemm.outputs[0]);
  if (!activation) return false;
  Attributes attributes = gemm.attributes;
  setActivation(attributes, *activation);
  std::vector<NodeId> chain = {id};
  chain.insert(chain.end(), activation->nodes.begin(), activation->nodes.end());
  rewrite(chain, "FusedGemm", std::move(attributes), inputs);
  return true;
}

// The chain's last node becomes the fused node, so that the chain's output
// keeps its value (name, type, graph-output slot); then the other nodes,
// whose outputs nothing reads any more, go, consumers before producers.
void MatMulFusion::rewrite(const std::vector<NodeId>& chain, const std::string& op, Attributes attributes,
                           const std::vector<ValueId>& inputs) {
  const NodeId last = chain.back();
  const std::string name = graph_.node(chain.front()).name;
  for (uint32_t i = 0; i < graph_.node(last).inputs.size(); ++i) graph_.setNodeInput(last, i, kNoValue);
  Node& node = graph_.node(last);
  node.inputs.assign(inputs.size(), kNoValue);
  for (uint32_t i = 0; i < inputs.size(); ++i) graph_.setNodeInput(last, i, inputs[i]);
  node.op_type = op;
  node.domain = "kiln";
  node.name = name;
  node.attributes = std::move(attributes);
  for (auto it = chain.rbegin() + 1; it != chain.rend(); ++it) graph_.removeNode(*it);
}

}  // namespace

size_t fuseMatMuls(Graph& graph) { return MatMulFusion(graph).run(); }

}  // namespace kiln
