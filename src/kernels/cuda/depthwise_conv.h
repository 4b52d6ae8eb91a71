// Depthwise 2-D convolutions on cuda (one filter per channel: group equal
// to the channels, as in MobileNet and PP-LCNet blocks): kiln's own kernel,
// one thread per output element, with the bias and kiln.FusedConv's
// post-ops applied in the same pass. cuDNN's f32 depthwise kernels are
// several times slower at these shapes and need a second pass for any
// activation but ReLU. conv.cc tries this first for Conv and kiln.FusedConv.
//
// prepare has the runtime compiler (runtime_compiler.h) build the kernel
// for the step's geometry, the window loops unrolled and every size a
// constant, the post-ops as straight-line code; where it cannot, the
// built-in kernel (conv_launch.h) computes the same thing more slowly.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/cuda/conv_launch.h"
#include "kernels/kernel.h"

namespace kiln::cuda {

// The source of the specialized kernel: extern "C" kiln_depthwise taking
// DepthwiseArgs below, one thread per output element in blocks of 256.
// `post` over the convolution plus bias (input 0) and the residual (input
// 1); post.ops == 0 for none. Every tensor is stored as `storage` (f16 or
// bf16 with `kiln compile --fp16` / `--bf16`; the arithmetic f32). nullopt when x or y has 2^31 elements or more.
struct DepthwiseArgs {
  const float* x = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  const float* residual = nullptr;
  float* y = nullptr;
};
std::optional<std::string> depthwiseSource(const DepthwiseGeometry& geometry, const DeviceProgram& post, bool has_bias,
                                           bool has_residual, FloatStorage storage = FloatStorage::kF32);

// The step's state when it is a depthwise convolution this kernel runs
// (NCHW f32, or f16 where the runtime compiler builds the kernel; explicit
// or no pads, any kernel size, stride and dilation), else null (cuDNN runs
// it).
std::unique_ptr<KernelState> prepareDepthwiseConv(std::string_view op, const KernelSetup& setup);
bool isDepthwiseConv(const KernelState* state);
void runDepthwiseConv(const KernelCall& call);

}  // namespace kiln::cuda
