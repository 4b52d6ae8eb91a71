// Constant folding of shape arithmetic.
//
// Exporters compute shapes at run time: Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape chains, Range over a Shape, ConstantOfShape. Once input
// shapes are fixed, all of it is constant. This pass evaluates such nodes
// when every input is a constant (an initializer) or, for Shape and Size, has
// a static shape, and replaces their outputs with initializers, so that type
// inference sees concrete shapes and the dead nodes disappear.
//
// Only small integer tensors are evaluated (at most kMaxFoldedElements), in
// int64, with ONNX semantics; anything else is left for the kernels.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

inline constexpr size_t kMaxFoldedElements = 4096;

// Folds what it can, repeatedly; returns the number of nodes folded. Types
// must have been inferred (Shape needs its input's shape).
size_t foldConstants(Graph& graph);

}  // namespace kiln
