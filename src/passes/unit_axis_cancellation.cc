#include "passes/unit_axis_cancellation.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

using Dims = std::vector<int64_t>;

// The sorted axes of Squeeze or Unsqueeze `id` (from its constant input 1,
// or the attribute before opset 13), normalized against `rank`: the input's
// rank for Squeeze, the output's for Unsqueeze. Nothing when they are not
// known or not valid.
std::optional<Dims> axesOf(const Graph& graph, NodeId id, size_t rank) {
  const Node& node = graph.node(id);
  Dims axes;
  if (node.inputs.size() > 1 && node.inputs[1] != kNoValue) {
    const ConstantPtr& c = graph.value(node.inputs[1]).initializer;
    if (!c || c->info.dtype != DType::kI64) return std::nullopt;
    axes.resize(static_cast<size_t>(c->info.numElements()));
    if (!axes.empty()) std::memcpy(axes.data(), c->bytes.data(), axes.size() * sizeof(int64_t));
  } else {
    axes = node.intsAttribute("axes", {});
  }
  if (axes.empty()) return std::nullopt;  // Squeeze of every unit axis: not matched
  for (int64_t& axis : axes) {
    if (axis < 0) axis += static_cast<int64_t>(rank);
    if (axis < 0 || axis >= static_cast<int64_t>(rank)) return std::nullopt;
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) return std::nullopt;
  return axes;
}

// `dims` (a squeezed shape, or a constant's shape broadcast against one of
// rank `rank`) with unit axes inserted at `axes` (of the unsqueezed rank).
Dims unsqueezed(Dims dims, size_t rank, const Dims& axes) {
  dims.insert(dims.begin(), rank - std::min(rank, dims.size()), 1);  // align to the right
  for (int64_t axis : axes) dims.insert(dims.begin() + axis, 1);
  return dims;
}

bool isElementwiseUnary(const Graph& graph, const Node& node) {
  static const std::set<std::string, std::less<>> kUnary = {
      "Relu", "Sigmoid", "HardSwish", "Softplus", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Abs", "Neg",
      "Reciprocal", "Floor", "Ceil", "LeakyRelu", "Elu", "HardSigmoid", "Gelu", "Cast", "Identity"};
  if (kUnary.contains(node.op_type)) return node.inputs.size() == 1;
  if (node.op_type != "Clip" || node.inputs.empty()) return false;
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    if (node.inputs[i] != kNoValue && !graph.value(node.inputs[i]).initializer) return false;
  }
  return true;
}

bool isElementwiseBinary(const Node& node) {
  static const std::set<std::string, std::less<>> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu"};
  return kBinary.contains(node.op_type) && node.inputs.size() == 2;
}

// One link of a chain: the node and which of its inputs is the chain's.
struct Link {
  NodeId node = kNoNode;
  uint32_t input = 0;
};

// The link that produces `value`, when it is an elementwise op of the
// chain's kind whose output has its chain input's shape.
std::optional<Link> linkProducing(const Graph& graph, ValueId value) {
  const NodeId id = graph.value(value).producer;
  if (id == kNoNode) return std::nullopt;
  const Node& node = graph.node(id);
  if (!node.domain.empty() || node.outputs.size() != 1) return std::nullopt;
  Link link{id, 0};
  if (isElementwiseBinary(node)) {
    const bool first_constant = static_cast<bool>(graph.value(node.inputs[0]).initializer);
    const bool second_constant = static_cast<bool>(graph.value(node.inputs[1]).initializer);
    if (first_constant == second_constant) return std::nullopt;
    link.input = first_constant ? 1 : 0;
  } else if (!isElementwiseUnary(graph, node)) {
    return std::nullopt;
  }
  const ValueType& in = graph.value(node.inputs[link.input]).type;
  if (!in.shape || in.shape != graph.value(value).type.shape) return std::nullopt;
  return link;
}

// Cancels the pair ending at Unsqueeze `id`, when there is one.
bool cancelAt(Graph& graph, const std::set<ValueId>& pinned, NodeId id) {
  const Node& unsqueeze = graph.node(id);
  const ValueId out = unsqueeze.outputs[0];
  // (A copy: adding initializers below may move the graph's values.)
  const std::optional<std::vector<Dim>> shape = graph.value(out).type.shape;
  if (!shape) return false;
  const size_t rank = shape->size();
  const auto axes = axesOf(graph, id, rank);
  if (!axes) return false;
  // Walk back to the Squeeze.
  std::vector<Link> chain;  // last link first
  ValueId value = unsqueeze.inputs[0];
  NodeId squeeze = kNoNode;
  for (;;) {
    const NodeId producer = graph.value(value).producer;
    if (producer != kNoNode && isOp(graph, producer, "Squeeze")) {
      squeeze = producer;
      break;
    }
    if (pinned.contains(value) || graph.value(value).users.size() != 1) return false;
    const auto link = linkProducing(graph, value);
    if (!link) return false;
    chain.push_back(*link);
    value = graph.node(link->node).inputs[link->input];
  }
  const ValueId source = graph.node(squeeze).inputs[0];
  if (graph.value(source).type.shape != shape || axesOf(graph, squeeze, rank) != axes) return false;
  // With nothing between them the Unsqueeze's output becomes the source
  // itself, whose name cannot change: not for a value that must keep its own.
  if (chain.empty() && pinned.contains(out)) return false;
  const size_t squeezed_rank = rank - axes->size();

  // The chain reads the unsqueezed source; constants and values get the axes.
  for (auto link = chain.rbegin(); link != chain.rend(); ++link) {
    Node& node = graph.node(link->node);
    for (uint32_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId input = node.inputs[i];
      if (i == link->input || input == kNoValue || !isElementwiseBinary(node)) continue;
      const Constant& c = *graph.value(input).initializer;
      TensorInfo info{c.info.dtype, unsqueezed(c.info.shape, squeezed_rank, *axes)};
      const ValueId replacement = graph.addInitializer(uniqueName(graph, graph.value(input).name + ":unsqueezed"),
                                                       makeConstant(std::move(info), c.bytes));
      graph.setNodeInput(link->node, i, replacement);
    }
    if (link == chain.rbegin()) graph.setNodeInput(link->node, link->input, source);
    graph.value(graph.node(link->node).outputs[0]).type.shape = shape;
  }
  // The last value takes the Unsqueeze's place and name; with nothing
  // between the two, the source takes its place but keeps its own name.
  if (chain.empty()) {
    graph.replaceAllUses(out, source);
  } else {
    replaceKeepingName(graph, out, graph.node(chain.front().node).outputs[0], "/cancelled");
  }
  graph.removeNode(id);
  return true;
}

}  // namespace

size_t cancelUnitAxisPairs(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t cancelled = 0;
  for (NodeId id : graph.topologicalOrder()) {
    if (graph.node(id).removed || !isOp(graph, id, "Unsqueeze")) continue;
    if (cancelAt(graph, pinned, id)) ++cancelled;
  }
  return cancelled;
}

}  // namespace kiln
