// If with a constant condition: the branch it takes, inlined.
//
// Exporters turn a Python `if` on a configuration value into an ONNX If
// (Silero VAD switches its whole front end on the sample rate). Once the
// condition is a constant (an initializer, or folded from one, or a shape
// input fixed by its value at specialization), the If is replaced by the
// nodes of the branch it takes, so that the rest of the compiler sees one
// straight graph with static shapes, whatever shape the other branch gives.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Inlines every If of `graph` (not of its subgraphs) whose condition is an
// initializer; returns how many. An If is left as it is when a name of its
// branch is already taken in `graph` (ONNX names are unique model-wide, so
// only hand-built graphs do that).
size_t inlineConstantIfs(Graph& graph);

}  // namespace kiln
