// Common-subexpression elimination.
//
// Exporters repeat work: the same Shape -> Gather chain once per layer, the
// same small constant (1.0, sqrt(2), an axes list) as a separate initializer
// per use, and constant folding turns each repeated chain into yet another
// identical initializer. This pass keeps one copy of each and points every
// reader at it; the copies become dead and the compiler drops them.
//
// Two initializers merge when they have the same dtype, shape and bytes
// (grouped by an XXH3 hash of the bytes, then compared in full).
//
// Two nodes merge when all of these hold:
//   - same domain, op type, number of outputs and inputs, and the inputs are
//     the same values in the same order (an omitted optional input matches
//     only an omitted one);
//   - the same attributes: same names and equal values, floats compared by
//     their bits (so -0.0 differs from 0.0 and a NaN equals itself) and tensor
//     attributes by dtype, shape and bytes;
//   - the domain is ai.onnx or kiln, whose operators are pure functions of
//     their inputs (a custom op may have side effects or state);
//   - the op is deterministic: RandomNormal, RandomUniform, their *Like forms,
//     Multinomial, Bernoulli and Dropout (random in training mode; in
//     inference mode an identity that gains nothing from merging) never merge;
//   - neither node has a subgraph attribute (If, Loop, Scan): comparing bodies
//     is not attempted, so such nodes never merge.
// The first node in topological order is kept and the readers of the other
// node's outputs read the kept node's instead. Pinned values keep their
// names: graph outputs (a model's output names must not change) and values
// that subgraphs read by name. When the second node defines a pinned value,
// the second node is kept instead if the first defines none; when both do,
// they are left alone. The same holds for pinned initializers.
//
// Fixpoint: initializers are merged first, then nodes in one sweep in
// topological order, so a node's inputs are already canonical when it is
// looked at and chains of duplicates collapse in one sweep. Keeping the second
// node (for a graph output) can leave an already-seen reader of the first
// unmerged, so sweeps repeat until one changes nothing.
//
// Subgraphs are not entered. Types are not needed and not changed.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

struct CseResult {
  size_t initializers = 0;  // initializers whose readers now read an equal one
  size_t nodes = 0;         // nodes whose readers now read an equal node's outputs
};

// Merges what it can, to a fixpoint. The merged-away nodes are removed; the
// merged-away initializers are left without readers (the compiler skips them).
CseResult eliminateCommonSubexpressions(Graph& graph);

}  // namespace kiln
