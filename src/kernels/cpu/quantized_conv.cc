// kiln.NhwcQLinearConv: QLinearConv (ONNX) on channels-last 8-bit
// activations, through oneDNN's int8 convolution (VNNI's vpdpbusd on CPUs
// that have it: four 8-bit products per lane and instruction, into i32).
//
// The channels-last pass (src/passes/channels_last.h) writes it for a
// QLinearConv over 2-D images whose weights, scales, zero points and bias are
// constants, the weights i8 with zero points of 0 (oneDNN takes no weight
// zero point for convolutions), and the activations' scales and zero points
// one value each. onnxruntime's QDQ quantizer writes exactly that (symmetric
// per-channel i8 weights, u8 or i8 activations), and so does the QDQ fusion
// (src/passes/qdq_fusion.h).
//
//   acc[m]  = sum over the window of (x - x_zero) * w[m]  +  B[m]        (i32)
//   y[m]    = saturate(round(acc[m] * x_scale * w_scale[m] / y_scale) + y_zero)
//
// oneDNN applies the same arithmetic: the source zero point as an exact i32
// compensation, the bias before the output scale (oneDNN 2.x), then the
// scale as one f32 multiplier per channel (formed in f32 as onnxruntime's
// kernel forms it, (x_scale * w_scale) / y_scale), round half to even (an
// eltwise_round post-op), the output zero point and saturation: bit for bit
// onnxruntime's results. Without the post-op, oneDNN adds the zero point in
// f32 before it rounds, and a product within an f32 rounding of a half lands
// on the other neighbour (1 output in 12,800 of a random convolution; in a
// deep model those steps grow: PP-OCRv4's int8 detector was 11 steps from
// onnxruntime's output with them, 0 without).
//
// A fused residual Add (inputs 9-11, passes/conv_fusion.h) is oneDNN's sum
// post-op: the residual is copied into the output first, and
//   y[m] = saturate(round(clip(acc[m] * x_scale * w_scale[m] / y_scale)
//                         + (s_scale / y_scale) * (s - s_zero)) + y_zero)
// where y_scale and y_zero are the Add's and clip (an eltwise post-op
// before the sum) bounds the Conv's result to the range its own
// quantization saturated to (attribute residual_clip, over y_scale).
//
// Weights are reordered once, at prepare, into the primitive's blocked
// layout. Zero points live in the state (i32 memory objects oneDNN reads).
// Concurrency and allocation as in conv.cc (execution slots,
// onednn_support.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <string_view>
#include <vector>

#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/onednn_support.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using onednn::Dims;
using onednn::ExecutionSlot;

constexpr const char* kKernel = "kiln.NhwcQLinearConv";

struct QuantizedConvState final : KernelState {
  bool empty = false;  // a batch of 0: nothing to compute
  bool has_bias = false;
  bool has_sum = false;  // inputs 9-11: a residual added by the sum post-op
  dnnl::convolution_forward primitive;
  dnnl::memory packed_weights;
  std::vector<int32_t> bias_values;  // a copy of the constant B, owned with the primitive
  dnnl::memory bias;                  // points at bias_values
  int32_t zeros[2] = {0, 0};  // x_zero, y_zero: what the two memories below point at
  dnnl::memory src_zero;
  dnnl::memory dst_zero;
  onednn::ExecutionSlots slots;
};

dnnl::memory::data_type integerType(DType dtype) {
  return dtype == DType::kU8 ? dnnl::memory::data_type::u8 : dnnl::memory::data_type::s8;
}

// Constant input `index` of the setup, or a UsageError: the channels-last
// pass writes this operator only over constant parameters.
const std::byte* constantAt(const KernelSetup& setup, size_t index, const char* what) {
  const std::byte* data = index < setup.constants.size() ? setup.constants[index] : nullptr;
  if (data == nullptr) throw UsageError(fmt::format("{}: {} (input {}) must be a constant", kKernel, what, index));
  return data;
}

// One value of input `index` (a scale or zero point given per tensor).
float singleValue(const KernelSetup& setup, size_t index, const char* what) {
  const TensorInfo& info = setup.inputs[index];
  if (info.numElements() != 1) {
    throw UsageError(fmt::format("{}: {} (input {}) must hold one value, found {}{}", kKernel, what, index,
                                 dtypeName(info.dtype), info.shapeString()));
  }
  return loadAsFloat(constantAt(setup, index, what), info.dtype, 0);
}

// Inputs: x [N, H, W, C], x_scale, x_zero_point, w [M, C/group, kH, kW],
// w_scale, w_zero_point, y_scale, y_zero_point, B? (i32 [M]), and for a
// fused residual (passes/conv_fusion.h) s (y's type), s_scale, s_zero_point.
std::unique_ptr<KernelState> prepareNhwcQLinearConv(const KernelSetup& setup) {
  if (setup.inputs.size() < 8 || setup.inputs.size() > 12 || setup.inputs.size() == 10 ||
      setup.inputs.size() == 11 || setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 8, 9 or 12 inputs and 1 output", kKernel));
  }
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[3];
  const TensorInfo& y = setup.outputs[0];
  if (!isInteger8(x.dtype) || w.dtype != DType::kI8 || !isInteger8(y.dtype) || w.shape.size() != 4) {
    throw UsageError(fmt::format("{}: needs u8 or i8 activations and 2-D i8 weights, got x {}{}, w {}{}, y {}{}",
                                 kKernel, dtypeName(x.dtype), x.shapeString(), dtypeName(w.dtype), w.shapeString(),
                                 dtypeName(y.dtype), y.shapeString()));
  }
  const NchwSetup nchw(kKernel, setup);
  const ConvGeometry g = convGeometry(kKernel, setup.params, nchw.get().inputs[0], w, nchw.get().outputs[0]);
  auto state = std::make_unique<QuantizedConvState>();
  if (g.batch == 0) {
    state->empty = true;
    return state;
  }
  const int64_t m = g.out_channels;

  // Output scales, one per channel or one for all.
  const float x_scale = singleValue(setup, 1, "x_scale");
  const float y_scale = singleValue(setup, 6, "y_scale");
  const TensorInfo& w_scale = setup.inputs[4];
  const auto w_scales = static_cast<int64_t>(w_scale.numElements());
  if (w_scales != 1 && w_scales != m) {
    throw UsageError(fmt::format("{}: w_scale must hold 1 or {} values, found {}", kKernel, m, w_scales));
  }
  const std::byte* w_scale_data = constantAt(setup, 4, "w_scale");
  std::vector<float> scales(static_cast<size_t>(w_scales));
  for (int64_t i = 0; i < w_scales; ++i) {
    scales[static_cast<size_t>(i)] = x_scale * loadAsFloat(w_scale_data, w_scale.dtype, i) / y_scale;
  }
  const std::byte* w_zero = constantAt(setup, 5, "w_zero_point");
  for (int64_t i = 0; i < static_cast<int64_t>(setup.inputs[5].numElements()); ++i) {
    if (loadAsFloat(w_zero, setup.inputs[5].dtype, i) != 0) {
      throw UsageError(fmt::format("{}: the weights' zero points must be 0", kKernel));
    }
  }
  state->zeros[0] = static_cast<int32_t>(singleValue(setup, 2, "x_zero_point"));
  state->zeros[1] = static_cast<int32_t>(singleValue(setup, 7, "y_zero_point"));
  state->has_bias = setup.inputs.size() >= 9 && setup.inputs[8].dtype != DType::kUndefined;
  state->has_sum = setup.inputs.size() == 12;
  float sum_scale = 0;
  int32_t sum_zero = 0;
  std::vector<double> clip;  // the Conv's own saturation, in real units
  if (state->has_sum) {
    if (setup.inputs[9] != y) {
      throw UsageError(fmt::format("{}: the residual (input 9) is {}{} but the output is {}{}: they must be equal",
                                   kKernel, dtypeName(setup.inputs[9].dtype), setup.inputs[9].shapeString(),
                                   dtypeName(y.dtype), y.shapeString()));
    }
    sum_scale = singleValue(setup, 10, "the residual's scale") / y_scale;
    sum_zero = static_cast<int32_t>(singleValue(setup, 11, "the residual's zero point"));
    clip = setup.params.getFloats("residual_clip", {});
    if (clip.size() != 2 || !(clip[0] <= clip[1])) {
      throw UsageError(fmt::format("{}: a fused residual needs residual_clip, [low, high]", kKernel));
    }
  }
  if (state->has_bias && (setup.inputs[8].dtype != DType::kI32 || setup.inputs[8].shape != std::vector<int64_t>{m})) {
    throw UsageError(fmt::format("{}: the bias must be i32[{}]", kKernel, m));
  }

  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const Dims src_dims{g.batch, g.in_channels, g.in[1], g.in[2]};
  const Dims dst_dims{g.batch, m, g.out[1], g.out[2]};
  const Dims strides{g.strides[1], g.strides[2]};
  const Dims dilations{g.dilations[1] - 1, g.dilations[2] - 1};
  const Dims pad_l{g.pad_begin[1], g.pad_begin[2]};
  Dims pad_r;
  for (size_t a = 1; a < 3; ++a) {
    pad_r.push_back((g.out[a] - 1) * g.strides[a] + (g.kernel[a] - 1) * g.dilations[a] + 1 - g.in[a] - g.pad_begin[a]);
  }
  const bool grouped = g.group > 1;
  const Dims w_dims = grouped ? Dims{g.group, m / g.group, g.in_channels / g.group, g.kernel[1], g.kernel[2]}
                              : Dims{m, g.in_channels, g.kernel[1], g.kernel[2]};
  const dnnl::memory::desc src(src_dims, integerType(x.dtype), tag::nhwc);
  const dnnl::memory::desc dst(dst_dims, integerType(y.dtype), tag::nhwc);
  const dnnl::memory::desc weights_plain(w_dims, dt::s8, grouped ? tag::goihw : tag::oihw);
  const dnnl::memory::desc weights_any(w_dims, dt::s8, tag::any);
  const dnnl::memory::desc bias({m}, dt::s32, tag::x);

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_output_scales(w_scales == 1 ? 0 : 1 << 1, scales);
  // Zero points only where they are not 0: oneDNN 2.6 has no brgemm
  // kernel for a spatial convolution with a source zero point (jit_int8
  // takes it, 15-20% slower on ResNet-50's 3x3 convolutions), and after a
  // ReLU the activations' zero point is 0.
  if (state->zeros[0] != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (state->zeros[1] != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  if (state->has_sum) {
    // dst = saturate(round(clip(acc * scale) + s_scale / y_scale * (s - s_zero)) + y_zero), s read from dst.
    dnnl::post_ops post_ops;
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip, static_cast<float>(clip[0]) / y_scale,
                            static_cast<float>(clip[1]) / y_scale);
    post_ops.append_sum(sum_scale, sum_zero, integerType(y.dtype));
    attr.set_post_ops(post_ops);
  } else {
    // Rounded before oneDNN adds the output zero point (in f32), as
    // onnxruntime rounds: then the addition is exact, and so is the result.
    dnnl::post_ops post_ops;
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_round, 0.0f, 0.0f);
    attr.set_post_ops(post_ops);
  }
  const dnnl::engine& engine = onednn::cpuEngine();
  dnnl::convolution_forward::primitive_desc pd;
  try {
    const auto desc = state->has_bias
                          ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct, src, weights_any,
                                                            bias, dst, strides, dilations, pad_l, pad_r)
                          : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct, src, weights_any, dst,
                                                            strides, dilations, pad_l, pad_r);
    pd = dnnl::convolution_forward::primitive_desc(desc, attr, engine);
  } catch (const dnnl::error& e) {
    throw UsageError(fmt::format("{}: oneDNN has no int8 convolution for x {}{}, w {}{} ({})", kKernel,
                                 dtypeName(x.dtype), x.shapeString(), dtypeName(w.dtype), w.shapeString(), e.what()));
  }
  state->primitive = dnnl::convolution_forward(pd);
  state->packed_weights = onednn::reorderConstant(weights_plain, constantAt(setup, 3, "the weights"), pd.weights_desc());
  if (state->has_bias) {
    state->bias_values.resize(static_cast<size_t>(m));
    std::memcpy(state->bias_values.data(), constantAt(setup, 8, "the bias"), state->bias_values.size() * sizeof(int32_t));
    state->bias = dnnl::memory(bias, engine, state->bias_values.data());
  }
  const dnnl::memory::desc zero_point({1}, dt::s32, tag::x);
  state->src_zero = dnnl::memory(zero_point, engine, &state->zeros[0]);
  state->dst_zero = dnnl::memory(zero_point, engine, &state->zeros[1]);
  state->slots.create(engine, pd.scratchpad_desc());
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    ExecutionSlot& slot = state->slots[i];
    slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
  }
  return state;
}

void runNhwcQLinearConv(const KernelCall& call) {
  const auto& state = static_cast<const QuantizedConvState&>(*call.state);
  if (state.empty) return;
  if (state.has_sum && call.inputs[9].data != call.outputs[0].data) {
    // The sum post-op reads the residual from the output.
    std::memcpy(call.outputs[0].data, call.inputs[9].data, call.outputs[0].numElements());
  }
  ExecutionSlot& slot = state.slots.claim();
  onednn::setHandle(kKernel, slot.src, const_cast<std::byte*>(call.inputs[0].data));
  onednn::setHandle(kKernel, slot.dst, call.outputs[0].data);
  dnnl_exec_arg_t args[7];
  int count = 0;
  args[count++] = {DNNL_ARG_SRC, slot.src.get()};
  args[count++] = {DNNL_ARG_WEIGHTS, state.packed_weights.get()};
  if (state.has_bias) args[count++] = {DNNL_ARG_BIAS, state.bias.get()};
  args[count++] = {DNNL_ARG_DST, slot.dst.get()};
  if (state.zeros[0] != 0) args[count++] = {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, state.src_zero.get()};
  if (state.zeros[1] != 0) args[count++] = {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, state.dst_zero.get()};
  onednn::execute(kKernel, state.primitive, state.slots, slot, args, count);
}

}  // namespace

void registerQuantizedConvKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"kiln.NhwcQLinearConv", &prepareNhwcQLinearConv, &runNhwcQLinearConv});
}

}  // namespace kiln
