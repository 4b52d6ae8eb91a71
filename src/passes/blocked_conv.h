// Winograd for 3x3 convolutions: oneDNN computes a 3x3, stride-1 Conv with
// Winograd's algorithm (about half the multiplies; 1.9x to 3x faster than
// its direct NHWC kernel at ResNet's shapes on AVX-512, measured) but only on
// its nChw16c layout. This pass, run after the channels-last pass and Conv
// fusion, moves each eligible kiln.NhwcConv to that layout:
//
//   x [N, H, W, C] -> Reshape [N, H, W, C/16, 16] -> Transpose [N, C/16, H, W, 16]
//     -> kiln.Blocked16Conv (same attributes and post-ops)
//     -> Transpose [N, H', W', M/16, 16] -> Reshape [N, H', W', M]  (the original name)
//
// (the Reshapes are views; the Transposes are the layout conversions). Two
// blocked convolutions in a row pass the blocked tensor directly. The kernel
// falls back to oneDNN's direct blocked convolution where it has no
// Winograd kernel for the shape (slower than NHWC brgconv: the eligibility
// below keeps to the cases oneDNN 2.6 runs by Winograd).
//
// Eligible: a kiln.NhwcConv with constant f32 weights [M, C, 3, 3], C and M
// multiples of 16 and at least 64, group 1, strides and dilations 1, explicit pads of at most
// 1 (or auto_pad SAME_*), a static input shape, and no post-op but a Relu
// (YOLO's SiLU, a residual Add: no Winograd kernel takes them).
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of convolutions moved to the blocked layout.
size_t useBlockedConvs(Graph& graph);

}  // namespace kiln
