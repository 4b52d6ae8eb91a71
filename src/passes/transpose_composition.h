// Consecutive Transposes composed into one.
//
// Transpose(Transpose(x, p1), p2) moves each element twice; it is
// Transpose(x, q) with q[i] = p1[p2[i]], one move, and no move at all when
// q is the identity (or moves only axes of size 1: the lowering makes such a
// Transpose a view, compiler.cc). Pairs like this appear where the
// channels-last pass meets a model's own layout changes: Magika's Conv over
// [1, 256, 512, 1] is the model's Transpose of [1, 512, 256, 1] followed by
// the pass's Transpose to [1, 512, 1, 256], together a view.
//
// The outer Transpose is rewritten in place to read x with the composed
// perm (its output keeps its name and type); the inner one stays for its
// other readers, or is left for dead-node removal. An identity composition
// becomes an Identity, which the lowering makes a view. Only Transposes of
// the default domain with a known rank are touched.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Composes every Transpose of a Transpose in `graph` (not its subgraphs);
// returns how many were rewritten.
size_t composeTransposes(Graph& graph);

}  // namespace kiln
