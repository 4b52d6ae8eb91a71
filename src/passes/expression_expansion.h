// kiln.Expression: an elementwise formula written as text,
//
//   Expression(x, y) {expression = "x * sin(y) + 2"}
//
// expanded into the ONNX operators it stands for (Mul, Sin, Add and a
// scalar constant), which the rest of the compiler infers, broadcasts
// (numpy rules) and fuses like any others: the arithmetic of an expression
// joins one kiln.FusedElementwise step with its neighbours where the
// elementwise fusion takes those ops.
//
// The language: numbers (2, 0.5, 1e-3), the inputs by name, + - * / and ^
// (power, right-associative), unary minus, parentheses, and the functions
//   abs acos asin atan ceil cos cosh erf exp floor log neg reciprocal relu
//   round sigmoid sign sin sinh softplus sqrt tan tanh   (one argument)
//   max min pow                                           (two arguments)
// Inputs are named by the node's optional `input_names` attribute
// (strings, one per input), else by their values' names in the model.
// Constants take the first input's element type (a Cast when the type is
// known before inference, else a CastLike from default opset 15 on). A malformed
// expression is a GraphError pointing at the column:
//   node 'e' (kiln.Expression): expression "x * sin(y" column 10: expected ')'
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/graph.h"

namespace kiln {

// Expands every kiln.Expression node of `graph` and its subgraphs; returns
// how many. `opset`: the model's default-domain opset.
size_t expandExpressions(Graph& graph, int64_t opset);

}  // namespace kiln
