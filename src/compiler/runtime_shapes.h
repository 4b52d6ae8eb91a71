// Graphs whose shapes are known only at run time.
//
// analyzeRuntimeShapes tells whether a graph can be planned ahead of time
// and, if not, which model inputs' values its shapes depend on (the shape
// inputs: a Reshape's target, a sample rate that picks an If branch). A
// graph package is specialized per input signature (DynamicExecutor), the
// shape inputs' values being part of the signature.
//
// Some shapes depend on values the model computes: how many steps a Loop ran
// before its condition stopped it, how many boxes survived NonZero. No input
// signature fixes them. splitAtUnknownShapes cuts such a graph in two: the
// prefix (every node whose shapes are known, and that reads only what such
// nodes give) runs first, and the rest, whose inputs are the prefix's
// results, is specialized on them like a model of its own (its shape inputs
// being the small values it reads, such as the Loop's step count).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/graph.h"

namespace kiln {

struct RuntimeShapes {
  bool dynamic = false;
  std::vector<std::string> shape_inputs;
  std::string reason;  // why, in a few words, for the compile's notice
};

// Infers what can be inferred and folds what can be folded (changing
// `graph`), then answers.
RuntimeShapes analyzeRuntimeShapes(Graph& graph, const std::map<std::string, int64_t>& opsets,
                                   const CompileOptions& options);

struct StagedGraph {
  Graph prefix;  // inputs: the model's; outputs: what the rest reads
  Graph rest;    // inputs: the prefix's outputs and the model inputs it reads; outputs: the model's
};

// `graph` (inferred and folded by analyzeRuntimeShapes) cut before its first
// values of unknown shape; nullopt when it has none, or when no node can run
// before them.
std::optional<StagedGraph> splitAtUnknownShapes(const Graph& graph);

}  // namespace kiln
