// ReduceMean and ReduceMax over the spatial axes of an image become the
// global pools they are.
//
// PyTorch exports x.mean((2, 3), keepdim=True) (squeeze-excite blocks,
// PP-OCRv6's detector) as ReduceMean(axes = [2, 3], keepdims = 1), which is
// GlobalAveragePool; ReduceMax likewise GlobalMaxPool. The channels-last
// pass knows the global pools (kiln.NhwcGlobal*Pool) and not the
// reductions, so each such ReduceMean sent its input back to NCHW through a
// Transpose.
//
// Applies to f32 inputs of rank 4 with a known shape, axes exactly {2, 3}
// (negative ones counted from the end; from the attribute, or from a
// constant input since opset 18) and keepdims 1 (its default).
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Rewrites every such node of `graph` (not its subgraphs) in place; returns
// how many.
size_t reductionsToGlobalPools(Graph& graph);

}  // namespace kiln
