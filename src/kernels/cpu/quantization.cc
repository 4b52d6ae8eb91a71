// Quantization kernels (ONNX) on the CPU, as plain loops:
//   QuantizeLinear      y = saturate(round(x / scale) + zero_point)
//   DequantizeLinear    y = (x - zero_point) * scale
//   DynamicQuantizeLinear   u8 quantization with the scale and zero point of
//                       x's range (widened to include 0)
//   MatMulInteger, ConvInteger   i32 sums of (a - a_zero) * (b - b_zero)
//   QLinearMatMul, QLinearConv   the same sums requantized:
//                       y = saturate(round(sum * a_scale * b_scale / y_scale) + y_zero)
//   kiln.QLinearMatMul  QLinearMatMul with QLinearConv's i32 bias added to
//                       the sums (what passes/qdq_fusion.h makes of a QDQ Gemm)
//
// Scales and zero points are per tensor, per axis or blocked (see
// src/ops/quantization_ops.cc); ParamLayout maps an element of x to its
// parameter. Quantized types: u8, i8, u16, i16, u4, i4, u2, i2 (round half
// to even, then clamp; the sub-byte ones one element per byte) and f8e4m3,
// f8e5m2, f4e2m1 (round to nearest even, `saturate` as in
// core/float_formats.h). Scales are f32, f16 or bf16; x / scale is computed in
// f32 and rounded to the `precision` type (default: the scale's), as ONNX
// specifies. The integer products accumulate in i32 (exact for every K below
// 2^15 at 8 bits); the requantization multiplier is formed in the scales'
// type and applied in double, as onnx's reference implementation does.
//
// Scales and zero points are read at run time (they may be graph inputs),
// one element at a time through element_access.h. Nothing allocates while
// running: the matrix products accumulate into a fixed block on the stack.
// With constant weights, MatMulInteger and ConvInteger take exact GEMM routes
// instead (exact_int_gemm.h, integer_conv_gemm.h); the loops here remain for
// weights computed at run time.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/exact_int_gemm.h"
#include "kernels/cpu/int8_matmul.h"
#include "kernels/cpu/integer_conv_gemm.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using checks::constantInput;
using checks::expectCounts;
using checks::inputAt;
using checks::present;
using checks::typeText;

using Ints = std::vector<int64_t>;

bool isScaleType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

bool isQuantizedType(DType dtype) {
  switch (dtype) {
    case DType::kU8: case DType::kI8: case DType::kU16: case DType::kI16:
    case DType::kU4: case DType::kI4: case DType::kU2: case DType::kI2:
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kF4E2M1:
      return true;
    default:
      return false;
  }
}

void expectType(std::string_view op, const TensorInfo& info, bool ok, const char* what, const char* allowed) {
  if (!ok) throw UsageError(fmt::format("{}: no kernel for {} {} (supports {})", op, what, typeText(info), allowed));
}

// Rounds `v` to the precision of `dtype` (f32, f16 or bf16).
float roundTo(DType dtype, float v) {
  if (dtype == DType::kF16) return halfToFloat(floatToHalf(v));
  if (dtype == DType::kBF16) return bfloat16ToFloat(floatToBfloat16(v));
  return v;
}

// The integer range of a quantized integer type.
void integerRange(DType dtype, double& lo, double& hi) {
  switch (dtype) {
    case DType::kU8: lo = 0; hi = 255; return;
    case DType::kI8: lo = -128; hi = 127; return;
    case DType::kU16: lo = 0; hi = 65535; return;
    case DType::kI16: lo = -32768; hi = 32767; return;
    case DType::kU4: lo = 0; hi = 15; return;
    case DType::kI4: lo = -8; hi = 7; return;
    case DType::kU2: lo = 0; hi = 3; return;
    case DType::kI2: lo = -2; hi = 1; return;
    default: lo = hi = 0; return;
  }
}

// Writes element i of quantized type `dtype`: `scaled` (x / scale, or a
// requantized sum) rounded half to even plus `zero`, clamped to the type's
// range (integers; NaN gives the zero point), or converted with `saturate`
// (float8).
void storeQuantized(std::byte* y, DType dtype, int64_t i, double scaled, double zero, bool saturate) {
  if (dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2 || dtype == DType::kF4E2M1) {
    // float4 E2M1 has no infinity or NaN: it always saturates.
    const MiniFloat format = dtype == DType::kF8E4M3   ? MiniFloat::kF8E4M3FN
                             : dtype == DType::kF8E5M2 ? MiniFloat::kF8E5M2
                                                       : MiniFloat::kF4E2M1;
    // x / scale is an f32 value (the rounding ONNX specifies); then to float8.
    storeElement(y, i, static_cast<uint8_t>(doubleToMiniFloat(static_cast<float>(scaled + zero), format, saturate)));
    return;
  }
  double lo = 0;
  double hi = 0;
  integerRange(dtype, lo, hi);
  double q = std::nearbyint(scaled) + zero;
  q = q == q ? std::clamp(q, lo, hi) : std::clamp(zero, lo, hi);
  switch (dtype) {
    case DType::kU8: storeElement(y, i, static_cast<uint8_t>(q)); return;
    case DType::kI8: storeElement(y, i, static_cast<int8_t>(q)); return;
    case DType::kU16: storeElement(y, i, static_cast<uint16_t>(q)); return;
    case DType::kI16: storeElement(y, i, static_cast<int16_t>(q)); return;
    case DType::kU4: case DType::kI4:  // one element per byte, in its low bits (two's complement)
      storeElement(y, i, static_cast<uint8_t>(static_cast<int32_t>(q) & 0xF));
      return;
    case DType::kU2: case DType::kI2:
      storeElement(y, i, static_cast<uint8_t>(static_cast<int32_t>(q) & 0x3));
      return;
    default: return;
  }
}

// ------------------------------------------------------------ ParamLayout

// Where the parameter (scale or zero point) of an element of x lies, with x
// seen as [outer, axis, inner]: index = o * outer_stride + (a / block) *
// axis_stride + r * inner_stride. Per tensor all strides are 0; per axis
// only axis_stride is 1; blocked, the parameters are x's shape with
// ceil(axis / block) along the axis.
struct ParamLayout {
  int64_t block = 1;
  int64_t outer_stride = 0;
  int64_t axis_stride = 0;
  int64_t inner_stride = 0;

  int64_t index(int64_t o, int64_t a, int64_t r) const {
    return o * outer_stride + (a / block) * axis_stride + r * inner_stride;
  }
};

// x viewed as [outer, axis, inner] around the quantization axis.
struct AxisView {
  int64_t outer = 1;
  int64_t axis = 1;
  int64_t inner = 1;
};

AxisView axisView(const Ints& shape, size_t axis) {
  AxisView v;
  if (shape.empty()) return v;
  for (size_t i = 0; i < axis; ++i) v.outer *= shape[i];
  v.axis = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) v.inner *= shape[i];
  return v;
}

// A per-tensor parameter: a scalar or one value in 1-D.
bool isSingle(const TensorInfo& param) { return param.numElements() == 1 && param.shape.size() <= 1; }

ParamLayout paramLayout(std::string_view op, const TensorInfo& x, const TensorInfo& param, size_t axis,
                        int64_t block_size, const AxisView& view) {
  ParamLayout layout;
  if (isSingle(param)) return layout;  // per tensor
  if (block_size == 0) {
    if (param.shape != Ints{view.axis}) {
      throw UsageError(fmt::format("{}: the parameter {} must be a scalar, [1] or [{}] (axis {} of x {})", op,
                                   typeText(param), view.axis, axis, typeText(x)));
    }
    layout.axis_stride = 1;
    return layout;
  }
  Ints expected = x.shape;
  expected[axis] = (view.axis + block_size - 1) / block_size;
  if (param.shape != expected) {
    throw UsageError(fmt::format("{}: blocked (block_size {}): the parameter {} must be {}", op, block_size,
                                 typeText(param), TensorInfo{param.dtype, expected}.shapeString()));
  }
  layout.block = block_size;
  layout.inner_stride = 1;
  layout.axis_stride = view.inner;
  layout.outer_stride = expected[axis] * view.inner;
  return layout;
}

// The layouts of a scale (input `scale`) and its optional zero point.
struct QuantParams {
  AxisView view;
  ParamLayout scale;
  ParamLayout zero;
  DType scale_type = DType::kUndefined;
  DType zero_type = DType::kUndefined;  // kUndefined: no zero point
};

QuantParams quantParams(std::string_view op, const KernelSetup& setup, size_t scale) {
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& zero = inputAt(setup, scale + 1);
  QuantParams q;
  q.scale_type = setup.inputs[scale].dtype;
  q.zero_type = zero.dtype;  // kUndefined when omitted
  if (isSingle(setup.inputs[scale]) && (!present(zero) || isSingle(zero))) {
    // Per tensor: the axis attribute does not matter (and its default, 1,
    // need not exist in x).
    q.view.axis = static_cast<int64_t>(x.numElements());
    return q;
  }
  const int64_t block_size = setup.params.getInt("block_size", 0);
  if (block_size < 0) throw UsageError(fmt::format("{}: block_size must not be negative, got {}", op, block_size));
  const auto rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = setup.params.getInt("axis", 1);
  if (axis < -rank || axis >= rank) {
    throw UsageError(fmt::format("{}: axis {} is out of range for {}", op, axis, typeText(x)));
  }
  if (axis < 0) axis += rank;
  q.view = axisView(x.shape, static_cast<size_t>(axis));
  q.scale = paramLayout(op, x, setup.inputs[scale], static_cast<size_t>(axis), block_size, q.view);
  if (present(zero)) q.zero = paramLayout(op, x, zero, static_cast<size_t>(axis), block_size, q.view);
  return q;
}

// Calls body(i, scale, zero) for every element i of x in order.
template <typename Body>
void forEachQuantized(const QuantParams& q, const std::byte* scale, const std::byte* zero, const Body& body) {
  int64_t i = 0;
  for (int64_t o = 0; o < q.view.outer; ++o) {
    for (int64_t a = 0; a < q.view.axis; ++a) {
      for (int64_t r = 0; r < q.view.inner; ++r, ++i) {
        const float s = loadAsFloat(scale, q.scale_type, q.scale.index(o, a, r));
        const float z = zero != nullptr ? loadAsFloat(zero, q.zero_type, q.zero.index(o, a, r)) : 0.0f;
        body(i, s, z);
      }
    }
  }
}

// --------------------------------------------------------- QuantizeLinear

struct QuantizeState final : KernelState {
  QuantParams params;
  DType x_type = DType::kUndefined;
  DType y_type = DType::kUndefined;
  DType precision = DType::kF32;  // x / scale is rounded to this type
  bool saturate = true;
  // f32 to u8 or i8 with one f32 scale: vec::quantize8's vector loop.
  bool vector_path = false;
};

std::unique_ptr<KernelState> prepareQuantize(const KernelSetup& setup) {
  constexpr std::string_view op = "QuantizeLinear";
  expectCounts(op, setup, 2, 3, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  expectType(op, x, isScaleType(x.dtype) || x.dtype == DType::kI32, "x", "f32, f16, bf16, i32");
  expectType(op, setup.inputs[1], isScaleType(setup.inputs[1].dtype), "y_scale", "f32, f16, bf16");
  expectType(op, y, isQuantizedType(y.dtype), "output", "u8, i8, u16, i16, u4, i4, u2, i2, f8e4m3, f8e5m2, f4e2m1");
  const TensorInfo& zero = inputAt(setup, 2);
  if (present(zero) && zero.dtype != y.dtype) {
    throw UsageError(fmt::format("{}: the zero point {} and the output {} must have one type", op, typeText(zero),
                                 typeText(y)));
  }
  if (y.shape != x.shape) {
    throw UsageError(fmt::format("{}: the output {} must have the shape of x {}", op, typeText(y), typeText(x)));
  }
  auto state = std::make_unique<QuantizeState>();
  state->params = quantParams(op, setup, 1);
  state->x_type = x.dtype;
  state->y_type = y.dtype;
  state->saturate = setup.params.getInt("saturate", 1) != 0;
  const int64_t precision = setup.params.getInt("precision", 0);
  state->precision = precision == 0 ? setup.inputs[1].dtype : static_cast<DType>(precision);
  if (!isScaleType(state->precision)) {
    throw UsageError(fmt::format("{}: precision {} is not f32, f16 or bf16", op, precision));
  }
  state->vector_path = x.dtype == DType::kF32 && setup.inputs[1].dtype == DType::kF32 &&
                       state->precision == DType::kF32 && isInteger8(y.dtype) && isSingle(setup.inputs[1]) &&
                       (!present(inputAt(setup, 2)) || isSingle(inputAt(setup, 2)));
  return state;
}

// Per tensor, f32 to 8 bits: vec::quantize8 rounds x / scale half to even
// and saturates, as QuantizeLinear does.
void runVectorQuantize(const KernelCall& call) {
  const float scale = loadElement<float>(call.inputs[1].data, 0);
  const bool is_signed = call.outputs[0].dtype == DType::kI8;
  const bool has_zero = call.input_count > 2 && call.inputs[2].data != nullptr;
  const float zero = has_zero ? loadAsFloat(call.inputs[2].data, call.inputs[2].dtype, 0) : 0.0f;
  const float* x = call.inputs[0].as<const float>();
  auto* y = call.outputs[0].as<uint8_t>();
  const vec::VectorKernels& kernels = vec::vectorKernels();
  parallelForElements(static_cast<int64_t>(call.outputs[0].numElements()), [&](int64_t begin, int64_t end) {
    kernels.quantize8(x + begin, y + begin, end - begin, scale, zero, is_signed);
  }, 4);
}

void runQuantize(const KernelCall& call) {
  const auto& s = static_cast<const QuantizeState&>(*call.state);
  if (s.vector_path) {
    runVectorQuantize(call);
    return;
  }
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const std::byte* zero = call.input_count > 2 ? call.inputs[2].data : nullptr;
  forEachQuantized(s.params, call.inputs[1].data, zero, [&](int64_t i, float scale, float z) {
    const float scaled = roundTo(s.precision, loadAsFloat(x, s.x_type, i) / scale);
    storeQuantized(y, s.y_type, i, scaled, z, s.saturate);
  });
}

// ------------------------------------------------------- DequantizeLinear

struct DequantizeState final : KernelState {
  QuantParams params;
  DType x_type = DType::kUndefined;
  DType y_type = DType::kUndefined;
};

std::unique_ptr<KernelState> prepareDequantize(const KernelSetup& setup) {
  constexpr std::string_view op = "DequantizeLinear";
  expectCounts(op, setup, 2, 3, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  expectType(op, x, isQuantizedType(x.dtype) || x.dtype == DType::kI32, "x", "u8, i8, u16, i16, i32, u4, i4, u2, i2, f8e4m3, f8e5m2, f4e2m1");
  expectType(op, setup.inputs[1], isScaleType(setup.inputs[1].dtype), "x_scale", "f32, f16, bf16");
  expectType(op, y, isScaleType(y.dtype), "output", "f32, f16, bf16");
  const TensorInfo& zero = inputAt(setup, 2);
  if (present(zero) && zero.dtype != x.dtype) {
    throw UsageError(fmt::format("{}: the zero point {} and x {} must have one type", op, typeText(zero), typeText(x)));
  }
  if (y.shape != x.shape) {
    throw UsageError(fmt::format("{}: the output {} must have the shape of x {}", op, typeText(y), typeText(x)));
  }
  auto state = std::make_unique<DequantizeState>();
  state->params = quantParams(op, setup, 1);
  state->x_type = x.dtype;
  state->y_type = y.dtype;
  return state;
}

// Whether the typed loops of dequantizeRuns apply: 8-bit or i32 x into f32
// with f32 scales, per tensor or per axis (not blocked).
bool hasTypedDequantize(const DequantizeState& s) {
  const bool x_ok = s.x_type == DType::kU8 || s.x_type == DType::kI8 || s.x_type == DType::kI32;
  const auto unblocked = [](const ParamLayout& p) { return p.outer_stride == 0 && p.inner_stride == 0; };
  return x_ok && s.y_type == DType::kF32 && s.params.scale_type == DType::kF32 && unblocked(s.params.scale) &&
         unblocked(s.params.zero);
}

// y = (x - zero) * scale with one scale and zero point per run of `inner`
// elements (all of x per tensor): loops the compiler vectorizes, split over
// the threads. The same arithmetic as the element-wise path, so the same
// results. (A Gather of a quantized embedding table ends in one of these
// per run: 1.6 ms through the element-wise path for T5's [4, 64, 512].)
template <typename TX>
void dequantizeRuns(const QuantParams& q, const TX* x, const float* scale, const TX* zero, float* y) {
  const auto run = [](const TX* in, float* out, int64_t n, float s, float z) {
    for (int64_t i = 0; i < n; ++i) out[i] = (static_cast<float>(in[i]) - z) * s;
  };
  if (q.scale.axis_stride == 0 && q.zero.axis_stride == 0) {  // per tensor
    const float s = scale[0];
    const float z = zero != nullptr ? static_cast<float>(zero[0]) : 0.0f;
    const int64_t n = q.view.outer * q.view.axis * q.view.inner;
    if constexpr (sizeof(TX) == 1) {  // 8 bits: the vector loop of this CPU's ISA
      const vec::VectorKernels& kernels = vec::vectorKernels();
      const auto* bytes = reinterpret_cast<const uint8_t*>(x);
      parallelForElements(n, [&](int64_t begin, int64_t end) {
        kernels.dequantize8(bytes + begin, y + begin, end - begin, s, z, std::is_signed_v<TX>);
      });
      return;
    }
    parallelForElements(n, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin, s, z); });
    return;
  }
  parallelForItems(q.view.outer * q.view.axis, q.view.inner, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t a = r % q.view.axis;
      const float z = zero != nullptr ? static_cast<float>(zero[a * q.zero.axis_stride]) : 0.0f;
      run(x + r * q.view.inner, y + r * q.view.inner, q.view.inner, scale[a * q.scale.axis_stride], z);
    }
  });
}

template <typename TX>
void dequantizeTyped(const DequantizeState& s, const KernelCall& call) {
  const TX* zero = call.input_count > 2 && call.inputs[2].data != nullptr ? call.inputs[2].as<const TX>() : nullptr;
  dequantizeRuns<TX>(s.params, call.inputs[0].as<const TX>(), call.inputs[1].as<const float>(), zero,
                     call.outputs[0].as<float>());
}

void runDequantize(const KernelCall& call) {
  const auto& s = static_cast<const DequantizeState&>(*call.state);
  if (hasTypedDequantize(s)) {
    switch (s.x_type) {
      case DType::kU8: return dequantizeTyped<uint8_t>(s, call);
      case DType::kI8: return dequantizeTyped<int8_t>(s, call);
      default: return dequantizeTyped<int32_t>(s, call);
    }
  }
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const std::byte* zero = call.input_count > 2 ? call.inputs[2].data : nullptr;
  forEachQuantized(s.params, call.inputs[1].data, zero, [&](int64_t i, float scale, float z) {
    storeFloat(y, s.y_type, i, (loadAsFloat(x, s.x_type, i) - z) * scale);
  });
}

// -------------------------------------------------- DynamicQuantizeLinear

struct DynamicQuantizeState final : KernelState {
  int64_t count = 0;
};

std::unique_ptr<KernelState> prepareDynamicQuantize(const KernelSetup& setup) {
  constexpr std::string_view op = "DynamicQuantizeLinear";
  expectCounts(op, setup, 1, 1, 3, 3);
  const TensorInfo& x = setup.inputs[0];
  expectType(op, x, x.dtype == DType::kF32, "x", "f32");
  const TensorInfo want[] = {{DType::kU8, x.shape}, {DType::kF32, {}}, {DType::kU8, {}}};
  for (size_t i = 0; i < 3; ++i) {
    if (setup.outputs[i] != want[i]) {
      throw UsageError(fmt::format("{}: output {} is {} but must be {}", op, i, typeText(setup.outputs[i]),
                                   typeText(want[i])));
    }
  }
  auto state = std::make_unique<DynamicQuantizeState>();
  state->count = static_cast<int64_t>(x.numElements());
  return state;
}

// As onnx's reference: the range [min(0, min x), max(0, max x)] over 255
// steps; the zero point is -min / scale rounded half to even.
void runDynamicQuantize(const KernelCall& call) {
  const auto& s = static_cast<const DynamicQuantizeState&>(*call.state);
  const DynamicQuantization q =
      quantizeDynamic(call.inputs[0].as<const float>(), s.count, call.outputs[0].as<uint8_t>());
  *call.outputs[1].as<float>() = q.scale;
  *call.outputs[2].as<uint8_t>() = q.zero;
}

// ------------------------------------------------- integer matrix product

// A [..., M, K] times B [..., K, N] with numpy's batch broadcasting; a 1-D A
// is a row and a 1-D B a column. Offsets (in elements) of each output
// matrix's A and B, made at prepare.
struct MatMulPlan {
  int64_t m = 1;
  int64_t k = 1;
  int64_t n = 1;
  std::vector<int64_t> a_offsets;
  std::vector<int64_t> b_offsets;
};

MatMulPlan planMatMul(std::string_view op, const TensorInfo& a, const TensorInfo& b, const TensorInfo& y) {
  if (a.shape.empty() || b.shape.empty()) throw UsageError(fmt::format("{}: needs inputs of rank 1 or more", op));
  Ints as = a.shape;
  Ints bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  MatMulPlan plan;
  plan.m = as[as.size() - 2];
  plan.k = as.back();
  plan.n = bs.back();
  if (bs[bs.size() - 2] != plan.k) {
    throw UsageError(fmt::format("{}: cannot multiply {} by {}", op, typeText(a), typeText(b)));
  }
  const size_t batch_rank = std::max(as.size(), bs.size()) - 2;
  Ints batch(batch_rank);
  Ints a_strides(batch_rank, 0);
  Ints b_strides(batch_rank, 0);
  int64_t a_stride = plan.m * plan.k;
  int64_t b_stride = plan.k * plan.n;
  for (size_t d = batch_rank; d-- > 0;) {
    const size_t from_end = batch_rank - d;  // 1 for the innermost batch axis
    const int64_t ad = as.size() - 2 >= from_end ? as[as.size() - 2 - from_end] : 1;
    const int64_t bd = bs.size() - 2 >= from_end ? bs[bs.size() - 2 - from_end] : 1;
    if (ad != bd && ad != 1 && bd != 1) {
      throw UsageError(fmt::format("{}: the batch dimensions of {} and {} do not broadcast", op, typeText(a), typeText(b)));
    }
    batch[d] = std::max(ad, bd);
    a_strides[d] = ad == 1 ? 0 : a_stride;
    b_strides[d] = bd == 1 ? 0 : b_stride;
    a_stride *= ad;
    b_stride *= bd;
  }
  Ints expected = batch;
  if (a.shape.size() > 1) expected.push_back(plan.m);
  if (b.shape.size() > 1) expected.push_back(plan.n);
  if (y.shape != expected) {
    throw UsageError(fmt::format("{}: the output {} must be {}", op, typeText(y), TensorInfo{y.dtype, expected}.shapeString()));
  }
  int64_t count = 1;
  for (int64_t d : batch) count *= d;
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    int64_t a_off = 0;
    int64_t b_off = 0;
    for (size_t d = batch_rank; d-- > 0;) {
      const int64_t index = rest % batch[d];
      rest /= batch[d];
      a_off += index * a_strides[d];
      b_off += index * b_strides[d];
    }
    plan.a_offsets.push_back(a_off);
    plan.b_offsets.push_back(b_off);
  }
  return plan;
}

// A zero point per tensor (stride 0) or per row of A / column of B (stride 1).
struct ZeroPoint {
  const std::byte* data = nullptr;  // nullptr: 0
  DType dtype = DType::kUndefined;
  int64_t stride = 0;

  int32_t at(int64_t i) const { return data ? static_cast<int32_t>(loadAsFloat(data, dtype, i * stride)) : 0; }
};

// The stride of an optional zero point (input `index`) of one value or of
// `count` values (per row or column).
int64_t zeroPointStride(std::string_view op, const KernelSetup& setup, size_t index, int64_t count, const char* per) {
  const TensorInfo& info = inputAt(setup, index);
  if (!present(info) || info.numElements() == 1) return 0;
  if (info.shape == Ints{count}) return 1;
  throw UsageError(fmt::format("{}: input {} {} must hold one value or one per {} ({})", op, index, typeText(info),
                               per, count));
}

constexpr int64_t kColumnBlock = 256;  // accumulators on the stack

// Calls sink(batch, row, column0, sums, count) with the i32 sums of
// (a - a_zero) * (b - b_zero) for `count` consecutive columns of one row.
template <typename TA, typename TB, typename Sink>
void integerMatMul(const MatMulPlan& plan, const TA* a, const TB* b, const ZeroPoint& a_zero, const ZeroPoint& b_zero,
                   const Sink& sink) {
  int32_t sums[kColumnBlock];
  int32_t b_zeros[kColumnBlock];
  for (size_t batch = 0; batch < plan.a_offsets.size(); ++batch) {
    const TA* a_batch = a + plan.a_offsets[batch];
    const TB* b_batch = b + plan.b_offsets[batch];
    for (int64_t j0 = 0; j0 < plan.n; j0 += kColumnBlock) {
      const int64_t count = std::min(kColumnBlock, plan.n - j0);
      for (int64_t j = 0; j < count; ++j) b_zeros[j] = b_zero.at(j0 + j);
      for (int64_t i = 0; i < plan.m; ++i) {
        const int32_t za = a_zero.at(i);
        std::fill(sums, sums + count, 0);
        for (int64_t p = 0; p < plan.k; ++p) {
          const int32_t av = static_cast<int32_t>(a_batch[i * plan.k + p]) - za;
          const TB* b_row = b_batch + p * plan.n + j0;
          for (int64_t j = 0; j < count; ++j) sums[j] += av * (static_cast<int32_t>(b_row[j]) - b_zeros[j]);
        }
        sink(static_cast<int64_t>(batch), i, j0, sums, count);
      }
    }
  }
}

// Calls f(a, b) with a and b typed as uint8_t or int8_t pointers.
template <typename F>
void withInteger8(const TensorView& a, const TensorView& b, const F& f) {
  const bool a_signed = a.dtype == DType::kI8;
  const bool b_signed = b.dtype == DType::kI8;
  if (a_signed && b_signed) f(a.as<const int8_t>(), b.as<const int8_t>());
  else if (a_signed) f(a.as<const int8_t>(), b.as<const uint8_t>());
  else if (b_signed) f(a.as<const uint8_t>(), b.as<const int8_t>());
  else f(a.as<const uint8_t>(), b.as<const uint8_t>());
}

// -------------------------------------------------------- MatMulInteger

struct MatMulIntegerState final : KernelState {
  MatMulPlan plan;
  int64_t a_zero_stride = 0;
  int64_t b_zero_stride = 0;
  std::unique_ptr<ExactIntGemm> fast;  // exact_int_gemm.h, when B is a constant
};

void expectInteger8Inputs(std::string_view op, const KernelSetup& setup, size_t a, size_t b) {
  for (size_t i : {a, b}) expectType(op, setup.inputs[i], isInteger8(setup.inputs[i].dtype), "input", "u8, i8");
}

void expectZeroPointType(std::string_view op, const KernelSetup& setup, size_t zero, size_t of) {
  const TensorInfo& info = inputAt(setup, zero);
  if (present(info) && info.dtype != setup.inputs[of].dtype) {
    throw UsageError(fmt::format("{}: the zero point {} (input {}) must have the type of input {} ({})", op,
                                 typeText(info), zero, of, dtypeName(setup.inputs[of].dtype)));
  }
}

// MatMulInteger's checks and plan for inputs 0 to 3 of `setup`; the caller
// checks the output's type.
std::unique_ptr<MatMulIntegerState> prepareIntegerProduct(std::string_view op, const KernelSetup& setup) {
  expectInteger8Inputs(op, setup, 0, 1);
  expectZeroPointType(op, setup, 2, 0);
  expectZeroPointType(op, setup, 3, 1);
  auto state = std::make_unique<MatMulIntegerState>();
  state->plan = planMatMul(op, setup.inputs[0], setup.inputs[1], setup.outputs[0]);
  state->a_zero_stride = zeroPointStride(op, setup, 2, state->plan.m, "row of A");
  state->b_zero_stride = zeroPointStride(op, setup, 3, state->plan.n, "column of B");
  const auto constant = [&](size_t index) { return index < setup.constants.size() ? setup.constants[index] : nullptr; };
  const bool b_zero_known = !present(inputAt(setup, 3)) || constant(3) != nullptr;
  if (constant(1) != nullptr && b_zero_known && state->a_zero_stride == 0) {
    const MatMulPlan& plan = state->plan;
    state->fast = prepareExactIntGemm(setup.inputs[0].dtype, plan.m, plan.n, plan.k, plan.a_offsets, plan.b_offsets, setup.inputs[1].dtype,
                                      constant(1), setup.inputs[1].numElements(),
                                      present(inputAt(setup, 3)) ? constant(3) : nullptr, state->b_zero_stride);
  }
  return state;
}

std::unique_ptr<KernelState> prepareMatMulInteger(const KernelSetup& setup) {
  constexpr std::string_view op = "MatMulInteger";
  expectCounts(op, setup, 2, 4, 1, 1);
  expectType(op, setup.outputs[0], setup.outputs[0].dtype == DType::kI32, "output", "i32");
  return prepareIntegerProduct(op, setup);
}

ZeroPoint zeroPointOf(const KernelCall& call, size_t index, int64_t stride) {
  if (index >= call.input_count || call.inputs[index].data == nullptr) return {};
  return ZeroPoint{call.inputs[index].data, call.inputs[index].dtype, stride};
}

// The i32 sums of MatMulInteger (inputs 0 to 3 of `call`) into y.
void integerProduct(const MatMulIntegerState& s, const KernelCall& call, int32_t* y) {
  const MatMulPlan& plan = s.plan;
  if (s.fast && runExactIntGemm(*s.fast, call.inputs[0].dtype, call.inputs[0].data,
                                zeroPointOf(call, 2, 0).at(0), y)) {
    return;
  }
  withInteger8(call.inputs[0], call.inputs[1], [&](const auto* a, const auto* b) {
    integerMatMul(plan, a, b, zeroPointOf(call, 2, s.a_zero_stride), zeroPointOf(call, 3, s.b_zero_stride),
                  [&](int64_t batch, int64_t i, int64_t j0, const int32_t* sums, int64_t count) {
                    std::memcpy(y + (batch * plan.m + i) * plan.n + j0, sums, static_cast<size_t>(count) * sizeof(int32_t));
                  });
  });
}

void runMatMulInteger(const KernelCall& call) {
  integerProduct(static_cast<const MatMulIntegerState&>(*call.state), call, call.outputs[0].as<int32_t>());
}

// ------------------------------------------------- MatMulIntegerToFloat
//
// kiln.MatMulIntegerToFloat(A, B, a_zero?, b_zero?, scale[, addend]) =
// f32(sums) * scale (+ addend): MatMulInteger -> Cast -> Mul (-> Add) as one
// step (onnxruntime's quantizer writes that chain after every dynamically
// quantized MatMul). The sums go into the
// output's own memory, an i32 and an f32 having one size, and one vector
// pass (vector_kernels.h, scaleSums) turns each into its f32 product with
// the scale there: the Cast's and the Mul's arithmetic, so the same results,
// without their two passes over memory.

struct MatMulIntegerToFloatState final : KernelState {
  std::unique_ptr<MatMulIntegerState> product;
  bool per_column = false;  // scale [N] rather than one value
  enum class Addend { kNone, kBias, kResidual } addend = Addend::kNone;
};

std::unique_ptr<KernelState> prepareMatMulIntegerToFloat(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.MatMulIntegerToFloat";
  expectCounts(op, setup, 5, 6, 1, 1);
  expectType(op, setup.outputs[0], setup.outputs[0].dtype == DType::kF32, "output", "f32");
  const TensorInfo& scale = setup.inputs[4];
  auto state = std::make_unique<MatMulIntegerToFloatState>();
  state->product = prepareIntegerProduct(op, setup);
  const int64_t n = state->product->plan.n;
  expectType(op, scale, scale.dtype == DType::kF32, "scale", "f32");
  if (scale.numElements() != 1 && static_cast<int64_t>(scale.numElements()) != n) {
    throw UsageError(fmt::format("{}: the scale {} must hold one value or one per column ({})", op, typeText(scale), n));
  }
  state->per_column = scale.numElements() != 1;
  if (present(inputAt(setup, 5))) {
    const TensorInfo& addend = setup.inputs[5];
    if (addend.dtype == DType::kF32 && addend.shape == setup.outputs[0].shape) {
      state->addend = MatMulIntegerToFloatState::Addend::kResidual;
    } else if (addend.dtype == DType::kF32 && addend.shape == Ints{n}) {
      state->addend = MatMulIntegerToFloatState::Addend::kBias;
    } else {
      throw UsageError(fmt::format("{}: the addend {} must be f32 [{}] or {}", op, typeText(addend), n,
                                   typeText(setup.outputs[0])));
    }
  }
  return state;
}

void runMatMulIntegerToFloat(const KernelCall& call) {
  const auto& s = static_cast<const MatMulIntegerToFloatState&>(*call.state);
  std::byte* y = call.outputs[0].data;
  integerProduct(*s.product, call, reinterpret_cast<int32_t*>(y));
  const float* scale = call.inputs[4].as<const float>();
  using Addend = MatMulIntegerToFloatState::Addend;
  const float* addend = s.addend == Addend::kNone ? nullptr : call.inputs[5].as<const float>();
  const int64_t n = s.product->plan.n;
  const int64_t rows = static_cast<int64_t>(call.outputs[0].numElements()) / std::max<int64_t>(n, 1);
  const vec::VectorKernels& vk = vec::vectorKernels();
  parallelForItems(rows, n, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* add = s.addend == Addend::kResidual ? addend + r * n : addend;
      std::byte* row = y + r * n * 4;
      vk.scaleSums(row, row, n, scale, s.per_column, add);
    }
  });
}

// --------------------------------------------------------- requantizing

// sum * multiplier + y_zero, rounded half to even and clamped to the output
// type. The multiplier a_scale * b_scale / y_scale is rounded as the scales'
// type would (onnx's reference computes it in that type).
struct Requantizer {
  DType scale_type = DType::kF32;
  DType y_type = DType::kU8;

  float multiplier(float a_scale, float b_scale, float y_scale) const {
    return roundTo(scale_type, roundTo(scale_type, a_scale * b_scale) / y_scale);
  }
  void store(std::byte* y, int64_t i, int32_t sum, float multiplier, float zero) const {
    storeQuantized(y, y_type, i, static_cast<double>(sum) * multiplier, zero, true);
  }
};

// Fails unless the scales (inputs `scales`) share one float type; returns it.
DType commonScaleType(std::string_view op, const KernelSetup& setup, std::initializer_list<size_t> scales) {
  const DType dtype = setup.inputs[*scales.begin()].dtype;
  for (size_t i : scales) {
    expectType(op, setup.inputs[i], isScaleType(setup.inputs[i].dtype) && setup.inputs[i].dtype == dtype, "scale",
               "f32, f16, bf16, all scales of one type");
  }
  return dtype;
}

void expectSingle(std::string_view op, const KernelSetup& setup, size_t index) {
  if (setup.inputs[index].numElements() != 1) {
    throw UsageError(fmt::format("{}: input {} {} must hold one value", op, index, typeText(setup.inputs[index])));
  }
}

// -------------------------------------------------------- QLinearMatMul

struct QLinearMatMulState final : KernelState {
  MatMulPlan plan;
  bool has_bias = false;  // kiln.QLinearMatMul's input 8
  int64_t b_param_stride = 0;  // b_scale and b_zero_point: per tensor or per column
  Requantizer requantizer;
  std::unique_ptr<Int8MatMul> fast;  // oneDNN's requantizing int8 matmul, where it applies (int8_matmul.h)
};

// The fast path's object, where it applies (int8_matmul.h): B a
// constant 2-D i8 matrix with zero points 0, the other parameters constants
// of one value, f32 scales.
std::unique_ptr<Int8MatMul> prepareFastQLinearMatMul(const KernelSetup& setup, const MatMulPlan& plan) {
  const TensorInfo& b = setup.inputs[3];
  const auto constant = [&](size_t i) { return i < setup.constants.size() ? setup.constants[i] : nullptr; };
  for (size_t i = 1; i < 8; ++i) {
    if (constant(i) == nullptr) return nullptr;
  }
  if (b.dtype != DType::kI8 || b.shape.size() != 2) return nullptr;
  for (size_t i : {1u, 4u, 6u}) {
    if (setup.inputs[i].dtype != DType::kF32) return nullptr;
  }
  const int64_t zeros = static_cast<int64_t>(setup.inputs[5].numElements());
  for (int64_t j = 0; j < zeros; ++j) {
    if (loadAsFloat(constant(5), DType::kI8, j) != 0) return nullptr;
  }
  const float a_scale = loadAsFloat(constant(1), DType::kF32, 0);
  const float y_scale = loadAsFloat(constant(6), DType::kF32, 0);
  std::vector<float> scales(setup.inputs[4].numElements());
  for (size_t j = 0; j < scales.size(); ++j) {
    scales[j] = a_scale * loadAsFloat(constant(4), DType::kF32, static_cast<int64_t>(j)) / y_scale;
  }
  const int64_t rows = static_cast<int64_t>(setup.inputs[0].numElements()) / std::max<int64_t>(plan.k, 1);
  if (rows == 0 || plan.k == 0 || plan.n == 0) return nullptr;
  const bool has_bias = setup.inputs.size() == 9 && setup.inputs[8].dtype != DType::kUndefined;
  if (has_bias && constant(8) == nullptr) return nullptr;
  return prepareRequantizedInt8MatMul(rows, plan.n, plan.k, setup.inputs[0].dtype, setup.outputs[0].dtype,
                                      reinterpret_cast<const int8_t*>(constant(3)), scales,
                                      static_cast<int32_t>(loadAsFloat(constant(2), setup.inputs[2].dtype, 0)),
                                      static_cast<int32_t>(loadAsFloat(constant(7), setup.inputs[7].dtype, 0)),
                                      has_bias ? reinterpret_cast<const int32_t*>(constant(8)) : nullptr);
}

// Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
// y_zero_point; kiln.QLinearMatMul also an optional bias (i32 [n], at the
// scale a_scale * b_scale, added to the sums as QLinearConv's).
std::unique_ptr<KernelState> prepareQLinearMatMulAs(const KernelSetup& setup, std::string_view op, size_t max_inputs) {
  expectCounts(op, setup, 8, max_inputs, 1, 1);
  expectInteger8Inputs(op, setup, 0, 3);
  expectZeroPointType(op, setup, 2, 0);
  expectZeroPointType(op, setup, 5, 3);
  expectType(op, setup.inputs[7], isInteger8(setup.inputs[7].dtype), "y_zero_point", "u8, i8");
  if (setup.outputs[0].dtype != setup.inputs[7].dtype) {
    throw UsageError(fmt::format("{}: the output {} must have the type of y_zero_point", op, typeText(setup.outputs[0])));
  }
  auto state = std::make_unique<QLinearMatMulState>();
  state->requantizer = Requantizer{commonScaleType(op, setup, {1, 4, 6}), setup.outputs[0].dtype};
  state->plan = planMatMul(op, setup.inputs[0], setup.inputs[3], setup.outputs[0]);
  for (size_t i : {1u, 2u, 6u, 7u}) expectSingle(op, setup, i);
  const int64_t b_scale = zeroPointStride(op, setup, 4, state->plan.n, "column of B");
  const int64_t b_zero = zeroPointStride(op, setup, 5, state->plan.n, "column of B");
  if (setup.inputs[4].numElements() != setup.inputs[5].numElements()) {
    throw UsageError(fmt::format("{}: b_scale {} and b_zero_point {} must have one shape", op,
                                 typeText(setup.inputs[4]), typeText(setup.inputs[5])));
  }
  state->b_param_stride = std::max(b_scale, b_zero);
  state->has_bias = setup.inputs.size() == 9 && setup.inputs[8].dtype != DType::kUndefined;
  if (state->has_bias && (setup.inputs[8].dtype != DType::kI32 || setup.inputs[8].shape != std::vector<int64_t>{state->plan.n})) {
    throw UsageError(fmt::format("{}: the bias {} must be i32[{}]", op, typeText(setup.inputs[8]), state->plan.n));
  }
  state->fast = prepareFastQLinearMatMul(setup, state->plan);
  return state;
}

std::unique_ptr<KernelState> prepareQLinearMatMul(const KernelSetup& setup) {
  return prepareQLinearMatMulAs(setup, "QLinearMatMul", 8);
}
std::unique_ptr<KernelState> prepareBiasedQLinearMatMul(const KernelSetup& setup) {
  return prepareQLinearMatMulAs(setup, "kiln.QLinearMatMul", 9);
}

void runQLinearMatMul(const KernelCall& call) {
  const auto& s = static_cast<const QLinearMatMulState&>(*call.state);
  if (s.fast) {
    runRequantizedInt8MatMul(*s.fast, call.inputs[0].data, call.outputs[0].data);
    return;
  }
  const MatMulPlan& plan = s.plan;
  const TensorView* in = call.inputs;
  const float a_scale = loadAsFloat(in[1].data, in[1].dtype, 0);
  const float y_scale = loadAsFloat(in[6].data, in[6].dtype, 0);
  const float y_zero = loadAsFloat(in[7].data, in[7].dtype, 0);
  std::byte* y = call.outputs[0].data;
  const int32_t* bias = s.has_bias ? in[8].as<const int32_t>() : nullptr;
  withInteger8(in[0], in[3], [&](const auto* a, const auto* b) {
    integerMatMul(plan, a, b, zeroPointOf(call, 2, 0), zeroPointOf(call, 5, s.b_param_stride),
                  [&](int64_t batch, int64_t i, int64_t j0, const int32_t* sums, int64_t count) {
                    const int64_t row = (batch * plan.m + i) * plan.n + j0;
                    for (int64_t j = 0; j < count; ++j) {
                      const float b_scale = loadAsFloat(in[4].data, in[4].dtype, (j0 + j) * s.b_param_stride);
                      const int32_t sum = sums[j] + (bias != nullptr ? bias[j0 + j] : 0);
                      s.requantizer.store(y, row + j, sum, s.requantizer.multiplier(a_scale, b_scale, y_scale),
                                          y_zero);
                    }
                  });
  });
}

// ------------------------------------------------ integer convolution

// Calls sink(n, m, position, sum) with the i32 sum of (x - x_zero) * (w -
// w_zero[m]) of every output element; padding reads as x_zero (adds 0).
template <typename TX, typename TW, typename Sink>
void integerConv(const ConvGeometry& g, const TX* x, const TW* w, int32_t x_zero, const ZeroPoint& w_zero,
                 const Sink& sink) {
  const int64_t group_in = g.in_channels / g.group;
  const int64_t group_out = g.out_channels / g.group;
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t m = 0; m < g.out_channels; ++m) {
      const int64_t first_channel = (m / group_out) * group_in;
      const int32_t wz = w_zero.at(m);
      const TW* w_m = w + m * group_in * g.kernelSize();
      int64_t position = 0;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++position) {
            int32_t sum = 0;
            for (int64_t c = 0; c < group_in; ++c) {
              const TX* x_c = x + (n * g.in_channels + first_channel + c) * g.inPlane();
              const TW* w_c = w_m + c * g.kernelSize();
              for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
                const int64_t id = od * g.strides[0] - g.pad_begin[0] + kd * g.dilations[0];
                if (id < 0 || id >= g.in[0]) continue;
                for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
                  const int64_t ih = oh * g.strides[1] - g.pad_begin[1] + kh * g.dilations[1];
                  if (ih < 0 || ih >= g.in[1]) continue;
                  for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                    const int64_t iw = ow * g.strides[2] - g.pad_begin[2] + kw * g.dilations[2];
                    if (iw < 0 || iw >= g.in[2]) continue;
                    const int32_t xv = static_cast<int32_t>(x_c[(id * g.in[1] + ih) * g.in[2] + iw]) - x_zero;
                    const int32_t wv =
                        static_cast<int32_t>(w_c[(kd * g.kernel[1] + kh) * g.kernel[2] + kw]) - wz;
                    sum += xv * wv;
                  }
                }
              }
            }
            sink(n, m, position, sum);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------- ConvInteger

struct ConvIntegerState final : KernelState {
  ConvGeometry geometry;
  int64_t w_zero_stride = 0;
  std::unique_ptr<IntegerConvGemm> fast;  // constant weights (integer_conv_gemm.h)
};

std::unique_ptr<KernelState> prepareConvInteger(const KernelSetup& setup) {
  constexpr std::string_view op = "ConvInteger";
  expectCounts(op, setup, 2, 4, 1, 1);
  expectInteger8Inputs(op, setup, 0, 1);
  expectZeroPointType(op, setup, 2, 0);
  expectZeroPointType(op, setup, 3, 1);
  expectType(op, setup.outputs[0], setup.outputs[0].dtype == DType::kI32, "output", "i32");
  auto state = std::make_unique<ConvIntegerState>();
  state->geometry = convGeometry(op, setup.params, setup.inputs[0], setup.inputs[1], setup.outputs[0]);
  if (present(inputAt(setup, 2))) expectSingle(op, setup, 2);
  state->w_zero_stride = zeroPointStride(op, setup, 3, state->geometry.out_channels, "output channel");
  const auto constant = [&](size_t index) { return index < setup.constants.size() ? setup.constants[index] : nullptr; };
  const bool w_zero_known = !present(inputAt(setup, 3)) || constant(3) != nullptr;
  if (constant(1) != nullptr && w_zero_known) {
    state->fast = prepareIntegerConvGemm(state->geometry, setup.inputs[1].dtype, constant(1),
                                         present(inputAt(setup, 3)) ? constant(3) : nullptr, state->w_zero_stride);
  }
  return state;
}

void runConvInteger(const KernelCall& call) {
  const auto& s = static_cast<const ConvIntegerState&>(*call.state);
  const ConvGeometry& g = s.geometry;
  int32_t* y = call.outputs[0].as<int32_t>();
  const int32_t x_zero = zeroPointOf(call, 2, 0).at(0);
  if (s.fast && runIntegerConvGemm(*s.fast, call.inputs[0].dtype, call.inputs[0].data, x_zero, y)) return;
  withInteger8(call.inputs[0], call.inputs[1], [&](const auto* x, const auto* w) {
    integerConv(g, x, w, x_zero, zeroPointOf(call, 3, s.w_zero_stride),
                [&](int64_t n, int64_t m, int64_t position, int32_t sum) {
                  y[(n * g.out_channels + m) * g.outPlane() + position] = sum;
                });
  });
}

// ---------------------------------------------------------- QLinearConv

struct QLinearConvState final : KernelState {
  ConvGeometry geometry;
  int64_t w_param_stride = 0;  // w_scale and w_zero_point: per tensor or per output channel
  Requantizer requantizer;
};

// Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
// y_zero_point, B? (i32 [M], added to the sums).
std::unique_ptr<KernelState> prepareQLinearConv(const KernelSetup& setup) {
  constexpr std::string_view op = "QLinearConv";
  expectCounts(op, setup, 8, 9, 1, 1);
  expectInteger8Inputs(op, setup, 0, 3);
  expectZeroPointType(op, setup, 2, 0);
  expectZeroPointType(op, setup, 5, 3);
  expectType(op, setup.inputs[7], isInteger8(setup.inputs[7].dtype), "y_zero_point", "u8, i8");
  if (setup.outputs[0].dtype != setup.inputs[7].dtype) {
    throw UsageError(fmt::format("{}: the output {} must have the type of y_zero_point", op, typeText(setup.outputs[0])));
  }
  auto state = std::make_unique<QLinearConvState>();
  state->requantizer = Requantizer{commonScaleType(op, setup, {1, 4, 6}), setup.outputs[0].dtype};
  state->geometry = convGeometry(op, setup.params, setup.inputs[0], setup.inputs[3], setup.outputs[0]);
  for (size_t i : {1u, 2u, 6u, 7u}) expectSingle(op, setup, i);
  const int64_t channels = state->geometry.out_channels;
  state->w_param_stride = std::max(zeroPointStride(op, setup, 4, channels, "output channel"),
                                   zeroPointStride(op, setup, 5, channels, "output channel"));
  const TensorInfo& bias = inputAt(setup, 8);
  if (present(bias) && (bias.dtype != DType::kI32 || bias.shape != Ints{channels})) {
    throw UsageError(fmt::format("{}: the bias {} must be i32[{}]", op, typeText(bias), channels));
  }
  return state;
}

void runQLinearConv(const KernelCall& call) {
  const auto& s = static_cast<const QLinearConvState&>(*call.state);
  const ConvGeometry& g = s.geometry;
  const TensorView* in = call.inputs;
  const float x_scale = loadAsFloat(in[1].data, in[1].dtype, 0);
  const float y_scale = loadAsFloat(in[6].data, in[6].dtype, 0);
  const float y_zero = loadAsFloat(in[7].data, in[7].dtype, 0);
  const int32_t* bias = call.input_count > 8 ? in[8].as<const int32_t>() : nullptr;
  const int32_t x_zero = zeroPointOf(call, 2, 0).at(0);
  std::byte* y = call.outputs[0].data;
  withInteger8(in[0], in[3], [&](const auto* x, const auto* w) {
    integerConv(g, x, w, x_zero, zeroPointOf(call, 5, s.w_param_stride),
                [&](int64_t n, int64_t m, int64_t position, int32_t sum) {
                  const float w_scale = loadAsFloat(in[4].data, in[4].dtype, m * s.w_param_stride);
                  s.requantizer.store(y, (n * g.out_channels + m) * g.outPlane() + position,
                                      sum + (bias ? bias[m] : 0), s.requantizer.multiplier(x_scale, w_scale, y_scale),
                                      y_zero);
                });
  });
}

}  // namespace

void registerQuantizationKernels(KernelRegistry& registry) {
  registry.add({"QuantizeLinear", prepareQuantize, runQuantize});
  registry.add({"DequantizeLinear", prepareDequantize, runDequantize});
  registry.add({"DynamicQuantizeLinear", prepareDynamicQuantize, runDynamicQuantize});
  registry.add({"MatMulInteger", prepareMatMulInteger, runMatMulInteger});
  registry.add({"kiln.MatMulIntegerToFloat", prepareMatMulIntegerToFloat, runMatMulIntegerToFloat});
  registry.add({"QLinearMatMul", prepareQLinearMatMul, runQLinearMatMul});
  registry.add({"kiln.QLinearMatMul", prepareBiasedQLinearMatMul, runQLinearMatMul});
  registry.add({"ConvInteger", prepareConvInteger, runConvInteger});
  registry.add({"QLinearConv", prepareQLinearConv, runQLinearConv});
}

}  // namespace kiln
