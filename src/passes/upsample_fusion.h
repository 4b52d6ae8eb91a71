// Nearest upsampling by whole factors read by an elementwise step, fused
// into it (CPU target, channels-last).
//
// Feature pyramids (the DBNet text detectors' FPN, U-Nets) add a
// nearest-upsampled coarse map to a finer one: Resize(x) writes the 2x map
// (9.8 MB for PP-OCR's 160x160x96) and the elementwise step reads it back.
// Here a kiln.FusedElementwise input that is a kiln.NhwcResize read by
// nothing else reads the Resize's own input instead, with the factors in its
// `upsample` attribute (core/elementwise_program.h); the kernel gathers each
// block of it from the small map, in cache.
//
// A Resize qualifies when it is mode "nearest" without antialias or axes,
// its output is its 4-D input times whole factors (fh, fw) along H and W
// (its scales, when given, exactly [1, 1, fh, fw]), and its coordinate and
// rounding modes map output row y to input row y / fh (floor): asymmetric
// with floor (PyTorch's and Paddle's nearest), half_pixel or
// pytorch_half_pixel with round_prefer_floor or round_prefer_ceil (ONNX's
// defaults), tf_half_pixel_for_nearest with floor; opset 10's Resize
// (asymmetric, floor). The fused step must keep an input of the output's
// shape other than the upsampled ones, and takes at most four of them.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of Resize outputs the elementwise steps now upsample
// themselves (the Resize nodes are left unread; removeDeadNodes drops them).
size_t fuseUpsampling(Graph& graph);

}  // namespace kiln
