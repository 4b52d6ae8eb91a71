// NonZero, NonMaxSuppression, Compress and Unique on the CPU
// (core/selection.h computes them).
//
// Their output size depends on the values they read, so a step is prepared
// with the size those values give: when the compiler folds them on constant
// inputs, or when DynamicExecutor evaluates them on the host on a call's
// values. The kernel writes as many rows as were planned. NonZero and
// Compress allocate nothing; NonMaxSuppression and Unique keep their working
// lists on the heap (they run in host stages, which allocate anyway).
#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "core/selection.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_checks.h"
#include "kiln/tensor_info.h"

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
  if (!selected.empty()) {
    std::memcpy(call.outputs[0].data, selected.data(), std::min<uint64_t>(values, selected.size()) * sizeof(int64_t));
  }
}

// The input around the axis attribute (flattened without one).
AxisSplit axisView(std::string_view op, const KernelSetup& setup, const TensorInfo& x) {
  std::optional<size_t> axis;
  if (setup.params.has("axis")) axis = checks::normalizeAxis(op, setup.params.getInt("axis", 0), x.shape.size());
  return splitAround(x.shape, axis);
}

struct CompressState final : KernelState {
  AxisSplit view;
  uint64_t conditions = 0;
  uint64_t selected = 0;  // the planned slices
  size_t slice_bytes = 0;  // inner elements
};

std::unique_ptr<KernelState> prepareCompress(const KernelSetup& setup) {
  expectCounts("Compress", setup, 2, 2, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& condition = setup.inputs[1];
  if (condition.dtype != DType::kBool || condition.shape.size() != 1) {
    throw UsageError(fmt::format("Compress: condition must be 1-D bool, got {}", typeText(condition)));
  }
  auto state = std::make_unique<CompressState>();
  state->view = axisView("Compress", setup, x);
  state->conditions = condition.numElements();
  const TensorInfo& y = setup.outputs[0];
  const uint64_t planned = state->view.outer * state->view.inner == 0
                               ? 0
                               : y.numElements() / static_cast<uint64_t>(state->view.outer * state->view.inner);
  if (y.dtype != x.dtype || planned * static_cast<uint64_t>(state->view.outer * state->view.inner) != y.numElements()) {
    throw UsageError(fmt::format("Compress: output {} does not hold whole slices of {}", typeText(y), typeText(x)));
  }
  state->selected = planned;
  state->slice_bytes = static_cast<size_t>(state->view.inner) * dtypeSize(x.dtype);
  return state;
}

void runCompress(const KernelCall& call) {
  const auto& s = static_cast<const CompressState&>(*call.state);
  const auto* condition = call.inputs[1].as<const uint8_t>();
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const uint64_t limit = std::min<uint64_t>(s.conditions, static_cast<uint64_t>(s.view.length));
  // Nothing selected: an empty output, and no walk over a vast outer axis.
  if (limit == 0 || s.selected == 0 || s.slice_bytes == 0) return;
  for (int64_t o = 0; o < s.view.outer; ++o) {
    uint64_t written = 0;
    for (uint64_t i = 0; i < limit && written < s.selected; ++i) {
      if (condition[i] == 0) continue;
      std::memcpy(y + (static_cast<uint64_t>(o) * s.selected + written) * s.slice_bytes,
                  x + (static_cast<uint64_t>(o) * static_cast<uint64_t>(s.view.length) + i) * s.slice_bytes,
                  s.slice_bytes);
      ++written;
    }
  }
}

struct UniqueState final : KernelState {
  AxisSplit view;
  DType dtype = DType::kUndefined;
  bool sorted = true;
  int64_t planned = 0;  // unique slices
  size_t slice_bytes = 0;
};

std::unique_ptr<KernelState> prepareUnique(const KernelSetup& setup) {
  expectCounts("Unique", setup, 1, 1, 1, 4);
  const TensorInfo& x = setup.inputs[0];
  auto state = std::make_unique<UniqueState>();
  state->view = axisView("Unique", setup, x);
  state->dtype = x.dtype;
  state->sorted = setup.params.getInt("sorted", 1) != 0;
  state->slice_bytes = static_cast<size_t>(state->view.inner) * dtypeSize(x.dtype);
  const std::optional<int64_t> slice_elements = checkedMultiply(state->view.outer, state->view.inner);
  if (!slice_elements) throw UsageError(fmt::format("Unique: the slices of {} are too large", typeText(x)));
  const int64_t per_unique = *slice_elements;
  const TensorInfo& y = setup.outputs[0];
  // Empty slices are all equal: one unique slice, none along an empty axis.
  state->planned = per_unique == 0 ? (state->view.length > 0 ? 1 : 0)
                                   : static_cast<int64_t>(y.numElements()) / per_unique;
  if (y.dtype != x.dtype || state->planned * per_unique != static_cast<int64_t>(y.numElements())) {
    throw UsageError(fmt::format("Unique: output {} does not hold whole slices of {}", typeText(y), typeText(x)));
  }
  const int64_t sizes[] = {state->planned, state->view.length, state->planned};
  for (size_t i = 1; i < setup.outputs.size(); ++i) {
    if (present(setup.outputs, i) && setup.outputs[i] != TensorInfo{DType::kI64, {sizes[i - 1]}}) {
      throw UsageError(fmt::format("Unique: output {} must be i64[{}], got {}", i, sizes[i - 1],
                                   typeText(setup.outputs[i])));
    }
  }
  return state;
}

// Unique of empty slices (all equal): the first slice, which every slice
// maps to, `length` times; nothing to sort, however many there are.
UniqueSlices uniqueOfEmptySlices(int64_t length) {
  UniqueSlices found;
  if (length > 0) {
    found.first = {0};
    found.counts = {length};
  }
  return found;  // inverse: all 0, as the outputs are cleared
}

void runUnique(const KernelCall& call) {
  const auto& s = static_cast<const UniqueState&>(*call.state);
  const bool empty_slices = s.view.outer == 0 || s.view.inner == 0;
  const UniqueSlices found =
      empty_slices ? uniqueOfEmptySlices(s.view.length)
                   : uniqueSlices(call.inputs[0].data, s.dtype, s.view.outer, s.view.length, s.view.inner, s.sorted);
  const auto unique = std::min<int64_t>(s.planned, static_cast<int64_t>(found.first.size()));
  std::byte* y = call.outputs[0].data;
  // (Empty slices copy nothing; an empty output's data may be null, which
  // memcpy must not get. Nothing to copy, no loop over a vast outer axis.)
  for (int64_t o = 0; s.slice_bytes > 0 && unique > 0 && o < s.view.outer; ++o) {
    for (int64_t u = 0; u < unique; ++u) {
      std::memcpy(y + static_cast<size_t>(o * s.planned + u) * s.slice_bytes,
                  call.inputs[0].data + static_cast<size_t>(o * s.view.length + found.first[static_cast<size_t>(u)]) *
                                            s.slice_bytes,
                  s.slice_bytes);
    }
  }
  const std::vector<int64_t>* lists[] = {&found.first, &found.inverse, &found.counts};
  for (uint32_t i = 1; i < call.output_count; ++i) {
    if (call.outputs[i].data == nullptr) continue;
    const std::vector<int64_t>& list = *lists[i - 1];
    const uint64_t room = call.outputs[i].numElements();
    std::memset(call.outputs[i].data, 0, room * sizeof(int64_t));
    // An empty list's data() may be null, which memcpy must not get.
    if (!list.empty()) {
      std::memcpy(call.outputs[i].data, list.data(), std::min<uint64_t>(room, list.size()) * sizeof(int64_t));
    }
  }
}

}  // namespace

void registerSelectionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"NonZero", &prepareNonZero, &runNonZero});
  registry.add(KernelDef{"NonMaxSuppression", &prepareNonMaxSuppression, &runNonMaxSuppression});
  registry.add(KernelDef{"Compress", &prepareCompress, &runCompress});
  registry.add(KernelDef{"Unique", &prepareUnique, &runUnique});
}

}  // namespace kiln
