// Constant folding of shape arithmetic.
//
// Exporters compute shapes at run time: Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape chains, Range over a Shape, ConstantOfShape. Once input
// shapes are fixed, all of it is constant. This pass evaluates such nodes
// when every input is a constant (an initializer) or, for Shape and Size, has
// a static shape, and replaces their outputs with initializers, so that type
// inference sees concrete shapes and the dead nodes disappear.
//
// The pass itself evaluates small integer tensors (at most
// kMaxFoldedElements), in int64, with ONNX semantics. Any other node whose
// inputs are all constants and whose outputs are static, and either small or
// at most 4 times its constant inputs' bytes, goes to `evaluate` when one is
// given: the compiler passes one that runs the CPU kernel once (function
// bodies compute shapes with Cast, Sub, Div, ...; exporters slice, concatenate
// and transpose weights).
// Random operators are never folded.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

inline constexpr size_t kMaxFoldedElements = 4096;

// Computes a node's outputs from its constant inputs (nullptr for an
// omitted one), or nullopt when it cannot.
using ConstantEvaluator = std::function<std::optional<std::vector<ConstantPtr>>(
    const Node& node, const std::vector<ConstantPtr>& inputs, const std::vector<TensorInfo>& outputs)>;

// Folds what it can, repeatedly; returns the number of nodes folded. Types
// must have been inferred (Shape needs its input's shape).
size_t foldConstants(Graph& graph, const ConstantEvaluator& evaluate = {});

}  // namespace kiln
