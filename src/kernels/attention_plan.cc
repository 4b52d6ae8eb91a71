#include "kernels/attention_plan.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::present;
using checks::typeText;

// The mask [..., q_seq, mask_len] broadcasts to [batch, q_heads, q_seq, *].
void planMask(AttentionPlan& plan, const TensorInfo& mask) {
  constexpr std::string_view op = "Attention";
  if (mask.dtype == DType::kBool) {
    plan.mask = AttentionMask::kBool;
  } else if (fp::isComputedInF32(mask.dtype)) {
    plan.mask = AttentionMask::kFloat;
  } else {
    throw UsageError(fmt::format("{}: attn_mask must be bool or a float type, found {}", op, typeText(mask)));
  }
  const Ints& m = mask.shape;
  if (m.empty() || m.size() > 4) {
    throw UsageError(fmt::format("{}: attn_mask must have rank 1 to 4, found {}", op, typeText(mask)));
  }
  plan.mask_len = m.back();
  if (plan.mask_len > plan.total) {
    throw UsageError(fmt::format("{}: attn_mask {} is longer than the {} keys", op, typeText(mask), plan.total));
  }
  // Right-aligned: the mask's axes before the last map to query, q head, batch.
  const int64_t full[3] = {plan.batch, plan.q_heads, plan.q_seq};
  int64_t stride = plan.mask_len;
  for (int axis = 2; axis >= 0; --axis) {
    const int64_t from_end = 3 - axis;  // 1 for the query axis
    const auto index = static_cast<int64_t>(m.size()) - 1 - from_end;
    const int64_t size = index >= 0 ? m[static_cast<size_t>(index)] : 1;
    if (size != 1 && size != full[axis]) {
      throw UsageError(fmt::format("{}: attn_mask {} does not broadcast to [{}, {}, {}, {}]", op, typeText(mask),
                                   plan.batch, plan.q_heads, plan.q_seq, plan.total));
    }
    plan.mask_strides[static_cast<size_t>(axis)] = size == 1 ? 0 : stride;
    stride *= size;
  }
}

}  // namespace

AttentionPlan::Strides headStrides(bool four_d, int64_t heads, int64_t seq, int64_t size) {
  if (four_d) return {heads * seq * size, seq * size, size};
  return {seq * heads * size, size, heads * size};
}

AttentionPlan planAttention(const KernelSetup& setup) {
  constexpr std::string_view op = "Attention";
  checks::expectCounts(op, setup, 3, 7, 1, 4);
  const TensorInfo& q = setup.inputs[0];
  const TensorInfo& k = setup.inputs[1];
  const TensorInfo& v = setup.inputs[2];
  if (!fp::isComputedInF32(q.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32, f16, bf16)", op, typeText(q)));
  }
  for (size_t i : {1u, 2u, 4u, 5u}) {
    if (present(setup.inputs, i) && setup.inputs[i].dtype != q.dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but Q is {}", op, i, typeText(setup.inputs[i]), typeText(q)));
    }
  }
  const size_t rank = q.shape.size();
  if ((rank != 3 && rank != 4) || k.shape.size() != rank || v.shape.size() != rank) {
    throw UsageError(fmt::format("{}: Q, K and V must all be 3-D or all 4-D, found {}, {}, {}", op, typeText(q),
                                 typeText(k), typeText(v)));
  }
  AttentionPlan plan;
  plan.batch = q.shape[0];
  const bool four_d = rank == 4;
  if (four_d) {
    plan.q_heads = q.shape[1];
    plan.kv_heads = k.shape[1];
    plan.q_seq = q.shape[2];
    plan.kv_seq = k.shape[2];
    plan.head_size = q.shape[3];
    plan.v_head_size = v.shape[3];
    if (k.shape[3] != plan.head_size || v.shape[1] != plan.kv_heads || v.shape[2] != plan.kv_seq) {
      throw UsageError(fmt::format("{}: Q {}, K {} and V {} do not agree", op, typeText(q), typeText(k), typeText(v)));
    }
  } else {
    plan.q_heads = setup.params.getInt("q_num_heads", 0);
    plan.kv_heads = setup.params.getInt("kv_num_heads", 0);
    if (plan.q_heads < 1 || plan.kv_heads < 1 || q.shape[2] % plan.q_heads != 0 || k.shape[2] % plan.kv_heads != 0 ||
        v.shape[2] % plan.kv_heads != 0) {
      throw UsageError(fmt::format("{}: 3-D Q {}, K {}, V {} need q_num_heads and kv_num_heads that divide them", op,
                                   typeText(q), typeText(k), typeText(v)));
    }
    plan.q_seq = q.shape[1];
    plan.kv_seq = k.shape[1];
    plan.head_size = q.shape[2] / plan.q_heads;
    plan.v_head_size = v.shape[2] / plan.kv_heads;
    if (k.shape[2] / plan.kv_heads != plan.head_size || v.shape[1] != plan.kv_seq) {
      throw UsageError(fmt::format("{}: Q {}, K {} and V {} do not agree", op, typeText(q), typeText(k), typeText(v)));
    }
  }
  if (k.shape[0] != plan.batch || v.shape[0] != plan.batch || plan.q_heads % plan.kv_heads != 0) {
    throw UsageError(fmt::format("{}: Q {}, K {} and V {} do not agree (batch, or q heads a multiple of kv heads)", op,
                                 typeText(q), typeText(k), typeText(v)));
  }
  if (present(setup.inputs, 4) != present(setup.inputs, 5)) {
    throw UsageError(fmt::format("{}: past_key and past_value must be given together", op));
  }
  if (present(setup.inputs, 4)) {
    const Ints& pk = setup.inputs[4].shape;
    const Ints& pv = setup.inputs[5].shape;
    if (pk.size() != 4 || pv.size() != 4 || pk != Ints{plan.batch, plan.kv_heads, pk[2], plan.head_size} ||
        pv != Ints{plan.batch, plan.kv_heads, pk[2], plan.v_head_size}) {
      throw UsageError(fmt::format("{}: past_key {} and past_value {} must be [{}, {}, P, {}] and [{}, {}, P, {}]", op,
                                   typeText(setup.inputs[4]), typeText(setup.inputs[5]), plan.batch, plan.kv_heads,
                                   plan.head_size, plan.batch, plan.kv_heads, plan.v_head_size));
    }
    plan.past = pk[2];
  }
  plan.total = plan.past + plan.kv_seq;
  plan.q = headStrides(four_d, plan.q_heads, plan.q_seq, plan.head_size);
  plan.k = headStrides(four_d, plan.kv_heads, plan.kv_seq, plan.head_size);
  plan.v = headStrides(four_d, plan.kv_heads, plan.kv_seq, plan.v_head_size);
  plan.y = headStrides(four_d, plan.q_heads, plan.q_seq, plan.v_head_size);
  if (present(setup.inputs, 3)) planMask(plan, setup.inputs[3]);
  if (present(setup.inputs, 6)) {
    const TensorInfo& lens = setup.inputs[6];
    if (lens.dtype != DType::kI64 || lens.shape != Ints{plan.batch}) {
      throw UsageError(fmt::format("{}: nonpad_kv_seqlen must be i64[{}], found {}", op, plan.batch, typeText(lens)));
    }
    if (plan.past > 0) throw UsageError(fmt::format("{}: nonpad_kv_seqlen cannot be combined with past_key", op));
    plan.nonpad = true;
  }
  // Attributes.
  const double head_scale = 1.0 / std::sqrt(static_cast<double>(plan.head_size));
  const double scale = setup.params.getFloat("scale", head_scale);
  float root = static_cast<float>(std::sqrt(scale));
  if (fp::isNarrowFloat(q.dtype)) {  // as the reference: sqrt(scale) in the input type
    std::byte bits[2];
    fp::fromFloat(q.dtype, &root, bits, 1);
    fp::toFloat(q.dtype, bits, &root, 1);
  }
  plan.scale = root * root;
  plan.softcap = static_cast<float>(setup.params.getFloat("softcap", 0.0));
  plan.causal = setup.params.getInt("is_causal", 0) != 0;
  plan.left_window = setup.params.getInt("left_window_size", -1);
  plan.right_window = setup.params.getInt("right_window_size", -1);
  plan.qk_mode = setup.params.getInt("qk_matmul_output_mode", 0);
  if (plan.qk_mode < 0 || plan.qk_mode > 3) {
    throw UsageError(fmt::format("{}: qk_matmul_output_mode {} is not 0, 1, 2 or 3", op, plan.qk_mode));
  }
  if (plan.softcap < 0) throw UsageError(fmt::format("{}: softcap {} is negative", op, plan.softcap));
  if (plan.left_window < -1 || plan.right_window < -1) {
    throw UsageError(fmt::format("{}: window sizes must be -1 or nonnegative, found {} and {}", op, plan.left_window,
                                 plan.right_window));
  }
  // Outputs.
  const Ints y = four_d ? Ints{plan.batch, plan.q_heads, plan.q_seq, plan.v_head_size}
                        : Ints{plan.batch, plan.q_seq, plan.q_heads * plan.v_head_size};
  const Ints shapes[4] = {y, {plan.batch, plan.kv_heads, plan.total, plan.head_size},
                          {plan.batch, plan.kv_heads, plan.total, plan.v_head_size}, {plan.batch, plan.q_heads, plan.q_seq, plan.total}};
  for (size_t i = 0; i < setup.outputs.size(); ++i) checks::expectOutput(op, setup, i, q.dtype, shapes[i]);
  return plan;
}

}  // namespace kiln
