// onnxruntime's contrib operators (domain com.microsoft), rewritten on import
// into operators kiln has.
//
// Models that went through onnxruntime's transformer optimizer or its
// quantizer (what "model_optimized.onnx" files in wheels and model hubs
// are) carry fused operators of the com.microsoft domain. Each becomes the
// plain nodes it stands for, so that kiln's own fusions (attention_fusion.h,
// matmul_fusion.h, elementwise_fusion.h, integer_matmul_fusion.h) take them
// like any exported graph:
//
//   Gelu(X)                      X * 0.5 * (1 + Erf(X / sqrt 2))
//   BiasGelu(A, B)               Gelu(A + B)
//   FastGelu(X[, bias])          the tanh form of Gelu of X (+ bias)
//   QuickGelu(X) {alpha}         X * Sigmoid(alpha * X)
//   SkipLayerNormalization(X, skip, gamma[, beta][, bias]) {epsilon}
//                                s = (X + bias) + skip; LayerNormalization(s)
//                                (default domain);
//                                output 3 (the sum) is s
//   SkipSimplifiedLayerNormalization(X, skip, gamma[, bias]) {epsilon}
//                                the same with RMS normalization
//   SimplifiedLayerNormalization(X, scale) {axis, epsilon}  (the default domain,
//                                where onnxruntime defines it) kiln.RMSNormalization
//   FusedMatMul(A, B) {alpha, transA, transB}
//                                alpha * MatMul(A or A^T, B or B^T) (last two axes)
//   MatMulIntegerToFloat(A, B, a_scale, b_scale[, a_zero][, b_zero][, bias])
//                                kiln.MatMulIntegerToFloat(A, B, a_zero, b_zero,
//                                a_scale * b_scale) (+ bias)
//   DynamicQuantizeMatMul(A, B, b_scale[, b_zero][, bias])
//                                DynamicQuantizeLinear(A), then as above
//   EmbedLayerNormalization(input_ids[, segment_ids], word, position[, segment],
//       gamma, beta[, mask][, position_ids]) {epsilon}
//                                LayerNormalization of the summed Gathers
//                                (positions 0 .. S-1 without position_ids);
//                                mask_index: the count of ones per mask row
//   QEmbedLayerNormalization(...)  the same over its 8-bit tables, gamma and
//                                beta, each through DequantizeLinear
//   Attention(input, weights[, bias][, mask_index][, past][, attention_bias])
//       {num_heads, qkv_hidden_sizes, unidirectional, scale, mask_filter_value}
//                                q, k, v = input x column slices of the
//                                weights (+ the bias's slices);
//                                kiln.Attention (3-D) with the mask
//                                (1 - mask) * mask_filter_value for a raw
//                                [batch, keys] mask_index (for the lengths an
//                                EmbedLayerNormalization counted, the raw mask
//                                it counted them from; for [batch] lengths of
//                                right-padded rows, keys j < length), plus
//                                attention_bias
//   QAttention(input, weights, bias, input_scale, weight_scale[, mask_index]
//       [, input_zero][, weight_zero])
//                                the same with kiln.MatMulIntegerToFloat products
//                                (weight scales and zero points per tensor or
//                                per column)
//   QLinearAdd, QLinearMul(A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp?)
//                                Q(Add or Mul(DQ(A), DQ(B))): the QDQ group, which
//                                passes/qdq_fusion.h runs in integers again
//   QLinearGlobalAveragePool(X, x_scale, x_zp, y_scale, y_zp) {channels_last 0}
//                                Q(GlobalAveragePool(DQ(X)))
//   QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?) {alpha, transA, transB}
//                                [Q](Gemm(DQ(A), DQ(B), DQ(C, a_scale * b_scale)))
//                                (onnxruntime's QuantFormat.QOperator output)
//
// LayerNormalization, which onnxruntime defines in the default domain from
// version 1, runs as it is (ops/nn_ops.cc registers it from version 1 too). What a rewrite cannot express is refused with a GraphError naming the
// node: an Attention with past state, rotary embedding or a mask_index in
// another form (left-padding starts, 3-D); statistics outputs (mean, inverse deviation) that something reads.
// Outputs keep their names.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kiln/graph.h"

namespace kiln {

// Rewrites the com.microsoft nodes above in `graph` and its subgraphs;
// `default_opset` is the model's ai.onnx version (the rewrites use Slice and
// Reshape with shape inputs, opset 10 and 5). Returns how many were rewritten.
int expandContribOps(Graph& graph, int64_t default_opset);

}  // namespace kiln
