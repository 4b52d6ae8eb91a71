// The geometry and options of one Attention step (ONNX Attention, opsets
// 23 to 25, and kiln.Attention, which passes/attention_fusion.h makes of
// exported attention chains), checked once when a kernel is prepared. The
// CPU kernel (cpu/transformer.cc) and the cuda kernel (cuda/attention.cc)
// both compute from it, so they accept and refuse the same nodes.
//
// Q, K and V are 4-D [batch, heads, sequence, head size] or 3-D [batch,
// sequence, heads * head size] (head counts in q_num_heads and
// kv_num_heads); the query heads are a multiple of the key/value heads
// (grouped-query attention). Scores are dot(q, k) * scale, softcapped with
// softcap * tanh(s / softcap) when softcap > 0, then the additive bias: the
// mask (bool: 0 or -inf; keys past its last dimension are masked), the
// causal frontier (key j allowed for query i when j <= i + offset), the
// sliding windows and the nonpad_kv_seqlen padding. offset is the past
// length, or nonpad_kv_seqlen[b] - q_seq without a past, or 0.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/kernel.h"

namespace kiln {

enum class AttentionMask { kNone, kBool, kFloat };

struct AttentionPlan {
  // Element strides of a [batch, heads, sequence, size] tensor in its 4-D or
  // 3-D layout; the size axis is contiguous.
  struct Strides {
    int64_t batch = 0;
    int64_t head = 0;
    int64_t seq = 0;
  };

  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_seq = 0, kv_seq = 0, past = 0, total = 0;
  int64_t head_size = 0, v_head_size = 0;
  Strides q, k, v, y;
  float scale = 0;  // applied to dot(q, k)
  float softcap = 0;
  bool causal = false;
  int64_t left_window = -1, right_window = -1;
  int64_t qk_mode = 0;
  AttentionMask mask = AttentionMask::kNone;
  int64_t mask_len = 0;                   // the mask's last dimension (<= total)
  std::array<int64_t, 3> mask_strides{};  // over batch, q head, query; 0 where broadcast
  bool nonpad = false;                    // input 6, nonpad_kv_seqlen, is given
};

// The strides of a [batch, heads, seq, size] tensor stored 4-D, or 3-D as
// [batch, seq, heads * size] (RotaryEmbedding's layouts too).
AttentionPlan::Strides headStrides(bool four_d, int64_t heads, int64_t seq, int64_t size);

// Checks the node (inputs, outputs, attributes) and plans it; UsageError
// with "Attention: ..." on anything the operator does not allow.
AttentionPlan planAttention(const KernelSetup& setup);

}  // namespace kiln
