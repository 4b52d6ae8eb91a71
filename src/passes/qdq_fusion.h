// QDQ fusion: a quantized model in QDQ form computed in integers.
//
// onnxruntime's quantizer (quantize_static, QuantFormat.QDQ, its default)
// and most exporters write a quantized operator as the float operator between
// DequantizeLinear nodes on its inputs and a QuantizeLinear on its output:
//
//   x_q -> DequantizeLinear -> Conv -> QuantizeLinear -> y_q
//   w_q -> DequantizeLinear ---^
//
// Run as written, that is slower than the float model (every activation is
// dequantized, convolved in f32 and quantized again). onnxruntime's QDQ
// transformer turns each such group into its integer operator, and so does
// this pass:
//
//   Q(Conv(DQ(x), DQ(w), bias))      -> QLinearConv(x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, B)
//   Q(Relu(Conv(...))), Q(Clip(...)) -> the same, when the activation changes nothing the quantization would
//                                       not: Q(low) and Q(high) of its bounds are the type's lowest and highest
//                                       values (a Relu: y_zero is the lowest; ReLU6 calibrated on [0, 6])
//   Q(MatMul(DQ(a), DQ(w)))          -> QLinearMatMul(a, a_scale, a_zero, w, w_scale, w_zero, y_scale, y_zero)
//   Q(Add(DQ(a), DQ(b)))             -> kiln.QLinearAdd(a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero)
//                                       (a Relu or Clip before the Q too, on the same condition as a Conv's)
//   Q(op(DQ(x)))                     -> op(x), when Q and DQ have the same scale and zero point, for the
//                                       operators that pick or move elements: MaxPool, Concat (every
//                                       input), Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice,
//                                       Gather, DepthToSpace, SpaceToDepth
//
// QLinearConv then runs on oneDNN's int8 convolution once the channels-last
// pass has made it kiln.NhwcQLinearConv (kernels/cpu/quantized_conv.cc);
// QLinearMatMul with constant i8 weights on oneDNN's int8 matmul
// (kernels/cpu/int8_matmul.h).
//
// Conditions: the activations' DequantizeLinear and the QuantizeLinear are per
// tensor (one scale, one zero point, or none: 0) over u8 or i8; the weights
// are an i8 or u8 initializer with an initializer scale (one, or one per
// output channel: axis 0 of a Conv's, axis 1 of a MatMul's [K, N]) and zero
// point; the bias, when there is one, is
// an f32 initializer or the DequantizeLinear of an i32 initializer (zero
// point 0), and becomes i32 at the scale x_scale * w_scale (QLinearConv's),
// exactly when its scale is that already (onnxruntime's quantizer makes it
// so), otherwise rounded to the nearest step. Add's operands and its result
// have one 8-bit type and one shape (no broadcasting). Every float value
// that disappears is read only inside its group and is not a graph output.
// Runs on the main graph, before constant folding would expand the weights.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Rewrites every matching group of `graph` (not its subgraphs); returns how
// many. Leaves the groups' DequantizeLinear nodes for dead-node removal.
size_t fuseQdq(Graph& graph);

}  // namespace kiln
