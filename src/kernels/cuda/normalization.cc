// Softmax, LogSoftmax and LayerNormalization on cuda (f32, or f16 or bf16
// computed in f32; kernels in
// normalization_kernels.cu). Softmax follows opset 13 (one axis; the
// importer rewrites older opsets' flattening form). LayerNormalization with
// its optional Mean and InvStdDev outputs is declined (those steps run on
// the host); its scale and bias have the normalised shape or one element.
#include <fmt/format.h>

#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/post_ops.h"

namespace kiln::cuda {
namespace {

using setup_helpers::normalizeAxis;
using setup_helpers::present;
using setup_helpers::product;

[[noreturn]] void decline(std::string_view op, const std::string& why) {
  throw KernelUnsupported(fmt::format("{} on cuda: {}", op, why));
}

// Every tensor f32, or every one f16, or every one bf16: how they store.
FloatStorage expectOneFloatType(std::string_view op, const KernelSetup& setup) {
  const DType dtype = setup.inputs[0].dtype;
  const std::optional<FloatStorage> storage = floatStorageOf(dtype);
  if (!storage) decline(op, "inputs other than f32, f16 or bf16");
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    if (present(setup, i) && setup.inputs[i].dtype != dtype) decline(op, "inputs of different types");
  }
  for (const TensorInfo& output : setup.outputs) {
    if (output.dtype != dtype) decline(op, "an output of another type than its input");
  }
  return *storage;
}

struct SoftmaxState final : KernelState {
  int64_t outer = 1, axis = 1, inner = 1;
  bool log = false;
  FloatStorage storage = FloatStorage::kF32;
};

template <bool kLog>
std::unique_ptr<KernelState> prepareSoftmax(const KernelSetup& setup) {
  constexpr std::string_view op = kLog ? "LogSoftmax" : "Softmax";
  const FloatStorage storage = expectOneFloatType(op, setup);
  const std::vector<int64_t>& x = setup.inputs[0].shape;
  auto state = std::make_unique<SoftmaxState>();
  state->log = kLog;
  state->storage = storage;
  if (x.empty()) return state;
  const auto axis = static_cast<size_t>(normalizeAxis(op, setup.params.getInt("axis", -1), x.size()));
  state->outer = product(x, 0, axis);
  state->axis = x[axis];
  state->inner = product(x, axis + 1, x.size());
  return state;
}

void runSoftmax(const KernelCall& call) {
  const auto& s = *static_cast<const SoftmaxState*>(call.state);
  launchSoftmax(call.inputs[0].data, call.outputs[0].data, s.storage, s.outer, s.axis, s.inner, s.log,
                queueOf(call.queue).stream);
}

struct LayerNormState final : KernelState {
  int64_t rows = 0, cols = 0;
  float epsilon = 1e-5f;
  bool scale_is_scalar = false, bias_is_scalar = false, has_bias = false;
  FloatStorage storage = FloatStorage::kF32;
};

std::unique_ptr<KernelState> prepareLayerNorm(const KernelSetup& setup) {
  constexpr std::string_view op = "LayerNormalization";
  if (setup.outputs.size() > 1) decline(op, "the Mean and InvStdDev outputs");
  const FloatStorage storage = expectOneFloatType(op, setup);
  const std::vector<int64_t>& x = setup.inputs[0].shape;
  const auto axis = static_cast<size_t>(normalizeAxis(op, setup.params.getInt("axis", -1), x.size()));
  auto state = std::make_unique<LayerNormState>();
  state->storage = storage;
  state->rows = product(x, 0, axis);
  state->cols = product(x, axis, x.size());
  state->epsilon = static_cast<float>(setup.params.getFloat("epsilon", 1e-5));
  auto check = [&](size_t input, bool* scalar) {
    const uint64_t n = setup.inputs[input].numElements();
    if (n != 1 && n != static_cast<uint64_t>(state->cols)) decline(op, "a scale or bias that broadcasts otherwise");
    *scalar = n == 1;
  };
  check(1, &state->scale_is_scalar);
  state->has_bias = present(setup, 2);
  if (state->has_bias) check(2, &state->bias_is_scalar);
  return state;
}

void runLayerNorm(const KernelCall& call) {
  const auto& s = *static_cast<const LayerNormState*>(call.state);
  launchLayerNorm(call.inputs[0].data, call.inputs[1].data, s.scale_is_scalar, s.has_bias ? call.inputs[2].data : nullptr,
                  s.bias_is_scalar, call.outputs[0].data, s.storage, s.rows, s.cols, s.epsilon, queueOf(call.queue).stream);
}

}  // namespace

void registerCudaNormalizationKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Softmax", &prepareSoftmax<false>, &runSoftmax});
  registry.add(KernelDef{"LogSoftmax", &prepareSoftmax<true>, &runSoftmax});
  registry.add(KernelDef{"LayerNormalization", &prepareLayerNorm, &runLayerNorm});
}

}  // namespace kiln::cuda
