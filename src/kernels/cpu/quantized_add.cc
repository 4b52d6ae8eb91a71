// kiln.QLinearAdd and kiln.QLinearMul(a, a_scale, a_zero_point, b, b_scale,
// b_zero_point, y_scale, y_zero_point): the sum or product of two quantized
// tensors of one shape, quantized again, without a round trip through f32
// tensors. What the QDQ fusion (src/passes/qdq_fusion.h) makes of
// Q(Add(DQ(a), DQ(b))) (a residual connection) and Q(Mul(DQ(a), DQ(b))) (a
// hard-swish written as x * HardSigmoid(x), a gate); the same as
// onnxruntime's com.microsoft QLinearAdd and QLinearMul (its QDQ transformer
// makes the same nodes), and computed as its kernels compute them:
//
//   y = saturate(round((a_scale / y_scale) * (a - a_zero) + (b_scale / y_scale) * (b - b_zero)) + y_zero)
//   y = saturate(round((a_scale * b_scale / y_scale) * ((a - a_zero) * (b - b_zero))) + y_zero)
//
// in f32, rounding half to even. a, b and y are all u8 or all i8; the scales
// and zero points hold one value each and are read per call.
#include <fmt/format.h>

#include <cstdint>
#include <memory>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

// Which of the two a state computes.
struct QuantizedBinaryState final : KernelState {
  bool multiply = false;
};

std::unique_ptr<KernelState> prepareQuantizedBinary(const KernelSetup& setup, const char* op, bool multiply) {
  if (setup.inputs.size() != 8 || setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 8 inputs and 1 output", op));
  }
  const TensorInfo& y = setup.outputs[0];
  if (y.dtype != DType::kU8 && y.dtype != DType::kI8) {
    throw UsageError(fmt::format("{}: the output must be u8 or i8, found {}", op, dtypeName(y.dtype)));
  }
  for (size_t i : {0u, 3u}) {
    if (setup.inputs[i] != y) {
      throw UsageError(fmt::format("{}: input {} is {}{} but the output is {}{}: they must be equal", op, i,
                                   dtypeName(setup.inputs[i].dtype), setup.inputs[i].shapeString(),
                                   dtypeName(y.dtype), y.shapeString()));
    }
  }
  for (size_t i : {1u, 2u, 4u, 5u, 6u, 7u}) {
    const TensorInfo& param = setup.inputs[i];
    if (param.numElements() != 1 || !isLoadableAsFloat(param.dtype)) {
      throw UsageError(fmt::format("{}: input {} (a scale or zero point) must hold one value, found {}{}", op, i,
                                   dtypeName(param.dtype), param.shapeString()));
    }
  }
  auto state = std::make_unique<QuantizedBinaryState>();
  state->multiply = multiply;
  return state;
}

std::unique_ptr<KernelState> prepareQLinearAdd(const KernelSetup& setup) {
  return prepareQuantizedBinary(setup, "kiln.QLinearAdd", false);
}
std::unique_ptr<KernelState> prepareQLinearMul(const KernelSetup& setup) {
  return prepareQuantizedBinary(setup, "kiln.QLinearMul", true);
}

void runQuantizedBinary(const KernelCall& call) {
  const bool multiply = static_cast<const QuantizedBinaryState&>(*call.state).multiply;
  const TensorView* in = call.inputs;
  auto param = [&](size_t i) { return loadAsFloat(in[i].data, in[i].dtype, 0); };
  const float y_scale = param(6);
  // The product's multiplier is formed as onnxruntime forms it: a_scale * b_scale / y_scale.
  const vec::QuantizedBinaryParams p{.multiply = multiply,
                                     .a_ratio = multiply ? param(1) * param(4) / y_scale : param(1) / y_scale,
                                     .a_zero = param(2),
                                     .b_ratio = param(4) / y_scale,
                                     .b_zero = param(5),
                                     .y_zero = param(7),
                                     .signed_bytes = call.outputs[0].dtype == DType::kI8};
  const auto* a = in[0].as<const uint8_t>();
  const auto* b = in[3].as<const uint8_t>();
  auto* y = call.outputs[0].as<uint8_t>();
  const vec::VectorKernels& kernels = vec::vectorKernels();
  parallelForElements(static_cast<int64_t>(call.outputs[0].numElements()), [&](int64_t begin, int64_t end) {
    kernels.binaryQuantized(a + begin, b + begin, y + begin, end - begin, p);
  }, 4);
}

}  // namespace

void registerQuantizedAddKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"kiln.QLinearAdd", &prepareQLinearAdd, &runQuantizedBinary});
  registry.add(KernelDef{"kiln.QLinearMul", &prepareQLinearMul, &runQuantizedBinary});
}

}  // namespace kiln
