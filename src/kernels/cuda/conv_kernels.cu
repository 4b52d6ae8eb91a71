// The convolution kernels of conv_launch.h, one thread per output element,
// grid-stride. Depthwise: the filter taps of a channel are read through the
// read-only cache, the input window straight from memory (neighbouring
// threads read neighbouring pixels, so the loads coalesce). Tiled
// ConvTranspose: neighbouring threads share or neighbour their input pixel
// in every channel, and read the same few taps.
#include "kernels/cuda/conv_launch.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

__global__ void depthwise(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                          const float* __restrict__ residual, float* __restrict__ y, DepthwiseGeometry g,
                          DeviceProgram post, uint32_t n) {
  float slot[kMaxProgramSlots];
  loadImmediates(post, slot);
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t ox = i % static_cast<uint32_t>(g.out_w);
    const uint32_t oy = (i / static_cast<uint32_t>(g.out_w)) % static_cast<uint32_t>(g.out_h);
    const uint32_t plane = i / static_cast<uint32_t>(g.out_w * g.out_h);  // n * channels + c
    const uint32_t c = plane % static_cast<uint32_t>(g.channels);
    const float* in = x + static_cast<int64_t>(plane) * g.in_h * g.in_w;
    const float* taps = w + static_cast<int64_t>(c) * g.kernel_h * g.kernel_w;
    float sum = bias != nullptr ? __ldg(bias + c) : 0.0f;
    const int y0 = static_cast<int>(oy) * g.stride_h - g.pad_top;
    const int x0 = static_cast<int>(ox) * g.stride_w - g.pad_left;
    for (int ky = 0; ky < g.kernel_h; ++ky) {
      const int iy = y0 + ky * g.dilation_h;
      if (iy < 0 || iy >= g.in_h) continue;
      for (int kx = 0; kx < g.kernel_w; ++kx) {
        const int ix = x0 + kx * g.dilation_w;
        if (ix < 0 || ix >= g.in_w) continue;
        sum += in[iy * g.in_w + ix] * __ldg(taps + ky * g.kernel_w + kx);
      }
    }
    if (post.ops > 0) {
      slot[0] = sum;
      if (residual != nullptr) slot[1] = residual[i];
      sum = runInstructions(post, slot);
    }
    y[i] = sum;
  }
}

__global__ void tiledConvTranspose(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ bias, float* __restrict__ y, TiledGeometry g,
                                   uint32_t n) {
  const auto kh = static_cast<uint32_t>(g.kernel_h), kw = static_cast<uint32_t>(g.kernel_w);
  const auto in_w = static_cast<uint32_t>(g.in_w), out_w = in_w * kw, out_h = static_cast<uint32_t>(g.in_h) * kh;
  const auto out_channels = static_cast<uint32_t>(g.out_channels), in_channels = static_cast<uint32_t>(g.in_channels);
  const uint32_t in_plane = static_cast<uint32_t>(g.in_h) * in_w, tap_stride = out_channels * kh * kw;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t ox = i % out_w;
    const uint32_t oy = (i / out_w) % out_h;
    const uint32_t plane = i / (out_w * out_h);  // batch * out_channels + co
    const uint32_t co = plane % out_channels;
    const uint32_t b = plane / out_channels;
    const float* in = x + b * in_channels * in_plane + (oy / kh) * in_w + ox / kw;
    const float* taps = w + co * kh * kw + (oy % kh) * kw + ox % kw;
    float sum = bias != nullptr ? __ldg(bias + co) : 0.0f;
    for (uint32_t ci = 0; ci < in_channels; ++ci) sum += in[ci * in_plane] * __ldg(taps + ci * tap_stride);
    y[i] = sum;
  }
}

}  // namespace

void launchTiledConvTranspose(const float* x, const float* w, const float* bias, float* y, const TiledGeometry& g,
                              cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(g.batch * g.out_channels * g.in_h * g.kernel_h * g.in_w * g.kernel_w);
  if (n == 0) return;
  tiledConvTranspose<<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(x, w, bias, y, g, static_cast<uint32_t>(n));
}

void launchDepthwiseConv(const float* x, const float* w, const float* bias, const float* residual, float* y,
                         const DepthwiseGeometry& g, const DeviceProgram& post, cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(g.batch * g.channels * g.out_h * g.out_w);
  if (n == 0) return;
  depthwise<<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(x, w, bias, residual, y, g, post, static_cast<uint32_t>(n));
}

}  // namespace kiln::cuda
