// A one-hot encoding multiplied by a constant matrix becomes a row lookup.
//
// TensorFlow and JAX exports write an embedding as one_hot(ids) @ W:
//
//   onehot = Cast(Equal(ids [..., 1], arange(D) [1, ..., D]), float)   [..., D]
//   y      = MatMul(onehot, W [D, N])                                   [..., N]
//
// which builds a [..., D] tensor of zeros and ones and multiplies it out
// (Magika: [16, 2048, 257] for 257 byte values, 9 ms of its 69 at batch 16).
// Each row of y is the row of W that the id selects, or zeros when the id is
// outside [0, D) (no position of the one-hot is set):
//
//   y = Reshape(Gather(W', Where(0 <= ids < D, ids, D)), [..., N])
//
// with W' = W and a row of zeros appended. Exact: a product with one 1 and
// zeros elsewhere is that row (W must be finite: 0 * inf would be NaN).
//
// Applies when ids is an integer tensor of static shape whose last dimension
// is 1, the other Equal operand an integer constant holding 0, 1, ..., D - 1
// along its last axis (every other dimension 1), the Cast to f32 read only
// by the MatMul, the Equal only by the Cast, and W an f32 constant [D, N].
// The MatMul's output keeps its name.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Rewrites every such MatMul in `graph` (not its subgraphs); returns how
// many. Types must have been inferred.
size_t replaceOneHotMatMuls(Graph& graph);

}  // namespace kiln
