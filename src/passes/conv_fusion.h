// Fuses into each kiln.NhwcConv the elementwise work that follows it, so
// that oneDNN applies it to each output block while it is still in
// registers (post-ops) instead of in another pass over memory:
//   - activations (see activation_match.h): Relu, Clip, SiLU, Gelu, ...;
//   - one Add of another tensor with the output's exact type, a residual
//     connection, read through oneDNN's binary post-op.
// In the order the graph applies them (ResNet adds, then applies Relu; YOLO
// applies SiLU, then adds), up to kMaxPostOps. The fused Conv records them in
// the attribute `post_ops`, a comma-separated list of kinds: "Add" or an
// activation's name in core/fused_activation.h ("Add,Relu"), with
// `post_op_alpha` and `post_op_beta` (floats, one per post-op; see
// ActivationMatch), and reads the residual as its input 3. The final value of
// the chain keeps its name and becomes the Conv's output.
//
// Each fused intermediate value must have no other reader and must not be
// pinned (pass_helpers.h); the residual has the Conv output's exact static
// type. Channels-last convolutions are fused; with `nchw` (the cuda target),
// plain ONNX Convs too, which become kiln.FusedConv (NCHW): the kiln domain
// is where extra attributes are ours to define. A kiln.NhwcConvTranspose
// takes the same post-ops and folds when its patches do not overlap (kernel
// equal to its strides, no pads: the CPU kernel then runs it as a matmul,
// kernels/cpu/patch_conv_transpose.h); other ConvTransposes take none (oneDNN
// 2.6 runs a deconvolution with post-ops on its reference kernel).
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

inline constexpr size_t kMaxPostOps = 4;

// Returns the number of post-ops fused. `fuse_clip`: whether a Clip may
// become a post-op (activation_match.h: oneDNN's clip maps NaN to Clip's min).
size_t fuseConvPostOps(Graph& graph, bool nchw = false, bool fuse_clip = true);

// Fuses into a kiln.NhwcQLinearConv the kiln.QLinearAdd that alone reads its
// output (an int8 ResNet's residual connection): the Conv takes the Add's
// output scale and zero point as its own (inputs 6 and 7) and reads the other
// operand with its scale and zero point as inputs 9 to 11, which oneDNN adds
// through its sum post-op before rounding. The Conv's own quantization
// leaves its saturation, kept as a clip to the range it saturated to
// (attribute `residual_clip`, [low, high] in real units: a ReLU where its
// zero point was the lowest value), and its rounding, which the fused form
// skips: within a step of the unfused result, closer to the float one.
// Parameters must be constants. Returns the number fused.
size_t fuseQuantizedResidualAdds(Graph& graph);

}  // namespace kiln
