// The recurrent-state operators of linear-attention models (Gated DeltaNet,
// Mamba), opset 27: LinearAttention and CausalConvWithState.
//
// LinearAttention(query, key, value[, past_state, decay, beta]) takes 3-D
// packed [B, T, heads * size] activations with the head counts in the
// q_num_heads and kv_num_heads attributes; output is [B, T, H_q * d_v] and
// present_state [B, H_kv, d_k, d_v] (in past_state's type, or query's when
// there is no past_state). update_rule picks which of decay ('gated',
// 'gated_delta') and beta ('delta', 'gated_delta') must be given.
//
// CausalConvWithState(input, weight[, bias, past_state]) is a depthwise
// causal 1-D convolution: input [B, C, L], weight [C, 1, k]; output has
// input's shape and present_state is [B, C, k - 1].
#include <string>
#include <tuple>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

bool isActivationType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

// Fails unless input `index` (when present and known) is 3-D.
const std::vector<Dim>* rank3(const InferenceContext& context, size_t index, const char* name) {
  const std::vector<Dim>* dims = knownShape(context, index);
  if (dims && dims->size() != 3) context.fail("{} must be 3-D, found {}", name, dimsText(*dims));
  return dims;
}

void linearAttention(InferenceContext& context) {
  const std::string rule = context.node().stringAttribute("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
    context.fail("update_rule '{}' is not 'linear', 'gated', 'delta' or 'gated_delta'", rule);
  }
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  if (gated != context.hasInput(4)) context.fail("update_rule '{}' {} the decay input", rule, gated ? "requires" : "forbids");
  if (delta != context.hasInput(5)) context.fail("update_rule '{}' {} the beta input", rule, delta ? "requires" : "forbids");
  const int64_t q_heads = context.node().intAttribute("q_num_heads", 0);
  const int64_t kv_heads = context.node().intAttribute("kv_num_heads", 0);
  if (q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0) {
    context.fail("q_num_heads ({}) must be a positive multiple of kv_num_heads ({})", q_heads, kv_heads);
  }
  const DType dtype = context.inputType(0).dtype;
  if (!isActivationType(dtype)) context.fail("query must be f32, f16 or bf16, found {}", dtypeName(dtype));
  for (size_t i : {1u, 2u, 4u, 5u}) {
    if (context.hasInput(i) && context.inputType(i).dtype != dtype) {
      context.fail("input {} is {} but query is {}", i, dtypeName(context.inputType(i).dtype), dtypeName(dtype));
    }
  }
  const DType state_type = context.hasInput(3) ? context.inputType(3).dtype : dtype;
  if (!isActivationType(state_type)) context.fail("past_state must be f32, f16 or bf16, found {}", dtypeName(state_type));
  context.output(0) = ValueType{dtype, std::nullopt};
  if (context.outputCount() > 1) context.output(1) = ValueType{state_type, std::nullopt};
  const std::vector<Dim>* q = rank3(context, 0, "query");
  const std::vector<Dim>* k = rank3(context, 1, "key");
  const std::vector<Dim>* v = rank3(context, 2, "value");
  if (context.hasInput(4)) rank3(context, 4, "decay");
  if (context.hasInput(5)) rank3(context, 5, "beta");
  if (!q || !k || !v) return;
  for (const auto& [name, dims, heads] : {std::tuple{"query", q, q_heads}, {"key", k, kv_heads}, {"value", v, kv_heads}}) {
    const Dim& hidden = (*dims)[2];
    if (hidden.isKnown() && hidden.size % heads != 0) {
      context.fail("{}'s last axis {} does not divide into {} heads", name, hidden.size, heads);
    }
  }
  const Dim d_v = divided((*v)[2], kv_heads);
  const Dim hidden = d_v.isKnown() ? Dim::known(multiplyDims(context, d_v.size, q_heads)) : Dim{};
  context.output(0) = ValueType{dtype, std::vector<Dim>{(*q)[0], (*q)[1], hidden}};
  if (context.outputCount() > 1) {
    context.output(1) = ValueType{state_type, std::vector<Dim>{(*q)[0], Dim::known(kv_heads), divided((*k)[2], kv_heads), d_v}};
  }
}

void causalConvWithState(InferenceContext& context) {
  const std::string activation = context.node().stringAttribute("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    context.fail("activation '{}' is not 'none', 'silu' or 'swish'", activation);
  }
  const DType dtype = context.inputType(0).dtype;
  if (!isActivationType(dtype)) {
    context.fail("input must be f32, f16 or bf16, found {}", dtypeName(dtype));
  }
  for (size_t i : {1u, 2u, 3u}) {
    if (context.hasInput(i) && context.inputType(i).dtype != dtype) {
      context.fail("input {} is {} but input 0 is {}", i, dtypeName(context.inputType(i).dtype), dtypeName(dtype));
    }
  }
  copyInputType(context, 0, 0);
  if (context.outputCount() > 1) context.output(1) = ValueType{dtype, std::nullopt};
  const std::vector<Dim>* x = rank3(context, 0, "input");
  const std::vector<Dim>* w = rank3(context, 1, "weight");
  if (!x || !w) return;
  const Dim& k = (*w)[2];
  if (k.isKnown() && k.size < 1) context.fail("the kernel size must be at least 1, found {}", k.size);
  const Dim state = k.isKnown() ? Dim::known(k.size - 1) : Dim{};
  if (context.outputCount() > 1) context.output(1) = ValueType{dtype, std::vector<Dim>{(*x)[0], (*x)[1], state}};
}

}  // namespace

void registerLinearAttentionOps(OpRegistry& registry) {
  registry.add(OpSchema{"", "LinearAttention", 27, 3, 6, 1, 2, linearAttention});
  registry.add(OpSchema{"", "CausalConvWithState", 27, 2, 4, 1, 2, causalConvWithState});
}

}  // namespace kiln
