// Recognises the activation functions that oneDNN can apply as an eltwise
// post-op of a convolution or matrix product, in the forms exporters write
// them: single operators (Relu, LeakyRelu, Clip with constant bounds,
// Sigmoid, Tanh, HardSigmoid, HardSwish, Elu, Gelu) and SiLU written as
// x * Sigmoid(x).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

struct ActivationMatch {
  // The post-op: "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh",
  // "HardSigmoid", "HardSwish", "Elu", "Gelu", "GeluTanh" or "Swish";
  // `alpha` and `beta` as oneDNN's eltwise takes them (Clip: bounds).
  std::string kind;
  float alpha = 0;
  float beta = 0;
  ValueId output = kNoValue;   // the activation's result
  std::vector<NodeId> nodes;   // the nodes it spans, to remove once fused
};

// The activation applied to `value`, when every node of it reads only
// `value` and constants, and `value` has no reader outside the match and is
// not a graph output; nullopt otherwise.
std::optional<ActivationMatch> matchActivation(const Graph& graph, ValueId value);

}  // namespace kiln
