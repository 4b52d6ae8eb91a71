// The geometry of a direct (loop) convolution over 1 to 3 spatial axes, for
// the kernels that do not go through oneDNN: ConvInteger and QLinearConv
// (quantization.cc) and DeformConv (sampling.cc).
//
// It reads the Conv attributes (kernel_shape, strides, dilations, pads,
// auto_pad, group) against static x [N, C, spatial...], w [M, C/group, k...]
// and the output [N, M, out...] that inference fixed, and checks that they
// agree. Fewer than three spatial axes are padded in front with axes of size
// 1 (kernel 1, stride 1, no padding), so one 3-D loop serves every rank.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/param_map.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct ConvGeometry {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t group = 1;
  std::array<int64_t, 3> in{};  // spatial sizes, padded in front with 1s
  std::array<int64_t, 3> out{};
  std::array<int64_t, 3> kernel{};
  std::array<int64_t, 3> strides{};
  std::array<int64_t, 3> dilations{};
  std::array<int64_t, 3> pad_begin{};

  int64_t inPlane() const { return in[0] * in[1] * in[2]; }
  int64_t outPlane() const { return out[0] * out[1] * out[2]; }
  int64_t kernelSize() const { return kernel[0] * kernel[1] * kernel[2]; }
};

// Throws UsageError naming `op` on anything inconsistent or unsupported
// (more than 3 spatial axes).
ConvGeometry convGeometry(std::string_view op, const ParamMap& params, const TensorInfo& x, const TensorInfo& w,
                          const TensorInfo& y);

}  // namespace kiln
