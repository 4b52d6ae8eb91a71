// compile --quantize-activations: MatMuls over int8 weights computed in int8.
//
// Weight-only quantized models keep a MatMul's weights as int8 and expand
// them in the graph, in one of two forms:
//
//   MatMul(x, Mul(Cast(w [k, n] i8, to = float), scale))
//   MatMul(x, DequantizeLinear(w [k, n] i8, scale[, zero point 0]))
//
// scale holding one value or one per column (DequantizeLinear's axis 1),
// and the same as Gemm's B (alpha 1, A not transposed; with transB the
// weights [n, k] are transposed once here, the scale one per row of them; C,
// a constant row, becomes the bias, times beta).
// onnxruntime computes these in f32 on the expanded weights, and so does
// kiln by default (constant folding expands them once). With this pass each
// such MatMul becomes
//
//   kiln.DynamicInt8MatMul(x, w, scale [n][, bias [n]])
//
// (kernels/cpu/dynamic_int8_matmul.h): x is quantized per row in groups of
// 32 as the model runs and multiplied by w in int8, as OpenVINO does for
// such models; an Add of a constant bias ([n] or one value) right after the
// MatMul becomes the step's bias, and an activation after that (Relu, Gelu
// and its Erf form, ...; activation_match.h, all but Swish) its activation. That is about twice as fast as f32 on
// CPUs with AVX-512 VNNI, and changes results (5e-3 relative on
// all-MiniLM-L6-v2), hence opt-in.
//
// Applies where w and scale are initializers, w is 2-D with k at most 8192
// (the kernel's bound) and a DequantizeLinear's zero point, if any, is an
// all-zero initializer. The MatMul's output keeps its name. Runs on the
// main graph, before constant folding would expand the weights.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Rewrites every such MatMul and Gemm of `graph` (not its subgraphs);
// returns how many.
size_t quantizeActivations(Graph& graph);

}  // namespace kiln
