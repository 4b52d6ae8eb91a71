// The recurrent-state kernels of linear-attention models (opset 27) on the
// CPU: LinearAttention and CausalConvWithState, following
// onnx/reference/ops/op_linear_attention.py and op_causal_conv_with_state.py.
// Both compute in f32; f16 and bf16 tensors are staged around that
// (float_staging.h), whose scratch lives in the state: one call at a time per
// prepared step, as the executor runs them.
//
// LinearAttention runs the recurrence token by token, one key/value head at a
// time, on a [d_k, d_v] state S (the present_state output itself, or scratch
// when that output is not wanted). Per token t:
//   gated:  S *= exp(g_t)                 (g_t per head, or per key row)
//   delta:  u = beta_t * (v_t - S^T k_t)  (else u = v_t)
//           S += k_t (outer) u
//   output: o_t = scale * q_t^T S         for each query head of the group
// Query head h reads key/value head h / (q_num_heads / kv_num_heads).
//
// CausalConvWithState convolves each channel of [past_state | input] (zeros
// when there is no past_state) with its own k taps, adds the bias, optionally
// applies SiLU, and keeps the last k - 1 positions of the padded sequence as
// present_state.
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
using checks::present;
using checks::typeText;

void expectComputedInF32(std::string_view op, const TensorInfo& info, std::string_view what) {
  if (!fp::isComputedInF32(info.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} {} (supports f32, f16, bf16)", op, typeText(info), what));
  }
}

// ----------------------------------------------------------- LinearAttention

struct LinearAttentionState final : KernelState {
  int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, d_k = 0, d_v = 0;
  float scale = 0;
  bool gated = false, delta = false, past = false;
  bool decay_per_key = false;  // decay [B, T, H_kv * d_k], else [B, T, H_kv]
  int64_t beta_heads = 0;      // beta's last axis: H_kv or 1
  fp::FloatStaging staging;
  // Scratch (one call at a time): the state when present_state is not an
  // output, and one u vector per key/value head.
  mutable std::vector<float> state_scratch;
  mutable std::vector<float> update_scratch;
};

// Fails unless `info` is [batch, seq, last].
void expectPacked(const LinearAttentionState& s, const TensorInfo& info, const char* name, int64_t last) {
  if (info.shape != Ints{s.batch, s.seq, last}) {
    throw UsageError(fmt::format("LinearAttention: {} must be [{}, {}, {}], found {}", name, s.batch, s.seq, last,
                                 typeText(info)));
  }
}

std::unique_ptr<KernelState> prepareLinearAttention(const KernelSetup& setup) {
  constexpr std::string_view op = "LinearAttention";
  checks::expectCounts(op, setup, 3, 6, 1, 2);
  const TensorInfo& q = setup.inputs[0];
  expectComputedInF32(op, q, "query");
  for (size_t i : {1u, 2u, 4u, 5u}) {
    if (present(setup.inputs, i) && setup.inputs[i].dtype != q.dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but query is {}", op, i, typeText(setup.inputs[i]), typeText(q)));
    }
  }
  auto s = std::make_unique<LinearAttentionState>();
  const std::string rule = setup.params.getString("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
    throw UsageError(fmt::format("{}: update_rule '{}' is not 'linear', 'gated', 'delta' or 'gated_delta'", op, rule));
  }
  s->gated = rule == "gated" || rule == "gated_delta";
  s->delta = rule == "delta" || rule == "gated_delta";
  if (s->gated != present(setup.inputs, 4) || s->delta != present(setup.inputs, 5)) {
    throw UsageError(fmt::format("{}: update_rule '{}' {} decay and {} beta", op, rule,
                                 s->gated ? "requires" : "forbids", s->delta ? "requires" : "forbids"));
  }
  s->q_heads = setup.params.getInt("q_num_heads", 0);
  s->kv_heads = setup.params.getInt("kv_num_heads", 0);
  if (s->q_heads < 1 || s->kv_heads < 1 || s->q_heads % s->kv_heads != 0) {
    throw UsageError(fmt::format("{}: q_num_heads ({}) must be a positive multiple of kv_num_heads ({})", op,
                                 s->q_heads, s->kv_heads));
  }
  if (q.shape.size() != 3 || q.shape[2] % s->q_heads != 0) {
    throw UsageError(fmt::format("{}: query must be [B, T, {} * d_k], found {}", op, s->q_heads, typeText(q)));
  }
  s->batch = q.shape[0];
  s->seq = q.shape[1];
  s->d_k = q.shape[2] / s->q_heads;
  const TensorInfo& v = setup.inputs[2];
  if (v.shape.size() != 3 || v.shape[2] % s->kv_heads != 0) {
    throw UsageError(fmt::format("{}: value must be [B, T, {} * d_v], found {}", op, s->kv_heads, typeText(v)));
  }
  s->d_v = v.shape[2] / s->kv_heads;
  expectPacked(*s, setup.inputs[1], "key", s->kv_heads * s->d_k);
  expectPacked(*s, v, "value", s->kv_heads * s->d_v);
  if (s->gated) {
    const TensorInfo& decay = setup.inputs[4];
    s->decay_per_key = decay.shape.size() == 3 && decay.shape[2] == s->kv_heads * s->d_k;
    expectPacked(*s, decay, "decay (per head, or per key dimension)", s->decay_per_key ? s->kv_heads * s->d_k : s->kv_heads);
  }
  if (s->delta) {
    const TensorInfo& beta = setup.inputs[5];
    s->beta_heads = beta.shape.size() == 3 && beta.shape[2] == 1 ? 1 : s->kv_heads;
    expectPacked(*s, beta, "beta (per head, or one)", s->beta_heads);
  }
  const Ints state_shape{s->batch, s->kv_heads, s->d_k, s->d_v};
  DType state_type = q.dtype;
  s->past = present(setup.inputs, 3);
  if (s->past) {
    const TensorInfo& past = setup.inputs[3];
    expectComputedInF32(op, past, "past_state");
    if (past.shape != state_shape) {
      throw UsageError(fmt::format("{}: past_state must be [{}, {}, {}, {}], found {}", op, s->batch, s->kv_heads,
                                   s->d_k, s->d_v, typeText(past)));
    }
    state_type = past.dtype;
  }
  const double scale = setup.params.getFloat("scale", 0.0);
  s->scale = static_cast<float>(scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(s->d_k)) : scale);
  checks::expectOutput(op, setup, 0, q.dtype, {s->batch, s->seq, s->q_heads * s->d_v});
  if (setup.outputs.size() > 1) {
    checks::expectOutput(op, setup, 1, state_type, state_shape);
  } else {
    s->state_scratch.resize(static_cast<size_t>(checks::elementCount(state_shape)));
  }
  s->update_scratch.resize(static_cast<size_t>(s->batch * s->kv_heads * s->d_v));
  s->staging.plan(setup);
  return s;
}

struct LinearAttentionData {
  const float* q;
  const float* k;
  const float* v;
  const float* decay;  // nullptr unless gated
  const float* beta;   // nullptr unless delta
  float* y;
};

// The recurrence of one (batch, key/value head) over all tokens; `state` is
// its [d_k, d_v] block, holding past_state (or zeros) on entry.
void linearAttentionHead(const LinearAttentionState& s, const LinearAttentionData& d, int64_t b, int64_t kv,
                         float* state, float* u) {
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t d_k = s.d_k;
  const int64_t d_v = s.d_v;
  for (int64_t t = 0; t < s.seq; ++t) {
    const int64_t token = b * s.seq + t;
    const float* k = d.k + (token * s.kv_heads + kv) * d_k;
    const float* v = d.v + (token * s.kv_heads + kv) * d_v;
    if (s.gated) {
      const float* g = s.decay_per_key ? d.decay + (token * s.kv_heads + kv) * d_k : d.decay + token * s.kv_heads + kv;
      for (int64_t i = 0; i < d_k; ++i) {
        const float factor = std::exp(g[s.decay_per_key ? i : 0]);
        for (int64_t m = 0; m < d_v; ++m) state[i * d_v + m] *= factor;
      }
    }
    if (s.delta) {  // u = beta * (v - S^T k)
      const float beta = d.beta[token * s.beta_heads + (s.beta_heads == 1 ? 0 : kv)];
      for (int64_t m = 0; m < d_v; ++m) u[m] = v[m];
      for (int64_t i = 0; i < d_k; ++i) {
        for (int64_t m = 0; m < d_v; ++m) u[m] -= state[i * d_v + m] * k[i];
      }
      for (int64_t m = 0; m < d_v; ++m) u[m] *= beta;
    } else {
      std::copy(v, v + d_v, u);
    }
    for (int64_t i = 0; i < d_k; ++i) {
      for (int64_t m = 0; m < d_v; ++m) state[i * d_v + m] += k[i] * u[m];
    }
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const float* q = d.q + (token * s.q_heads + h) * d_k;
      float* y = d.y + (token * s.q_heads + h) * d_v;
      std::fill(y, y + d_v, 0.0f);
      for (int64_t i = 0; i < d_k; ++i) {
        for (int64_t m = 0; m < d_v; ++m) y[m] += q[i] * state[i * d_v + m];
      }
      for (int64_t m = 0; m < d_v; ++m) y[m] *= s.scale;
    }
  }
}

void runLinearAttention(const KernelCall& call) {
  const auto& s = static_cast<const LinearAttentionState&>(*call.state);
  LinearAttentionData d{};
  d.q = s.staging.input(call, 0);
  d.k = s.staging.input(call, 1);
  d.v = s.staging.input(call, 2);
  if (s.gated) d.decay = s.staging.input(call, 4);
  if (s.delta) d.beta = s.staging.input(call, 5);
  d.y = s.staging.output(call, 0);
  float* state = call.output_count > 1 ? s.staging.output(call, 1) : s.state_scratch.data();
  const int64_t block = s.d_k * s.d_v;
  const int64_t heads = s.batch * s.kv_heads;
  if (s.past) {
    const float* past = s.staging.input(call, 3);
    std::copy(past, past + heads * block, state);
  } else {
    std::fill(state, state + heads * block, 0.0f);
  }
  parallelForItems(heads, s.seq * block * 4, [&](int64_t begin, int64_t end) {
    for (int64_t head = begin; head < end; ++head) {
      linearAttentionHead(s, d, head / s.kv_heads, head % s.kv_heads, state + head * block,
                          s.update_scratch.data() + head * s.d_v);
    }
  });
  s.staging.finish(call);
}

// ------------------------------------------------------- CausalConvWithState

struct CausalConvState final : KernelState {
  int64_t batch = 0, channels = 0, length = 0, taps = 0;
  bool bias = false, past = false, silu = false;
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareCausalConv(const KernelSetup& setup) {
  constexpr std::string_view op = "CausalConvWithState";
  checks::expectCounts(op, setup, 2, 4, 1, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];
  expectComputedInF32(op, x, "input");
  for (size_t i : {1u, 2u, 3u}) {
    if (present(setup.inputs, i) && setup.inputs[i].dtype != x.dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but input 0 is {}", op, i, typeText(setup.inputs[i]), typeText(x)));
    }
  }
  if (x.shape.size() != 3) throw UsageError(fmt::format("{}: input must be [B, C, L], found {}", op, typeText(x)));
  auto s = std::make_unique<CausalConvState>();
  s->batch = x.shape[0];
  s->channels = x.shape[1];
  s->length = x.shape[2];
  if (w.shape.size() != 3 || w.shape[0] != s->channels || w.shape[1] != 1 || w.shape[2] < 1) {
    throw UsageError(fmt::format("{}: weight must be [{}, 1, k] with k >= 1, found {}", op, s->channels, typeText(w)));
  }
  s->taps = w.shape[2];
  s->bias = present(setup.inputs, 2);
  if (s->bias && setup.inputs[2].shape != Ints{s->channels}) {
    throw UsageError(fmt::format("{}: bias must be [{}], found {}", op, s->channels, typeText(setup.inputs[2])));
  }
  const Ints state_shape{s->batch, s->channels, s->taps - 1};
  s->past = present(setup.inputs, 3);
  if (s->past && setup.inputs[3].shape != state_shape) {
    throw UsageError(fmt::format("{}: past_state must be [{}, {}, {}], found {}", op, s->batch, s->channels,
                                 s->taps - 1, typeText(setup.inputs[3])));
  }
  const std::string activation = setup.params.getString("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    throw UsageError(fmt::format("{}: activation '{}' is not 'none', 'silu' or 'swish'", op, activation));
  }
  s->silu = activation != "none";
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
  if (setup.outputs.size() > 1) checks::expectOutput(op, setup, 1, x.dtype, state_shape);
  s->staging.plan(setup);
  return s;
}

void runCausalConv(const KernelCall& call) {
  const auto& s = static_cast<const CausalConvState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* w = s.staging.input(call, 1);
  const float* bias = s.bias ? s.staging.input(call, 2) : nullptr;
  const float* past = s.past ? s.staging.input(call, 3) : nullptr;
  float* y = s.staging.output(call, 0);
  float* present_state = call.output_count > 1 ? s.staging.output(call, 1) : nullptr;
  const int64_t carry = s.taps - 1;
  for (int64_t row = 0; row < s.batch * s.channels; ++row) {
    const float* in = x + row * s.length;
    const float* taps = w + row % s.channels * s.taps;
    const float* carried = past == nullptr ? nullptr : past + row * carry;
    // Position j of the padded sequence [carry | input].
    auto padded = [&](int64_t j) -> float {
      if (j >= carry) return in[j - carry];
      return carried == nullptr ? 0.0f : carried[j];
    };
    float* out = y + row * s.length;
    for (int64_t l = 0; l < s.length; ++l) {
      float sum = bias == nullptr ? 0.0f : bias[row % s.channels];
      for (int64_t i = 0; i < s.taps; ++i) sum += taps[i] * padded(l + i);
      out[l] = s.silu ? sum / (1.0f + std::exp(-sum)) : sum;
    }
    if (present_state != nullptr) {
      for (int64_t j = 0; j < carry; ++j) present_state[row * carry + j] = padded(s.length + j);
    }
  }
  s.staging.finish(call);
}

}  // namespace

void registerLinearAttentionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"LinearAttention", &prepareLinearAttention, &runLinearAttention});
  registry.add(KernelDef{"CausalConvWithState", &prepareCausalConv, &runCausalConv});
}

}  // namespace kiln
