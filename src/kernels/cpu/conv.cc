// Conv and ConvTranspose (ONNX) on the CPU in f32, through oneDNN's
// convolution_forward and deconvolution_forward primitives, over 1, 2 or 3
// spatial axes; and kiln.NhwcConv and kiln.NhwcConvTranspose, the same on
// [N, H, W, C] activations (see src/passes/channels_last.h), where oneDNN's
// fastest kernels are. Conv in
// f16, bf16 and f64 runs on a direct loop (accumulating in double, rounding
// once per output element), which oneDNN's CPU build does not offer
// everywhere.
//
// prepare resolves the attributes (kernel_shape from the weights, strides,
// dilations, pads or auto_pad, group, ConvTranspose's output_padding and
// output_shape), checks the output shape against them, creates the primitive
// for exactly those shapes with plain (NC...) activations and, when the
// weights are a constant, reorders them once into the layout the primitive
// prefers (format_tag::any), kept in the state. Weights that arrive per call
// (a training step's variables) are reordered into that layout on every call,
// into the execution slot's own buffer: oneDNN has only its reference kernels
// for weights in the ONNX layout (10x slower on a small CNN's step). The ONNX
// layout is described to oneDNN with strides (ConvTranspose's [C, M/group,
// k...] is oneDNN's [group, M/group, C/group, k...] with the first two axes
// swapped).
//
// An output of a few positions (1-D audio front ends, squeeze-excite blocks)
// runs on small_conv.h's path instead, the primitive its fallback.
//
// Concurrency and allocation: execution slots (see onednn_support.h), made at
// prepare; run claims one, points its memory objects at the call's tensors,
// executes and releases it. dnnl_primitive_execute itself allocates a few
// small objects per call (measured in tests/kernels/allocation_test.cc).
#include <dnnl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/onednn_support.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/patch_conv_transpose.h"
#include "kernels/cpu/small_conv.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/cpu/window_attributes.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using onednn::denseStrides;
using onednn::Dims;
using onednn::ExecutionSlot;
using onednn::plainDesc;
using Ints = std::vector<int64_t>;

constexpr const char* kKernel = "Conv/ConvTranspose";

struct ConvState final : KernelState {
  bool empty = false;  // nothing to compute (a batch of 0)
  dnnl::primitive primitive;
  bool weights_packed = false;
  dnnl::memory packed_weights;
  // Weights per call, reordered into the primitive's layout in each call
  // (null when the primitive takes them as they are).
  std::optional<dnnl::reorder> weights_reorder;
  bool has_bias = false;
  // A patch ConvTranspose's bias, repeated along the product's columns
  // (patch_conv_transpose.h): the slots' bias memory points here for good.
  std::vector<float> bias_row;
  // A channels-last ConvTranspose adds its bias itself, after the primitive
  // (see addChannelBias); `pixels` output positions of `out_channels` each.
  bool bias_after = false;
  int64_t pixels = 0;
  int64_t out_channels = 0;
  int residual_post_op = -1;  // the index of the fused residual Add among the post-ops
  // A slot's weights point at the packed weights for good, or at W per call.
  onednn::ExecutionSlots slots;
  // Conv in another float type: the direct loop, no oneDNN primitive.
  DType loop_type = DType::kUndefined;
  ConvGeometry geometry;
  // Few output positions: small_conv.h's path, the primitive its fallback.
  SmallConvPtr small;
};

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// ----------------------------------------------------------------- attributes

struct ConvShape {
  bool transposed = false;
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t group = 1;
  size_t spatial = 0;
  Ints in;  // spatial sizes
  Ints kernel;
  Ints strides;
  Ints dilations;
  Ints pad_begin;
  Ints pad_end;  // as oneDNN takes it (ConvTranspose: minus output_padding)
  Ints out;
};

enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower };

AutoPad autoPad(std::string_view op, const ParamMap& params) {
  const std::string text = params.getString("auto_pad", "NOTSET");
  if (text == "NOTSET" || text.empty()) return AutoPad::kNotSet;
  if (text == "VALID") return AutoPad::kValid;
  if (text == "SAME_UPPER") return AutoPad::kSameUpper;
  if (text == "SAME_LOWER") return AutoPad::kSameLower;
  throw UsageError(fmt::format("{}: auto_pad is '{}', not NOTSET, VALID, SAME_UPPER or SAME_LOWER", op, text));
}

void checkInputs(std::string_view op, const KernelSetup& setup) {
  // A fused residual Add (post_ops, see src/passes/conv_fusion.h) is input 3.
  const size_t max_inputs = setup.params.has("post_ops") ? 4 : 3;
  if (setup.inputs.size() < 2 || setup.inputs.size() > max_inputs) {
    throw UsageError(fmt::format("{}: expects 2 to {} inputs, got {}", op, max_inputs, setup.inputs.size()));
  }
  if (setup.outputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (input.dtype == DType::kUndefined && i == 2) continue;
    if (input.dtype != DType::kF32) {
      throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32{}); input {} is {}", op,
                                   dtypeName(input.dtype), op == "Conv" ? "; f16, bf16, f64 of one type" : "", i,
                                   typeString(input)));
    }
    if (!input.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
  const Ints& x = setup.inputs[0].shape;
  const Ints& w = setup.inputs[1].shape;
  if (x.size() < 3 || x.size() > 5) {
    throw UsageError(fmt::format("{}: needs an input [N, C, spatial...] with 1 to 3 spatial axes, got {}", op,
                                 typeString(setup.inputs[0])));
  }
  if (w.size() != x.size()) {
    throw UsageError(fmt::format("{}: the weights {} must have the rank of the input {}", op,
                                 typeString(setup.inputs[1]), typeString(setup.inputs[0])));
  }
}

void checkOutput(std::string_view op, const KernelSetup& setup, const ConvShape& s) {
  Ints shape{s.batch, s.out_channels};
  shape.insert(shape.end(), s.out.begin(), s.out.end());
  const TensorInfo expected{DType::kF32, shape};
  if (setup.outputs[0] != expected) {
    throw UsageError(
        fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]), typeString(expected)));
  }
}

void checkBias(std::string_view op, const KernelSetup& setup, int64_t channels) {
  if (setup.inputs.size() < 3 || setup.inputs[2].dtype == DType::kUndefined) return;
  if (setup.inputs[2].shape != Ints{channels}) {
    throw UsageError(fmt::format("{}: the bias {} must be [{}], one value per output channel", op,
                                 typeString(setup.inputs[2]), channels));
  }
}

// Kernel shape from the weights, checked against kernel_shape when present.
Ints kernelShape(std::string_view op, const KernelSetup& setup, size_t spatial) {
  const Ints& w = setup.inputs[1].shape;
  Ints kernel(w.begin() + 2, w.end());
  if (setup.params.has("kernel_shape")) {
    const Ints given = setup.params.getInts("kernel_shape", {});
    if (given != kernel) {
      throw UsageError(fmt::format("{}: kernel_shape [{}] differs from the weights' spatial sizes [{}]", op,
                                   fmt::join(given, ", "), fmt::join(kernel, ", ")));
    }
  }
  for (size_t i = 0; i < spatial; ++i) {
    if (kernel[i] < 1) throw UsageError(fmt::format("{}: the weights {} have an empty kernel", op, typeString(setup.inputs[1])));
  }
  return kernel;
}

// A 2-D convolution over [H, 1] with a [kh, 1] kernel (a 1-D convolution
// exported as 2-D, the way TensorFlow and JAX write Conv1D) is described to
// oneDNN as one over [1, H] with a [1, kh] kernel. Both have the same bytes
// in every layout kiln uses (NCHW, NHWC, nChw16c, and the weights), but
// oneDNN's brgemm convolution blocks along the output width: with a width of
// 1 it multiplies rows of one, at less than half the speed of the same
// convolution along W (512 channels over 512 positions, kernel 5: 7.5 ms
// against 3.1 ms for the GEMM of the same size, on 2 cores).
void preferWidth(ConvShape& s) {
  if (s.spatial != 2 || s.in[1] != 1 || s.out[1] != 1 || s.kernel[1] != 1 || s.in[0] == 1) return;
  if (s.pad_begin[1] != 0 || s.pad_end[1] != 0) return;
  for (Ints* axis : {&s.in, &s.out, &s.kernel, &s.strides, &s.dilations, &s.pad_begin, &s.pad_end}) {
    std::swap((*axis)[0], (*axis)[1]);
  }
}

ConvShape convShape(const KernelSetup& setup) {
  constexpr std::string_view op = "Conv";
  checkInputs(op, setup);
  const Ints& x = setup.inputs[0].shape;
  const Ints& w = setup.inputs[1].shape;
  ConvShape s;
  s.spatial = x.size() - 2;
  s.batch = x[0];
  s.in_channels = x[1];
  s.out_channels = w[0];
  s.group = setup.params.getInt("group", 1);
  if (s.group < 1) throw UsageError(fmt::format("Conv: group must be positive, got {}", s.group));
  if (s.in_channels != w[1] * s.group) {
    throw UsageError(fmt::format("Conv: the input {} has {} channels but the weights {} take {} ({} per group x {} groups)",
                                 typeString(setup.inputs[0]), s.in_channels, typeString(setup.inputs[1]),
                                 w[1] * s.group, w[1], s.group));
  }
  if (s.out_channels % s.group != 0) {
    throw UsageError(fmt::format("Conv: the {} output channels of the weights {} do not divide into {} groups",
                                 s.out_channels, typeString(setup.inputs[1]), s.group));
  }
  if (w[1] == 0 || s.out_channels == 0) {
    throw UsageError(fmt::format("Conv: no kernel for empty weights {}", typeString(setup.inputs[1])));
  }
  checkBias(op, setup, s.out_channels);
  const size_t n = s.spatial;
  s.in.assign(x.begin() + 2, x.end());
  s.kernel = kernelShape(op, setup, n);
  s.strides = sizedInts(op, setup.params, "strides", n, 1, Ints(n, 1));
  s.dilations = sizedInts(op, setup.params, "dilations", n, 1, Ints(n, 1));
  Ints pads = sizedInts(op, setup.params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const AutoPad auto_pad = autoPad(op, setup.params);
  s.pad_begin.resize(n);
  s.pad_end.resize(n);
  s.out.resize(n);
  // The window arithmetic, checked: kernel, dilations, strides and pads come
  // from the package.
  auto must = [&](std::optional<int64_t> value, size_t axis) {
    if (!value) throw UsageError(fmt::format("{}: spatial axis {}: the window arithmetic overflows", op, axis));
    return *value;
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t extent = must(checkedAdd(must(checkedMultiply(s.kernel[i] - 1, s.dilations[i]), i), 1), i);
    const int64_t stride = s.strides[i];
    if (auto_pad == AutoPad::kSameUpper || auto_pad == AutoPad::kSameLower) {
      s.out[i] = must(checkedAdd(s.in[i], stride - 1), i) / stride;
      const int64_t reach = must(checkedAdd(must(checkedMultiply(s.out[i] - 1, stride), i), extent), i);
      const int64_t total = std::max<int64_t>(0, must(checkedSubtract(reach, s.in[i]), i));
      s.pad_begin[i] = auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      s.pad_end[i] = total - s.pad_begin[i];
    } else {
      s.pad_begin[i] = auto_pad == AutoPad::kValid ? 0 : pads[i];
      s.pad_end[i] = auto_pad == AutoPad::kValid ? 0 : pads[i + n];
      const int64_t padded = must(checkedAdd(must(checkedAdd(s.in[i], s.pad_begin[i]), i), s.pad_end[i]), i);
      const int64_t room = must(checkedSubtract(padded, extent), i);
      if (room < 0) {
        throw UsageError(fmt::format(
            "Conv: spatial axis {}: the kernel spans {} elements (dilations included) but the padded input has {}", i,
            extent, padded));
      }
      s.out[i] = room / stride + 1;
    }
  }
  checkOutput(op, setup, s);
  preferWidth(s);
  return s;
}

ConvShape convTransposeShape(const KernelSetup& setup) {
  constexpr std::string_view op = "ConvTranspose";
  checkInputs(op, setup);
  const Ints& x = setup.inputs[0].shape;
  const Ints& w = setup.inputs[1].shape;
  ConvShape s;
  s.transposed = true;
  s.spatial = x.size() - 2;
  s.batch = x[0];
  s.in_channels = x[1];
  s.group = setup.params.getInt("group", 1);
  if (s.group < 1) throw UsageError(fmt::format("ConvTranspose: group must be positive, got {}", s.group));
  if (w[0] != s.in_channels) {
    throw UsageError(fmt::format("ConvTranspose: the input {} has {} channels but the weights {} take {}",
                                 typeString(setup.inputs[0]), s.in_channels, typeString(setup.inputs[1]), w[0]));
  }
  if (s.in_channels % s.group != 0) {
    throw UsageError(
        fmt::format("ConvTranspose: the {} input channels do not divide into {} groups", s.in_channels, s.group));
  }
  s.out_channels = w[1] * s.group;
  if (s.in_channels == 0 || s.out_channels == 0) {
    throw UsageError(fmt::format("ConvTranspose: no kernel for empty weights {}", typeString(setup.inputs[1])));
  }
  checkBias(op, setup, s.out_channels);
  const size_t n = s.spatial;
  s.in.assign(x.begin() + 2, x.end());
  s.kernel = kernelShape(op, setup, n);
  s.strides = sizedInts(op, setup.params, "strides", n, 1, Ints(n, 1));
  s.dilations = sizedInts(op, setup.params, "dilations", n, 1, Ints(n, 1));
  const Ints pads = sizedInts(op, setup.params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const Ints output_padding = sizedInts(op, setup.params, "output_padding", n, 0, Ints(n, 0));
  const AutoPad auto_pad = autoPad(op, setup.params);
  Ints output_shape;
  if (setup.params.has("output_shape")) {
    output_shape = setup.params.getInts("output_shape", {});
    if (output_shape.size() == n + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
    if (output_shape.size() != n) {
      throw UsageError(fmt::format("ConvTranspose: output_shape [{}] must have one size per spatial axis ({})",
                                   fmt::join(output_shape, ", "), n));
    }
  }
  s.pad_begin.resize(n);
  s.pad_end.resize(n);
  s.out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t extent = (s.kernel[i] - 1) * s.dilations[i] + 1;
    const int64_t full = s.strides[i] * (s.in[i] - 1) + output_padding[i] + extent;  // before any padding
    int64_t begin = 0;
    int64_t end = 0;
    if (!output_shape.empty() || auto_pad == AutoPad::kSameUpper || auto_pad == AutoPad::kSameLower) {
      s.out[i] = output_shape.empty() ? s.in[i] * s.strides[i] : output_shape[i];
      // The padding that takes `full` to the output size. It may be negative
      // when output_shape asks for more than `full`: ONNX (the reference
      // implementation) then splits it with floor division as for positive
      // totals, so the extra elements land at the end like output_padding.
      const int64_t total = full - s.out[i];
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor(total / 2)
      // ONNX: SAME_UPPER puts the smaller half first; otherwise the larger.
      begin = auto_pad == AutoPad::kSameUpper ? half : total - half;
      end = total - begin;
      if (begin < 0) {
        throw UsageError(fmt::format("ConvTranspose: spatial axis {}: output size {} is larger than the {} the "
                                     "input, kernel and strides give by more than the end padding can take",
                                     i, s.out[i], full));
      }
    } else {
      begin = auto_pad == AutoPad::kValid ? 0 : pads[i];
      end = auto_pad == AutoPad::kValid ? 0 : pads[i + n];
      s.out[i] = full - begin - end;
      if (s.out[i] < 1) {
        throw UsageError(fmt::format("ConvTranspose: spatial axis {}: the output size {} is not positive", i, s.out[i]));
      }
    }
    s.pad_begin[i] = begin;
    s.pad_end[i] = end - output_padding[i];  // oneDNN: out = stride * (in - 1) + extent - l - r
  }
  checkOutput(op, setup, s);
  return s;
}

// ------------------------------------------------------------------ oneDNN

// oneDNN's weights dims ([group,] out/group, in/group, k...) and the strides
// of the ONNX layout in them.
void weightsLayout(const ConvShape& s, Dims& dims, Dims& strides) {
  const int64_t og = s.out_channels / s.group;
  const int64_t ig = s.in_channels / s.group;
  int64_t k = 1;
  for (int64_t v : s.kernel) k *= v;
  Dims spatial_strides = denseStrides(Dims(s.kernel.begin(), s.kernel.end()));
  int64_t g_stride = 0;
  int64_t o_stride = 0;
  int64_t i_stride = 0;
  if (!s.transposed) {  // ONNX [M, C/group, k...]: M = g * og + o
    i_stride = k;
    o_stride = ig * k;
    g_stride = og * ig * k;
  } else {  // ONNX [C, M/group, k...]: C = g * ig + i
    o_stride = k;
    i_stride = og * k;
    g_stride = ig * og * k;
  }
  dims.clear();
  strides.clear();
  if (s.group > 1) {
    dims.push_back(s.group);
    strides.push_back(g_stride);
  }
  dims.push_back(og);
  strides.push_back(o_stride);
  dims.push_back(ig);
  strides.push_back(i_stride);
  for (size_t d = 0; d < s.spatial; ++d) {
    dims.push_back(s.kernel[d]);
    strides.push_back(spatial_strides[d]);
  }
}

// How the activations are laid out in memory: as ONNX says, or as the
// kiln-domain forms say (channels_last.h).
enum class Activations { kPlain, kNhwc, kBlocked16 };

dnnl::memory::desc activationDesc(const Dims& dims, Activations layout) {
  using tag = dnnl::memory::format_tag;
  switch (layout) {
    case Activations::kNhwc: return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag::nhwc);
    case Activations::kBlocked16: return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag::nChw16c);
    case Activations::kPlain: break;
  }
  return plainDesc(dims);
}

void checkResidual(std::string_view op, const KernelSetup& setup, const ConvState& state) {
  if (state.residual_post_op >= 0 &&
      (setup.inputs.size() < 4 || setup.inputs[3].dtype != DType::kF32 ||
       setup.inputs[3].numElements() != setup.outputs[0].numElements())) {
    throw UsageError(fmt::format("{}: the fused Add needs input 3 of the output's type {}", op,
                                 typeString(setup.outputs[0])));
  }
}

// A ConvTranspose whose 2-D kernel equals its stride, without pads,
// dilation, output padding or groups: its patches do not overlap.
bool isPatchConvTranspose(const ConvShape& s) {
  if (!s.transposed || s.spatial != 2 || s.group != 1 || s.batch == 0) return false;
  for (size_t d = 0; d < 2; ++d) {
    if (s.kernel[d] != s.strides[d] || s.dilations[d] != 1 || s.pad_begin[d] != 0 || s.pad_end[d] != 0 ||
        s.out[d] != s.in[d] * s.kernel[d]) {
      return false;
    }
  }
  return true;
}

// kiln.NhwcConvTranspose as one matmul (patch_conv_transpose.h) when its
// patches do not overlap and its weights and bias are constants; nullptr
// otherwise, for the deconvolution primitive.
std::unique_ptr<ConvState> makePatchState(std::string_view op, const KernelSetup& setup, const ConvShape& s) {
  const std::byte* w = constantInput(setup, 1);
  const bool has_bias = setup.inputs.size() >= 3 && setup.inputs[2].dtype != DType::kUndefined;
  const std::byte* bias = has_bias ? constantInput(setup, 2) : nullptr;
  if (!isPatchConvTranspose(s) || w == nullptr || (has_bias && bias == nullptr)) return nullptr;
  const PatchGeometry g{s.batch, s.in[0], s.in[1], s.in_channels, s.out_channels, s.kernel[0], s.kernel[1]};
  auto state = std::make_unique<ConvState>();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_post_ops(onednn::fusedPostOps(op, setup.params, patchOutputDesc(g), state->residual_post_op));
  checkResidual(op, setup, *state);
  PatchConvTranspose patch;
  try {
    patch = preparePatchConvTranspose(g, reinterpret_cast<const float*>(w), reinterpret_cast<const float*>(bias),
                                      attr);
  } catch (const dnnl::error&) {
    return nullptr;
  }
  const dnnl::engine& engine = onednn::cpuEngine();
  state->primitive = patch.primitive;
  state->weights_packed = true;
  state->packed_weights = patch.packed_weights;
  state->has_bias = has_bias;
  state->bias_row = std::move(patch.bias_row);
  state->slots.create(engine, patch.scratchpad);
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    ExecutionSlot& slot = state->slots[i];
    slot.src = dnnl::memory(patch.src, engine, DNNL_MEMORY_NONE);
    slot.weights = dnnl::memory(patch.weights, engine, state->packed_weights.get_data_handle());
    slot.dst = dnnl::memory(patch.dst, engine, DNNL_MEMORY_NONE);
    if (has_bias) slot.bias = dnnl::memory(patch.bias, engine, state->bias_row.data());
    if (state->residual_post_op >= 0) slot.binary = dnnl::memory(patch.dst, engine, DNNL_MEMORY_NONE);
  }
  return state;
}

std::unique_ptr<KernelState> makeState(std::string_view op, const KernelSetup& setup, const ConvShape& s,
                                       Activations layout = Activations::kPlain) {
  auto state = std::make_unique<ConvState>();
  if (s.batch == 0) {
    state->empty = true;
    return state;
  }
  const dnnl::engine& engine = onednn::cpuEngine();
  Dims src_dims{s.batch, s.in_channels};
  src_dims.insert(src_dims.end(), s.in.begin(), s.in.end());
  Dims dst_dims{s.batch, s.out_channels};
  dst_dims.insert(dst_dims.end(), s.out.begin(), s.out.end());
  Dims w_dims;
  Dims w_strides;
  weightsLayout(s, w_dims, w_strides);
  const dnnl::memory::desc src = activationDesc(src_dims, layout);
  const dnnl::memory::desc dst = activationDesc(dst_dims, layout);
  const dnnl::memory::desc weights_plain = onednn::f32Desc(w_dims, w_strides);
  const std::byte* w_constant = constantInput(setup, 1);
  const dnnl::memory::desc weights(w_dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
  state->has_bias = setup.inputs.size() >= 3 && setup.inputs[2].dtype != DType::kUndefined;
  // oneDNN 2.6 runs a channels-last deconvolution several times slower with
  // a bias than without (PP-OCR's detector's 2x2 upsampling: 7.8 against
  // 2.8 ms): the bias is added after it instead.
  state->bias_after = state->has_bias && s.transposed && layout == Activations::kNhwc;
  state->pixels = s.batch;
  for (int64_t size : s.out) state->pixels *= size;
  state->out_channels = s.out_channels;
  const bool primitive_bias = state->has_bias && !state->bias_after;
  const dnnl::memory::desc bias = plainDesc({s.out_channels});
  Dims strides(s.strides.begin(), s.strides.end());
  Dims dilations(s.spatial);
  for (size_t i = 0; i < s.spatial; ++i) dilations[i] = s.dilations[i] - 1;  // oneDNN counts the gaps
  Dims pad_l(s.pad_begin.begin(), s.pad_begin.end());
  Dims pad_r(s.pad_end.begin(), s.pad_end.end());

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_post_ops(onednn::fusedPostOps(op, setup.params, dst, state->residual_post_op));
  // (In NCHW terms for kiln.NhwcConv, whose residual input stays [N, H, W, C].)
  checkResidual(op, setup, *state);
  dnnl::memory::desc pd_weights;
  dnnl::memory::desc pd_scratchpad;
  dnnl::memory::desc pd_src;
  dnnl::memory::desc pd_dst;
  try {
    if (!s.transposed) {
      auto describe = [&](dnnl::algorithm algorithm) {
        return state->has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, algorithm, src,
                                                                 weights, bias, dst, strides, dilations, pad_l, pad_r)
                               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, algorithm, src,
                                                                 weights, dst, strides, dilations, pad_l, pad_r);
      };
      // Blocked activations are there for Winograd (half the multiplies of
      // a direct 3x3); where oneDNN has none for the shape, direct.
      std::optional<dnnl::convolution_forward::primitive_desc> winograd;
      if (layout == Activations::kBlocked16) {
        try {
          winograd.emplace(describe(dnnl::algorithm::convolution_winograd), attr, engine);
        } catch (const dnnl::error&) {
        }
      }
      const dnnl::convolution_forward::primitive_desc pd =
          winograd ? *winograd
                   : dnnl::convolution_forward::primitive_desc(describe(dnnl::algorithm::convolution_direct), attr, engine);
      state->primitive = dnnl::convolution_forward(pd);
      pd_weights = pd.weights_desc();
      pd_scratchpad = pd.scratchpad_desc();
      pd_src = pd.src_desc();
      pd_dst = pd.dst_desc();
    } else {
      const auto desc = primitive_bias
                            ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                                dnnl::algorithm::deconvolution_direct, src, weights,
                                                                bias, dst, strides, dilations, pad_l, pad_r)
                            : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                                dnnl::algorithm::deconvolution_direct, src, weights,
                                                                dst, strides, dilations, pad_l, pad_r);
      const dnnl::deconvolution_forward::primitive_desc pd(desc, attr, engine);
      state->primitive = dnnl::deconvolution_forward(pd);
      pd_weights = pd.weights_desc();
      pd_scratchpad = pd.scratchpad_desc();
      pd_src = pd.src_desc();
      pd_dst = pd.dst_desc();
    }
  } catch (const dnnl::error& e) {
    throw UsageError(fmt::format("{}: oneDNN has no kernel for input {}, weights {}, strides [{}], dilations [{}], "
                                 "pads [{}] + [{}] ({})",
                                 op, typeString(setup.inputs[0]), typeString(setup.inputs[1]),
                                 fmt::join(s.strides, ", "), fmt::join(s.dilations, ", "), fmt::join(s.pad_begin, ", "),
                                 fmt::join(s.pad_end, ", "), e.what()));
  }

  if (w_constant != nullptr) {
    // Reorder (or copy) the constant weights once.
    state->packed_weights = onednn::reorderConstant(weights_plain, w_constant, pd_weights);
    state->weights_packed = true;
  } else if (pd_weights != weights_plain) {
    state->weights_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, weights_plain, engine, pd_weights));
  }
  state->slots.create(engine, pd_scratchpad);
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    ExecutionSlot& slot = state->slots[i];
    slot.src = dnnl::memory(pd_src, engine, DNNL_MEMORY_NONE);
    if (state->weights_reorder) {
      // Each slot reorders into a buffer of its own (allocated here, once).
      slot.weights_plain = dnnl::memory(weights_plain, engine, DNNL_MEMORY_NONE);
      slot.weights = dnnl::memory(pd_weights, engine);
    } else {
      slot.weights = dnnl::memory(pd_weights, engine,
                                  state->weights_packed ? state->packed_weights.get_data_handle() : DNNL_MEMORY_NONE);
    }
    slot.dst = dnnl::memory(pd_dst, engine, DNNL_MEMORY_NONE);
    if (primitive_bias) slot.bias = dnnl::memory(bias, engine, DNNL_MEMORY_NONE);
    if (state->residual_post_op >= 0) slot.binary = dnnl::memory(dst, engine, DNNL_MEMORY_NONE);
  }
  if (!s.transposed && layout != Activations::kBlocked16) {
    state->small = prepareSmallConv(setup, layout == Activations::kNhwc);
  }
  return state;
}

// ------------------------------------------------------ f16, bf16, f64 loop

bool isLoopType(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64; }

// Conv(X, W, B?) in one of the loop types, for every attribute Conv has.
std::unique_ptr<KernelState> prepareLoopConv(const KernelSetup& setup) {
  constexpr std::string_view op = "Conv";
  const DType dtype = setup.inputs[0].dtype;
  if (setup.inputs.size() < 2 || setup.inputs.size() > 3 || setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 2 or 3 inputs and 1 output", op));
  }
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (input.dtype == DType::kUndefined && i == 2) continue;
    if (input.dtype != dtype || !input.isStatic()) {
      throw UsageError(fmt::format("{}: input {} is {}; every input must be static and {}", op, i, typeString(input),
                                   dtypeName(dtype)));
    }
  }
  if (setup.outputs[0].dtype != dtype) {
    throw UsageError(fmt::format("{}: the output {} must be {}", op, typeString(setup.outputs[0]), dtypeName(dtype)));
  }
  auto state = std::make_unique<ConvState>();
  state->loop_type = dtype;
  state->geometry = convGeometry(op, setup.params, setup.inputs[0], setup.inputs[1], setup.outputs[0]);
  state->has_bias = setup.inputs.size() == 3 && setup.inputs[2].dtype != DType::kUndefined;
  if (state->has_bias) checkBias(op, setup, state->geometry.out_channels);
  return state;
}

void runLoopConv(const ConvState& state, const KernelCall& call) {
  const ConvGeometry& g = state.geometry;
  const DType t = state.loop_type;
  const std::byte* x = call.inputs[0].data;
  const std::byte* w = call.inputs[1].data;
  const std::byte* bias = state.has_bias ? call.inputs[2].data : nullptr;
  std::byte* y = call.outputs[0].data;
  const int64_t group_in = g.in_channels / g.group;
  const int64_t group_out = g.out_channels / g.group;
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t m = 0; m < g.out_channels; ++m) {
      const int64_t first_channel = (m / group_out) * group_in;
      int64_t position = 0;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++position) {
            double sum = bias ? loadAsDouble(bias, t, m) : 0.0;
            for (int64_t c = 0; c < group_in; ++c) {
              const int64_t x_plane = (n * g.in_channels + first_channel + c) * g.inPlane();
              const int64_t w_kernel = (m * group_in + c) * g.kernelSize();
              for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
                const int64_t id = od * g.strides[0] - g.pad_begin[0] + kd * g.dilations[0];
                if (id < 0 || id >= g.in[0]) continue;
                for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
                  const int64_t ih = oh * g.strides[1] - g.pad_begin[1] + kh * g.dilations[1];
                  if (ih < 0 || ih >= g.in[1]) continue;
                  for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                    const int64_t iw = ow * g.strides[2] - g.pad_begin[2] + kw * g.dilations[2];
                    if (iw < 0 || iw >= g.in[2]) continue;
                    const int64_t xi = x_plane + (id * g.in[1] + ih) * g.in[2] + iw;
                    const int64_t wi = w_kernel + (kd * g.kernel[1] + kh) * g.kernel[2] + kw;
                    sum += loadAsDouble(x, t, xi) * loadAsDouble(w, t, wi);
                  }
                }
              }
            }
            storeFloat(y, t, (n * g.out_channels + m) * g.outPlane() + position, sum);
          }
        }
      }
    }
  }
}

// y[p, c] += bias[c] for channels-last y of `pixels` rows: in runs of whole
// rows against the bias repeated side by side (a thread's own tile), so that
// rows of a few channels still make long vector loops.
void addChannelBias(float* y, int64_t pixels, int64_t channels, const float* bias) {
  constexpr int64_t kTileFloats = 1024;
  const vec::BinaryFn add = vec::vectorKernels().binaryFn(vec::Binary::kAdd, vec::Operands::kBoth);
  if (channels > kTileFloats / 2) {
    parallelForItems(pixels, channels, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) add(y + p * channels, bias, y + p * channels, channels);
    });
    return;
  }
  const int64_t rows = kTileFloats / channels;
  parallelForItems((pixels + rows - 1) / rows, rows * channels, [&](int64_t begin, int64_t end) {
    alignas(64) float tile[kTileFloats];
    for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + channels, tile + r * channels);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      float* at = y + chunk * rows * channels;
      const int64_t count = std::min(rows, pixels - chunk * rows) * channels;
      add(at, tile, at, count);
    }
  });
}

void runConv(const KernelCall& call) {
  const auto& state = static_cast<const ConvState&>(*call.state);
  if (state.empty) return;
  if (state.loop_type != DType::kUndefined) {
    runLoopConv(state, call);
    return;
  }
  if (state.small && runSmallConv(*state.small, call)) return;
  ExecutionSlot& slot = state.slots.claim();
  dnnl_exec_arg_t args[6];
  int count = 0;
  onednn::setHandle(kKernel, slot.src, call.inputs[0].data);
  args[count++] = {DNNL_ARG_SRC, slot.src.get()};
  if (state.weights_reorder) {
    onednn::setHandle(kKernel, slot.weights_plain, call.inputs[1].data);
    onednn::reorderWeights(kKernel, *state.weights_reorder, slot);
  } else if (!state.weights_packed) {
    onednn::setHandle(kKernel, slot.weights, call.inputs[1].data);
  }
  args[count++] = {DNNL_ARG_WEIGHTS, slot.weights.get()};
  if (state.has_bias && !state.bias_after) {
    if (state.bias_row.empty()) onednn::setHandle(kKernel, slot.bias, call.inputs[2].data);
    args[count++] = {DNNL_ARG_BIAS, slot.bias.get()};
  }
  onednn::setHandle(kKernel, slot.dst, call.outputs[0].data);
  args[count++] = {DNNL_ARG_DST, slot.dst.get()};
  if (state.residual_post_op >= 0) {
    onednn::setHandle(kKernel, slot.binary, call.inputs[3].data);
    args[count++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(state.residual_post_op) | DNNL_ARG_SRC_1, slot.binary.get()};
  }
  onednn::execute(kKernel, state.primitive, state.slots, slot, args, count);
  if (state.bias_after) {
    addChannelBias(call.outputs[0].as<float>(), state.pixels, state.out_channels, call.inputs[2].as<const float>());
  }
}

std::unique_ptr<KernelState> prepareConv(const KernelSetup& setup) {
  if (!setup.inputs.empty() && isLoopType(setup.inputs[0].dtype)) return prepareLoopConv(setup);
  return makeState("Conv", setup, convShape(setup));
}

std::unique_ptr<KernelState> prepareConvTranspose(const KernelSetup& setup) {
  return makeState("ConvTranspose", setup, convTransposeShape(setup));
}

// kiln.NhwcConv: Conv with [N, H, W, C] activations.
std::unique_ptr<KernelState> prepareNhwcConv(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcConv", setup);
  return makeState("kiln.NhwcConv", nchw.get(), convShape(nchw.get()), Activations::kNhwc);
}

// kiln.NhwcConvTranspose: ConvTranspose with [N, H, W, C] activations, where
// oneDNN has brgemm kernels (in NCHW it computes a GEMM and scatters the
// columns back: 8 ms against 0.5 ms for a 2x2 upsampling of 24 channels
// over 160x160).
std::unique_ptr<KernelState> prepareNhwcConvTranspose(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcConvTranspose", setup);
  const ConvShape shape = convTransposeShape(nchw.get());
  if (auto patch = makePatchState("kiln.NhwcConvTranspose", nchw.get(), shape)) return patch;
  return makeState("kiln.NhwcConvTranspose", nchw.get(), shape, Activations::kNhwc);
}

// kiln.Blocked16Conv: Conv with nChw16c activations, by Winograd where
// oneDNN has it for the shape (src/passes/blocked_conv.h).
std::unique_ptr<KernelState> prepareBlocked16Conv(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.Blocked16Conv", setup, ActivationLayout::kBlocked16);
  return makeState("kiln.Blocked16Conv", nchw.get(), convShape(nchw.get()), Activations::kBlocked16);
}

}  // namespace

void registerConvKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Conv", &prepareConv, &runConv});
  // The NCHW Conv with fused post-ops of the cuda target (conv_fusion.h),
  // when it runs as a host step: the same kernel, post-ops from its params.
  registry.add(KernelDef{"kiln.FusedConv", &prepareConv, &runConv});
  registry.add(KernelDef{"kiln.NhwcConv", &prepareNhwcConv, &runConv});
  registry.add(KernelDef{"kiln.Blocked16Conv", &prepareBlocked16Conv, &runConv});
  registry.add(KernelDef{"ConvTranspose", &prepareConvTranspose, &runConv});
  registry.add(KernelDef{"kiln.NhwcConvTranspose", &prepareNhwcConvTranspose, &runConv});
}

}  // namespace kiln
