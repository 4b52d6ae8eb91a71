// Transformer-block kernels (ONNX) on the CPU: Attention, RotaryEmbedding,
// RMSNormalization, SwiGLU. All compute in f32; f16 and bf16 tensors are
// converted around that (float_staging.h), whose scratch lives in the state:
// one call at a time per prepared step, as the executor runs them.
//
// Attention follows onnx/reference/ops/op_attention.py; its node is checked
// and planned by kernels/attention_plan.h (which says what a score and its
// bias are, and which the cuda kernel shares). Per query row it makes one
// pass over the keys with an online softmax (running maximum and sum, the
// output row rescaled when the maximum grows, as FlashAttention does), so it
// needs no scratch for the scores: Y's row is the accumulator. A row whose
// keys are all masked gives zeros. The reference scales q and k by
// sqrt(scale) in the input type, so scale is rounded the same way.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_plan.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/transpose_tile.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::present;
using checks::typeText;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void expectComputedInF32(std::string_view op, const TensorInfo& info, std::string_view what) {
  if (!fp::isComputedInF32(info.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} {} (supports f32, f16, bf16)", op, typeText(info), what));
  }
}

// ---------------------------------------------------------------- Attention

using Strides = AttentionPlan::Strides;
using MaskKind = AttentionMask;

// The plan (kernels/attention_plan.h) and the f16/bf16 staging.
struct AttentionState final : KernelState, AttentionPlan {
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareAttention(const KernelSetup& setup) {
  auto s = std::make_unique<AttentionState>();
  static_cast<AttentionPlan&>(*s) = planAttention(setup);
  s->staging.plan(setup);
  return s;
}

// present = concat(past, new) along the sequence, [batch, kv heads, total, size].
void writePresent(const AttentionState& s, const float* past, const float* fresh, const Strides& strides, int64_t size,
                  float* present) {
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      float* out = present + (b * s.kv_heads + h) * s.total * size;
      if (s.past > 0) {
        std::memcpy(out, past + (b * s.kv_heads + h) * s.past * size, static_cast<size_t>(s.past * size) * sizeof(float));
      }
      for (int64_t j = 0; j < s.kv_seq; ++j) {
        std::memcpy(out + (s.past + j) * size, fresh + b * strides.batch + h * strides.head + j * strides.seq,
                    static_cast<size_t>(size) * sizeof(float));
      }
    }
  }
}

struct AttentionData {
  const float* q;
  const float* k;
  const float* v;
  const float* past_key;
  const float* past_value;
  const std::byte* mask;
  const float* float_mask;
  const int64_t* nonpad;
  float* y;
  float* scores;  // qk_matmul_output, or nullptr
};

// The additive bias of key j for query i of (batch b, q head h).
float biasOf(const AttentionState& s, const AttentionData& d, int64_t b, int64_t h, int64_t i, int64_t j,
             int64_t offset) {
  float bias = 0;
  if (s.mask != MaskKind::kNone) {
    if (j >= s.mask_len) {
      bias += kNegInf;
    } else {
      const int64_t at = b * s.mask_strides[0] + h * s.mask_strides[1] + i * s.mask_strides[2] + j;
      if (s.mask == MaskKind::kBool) {
        bias += d.mask[at] != std::byte{0} ? 0.0f : kNegInf;
      } else {
        bias += d.float_mask[at];
      }
    }
  }
  const int64_t frontier = i + offset;  // the query's absolute position
  if (s.causal && j > frontier) bias += kNegInf;
  if (s.left_window >= 0 && frontier - j > s.left_window) bias += kNegInf;
  if (s.right_window >= 0 && j - frontier > s.right_window) bias += kNegInf;
  if (s.nonpad && j >= d.nonpad[b]) bias += kNegInf;
  return bias;
}

void attentionRow(const AttentionState& s, const AttentionData& d, int64_t b, int64_t h, int64_t i) {
  const int64_t kv_h = h / (s.q_heads / s.kv_heads);
  const float* q = d.q + b * s.q.batch + h * s.q.head + i * s.q.seq;
  float* y = d.y + b * s.y.batch + h * s.y.head + i * s.y.seq;
  float* scores = d.scores == nullptr ? nullptr : d.scores + ((b * s.q_heads + h) * s.q_seq + i) * s.total;
  const int64_t offset = s.past > 0 ? s.past : (s.nonpad ? d.nonpad[b] - s.q_seq : 0);
  std::fill(y, y + s.v_head_size, 0.0f);
  float max = kNegInf;
  float sum = 0;
  bool any_allowed = false;
  for (int64_t j = 0; j < s.total; ++j) {
    const bool past = j < s.past;
    const float* key = past ? d.past_key + ((b * s.kv_heads + kv_h) * s.past + j) * s.head_size
                            : d.k + b * s.k.batch + kv_h * s.k.head + (j - s.past) * s.k.seq;
    const float* value = past ? d.past_value + ((b * s.kv_heads + kv_h) * s.past + j) * s.v_head_size
                              : d.v + b * s.v.batch + kv_h * s.v.head + (j - s.past) * s.v.seq;
    float dot = 0;
    for (int64_t c = 0; c < s.head_size; ++c) dot += q[c] * key[c];
    float logit = dot * s.scale;
    if (s.softcap > 0) logit = s.softcap * std::tanh(logit / s.softcap);
    const float bias = biasOf(s, d, b, h, i, j, offset);
    any_allowed = any_allowed || !(bias == kNegInf);
    const float z = logit + bias;
    if (scores != nullptr) scores[j] = s.qk_mode <= 1 ? logit : z;
    if (z == kNegInf) continue;  // weight 0
    if (std::isnan(z)) {
      max = z;  // poisons the row, as in the reference
      continue;
    }
    if (z > max) {
      const float factor = std::exp(max - z);
      for (int64_t c = 0; c < s.v_head_size; ++c) y[c] *= factor;
      sum *= factor;
      max = z;
    }
    const float e = std::exp(z - max);
    sum += e;
    for (int64_t c = 0; c < s.v_head_size; ++c) y[c] += e * value[c];
  }
  const bool zero = !any_allowed || sum == 0;
  const float inv = zero ? 0.0f : (std::isnan(max) ? max : 1.0f / sum);
  for (int64_t c = 0; c < s.v_head_size; ++c) y[c] = zero ? 0.0f : y[c] * inv;
  if (scores != nullptr && s.qk_mode == 3) {
    for (int64_t j = 0; j < s.total; ++j) scores[j] = zero ? 0.0f : std::exp(scores[j] - max) * inv;
  }
}

// ------------------------------------------------- Attention, the fast path
//
// The attention of encoders (BERT, MiniLM, T5, ViT; what the compiler's
// attention fusion makes, passes/attention_fusion.h): no past, softcap,
// window, padding lengths or scores output. Per (batch, head) and block of
// up to kFastRows queries it computes the whole score block with the small
// GEMM of the vector kernels (Q rows times K transposed, packed once per
// task), takes the softmax of each row with the vector exp, and multiplies
// the block by V with the same GEMM, then scales each output row by
// 1 / sum. The scores of a row are exact before the exponential, as the
// reference's; only the summation order differs from attentionRow.
constexpr int64_t kFastRows = 16;          // queries per score block
constexpr int64_t kFastMinTaskRows = 64;   // queries per parallel task, at least
constexpr int64_t kFastTasksPerThread = 4;  // enough tasks to even the threads out

bool fastPathApplies(const AttentionState& s, size_t output_count) {
  return output_count == 1 && s.past == 0 && s.softcap == 0 && !s.nonpad && s.left_window < 0 &&
         s.right_window < 0 && s.total > 0;
}

// One task: queries [begin, end) of (batch b, q head h).
void attentionBlockFast(const AttentionState& s, const AttentionData& d, int64_t b, int64_t h, int64_t begin,
                        int64_t end) {
  const vec::VectorKernels& vk = vec::vectorKernels();
  const int64_t t = s.total;
  const int64_t kv_h = h / (s.q_heads / s.kv_heads);
  // Working memory of this thread: K transposed [head_size, t], the score
  // block [kFastRows, t]. It grows to the largest call once and stays.
  thread_local std::vector<float> scratch;
  const auto need = static_cast<size_t>((s.head_size + kFastRows) * t);
  if (scratch.size() < need) scratch.resize(need);
  float* kt = scratch.data();
  float* scores = kt + s.head_size * t;
  const float* k = d.k + b * s.k.batch + kv_h * s.k.head;
  // K transposed: kt[c][j] = k[j][c], by 4x4 vector blocks.
  transposeTile(kt, t, k, s.k.seq, s.head_size, t);
  const float* v = d.v + b * s.v.batch + kv_h * s.v.head;
  const vec::BinaryFn add = vk.binaryFn(vec::Binary::kAdd, vec::Operands::kBoth);
  float inv_sum[kFastRows];
  for (int64_t i0 = begin; i0 < end; i0 += kFastRows) {
    const int64_t rows = std::min(kFastRows, end - i0);
    std::fill(scores, scores + rows * t, 0.0f);
    vk.matmulAccumulate(d.q + b * s.q.batch + h * s.q.head + i0 * s.q.seq, s.q.seq, kt, t, scores, t, rows, t,
                        s.head_size);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* row = scores + r * t;
      vk.affine(row, row, t, s.scale, 0.0f);
      if (s.mask != MaskKind::kNone) {
        const int64_t at = b * s.mask_strides[0] + h * s.mask_strides[1] + i * s.mask_strides[2];
        if (s.mask == MaskKind::kFloat) {
          add(row, d.float_mask + at, row, s.mask_len);
        } else {
          for (int64_t j = 0; j < s.mask_len; ++j) {
            if (d.mask[at + j] == std::byte{0}) row[j] = kNegInf;
          }
        }
        std::fill(row + s.mask_len, row + t, kNegInf);
      }
      if (s.causal && i + 1 < t) std::fill(row + i + 1, row + t, kNegInf);
      const float max = vk.max(row, t);
      if (max == kNegInf) {  // every key masked: the reference gives zeros
        std::fill(row, row + t, 0.0f);
        inv_sum[r] = 0;
        continue;
      }
      const float sum = vk.expSum(row, row, t, max);
      inv_sum[r] = sum == 0 ? 0.0f : 1.0f / sum;
    }
    float* y = d.y + b * s.y.batch + h * s.y.head + i0 * s.y.seq;
    for (int64_t r = 0; r < rows; ++r) std::fill(y + r * s.y.seq, y + r * s.y.seq + s.v_head_size, 0.0f);
    vk.matmulAccumulate(scores, t, v, s.v.seq, y, s.y.seq, rows, s.v_head_size, t);
    for (int64_t r = 0; r < rows; ++r) vk.affine(y + r * s.y.seq, y + r * s.y.seq, s.v_head_size, inv_sum[r], 0.0f);
  }
}

// Each task packs its head's K once: a task takes all queries of a head
// when there are heads enough to keep every thread busy, else blocks of at
// least kFastMinTaskRows queries.
void runAttentionFast(const AttentionState& s, const AttentionData& d) {
  const int64_t heads = s.batch * s.q_heads;
  int64_t task_rows = s.q_seq;
#if defined(_OPENMP)
  const int64_t wanted = kFastTasksPerThread * omp_get_max_threads();
  if (heads < wanted) {
    const int64_t blocks_per_head = (wanted + heads - 1) / heads;
    task_rows = std::max(kFastMinTaskRows, (s.q_seq + blocks_per_head - 1) / blocks_per_head);
  }
#endif
  const int64_t blocks = (s.q_seq + task_rows - 1) / task_rows;
  parallelForItems(heads * blocks, std::min(s.q_seq, task_rows) * s.total * (s.head_size + s.v_head_size),
                   [&](int64_t first, int64_t last) {
                     for (int64_t task = first; task < last; ++task) {
                       const int64_t block = task % blocks;
                       const int64_t head = task / blocks % s.q_heads;
                       const int64_t b = task / blocks / s.q_heads;
                       attentionBlockFast(s, d, b, head, block * task_rows, std::min(s.q_seq, (block + 1) * task_rows));
                     }
                   });
}

void runAttention(const KernelCall& call) {
  const auto& s = static_cast<const AttentionState&>(*call.state);
  AttentionData d{};
  d.q = s.staging.input(call, 0);
  d.k = s.staging.input(call, 1);
  d.v = s.staging.input(call, 2);
  if (s.mask == MaskKind::kBool) d.mask = call.inputs[3].data;
  if (s.mask == MaskKind::kFloat) d.float_mask = s.staging.input(call, 3);
  if (s.past > 0) {
    d.past_key = s.staging.input(call, 4);
    d.past_value = s.staging.input(call, 5);
  }
  if (s.nonpad) d.nonpad = call.inputs[6].as<const int64_t>();
  d.y = s.staging.output(call, 0);
  if (call.output_count > 1) writePresent(s, d.past_key, d.k, s.k, s.head_size, s.staging.output(call, 1));
  if (call.output_count > 2) writePresent(s, d.past_value, d.v, s.v, s.v_head_size, s.staging.output(call, 2));
  if (call.output_count > 3) d.scores = s.staging.output(call, 3);
  if (fastPathApplies(s, call.output_count)) {
    runAttentionFast(s, d);
    s.staging.finish(call);
    return;
  }
  const int64_t rows = s.batch * s.q_heads * s.q_seq;
  parallelForItems(rows, s.total * (s.head_size + s.v_head_size), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      attentionRow(s, d, row / (s.q_heads * s.q_seq), row / s.q_seq % s.q_heads, row % s.q_seq);
    }
  });
  s.staging.finish(call);
}

// ---------------------------------------------------------- RotaryEmbedding

struct RotaryState final : KernelState {
  int64_t batch = 0, heads = 0, seq = 0, head_size = 0;
  Strides x;            // of X and Y
  int64_t rotary = 0;   // rotated elements at the start of each head
  bool interleaved = false;
  bool positions = false;
  int64_t cache_rows = 0;  // with position_ids: rows of the caches
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareRotary(const KernelSetup& setup) {
  constexpr std::string_view op = "RotaryEmbedding";
  checks::expectCounts(op, setup, 3, 4, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  expectComputedInF32(op, x, "input");
  for (size_t i : {1u, 2u}) {
    if (setup.inputs[i].dtype != x.dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but X is {}", op, i, typeText(setup.inputs[i]), typeText(x)));
    }
  }
  auto s = std::make_unique<RotaryState>();
  s->batch = x.shape.empty() ? 0 : x.shape[0];
  if (x.shape.size() == 4) {
    s->heads = x.shape[1];
    s->seq = x.shape[2];
    s->head_size = x.shape[3];
  } else if (x.shape.size() == 3) {
    s->heads = setup.params.getInt("num_heads", 0);
    if (s->heads < 1 || x.shape[2] % s->heads != 0) {
      throw UsageError(fmt::format("{}: a 3-D X {} needs a num_heads that divides its last axis, found {}", op,
                                   typeText(x), s->heads));
    }
    s->seq = x.shape[1];
    s->head_size = x.shape[2] / s->heads;
  } else {
    throw UsageError(fmt::format("{}: X must be 3-D or 4-D, found {}", op, typeText(x)));
  }
  s->x = headStrides(x.shape.size() == 4, s->heads, s->seq, s->head_size);
  s->rotary = setup.params.getInt("rotary_embedding_dim", 0);
  if (s->rotary == 0) s->rotary = s->head_size;
  if (s->rotary < 0 || s->rotary > s->head_size || s->rotary % 2 != 0) {
    throw UsageError(fmt::format("{}: rotary_embedding_dim {} must be even and at most the head size {}", op, s->rotary,
                                 s->head_size));
  }
  s->interleaved = setup.params.getInt("interleaved", 0) != 0;
  s->positions = present(setup.inputs, 3);
  const int64_t half = s->rotary / 2;
  const Ints& cos = setup.inputs[1].shape;
  if (s->positions) {
    checks::expectDType(op, "position_ids", setup.inputs[3], DType::kI64);
    if (setup.inputs[3].shape != Ints{s->batch, s->seq}) {
      throw UsageError(fmt::format("{}: position_ids must be [{}, {}], found {}", op, s->batch, s->seq,
                                   typeText(setup.inputs[3])));
    }
    if (cos.size() != 2 || cos[1] != half) {
      throw UsageError(fmt::format("{}: with position_ids the caches must be [positions, {}], found {}", op, half,
                                   typeText(setup.inputs[1])));
    }
    s->cache_rows = cos[0];
  } else if (cos != Ints{s->batch, s->seq, half}) {
    throw UsageError(fmt::format("{}: without position_ids the caches must be [{}, {}, {}], found {}", op, s->batch,
                                 s->seq, half, typeText(setup.inputs[1])));
  }
  if (setup.inputs[2].shape != cos) {
    throw UsageError(fmt::format("{}: sin_cache {} and cos_cache {} differ", op, typeText(setup.inputs[2]),
                                 typeText(setup.inputs[1])));
  }
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
  s->staging.plan(setup);
  return s;
}

void runRotary(const KernelCall& call) {
  const auto& s = static_cast<const RotaryState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* cos_cache = s.staging.input(call, 1);
  const float* sin_cache = s.staging.input(call, 2);
  const int64_t* positions = s.positions ? call.inputs[3].as<const int64_t>() : nullptr;
  float* y = s.staging.output(call, 0);
  const int64_t half = s.rotary / 2;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.seq; ++t) {
      // An out-of-range position id is clamped (run cannot fail).
      const int64_t row = positions == nullptr ? b * s.seq + t
                                               : std::clamp<int64_t>(positions[b * s.seq + t], 0, s.cache_rows - 1);
      const float* cos = cos_cache + row * half;
      const float* sin = sin_cache + row * half;
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t at = b * s.x.batch + h * s.x.head + t * s.x.seq;
        const float* in = x + at;
        float* out = y + at;
        for (int64_t c = 0; c < half; ++c) {
          const int64_t i1 = s.interleaved ? 2 * c : c;
          const int64_t i2 = s.interleaved ? 2 * c + 1 : c + half;
          const float x1 = in[i1];
          const float x2 = in[i2];
          out[i1] = cos[c] * x1 - sin[c] * x2;
          out[i2] = sin[c] * x1 + cos[c] * x2;
        }
        std::copy(in + s.rotary, in + s.head_size, out + s.rotary);
      }
    }
  }
  s.staging.finish(call);
}

// --------------------------------------------------------- RMSNormalization

struct RmsNormState final : KernelState {
  int64_t rows = 0;
  int64_t size = 0;  // normalised elements per row
  float epsilon = 0;
  std::vector<int64_t> scale_index;  // per element of a row: its scale element (broadcasting)
  bool scale_is_row = false;         // scale_index is 0, 1, 2, ...: the vector path
  fp::FloatStaging staging;
};

// The flat index into `param` (right-aligned against `dims`, broadcasting)
// of each element of `dims`; UsageError when it does not broadcast.
std::vector<int64_t> broadcastIndices(std::string_view op, const TensorInfo& param, const Ints& dims) {
  const Ints& p = param.shape;
  if (p.size() > dims.size()) {
    for (size_t i = 0; i < p.size() - dims.size(); ++i) {
      if (p[i] != 1) {
        throw UsageError(fmt::format("{}: {} does not broadcast to the normalised shape {}", op, typeText(param),
                                     TensorInfo{param.dtype, dims}.shapeString()));
      }
    }
  }
  const size_t lead = dims.size() - std::min(dims.size(), p.size());
  Ints strides(dims.size(), 0);
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > lead;) {
    const int64_t size = p[p.size() - (dims.size() - d)];
    if (size != 1 && size != dims[d]) {
      throw UsageError(fmt::format("{}: {} does not broadcast to the normalised shape {}", op, typeText(param),
                                   TensorInfo{param.dtype, dims}.shapeString()));
    }
    strides[d] = size == 1 ? 0 : stride;
    stride *= size;
  }
  std::vector<int64_t> indices(static_cast<size_t>(checks::elementCount(dims)));
  for (size_t e = 0; e < indices.size(); ++e) {
    int64_t rest = static_cast<int64_t>(e);
    int64_t index = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      index += rest % dims[d] * strides[d];
      rest /= dims[d];
    }
    indices[e] = index;
  }
  return indices;
}

std::unique_ptr<KernelState> prepareRmsNorm(const KernelSetup& setup) {
  constexpr std::string_view op = "RMSNormalization";
  checks::expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  expectComputedInF32(op, x, "input");
  expectComputedInF32(op, setup.inputs[1], "scale");
  const int64_t stash = setup.params.getInt("stash_type", 1);
  if (stash != 1) throw UsageError(fmt::format("{}: stash_type {} is not supported (only 1, f32)", op, stash));
  if (x.shape.empty()) throw UsageError(fmt::format("{}: needs an input of rank 1 or more, got a scalar", op));
  const size_t axis = checks::normalizeAxis(op, setup.params.getInt("axis", -1), x.shape.size());
  const Ints normalized(x.shape.begin() + static_cast<std::ptrdiff_t>(axis), x.shape.end());
  auto s = std::make_unique<RmsNormState>();
  s->size = checks::elementCount(normalized);
  s->rows = s->size == 0 ? 0 : checks::elementCount(x.shape) / s->size;
  s->epsilon = static_cast<float>(setup.params.getFloat("epsilon", 1e-5));
  s->scale_index = broadcastIndices(op, setup.inputs[1], normalized);
  s->scale_is_row = true;
  for (size_t e = 0; e < s->scale_index.size(); ++e) s->scale_is_row = s->scale_is_row && s->scale_index[e] == static_cast<int64_t>(e);
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
  s->staging.plan(setup);
  return s;
}

void runRmsNorm(const KernelCall& call) {
  const auto& s = static_cast<const RmsNormState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* scale = s.staging.input(call, 1);
  float* y = s.staging.output(call, 0);
  if (s.scale_is_row) {  // the vector kernels: sum of squares, then x * inv * scale
    const vec::VectorKernels& vk = vec::vectorKernels();
    parallelForItems(s.rows, s.size, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* in = x + r * s.size;
        const double mean_square = static_cast<double>(vk.sumSquares(in, s.size, 0.0f)) / static_cast<double>(s.size);
        const auto inv = static_cast<float>(1.0 / std::sqrt(mean_square + s.epsilon));
        vk.normalize(in, scale, nullptr, y + r * s.size, s.size, 0.0f, inv);
      }
    });
    s.staging.finish(call);
    return;
  }
  parallelForItems(s.rows, s.size, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = x + r * s.size;
      float* out = y + r * s.size;
      double squares = 0;
      for (int64_t e = 0; e < s.size; ++e) squares += static_cast<double>(in[e]) * in[e];
      const auto inv = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(s.size) + s.epsilon));
      for (int64_t e = 0; e < s.size; ++e) out[e] = in[e] * inv * scale[s.scale_index[static_cast<size_t>(e)]];
    }
  });
  s.staging.finish(call);
}

// ------------------------------------------------------------------- SwiGLU

struct SwigluState final : KernelState {
  int64_t size = 0;
  float alpha = 1;
  fp::FloatStaging staging;
};

std::unique_ptr<KernelState> prepareSwiglu(const KernelSetup& setup) {
  constexpr std::string_view op = "SwiGLU";
  checks::expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& a = setup.inputs[0];
  expectComputedInF32(op, a, "inputs");
  if (setup.inputs[1] != a) {
    throw UsageError(fmt::format("{}: A {} and B {} must have one type and shape (no broadcasting)", op, typeText(a),
                                 typeText(setup.inputs[1])));
  }
  checks::expectOutput(op, setup, 0, a.dtype, a.shape);
  auto s = std::make_unique<SwigluState>();
  s->size = checks::elementCount(a.shape);
  s->alpha = static_cast<float>(setup.params.getFloat("alpha", 1.0));
  s->staging.plan(setup);
  return s;
}

void runSwiglu(const KernelCall& call) {
  const auto& s = static_cast<const SwigluState&>(*call.state);
  const float* a = s.staging.input(call, 0);
  const float* b = s.staging.input(call, 1);
  float* y = s.staging.output(call, 0);
  parallelForElements(s.size, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = a[i] / (1.0f + std::exp(-s.alpha * a[i])) * b[i];
  }, 8);
  s.staging.finish(call);
}

}  // namespace

void registerTransformerKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Attention", &prepareAttention, &runAttention});
  registry.add(KernelDef{"kiln.Attention", &prepareAttention, &runAttention});
  registry.add(KernelDef{"RotaryEmbedding", &prepareRotary, &runRotary});
  registry.add(KernelDef{"RMSNormalization", &prepareRmsNorm, &runRmsNorm});
  registry.add(KernelDef{"kiln.RMSNormalization", &prepareRmsNorm, &runRmsNorm});
  registry.add(KernelDef{"SwiGLU", &prepareSwiglu, &runSwiglu});
}

}  // namespace kiln
