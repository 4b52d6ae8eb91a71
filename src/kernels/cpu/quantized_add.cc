// kiln.QLinearAdd(a, a_scale, a_zero_point, b, b_scale, b_zero_point,
// y_scale, y_zero_point): the sum of two quantized tensors of one shape,
// quantized again, without a round trip through f32 tensors. What the QDQ
// fusion (src/passes/qdq_fusion.h) makes of Q(Add(DQ(a), DQ(b))), the
// residual Add of a quantized CNN; the same as onnxruntime's com.microsoft
// QLinearAdd (its QDQ transformer makes the same node), and computed as its
// kernel computes it:
//
//   y = saturate(round((a_scale / y_scale) * (a - a_zero) + (b_scale / y_scale) * (b - b_zero)) + y_zero)
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

constexpr const char* kKernel = "kiln.QLinearAdd";

std::unique_ptr<KernelState> prepareQLinearAdd(const KernelSetup& setup) {
  if (setup.inputs.size() != 8 || setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 8 inputs and 1 output", kKernel));
  }
  const TensorInfo& y = setup.outputs[0];
  if (y.dtype != DType::kU8 && y.dtype != DType::kI8) {
    throw UsageError(fmt::format("{}: the output must be u8 or i8, found {}", kKernel, dtypeName(y.dtype)));
  }
  for (size_t i : {0u, 3u}) {
    if (setup.inputs[i] != y) {
      throw UsageError(fmt::format("{}: input {} is {}{} but the output is {}{}: they must be equal", kKernel, i,
                                   dtypeName(setup.inputs[i].dtype), setup.inputs[i].shapeString(),
                                   dtypeName(y.dtype), y.shapeString()));
    }
  }
  for (size_t i : {1u, 2u, 4u, 5u, 6u, 7u}) {
    const TensorInfo& param = setup.inputs[i];
    if (param.numElements() != 1 || !isLoadableAsFloat(param.dtype)) {
      throw UsageError(fmt::format("{}: input {} (a scale or zero point) must hold one value, found {}{}", kKernel, i,
                                   dtypeName(param.dtype), param.shapeString()));
    }
  }
  return std::make_unique<KernelState>();
}

void runQLinearAdd(const KernelCall& call) {
  const TensorView* in = call.inputs;
  auto param = [&](size_t i) { return loadAsFloat(in[i].data, in[i].dtype, 0); };
  const float y_scale = param(6);
  const vec::QuantizedAddParams p{.a_ratio = param(1) / y_scale,
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
    kernels.addQuantized(a + begin, b + begin, y + begin, end - begin, p);
  }, 4);
}

}  // namespace

void registerQuantizedAddKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"kiln.QLinearAdd", &prepareQLinearAdd, &runQLinearAdd});
}

}  // namespace kiln
