#include "kernels/cpu/small_conv.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/fused_activation.h"
#include "core/fused_post_ops.h"
#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/panel_matrix.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kiln/error.h"

namespace kiln {

namespace {

// The post-ops of `post_ops` (conv_fusion.h), or nullopt when one is not
// known here (an activation without a vector loop).
std::optional<std::vector<PostOp>> parsePostOps(const ParamMap& params) {
  std::vector<PostOp> ops;
  try {
    ops = readPostOps("Conv", params);
  } catch (const UsageError&) {
    return std::nullopt;
  }
  for (const PostOp& op : ops) {
    if (!op.add && op.activation != FusedActivation::kSwish && !vec::unaryForActivation(op.activation)) return std::nullopt;
  }
  return ops;
}

}  // namespace

struct SmallConv {
  ConvGeometry g;
  bool channels_last = false;
  int64_t positions = 0;  // output positions, batch included
  int64_t patch = 0;      // in_channels * kernel size: one position's inputs
  bool has_bias = false;
  std::vector<PostOp> post_ops;
  std::vector<float> weights_t;  // [patch, out_channels] in panels (panel_matrix.h)

  // Scratch, claimed per call through `busy` (see the header).
  mutable std::atomic<bool> busy{false};
  mutable std::vector<float> patches;  // [positions, patch]
  mutable std::vector<float> rows;     // [positions, out_channels]: the result, position-major
  mutable std::vector<float> temp;     // [out_channels]: Swish's sigmoid
  mutable std::vector<int64_t> offsets;  // [kernel size]: gatherPatches' taps
};

void SmallConvDeleter::operator()(SmallConv* conv) const { delete conv; }

SmallConvPtr prepareSmallConv(const KernelSetup& setup, bool channels_last) {
  if (setup.inputs.size() < 2 || setup.outputs.size() != 1 || setup.constants.size() < 2 ||
      setup.constants[1] == nullptr) {
    return nullptr;
  }
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];
  const TensorInfo& y = setup.outputs[0];
  if (x.dtype != DType::kF32 || w.dtype != DType::kF32 || y.dtype != DType::kF32) return nullptr;
  const bool has_bias = setup.inputs.size() >= 3 && setup.inputs[2].dtype != DType::kUndefined;
  if (has_bias && setup.inputs[2] != TensorInfo{DType::kF32, {w.shape.empty() ? 0 : w.shape[0]}}) return nullptr;
  ConvGeometry g;
  try {
    g = convGeometry("Conv", setup.params, x, w, y);
  } catch (const UsageError&) {
    return nullptr;  // the oneDNN path reports what is wrong
  }
  const int64_t positions = g.batch * g.outPlane();
  if (g.group != 1 || positions < 1 || positions > kSmallConvPositions) return nullptr;
  std::optional<std::vector<PostOp>> post_ops = parsePostOps(setup.params);
  if (!post_ops) return nullptr;
  const bool has_add = std::any_of(post_ops->begin(), post_ops->end(), [](const PostOp& op) { return op.add; });
  // The residual is read position-major, as NHWC lays it out.
  if (!post_ops->empty() && !channels_last) return nullptr;
  if (has_add && (setup.inputs.size() < 4 || setup.inputs[3].dtype != DType::kF32 ||
                  setup.inputs[3].numElements() != y.numElements())) {
    return nullptr;
  }

  SmallConvPtr conv(new SmallConv);
  conv->g = g;
  conv->channels_last = channels_last;
  conv->positions = positions;
  conv->patch = g.in_channels * g.kernelSize();
  conv->has_bias = has_bias;
  conv->post_ops = std::move(*post_ops);
  const int64_t m = g.out_channels, k = conv->patch;
  const auto* weights = reinterpret_cast<const float*>(setup.constants[1]);
  conv->weights_t.resize(panelsSize(k, m));
  packPanels(weights, k, m, 1, k, conv->weights_t.data());  // W [m, k] read as W^T
  conv->patches.assign(static_cast<size_t>(positions * k), 0.0f);
  conv->rows.assign(static_cast<size_t>(positions * m), 0.0f);
  conv->temp.assign(static_cast<size_t>(m), 0.0f);
  conv->offsets.assign(static_cast<size_t>(g.kernelSize()), -1);
  return conv;
}

namespace {

// patches[p] = the inputs that output position p reads (0 where padding):
// per position, the offset of each kernel tap in a channel (-1 in the
// padding), then per channel the taps.
void gatherPatches(const SmallConv& conv, const float* x) {
  const ConvGeometry& g = conv.g;
  const int64_t channels = g.in_channels, plane = g.inPlane(), taps = g.kernelSize();
  // NCHW: a channel is a plane, a tap a step of 1; NHWC the other way round.
  const int64_t channel_step = conv.channels_last ? 1 : plane;
  const int64_t tap_step = conv.channels_last ? channels : 1;
  int64_t* offsets = conv.offsets.data();
  float* row = conv.patches.data();
  for (int64_t n = 0; n < g.batch; ++n) {
    const float* image = x + n * channels * plane;
    for (int64_t od = 0; od < g.out[0]; ++od) {
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        for (int64_t ow = 0; ow < g.out[2]; ++ow, row += conv.patch) {
          int64_t* offset = offsets;
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            const int64_t id = od * g.strides[0] - g.pad_begin[0] + kd * g.dilations[0];
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              const int64_t ih = oh * g.strides[1] - g.pad_begin[1] + kh * g.dilations[1];
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                const int64_t iw = ow * g.strides[2] - g.pad_begin[2] + kw * g.dilations[2];
                const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 && iw < g.in[2];
                *offset++ = inside ? ((id * g.in[1] + ih) * g.in[2] + iw) * tap_step : -1;
              }
            }
          }
          float* to = row;
          for (int64_t c = 0; c < channels; ++c, to += taps) {
            const float* channel = image + c * channel_step;
            for (int64_t t = 0; t < taps; ++t) to[t] = offsets[t] >= 0 ? channel[offsets[t]] : 0.0f;
          }
        }
      }
    }
  }
}

void applyPostOps(const SmallConv& conv, const float* residual) {
  const vec::VectorKernels& v = vec::vectorKernels();
  const int64_t m = conv.g.out_channels;
  for (const PostOp& op : conv.post_ops) {
    for (int64_t p = 0; p < conv.positions; ++p) {
      float* row = conv.rows.data() + p * m;
      if (op.add) {
        v.binaryFn(vec::Binary::kAdd, vec::Operands::kBoth)(row, residual + p * m, row, m);
      } else if (op.activation == FusedActivation::kSwish) {
        v.unaryFn(vec::Unary::kSigmoid)(row, conv.temp.data(), m, 0, 0);
        v.binaryFn(vec::Binary::kMul, vec::Operands::kBoth)(row, conv.temp.data(), row, m);
      } else {
        v.unaryFn(*vec::unaryForActivation(op.activation))(row, row, m, op.alpha, op.beta);
      }
    }
  }
}

}  // namespace

bool runSmallConv(const SmallConv& conv, const KernelCall& call) {
  if (conv.busy.exchange(true, std::memory_order_acquire)) return false;
  const ConvGeometry& g = conv.g;
  const int64_t m = g.out_channels, k = conv.patch, positions = conv.positions;
  gatherPatches(conv, call.inputs[0].as<const float>());
  const float* bias = conv.has_bias ? call.inputs[2].as<const float>() : nullptr;
  for (int64_t p = 0; p < positions; ++p) {
    float* row = conv.rows.data() + p * m;
    if (bias != nullptr) {
      std::memcpy(row, bias, static_cast<size_t>(m) * sizeof(float));
    } else {
      std::fill(row, row + m, 0.0f);
    }
  }
  // Whole panels of columns across the threads when the product is big
  // enough (a multiply-add in a vector loop costs a sixteenth of an
  // elementwise op's element, which is what parallel.h counts).
  const vec::VectorKernels& v = vec::vectorKernels();
  parallelForItems((m + kPanel - 1) / kPanel, positions * k * kPanel / 16, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kPanel, last = std::min(end * kPanel, m);
    panelProduct(v, conv.patches.data(), k, conv.weights_t.data(), k, first, last, conv.rows.data() + first, m,
                 positions);
  });
  applyPostOps(conv, call.input_count > 3 ? call.inputs[3].as<const float>() : nullptr);
  float* y = call.outputs[0].as<float>();
  if (conv.channels_last) {
    std::memcpy(y, conv.rows.data(), static_cast<size_t>(positions * m) * sizeof(float));
  } else {
    const int64_t plane = g.outPlane();
    for (int64_t p = 0; p < positions; ++p) {
      const int64_t n = p / plane, at = p % plane;
      for (int64_t oc = 0; oc < m; ++oc) y[(n * m + oc) * plane + at] = conv.rows[static_cast<size_t>(p * m + oc)];
    }
  }
  conv.busy.store(false, std::memory_order_release);
  return true;
}

}  // namespace kiln
