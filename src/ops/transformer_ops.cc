// The operators of transformer blocks: Attention (opset 23; the
// nonpad_kv_seqlen input from 24, the window attributes from 25),
// RotaryEmbedding and RMSNormalization (23), SwiGLU (28).
//
// Attention takes Q, K, V either as 4-D [batch, heads, sequence, head size]
// or as 3-D [batch, sequence, heads * head size] with the head counts in the
// q_num_heads and kv_num_heads attributes. Its outputs: Y in Q's layout,
// present_key/present_value (the past cache with K/V appended, 4-D) and the
// attention scores [batch, q heads, q sequence, total sequence].
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

Dim sum(const InferenceContext& context, const Dim& a, const Dim& b) {
  if (!a.isKnown() || !b.isKnown()) return Dim{};
  return Dim::known(addDims(context, a.size, b.size));
}

// Requires a positive, known head count for 3-D inputs.
int64_t headCount(const InferenceContext& context, const char* name, const Dim& hidden) {
  const int64_t heads = context.node().intAttribute(name, 0);
  if (heads < 1) context.fail("3-D inputs need a positive '{}' attribute, found {}", name, heads);
  if (hidden.isKnown() && hidden.size % heads != 0) {
    context.fail("the hidden size {} does not divide into {} = {} heads", hidden.size, name, heads);
  }
  return heads;
}

void attention(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  for (size_t i : {1u, 2u}) {
    if (context.inputType(i).dtype != dtype) {
      context.fail("Q, K and V must have one type; Q is {}, input {} is {}", dtypeName(dtype), i,
                   dtypeName(context.inputType(i).dtype));
    }
  }
  const std::vector<Dim>* q = knownShape(context, 0);
  const std::vector<Dim>* k = knownShape(context, 1);
  const std::vector<Dim>* v = knownShape(context, 2);
  for (size_t i = 0; i < context.outputCount(); ++i) context.output(i) = ValueType{dtype, std::nullopt};
  if (!q || !k || !v) return;
  const size_t rank = q->size();
  if ((rank != 3 && rank != 4) || k->size() != rank || v->size() != rank) {
    context.fail("Q, K and V must all be 3-D or all 4-D, found {}, {} and {}", dimsText(*q), dimsText(*k),
                 dimsText(*v));
  }
  // The 4-D view: [batch, heads, sequence, head size].
  Dim batch = (*q)[0];
  Dim q_heads, kv_heads, q_seq, kv_seq, head_size, v_head_size;
  if (rank == 4) {
    q_heads = (*q)[1];
    kv_heads = (*k)[1];
    q_seq = (*q)[2];
    kv_seq = (*k)[2];
    head_size = (*k)[3];
    v_head_size = (*v)[3];
  } else {
    const int64_t qh = headCount(context, "q_num_heads", (*q)[2]);
    const int64_t kvh = headCount(context, "kv_num_heads", (*k)[2]);
    headCount(context, "kv_num_heads", (*v)[2]);
    q_heads = Dim::known(qh);
    kv_heads = Dim::known(kvh);
    q_seq = (*q)[1];
    kv_seq = (*k)[1];
    head_size = divided((*k)[2], kvh);
    v_head_size = divided((*v)[2], kvh);
  }
  if (q_heads.isKnown() && kv_heads.isKnown() && (kv_heads.size == 0 || q_heads.size % kv_heads.size != 0)) {
    context.fail("the {} query heads do not divide into groups of the {} key/value heads", q_heads.size,
                 kv_heads.size);
  }
  Dim past = Dim::known(0);
  if (context.hasInput(4) != context.hasInput(5)) context.fail("past_key and past_value must be given together");
  if (const std::vector<Dim>* past_key = knownShape(context, 4)) {
    if (past_key->size() != 4) context.fail("past_key must be 4-D, found {}", dimsText(*past_key));
    past = (*past_key)[2];
  } else if (context.hasInput(4)) {
    past = Dim{};
  }
  const Dim total = sum(context, past, kv_seq);
  if (rank == 4) {
    context.output(0) = ValueType{dtype, std::vector<Dim>{batch, q_heads, q_seq, v_head_size}};
  } else {
    const Dim hidden = q_heads.isKnown() && v_head_size.isKnown() ? Dim::known(multiplyDims(context, q_heads.size, v_head_size.size)) : Dim{};
    context.output(0) = ValueType{dtype, std::vector<Dim>{batch, q_seq, hidden}};
  }
  if (context.outputCount() > 1) context.output(1) = ValueType{dtype, std::vector<Dim>{batch, kv_heads, total, head_size}};
  if (context.outputCount() > 2) {
    context.output(2) = ValueType{dtype, std::vector<Dim>{batch, kv_heads, total, v_head_size}};
  }
  if (context.outputCount() > 3) context.output(3) = ValueType{dtype, std::vector<Dim>{batch, q_heads, q_seq, total}};
}

// RotaryEmbedding(X, cos_cache, sin_cache[, position_ids]): X is 4-D
// [batch, heads, sequence, head size] or 3-D [batch, sequence, hidden] with
// num_heads; Y has its shape.
void rotaryEmbedding(InferenceContext& context) {
  if (const std::vector<Dim>* x = knownShape(context, 0)) {
    if (x->size() != 3 && x->size() != 4) context.fail("X must be 3-D or 4-D, found {}", dimsText(*x));
    if (x->size() == 3) headCount(context, "num_heads", (*x)[2]);
  }
  copyInputType(context);
}

// Normalises over the axes from `axis` on, as LayerNormalization does.
void rmsNormalization(InferenceContext& context) {
  if (const std::vector<Dim>* x = knownShape(context, 0)) {
    normalizeAxis(context, context.node().intAttribute("axis", -1), x->size());
  }
  copyInputType(context);
}

// SwiGLU(A, B) = A * sigmoid(alpha * A) * B, without broadcasting.
void swiglu(InferenceContext& context) {
  const std::vector<Dim>* a = knownShape(context, 0);
  const std::vector<Dim>* b = knownShape(context, 1);
  if (context.inputType(0).dtype != context.inputType(1).dtype) {
    context.fail("A and B must have one type, found {} and {}", dtypeName(context.inputType(0).dtype),
                 dtypeName(context.inputType(1).dtype));
  }
  if (a && b && a->size() != b->size()) context.fail("A {} and B {} must have one shape", dimsText(*a), dimsText(*b));
  if (a && b) broadcastInputs(context, {0, 1});  // equal known sizes, checked
  copyInputType(context);
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         size_t max_outputs, InferFunction infer) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, max_outputs, std::move(infer)});
}

}  // namespace

void registerTransformerOps(OpRegistry& registry) {
  add(registry, "Attention", 23, 3, 6, 4, attention);
  add(registry, "Attention", 24, 3, 7, 4, attention);  // nonpad_kv_seqlen
  // kiln.Attention(Q, K, V[, attn_mask]) -> Y: what the attention fusion
  // makes of exported attention chains (passes/attention_fusion.h), for
  // models of any opset; Attention's attributes and kernel.
  registry.add(OpSchema{"kiln", "Attention", 1, 3, 4, 1, 1, attention});
  // kiln.RMSNormalization: what the RMS norm fusion makes (passes/layernorm_fusion.h).
  registry.add(OpSchema{"kiln", "RMSNormalization", 1, 2, 2, 1, 1, rmsNormalization});
  add(registry, "RotaryEmbedding", 23, 3, 4, 1, rotaryEmbedding);
  add(registry, "RMSNormalization", 23, 2, 2, 1, rmsNormalization);
  add(registry, "SwiGLU", 28, 2, 2, 1, swiglu);
}

}  // namespace kiln
