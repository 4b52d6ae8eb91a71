// Channels-last layout: convolutions and pooling run on [N, H, W, C]
// tensors, where oneDNN's fast kernels are (a 3x3 convolution in NHWC runs
// about twice as fast as in NCHW on AVX-512; depthwise ones about 20 times).
//
// The pass turns every eligible 2-D Conv, ConvTranspose, MaxPool, AveragePool,
// GlobalAveragePool, GlobalMaxPool, Resize (of H and W) and QLinearConv into its kiln-domain channels-last
// form (kiln.NhwcConv, ...; see src/ops/nn_ops.cc), and lets the layout flow
// through the layout-agnostic operators between them so that a chain of
// convolutions converts its activations once, not at every step:
//   - elementwise operators (unary ones, and binary ones whose other inputs
//     are channels-last too, converted to it for another reader already,
//     scalars, or constants, which are stored permuted) run unchanged on
//     channels-last data;
//   - Concat and Split run with their axis renumbered.
// Any other reader of a channels-last value, and the graph's outputs, get it
// back in NCHW through one Transpose per value, which keeps the value's
// original name (so model output names do not change); the channels-last
// value is renamed "<name>/nhwc". A value read by a subgraph (If, Loop, Scan
// bodies) also keeps an NCHW copy under its name.
//
// Eligibility: the operator is in the default domain; its data input is f32
// with a known rank of 4 (MaxPool: also u8 or i8); MaxPool has no Indices
// output; AveragePool does not both count padding and use ceil_mode (the
// kernel for that case is NCHW only); Resize has the opset-11 inputs and keeps
// N and C; a QLinearConv is 2-D over u8 or i8 activations with constant
// parameters, i8 weights with zero points 0 and one activation scale and zero
// point each (kernels/cpu/quantized_conv.cc); a layout-agnostic operator has
// at least one channels-last input and only 4-D outputs (QuantizeLinear,
// DequantizeLinear and kiln.QLinearAdd count as elementwise with one scale
// and zero point each). The types of every rewritten value are updated;
// shape inference gives the same types again.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Rewrites `graph` (top level only); returns the number of convolutions and
// pooling operators now channels-last.
size_t convertToChannelsLast(Graph& graph);

}  // namespace kiln
