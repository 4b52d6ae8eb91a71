// Fusion of scaled dot-product attention into one node.
//
// Exporters write the attention of a transformer layer as a chain of small
// steps: split the heads out of the projections (Reshape + Transpose), a
// batched MatMul for the scores, a scale, an added mask, a Softmax, a second
// MatMul, and merge the heads back (Transpose + Reshape). Run one by one,
// the transposes copy every head twice, the [batch, heads, queries, keys]
// scores go through memory three times, and each step wakes the thread
// pool. This pass turns the chain into one kiln.Attention node
// (ops/transformer_ops.cc), which has ONNX Attention's semantics (opset 23)
// and its kernel (kernels/cpu/transformer.cc): scores per block of queries in
// cache, the heads read in place.
//
// The chain, every value f32 with a static shape:
//
//   S = MatMul(Q4, Kt4)                 Q4 [B, H, S, D], Kt4 [B, H, D, T]
//   S = Div(S, c) | Mul(S, c)           optional; c a scalar f32 initializer
//   S = Add(S, M)                       optional; M broadcasts to S's shape
//                                       (rank <= 4, last dimension T)
//   S = Cast(S, to = float)             optional (T5's export has one)
//   P = Softmax(S) over the last axis
//   P = Where(IsNaN(P), 0, P)           optional (PyTorch's SDPA export)
//   Y4 = MatMul(P, V4)                  V4 [B, H, T, Dv]
//
// where Q4 and Kt4 may each be Mul(x, c) too (the SDPA export scales q and
// k by the root of the scale): the scales multiply into the node's `scale`.
//
// The node is 3-D (Q, K, V, Y [batch, sequence, heads * size]) when the
// heads are split from and merged back into such tensors the way exporters
// do it:
//   Q4  = Transpose(Reshape(q, [B, S, H, D]), perm = [0, 2, 1, 3]), V4 alike
//   Kt4 = Transpose(Reshape(k, [B, T, H, D]), perm = [0, 2, 3, 1]),
//      or Transpose(K4, perm = [0, 1, 3, 2]) with K4 split like Q4,
//      or Reshape(Transpose(k, perm = [0, 2, 1]), [B, H, D, T])
//   Y   = Reshape(Transpose(Y4, perm = [0, 2, 1, 3]), [B, S, H * Dv])
// and 4-D (Q4, K4, V4 -> Y4) otherwise, with K4 the input of Kt4's
// Transpose [0, 1, 3, 2] or, when Kt4 has none, a new such Transpose of Kt4.
//
// Every intermediate value must be read only by the chain and not be pinned
// (pass_helpers.h); the last node (Y's Reshape, or the second MatMul) becomes
// the fused node and keeps its output. Reshapes and Transposes that the fused
// node no longer reads are left for dead-node removal.
//
// Numerics: the scale is applied to q.k rather than to q and k apart, and the
// softmax sums in another order: within a few ulps of the chain. A row whose
// keys are all masked gives zeros, as the Where of the SDPA export makes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/graph.h"

namespace kiln {

// Fuses every matching chain of `graph` (not its subgraphs); returns how
// many. `default_opset` decides Softmax's default axis (1 before opset 13).
size_t fuseAttention(Graph& graph, int64_t default_opset);

}  // namespace kiln
