// Normalisation kernels (ONNX) over statistics of groups of elements, on the
// CPU: InstanceNormalization, GroupNormalization (opset 18: scale and bias
// per group; 21: per channel), MeanVarianceNormalization, LpNormalization,
// LRN, and Hardmax. All compute in f32; f16 and bf16 are converted around
// that (float_staging.h: scratch in the state, one call at a time per step).
//
// Means and variances take two passes in double (the mean, then the squares
// of x - mean), which keeps the variance exact for groups with a large mean.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::typeText;

// Checks the counts and that input 0 is f32, f16 or bf16 and the output has
// its type; the other inputs present must have its dtype.
void expectFloatInputs(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs) {
  checks::expectCounts(op, setup, min_inputs, max_inputs, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  if (!fp::isComputedInF32(x.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32, f16, bf16)", op, typeText(x)));
  }
  for (size_t i = 1; i < setup.inputs.size(); ++i) {
    if (checks::present(setup.inputs, i) && setup.inputs[i].dtype != x.dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but X is {}", op, i, typeText(setup.inputs[i]), typeText(x)));
    }
  }
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
}

struct Moments {
  float mean;
  float inv_std;  // 1 / sqrt(variance + epsilon)
};

// The mean and 1 / sqrt(var + epsilon) of n elements at x[offsets[i]] (or
// x[i] when offsets is null).
Moments momentsOf(const float* x, int64_t n, const int64_t* offsets, double epsilon) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[offsets == nullptr ? i : offsets[i]];
  const double mean = n == 0 ? 0 : sum / static_cast<double>(n);
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[offsets == nullptr ? i : offsets[i]] - mean;
    squares += d * d;
  }
  const double var = n == 0 ? 0 : squares / static_cast<double>(n);
  return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(var + epsilon))};
}

// -------------------------------------------- Instance and GroupNormalization

// Groups of `group_size` contiguous elements, each made of `channels_per_group`
// channels of `inner` elements; channel c gets scale[c] and bias[c] (or
// [group] when per_group).
struct GroupNormState final : KernelState {
  int64_t batch = 0, channels = 0, groups = 0, inner = 0;
  bool per_group = false;
  double epsilon = 1e-5;
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareGroupNormLike(std::string_view op, const KernelSetup& setup, int64_t groups) {
  expectFloatInputs(op, setup, 3, 3);
  const Ints& x = setup.inputs[0].shape;
  if (x.size() < 2) throw UsageError(fmt::format("{}: needs an input [N, C, ...], got {}", op, typeText(setup.inputs[0])));
  auto s = std::make_unique<GroupNormState>();
  s->batch = x[0];
  s->channels = x[1];
  s->groups = groups == 0 ? s->channels : groups;
  if (s->groups < 1 || s->channels % s->groups != 0) {
    throw UsageError(fmt::format("{}: the {} channels do not divide into {} groups", op, s->channels, s->groups));
  }
  s->inner = checks::elementCount(Ints(x.begin() + 2, x.end()));
  const Ints per_channel{s->channels};
  const Ints per_group{s->groups};
  for (size_t i : {1u, 2u}) {
    const Ints& shape = setup.inputs[i].shape;
    if (shape != per_channel && shape != per_group) {
      throw UsageError(fmt::format("{}: input {} is {} but must be [{}] (per channel) or [{}] (per group)", op, i,
                                   typeText(setup.inputs[i]), s->channels, s->groups));
    }
  }
  s->per_group = setup.inputs[1].shape != per_channel;
  if ((setup.inputs[2].shape != per_channel) != s->per_group) {
    throw UsageError(fmt::format("{}: scale {} and bias {} must both be per channel or both per group", op,
                                 typeText(setup.inputs[1]), typeText(setup.inputs[2])));
  }
  s->epsilon = setup.params.getFloat("epsilon", 1e-5);
  const int64_t stash = setup.params.getInt("stash_type", 1);
  if (stash != 1) throw UsageError(fmt::format("{}: stash_type {} is not supported (only 1, f32)", op, stash));
  s->staging.plan(setup);
  return s;
}

std::unique_ptr<KernelState> prepareInstanceNorm(const KernelSetup& setup) {
  if (setup.inputs.size() > 0 && setup.inputs[0].shape.size() < 3) {
    throw UsageError(fmt::format("InstanceNormalization: needs an input [N, C, D1, ...], got {}", typeText(setup.inputs[0])));
  }
  return prepareGroupNormLike("InstanceNormalization", setup, 0);
}

std::unique_ptr<KernelState> prepareGroupNorm(const KernelSetup& setup) {
  const int64_t groups = setup.params.getInt("num_groups", 0);
  if (groups < 1) throw UsageError(fmt::format("GroupNormalization: needs a positive num_groups, found {}", groups));
  return prepareGroupNormLike("GroupNormalization", setup, groups);
}

void runGroupNorm(const KernelCall& call) {
  const auto& s = static_cast<const GroupNormState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* scale = s.staging.input(call, 1);
  const float* bias = s.staging.input(call, 2);
  float* y = s.staging.output(call, 0);
  const int64_t per_group = s.channels / s.groups;
  const int64_t group_size = per_group * s.inner;
  parallelForItems(s.batch * s.groups, group_size, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t group = item % s.groups;
      const float* in = x + item * group_size;
      float* out = y + item * group_size;
      const Moments m = momentsOf(in, group_size, nullptr, s.epsilon);
      for (int64_t c = 0; c < per_group; ++c) {
        const int64_t param = s.per_group ? group : group * per_group + c;
        const float a = m.inv_std * scale[param];
        const float b = bias[param];
        for (int64_t e = c * s.inner; e < (c + 1) * s.inner; ++e) out[e] = (in[e] - m.mean) * a + b;
      }
    }
  });
  s.staging.finish(call);
}

// -------------------------------------------------- MeanVarianceNormalization

// y = (x - mean) / (sqrt(var) + 1e-9) over `axes` (default [0, 2, 3]), the
// epsilon of the ONNX function body. Each group is one combination of the
// kept axes; its elements are at base[group] + offsets[i].
struct MvnState final : KernelState {
  std::vector<int64_t> bases;
  std::vector<int64_t> offsets;
  fp::FloatStaging staging;
};

// The flat offsets of every element of the sub-grid of `shape` along the
// axes where `take` is true (the others at 0), in row-major order.
std::vector<int64_t> gridOffsets(const Ints& shape, const std::vector<bool>& take) {
  std::vector<int64_t> offsets = {0};
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!take[d]) continue;
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(shape[d]));
    for (int64_t base : offsets) {
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * strides[d]);
    }
    offsets = std::move(next);
  }
  return offsets;
}

std::unique_ptr<KernelState> prepareMvn(const KernelSetup& setup) {
  constexpr std::string_view op = "MeanVarianceNormalization";
  expectFloatInputs(op, setup, 1, 1);
  const Ints& x = setup.inputs[0].shape;
  std::vector<bool> reduced(x.size(), false);
  for (int64_t axis : setup.params.getInts("axes", {0, 2, 3})) {
    const size_t a = checks::normalizeAxis(op, axis, x.size());
    if (reduced[a]) throw UsageError(fmt::format("{}: axis {} repeats", op, axis));
    reduced[a] = true;
  }
  std::vector<bool> kept(x.size());
  for (size_t d = 0; d < x.size(); ++d) kept[d] = !reduced[d];
  auto s = std::make_unique<MvnState>();
  s->bases = gridOffsets(x, kept);
  s->offsets = gridOffsets(x, reduced);
  if (checks::elementCount(x) == 0) s->bases.clear();
  s->staging.plan(setup);
  return s;
}

void runMvn(const KernelCall& call) {
  const auto& s = static_cast<const MvnState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  float* y = s.staging.output(call, 0);
  const auto n = static_cast<int64_t>(s.offsets.size());
  parallelForItems(static_cast<int64_t>(s.bases.size()), n, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t base = s.bases[static_cast<size_t>(g)];
      const Moments m = momentsOf(x + base, n, s.offsets.data(), 0.0);
      const float inv = 1.0f / (1.0f / m.inv_std + 1e-9f);  // 1 / (sqrt(var) + 1e-9)
      for (int64_t offset : s.offsets) y[base + offset] = (x[base + offset] - m.mean) * inv;
    }
  });
  s.staging.finish(call);
}

// ------------------------------------------------------ along-one-axis ops

// LpNormalization and Hardmax work along one axis: [outer, axis, inner].
struct AxisState final : KernelState {
  int64_t outer = 0, axis = 0, inner = 0;
  int64_t p = 2;
  fp::FloatStaging staging;
};

std::unique_ptr<AxisState> prepareAlongAxis(std::string_view op, const KernelSetup& setup) {
  expectFloatInputs(op, setup, 1, 1);
  const Ints& x = setup.inputs[0].shape;
  auto s = std::make_unique<AxisState>();
  if (x.empty()) {
    s->outer = s->axis = s->inner = 1;
  } else {
    const size_t axis = checks::normalizeAxis(op, setup.params.getInt("axis", -1), x.size());
    s->outer = checks::elementCount(Ints(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(axis)));
    s->axis = x[axis];
    s->inner = checks::elementCount(Ints(x.begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.end()));
  }
  s->staging.plan(setup);
  return s;
}

std::unique_ptr<KernelState> prepareLpNorm(const KernelSetup& setup) {
  auto s = prepareAlongAxis("LpNormalization", setup);
  s->p = setup.params.getInt("p", 2);
  if (s->p != 1 && s->p != 2) throw UsageError(fmt::format("LpNormalization: p is {}; only 1 and 2 are defined", s->p));
  return s;
}

// y = x / ||x||_p along the axis; 0 where the norm is 0.
void runLpNorm(const KernelCall& call) {
  const auto& s = static_cast<const AxisState&>(*call.state);
  if (s.outer == 0 || s.axis == 0 || s.inner == 0) return;  // empty, and Y with it
  const float* x = s.staging.input(call, 0);
  float* y = s.staging.output(call, 0);
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const int64_t start = o * s.axis * s.inner + i;
      double norm = 0;
      for (int64_t a = 0; a < s.axis; ++a) {
        const double v = x[start + a * s.inner];
        norm += s.p == 1 ? std::abs(v) : v * v;
      }
      if (s.p == 2) norm = std::sqrt(norm);
      for (int64_t a = 0; a < s.axis; ++a) {
        const int64_t at = start + a * s.inner;
        y[at] = norm == 0 ? 0.0f : static_cast<float>(x[at] / norm);
      }
    }
  }
  s.staging.finish(call);
}

std::unique_ptr<KernelState> prepareHardmax(const KernelSetup& setup) { return prepareAlongAxis("Hardmax", setup); }

// 1 at the first maximum along the axis, 0 elsewhere.
void runHardmax(const KernelCall& call) {
  const auto& s = static_cast<const AxisState&>(*call.state);
  if (s.outer == 0 || s.axis == 0 || s.inner == 0) return;  // empty, and Y with it
  const float* x = s.staging.input(call, 0);
  float* y = s.staging.output(call, 0);
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const int64_t start = o * s.axis * s.inner + i;
      int64_t best = 0;
      for (int64_t a = 1; a < s.axis; ++a) {
        if (x[start + a * s.inner] > x[start + best * s.inner]) best = a;
      }
      for (int64_t a = 0; a < s.axis; ++a) y[start + a * s.inner] = a == best ? 1.0f : 0.0f;
    }
  }
  s.staging.finish(call);
}

// ---------------------------------------------------------------------- LRN

// y = x / (bias + alpha / size * sum of x^2 over the channels
// [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)])^beta.
struct LrnState final : KernelState {
  int64_t batch = 0, channels = 0, inner = 0;
  int64_t size = 1;
  float alpha = 1e-4f, beta = 0.75f, bias = 1;
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareLrn(const KernelSetup& setup) {
  constexpr std::string_view op = "LRN";
  expectFloatInputs(op, setup, 1, 1);
  const Ints& x = setup.inputs[0].shape;
  if (x.size() < 3) throw UsageError(fmt::format("{}: needs an input [N, C, D1, ...], got {}", op, typeText(setup.inputs[0])));
  auto s = std::make_unique<LrnState>();
  s->batch = x[0];
  s->channels = x[1];
  s->inner = checks::elementCount(Ints(x.begin() + 2, x.end()));
  s->size = setup.params.getInt("size", 0);
  if (s->size < 1) throw UsageError(fmt::format("{}: needs a positive size, found {}", op, s->size));
  s->alpha = static_cast<float>(setup.params.getFloat("alpha", 1e-4));
  s->beta = static_cast<float>(setup.params.getFloat("beta", 0.75));
  s->bias = static_cast<float>(setup.params.getFloat("bias", 1.0));
  s->staging.plan(setup);
  return s;
}

void runLrn(const KernelCall& call) {
  const auto& s = static_cast<const LrnState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  float* y = s.staging.output(call, 0);
  const int64_t before = (s.size - 1) / 2;
  const int64_t after = s.size / 2;  // ceil((size - 1) / 2)
  parallelForItems(s.batch * s.channels, s.inner * s.size, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / s.channels;
      const int64_t c = item % s.channels;
      const int64_t first = std::max<int64_t>(0, c - before);
      const int64_t last = std::min(s.channels - 1, c + after);
      for (int64_t e = 0; e < s.inner; ++e) {
        float squares = 0;
        for (int64_t k = first; k <= last; ++k) {
          const float v = x[(n * s.channels + k) * s.inner + e];
          squares += v * v;
        }
        const int64_t at = item * s.inner + e;
        y[at] = x[at] / std::pow(s.bias + s.alpha / static_cast<float>(s.size) * squares, s.beta);
      }
    }
  });
  s.staging.finish(call);
}

}  // namespace

void registerFeatureNormalizationKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"InstanceNormalization", &prepareInstanceNorm, &runGroupNorm});
  registry.add(KernelDef{"GroupNormalization", &prepareGroupNorm, &runGroupNorm});
  registry.add(KernelDef{"MeanVarianceNormalization", &prepareMvn, &runMvn});
  registry.add(KernelDef{"LpNormalization", &prepareLpNorm, &runLpNorm});
  registry.add(KernelDef{"Hardmax", &prepareHardmax, &runHardmax});
  registry.add(KernelDef{"LRN", &prepareLrn, &runLrn});
}

}  // namespace kiln
