#include "passes/activation_match.h"

#include <cstring>
#include <limits>

#include "passes/graph_edit.h"

namespace kiln {
namespace {

// The value of a one-element f32 initializer.
std::optional<float> scalarConstant(const Graph& graph, ValueId id) {
  if (id == kNoValue) return std::nullopt;
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c || c->info.dtype != DType::kF32 || c->info.numElements() != 1) return std::nullopt;
  float v;
  std::memcpy(&v, c->bytes.data(), sizeof v);
  return v;
}

std::optional<ActivationMatch> singleNode(const Graph& graph, NodeId id, ValueId value) {
  const Node& node = graph.node(id);
  if (!node.domain.empty() || node.outputs.size() != 1 || node.inputs.empty() || node.inputs[0] != value) {
    return std::nullopt;
  }
  ActivationMatch m{.kind = node.op_type, .output = node.outputs[0], .nodes = {id}};
  const std::string& op = node.op_type;
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") {
    if (node.inputs.size() != 1) return std::nullopt;
  } else if (op == "LeakyRelu") {
    m.alpha = node.floatAttribute("alpha", 0.01f);
  } else if (op == "Elu") {
    m.alpha = node.floatAttribute("alpha", 1.0f);
  } else if (op == "HardSigmoid") {
    m.alpha = node.floatAttribute("alpha", 0.2f);
    m.beta = node.floatAttribute("beta", 0.5f);
  } else if (op == "Gelu") {
    if (node.stringAttribute("approximate", "none") == "tanh") m.kind = "GeluTanh";
  } else if (op == "Clip") {
    // Opset 11+: bounds as optional inputs; before: attributes.
    m.alpha = node.floatAttribute("min", std::numeric_limits<float>::lowest());
    m.beta = node.floatAttribute("max", std::numeric_limits<float>::max());
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      if (node.inputs[i] == kNoValue) continue;
      const std::optional<float> bound = scalarConstant(graph, node.inputs[i]);
      if (!bound) return std::nullopt;
      (i == 1 ? m.alpha : m.beta) = *bound;
    }
  } else {
    return std::nullopt;
  }
  return m;
}

// x * Sigmoid(x), in either operand order: `value`'s two readers are a
// Sigmoid and the Mul that reads both.
std::optional<ActivationMatch> silu(const Graph& graph, ValueId value) {
  const std::vector<Use>& users = graph.value(value).users;
  if (users.size() != 2) return std::nullopt;
  for (int first = 0; first < 2; ++first) {
    const NodeId sigmoid_id = users[static_cast<size_t>(first)].node;
    const NodeId mul_id = users[static_cast<size_t>(1 - first)].node;
    const Node& sigmoid = graph.node(sigmoid_id);
    const Node& mul = graph.node(mul_id);
    if (sigmoid.op_type != "Sigmoid" || !sigmoid.domain.empty() || mul.op_type != "Mul" || !mul.domain.empty()) {
      continue;
    }
    const ValueId s = sigmoid.outputs[0];
    if (mul.inputs.size() != 2 || graph.value(s).users.size() != 1 || isGraphOutput(graph, s)) continue;
    const bool operands = (mul.inputs[0] == value && mul.inputs[1] == s) || (mul.inputs[0] == s && mul.inputs[1] == value);
    if (!operands) continue;
    return ActivationMatch{.kind = "Swish", .alpha = 1.0f, .output = mul.outputs[0], .nodes = {sigmoid_id, mul_id}};
  }
  return std::nullopt;
}

}  // namespace

std::optional<ActivationMatch> matchActivation(const Graph& graph, ValueId value) {
  const Value& v = graph.value(value);
  if (isGraphOutput(graph, value) || v.type.dtype != DType::kF32) return std::nullopt;
  if (v.users.size() == 1) return singleNode(graph, v.users[0].node, value);
  return silu(graph, value);
}

}  // namespace kiln
