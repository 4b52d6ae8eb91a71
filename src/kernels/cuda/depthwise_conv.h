// Depthwise 2-D convolutions on cuda (one filter per channel: group equal
// to the channels, as in MobileNet and PP-LCNet blocks): kiln's own kernel,
// one thread per output element, with the bias and kiln.FusedConv's
// post-ops applied in the same pass. cuDNN's f32 depthwise kernels are
// several times slower at these shapes and need a second pass for any
// activation but ReLU. conv.cc tries this first for Conv and kiln.FusedConv.
#pragma once

#include <memory>
#include <string_view>

#include "kernels/kernel.h"

namespace kiln::cuda {

// The step's state when it is a depthwise convolution this kernel runs
// (NCHW f32, explicit or no pads, any kernel size, stride and dilation),
// else null (cuDNN runs it).
std::unique_ptr<KernelState> prepareDepthwiseConv(std::string_view op, const KernelSetup& setup);
bool isDepthwiseConv(const KernelState* state);
void runDepthwiseConv(const KernelCall& call);

}  // namespace kiln::cuda
