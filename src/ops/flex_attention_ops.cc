// FlexAttention (ai.onnx.preview opset 1) and the two kiln operators its
// modifier subgraphs are inlined between (frontend/onnx/flex_attention_
// expansion.h).
//
//   FlexAttention(Q [B, Hq, L, E], K [B, Hkv, S, E], V [B, Hkv, S, Ev])
//       -> Y [B, Hq, L, Ev]; Hq a multiple of Hkv (grouped-query attention)
//   kiln.FlexAttentionScores(Q, K) -> scores [B, Hq, L, S], in the softmax
//       precision: scale * Q K^T
//   kiln.FlexAttentionOutput(P [B, Hq, L, S], V) -> Y [B, Hq, L, Ev], in V's
//       type: softmax(P) V when its attribute softmax is 1, else P V
//
// The softmax precision is f64 for f64 inputs and f32 otherwise, or the
// softmax_precision attribute; kiln computes only those defaults.
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

bool isFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

// The softmax precision for inputs of `dtype`: the attribute when given (an
// ONNX TensorProto data type), else f64 for f64 and f32 otherwise.
DType softmaxType(const InferenceContext& context, DType dtype) {
  const DType fallback = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  if (!context.node().hasAttribute("softmax_precision")) return fallback;
  const int64_t precision = context.node().intAttribute("softmax_precision", 0);
  const int64_t wanted = fallback == DType::kF64 ? 11 : 1;  // ONNX DOUBLE, FLOAT
  if (precision != wanted) {
    context.fail("softmax_precision {} is not supported for {} inputs (kiln computes in {})", precision,
                 dtypeName(dtype), dtypeName(fallback));
  }
  return fallback;
}

// Fails unless input `index` (when its shape is known) is 4-D.
const std::vector<Dim>* rank4(const InferenceContext& context, size_t index, const char* name) {
  const std::vector<Dim>* dims = knownShape(context, index);
  if (dims && dims->size() != 4) context.fail("{} must be 4-D, found {}", name, dimsText(*dims));
  return dims;
}

// Q, K and V of one float type; returns it.
DType sameFloatType(const InferenceContext& context, const std::vector<size_t>& inputs) {
  const DType dtype = context.inputType(inputs[0]).dtype;
  if (!isFloat(dtype)) context.fail("input {} must be f32, f16, bf16 or f64, found {}", inputs[0], dtypeName(dtype));
  for (size_t i : inputs) {
    if (context.inputType(i).dtype != dtype) {
      context.fail("input {} is {} but input {} is {}", i, dtypeName(context.inputType(i).dtype), inputs[0],
                   dtypeName(dtype));
    }
  }
  return dtype;
}

void checkHeads(const InferenceContext& context, const Dim& q_heads, const Dim& kv_heads) {
  if (q_heads.isKnown() && kv_heads.isKnown() && (kv_heads.size == 0 || q_heads.size % kv_heads.size != 0)) {
    context.fail("the {} query heads are not a multiple of the {} key/value heads", q_heads.size, kv_heads.size);
  }
}

void flexAttention(InferenceContext& context) {
  for (const char* name : {"score_mod", "prob_mod"}) {
    if (context.node().hasAttribute(name)) {
      context.fail("the {} subgraph should have been inlined on import (frontend/onnx/flex_attention_expansion.h)", name);
    }
  }
  const DType dtype = sameFloatType(context, {0, 1, 2});
  softmaxType(context, dtype);
  context.output(0) = ValueType{dtype, std::nullopt};
  const std::vector<Dim>* q = rank4(context, 0, "Q");
  const std::vector<Dim>* k = rank4(context, 1, "K");
  const std::vector<Dim>* v = rank4(context, 2, "V");
  if (!q || !k || !v) return;
  checkHeads(context, (*q)[1], (*k)[1]);
  context.output(0) = ValueType{dtype, std::vector<Dim>{(*q)[0], (*q)[1], (*q)[2], (*v)[3]}};
}

void flexAttentionScores(InferenceContext& context) {
  const DType dtype = sameFloatType(context, {0, 1});
  const DType scores = softmaxType(context, dtype);
  context.output(0) = ValueType{scores, std::nullopt};
  const std::vector<Dim>* q = rank4(context, 0, "Q");
  const std::vector<Dim>* k = rank4(context, 1, "K");
  if (!q || !k) return;
  checkHeads(context, (*q)[1], (*k)[1]);
  context.output(0) = ValueType{scores, std::vector<Dim>{(*q)[0], (*q)[1], (*q)[2], (*k)[2]}};
}

void flexAttentionOutput(InferenceContext& context) {
  const DType dtype = context.inputType(1).dtype;
  if (!isFloat(dtype)) context.fail("V must be f32, f16, bf16 or f64, found {}", dtypeName(dtype));
  const DType probs = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  if (context.inputType(0).dtype != probs) {
    context.fail("the probabilities must be {} for {} V, found {}", dtypeName(probs), dtypeName(dtype),
                 dtypeName(context.inputType(0).dtype));
  }
  context.output(0) = ValueType{dtype, std::nullopt};
  const std::vector<Dim>* p = rank4(context, 0, "the probabilities");
  const std::vector<Dim>* v = rank4(context, 1, "V");
  if (!p || !v) return;
  checkHeads(context, (*p)[1], (*v)[1]);
  context.output(0) = ValueType{dtype, std::vector<Dim>{(*p)[0], (*p)[1], (*p)[2], (*v)[3]}};
}

}  // namespace

void registerFlexAttentionOps(OpRegistry& registry) {
  registry.add(OpSchema{"ai.onnx.preview", "FlexAttention", 1, 3, 3, 1, 1, flexAttention});
  registry.add(OpSchema{"kiln", "FlexAttentionScores", 1, 2, 2, 1, 1, flexAttentionScores});
  registry.add(OpSchema{"kiln", "FlexAttentionOutput", 1, 2, 2, 1, 1, flexAttentionOutput});
}

}  // namespace kiln
