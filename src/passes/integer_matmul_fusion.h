// Fusion of a MatMulInteger with the Cast and scale after it.
//
// onnxruntime's dynamic quantizer writes every quantized MatMul as
//
//   DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q, x_zero, W_zero)
//     -> Cast(to = float) -> Mul(scale)      (scale = x_scale * W_scale)
//
// and the Cast and the Mul each make a pass over the product. This pass turns
// MatMulInteger -> Cast -> Mul into one kiln.MatMulIntegerToFloat(A, B,
// a_zero, b_zero, scale[, addend]) node (ops/quantization_ops.cc; its kernel in
// kernels/cpu/quantization.cc does the same arithmetic in one pass), when:
//   - the Cast casts to f32 and the Mul's other operand is an f32 value with
//     one element or one per column of the product ([N], or [1, ..., N]),
//     the Mul's output having the product's shape;
//   - the product and the Cast's output are read only by the next node of
//     the chain and are not pinned (pass_helpers.h).
// An Add after the Mul joins the node as its sixth input when the other
// operand is an f32 bias [N] or a residual of the product's shape (and the
// Mul's output is read only by it); the chain's last node becomes the fused
// node and keeps its output.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Fuses every matching chain of `graph` (not its subgraphs); returns how many.
size_t fuseIntegerMatMuls(Graph& graph);

}  // namespace kiln
