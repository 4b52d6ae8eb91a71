#include "passes/if_inlining.h"

#include <algorithm>
#include <map>
#include <optional>

#include "kiln/error.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The condition of If node `node` when it is an initializer: a one-element
// bool (or numeric, read as nonzero) tensor.
std::optional<bool> constantCondition(const Graph& graph, const Node& node) {
  if (node.inputs.empty() || node.inputs[0] == kNoValue) return std::nullopt;
  const Value& cond = graph.value(node.inputs[0]);
  if (!cond.initializer || cond.initializer->info.numElements() != 1) return std::nullopt;
  const auto& bytes = cond.initializer->bytes;
  const size_t size = dtypeSize(cond.initializer->info.dtype);
  if (size == 0 || bytes.size() < size) return std::nullopt;
  return std::any_of(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size),
                     [](std::byte b) { return b != std::byte{0}; });
}

bool namesAreFree(const Graph& graph, const Graph& branch) {
  for (ValueId id = 0; id < branch.valueCount(); ++id) {
    const Value& value = branch.value(id);
    if (value.kind != ValueKind::kOuterScope && graph.findValue(value.name)) return false;
  }
  return true;
}

// Copies `branch` into `graph` in place of If node `if_node`.
void inlineBranch(Graph& graph, NodeId if_node, const Graph& branch) {
  std::map<ValueId, ValueId> mapped;  // branch value -> graph value
  for (ValueId id : branch.outerScopeValues()) {
    const auto outer = graph.findValue(branch.value(id).name);
    if (!outer) throw GraphError("If branch reads '" + branch.value(id).name + "', which its graph does not define");
    mapped[id] = *outer;
  }
  for (ValueId id : branch.initializers()) {
    mapped[id] = graph.addInitializer(branch.value(id).name, branch.value(id).initializer);
  }
  for (NodeId id : branch.topologicalOrder()) copyNode(branch, branch.node(id), graph, mapped);
  // Each If output keeps its name (graph outputs and values that subgraphs
  // capture are found by name), now on an Identity of the branch's result:
  // a view, which costs nothing.
  const std::vector<ValueId> results = graph.node(if_node).outputs;
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string name = graph.value(results[i]).name;
    graph.renameValue(results[i], name + ":if");
    const NodeId identity = graph.addNode("Identity", {mapped.at(branch.outputs()[i])}, {name});
    const ValueId value = graph.node(identity).outputs[0];
    graph.value(value).type = graph.value(mapped.at(branch.outputs()[i])).type;
    graph.replaceAllUses(results[i], value);
  }
  graph.removeNode(if_node);
}

}  // namespace

size_t inlineConstantIfs(Graph& graph) {
  size_t inlined = 0;
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    if (!node.domain.empty() || node.op_type != "If") continue;
    const std::optional<bool> condition = constantCondition(graph, node);
    if (!condition) continue;
    const GraphPtr branch = std::get<GraphPtr>(node.attributes.at(*condition ? "then_branch" : "else_branch"));
    if (!branch || branch->outputs().size() != node.outputs.size() || !namesAreFree(graph, *branch)) continue;
    inlineBranch(graph, id, *branch);
    ++inlined;
  }
  return inlined;
}

}  // namespace kiln
