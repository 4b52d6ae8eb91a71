// 1x1 convolutions on cuda (stride 1, no pads, group 1: the expand and
// project convolutions of MobileNet-style blocks, ResNet's bottlenecks) as
// what they are, a matrix product per image: y[n] = W x[n], one strided
// batched cuBLAS GEMM (f32 without TF32, or f16 operands summed in f32), then the bias and kiln.FusedConv's
// post-ops in one elementwise pass. cuBLAS is faster than cuDNN's f32
// (FMA) algorithms at some shapes (small batches) and slower at others (where cuDNN fuses the bias, residual and ReLU): conv.cc times both
// at prepare and keeps the faster.
#pragma once

#include <memory>
#include <string_view>

#include "kernels/kernel.h"

namespace kiln::cuda {

// The step's state when it is such a convolution, else null.
std::unique_ptr<KernelState> preparePointwiseConv(std::string_view op, const KernelSetup& setup);
bool isPointwiseConv(const KernelState* state);
void runPointwiseConv(const KernelCall& call);

}  // namespace kiln::cuda
