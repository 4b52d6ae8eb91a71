// FlexAttention (ai.onnx.preview) on the CPU, and the two kiln kernels that
// a FlexAttention with score_mod / prob_mod subgraphs is expanded into
// (frontend/onnx/flex_attention_expansion.h), following
// onnx/reference/ops/aionnx_preview/op_flex_attention.py:
//
//   ai.onnx.preview.FlexAttention  Y = softmax(scale * Q K^T) V, row by row
//   kiln.FlexAttentionScores       scores = scale * Q K^T
//   kiln.FlexAttentionOutput       Y = softmax(P) V (attribute softmax = 1)
//                                  or Y = P V (softmax = 0)
//
// All three share the row functions below. They compute in the softmax
// precision: f64 for f64 inputs, f32 otherwise (f16 and bf16 staged through
// f32 by float_staging.h). As the reference does, the scale is applied as
// sqrt(scale) (taken in f32, then rounded to the input type) on both Q and
// K, and for f16/bf16 inputs each score is rounded to the input type before
// the softmax. Query head h reads key/value head h / (Hq / Hkv). A row whose
// scores are all -inf gives NaN, as in the reference.
//
// Scratch (the fused kernel's score row, the staged f16/bf16 tensors) lives
// in the state: one call at a time per prepared step, as the executor runs
// them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::typeText;

struct FlexState final : KernelState {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_seq = 0, kv_seq = 0, head_size = 0, v_head_size = 0;
  bool f64 = false;                  // computes in double (f64 inputs), else in f32
  DType round_to = DType::kUndefined;  // f16/bf16: scores are rounded to it
  double scale = 0;                  // sqrt(scale)^2, as rounded
  bool softmax = true;               // FlexAttentionOutput: softmax its input first
  fp::FloatStaging staging;
  mutable std::vector<float> row32;  // the fused kernel's score row
  mutable std::vector<double> row64;
};

bool isFloat(DType dtype) { return fp::isComputedInF32(dtype) || dtype == DType::kF64; }

void expectFloat(std::string_view op, const TensorInfo& info, const char* what) {
  if (!isFloat(info.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} {} (supports f32, f16, bf16, f64)", op, typeText(info), what));
  }
}

void expect4d(std::string_view op, const TensorInfo& info, const char* what) {
  if (info.shape.size() != 4) throw UsageError(fmt::format("{}: {} must be 4-D, found {}", op, what, typeText(info)));
}

// Only the default softmax precision (f64 for f64 inputs, else f32).
void expectDefaultPrecision(std::string_view op, const KernelSetup& setup, DType dtype) {
  const int64_t wanted = dtype == DType::kF64 ? 11 : 1;  // ONNX DOUBLE, FLOAT
  const int64_t precision = setup.params.getInt("softmax_precision", wanted);
  if (precision != wanted) {
    throw UsageError(fmt::format("{}: softmax_precision {} is not supported for {} inputs", op, precision,
                                 dtypeName(dtype)));
  }
}

// Batch and heads of Q-like `q` [B, Hq, L, *] against K/V-like `kv` [B, Hkv, S, *].
void setHeads(std::string_view op, FlexState& s, const TensorInfo& q, const TensorInfo& kv) {
  s.batch = q.shape[0];
  s.q_heads = q.shape[1];
  s.q_seq = q.shape[2];
  s.kv_heads = kv.shape[1];
  s.kv_seq = kv.shape[2];
  if (kv.shape[0] != s.batch || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0) {
    throw UsageError(fmt::format("{}: {} and {} do not agree (batch, or query heads a multiple of key/value heads)", op,
                                 typeText(q), typeText(kv)));
  }
}

// The fused kernels' score row, in the compute type.
void sizeRow(FlexState& s) {
  if (s.f64) {
    s.row64.resize(static_cast<size_t>(s.kv_seq));
  } else {
    s.row32.resize(static_cast<size_t>(s.kv_seq));
  }
}

// scale and rounding from the attribute and Q's type.
void setScale(FlexState& s, const KernelSetup& setup, DType dtype) {
  const double scale = setup.params.getFloat("scale", 1.0 / std::sqrt(static_cast<double>(s.head_size)));
  float root = std::sqrt(static_cast<float>(scale));
  if (fp::isNarrowFloat(dtype)) {
    std::byte bits[2];
    fp::fromFloat(dtype, &root, bits, 1);
    fp::toFloat(dtype, bits, &root, 1);
    s.round_to = dtype;
  }
  s.scale = static_cast<double>(root) * root;
  s.f64 = dtype == DType::kF64;
}

// ------------------------------------------------------------ row functions

template <typename T>
T roundScore(const FlexState& s, T score) {
  if constexpr (std::is_same_v<T, float>) {
    if (s.round_to != DType::kUndefined) {
      std::byte bits[2];
      fp::fromFloat(s.round_to, &score, bits, 1);
      fp::toFloat(s.round_to, bits, &score, 1);
    }
  }
  return score;
}

// row[j] = scale * dot(q, k_j) for the S keys of one head ([S, E]).
template <typename T>
void scoreRow(const FlexState& s, const T* q, const T* keys, T* row) {
  const auto scale = static_cast<T>(s.scale);
  for (int64_t j = 0; j < s.kv_seq; ++j) {
    const T* k = keys + j * s.head_size;
    T dot = 0;
    for (int64_t e = 0; e < s.head_size; ++e) dot += q[e] * k[e];
    row[j] = roundScore(s, dot * scale);
  }
}

// In place: exp(row - max) / sum.
template <typename T>
void softmaxRow(T* row, int64_t n) {
  T max = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) max = std::max(max, row[j]);
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - max);
    sum += row[j];
  }
  for (int64_t j = 0; j < n; ++j) row[j] /= sum;
}

// y = sum_j p[j] * v_j over the S values of one head ([S, Ev]).
template <typename T>
void applyRow(const FlexState& s, const T* p, const T* values, T* y) {
  std::fill(y, y + s.v_head_size, T{0});
  for (int64_t j = 0; j < s.kv_seq; ++j) {
    const T* v = values + j * s.v_head_size;
    for (int64_t e = 0; e < s.v_head_size; ++e) y[e] += p[j] * v[e];
  }
}

// The data of input/output `index` in the compute type T.
template <typename T>
const T* inputOf(const FlexState& s, const KernelCall& call, size_t index) {
  if constexpr (std::is_same_v<T, double>) {
    return call.inputs[index].as<const double>();
  } else {
    return s.staging.input(call, index);
  }
}
template <typename T>
T* outputOf(const FlexState& s, const KernelCall& call) {
  if constexpr (std::is_same_v<T, double>) {
    return call.outputs[0].as<double>();
  } else {
    return s.staging.output(call, 0);
  }
}

// Calls body(b, h, i, kv_head, row) for every query row.
template <typename Body>
void forEachRow(const FlexState& s, const Body& body) {
  const int64_t group = s.q_heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      for (int64_t i = 0; i < s.q_seq; ++i) body(b * s.kv_heads + h / group, (b * s.q_heads + h) * s.q_seq + i);
    }
  }
}

// ------------------------------------------------------------ FlexAttention

std::unique_ptr<KernelState> prepareFlex(const KernelSetup& setup) {
  constexpr std::string_view op = "FlexAttention";
  checks::expectCounts(op, setup, 3, 3, 1, 1);
  const TensorInfo& q = setup.inputs[0];
  const TensorInfo& k = setup.inputs[1];
  const TensorInfo& v = setup.inputs[2];
  expectFloat(op, q, "inputs");
  for (const TensorInfo* t : {&q, &k, &v}) expect4d(op, *t, "Q, K and V");
  if (k.dtype != q.dtype || v.dtype != q.dtype) {
    throw UsageError(fmt::format("{}: Q {}, K {} and V {} must have one type", op, typeText(q), typeText(k), typeText(v)));
  }
  expectDefaultPrecision(op, setup, q.dtype);
  auto s = std::make_unique<FlexState>();
  setHeads(op, *s, q, k);
  s->head_size = q.shape[3];
  s->v_head_size = v.shape[3];
  if (k.shape[3] != s->head_size || v.shape[0] != s->batch || v.shape[1] != s->kv_heads || v.shape[2] != s->kv_seq) {
    throw UsageError(fmt::format("{}: Q {}, K {} and V {} do not agree", op, typeText(q), typeText(k), typeText(v)));
  }
  setScale(*s, setup, q.dtype);
  checks::expectOutput(op, setup, 0, q.dtype, {s->batch, s->q_heads, s->q_seq, s->v_head_size});
  sizeRow(*s);
  s->staging.plan(setup);
  return s;
}

template <typename T>
void runFlexIn(const FlexState& s, const KernelCall& call, T* row) {
  const T* q = inputOf<T>(s, call, 0);
  const T* k = inputOf<T>(s, call, 1);
  const T* v = inputOf<T>(s, call, 2);
  T* y = outputOf<T>(s, call);
  forEachRow(s, [&](int64_t kv_head, int64_t r) {
    scoreRow(s, q + r * s.head_size, k + kv_head * s.kv_seq * s.head_size, row);
    softmaxRow(row, s.kv_seq);
    applyRow(s, row, v + kv_head * s.kv_seq * s.v_head_size, y + r * s.v_head_size);
  });
}

void runFlex(const KernelCall& call) {
  const auto& s = static_cast<const FlexState&>(*call.state);
  if (s.f64) {
    runFlexIn<double>(s, call, s.row64.data());
  } else {
    runFlexIn<float>(s, call, s.row32.data());
    s.staging.finish(call);
  }
}

// ------------------------------------------------------ FlexAttentionScores

std::unique_ptr<KernelState> prepareScores(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.FlexAttentionScores";
  checks::expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& q = setup.inputs[0];
  const TensorInfo& k = setup.inputs[1];
  expectFloat(op, q, "Q");
  expect4d(op, q, "Q");
  expect4d(op, k, "K");
  if (k.dtype != q.dtype || k.shape[3] != q.shape[3]) {
    throw UsageError(fmt::format("{}: Q {} and K {} do not agree", op, typeText(q), typeText(k)));
  }
  expectDefaultPrecision(op, setup, q.dtype);
  auto s = std::make_unique<FlexState>();
  setHeads(op, *s, q, k);
  s->head_size = q.shape[3];
  setScale(*s, setup, q.dtype);
  checks::expectOutput(op, setup, 0, s->f64 ? DType::kF64 : DType::kF32, {s->batch, s->q_heads, s->q_seq, s->kv_seq});
  s->staging.plan(setup);
  return s;
}

template <typename T>
void runScoresIn(const FlexState& s, const KernelCall& call) {
  const T* q = inputOf<T>(s, call, 0);
  const T* k = inputOf<T>(s, call, 1);
  T* scores = call.outputs[0].as<T>();
  forEachRow(s, [&](int64_t kv_head, int64_t r) {
    scoreRow(s, q + r * s.head_size, k + kv_head * s.kv_seq * s.head_size, scores + r * s.kv_seq);
  });
}

void runScores(const KernelCall& call) {
  const auto& s = static_cast<const FlexState&>(*call.state);
  if (s.f64) {
    runScoresIn<double>(s, call);
  } else {
    runScoresIn<float>(s, call);
  }
}

// ------------------------------------------------------ FlexAttentionOutput

std::unique_ptr<KernelState> prepareOutput(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.FlexAttentionOutput";
  checks::expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& p = setup.inputs[0];
  const TensorInfo& v = setup.inputs[1];
  expectFloat(op, v, "V");
  expect4d(op, p, "the probabilities");
  expect4d(op, v, "V");
  auto s = std::make_unique<FlexState>();
  s->f64 = v.dtype == DType::kF64;
  checks::expectDType(op, "the probabilities", p, s->f64 ? DType::kF64 : DType::kF32);
  setHeads(op, *s, p, v);
  s->v_head_size = v.shape[3];
  if (p.shape[3] != s->kv_seq) {
    throw UsageError(fmt::format("{}: the probabilities {} do not match V {}", op, typeText(p), typeText(v)));
  }
  s->softmax = setup.params.getInt("softmax", 0) != 0;
  checks::expectOutput(op, setup, 0, v.dtype, {s->batch, s->q_heads, s->q_seq, s->v_head_size});
  sizeRow(*s);
  s->staging.plan(setup);
  return s;
}

template <typename T>
void runOutputIn(const FlexState& s, const KernelCall& call, T* row) {
  const T* p = call.inputs[0].as<const T>();
  const T* v = inputOf<T>(s, call, 1);
  T* y = outputOf<T>(s, call);
  forEachRow(s, [&](int64_t kv_head, int64_t r) {
    const T* probs = p + r * s.kv_seq;
    if (s.softmax) {
      std::copy(probs, probs + s.kv_seq, row);
      softmaxRow(row, s.kv_seq);
      probs = row;
    }
    applyRow(s, probs, v + kv_head * s.kv_seq * s.v_head_size, y + r * s.v_head_size);
  });
}

void runOutput(const KernelCall& call) {
  const auto& s = static_cast<const FlexState&>(*call.state);
  if (s.f64) {
    runOutputIn<double>(s, call, s.row64.data());
  } else {
    runOutputIn<float>(s, call, s.row32.data());
    s.staging.finish(call);
  }
}

}  // namespace

void registerFlexAttentionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"ai.onnx.preview.FlexAttention", &prepareFlex, &runFlex});
  registry.add(KernelDef{"kiln.FlexAttentionScores", &prepareScores, &runScores});
  registry.add(KernelDef{"kiln.FlexAttentionOutput", &prepareOutput, &runOutput});
}

}  // namespace kiln
