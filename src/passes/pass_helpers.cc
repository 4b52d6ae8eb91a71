#include "passes/pass_helpers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {

std::set<ValueId> pinnedValues(const Graph& graph) {
  std::set<ValueId> pinned(graph.outputs().begin(), graph.outputs().end());
  std::set<std::string> captured;
  collectSubgraphReads(graph, captured);
  for (const std::string& name : captured) {
    if (const auto id = graph.findValue(name)) pinned.insert(*id);
  }
  return pinned;
}

bool isGraphOutput(const Graph& graph, ValueId id) {
  return std::find(graph.outputs().begin(), graph.outputs().end(), id) != graph.outputs().end();
}

bool isOp(const Graph& graph, NodeId id, std::string_view op) {
  const Node& node = graph.node(id);
  return node.domain.empty() && node.op_type == op && node.outputs.size() == 1;
}

std::optional<NodeId> onlyReader(const Graph& graph, const std::set<ValueId>& pinned, ValueId value,
                                 std::string_view op) {
  const Value& v = graph.value(value);
  if (pinned.contains(value) || v.users.size() != 1 || !isOp(graph, v.users[0].node, op)) return std::nullopt;
  return v.users[0].node;
}

ValueId otherOperand(const Graph& graph, NodeId id, ValueId value) {
  const std::vector<ValueId>& in = graph.node(id).inputs;
  if (in.size() != 2) return kNoValue;
  if (in[0] == value && in[1] != value) return in[1];
  if (in[1] == value && in[0] != value) return in[0];
  return kNoValue;
}

std::optional<std::vector<int64_t>> staticShape(const Graph& graph, ValueId id) {
  const ValueType& type = graph.value(id).type;
  if (!type.hasStaticShape()) return std::nullopt;
  std::vector<int64_t> dims;
  for (const Dim& d : *type.shape) dims.push_back(d.size);
  return dims;
}

const Constant* initializerOf(const Graph& graph, ValueId id) {
  if (id == kNoValue) return nullptr;
  const Value& value = graph.value(id);
  return value.kind == ValueKind::kInitializer ? value.initializer.get() : nullptr;
}

bool allZero(const Constant& c) {
  for (std::byte b : c.bytes) {
    if (b != std::byte{0}) return false;
  }
  return true;
}

std::optional<PerTensorQuantization> perTensorQuantization(const Graph& graph, NodeId id) {
  const Node& node = graph.node(id);
  const bool quantize = isOp(graph, id, "QuantizeLinear");
  if ((!quantize && !isOp(graph, id, "DequantizeLinear")) || node.inputs.size() < 2) return std::nullopt;
  if (node.intAttribute("block_size", 0) != 0) return std::nullopt;
  PerTensorQuantization q;
  q.type = graph.value(quantize ? node.outputs[0] : node.inputs[0]).type.dtype;
  if (q.type != DType::kU8 && q.type != DType::kI8) return std::nullopt;
  const std::optional<float> scale = scalarConstant(graph, node.inputs[1], 1);
  if (!scale || !(*scale > 0) || !std::isfinite(*scale)) return std::nullopt;
  q.scale = *scale;
  if (node.inputs.size() < 3 || node.inputs[2] == kNoValue) return q;
  const Constant* zero = initializerOf(graph, node.inputs[2]);
  if (zero == nullptr || zero->info.dtype != q.type || zero->info.numElements() != 1) return std::nullopt;
  const auto byte = std::to_integer<uint8_t>(zero->bytes[0]);
  q.zero = q.type == DType::kU8 ? static_cast<int32_t>(byte) : static_cast<int32_t>(static_cast<int8_t>(byte));
  return q;
}

std::optional<float> scalarConstant(const Graph& graph, ValueId id, size_t rank) {
  if (id == kNoValue) return std::nullopt;
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c || c->info.dtype != DType::kF32 || c->info.numElements() != 1 || c->info.shape.size() > rank) {
    return std::nullopt;
  }
  float v;
  std::memcpy(&v, c->bytes.data(), sizeof v);
  return v;
}

void replaceKeepingName(Graph& graph, ValueId from, ValueId to, const std::string& suffix) {
  const std::string name = graph.value(from).name;
  graph.replaceAllUses(from, to);
  graph.renameValue(from, uniqueName(graph, name + suffix));
  graph.renameValue(to, name);
}

void replaceByFusedNode(Graph& graph, const std::vector<NodeId>& nodes, const std::string& op, Attributes attributes,
                        const std::vector<ValueId>& inputs, std::string name) {
  const NodeId last = nodes.back();
  for (uint32_t i = 0; i < graph.node(last).inputs.size(); ++i) graph.setNodeInput(last, i, kNoValue);
  Node& node = graph.node(last);
  node.inputs.assign(inputs.size(), kNoValue);
  for (uint32_t i = 0; i < inputs.size(); ++i) graph.setNodeInput(last, i, inputs[i]);
  node.op_type = op;
  node.domain = "kiln";
  node.name = std::move(name);
  node.attributes = std::move(attributes);
  // Consumers before producers, so that each output is unread when its
  // node goes.
  for (auto it = nodes.rbegin() + 1; it != nodes.rend(); ++it) graph.removeNode(*it);
}

NodeId copyNode(const Graph& from, const Node& node, Graph& to, std::map<ValueId, ValueId>& mapped) {
  std::vector<ValueId> inputs;
  for (ValueId input : node.inputs) inputs.push_back(input == kNoValue ? kNoValue : mapped.at(input));
  std::vector<std::string> names;
  for (ValueId output : node.outputs) names.push_back(from.value(output).name);
  const NodeId copy = to.addNode(node.op_type, inputs, names, node.attributes, node.domain);
  to.node(copy).name = node.name;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ValueId output = to.node(copy).outputs[i];
    to.value(output).type = from.value(node.outputs[i]).type;
    mapped[node.outputs[i]] = output;
  }
  return copy;
}

}  // namespace kiln
