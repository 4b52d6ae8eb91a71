// NonZero and NonMaxSuppression on the CPU (core/selection.h computes them).
//
// Their output size depends on the values they read, so a step is prepared
// with the size those values give: when the compiler folds them on constant
// inputs, or when DynamicExecutor evaluates them on the host on a call's
// values. The kernel writes as many rows as were planned. NonZero allocates
// nothing; NonMaxSuppression keeps its candidate lists on the heap (it runs
// in host stages, which allocate anyway).
#include <fmt/format.h>

#include <cstring>

#include "core/selection.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_checks.h"

namespace kiln {
namespace {

using checks::constantInput;
using checks::expectCounts;
using checks::present;
using checks::typeText;

struct NonZeroState final : KernelState {
  std::vector<int64_t> shape;
  DType dtype = DType::kUndefined;
  uint64_t count = 0;  // the planned columns
};

std::unique_ptr<KernelState> prepareNonZero(const KernelSetup& setup) {
  expectCounts("NonZero", setup, 1, 1, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  if (x.shape.empty()) throw UsageError(fmt::format("NonZero: needs rank 1 or more, got {}", typeText(x)));
  if (y.dtype != DType::kI64 || y.shape.size() != 2 || y.shape[0] != static_cast<int64_t>(x.shape.size())) {
    throw UsageError(fmt::format("NonZero: output must be i64[{}, count], got {}", x.shape.size(), typeText(y)));
  }
  if (const std::byte* bytes = constantInput(setup, 0);
      bytes && countNonZero(bytes, x.dtype, x.numElements()) != static_cast<uint64_t>(y.shape[1])) {
    throw UsageError(fmt::format("NonZero: the input has {} non-zero elements, the output {} columns",
                                 countNonZero(bytes, x.dtype, x.numElements()), y.shape[1]));
  }
  auto state = std::make_unique<NonZeroState>();
  state->shape = x.shape;
  state->dtype = x.dtype;
  state->count = static_cast<uint64_t>(y.shape[1]);
  return state;
}

void runNonZero(const KernelCall& call) {
  const auto& s = static_cast<const NonZeroState&>(*call.state);
  // A call whose input has fewer non-zero elements than planned leaves the
  // rest zero rather than unwritten.
  std::memset(call.outputs[0].data, 0, s.shape.size() * s.count * sizeof(int64_t));
  writeNonZeroPositions(call.inputs[0].data, s.dtype, s.shape, call.outputs[0].as<int64_t>(), s.count);
}

struct NmsState final : KernelState {
  int64_t batches = 0, classes = 0, boxes = 0;
  uint64_t rows = 0;  // the planned selections
  int64_t center_point_box = 0;
};

std::unique_ptr<KernelState> prepareNonMaxSuppression(const KernelSetup& setup) {
  constexpr std::string_view op = "NonMaxSuppression";
  expectCounts(op, setup, 2, 5, 1, 1);
  const TensorInfo& boxes = setup.inputs[0];
  const TensorInfo& scores = setup.inputs[1];
  if (boxes.dtype != DType::kF32 || scores.dtype != DType::kF32 || boxes.shape.size() != 3 || boxes.shape[2] != 4 ||
      scores.shape.size() != 3 || boxes.shape[0] != scores.shape[0] || boxes.shape[1] != scores.shape[2]) {
    throw UsageError(fmt::format("{}: boxes must be f32[B, N, 4] and scores f32[B, C, N], got {} and {}", op,
                                 typeText(boxes), typeText(scores)));
  }
  const DType parameter_types[] = {DType::kI64, DType::kF32, DType::kF32};
  for (size_t i = 2; i < setup.inputs.size(); ++i) {
    if (present(setup.inputs, i) &&
        (setup.inputs[i].dtype != parameter_types[i - 2] || setup.inputs[i].numElements() != 1)) {
      throw UsageError(fmt::format("{}: input {} must be one {}, got {}", op, i, dtypeName(parameter_types[i - 2]),
                                   typeText(setup.inputs[i])));
    }
  }
  const TensorInfo& y = setup.outputs[0];
  if (y.dtype != DType::kI64 || y.shape.size() != 2 || y.shape[1] != 3) {
    throw UsageError(fmt::format("{}: output must be i64[count, 3], got {}", op, typeText(y)));
  }
  auto state = std::make_unique<NmsState>();
  state->batches = boxes.shape[0];
  state->boxes = boxes.shape[1];
  state->classes = scores.shape[1];
  state->rows = static_cast<uint64_t>(y.shape[0]);
  state->center_point_box = setup.params.getInt("center_point_box", 0);
  return state;
}

void runNonMaxSuppression(const KernelCall& call) {
  const auto& s = static_cast<const NmsState&>(*call.state);
  const auto scalar = [&](uint32_t i) {
    return i < call.input_count && call.inputs[i].data != nullptr ? call.inputs[i].data : nullptr;
  };
  const NonMaxSuppressionOptions options = nonMaxSuppressionOptions(s.center_point_box, scalar(2), scalar(3), scalar(4));
  const std::vector<int64_t> selected =
      nonMaxSuppression(call.inputs[0].as<float>(), call.inputs[1].as<float>(), s.batches, s.classes, s.boxes, options);
  const uint64_t values = s.rows * 3;
  std::memset(call.outputs[0].data, 0, values * sizeof(int64_t));
  std::memcpy(call.outputs[0].data, selected.data(), std::min<uint64_t>(values, selected.size()) * sizeof(int64_t));
}

}  // namespace

void registerSelectionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"NonZero", &prepareNonZero, &runNonZero});
  registry.add(KernelDef{"NonMaxSuppression", &prepareNonMaxSuppression, &runNonMaxSuppression});
}

}  // namespace kiln
