// Small graph-editing helpers shared by the passes.
#pragma once

#include <string>

#include "kiln/graph.h"

namespace kiln {

// `base`, or `base` with a numeric suffix, that no value of `graph` is named.
std::string uniqueName(const Graph& graph, const std::string& base);

// Whether `id` is one of the graph's outputs.
bool isGraphOutput(const Graph& graph, ValueId id);

}  // namespace kiln
