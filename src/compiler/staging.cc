// splitAtUnknownShapes (runtime_shapes.h): the cut of a graph whose shapes
// depend on values it computes.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "compiler/runtime_shapes.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The names of the enclosing graph's values that `graph` and its subgraphs
// read (If branches and Loop bodies capture values by name).
void collectCaptures(const Graph& graph, std::set<std::string>& names) {
  for (ValueId id : graph.outerScopeValues()) names.insert(graph.value(id).name);
  for (NodeId id : graph.nodeIds()) {
    for (const Graph* sub : graph.node(id).subgraphs()) collectCaptures(*sub, names);
  }
}

// What `node` reads from `graph`: its inputs and its subgraphs' captures.
std::vector<ValueId> readsOf(const Graph& graph, const Node& node) {
  std::vector<ValueId> reads;
  for (ValueId input : node.inputs) {
    if (input != kNoValue) reads.push_back(input);
  }
  std::set<std::string> captured;
  for (const Graph* sub : node.subgraphs()) collectCaptures(*sub, captured);
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
    copyNode(from_, node, to_, map_);
  }

 private:
  const Graph& from_;
  Graph& to_;
  std::map<ValueId, ValueId> map_;
};

}  // namespace

std::optional<StagedGraph> splitAtUnknownShapes(const Graph& graph) {
  const std::vector<NodeId> order = graph.topologicalOrder();
  // Values available before the cut: inputs, initializers, prefix outputs.
  std::vector<bool> before(graph.valueCount(), false);
  for (ValueId id : graph.inputs()) before[id] = true;
  for (ValueId id : graph.initializers()) before[id] = true;
  std::vector<NodeId> prefix_nodes, rest_nodes;
  for (NodeId id : order) {
    const Node& node = graph.node(id);
    bool ready = hasStaticOutputs(graph, node);
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
