// LayerNormalization (and RMS normalization, below) written out as its
// arithmetic, as exporters emit it for opsets before 17 (and PyTorch often
// still does), becomes one LayerNormalization node, whose kernel makes two
// passes over each row instead of nine steps over the whole tensor:
//
//   m = ReduceMean(x, axes=[last], keepdims=1)
//   d = Sub(x, m)
//   v = ReduceMean(Pow(d, 2), axes=[last], keepdims=1)     (or Mul(d, d))
//   n = Div(d, Sqrt(Add(v, epsilon)))
//   y = Add(Mul(n, gamma), beta)                            (Mul, Add optional)
//
// becomes y = LayerNormalization(x, gamma, beta) {axis: -1, epsilon}, with a
// constant of ones for a missing gamma. y keeps its name.
//
// A fusion happens only when: x is f32 with a known rank; the reductions
// reduce the last axis only (axes attribute, or constant axes input) with
// keepdims 1; epsilon is a one-element f32 constant; the exponent is a
// one-element constant 2; gamma and beta are f32 initializers of shape [C]
// (C the last dimension of x); every intermediate value is read only inside
// the pattern and is not pinned (pass_helpers.h). Any opset: ONNX's
// LayerNormalization is opset 17's, but kiln, like onnxruntime, knows it in
// the default domain from version 1 (ops/nn_ops.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of LayerNormalizations formed.
size_t fuseLayerNorms(Graph& graph);

// RMS normalization written out (T5's and LLaMA's exports):
//
//   v = ReduceMean(Pow(x, 2) or Mul(x, x), axes=[last], keepdims=1)
//   s = Sqrt(Add(v, epsilon))
//   n = Mul(x, Div(1, s)), Mul(x, Reciprocal(s)) or Div(x, s)
//   y = Mul(n, gamma)                                         (optional)
//
// becomes y = kiln.RMSNormalization(x, gamma) {axis: -1, epsilon}: ONNX
// RMSNormalization (opset 23) for models of any opset, with its kernel; ones
// for a missing gamma. Same conditions as above (x f32 with a known last
// dimension, constants of one element, gamma an f32 initializer [C], the
// intermediate values read only inside the pattern and not pinned). Returns
// the number formed.
size_t fuseRmsNorms(Graph& graph);

}  // namespace kiln
