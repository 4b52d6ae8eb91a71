// Queries about a graph that several passes ask.
#pragma once

#include <set>

#include "kiln/graph.h"

namespace kiln {

// Values whose names a pass must keep: the graph's outputs (the model's output
// names) and the values that subgraphs of its nodes read by name, at any
// depth (those reads have no entry in Value::users).
std::set<ValueId> pinnedValues(const Graph& graph);

}  // namespace kiln
