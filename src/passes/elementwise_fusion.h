// Fusion of connected f32 elementwise nodes into one kiln.FusedElementwise
// node, whose kernel computes the whole group in one pass over memory
// (core/elementwise_program.h; kernels/cpu/fused_elementwise.cc).
//
// Unfused, every node of a chain such as x * sigmoid(x) + b is a step that
// reads its operands from memory and writes its whole result back. Fused, the
// group is one step, and the intermediate results stay in cache.
//
// Candidates: nodes of the default domain with one output, f32 with a static
// shape, whose operands are f32 with static shapes:
//   Relu, LeakyRelu, Elu, Sigmoid, HardSigmoid, HardSwish, Softplus, Tanh,
//   Exp, Log, Sqrt, Erf, Abs, Neg, Reciprocal, Floor, Ceil;
//   Gelu with approximate "none" or "tanh";
//   Clip whose min and max are absent or one-element f32 initializers
//     (attributes before opset 11);
//   Add, Sub, Mul, Div, and Max and Min of exactly two inputs;
//   Pow whose exponent is a one-element f32 initializer equal to 2, 3 (two
//     instructions: Square, then a Mul by x) or 0.5.
//
// Groups grow backwards from a sink, so that each has exactly one output:
// the nodes are visited consumers first, and a candidate that is in no group
// yet starts one (it is its sink). A candidate producing a value that the
// group reads joins it when
//   - its output has the same shape as the sink's output (the group's shape),
//   - every reader of its output is in the group, and
//   - its output is not pinned (a graph output or read by a subgraph, see
//     pass_helpers.h).
// So only the sink's output is read outside the group. This cannot make a
// cycle: every member's output reaches the sink, so a path leaving the group
// and coming back in would have been a cycle through the sink before.
//
// A group of two nodes or more becomes one node: the sink turns into
// kiln.FusedElementwise (keeping its output value, name and type, and its
// node name), and the others go. Its inputs are the values the group reads
// from outside, each once, in the order the program first reads them; a
// one-element f32 initializer operand becomes an immediate of the program
// instead (and Pow's exponent and Clip's bounds become parts of the op). Each
// input has the group's shape or broadcasts to it. A group is left as it is
// when its inputs would not give the output's rank by broadcasting (an
// immediate gave it: the fused node's shape must follow from its inputs) or
// when its program would need more than kMaxProgramRegisters registers.
//
// Quantized I/O (ElementwiseFusionLimits::quantized_io, the CPU target): a
// QDQ model surrounds its float elementwise work with DequantizeLinear and
// QuantizeLinear. A group input that a per-tensor DequantizeLinear of 8-bit
// data makes is read as that data, dequantized by the program as it loads
// (core/elementwise_program.h, `dequantize`; at most kMaxDequantizedInputs
// of them), and a group output read only by a per-tensor QuantizeLinear is
// written quantized (`quantize`), that node joining the group. A group of
// one node is fused too when it reads or writes 8-bit data so: one pass over
// bytes instead of three steps. The same arithmetic as the nodes it
// replaces, element for element.
//
// Run it after the fusions into Conv and MatMul, which must get first pick
// of the activations.
#pragma once

#include <cstdint>

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// What a kernel for the fused node can take (the cuda kernel passes its
// program as launch parameters of fixed size); a group grows only while it
// stays within them. The CPU kernel has no such limits.
struct ElementwiseFusionLimits {
  size_t max_inputs = SIZE_MAX;
  size_t max_ops = SIZE_MAX;
  size_t max_immediates = SIZE_MAX;
  // The CPU kernel reads 8-bit inputs and writes 8-bit outputs (quantized
  // I/O, below); the cuda one does not.
  bool quantized_io = false;
};

// Fuses every eligible group; returns the number of fused nodes made.
size_t fuseElementwise(Graph& graph, const ElementwiseFusionLimits& limits = {});

}  // namespace kiln
