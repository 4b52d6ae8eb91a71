// Training-side kernels (ONNX) on the CPU: NegativeLogLikelihoodLoss,
// SoftmaxCrossEntropyLoss and Dropout.
//
// The losses view the scores as [N, C, D] (D the product of the axes after
// the class axis) and the targets as [N, D]. An element whose target is
// ignore_index contributes nothing (loss 0, weight 0); so does a target
// outside [0, C), which ONNX leaves undefined (run cannot fail). "mean"
// divides the weighted sum by the sum of the weights of the counted
// elements, as the spec says. Sums run in double. SoftmaxCrossEntropyLoss
// computes each log-probability it needs as x - max - log(sum(exp(x - max)))
// down the class axis, without scratch. Scores in f16/bf16 are computed in
// f32 (float_staging.h: scratch in the state, one call at a time).
//
// Dropout passes X through (and a mask of all true) unless training_mode
// (input 2) is true at run time with a ratio above 0; then it zeroes each
// element with probability `ratio` and scales the rest by 1 / (1 - ratio).
// Its random numbers are kiln's own (a SplitMix64 stream from the seed
// attribute, restarted each call, so a seeded Dropout is deterministic); they
// cannot match the numpy generator of the ONNX reference. A training package
// sets kiln_mask_per_run (training/training_mode.h): its seeded stream then
// moves on each call, a new mask per training step, the same sequence in
// every session of the package.
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::present;
using checks::typeText;

// ------------------------------------------------------------------- Losses

enum class Reduction { kNone, kSum, kMean };

struct LossState final : KernelState {
  int64_t n = 0, classes = 0, inner = 0;  // scores [n, classes, inner]
  bool softmax = false;                   // SoftmaxCrossEntropyLoss
  bool target_i64 = true;
  bool has_weight = false;
  bool has_ignore = false;
  int64_t ignore_index = 0;
  Reduction reduction = Reduction::kMean;
  bool log_prob_output = false;
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareLoss(std::string_view op, const KernelSetup& setup, bool softmax) {
  checks::expectCounts(op, setup, 2, 3, 1, softmax ? 2 : 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& target = setup.inputs[1];
  if (!fp::isComputedInF32(x.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} scores (supports f32, f16, bf16)", op, typeText(x)));
  }
  if (target.dtype != DType::kI64 && target.dtype != DType::kI32) {
    throw UsageError(fmt::format("{}: the target must be i32 or i64, found {}", op, typeText(target)));
  }
  if (x.shape.size() < 2) throw UsageError(fmt::format("{}: the scores must be [N, C, ...], found {}", op, typeText(x)));
  Ints expected_target = {x.shape[0]};
  expected_target.insert(expected_target.end(), x.shape.begin() + 2, x.shape.end());
  if (target.shape != expected_target) {
    throw UsageError(fmt::format("{}: the target {} must be the scores' shape {} without the class axis", op,
                                 typeText(target), x.shapeString()));
  }
  auto s = std::make_unique<LossState>();
  s->n = x.shape[0];
  s->classes = x.shape[1];
  s->inner = checks::elementCount(expected_target) / std::max<int64_t>(s->n, 1);
  s->softmax = softmax;
  s->target_i64 = target.dtype == DType::kI64;
  s->has_weight = present(setup.inputs, 2);
  if (s->has_weight && (setup.inputs[2].dtype != x.dtype || setup.inputs[2].shape != Ints{s->classes})) {
    throw UsageError(fmt::format("{}: the weight must be {}[{}], found {}", op, dtypeName(x.dtype), s->classes,
                                 typeText(setup.inputs[2])));
  }
  s->has_ignore = setup.params.has("ignore_index");
  s->ignore_index = setup.params.getInt("ignore_index", 0);
  const std::string reduction = setup.params.getString("reduction", "mean");
  if (reduction == "none") {
    s->reduction = Reduction::kNone;
  } else if (reduction == "sum") {
    s->reduction = Reduction::kSum;
  } else if (reduction == "mean") {
    s->reduction = Reduction::kMean;
  } else {
    throw UsageError(fmt::format("{}: reduction is '{}', not none, sum or mean", op, reduction));
  }
  checks::expectOutput(op, setup, 0, x.dtype, s->reduction == Reduction::kNone ? expected_target : Ints{});
  if (setup.outputs.size() > 1) {
    checks::expectOutput(op, setup, 1, x.dtype, x.shape);
    s->log_prob_output = true;
  }
  s->staging.plan(setup);
  return s;
}

std::unique_ptr<KernelState> prepareNllLoss(const KernelSetup& setup) {
  return prepareLoss("NegativeLogLikelihoodLoss", setup, false);
}
std::unique_ptr<KernelState> prepareSceLoss(const KernelSetup& setup) {
  return prepareLoss("SoftmaxCrossEntropyLoss", setup, true);
}

// Writes the log-softmax down the class axis of column (i, d) into
// `log_prob` (stride `inner`), when given, and returns the log-probability
// of class `cls` (or 0 when cls < 0).
float logSoftmaxColumn(const LossState& s, const float* column, float* log_prob, int64_t cls) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < s.classes; ++c) max = std::max(max, column[c * s.inner]);
  double total = 0;
  for (int64_t c = 0; c < s.classes; ++c) total += std::exp(static_cast<double>(column[c * s.inner] - max));
  const float shift = max + static_cast<float>(std::log(total));
  if (log_prob != nullptr) {
    for (int64_t c = 0; c < s.classes; ++c) log_prob[c * s.inner] = column[c * s.inner] - shift;
  }
  return cls < 0 ? 0.0f : column[cls * s.inner] - shift;
}

void runLoss(const KernelCall& call) {
  const auto& s = static_cast<const LossState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* weight = s.has_weight ? s.staging.input(call, 2) : nullptr;
  const std::byte* targets = call.inputs[1].data;
  float* loss = s.staging.output(call, 0);
  float* log_prob = s.log_prob_output ? s.staging.output(call, 1) : nullptr;
  double loss_sum = 0;
  double weight_sum = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t d = 0; d < s.inner; ++d) {
      const int64_t at = i * s.inner + d;
      int64_t target;
      if (s.target_i64) {
        std::memcpy(&target, targets + at * 8, 8);
      } else {
        int32_t t32;
        std::memcpy(&t32, targets + at * 4, 4);
        target = t32;
      }
      const bool counted = !(s.has_ignore && target == s.ignore_index) && target >= 0 && target < s.classes;
      const int64_t cls = counted ? target : -1;
      const float* column = x + i * s.classes * s.inner + d;
      float value = 0;  // the log-probability (or score) of the target class
      if (s.softmax) {
        value = logSoftmaxColumn(s, column, log_prob == nullptr ? nullptr : log_prob + i * s.classes * s.inner + d, cls);
      } else if (counted) {
        value = column[cls * s.inner];
      }
      const float w = !counted ? 0.0f : (weight == nullptr ? 1.0f : weight[cls]);
      const float element = counted ? -value * w : 0.0f;
      if (s.reduction == Reduction::kNone) loss[at] = element;
      loss_sum += element;
      weight_sum += w;
    }
  }
  if (s.reduction == Reduction::kSum) loss[0] = static_cast<float>(loss_sum);
  if (s.reduction == Reduction::kMean) loss[0] = static_cast<float>(loss_sum / weight_sum);
  s.staging.finish(call);
}

// ------------------------------------------------------------------ Dropout

struct DropoutState final : KernelState {
  int64_t size = 0;
  size_t element_bytes = 0;
  DType dtype = DType::kUndefined;
  double default_ratio = 0.5;  // the attribute of opsets before 12; input 1 overrides it
  bool has_mask = false;
  bool seeded = false;
  uint64_t seed = 0;
  bool mask_per_run = false;
  mutable std::atomic<uint64_t> calls{0};  // varies the stream of an unseeded Dropout per call
};

std::unique_ptr<KernelState> prepareDropout(const KernelSetup& setup) {
  constexpr std::string_view op = "Dropout";
  checks::expectCounts(op, setup, 1, 3, 1, 2);
  const TensorInfo& x = setup.inputs[0];
  if (!fp::isComputedInF32(x.dtype) && x.dtype != DType::kF64) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32, f16, bf16, f64)", op, typeText(x)));
  }
  if (present(setup.inputs, 1)) {
    const TensorInfo& ratio = setup.inputs[1];
    if ((!fp::isComputedInF32(ratio.dtype) && ratio.dtype != DType::kF64) || checks::elementCount(ratio.shape) != 1) {
      throw UsageError(fmt::format("{}: ratio must be one floating-point value, found {}", op, typeText(ratio)));
    }
  }
  if (present(setup.inputs, 2)) {
    const TensorInfo& mode = setup.inputs[2];
    if (mode.dtype != DType::kBool || checks::elementCount(mode.shape) != 1) {
      throw UsageError(fmt::format("{}: training_mode must be one bool, found {}", op, typeText(mode)));
    }
  }
  if (setup.params.getInt("is_test", 1) == 0) {
    throw UsageError(fmt::format("{}: is_test = 0 (training, before opset 7) is not supported", op));
  }
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
  auto s = std::make_unique<DropoutState>();
  if (setup.outputs.size() > 1) {
    checks::expectOutput(op, setup, 1, DType::kBool, x.shape);
    s->has_mask = true;
  }
  s->size = checks::elementCount(x.shape);
  s->element_bytes = dtypeSize(x.dtype);
  s->dtype = x.dtype;
  s->default_ratio = setup.params.getFloat("ratio", 0.5);
  s->seeded = setup.params.has("seed");
  s->seed = static_cast<uint64_t>(setup.params.getInt("seed", 0));
  s->mask_per_run = setup.params.getInt("kiln_mask_per_run", 0) != 0;
  return s;
}

double scalarValue(const TensorView& view) {
  switch (view.dtype) {
    case DType::kF64: return *view.as<const double>();
    case DType::kF32: return *view.as<const float>();
    default: {
      float value;
      fp::toFloat(view.dtype, view.data, &value, 1);
      return value;
    }
  }
}

// SplitMix64: a small, well-mixed stream of 64-bit values.
uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// x * scale for element i of `dtype`, written in place of out's element i.
void scaleElement(DType dtype, const std::byte* x, std::byte* out, int64_t i, double scale) {
  if (dtype == DType::kF64) {
    reinterpret_cast<double*>(out)[i] = reinterpret_cast<const double*>(x)[i] * scale;
    return;
  }
  const size_t bytes = dtypeSize(dtype);
  float value;
  fp::toFloat(dtype, x + static_cast<size_t>(i) * bytes, &value, 1);
  value = static_cast<float>(value * scale);
  fp::fromFloat(dtype, &value, out + static_cast<size_t>(i) * bytes, 1);
}

void runDropout(const KernelCall& call) {
  const auto& s = static_cast<const DropoutState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  bool* mask = s.has_mask ? call.outputs[1].as<bool>() : nullptr;
  const double ratio = call.input_count > 1 && call.inputs[1].data != nullptr ? scalarValue(call.inputs[1]) : s.default_ratio;
  const bool training =
      call.input_count > 2 && call.inputs[2].data != nullptr && *call.inputs[2].as<const bool>();
  if (!training || ratio <= 0) {
    if (y != x) std::memmove(y, x, static_cast<size_t>(s.size) * s.element_bytes);
    if (mask != nullptr) std::fill(mask, mask + s.size, true);
    return;
  }
  uint64_t state = s.seeded ? s.seed : 0x5EED0000ull + s.calls.fetch_add(1);
  if (s.seeded && s.mask_per_run) {
    // Call k starts at a hashed point of the stream, far from call k - 1's.
    uint64_t start = s.seed ^ ((s.calls.fetch_add(1) + 1) * 0xD1B54A32D192ED03ull);
    state = splitMix64(start);
  }
  const double keep_scale = ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio);
  for (int64_t i = 0; i < s.size; ++i) {
    const double u = static_cast<double>(splitMix64(state) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    const bool keep = u >= ratio;
    scaleElement(s.dtype, x, y, i, keep ? keep_scale : 0.0);
    if (mask != nullptr) mask[i] = keep;
  }
}

}  // namespace

void registerLossKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"NegativeLogLikelihoodLoss", &prepareNllLoss, &runLoss});
  registry.add(KernelDef{"SoftmaxCrossEntropyLoss", &prepareSceLoss, &runLoss});
  registry.add(KernelDef{"Dropout", &prepareDropout, &runDropout});
}

}  // namespace kiln
