// Type and shape inference over a whole graph.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

// "Conv (ai.onnx, opset 17)" for every node, subgraphs included, whose
// operator has no schema at the model's opset; sorted, without duplicates.
std::vector<std::string> findUnsupportedOps(const Graph& graph, const std::map<std::string, int64_t>& opsets);

struct InferenceOptions {
  // Go on past a node whose schema cannot infer its outputs (leaving them
  // unknown): for analysing graphs whose shapes are only known at run time.
  bool lenient = false;
  // When set, receives every value whose contents some schema asked for
  // but which is not a constant: the values that shapes depend on.
  std::vector<ValueId>* wanted_values = nullptr;
};

// Fills in the type of every node output, in data order, using the
// schemas. Throws GraphError: first listing every unsupported operator at
// once, else naming the first node whose inputs its schema refuses.
void inferTypes(Graph& graph, const std::map<std::string, int64_t>& opsets, const InferenceOptions& options = {});

}  // namespace kiln
