// Attention on cuda: ONNX Attention and kiln.Attention (what the compiler's
// attention fusion makes of exported MatMul-Softmax-MatMul chains) as one
// fused kernel (attention_kernels.cu), f32 or f16/bf16 storage computed in
// f32. The node is checked by the plan the CPU kernel uses
// (kernels/attention_plan.h). Declined, so that the step runs on the host:
// a past key/value cache, the present_key/present_value and
// qk_matmul_output outputs, and head sizes above kMaxAttentionHeadSize.
#include <fmt/format.h>

#include <limits>

#include "kernels/attention_plan.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/post_ops.h"

namespace kiln::cuda {
namespace {

[[noreturn]] void decline(const std::string& why) {
  throw KernelUnsupported(fmt::format("Attention on cuda: {}", why));
}

struct AttentionState final : KernelState {
  AttentionShape shape;
  bool nonpad = false;
};

void copyStrides(const AttentionPlan::Strides& from, int64_t (&to)[3]) {
  to[0] = from.batch;
  to[1] = from.head;
  to[2] = from.seq;
}

std::unique_ptr<KernelState> prepareAttention(const KernelSetup& setup) {
  const AttentionPlan plan = planAttention(setup);
  if (setup.outputs.size() > 1) decline("the present_key, present_value and qk_matmul_output outputs");
  if (plan.past > 0) decline("a past key/value cache");
  if (plan.head_size > kMaxAttentionHeadSize || plan.v_head_size > kMaxAttentionHeadSize) {
    decline(fmt::format("head sizes {} and {} (up to {})", plan.head_size, plan.v_head_size, kMaxAttentionHeadSize));
  }
  const int64_t row_blocks = (plan.q_seq + kAttentionRowsPerBlock - 1) / kAttentionRowsPerBlock;
  if (row_blocks * plan.q_heads * plan.batch > std::numeric_limits<int32_t>::max()) decline("more than 2^31 blocks");
  auto state = std::make_unique<AttentionState>();
  AttentionShape& s = state->shape;
  s.storage = *floatStorageOf(setup.inputs[0].dtype);  // the plan accepts f32, f16 and bf16 only
  s.batch = plan.batch;
  s.q_heads = plan.q_heads;
  s.kv_heads = plan.kv_heads;
  s.q_seq = plan.q_seq;
  s.total = plan.total;
  s.head_size = plan.head_size;
  s.v_head_size = plan.v_head_size;
  copyStrides(plan.q, s.q_strides);
  copyStrides(plan.k, s.k_strides);
  copyStrides(plan.v, s.v_strides);
  copyStrides(plan.y, s.y_strides);
  s.scale = plan.scale;
  s.softcap = plan.softcap;
  s.causal = plan.causal;
  s.left_window = plan.left_window;
  s.right_window = plan.right_window;
  if (plan.mask == AttentionMask::kBool) s.mask = AttentionMaskKind::kBool;
  if (plan.mask == AttentionMask::kFloat) {
    s.mask = AttentionMaskKind::kFloat;
    s.mask_storage = *floatStorageOf(setup.inputs[3].dtype);
  }
  s.mask_len = plan.mask_len;
  for (size_t axis = 0; axis < 3; ++axis) s.mask_strides[axis] = plan.mask_strides[axis];
  state->nonpad = plan.nonpad;
  prepareAttentionKernel(s);
  return state;
}

void runAttention(const KernelCall& call) {
  const auto& state = *static_cast<const AttentionState*>(call.state);
  const void* mask = state.shape.mask == AttentionMaskKind::kNone ? nullptr : call.inputs[3].data;
  const auto* nonpad = state.nonpad ? call.inputs[6].as<const int64_t>() : nullptr;
  launchAttention(call.inputs[0].data, call.inputs[1].data, call.inputs[2].data, mask, nonpad, call.outputs[0].data,
                  state.shape, queueOf(call.queue).stream);
}

}  // namespace

void registerCudaAttentionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Attention", &prepareAttention, &runAttention});
  registry.add(KernelDef{"kiln.Attention", &prepareAttention, &runAttention});
}

}  // namespace kiln::cuda
