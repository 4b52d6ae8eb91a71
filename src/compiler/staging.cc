// splitAtUnknownShapes (runtime_shapes.h): the cut of a graph whose shapes
// depend on values it computes.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/runtime_shapes.h"
#include "kiln/error.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {


// What `node` reads from `graph`: its inputs and its subgraphs' captures.
std::vector<ValueId> readsOf(const Graph& graph, const Node& node) {
  std::vector<ValueId> reads;
  for (ValueId input : node.inputs) {
    if (input != kNoValue) reads.push_back(input);
  }
  std::set<std::string> captured;
  for (const Graph* sub : node.subgraphs()) collectCapturedNames(*sub, captured);
  for (const std::string& name : captured) {
    if (const auto id = graph.findValue(name)) reads.push_back(*id);
  }
  return reads;
}

bool hasStaticOutputs(const Graph& graph, const Node& node) {
  for (ValueId output : node.outputs) {
    if (!graph.value(output).type.hasStaticShape()) return false;
  }
  return true;
}

// Copies nodes of `from` into `to`, mapping value ids; values not yet in
// `to` are initializers (shared, not copied) or must have been added by the
// caller.
class Copier {
 public:
  Copier(const Graph& from, Graph& to) : from_(from), to_(to) {}

  void input(ValueId id) { map_[id] = to_.addInput(from_.value(id).name, from_.value(id).type); }
  void alias(ValueId id, ValueId in_to) { map_[id] = in_to; }

  ValueId mapped(ValueId id) {
    if (id == kNoValue) return kNoValue;
    const auto it = map_.find(id);
    if (it != map_.end()) return it->second;
    const Value& value = from_.value(id);
    // Anything else the copied nodes read is an initializer of `from`.
    return map_[id] = to_.addInitializer(value.name, value.initializer);
  }

  void node(const Node& node) {
    for (ValueId input : node.inputs) mapped(input);  // initializers first met here
    // Initializers that its subgraphs read by name come along too.
    std::set<std::string> captured;
    for (const Graph* sub : node.subgraphs()) collectCapturedNames(*sub, captured);
    for (const std::string& name : captured) {
      const auto id = from_.findValue(name);
      if (id && from_.value(*id).kind == ValueKind::kInitializer) mapped(*id);
    }
    copyNode(from_, node, to_, map_);
  }

 private:
  const Graph& from_;
  Graph& to_;
  std::map<ValueId, ValueId> map_;
};

bool isStaticGraph(const Graph& graph) {
  for (ValueId input : graph.inputs()) {
    if (!graph.value(input).type.hasStaticShape()) return false;
  }
  for (NodeId id : graph.nodeIds()) {
    if (!hasStaticOutputs(graph, graph.node(id)) || !hasStaticSubgraphs(graph.node(id))) return false;
  }
  return true;
}

// `graph` without node `cut`: its inputs are the node's outputs, then the
// graph inputs that the other nodes and the graph outputs read.
Graph graphAfter(const Graph& graph, NodeId cut) {
  Graph rest(graph.name() + ":after " + graph.node(cut).op_type);
  const std::vector<NodeId> order = graph.topologicalOrder();
  Copier after(graph, rest);
  for (ValueId output : graph.node(cut).outputs) after.input(output);
  std::set<ValueId> read_inputs;
  auto readInput = [&](ValueId id) {
    if (graph.value(id).kind == ValueKind::kGraphInput && read_inputs.insert(id).second) after.input(id);
  };
  for (NodeId id : order) {
    if (id == cut) continue;
    for (ValueId read : readsOf(graph, graph.node(id))) readInput(read);
  }
  for (ValueId output : graph.outputs()) readInput(output);
  for (NodeId id : order) {
    if (id != cut) after.node(graph.node(id));
  }
  for (ValueId output : graph.outputs()) rest.addOutput(after.mapped(output));
  return rest;
}

// Whether every value `node` reads is a graph input or an initializer.
bool readsOnlyInputs(const Graph& graph, const Node& node) {
  const std::vector<ValueId> reads = readsOf(graph, node);
  return std::all_of(reads.begin(), reads.end(), [&](ValueId read) {
    const ValueKind kind = graph.value(read).kind;
    return kind == ValueKind::kGraphInput || kind == ValueKind::kInitializer;
  });
}

// The Loop node `loop_id` of `graph` and what surrounds it, as a LoopStage.
LoopStage cutAroundLoop(const Graph& graph, NodeId loop_id) {
  const Node& loop = graph.node(loop_id);
  const Graph& body = *loop.subgraphs().at(0);
  LoopStage stage{Graph(graph.name() + ":loop body"), {}, {}, {}, {}, {}, Graph()};

  Copier inner(body, stage.body);
  for (ValueId input : body.inputs()) inner.input(input);
  std::set<std::string> captured;
  collectCapturedNames(body, captured);
  for (const std::string& name : captured) {
    // Nested subgraphs also read the body's own values by name: those are
    // not captures.
    const auto own = body.findValue(name);
    if (own && body.value(*own).kind != ValueKind::kOuterScope) continue;
    const auto outer = graph.findValue(name);
    if (!outer) throw GraphError(fmt::format("the Loop body reads '{}', which no enclosing graph defines", name));
    const ValueId input = stage.body.addInput(name, graph.value(*outer).type);
    if (own) inner.alias(*own, input);
    stage.captures.push_back(name);
  }
  for (NodeId id : body.topologicalOrder()) inner.node(body.node(id));
  const size_t carried = body.inputs().size() >= 2 ? body.inputs().size() - 2 : 0;
  if (body.outputs().size() < 1 + carried) {
    throw GraphError(fmt::format("the Loop body has {} outputs; its {} carried values need at least {}",
                                 body.outputs().size(), carried, 1 + carried));
  }
  for (size_t k = 0; k < carried; ++k) stage.unchanged.push_back(body.outputs()[1 + k] == body.inputs()[2 + k]);
  for (size_t j = 0; j < body.outputs().size(); ++j) {
    if (j >= 1 && j <= carried && stage.unchanged[j - 1]) continue;
    stage.body.addOutput(inner.mapped(body.outputs()[j]));
    stage.body_outputs.push_back(j);
  }

  for (ValueId input : loop.inputs) stage.loop_inputs.push_back(input == kNoValue ? "" : graph.value(input).name);
  for (ValueId output : loop.outputs) stage.loop_outputs.push_back(graph.value(output).name);

  stage.after = graphAfter(graph, loop_id);
  return stage;
}

}  // namespace

bool hasStaticSubgraphs(const Node& node) {
  for (const Graph* sub : node.subgraphs()) {
    if (!isStaticGraph(*sub)) return false;
  }
  return true;
}

std::optional<LoopStage> splitAtDynamicLoop(const Graph& graph) {
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    if (!node.domain.empty() || node.op_type != "Loop" || node.subgraphs().size() != 1) continue;
    // Dynamic: the body's shapes are unknown, or its carried values change
    // shape (inference saw the first iteration only).
    if (hasStaticSubgraphs(node) && hasStaticOutputs(graph, node)) continue;
    if (readsOnlyInputs(graph, node)) return cutAroundLoop(graph, id);
  }
  return std::nullopt;
}

bool isSelection(const Node& node) {
  return node.domain.empty() && (node.op_type == "NonZero" || node.op_type == "NonMaxSuppression" ||
                                 node.op_type == "Compress" || node.op_type == "Unique");
}

std::optional<NodeStage> splitAtUnknownNode(const Graph& graph, bool selections_only) {
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    if (!node.subgraphs().empty() || hasStaticOutputs(graph, node) || !readsOnlyInputs(graph, node)) continue;
    if (selections_only && !isSelection(node)) continue;
    NodeStage stage{node.op_type, node.domain, node.attributes, {}, {}, graphAfter(graph, id)};
    for (ValueId input : node.inputs) stage.inputs.push_back(input == kNoValue ? "" : graph.value(input).name);
    for (ValueId output : node.outputs) stage.outputs.push_back(graph.value(output).name);
    return stage;
  }
  return std::nullopt;
}

std::optional<StagedGraph> splitAtUnknownShapes(const Graph& graph) {
  const std::vector<NodeId> order = graph.topologicalOrder();
  // Values available before the cut: inputs, initializers, prefix outputs.
  std::vector<bool> before(graph.valueCount(), false);
  for (ValueId id : graph.inputs()) before[id] = true;
  for (ValueId id : graph.initializers()) before[id] = true;
  std::vector<NodeId> prefix_nodes, rest_nodes;
  for (NodeId id : order) {
    const Node& node = graph.node(id);
    bool ready = hasStaticOutputs(graph, node) && hasStaticSubgraphs(node);
    for (ValueId read : readsOf(graph, node)) ready = ready && before[read];
    if (ready) {
      prefix_nodes.push_back(id);
      for (ValueId output : node.outputs) before[output] = true;
    } else {
      rest_nodes.push_back(id);
    }
  }
  if (prefix_nodes.empty() || rest_nodes.empty()) return std::nullopt;

  // What the rest reads from before the cut (initializers aside), in a
  // fixed order: its inputs.
  std::vector<ValueId> crossing;
  std::set<ValueId> seen;
  auto cross = [&](ValueId id) {
    if (id == kNoValue || !before[id] || graph.value(id).kind == ValueKind::kInitializer) return;
    if (seen.insert(id).second) crossing.push_back(id);
  };
  for (NodeId id : rest_nodes) {
    for (ValueId read : readsOf(graph, graph.node(id))) cross(read);
  }
  for (ValueId output : graph.outputs()) cross(output);
  const bool prefix_gives = std::any_of(crossing.begin(), crossing.end(), [&](ValueId id) {
    return graph.value(id).kind == ValueKind::kNodeOutput;
  });
  if (!prefix_gives) return std::nullopt;  // the cut would run nothing first

  StagedGraph staged{Graph(graph.name()), Graph(graph.name() + ":rest")};
  Copier prefix(graph, staged.prefix);
  for (ValueId id : graph.inputs()) prefix.input(id);
  for (NodeId id : prefix_nodes) prefix.node(graph.node(id));
  Copier rest(graph, staged.rest);
  for (ValueId id : crossing) {
    rest.input(id);
    if (graph.value(id).kind != ValueKind::kGraphInput) staged.prefix.addOutput(prefix.mapped(id));
  }
  for (NodeId id : rest_nodes) rest.node(graph.node(id));
  for (ValueId output : graph.outputs()) staged.rest.addOutput(rest.mapped(output));
  return staged;
}

}  // namespace kiln
