// Normalisation kernels (ONNX) on the CPU in f32: BatchNormalization
// (inference, and training mode with its running statistics),
// LayerNormalization, Softmax and LogSoftmax (opset-13 semantics: along one
// axis).
//
// Their loops are the vector kernels' row helpers (vector_kernels.h: sums,
// max, exp-and-sum, affine maps, written for AVX-512, AVX2 and SSE2). Each
// reads an element before it writes the same index, so in-place execution
// (Y aliasing X) is right.
//
// BatchNormalization folds scale, B, mean and var into y = a * x + b per
// channel; when all four are constants that happens once at prepare,
// otherwise per call (one sqrt per channel). LayerNormalization takes two
// passes per row (mean, then the variance of x - mean), which keeps the
// variance exact for rows with a large mean. Softmax subtracts the row
// maximum before exp. Large calls split their rows (or channels, or column
// blocks) across threads (parallel.h). None of them allocates while running.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

bool present(const TensorInfo& info) { return info.dtype != DType::kUndefined; }

// Checks the counts, and f32 and static shapes of every input present.
void expectF32(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    const std::string expected =
        min_inputs == max_inputs ? std::to_string(min_inputs) : fmt::format("{} to {}", min_inputs, max_inputs);
    throw UsageError(fmt::format("{}: expects {} inputs, got {}", op, expected, setup.inputs.size()));
  }
  if (setup.outputs.empty()) throw UsageError(fmt::format("{}: expects an output", op));
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (!present(input)) {
      if (i < min_inputs) throw UsageError(fmt::format("{}: input {} is required", op, i));
      continue;
    }
    if (input.dtype != DType::kF32) {
      throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32); input {} is {}", op,
                                   dtypeName(input.dtype), i, typeString(input)));
    }
    if (!input.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
}

void expectOutput(std::string_view op, const KernelSetup& setup, size_t index, const Ints& shape) {
  const TensorInfo expected{DType::kF32, shape};
  if (setup.outputs[index] != expected) {
    throw UsageError(fmt::format("{}: output {} is {} but the inputs give {}", op, index,
                                 typeString(setup.outputs[index]), typeString(expected)));
  }
}

size_t normalizeAxis(std::string_view op, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw UsageError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  }
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

float loadFloat(const std::byte* bytes, int64_t index) {
  float v;
  std::memcpy(&v, bytes + static_cast<size_t>(index) * sizeof(float), sizeof v);
  return v;
}

// ------------------------------------------------------ BatchNormalization

struct BatchNormState final : KernelState {
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t inner = 0;  // elements per channel and batch index
  float epsilon = 0;
  bool folded = false;
  std::vector<float> a;  // when folded
  std::vector<float> b;
  // training_mode: normalise with the batch's own statistics and write the
  // updated running mean and variance (outputs 1 and 2, when present).
  bool training = false;
  float momentum = 0.9f;
};

std::unique_ptr<KernelState> prepareBatchNorm(const KernelSetup& setup) {
  constexpr std::string_view op = "BatchNormalization";
  expectF32(op, setup, 5, 5);
  const bool training = setup.params.getInt("training_mode", 0) != 0;
  if (setup.params.getInt("spatial", 1) == 0) {
    throw UsageError("BatchNormalization: spatial = 0 (per-element parameters, before opset 9) is not supported");
  }
  size_t outputs = 0;
  for (const TensorInfo& out : setup.outputs) outputs += present(out) ? 1 : 0;
  if (training && outputs > 3) {
    throw UsageError("BatchNormalization: training_mode writes Y, running_mean and running_var; the saved statistics "
                     "outputs of opsets before 14 are not supported");
  }
  if (!training && (outputs != 1 || !present(setup.outputs[0]))) {
    throw UsageError(
        "BatchNormalization: only the inference form with one output (Y) is supported; the running statistics "
        "outputs are not");
  }
  const Ints& x = setup.inputs[0].shape;
  if (x.size() < 2) {
    throw UsageError(fmt::format("{}: needs an input [N, C, ...] of rank 2 or more, got {}", op,
                                 typeString(setup.inputs[0])));
  }
  const char* names[] = {"", "scale", "B", "mean", "var"};
  for (size_t i = 1; i < 5; ++i) {
    if (setup.inputs[i].shape != Ints{x[1]}) {
      throw UsageError(fmt::format("{}: {} (input {}) is {} but must be [{}]", op, names[i], i,
                                   typeString(setup.inputs[i]), x[1]));
    }
  }
  expectOutput(op, setup, 0, x);
  auto state = std::make_unique<BatchNormState>();
  state->batch = x[0];
  state->channels = x[1];
  state->inner = 1;
  for (size_t i = 2; i < x.size(); ++i) state->inner *= x[i];
  state->epsilon = static_cast<float>(setup.params.getFloat("epsilon", 1e-5));
  if (training) {
    for (size_t i = 1; i < setup.outputs.size(); ++i) expectOutput(op, setup, i, {x[1]});
    state->training = true;
    state->momentum = static_cast<float>(setup.params.getFloat("momentum", 0.9));
    return state;
  }
  bool constants = true;
  for (size_t i = 1; i < 5; ++i) constants = constants && constantInput(setup, i) != nullptr;
  if (constants) {
    state->folded = true;
    state->a.resize(static_cast<size_t>(x[1]));
    state->b.resize(static_cast<size_t>(x[1]));
    for (int64_t c = 0; c < x[1]; ++c) {
      // In double, rounded once: the per-call path computes the same in f32.
      const double a = static_cast<double>(loadFloat(constantInput(setup, 1), c)) /
                       std::sqrt(static_cast<double>(loadFloat(constantInput(setup, 4), c)) + state->epsilon);
      state->a[static_cast<size_t>(c)] = static_cast<float>(a);
      state->b[static_cast<size_t>(c)] = static_cast<float>(
          static_cast<double>(loadFloat(constantInput(setup, 2), c)) - a * loadFloat(constantInput(setup, 3), c));
    }
  }
  return state;
}

// Training mode: per channel, the mean and (population) variance over the
// batch and spatial axes normalise x; running = input * momentum + batch
// statistic * (1 - momentum).
void runBatchNormTraining(const KernelCall& call, const BatchNormState& s) {
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  const float* scale = call.inputs[1].as<const float>();
  const float* bias = call.inputs[2].as<const float>();
  const float* mean_in = call.inputs[3].as<const float>();
  const float* var_in = call.inputs[4].as<const float>();
  float* mean_out = call.output_count > 1 ? call.outputs[1].as<float>() : nullptr;
  float* var_out = call.output_count > 2 ? call.outputs[2].as<float>() : nullptr;
  const double count = static_cast<double>(s.batch * s.inner);
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      const float* row = x + (n * s.channels + c) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) sum += row[i];
    }
    const double mean = count == 0 ? 0 : sum / count;
    double squares = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      const float* row = x + (n * s.channels + c) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) squares += (row[i] - mean) * (row[i] - mean);
    }
    const double var = count == 0 ? 0 : squares / count;
    const double a = scale[c] / std::sqrt(var + s.epsilon);
    for (int64_t n = 0; n < s.batch; ++n) {
      const float* row = x + (n * s.channels + c) * s.inner;
      float* out = y + (n * s.channels + c) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) out[i] = static_cast<float>((row[i] - mean) * a + bias[c]);
    }
    if (mean_out != nullptr) mean_out[c] = static_cast<float>(mean_in[c] * s.momentum + mean * (1 - s.momentum));
    if (var_out != nullptr) var_out[c] = static_cast<float>(var_in[c] * s.momentum + var * (1 - s.momentum));
  }
}

void runBatchNorm(const KernelCall& call) {
  const auto& s = static_cast<const BatchNormState&>(*call.state);
  if (s.training) return runBatchNormTraining(call, s);
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  const float* scale = call.inputs[1].as<const float>();
  const float* bias = call.inputs[2].as<const float>();
  const float* mean = call.inputs[3].as<const float>();
  const float* var = call.inputs[4].as<const float>();
  const vec::VectorKernels& kernels = vec::vectorKernels();
  // One item per (batch index, channel).
  parallelForItems(s.batch * s.channels, s.inner, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item % s.channels;
      float a;
      float b;
      if (s.folded) {
        a = s.a[static_cast<size_t>(c)];
        b = s.b[static_cast<size_t>(c)];
      } else {
        a = scale[c] / std::sqrt(var[c] + s.epsilon);
        b = bias[c] - a * mean[c];
      }
      kernels.affine(x + item * s.inner, y + item * s.inner, s.inner, a, b);
    }
  });
}

// ------------------------------------------------------ LayerNormalization

struct LayerNormState final : KernelState {
  int64_t rows = 0;
  int64_t size = 0;  // normalised elements per row
  float epsilon = 0;
  bool scale_scalar = false;  // one value for every element, else [size]
  bool has_bias = false;
  bool bias_scalar = false;
  bool mean_output = false;
  bool inv_std_output = false;
};

// True when `param` broadcasts to `normalized` as one value; false when it is
// the whole of it; UsageError otherwise.
bool layerNormParam(const KernelSetup& setup, size_t index, const Ints& normalized) {
  const Ints& shape = setup.inputs[index].shape;
  uint64_t count = 1;
  for (int64_t d : shape) count *= static_cast<uint64_t>(d);
  if (count == 1) return true;
  // The same shape, with any leading 1s.
  size_t lead = 0;
  while (shape.size() - lead > normalized.size() && shape[lead] == 1) ++lead;
  if (Ints(shape.begin() + static_cast<std::ptrdiff_t>(lead), shape.end()) ==
      Ints(normalized.end() - static_cast<std::ptrdiff_t>(std::min(normalized.size(), shape.size() - lead)),
           normalized.end())) {
    uint64_t n = 1;
    for (int64_t d : normalized) n *= static_cast<uint64_t>(d);
    if (count == n) return false;
  }
  throw UsageError(fmt::format(
      "LayerNormalization: input {} {} must have the normalised shape {} (or be one value); other broadcasts are "
      "not supported",
      index, typeString(setup.inputs[index]), TensorInfo{DType::kF32, normalized}.shapeString()));
}

std::unique_ptr<KernelState> prepareLayerNorm(const KernelSetup& setup) {
  constexpr std::string_view op = "LayerNormalization";
  expectF32(op, setup, 2, 3);
  if (setup.outputs.size() > 3) throw UsageError(fmt::format("{}: expects 1 to 3 outputs, got {}", op, setup.outputs.size()));
  const int64_t stash = setup.params.getInt("stash_type", 1);
  if (stash != 1) {
    throw UsageError(fmt::format("{}: stash_type {} is not supported (only 1, f32)", op, stash));
  }
  const Ints& x = setup.inputs[0].shape;
  if (x.empty()) throw UsageError(fmt::format("{}: needs an input of rank 1 or more, got a scalar", op));
  const size_t axis = normalizeAxis(op, setup.params.getInt("axis", -1), x.size());
  const Ints normalized(x.begin() + static_cast<std::ptrdiff_t>(axis), x.end());
  auto state = std::make_unique<LayerNormState>();
  state->rows = 1;
  for (size_t i = 0; i < axis; ++i) state->rows *= x[i];
  state->size = 1;
  for (int64_t d : normalized) state->size *= d;
  state->epsilon = static_cast<float>(setup.params.getFloat("epsilon", 1e-5));
  state->scale_scalar = layerNormParam(setup, 1, normalized);
  state->has_bias = setup.inputs.size() == 3 && present(setup.inputs[2]);
  if (state->has_bias) state->bias_scalar = layerNormParam(setup, 2, normalized);
  expectOutput(op, setup, 0, x);
  Ints stats(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(axis));
  stats.insert(stats.end(), x.size() - axis, 1);
  for (size_t i = 1; i < setup.outputs.size(); ++i) {
    if (!present(setup.outputs[i])) continue;
    expectOutput(op, setup, i, stats);
    (i == 1 ? state->mean_output : state->inv_std_output) = true;
  }
  return state;
}

// One row of n elements: (x - mean) * inv_std * scale + bias.
void layerNormRow(const LayerNormState& s, const vec::VectorKernels& kernels, const float* x, const float* scale,
                  const float* bias, float* y, float* mean_out, float* inv_out) {
  const int64_t n = s.size;
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mean = kernels.sum(x, n) * inv_n;
  const float var = kernels.sumSquares(x, n, mean) * inv_n;
  const float inv_std = 1.0f / std::sqrt(var + s.epsilon);
  if (mean_out != nullptr) *mean_out = mean;
  if (inv_out != nullptr) *inv_out = inv_std;
  // A scale or bias of one value is applied in a second pass over the row:
  // subtracting the mean first keeps the precision that folding it into one
  // affine map would lose.
  if (!s.scale_scalar) {
    kernels.normalize(x, scale, s.bias_scalar ? nullptr : bias, y, n, mean, inv_std);
    if (s.bias_scalar) kernels.affine(y, y, n, 1.0f, bias[0]);
    return;
  }
  kernels.affine(x, y, n, 1.0f, -mean);
  const float a = inv_std * scale[0];
  if (bias == nullptr || s.bias_scalar) {
    kernels.affine(y, y, n, a, bias == nullptr ? 0.0f : bias[0]);
  } else {
    kernels.binaryFn(vec::Binary::kMul, vec::Operands::kScalarB)(y, &a, y, n);
    kernels.binaryFn(vec::Binary::kAdd, vec::Operands::kBoth)(y, bias, y, n);
  }
}

void runLayerNorm(const KernelCall& call) {
  const auto& s = static_cast<const LayerNormState&>(*call.state);
  const float* x = call.inputs[0].as<const float>();
  const float* scale = call.inputs[1].as<const float>();
  const float* bias = s.has_bias ? call.inputs[2].as<const float>() : nullptr;
  float* y = call.outputs[0].as<float>();
  float* mean_out = s.mean_output ? call.outputs[1].as<float>() : nullptr;
  float* inv_out = s.inv_std_output ? call.outputs[2].as<float>() : nullptr;
  const vec::VectorKernels& kernels = vec::vectorKernels();
  parallelForItems(s.rows, s.size, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      layerNormRow(s, kernels, x + r * s.size, scale, bias, y + r * s.size,
                   mean_out == nullptr ? nullptr : mean_out + r, inv_out == nullptr ? nullptr : inv_out + r);
    }
  });
}

// ------------------------------------------------------ Softmax, LogSoftmax

struct SoftmaxState final : KernelState {
  int64_t outer = 0;
  int64_t axis = 0;   // elements along the axis
  int64_t inner = 0;  // elements after the axis
  bool log = false;
};

std::unique_ptr<KernelState> prepareSoftmaxLike(std::string_view op, const KernelSetup& setup, bool log) {
  expectF32(op, setup, 1, 1);
  if (setup.outputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  const Ints& x = setup.inputs[0].shape;
  expectOutput(op, setup, 0, x);
  auto state = std::make_unique<SoftmaxState>();
  state->log = log;
  if (x.empty()) {  // a scalar: one row of one element
    state->outer = state->axis = state->inner = 1;
    return state;
  }
  const size_t axis = normalizeAxis(op, setup.params.getInt("axis", -1), x.size());
  state->outer = 1;
  for (size_t i = 0; i < axis; ++i) state->outer *= x[i];
  state->axis = x[axis];
  state->inner = 1;
  for (size_t i = axis + 1; i < x.size(); ++i) state->inner *= x[i];
  return state;
}

// One contiguous row of n elements.
void softmaxRow(const vec::VectorKernels& kernels, const float* x, float* y, int64_t n, bool log) {
  const float m = kernels.max(x, n);
  if (log) {
    const float total = kernels.expSum(x, nullptr, n, m);
    kernels.affine(x, y, n, 1.0f, -(m + std::log(total)));
  } else {
    const float total = kernels.expSum(x, y, n, m);
    kernels.affine(y, y, n, 1.0f / total, 0.0f);
  }
}

// Columns are softmaxed kColumns at a time, with their running maxima and
// sums on the stack.
constexpr int64_t kColumns = 256;

// Columns [0, width) of a [n, stride] block, width <= kColumns: softmax
// down each column, a row of the block at a time (vector rows across the
// columns).
void softmaxColumns(const vec::VectorKernels& kernels, const float* x, float* y, int64_t n, int64_t stride,
                    int64_t width, bool log) {
  using vec::Binary;
  using vec::Operands;
  const vec::BinaryFn max = kernels.binaryFn(Binary::kMax, Operands::kBoth);
  const vec::BinaryFn add = kernels.binaryFn(Binary::kAdd, Operands::kBoth);
  const vec::BinaryFn sub = kernels.binaryFn(Binary::kSub, Operands::kBoth);
  const vec::BinaryFn mul = kernels.binaryFn(Binary::kMul, Operands::kBoth);
  const vec::UnaryFn exp = kernels.unaryFn(vec::Unary::kExp);
  float m[kColumns];
  float total[kColumns];
  float e[kColumns];
  std::fill(m, m + width, -std::numeric_limits<float>::infinity());
  std::fill(total, total + width, 0.0f);
  for (int64_t a = 0; a < n; ++a) max(m, x + a * stride, m, width);
  for (int64_t a = 0; a < n; ++a) {
    // LogSoftmax reads x again at the end, so its exps go to the stack, not
    // to y (which may be x).
    float* out = log ? e : y + a * stride;
    sub(x + a * stride, m, out, width);
    exp(out, out, width, 0, 0);
    add(total, out, total, width);
  }
  if (log) {
    kernels.unaryFn(vec::Unary::kLog)(total, total, width, 0, 0);
    add(total, m, total, width);
    for (int64_t a = 0; a < n; ++a) sub(x + a * stride, total, y + a * stride, width);
  } else {
    kernels.unaryFn(vec::Unary::kReciprocal)(total, total, width, 0, 0);
    for (int64_t a = 0; a < n; ++a) mul(y + a * stride, total, y + a * stride, width);
  }
}

void runSoftmax(const KernelCall& call) {
  const auto& s = static_cast<const SoftmaxState&>(*call.state);
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  if (s.axis == 0) return;
  const vec::VectorKernels& kernels = vec::vectorKernels();
  // One item per row (inner == 1) or per block of up to kColumns columns.
  const int64_t blocks = (s.inner + kColumns - 1) / kColumns;
  parallelForItems(s.outer * blocks, s.axis * std::min(s.inner, kColumns), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t offset = item / blocks * s.axis * s.inner + item % blocks * kColumns;
      if (s.inner == 1) {
        softmaxRow(kernels, x + offset, y + offset, s.axis, s.log);
      } else {
        const int64_t width = std::min(kColumns, s.inner - item % blocks * kColumns);
        softmaxColumns(kernels, x + offset, y + offset, s.axis, s.inner, width, s.log);
      }
    }
  });
}

std::unique_ptr<KernelState> prepareSoftmax(const KernelSetup& setup) {
  return prepareSoftmaxLike("Softmax", setup, false);
}
std::unique_ptr<KernelState> prepareLogSoftmax(const KernelSetup& setup) {
  return prepareSoftmaxLike("LogSoftmax", setup, true);
}

}  // namespace

void registerNormalizationKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"BatchNormalization", &prepareBatchNorm, &runBatchNorm});
  registry.add(KernelDef{"LayerNormalization", &prepareLayerNorm, &runLayerNorm});
  registry.add(KernelDef{"Softmax", &prepareSoftmax, &runSoftmax});
  registry.add(KernelDef{"LogSoftmax", &prepareLogSoftmax, &runSoftmax});
}

}  // namespace kiln
