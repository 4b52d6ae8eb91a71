// Reverse-mode automatic differentiation over kiln's graph IR: the first
// half of training (issue 15). appendGradients adds to a graph the nodes
// that compute the gradient of a scalar loss with respect to chosen values
// (weights, inputs), as ordinary ONNX operators, so that the compiler
// infers, fuses and plans the backward pass like the forward one.
//
// Each operator's rule (gradient_rules.cc) builds its inputs' gradients
// from its outputs' gradients; gradients reaching a value along several
// paths are summed; broadcasting is undone by summing over the broadcast
// axes. Types must be known and static (inferTypes first).
//
// Thread safety: changes `graph`; none.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

// Adds the gradient of `loss` (one element) with respect to each of `wrt`
// and returns their values, in order (a value the loss does not depend on
// gets zeros). `opsets`: the graph's; its default domain at 13 or later
// (the rules use ReduceSum with axes as an input). Throws GraphError naming
// the node when an operator on the way has no rule, UsageError when the
// loss is not a single element or the opset is below 13.
// `has_gradient`, when given, tells for each of `wrt` whether the loss
// depends on it along a differentiable path (false: it got zeros).
std::vector<ValueId> appendGradients(Graph& graph, ValueId loss, std::span<const ValueId> wrt,
                                     const std::map<std::string, int64_t>& opsets,
                                     std::vector<bool>* has_gradient = nullptr);

// Of `candidates`, the names of those the loss `loss` has a gradient for:
// not, say, a Dropout's ratio or a Pow's exponent. Differentiates a copy;
// `graph` is unchanged.
std::vector<std::string> namesWithGradients(const Graph& graph, const std::string& loss,
                                            const std::vector<std::string>& candidates,
                                            const std::map<std::string, int64_t>& opsets);

// The operators appendGradients has a rule for, sorted (docs/training.md).
std::vector<std::string> differentiableOps();

}  // namespace kiln
