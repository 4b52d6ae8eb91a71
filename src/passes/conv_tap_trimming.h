// Trimming of convolution taps that only ever read padding.
//
// A 3x3 Conv over a map one row high (the sequence models of OCR
// recognizers, SVTR's neck, after the backbone has pooled the height away)
// multiplies its top and bottom kernel rows by padding at every output
// position: two thirds of its weights and work add zeros. Along each spatial
// axis, tap k of the kernel reads input position o * stride - pad + k *
// dilation for output positions o; a tap for which that position is outside
// the input for every o contributes nothing, and a run of such taps at
// either end of the kernel can go. The Conv then takes the kernel's
// remaining taps (the weights sliced) with its begin padding less the
// dropped taps' span, and an end padding that keeps the output size:
// the same positions, the same sums, exactly.
//
// PP-OCRv3's recognizer: its two 3x3 convolutions over 1x40 maps (512 and
// 1024 input channels) become 1x3 ones, 0.60 to 0.2 ms.
//
// Applies to default-domain Conv nodes with an initializer as weights, a
// static input and output shape, and explicit or VALID padding (SAME_* is
// left as it is); an axis whose trimmed padding would be negative, or whose
// every tap reads padding, keeps its kernel.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Trims every eligible Conv; returns the number changed. A weight
// initializer that other nodes read stays for them.
size_t trimPaddingTaps(Graph& graph);

}  // namespace kiln
