// Conv and ConvTranspose (ONNX), and kiln.FusedConv (a Conv with the post-ops
// that passes/conv_fusion.h fused into it), on cuda devices, in f32 NCHW,
// through cuDNN's convolution API (cudnnConvolutionForward; ConvTranspose is
// the backward-data pass of the convolution it transposes,
// cudnnConvolutionBackwardData).
//
// prepare reads the attributes (kernel_shape, strides, dilations, pads or
// auto_pad, group; ConvTranspose's output_padding and output_shape), checks
// them against the static shapes of the inputs and of the output that
// inference fixed, and builds what cuDNN needs once: the tensor, filter and
// convolution descriptors and the algorithm. run only queues work on the
// queue's stream: it may be captured into a CUDA graph.
//
// The forward algorithm is measured, as onnxruntime does by default (its
// EXHAUSTIVE search), rather than taken from cuDNN's heuristic ranking, whose
// first choice is often not the fastest: prepare runs
// cudnnFindConvolutionForwardAlgorithmEx on zeroed stand-ins for x, w and y
// (cudaMalloc'd, freed before it returns) with the queue's handle and
// workspace, and takes the fastest algorithm that runs in plain f32 within
// the workspace. It keeps the measurements per convolution (device, sizes,
// workspace) for the process: models repeat shapes, and Find runs every
// algorithm. When Find fails or finds nothing that fits, the heuristic
// ranking (cudnnGetConvolutionForwardAlgorithm_v7) decides, as it still does
// for ConvTranspose. This makes prepare synchronize the queue's stream and
// use its workspace: it must not overlap jobs on the same queue (as
// cuda_queue.h requires).
//
// cuDNN's geometry differs from ONNX's in three ways:
//   - it needs 2 or 3 spatial axes: a 1-D convolution runs as a 2-D one whose
//     first spatial axis has size 1 (kernel 1, stride 1, no padding);
//   - its padding is symmetric (one value per axis for both ends). ONNX pads
//     [x1_begin, x2_begin, ..., x1_end, x2_end, ...] may differ per end, as
//     auto_pad SAME_* gives whenever the total padding is odd.
//       Conv: the windows start at `begin` in both, so cuDNN pads `begin`
//     whenever that gives ONNX's output size (the windows then never reach
//     the end padding, where the two differ). Otherwise run first copies the
//     input into the workspace with the missing zeros around it and cuDNN
//     pads the smaller of the two.
//       ConvTranspose: cuDNN pads `begin` and is given the output size, which
//     it accepts while 0 <= begin - end < stride (end net of output_padding:
//     symmetric pads, SAME_LOWER, output_shape mostly). Otherwise cuDNN pads
//     the smaller of the two (at least 0) into the workspace and run copies
//     ONNX's part of that out (zero-filled past it, as ONNX's output is).
//     The copies (cudaMemset + cudaMemcpy3D, both graph-capturable) cover the
//     last two spatial axes: a 3-D op whose depth pads differ per end is
//     refused;
//   - its f32 math may use TF32 tensor cores: the descriptors ask for
//     CUDNN_FMA_MATH, plain f32 as the CPU kernels compute, unless the step
//     allows TF32 (core/math_mode.h: `kiln compile --tf32`), when they ask
//     for CUDNN_TENSOR_OP_MATH.
// The bias (input 2) is added after the convolution by cudnnAddTensor (or,
// in kiln.FusedConv's post pass, with the post-ops).
//
// kiln.FusedConv computes y = conv(x, w) + bias, then its `post_ops` in
// order ("Add" adds the residual, input 3; the others are activations of
// core/fused_activation.h), in one of two ways:
//   - one cudnnConvolutionBiasActivationForward, act(conv + z + bias) with z
//     the residual (or y weighted 0) and act RELU or IDENTITY, when post_ops
//     is "", "Relu", "Add" or "Add,Relu" (and not "" without a bias: that is
//     Conv's way). cuDNN allows IDENTITY with IMPLICIT_PRECOMP_GEMM only, and
//     declines some combinations: prepare tries the call on the stand-ins
//     with the measured algorithms in order (as cuDNN allows them) and keeps
//     the first that runs if it is at least as fast as the other way, both
//     timed with CUDA events. A missing bias is a zeroed buffer of the state.
//     Its RELU does not propagate NaN (as onnxruntime's fused Conv);
//   - otherwise Conv's convolution, then one elementwise pass over y in
//     place (post_ops.h) for the bias and the post-ops.
//
// Declined in prepare (KernelUnsupported: the step then runs on the host):
// dtypes other than f32, dynamic shapes, more than 3 spatial axes, the depth
// pads above, copies larger than the workspace, shapes that do not fit
// cuDNN's int dimensions, unknown post-ops, and a residual that is missing or
// not one f32 per output element.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/fused_post_ops.h"
#include "core/math_mode.h"
#include "kernels/cuda/cudnn_support.h"
#include "kernels/cuda/depthwise_conv.h"
#include "kernels/cuda/pointwise_conv.h"
#include "kernels/cuda/step_timer.h"
#include "kernels/cuda/tiled_conv_transpose.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_pass.h"
#include "kernels/cuda/post_ops.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

using CudnnInts = std::vector<int>;

// cuDNN wants its workspace pointers aligned: the copies' buffers in the
// workspace end on this boundary.
constexpr size_t kWorkspaceAlignment = 256;

// ---------------------------------------------------------------- descriptors

using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using ActivationDescriptor =
    Descriptor<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor>;

// ------------------------------------------------------------------ attributes






// ----------------------------------------------------------- ONNX geometry

// One Conv or ConvTranspose as ONNX defines it, per spatial axis.
struct ConvGeometry {
  bool transposed = false;
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t group = 1;
  Ints in;  // spatial sizes
  Ints out;
  Ints kernel;
  Ints strides;
  Ints dilations;
  Ints pad_begin;
  Ints pad_end;  // ConvTranspose: the end pad minus output_padding (negative when output_shape asks for more)

  size_t spatial() const { return in.size(); }
  int64_t extent(size_t axis) const { return (kernel[axis] - 1) * dilations[axis] + 1; }
};

bool hasBias(const KernelSetup& setup) { return setup.inputs.size() > 2 && setup.inputs[2].dtype != DType::kUndefined; }

// X, W and the optional bias B; `max_inputs` is 4 with kiln.FusedConv's
// residual (checked with its post-ops).
void checkTensors(std::string_view op, const KernelSetup& setup, size_t max_inputs) {
  if (setup.queue == nullptr) throw KernelUnsupported(fmt::format("{} on cuda: prepared without a cuda queue", op));
  if (setup.inputs.size() < 2 || setup.inputs.size() > max_inputs) {
    throw KernelUnsupported(
        fmt::format("{} on cuda: expects 2 to {} inputs, got {}", op, max_inputs, setup.inputs.size()));
  }
  if (setup.outputs.size() != 1) {
    throw KernelUnsupported(fmt::format("{} on cuda: expects 1 output, got {}", op, setup.outputs.size()));
  }
  const size_t count = hasBias(setup) ? 3 : 2;
  // f32, or f16 or bf16 throughout (`kiln compile --fp16`, `--bf16`).
  const DType dtype = setup.inputs[0].dtype;
  for (size_t i = 0; i < count; ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (!floatStorageOf(dtype) || input.dtype != dtype) {
      throw KernelUnsupported(fmt::format("{} on cuda: inputs all f32, all f16 or all bf16 expected; input {} is {}",
                                          op, i, typeString(input)));
    }
    if (!input.isStatic()) {
      throw KernelUnsupported(fmt::format("{} on cuda: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
  const TensorInfo& x = setup.inputs[0];
  if (x.shape.size() < 3 || x.shape.size() > 5) {
    throw KernelUnsupported(fmt::format(
        "{} on cuda: needs an input [N, C, spatial...] with 1 to 3 spatial axes, got {}", op, typeString(x)));
  }
  if (setup.inputs[1].shape.size() != x.shape.size()) {
    throw KernelUnsupported(fmt::format("{} on cuda: the weights {} must have the rank of the input {}", op,
                                        typeString(setup.inputs[1]), typeString(x)));
  }
}

void checkBias(std::string_view op, const KernelSetup& setup, int64_t out_channels) {
  if (!hasBias(setup)) return;
  const TensorInfo& bias = setup.inputs[2];
  if (bias.shape != Ints{out_channels}) {
    throw KernelUnsupported(fmt::format("{} on cuda: the bias is {}, expected one value per output channel ([{}])", op,
                                        typeString(bias), out_channels));
  }
}

void checkOutput(std::string_view op, const KernelSetup& setup, const ConvGeometry& g) {
  Ints expected{g.batch, g.out_channels};
  expected.insert(expected.end(), g.out.begin(), g.out.end());
  const TensorInfo& y = setup.outputs[0];
  const DType dtype = setup.inputs[0].dtype;
  if (y.dtype != dtype || y.shape != expected) {
    throw KernelUnsupported(fmt::format("{} on cuda: the output is {} but the inputs and attributes give {}", op,
                                        typeString(y), typeString(TensorInfo{dtype, expected})));
  }
}

// kernel_shape, when present, must repeat the weights' spatial sizes.
Ints kernelShape(std::string_view op, const KernelSetup& setup, size_t spatial) {
  const Ints& w = setup.inputs[1].shape;
  const Ints from_weights(w.begin() + 2, w.end());
  const Ints kernel = sizedInts(op, setup.params, "kernel_shape", spatial, 1, from_weights);
  if (kernel != from_weights) {
    throw KernelUnsupported(fmt::format("{} on cuda: kernel_shape [{}] differs from the weights {}", op,
                                        fmt::join(kernel, ", "), typeString(setup.inputs[1])));
  }
  return kernel;
}

// The parts both ops read the same way: strides, dilations, the kernel.
void readWindow(std::string_view op, const KernelSetup& setup, ConvGeometry& g) {
  const Ints& x = setup.inputs[0].shape;
  const size_t n = x.size() - 2;
  g.batch = x[0];
  g.in_channels = x[1];
  g.group = setup.params.getInt("group", 1);
  if (g.group < 1) throw KernelUnsupported(fmt::format("{} on cuda: group must be positive, got {}", op, g.group));
  g.in.assign(x.begin() + 2, x.end());
  g.kernel = kernelShape(op, setup, n);
  g.strides = sizedInts(op, setup.params, "strides", n, 1, Ints(n, 1));
  g.dilations = sizedInts(op, setup.params, "dilations", n, 1, Ints(n, 1));
  g.out.assign(n, 0);
  g.pad_begin.assign(n, 0);
  g.pad_end.assign(n, 0);
}

void checkChannels(std::string_view op, const KernelSetup& setup, const ConvGeometry& g, int64_t weight_channels) {
  const Ints& w = setup.inputs[1].shape;
  if (g.in_channels != weight_channels || g.in_channels % g.group != 0 || g.out_channels % g.group != 0) {
    throw KernelUnsupported(fmt::format("{} on cuda: the input {}, the weights {} and group {} do not fit together", op,
                                        typeString(setup.inputs[0]), typeString(setup.inputs[1]), g.group));
  }
  if (w[0] == 0 || w[1] == 0) {
    throw KernelUnsupported(fmt::format("{} on cuda: no kernel for empty weights {}", op, typeString(setup.inputs[1])));
  }
}

ConvGeometry convGeometry(const KernelSetup& setup) {
  constexpr std::string_view op = "Conv";
  ConvGeometry g;
  readWindow(op, setup, g);
  const Ints& w = setup.inputs[1].shape;
  g.out_channels = w[0];
  checkChannels(op, setup, g, w[1] * g.group);
  checkBias(op, setup, g.out_channels);
  const size_t n = g.spatial();
  const Ints pads = sizedInts(op, setup.params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const AutoPad auto_pad = autoPad(op, setup.params);
  for (size_t i = 0; i < n; ++i) {
    const int64_t extent = g.extent(i);
    const int64_t stride = g.strides[i];
    if (isSame(auto_pad)) {
      g.out[i] = (g.in[i] + stride - 1) / stride;
      const int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * stride + extent - g.in[i]);
      g.pad_begin[i] = auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      g.pad_end[i] = total - g.pad_begin[i];
      continue;
    }
    g.pad_begin[i] = auto_pad == AutoPad::kValid ? 0 : pads[i];
    g.pad_end[i] = auto_pad == AutoPad::kValid ? 0 : pads[i + n];
    const int64_t room = g.in[i] + g.pad_begin[i] + g.pad_end[i] - extent;
    if (room < 0) {
      throw KernelUnsupported(
          fmt::format("Conv on cuda: spatial axis {}: the kernel spans {} elements (dilations included) "
                      "but the padded input has {}",
                      i, extent, g.in[i] + g.pad_begin[i] + g.pad_end[i]));
    }
    g.out[i] = room / stride + 1;
  }
  checkOutput(op, setup, g);
  return g;
}

// output_shape, when present, as one size per spatial axis (ONNX also
// allows the full [N, C, spatial...]).
Ints outputShapeAttribute(const KernelSetup& setup, size_t spatial) {
  if (!setup.params.has("output_shape")) return {};
  Ints shape = setup.params.getInts("output_shape", {});
  if (shape.size() == spatial + 2) shape.erase(shape.begin(), shape.begin() + 2);
  if (shape.size() != spatial) {
    throw KernelUnsupported(
        fmt::format("ConvTranspose on cuda: output_shape [{}] must have one size per spatial axis ({})",
                    fmt::join(shape, ", "), spatial));
  }
  return shape;
}

ConvGeometry convTransposeGeometry(const KernelSetup& setup) {
  constexpr std::string_view op = "ConvTranspose";
  ConvGeometry g;
  g.transposed = true;
  readWindow(op, setup, g);
  const Ints& w = setup.inputs[1].shape;  // [C_in, C_out / group, k...]
  g.out_channels = w[1] * g.group;
  checkChannels(op, setup, g, w[0]);
  checkBias(op, setup, g.out_channels);
  const size_t n = g.spatial();
  const Ints pads = sizedInts(op, setup.params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const Ints output_padding = sizedInts(op, setup.params, "output_padding", n, 0, Ints(n, 0));
  const Ints output_shape = outputShapeAttribute(setup, n);
  const AutoPad auto_pad = autoPad(op, setup.params);
  for (size_t i = 0; i < n; ++i) {
    const int64_t full = g.strides[i] * (g.in[i] - 1) + output_padding[i] + g.extent(i);  // before any padding
    int64_t begin = auto_pad == AutoPad::kValid ? 0 : pads[i];
    int64_t end = auto_pad == AutoPad::kValid ? 0 : pads[i + n];
    if (!output_shape.empty() || isSame(auto_pad)) {
      g.out[i] = output_shape.empty() ? g.in[i] * g.strides[i] : output_shape[i];
      // As the CPU kernel (and ONNX's reference): the total splits with floor
      // division, SAME_UPPER putting the smaller half first.
      const int64_t total = full - g.out[i];
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      begin = auto_pad == AutoPad::kSameUpper ? half : total - half;
      end = total - begin;
      if (begin < 0) {
        throw KernelUnsupported(
            fmt::format("ConvTranspose on cuda: spatial axis {}: output size {} is larger than the {} "
                        "the input, kernel and strides give by more than the end padding can take",
                        i, g.out[i], full));
      }
    } else {
      g.out[i] = full - begin - end;
      if (g.out[i] < 1) {
        throw KernelUnsupported(
            fmt::format("ConvTranspose on cuda: spatial axis {}: the output size {} is not positive", i, g.out[i]));
      }
    }
    g.pad_begin[i] = begin;
    g.pad_end[i] = end - output_padding[i];
  }
  checkOutput(op, setup, g);
  return g;
}

// ----------------------------------------------------------- cuDNN geometry

// What cuDNN computes: 2 or 3 spatial axes, symmetric pads. `x` and `y` are
// the tensors cuDNN reads and writes; they differ from the op's own (`op_x`,
// `op_y`) where a copy in the workspace bridges the two: a Conv's input with
// the zeros around it that cuDNN's symmetric pads cannot give (op_x sits at
// `x_offset` inside x), or a ConvTranspose's output computed with other pads,
// op_y's part of it (from `y_offset`) copied out.
struct CudnnGeometry {
  CudnnInts x;  // [N, C, spatial...]
  CudnnInts w;
  CudnnInts y;
  CudnnInts op_x;
  CudnnInts op_y;
  CudnnInts x_offset;  // per spatial axis
  CudnnInts y_offset;
  CudnnInts pads;
  CudnnInts strides;
  CudnnInts dilations;
};


// The output size cuDNN's forward convolution gives for one axis.
int64_t cudnnOutputSize(int64_t in, int64_t pad, int64_t extent, int64_t stride) {
  const int64_t room = in + 2 * pad - extent;
  return room < 0 ? 0 : room / stride + 1;
}

// Conv: padding `begin` when that gives ONNX's output size; otherwise the
// smaller pad, the input copy adding the rest.
void addConvAxis(std::string_view op, const ConvGeometry& g, size_t i, CudnnGeometry& c) {
  const int64_t begin = g.pad_begin[i];
  const int64_t end = g.pad_end[i];
  int64_t pad = begin;
  if (cudnnOutputSize(g.in[i], begin, g.extent(i), g.strides[i]) != g.out[i]) pad = std::min(begin, end);
  c.x.push_back(toInt(op, g.in[i] + (begin - pad) + (end - pad)));
  c.op_x.push_back(toInt(op, g.in[i]));
  c.x_offset.push_back(toInt(op, begin - pad));
  c.y_offset.push_back(0);
  c.y.push_back(toInt(op, g.out[i]));
  c.op_y.push_back(toInt(op, g.out[i]));
  c.pads.push_back(toInt(op, pad));
}

// ConvTranspose: cuDNN's backward data with padding `begin` and the output
// size given, which cuDNN accepts while 0 <= begin - end < stride (end net of
// output_padding). Otherwise cuDNN pads max(0, min(begin, end)) and computes
// stride * (in - 1) + extent - 2 * pad outputs, which hold ONNX's from
// begin - pad on (ONNX's outputs past them, if any, are zeros).
void addConvTransposeAxis(std::string_view op, const ConvGeometry& g, size_t i, CudnnGeometry& c) {
  const int64_t begin = g.pad_begin[i];
  const int64_t end = g.pad_end[i];
  int64_t pad = begin;
  int64_t computed = g.out[i];
  if (begin - end < 0 || begin - end >= g.strides[i]) {
    pad = std::max<int64_t>(0, std::min(begin, end));
    computed = g.strides[i] * (g.in[i] - 1) + g.extent(i) - 2 * pad;
  }
  c.x.push_back(toInt(op, g.in[i]));
  c.op_x.push_back(toInt(op, g.in[i]));
  c.x_offset.push_back(0);
  c.y.push_back(toInt(op, computed));
  c.op_y.push_back(toInt(op, g.out[i]));
  c.y_offset.push_back(toInt(op, begin - pad));
  c.pads.push_back(toInt(op, pad));
}

// A 1-D convolution's leading axis of size 1.
void addUnitAxis(CudnnGeometry& c) {
  for (CudnnInts* dims : {&c.x, &c.w, &c.y, &c.op_x, &c.op_y, &c.strides, &c.dilations}) dims->push_back(1);
  c.x_offset.push_back(0);
  c.y_offset.push_back(0);
  c.pads.push_back(0);
}

CudnnGeometry cudnnGeometry(std::string_view op, const KernelSetup& setup, const ConvGeometry& g) {
  CudnnGeometry c;
  const int batch = toInt(op, g.batch);
  c.x = {batch, toInt(op, g.in_channels)};
  c.op_x = c.x;
  c.y = {batch, toInt(op, g.out_channels)};
  c.op_y = c.y;
  for (int64_t dim : std::span(setup.inputs[1].shape).first(2)) c.w.push_back(toInt(op, dim));
  if (g.spatial() == 1) addUnitAxis(c);
  for (size_t i = 0; i < g.spatial(); ++i) {
    if (g.transposed) {
      addConvTransposeAxis(op, g, i, c);
    } else {
      addConvAxis(op, g, i, c);
    }
    c.w.push_back(toInt(op, g.kernel[i]));
    c.strides.push_back(toInt(op, g.strides[i]));
    c.dilations.push_back(toInt(op, g.dilations[i]));
  }
  return c;
}

// ------------------------------------------------------------- plane copies

// A copy of tensor `from` into `to` (elements of `element_bytes`), both [planes, rows, columns] (a
// plane is one (n, c) pair, or for 3-D convolutions one (n, c, depth)
// triple): each plane's rows x columns block at `from_at` lands at `to_at`,
// `to` zeroed first when the block does not cover it. One cudaMemset and one
// cudaMemcpy3D, both graph-capturable.
struct PlaneCopy {
  bool enabled = false;
  size_t planes = 0;
  size_t from_rows = 0;
  size_t from_columns = 0;
  size_t to_rows = 0;
  size_t to_columns = 0;
  size_t rows = 0;  // the block
  size_t columns = 0;
  cudaPos from_at{};  // in bytes, rows, planes as cudaMemcpy3D takes it
  cudaPos to_at{};
  bool zero_first = false;
  size_t buffer_bytes = 0;  // of the workspace, for the side in it (aligned)
  size_t element_bytes = sizeof(float);
};

size_t product(std::span<const int> values) {
  size_t result = 1;
  for (int v : values) result *= static_cast<size_t>(v);
  return result;
}

size_t alignedBytes(std::span<const int> dims, size_t element_bytes) {
  const size_t bytes = product(dims) * element_bytes;
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Where `offset` (per spatial axis) is in the last two axes, for cudaMemcpy3D.
cudaPos lastTwoAxes(const CudnnInts& offset, size_t element_bytes) {
  const size_t n = offset.size();
  return make_cudaPos(static_cast<size_t>(offset[n - 1]) * element_bytes, static_cast<size_t>(offset[n - 2]), 0);
}

// The copy from `from` (its part from `from_offset`) to `to` (at
// `to_offset`); disabled when there is nothing to copy. Only the last two
// spatial axes may differ.
PlaneCopy planeCopy(std::string_view op, const CudnnInts& from, const CudnnInts& from_offset, const CudnnInts& to,
                    const CudnnInts& to_offset, size_t element_bytes) {
  PlaneCopy copy;
  copy.element_bytes = element_bytes;
  const bool offsets = std::any_of(from_offset.begin(), from_offset.end(), [](int v) { return v != 0; }) ||
                       std::any_of(to_offset.begin(), to_offset.end(), [](int v) { return v != 0; });
  if (from == to && !offsets) return copy;
  const size_t row_axis = to.size() - 2;
  const bool depth_moves = to.size() == 5 && (from_offset[0] != 0 || to_offset[0] != 0);
  if (depth_moves || !std::equal(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(row_axis), to.begin())) {
    throw KernelUnsupported(
        fmt::format("{} on cuda: cuDNN pads both ends alike; pads that differ per end on the depth axis "
                    "of a 3-D convolution are not supported",
                    op));
  }
  copy.enabled = true;
  copy.planes = product(std::span(to).first(row_axis));
  copy.from_rows = static_cast<size_t>(from[row_axis]);
  copy.from_columns = static_cast<size_t>(from[row_axis + 1]);
  copy.to_rows = static_cast<size_t>(to[row_axis]);
  copy.to_columns = static_cast<size_t>(to[row_axis + 1]);
  copy.from_at = lastTwoAxes(from_offset, element_bytes);
  copy.to_at = lastTwoAxes(to_offset, element_bytes);
  copy.rows = std::min(copy.from_rows - copy.from_at.y, copy.to_rows - copy.to_at.y);
  copy.columns = std::min(copy.from_columns - copy.from_at.x / element_bytes,
                          copy.to_columns - copy.to_at.x / element_bytes);
  copy.zero_first = copy.rows < copy.to_rows || copy.columns < copy.to_columns;
  return copy;
}

void queuePlaneCopy(const PlaneCopy& copy, const void* from, void* to, cudaStream_t stream) {
  const size_t element = copy.element_bytes;
  if (copy.zero_first) cudaMemsetAsync(to, 0, copy.planes * copy.to_rows * copy.to_columns * element, stream);
  cudaMemcpy3DParms params{};
  params.srcPtr = make_cudaPitchedPtr(const_cast<void*>(from), copy.from_columns * element, copy.from_columns,
                                      copy.from_rows);
  params.srcPos = copy.from_at;
  params.dstPtr = make_cudaPitchedPtr(to, copy.to_columns * element, copy.to_columns, copy.to_rows);
  params.dstPos = copy.to_at;
  params.extent = make_cudaExtent(copy.columns * element, copy.rows, copy.planes);
  params.kind = cudaMemcpyDeviceToDevice;
  cudaMemcpy3DAsync(&params, stream);
}

// ------------------------------------------------------------------- state

struct ConvState : KernelState {
  bool transposed = false;
  bool empty = false;  // the output has no elements: nothing to do
  bool has_bias = false;
  bool bias_in_post_pass = false;  // kiln.FusedConv: its post pass adds the bias, not cudnnAddTensor
  DType dtype = DType::kF32;  // of every tensor, or f16 throughout
  cudnnMathType_t math = CUDNN_FMA_MATH;  // CUDNN_TENSOR_OP_MATH: TF32 allowed, or f16 on tensor cores
  TensorDescriptor x;  // what cuDNN reads (ConvTranspose: the "dy" of the backward pass)
  TensorDescriptor y;  // what cuDNN writes (ConvTranspose: its "dx")
  TensorDescriptor output;  // the op's output, for the bias
  TensorDescriptor bias;  // [1, C, 1, ...]
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  cudnnConvolutionFwdAlgo_t forward_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t backward_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  size_t algo_workspace_bytes = 0;
  PlaneCopy input_copy;   // Conv: the input into the padded x, at the front of the workspace
  PlaneCopy output_copy;  // ConvTranspose: y, after any input copy in the workspace, into the output
};

void setTensor(const TensorDescriptor& descriptor, DType dtype, const CudnnInts& dims) {
  check(cudnnSetTensorNdDescriptorEx(descriptor.get(), CUDNN_TENSOR_NCHW, cudnnDataType(dtype),
                                     static_cast<int>(dims.size()), dims.data()),
        "cudnnSetTensorNdDescriptorEx");
}

void setDescriptors(ConvState& state, const CudnnGeometry& c, int64_t group, bool has_bias) {
  setTensor(state.x, state.dtype, c.x);
  setTensor(state.y, state.dtype, c.y);
  setTensor(state.output, state.dtype, c.op_y);
  // f16 tensors convolve with f32 sums (cuDNN's PSEUDO_HALF_CONFIG): the
  // convolution's compute type stays FLOAT.
  check(cudnnSetFilterNdDescriptor(state.w.get(), cudnnDataType(state.dtype), CUDNN_TENSOR_NCHW, static_cast<int>(c.w.size()),
                                   c.w.data()),
        "cudnnSetFilterNdDescriptor");
  check(cudnnSetConvolutionNdDescriptor(state.conv.get(), static_cast<int>(c.pads.size()), c.pads.data(),
                                        c.strides.data(), c.dilations.data(), CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT),
        "cudnnSetConvolutionNdDescriptor");
  check(cudnnSetConvolutionGroupCount(state.conv.get(), static_cast<int>(group)), "cudnnSetConvolutionGroupCount");
  check(cudnnSetConvolutionMathType(state.conv.get(), state.math), "cudnnSetConvolutionMathType");
  state.has_bias = has_bias;
  // Also without a bias input: kiln.FusedConv's fused call then adds zeros.
  CudnnInts bias_dims(c.y.size(), 1);
  bias_dims[1] = c.y[1];
  setTensor(state.bias, state.dtype, bias_dims);
}

// cuDNN's own idea of the forward output (for ConvTranspose: of the
// convolution it transposes) must be what we computed.
void checkCudnnOutput(std::string_view op, const ConvState& state, const CudnnGeometry& c) {
  const TensorDescriptor& in = state.transposed ? state.y : state.x;
  const CudnnInts& expected = state.transposed ? c.x : c.y;
  CudnnInts dims(expected.size());
  check(cudnnGetConvolutionNdForwardOutputDim(state.conv.get(), in.get(), state.w.get(), static_cast<int>(dims.size()),
                                              dims.data()),
        "cudnnGetConvolutionNdForwardOutputDim");
  if (dims != expected) {
    throw KernelUnsupported(fmt::format("{} on cuda: cuDNN computes a convolution output [{}] where [{}] is expected",
                                        op, fmt::join(dims, ", "), fmt::join(expected, ", ")));
  }
}

// ------------------------------------------------------------ device memory

// Device memory that prepare holds for a while (the zeroed stand-ins it
// measures on) or that a state owns (kiln.FusedConv's zero bias):
// cudaMalloc'd, zeroed on `stream` (synchronize it before reading), freed
// with its owner. Null when the allocation fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, cudaStream_t stream) {
    if (cudaMalloc(&data_, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it
      data_ = nullptr;
      return;
    }
    cudaMemsetAsync(data_, 0, bytes, stream);
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);  // `other` frees what this held
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
};

size_t tensorBytes(const TensorDescriptor& tensor) {
  size_t bytes = 0;
  check(cudnnGetTensorSizeInBytes(tensor.get(), &bytes), "cudnnGetTensorSizeInBytes");
  return bytes;
}

size_t filterBytes(const FilterDescriptor& filter) {
  size_t bytes = 0;
  check(cudnnGetFilterSizeInBytes(filter.get(), &bytes), "cudnnGetFilterSizeInBytes");
  return bytes;
}

// --------------------------------------------------------------- algorithms

using ForwardPerf = cudnnConvolutionFwdAlgoPerf_t;

// What prepare settles before the algorithm: cuDNN's geometry, the group,
// and `budget`, the workspace left to cuDNN's algorithm behind the copies.
struct Plan {
  CudnnGeometry cudnn;
  int64_t group = 1;
  size_t budget = 0;
};

// The algorithm's part of the workspace: its last `budget` bytes.
std::byte* algorithmWorkspace(const CudaQueue& queue, size_t budget) {
  return static_cast<std::byte*>(queue.workspace) + (queue.workspace_bytes - budget);
}

// Whether a ranked algorithm fits: it runs within `budget`, in plain f32
// (or in TF32 where `math` allows tensor cores; never converting to f16).
template <typename Perf>
bool fits(const Perf& perf, size_t budget, cudnnMathType_t math) {
  const bool precise = perf.mathType == CUDNN_FMA_MATH ||
                       (math == CUDNN_TENSOR_OP_MATH && perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
  return perf.status == CUDNN_STATUS_SUCCESS && perf.memory <= budget && precise;
}

std::string noAlgorithmMessage(std::string_view op, const KernelSetup& setup, size_t budget) {
  return fmt::format("{} on cuda: cuDNN has no f32 algorithm for input {}, weights {} within the {} bytes of workspace",
                     op, typeString(setup.inputs[0]), typeString(setup.inputs[1]), budget);
}

// The forward algorithms that fit, fastest first, as
// cudnnFindConvolutionForwardAlgorithmEx times them on zeroed stand-ins for
// x, w and y. Empty when a stand-in cannot be allocated or Find fails.
std::vector<ForwardPerf> measureForwardAlgorithms(const CudaQueue& queue, const Plan& plan, const ConvState& state) {
  const DeviceBuffer x(tensorBytes(state.x), queue.stream);
  const DeviceBuffer w(filterBytes(state.w), queue.stream);
  const DeviceBuffer y(tensorBytes(state.y), queue.stream);
  int count = 0;
  if (!x || !w || !y || cudnnGetConvolutionForwardAlgorithmMaxCount(queue.cudnn, &count) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  // The zeros in place and the stream idle: nothing else in the timings.
  if (cudaStreamSynchronize(queue.stream) != cudaSuccess) return {};
  std::vector<ForwardPerf> measured(static_cast<size_t>(std::max(count, 1)));
  int returned = 0;
  const cudnnStatus_t status = cudnnFindConvolutionForwardAlgorithmEx(
      queue.cudnn, state.x.get(), x.get(), state.w.get(), w.get(), state.conv.get(), state.y.get(), y.get(),
      static_cast<int>(measured.size()), &returned, measured.data(), algorithmWorkspace(queue, plan.budget),
      plan.budget);
  if (status != CUDNN_STATUS_SUCCESS) return {};
  measured.resize(static_cast<size_t>(std::clamp(returned, 0, static_cast<int>(measured.size()))));
  std::erase_if(measured, [&](const ForwardPerf& perf) { return !fits(perf, plan.budget, state.math); });
  std::stable_sort(measured.begin(), measured.end(),
                   [](const ForwardPerf& a, const ForwardPerf& b) { return a.time < b.time; });
  return measured;
}

// The convolution a measurement is for: the device, the sizes cuDNN sees
// and the workspace.
std::string measurementKey(const CudaQueue& queue, const Plan& plan, const ConvState& state) {
  const CudnnGeometry& c = plan.cudnn;
  return fmt::format("{} x[{}] w[{}] y[{}] pads[{}] strides[{}] dilations[{}] group {} budget {} math {}", queue.device,
                     fmt::join(c.x, ","), fmt::join(c.w, ","), fmt::join(c.y, ","), fmt::join(c.pads, ","),
                     fmt::join(c.strides, ","), fmt::join(c.dilations, ","), plan.group, plan.budget,
                     static_cast<int>(state.math));
}

// measureForwardAlgorithms, once per convolution and process (a failure is
// tried again): models repeat their convolutions' shapes, and Find runs
// every algorithm on each.
std::vector<ForwardPerf> measuredForwardAlgorithms(const CudaQueue& queue, const Plan& plan, const ConvState& state) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<ForwardPerf>> measurements;
  const std::string key = measurementKey(queue, plan, state);
  const std::lock_guard lock(mutex);
  if (const auto found = measurements.find(key); found != measurements.end()) return found->second;
  std::vector<ForwardPerf> measured = measureForwardAlgorithms(queue, plan, state);
  if (!measured.empty()) measurements.emplace(key, measured);
  return measured;
}

// cuDNN's heuristic ranking of the forward algorithms, those that fit.
std::vector<ForwardPerf> rankedForwardAlgorithms(const CudaQueue& queue, const ConvState& state, size_t budget) {
  std::vector<ForwardPerf> ranked(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  int returned = 0;
  check(cudnnGetConvolutionForwardAlgorithm_v7(queue.cudnn, state.x.get(), state.w.get(), state.conv.get(),
                                               state.y.get(), static_cast<int>(ranked.size()), &returned,
                                               ranked.data()),
        "cudnnGetConvolutionForwardAlgorithm_v7");
  ranked.resize(static_cast<size_t>(std::clamp(returned, 0, static_cast<int>(ranked.size()))));
  std::erase_if(ranked, [&](const ForwardPerf& perf) { return !fits(perf, budget, state.math); });
  return ranked;
}

// The forward algorithms to choose from, best first: as measured, or
// cuDNN's heuristic ranking when measuring gave nothing.
std::vector<ForwardPerf> forwardAlgorithms(const CudaQueue& queue, const Plan& plan, const ConvState& state) {
  std::vector<ForwardPerf> algorithms = measuredForwardAlgorithms(queue, plan, state);
  if (algorithms.empty()) algorithms = rankedForwardAlgorithms(queue, state, plan.budget);
  return algorithms;
}

void pickForwardAlgorithm(std::string_view op, const KernelSetup& setup, std::span<const ForwardPerf> algorithms,
                          size_t budget, ConvState& state) {
  if (algorithms.empty()) throw KernelUnsupported(noAlgorithmMessage(op, setup, budget));
  state.forward_algo = algorithms.front().algo;
  state.algo_workspace_bytes = algorithms.front().memory;
}

void pickBackwardDataAlgorithm(const KernelSetup& setup, const CudaQueue& queue, ConvState& state, size_t budget) {
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> ranked(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  int returned = 0;
  check(cudnnGetConvolutionBackwardDataAlgorithm_v7(queue.cudnn, state.w.get(), state.x.get(), state.conv.get(),
                                                    state.y.get(), static_cast<int>(ranked.size()), &returned,
                                                    ranked.data()),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7");
  for (int i = 0; i < returned; ++i) {
    if (!fits(ranked[i], budget, state.math)) continue;
    state.backward_algo = ranked[i].algo;
    state.algo_workspace_bytes = ranked[i].memory;
    return;
  }
  throw KernelUnsupported(noAlgorithmMessage("ConvTranspose", setup, budget));
}

// ------------------------------------------------------------------ prepare

// Plans the copies; returns the workspace left for cuDNN's algorithm.
size_t planCopies(std::string_view op, const CudaQueue& queue, const CudnnGeometry& c, ConvState& state) {
  const CudnnInts origin(c.pads.size(), 0);
  const size_t element = dtypeSize(state.dtype);
  state.input_copy = planeCopy(op, c.op_x, origin, c.x, c.x_offset, element);
  if (state.input_copy.enabled) state.input_copy.buffer_bytes = alignedBytes(c.x, element);
  state.output_copy = planeCopy(op, c.y, c.y_offset, c.op_y, origin, element);
  if (state.output_copy.enabled) state.output_copy.buffer_bytes = alignedBytes(c.y, element);
  const size_t copies = state.input_copy.buffer_bytes + state.output_copy.buffer_bytes;
  if (copies > queue.workspace_bytes) {
    throw KernelUnsupported(
        fmt::format("{} on cuda: cuDNN pads both ends alike; these asymmetric pads need a copy of {} "
                    "bytes, more than the {} bytes of workspace",
                    op, copies, queue.workspace_bytes));
  }
  return queue.workspace_bytes - copies;
}

// What every kernel here prepares alike: the checks, the geometry, the
// copies and the descriptors. nullopt when the output is empty (then
// state.empty: run does nothing).
std::optional<Plan> planConvolution(std::string_view op, const KernelSetup& setup, size_t max_inputs,
                                    ConvState& state) {
  checkTensors(op, setup, max_inputs);
  const ConvGeometry g = state.transposed ? convTransposeGeometry(setup) : convGeometry(setup);
  if (setup.outputs[0].numElements() == 0) {
    state.empty = true;
    return std::nullopt;
  }
  if (setup.inputs[0].numElements() == 0) {
    throw KernelUnsupported(
        fmt::format("{} on cuda: no kernel for the empty input {}", op, typeString(setup.inputs[0])));
  }
  Plan plan{cudnnGeometry(op, setup, g), g.group, 0};
  state.dtype = setup.inputs[0].dtype;
  plan.budget = planCopies(op, queueOf(setup.queue), plan.cudnn, state);
  const bool tensor_cores = state.dtype != DType::kF32 || allowsTf32(setup.params);
  state.math = tensor_cores ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  setDescriptors(state, plan.cudnn, g.group, hasBias(setup));
  checkCudnnOutput(op, state, plan.cudnn);
  return plan;
}

void runConv(const KernelCall& call);

// A 1x1 convolution runs as a cuBLAS GEMM (pointwise_conv.h) or on cuDNN,
// whichever measures faster for this step: cuBLAS wins on small batches,
// cuDNN where it fuses the bias, residual and ReLU into one call.
std::unique_ptr<KernelState> fasterOf(std::unique_ptr<KernelState> cudnn, RunKernel run_cudnn,
                                      std::unique_ptr<KernelState> pointwise, const KernelSetup& setup) {
  if (!pointwise) return cudnn;
  const double gemm_ms = timeStep(&runPointwiseConv, *pointwise, setup);
  const double cudnn_ms = timeStep(run_cudnn, *cudnn, setup);
  return gemm_ms < cudnn_ms ? std::move(pointwise) : std::move(cudnn);
}

std::unique_ptr<KernelState> prepareConv(const KernelSetup& setup) {
  constexpr std::string_view op = "Conv";
  if (std::unique_ptr<KernelState> depthwise = prepareDepthwiseConv(op, setup)) return depthwise;
  std::unique_ptr<KernelState> pointwise = preparePointwiseConv(op, setup);
  auto state = std::make_unique<ConvState>();
  const std::optional<Plan> plan = planConvolution(op, setup, 3, *state);
  if (!plan) return state;
  pickForwardAlgorithm(op, setup, forwardAlgorithms(queueOf(setup.queue), *plan, *state), plan->budget, *state);
  return fasterOf(std::move(state), &runConv, std::move(pointwise), setup);
}

// A ConvTranspose whose kernel equals its stride runs on kiln's kernel
// (tiled_conv_transpose.h) or on cuDNN, whichever measures faster.
std::unique_ptr<KernelState> prepareConvTranspose(const KernelSetup& setup) {
  std::unique_ptr<KernelState> tiled = prepareTiledConvTranspose(setup);
  auto state = std::make_unique<ConvState>();
  state->transposed = true;
  try {
    const std::optional<Plan> plan = planConvolution("ConvTranspose", setup, 3, *state);
    if (!plan) return state;
    pickBackwardDataAlgorithm(setup, queueOf(setup.queue), *state, plan->budget);
  } catch (const KernelUnsupported&) {
    if (tiled) return tiled;
    throw;
  }
  if (!tiled) return state;
  const double tiled_ms = timeStep(&runTiledConvTranspose, *tiled, setup);
  const double cudnn_ms = timeStep(&runConv, *state, setup);
  return tiled_ms < cudnn_ms ? std::move(tiled) : std::unique_ptr<KernelState>(std::move(state));
}

// --------------------------------------------------------------------- run

// Where cuDNN reads x: the op's input, or its padded copy, queued at the
// front of the workspace (`workspace` then moves past it).
const void* convolutionInput(const ConvState& state, const void* x, std::byte*& workspace, cudaStream_t stream) {
  if (!state.input_copy.enabled) return x;
  queuePlaneCopy(state.input_copy, x, workspace, stream);
  const void* padded = workspace;
  workspace += state.input_copy.buffer_bytes;
  return padded;
}

// Queues the convolution (with its copies and bias). run cannot report
// errors: a call that fails here leaves the output as it was.
void runConv(const KernelCall& call) {
  if (isDepthwiseConv(call.state)) return runDepthwiseConv(call);
  if (isPointwiseConv(call.state)) return runPointwiseConv(call);
  if (isTiledConvTranspose(call.state)) return runTiledConvTranspose(call);
  const auto& state = static_cast<const ConvState&>(*call.state);
  if (state.empty) return;
  const CudaQueue& queue = queueOf(call.queue);
  const float one = 1.0f;
  const float zero = 0.0f;
  auto* workspace = static_cast<std::byte*>(queue.workspace);
  const void* x = convolutionInput(state, call.inputs[0].data, workspace, queue.stream);
  const void* w = call.inputs[1].data;
  void* output = call.outputs[0].data;
  void* y = output;
  if (state.output_copy.enabled) {
    y = workspace;
    workspace += state.output_copy.buffer_bytes;
  }
  if (state.transposed) {
    cudnnConvolutionBackwardData(queue.cudnn, &one, state.w.get(), w, state.x.get(), x, state.conv.get(),
                                 state.backward_algo, workspace, state.algo_workspace_bytes, &zero, state.y.get(), y);
  } else {
    cudnnConvolutionForward(queue.cudnn, &one, state.x.get(), x, state.w.get(), w, state.conv.get(),
                            state.forward_algo, workspace, state.algo_workspace_bytes, &zero, state.y.get(), y);
  }
  if (state.output_copy.enabled) queuePlaneCopy(state.output_copy, y, output, queue.stream);
  if (state.has_bias && !state.bias_in_post_pass) {
    cudnnAddTensor(queue.cudnn, &one, state.bias.get(), call.inputs[2].data, &one, state.output.get(), output);
  }
}

// ----------------------------------------------------------- kiln.FusedConv

// The Conv above with its post-ops (passes/conv_fusion.h). Either one
// cudnnConvolutionBiasActivationForward does it all (`in_cudnn`), or the
// convolution runs as Conv's and, with `post_pass`, one elementwise pass
// over y applies the post-ops in place.
struct FusedConvState final : ConvState {
  bool adds_residual = false;  // the post-ops add input 3
  bool post_pass = false;
  ElementwisePass post_ops;  // over y, the bias (per channel, when there is one) and the residual
  bool in_cudnn = false;
  ActivationDescriptor activation;
  cudnnConvolutionFwdAlgo_t fused_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t fused_workspace_bytes = 0;
  DeviceBuffer zero_bias;  // the fused call's bias when the step has none
};

// The post_ops attribute ("Add,Relu") as its list of kinds.
std::vector<std::string> postOpKinds(const ParamMap& params) {
  std::vector<PostOp> list;
  try {
    list = readPostOps("kiln.FusedConv", params);
  } catch (const UsageError& e) {
    throw KernelUnsupported(e.what());
  }
  std::vector<std::string> kinds;
  for (const PostOp& post : list) kinds.emplace_back(post.add ? "Add" : fusedActivationName(post.activation));
  return kinds;
}

// The activation cudnnConvolutionBiasActivationForward applies, when it can
// do these post-ops: it computes act(conv + z + bias), z the residual.
std::optional<cudnnActivationMode_t> cudnnActivation(const std::vector<std::string>& kinds) {
  using Kinds = std::vector<std::string>;
  if (kinds.empty() || kinds == Kinds{"Add"}) return CUDNN_ACTIVATION_IDENTITY;
  if (kinds == Kinds{"Relu"} || kinds == Kinds{"Add", "Relu"}) return CUDNN_ACTIVATION_RELU;
  return std::nullopt;
}

void checkResidual(std::string_view op, const KernelSetup& setup) {
  if (setup.inputs.size() < 4 || setup.inputs[3].dtype == DType::kUndefined) {
    throw KernelUnsupported(fmt::format("{} on cuda: post_ops has an Add but the residual (input 3) is missing", op));
  }
  const TensorInfo& residual = setup.inputs[3];
  const TensorInfo& y = setup.outputs[0];
  if (residual.dtype != y.dtype || !residual.isStatic() || residual.numElements() != y.numElements()) {
    throw KernelUnsupported(fmt::format("{} on cuda: the residual (input 3) is {}; one element of the output's type "
                                        "per output element ({}) expected",
                                        op, typeString(residual), typeString(y)));
  }
}

// With post-ops, the bias joins them: one pass over y instead of two.
void planPostPass(std::string_view op, const KernelSetup& setup, FusedConvState& state) {
  if (!postOpProgram(op, setup.params)) return;
  const std::optional<ElementwiseProgram> program = postOpProgram(op, setup.params, state.has_bias);
  const TensorInfo& y = setup.outputs[0];
  const int64_t pixels = y.shape.size() > 2 ? static_cast<int64_t>(y.numElements()) / (y.shape[0] * y.shape[1]) : 1;
  const Indexing indexing = perChannelIndexing(y.shape[0], y.shape[1], pixels, state.has_bias, state.adds_residual,
                                               floatStorageOf(y.dtype).value_or(FloatStorage::kF32));
  state.post_ops.prepare(toDeviceProgram(op, *program), indexing, y.numElements(), queueOf(setup.queue));
  state.post_pass = true;
  state.bias_in_post_pass = state.has_bias;
}

// The whole step in one cuDNN call. Without a residual, z is y weighted 0
// (as onnxruntime passes it).
cudnnStatus_t queueCudnnFusion(const KernelCall& call, const FusedConvState& state) {
  const CudaQueue& queue = queueOf(call.queue);
  auto* workspace = static_cast<std::byte*>(queue.workspace);
  const void* x = convolutionInput(state, call.inputs[0].data, workspace, queue.stream);
  void* y = call.outputs[0].data;
  const void* z = state.adds_residual ? call.inputs[3].data : y;
  const void* bias = state.has_bias ? call.inputs[2].data : state.zero_bias.get();
  const float one = 1.0f;
  const float zero = 0.0f;
  return cudnnConvolutionBiasActivationForward(
      queue.cudnn, &one, state.x.get(), x, state.w.get(), call.inputs[1].data, state.conv.get(), state.fused_algo,
      workspace, state.fused_workspace_bytes, state.adds_residual ? &one : &zero, state.y.get(), z, state.bias.get(),
      bias, state.activation.get(), state.y.get(), y);
}

void queuePostPass(const KernelCall& call, const FusedConvState& state) {
  Pointers pointers;
  int next = 0;
  pointers.in[next++] = call.outputs[0].as<const float>();
  if (state.bias_in_post_pass) pointers.in[next++] = call.inputs[2].as<const float>();
  if (state.adds_residual) pointers.in[next++] = call.inputs[3].as<const float>();
  pointers.out = call.outputs[0].as<float>();
  state.post_ops.launch(pointers, queueOf(call.queue).stream);
}

void runFusedConv(const KernelCall& call) {
  if (isDepthwiseConv(call.state)) return runDepthwiseConv(call);
  if (isPointwiseConv(call.state)) return runPointwiseConv(call);
  const auto& state = static_cast<const FusedConvState&>(*call.state);
  if (state.empty) return;
  if (state.in_cudnn) {
    queueCudnnFusion(call, state);
    return;
  }
  runConv(call);
  if (state.post_pass) queuePostPass(call, state);
}

// Zeroed stand-ins for a kiln.FusedConv's tensors, and views of them as run
// gets its own, for prepare to time the step both ways.
struct StandIns {
  std::array<DeviceBuffer, 4> buffers;  // x (sized as cuDNN's x, which holds the op's), w, bias, residual
  DeviceBuffer y;
  std::array<TensorView, 4> inputs{};
  TensorView output{};
};

// Allocates the stand-ins of the tensors the step reads; false when one
// allocation fails.
bool allocateStandIns(const KernelSetup& setup, const FusedConvState& state, cudaStream_t stream, StandIns& stand_ins) {
  const std::array<bool, 4> read = {true, true, state.has_bias, state.adds_residual};
  const std::array<size_t, 4> bytes = {tensorBytes(state.x), filterBytes(state.w), tensorBytes(state.bias),
                                       tensorBytes(state.output)};
  for (size_t i = 0; i < read.size(); ++i) {
    if (!read[i]) continue;
    stand_ins.buffers[i] = DeviceBuffer(bytes[i], stream);
    if (!stand_ins.buffers[i]) return false;
    stand_ins.inputs[i] = viewOf(setup.inputs[i], static_cast<std::byte*>(stand_ins.buffers[i].get()));
  }
  stand_ins.y = DeviceBuffer(tensorBytes(state.output), stream);
  stand_ins.output = viewOf(setup.outputs[0], static_cast<std::byte*>(stand_ins.y.get()));
  return static_cast<bool>(stand_ins.y);
}

// Milliseconds per run of `queue_work` (work queued on `stream`), the mean
// of a few after a warm-up; infinity when the events fail.
template <typename QueueWork>
float meanMilliseconds(cudaStream_t stream, const QueueWork& queue_work) {
  constexpr int kRuns = 10;
  queue_work();
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  float total = std::numeric_limits<float>::infinity();
  if (cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < kRuns; ++i) queue_work();
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&total, start, stop) != cudaSuccess) {
      total = std::numeric_limits<float>::infinity();
    }
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  return total / kRuns;
}

// Moves the step into cudnnConvolutionBiasActivationForward (activation
// `mode`) when cuDNN runs it with one of `algorithms` (with IDENTITY, cuDNN
// allows only IMPLICIT_PRECOMP_GEMM) and that beats Conv's way plus the
// elementwise pass, both timed on zeroed stand-ins.
void fuseIntoCudnn(const KernelSetup& setup, const Plan& plan, std::span<const ForwardPerf> algorithms,
                   cudnnActivationMode_t mode, FusedConvState& state) {
  const CudaQueue& queue = queueOf(setup.queue);
  // Not propagating NaN, as onnxruntime's fused Conv asks.
  check(cudnnSetActivationDescriptor(state.activation.get(), mode, CUDNN_NOT_PROPAGATE_NAN, 0.0),
        "cudnnSetActivationDescriptor");
  if (!state.has_bias) state.zero_bias = DeviceBuffer(tensorBytes(state.bias), queue.stream);
  StandIns stand_ins;
  if ((!state.has_bias && !state.zero_bias) || !allocateStandIns(setup, state, queue.stream, stand_ins)) return;
  if (cudaStreamSynchronize(queue.stream) != cudaSuccess) return;
  const KernelCall call{stand_ins.inputs.data(), static_cast<uint32_t>(setup.inputs.size()), &stand_ins.output, 1,
                        &state, setup.queue};
  state.fused_workspace_bytes = plan.budget;
  const float separate_ms = meanMilliseconds(queue.stream, [&] { runFusedConv(call); });
  for (const ForwardPerf& perf : algorithms) {
    if (mode == CUDNN_ACTIVATION_IDENTITY && perf.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
    state.fused_algo = perf.algo;
    if (queueCudnnFusion(call, state) != CUDNN_STATUS_SUCCESS) continue;  // not fused with this algorithm
    state.in_cudnn = meanMilliseconds(queue.stream, [&] { queueCudnnFusion(call, state); }) <= separate_ms;
    break;
  }
  cudaStreamSynchronize(queue.stream);
  if (!state.in_cudnn) state.zero_bias = DeviceBuffer();
}

std::unique_ptr<KernelState> prepareFusedConv(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.FusedConv";
  if (std::unique_ptr<KernelState> depthwise = prepareDepthwiseConv(op, setup)) return depthwise;
  std::unique_ptr<KernelState> pointwise = preparePointwiseConv(op, setup);
  auto state = std::make_unique<FusedConvState>();
  const std::optional<Plan> plan = planConvolution(op, setup, 4, *state);
  const std::vector<std::string> kinds = postOpKinds(setup.params);
  state->adds_residual = std::ranges::find(kinds, "Add") != kinds.end();
  if (state->adds_residual) checkResidual(op, setup);
  planPostPass(op, setup, *state);
  if (!plan) return state;
  const std::vector<ForwardPerf> algorithms = forwardAlgorithms(queueOf(setup.queue), *plan, *state);
  pickForwardAlgorithm(op, setup, algorithms, plan->budget, *state);
  const std::optional<cudnnActivationMode_t> mode = cudnnActivation(kinds);
  if (mode && (state->has_bias || !kinds.empty())) fuseIntoCudnn(setup, *plan, algorithms, *mode, *state);
  return fasterOf(std::move(state), &runFusedConv, std::move(pointwise), setup);
}

}  // namespace

void registerCudaConvKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Conv", &prepareConv, &runConv});
  registry.add(KernelDef{"ConvTranspose", &prepareConvTranspose, &runConv});
  registry.add(KernelDef{"kiln.FusedConv", &prepareFusedConv, &runFusedConv});
}

}  // namespace kiln::cuda
