#include "kernels/cpu/onednn_support.h"

#include "core/fused_post_ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln::onednn {

const dnnl::engine& cpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

Dims denseStrides(const Dims& dims) {
  Dims strides(dims.size());
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(dims[d], 1);
  }
  return strides;
}

dnnl::memory reorderConstant(const dnnl::memory::desc& from, const std::byte* data, const dnnl::memory::desc& to) {
  const dnnl::engine& engine = cpuEngine();
  dnnl::memory source(from, engine, const_cast<std::byte*>(data));
  dnnl::memory packed(to, engine);
  dnnl::stream stream(engine);
  dnnl::reorder(source, packed).execute(stream, source, packed);
  stream.wait();
  return packed;
}

void appendActivation(dnnl::post_ops& ops, FusedActivation activation, float alpha, float beta) {
  using dnnl::algorithm;
  switch (activation) {
    case FusedActivation::kNone: return;
    case FusedActivation::kRelu: return ops.append_eltwise(1, algorithm::eltwise_relu, 0, 0);
    case FusedActivation::kLeakyRelu: return ops.append_eltwise(1, algorithm::eltwise_relu, alpha, 0);
    case FusedActivation::kSigmoid: return ops.append_eltwise(1, algorithm::eltwise_logistic, 0, 0);
    case FusedActivation::kTanh: return ops.append_eltwise(1, algorithm::eltwise_tanh, 0, 0);
    case FusedActivation::kClip: return ops.append_eltwise(1, algorithm::eltwise_clip, alpha, beta);
    case FusedActivation::kGelu: return ops.append_eltwise(1, algorithm::eltwise_gelu_erf, 0, 0);
    case FusedActivation::kGeluTanh: return ops.append_eltwise(1, algorithm::eltwise_gelu_tanh, 0, 0);
    case FusedActivation::kHardSwish: return ops.append_eltwise(1, algorithm::eltwise_hardswish, 0, 0);
    case FusedActivation::kSwish: return ops.append_eltwise(1, algorithm::eltwise_swish, 1, 0);  // x * sigmoid(1 * x)
    case FusedActivation::kLinear: return ops.append_eltwise(1, algorithm::eltwise_linear, alpha, beta);
  }
}

dnnl::post_ops fusedPostOps(std::string_view op, const ParamMap& params, const dnnl::memory::desc& dst,
                            int& binary_index) {
  binary_index = -1;
  dnnl::post_ops post_ops;
  for (const PostOp& post : readPostOps(std::string(op), params)) {
    if (post.add) {
      binary_index = post_ops.len();
      post_ops.append_binary(dnnl::algorithm::binary_add, dst);
    } else {
      appendActivation(post_ops, post.activation, post.alpha, post.beta);
    }
  }
  return post_ops;
}

void ExecutionSlots::create(const dnnl::engine& engine, const dnnl::memory::desc& scratchpad) {
  has_scratchpad_ = scratchpad.get_size() != 0;
  slots_ = std::make_unique<ExecutionSlot[]>(kExecutionSlots);
  for (size_t i = 0; i < kExecutionSlots; ++i) {
    ExecutionSlot& slot = slots_[i];
    slot.stream = dnnl::stream(engine);
    if (has_scratchpad_) slot.scratchpad = dnnl::memory(scratchpad, engine);
  }
}

ExecutionSlot& ExecutionSlots::claim() const {
  for (;;) {
    for (size_t i = 0; i < kExecutionSlots; ++i) {
      ExecutionSlot& slot = slots_[i];
      if (!slot.busy.load(std::memory_order_relaxed) && !slot.busy.exchange(true, std::memory_order_acquire)) {
        return slot;
      }
    }
    std::this_thread::yield();
  }
}

void dnnlFailed(const char* kernel, const char* what, dnnl_status_t status) {
  std::fprintf(stderr, "kiln: %s kernel: %s failed with oneDNN status %d\n", kernel, what, static_cast<int>(status));
  std::abort();
}

void setHandle(const char* kernel, const dnnl::memory& memory, void* data) {
  const dnnl_status_t status = dnnl_memory_set_data_handle_v2(memory.get(), data, nullptr);
  if (status != dnnl_success) dnnlFailed(kernel, "dnnl_memory_set_data_handle", status);
}

void execute(const char* kernel, const dnnl::primitive& primitive, const ExecutionSlots& slots, ExecutionSlot& slot,
             dnnl_exec_arg_t* args, int count) {
  if (slots.hasScratchpad()) args[count++] = {DNNL_ARG_SCRATCHPAD, slot.scratchpad.get()};
  dnnl_status_t status = dnnl_primitive_execute(primitive.get(), slot.stream.get(), count, args);
  if (status == dnnl_success) status = dnnl_stream_wait(slot.stream.get());
  slot.busy.store(false, std::memory_order_release);
  if (status != dnnl_success) dnnlFailed(kernel, "dnnl_primitive_execute", status);
}

namespace {

void reorderInSlot(const char* kernel, const dnnl::primitive& reorder, ExecutionSlot& slot, const dnnl::memory& from,
                   const dnnl::memory& to) {
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
  dnnl_status_t status = dnnl_primitive_execute(reorder.get(), slot.stream.get(), 2, args);
  if (status == dnnl_success) status = dnnl_stream_wait(slot.stream.get());
  if (status != dnnl_success) {
    slot.busy.store(false, std::memory_order_release);
    dnnlFailed(kernel, "dnnl_primitive_execute (reorder)", status);
  }
}

}  // namespace

void reorderWeights(const char* kernel, const dnnl::primitive& reorder, ExecutionSlot& slot) {
  reorderInSlot(kernel, reorder, slot, slot.weights_plain, slot.weights);
}

void reorderSource(const char* kernel, const dnnl::primitive& reorder, ExecutionSlot& slot) {
  reorderInSlot(kernel, reorder, slot, slot.src_plain, slot.src);
}

}  // namespace kiln::onednn
