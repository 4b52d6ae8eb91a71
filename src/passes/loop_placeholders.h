// Loop-carried placeholders given their real shape.
//
// PaddlePaddle's exporter (and others) carry through a Loop values that the
// body overwrites without reading: a scalar placeholder goes in, and every
// iteration gives back a full tensor (SLANet's decoder carries its [1, 501,
// 50] output buffers that way, starting from a 0-d constant). kiln plans a
// Loop's carried values with one shape for all iterations, so such a value
// would have no static shape. When the body never reads the value and the
// Loop surely runs at least once (a constant trip count of at least 1, or
// none; a constant true condition, or none), what goes in is never seen:
// this pass replaces it with zeros of the shape the body gives, and the
// Loop's output is the same on every run.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of carried values replaced (Loops of `graph`, not of
// its subgraphs). Types must have been inferred.
size_t fillLoopPlaceholders(Graph& graph);

}  // namespace kiln
