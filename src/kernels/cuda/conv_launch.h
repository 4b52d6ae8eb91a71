// The device side of depthwise_conv.cc and tiled_conv_transpose.cc: geometry
// and launches (plain types, shared by the host code and conv_kernels.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

struct DepthwiseGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int pad_top = 0, pad_left = 0;
};

// y = post(conv(x, w) + bias, residual): `post` is a program over inputs 0
// (the convolution plus bias) and 1 (the residual, same shape as y); with
// post.ops == 0 nothing is applied. bias and residual may be null.
void launchDepthwiseConv(const float* x, const float* w, const float* bias, const float* residual, float* y,
                         const DepthwiseGeometry& geometry, const DeviceProgram& post, cudaStream_t stream);

// y[n, co, iy * kh + ky, ix * kw + kx] = bias[co] +
//   sum over ci of x[n, ci, iy, ix] * w[ci, co, ky, kx]   (bias may be null)
struct TiledGeometry {
  int64_t batch = 0, in_channels = 0, out_channels = 0, in_h = 0, in_w = 0, kernel_h = 1, kernel_w = 1;
};
void launchTiledConvTranspose(const float* x, const float* w, const float* bias, float* y, const TiledGeometry& geometry,
                              cudaStream_t stream);

}  // namespace kiln::cuda
