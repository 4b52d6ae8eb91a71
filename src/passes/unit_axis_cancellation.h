// Squeeze ... Unsqueeze pairs of the same unit axes around elementwise work
// cancel: the work runs on the unsqueezed tensor instead.
//
// tf2onnx exports a Keras Conv1D as a 2-D Conv over [N, C, 1, W] between an
// Unsqueeze and a Squeeze of axis 2, and the bias Add and activation between
// two such Convs run on the squeezed [N, C, W]:
//
//   Conv -> Squeeze(2) -> Add(bias [1, C, 1]) -> Relu -> Unsqueeze(2) -> Conv
//
// Rank changes stop the channels-last pass (channels_last.h) at every Conv:
// each gets a Transpose back to NCHW and one forward again. Rewritten as
//
//   Conv -> Add(bias [1, C, 1, 1]) -> Relu -> Conv
//
// the Convs meet, and the Add and Relu become the Conv's bias and post-op.
//
// The chain between the two may hold unary elementwise ops (those the
// elementwise fusion knows, Cast, Clip with constant bounds) and binary ones
// (Add, Sub, Mul, Div, Max, Min, Pow, PRelu) whose other operand is a
// constant and whose output has the shape of their chain input; the constant
// gets the unit axes inserted where the broadcast puts them. Every value of
// the chain has one reader and is not pinned (pass_helpers.h). The Squeeze
// stays for its other readers, or is left for dead-node removal; the
// Unsqueeze's output name passes to the chain's last value.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Cancels every such pair in `graph` (not its subgraphs); returns how many.
// Types must have been inferred.
size_t cancelUnitAxisPairs(Graph& graph);

}  // namespace kiln
