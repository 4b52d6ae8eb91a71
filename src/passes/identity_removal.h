// Identity nodes removed: their readers read the input instead.
//
// Paddle2ONNX's newer exports (PP-OCRv5, PP-OCRv6) put an Identity after
// nearly every operator. An Identity costs nothing at run time (the lowering
// makes it a view), but it hides each operator from the next one: a Conv's
// scale and shift no longer fold into its weights, an activation no longer
// fuses into it, and elementwise chains split into single steps (PP-OCRv5's
// recognizer: 93 lone Add and Mul steps).
//
// An Identity whose output must keep its name (a graph output, or a value a
// subgraph reads by name: pass_helpers.h's pinned values) stays.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Removes every such Identity of `graph` (not its subgraphs); returns how
// many.
size_t removeIdentities(Graph& graph);

}  // namespace kiln
