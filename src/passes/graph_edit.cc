#include "passes/graph_edit.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {

std::string uniqueName(const Graph& graph, const std::string& base) {
  std::string name = base;
  for (int i = 1; graph.findValue(name); ++i) name = fmt::format("{}_{}", base, i);
  return name;
}

bool isGraphOutput(const Graph& graph, ValueId id) {
  return std::find(graph.outputs().begin(), graph.outputs().end(), id) != graph.outputs().end();
}

}  // namespace kiln
