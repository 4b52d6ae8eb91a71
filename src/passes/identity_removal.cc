#include "passes/identity_removal.h"

#include <set>

#include "passes/pass_helpers.h"

namespace kiln {

size_t removeIdentities(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t removed = 0;
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    if (node.removed || !isOp(graph, id, "Identity") || node.inputs.size() != 1 || node.inputs[0] == kNoValue) continue;
    const ValueId in = node.inputs[0];
    const ValueId out = node.outputs[0];
    if (pinned.contains(out) || graph.value(in).type != graph.value(out).type) continue;
    graph.replaceAllUses(out, in);
    graph.removeNode(id);
    ++removed;
  }
  return removed;
}

}  // namespace kiln
