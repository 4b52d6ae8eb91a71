#include "passes/pass_helpers.h"

#include <string>

namespace kiln {
namespace {

void collectCapturedNames(const Graph& graph, std::set<std::string>& names) {
  for (NodeId id : graph.nodeIds()) {
    for (const Graph* subgraph : graph.node(id).subgraphs()) {
      for (ValueId captured : subgraph->outerScopeValues()) names.insert(subgraph->value(captured).name);
      collectCapturedNames(*subgraph, names);
    }
  }
}

}  // namespace

std::set<ValueId> pinnedValues(const Graph& graph) {
  std::set<ValueId> pinned(graph.outputs().begin(), graph.outputs().end());
  std::set<std::string> captured;
  collectCapturedNames(graph, captured);
  for (const std::string& name : captured) {
    if (const auto id = graph.findValue(name)) pinned.insert(*id);
  }
  return pinned;
}

}  // namespace kiln
