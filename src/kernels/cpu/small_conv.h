// Convolutions with few output positions, without oneDNN.
//
// A Conv whose output has a handful of positions per call (the 1-D front end
// of a voice-activity model: 258 channels over 3 positions; the 1x1 maps of a
// squeeze-excite block) is a small matrix product, [positions, C k...] x
// [C k..., M]. oneDNN's convolution spends more on the call than on that
// product (10-30 us for silero VAD's convolutions, whose arithmetic takes a
// few). Here the positions' input patches are gathered (im2col) and
// multiplied by the weights transposed into panels once at prepare
// (panel_matrix.h), with the vector kernel the recurrent layers use
// (vector_kernels.h, matmulAccumulate); then the bias and the fused post-ops
// (conv_fusion.h), with the same vector loops as the elementwise kernels.
//
// Taken for f32, group 1 and constant weights when the output has at most
// kSmallConvPositions positions (batch included) and every post-op is one
// this path has; conv.cc keeps its oneDNN primitive for the rest and as the
// fallback. Activations are NCHW (Conv) or NHWC (kiln.NhwcConv).
//
// Scratch (the patches and the result rows) belongs to the state: a call
// claims it with an atomic flag, and a second concurrent call on the same
// state finds it taken and runs the oneDNN primitive instead (runSmallConv
// returns false). Nothing allocates per call.
#pragma once

#include <memory>

#include "kernels/kernel.h"

namespace kiln {

inline constexpr int64_t kSmallConvPositions = 8;

struct SmallConv;  // defined in small_conv.cc
struct SmallConvDeleter {
  void operator()(SmallConv* conv) const;
};
using SmallConvPtr = std::unique_ptr<SmallConv, SmallConvDeleter>;

// The small path of this Conv (setup described in NCHW, as NchwSetup gives
// kiln.NhwcConv's), or nullptr when it does not apply.
SmallConvPtr prepareSmallConv(const KernelSetup& nchw_setup, bool channels_last);

// Runs the call; false, having done nothing, when another call holds the
// scratch.
bool runSmallConv(const SmallConv& conv, const KernelCall& call);

}  // namespace kiln
