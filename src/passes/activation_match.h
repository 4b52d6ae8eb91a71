// Recognises the activation functions that a fused step applies as a oneDNN
// eltwise post-op (core/fused_activation.h), in the forms exporters write
// them:
//   Relu, LeakyRelu, Sigmoid, Tanh, HardSwish, Gelu (approximate none or tanh);
//   Clip whose min and max are absent or f32 scalar initializers (attributes
//     before opset 11), with min <= max;
//   Swish: Mul(x, Sigmoid(x)), operands in either order;
//   Gelu as x * 0.5 * (1 + Erf(x / sqrt 2)): Div(x, sqrt 2) or Mul(x, 1/sqrt 2),
//     Erf, Add 1, then the two products grouped in any of the three ways
//     exporters use: Mul(Mul(x, 1 + erf), 0.5), Mul(Mul(x, 0.5), 1 + erf),
//     Mul(x, Mul(1 + erf, 0.5)); any operand order throughout. Its constants
//     must be f32 initializers with one element and no more dimensions than
//     x, within 1e-6 (relative) of their value.
// Every intermediate value of a match is read only inside it and is not
// pinned (pass_helpers.h), and neither is x: the match may be fused away.
#pragma once

#include <optional>
#include <set>
#include <vector>

#include "core/fused_activation.h"
#include "kiln/graph.h"

namespace kiln {

struct ActivationMatch {
  FusedActivation kind = FusedActivation::kNone;
  float alpha = 0;  // LeakyRelu: slope; Clip: min
  float beta = 0;   // Clip: max
  std::vector<NodeId> nodes;  // producers first; the last one defines `end`
  ValueId end = kNoValue;     // the activation's result
};

// The activation computed from `x` alone, if any. `x` must have a known shape.
// With `clip` false a Clip is not matched: oneDNN's clip post-op maps NaN to
// Clip's min, where ONNX's Clip (and kiln's own kernels) pass NaN through;
// fusions into oneDNN primitives ask for Clip only when the compile allows
// that (CompileOptions::fuse_clip).
std::optional<ActivationMatch> matchActivation(const Graph& graph, const std::set<ValueId>& pinned, ValueId x,
                                               bool clip = true);

// Sets a fused node's activation attributes (core/fused_activation.h) to
// `activation`'s kind and parameters.
void setActivation(Attributes& attributes, const ActivationMatch& activation);

}  // namespace kiln
