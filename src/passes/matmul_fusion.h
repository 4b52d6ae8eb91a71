// Fusion of MatMul and Gemm with the bias, residual and activation after them.
//
// A linear layer is exported as a MatMul (or Gemm) followed by an Add of a
// bias, often an Add of the block's input (a residual) and an activation,
// each of which would be its own step reading and writing the whole output.
// oneDNN's matmul applies a bias and post-ops while the product is still in
// cache, so this pass turns each such chain into one node of the kiln domain
// (ops/nn_ops.cc; kernels/cpu/matmul.cc):
//
//   MatMul(A, B) -> Add bias? -> Add residual? -> activation?
//       becomes FusedMatMul(A, B, bias, residual) {activation}   (one of the three at least)
//   Gemm(A, B, C) -> activation
//       becomes FusedGemm(A, B, C) {Gemm's attributes, activation}
//
// bias      an f32 initializer [N] or [1, ..., N], N the output's last
//           dimension, with no more dimensions than the output; either
//           operand of the Add.
// residual  any other f32 value with exactly the output's (static) shape;
//           either operand of the Add.
// activation (core/fused_activation.h), as one node or as the subgraph an
//           exporter writes:
//   Relu, LeakyRelu, Sigmoid, Tanh, HardSwish, Gelu (approximate none or tanh);
//   Clip whose min and max are absent or f32 scalar initializers (attributes
//     before opset 11), with min <= max;
//   Swish: Mul(x, Sigmoid(x)), operands in either order;
//   Gelu as x * 0.5 * (1 + Erf(x / sqrt 2)): Div(x, sqrt 2) or Mul(x, 1/sqrt 2),
//     Erf, Add 1, then the two products grouped in any of the three ways
//     exporters use: Mul(Mul(x, 1 + erf), 0.5), Mul(Mul(x, 0.5), 1 + erf),
//     Mul(x, Mul(1 + erf, 0.5)); any operand order throughout.
//   The constants (sqrt 2, 1, 0.5, ...) must be f32 initializers with one
//   element and no more dimensions than the output, within 1e-6 (relative)
//   of their value.
//
// A chain is fused only when all of these hold:
//   - its nodes are in the default domain and every value in it is f32 with a
//     static shape;
//   - MatMul: A and B have rank 2 or more; no input has a zero-sized
//     dimension and the output has at most 12 dimensions (the fused kernel
//     runs only on oneDNN, which takes neither zero sizes nor more than 12
//     dimensions);
//   - every intermediate value (all but the chain's last output) is read only
//     by nodes of the chain and is not pinned (a graph output or read by a
//     subgraph, see pass_helpers.h).
// The chain's last node becomes the fused node: its output keeps its name and
// type (so a graph output stays one), the node takes the MatMul's or Gemm's
// name, and the chain's other nodes are removed. Types stay valid; no
// initializer is added.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Fuses every eligible chain; returns the number of fused nodes made.
// `fuse_clip`: whether a Clip may be fused (activation_match.h: oneDNN's clip
// post-op maps NaN to Clip's min).
size_t fuseMatMuls(Graph& graph, bool fuse_clip = true);

}  // namespace kiln
