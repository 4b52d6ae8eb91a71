// Host steps (cuda_steps.h): a CPU kernel inside a cuda program.
//
// In stream order: each device input is copied into pinned host memory,
// then a host function (cudaLaunchHostFunc, which CUDA graphs capture too)
// runs the CPU kernel over those host copies, then each output is copied
// back into its device memory. Constant inputs are read from the state's own
// host copy, so nothing is copied for them per call. The pinned buffers are
// allocated once at prepare: running allocates nothing.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/cuda_steps.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

struct PinnedDeleter {
  void operator()(std::byte* p) const { cudaFreeHost(p); }
};
using PinnedBytes = std::unique_ptr<std::byte, PinnedDeleter>;

PinnedBytes allocatePinned(uint64_t bytes) {
  void* data = nullptr;
  check(cudaMallocHost(&data, std::max<uint64_t>(bytes, 1)), "cudaMallocHost (host step)");
  return PinnedBytes(static_cast<std::byte*>(data));
}

struct HostStepState final : KernelState {
  RunKernel cpu_run = nullptr;
  std::unique_ptr<KernelState> cpu_state;
  std::vector<TensorView> host_inputs;   // over pinned copies, or the constants' own bytes
  std::vector<TensorView> host_outputs;  // over pinned buffers
  std::vector<bool> copy_input;          // false for constants and omitted inputs
  std::vector<PinnedBytes> pinned;
  std::vector<std::vector<std::byte>> constants;  // host copies of constant inputs
};

void CUDART_CB runCpuKernel(void* data) {
  const auto& s = *static_cast<const HostStepState*>(data);
  s.cpu_run(KernelCall{s.host_inputs.data(), static_cast<uint32_t>(s.host_inputs.size()),
                       const_cast<TensorView*>(s.host_outputs.data()), static_cast<uint32_t>(s.host_outputs.size()),
                       s.cpu_state.get(), nullptr});
}

}  // namespace

std::unique_ptr<KernelState> prepareOnHost(const KernelDef& cpu, const KernelSetup& setup) {
  auto state = std::make_unique<HostStepState>();
  state->cpu_run = cpu.run;
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& info = setup.inputs[i];
    if (info.dtype == DType::kUndefined) {
      state->host_inputs.push_back(TensorView{});
      state->copy_input.push_back(false);
      continue;
    }
    std::byte* data = nullptr;
    if (setup.constants[i] != nullptr) {
      state->constants.emplace_back(setup.constants[i], setup.constants[i] + info.sizeInBytes());
      data = state->constants.back().data();
      state->copy_input.push_back(false);
    } else {
      state->pinned.push_back(allocatePinned(info.sizeInBytes()));
      data = state->pinned.back().get();
      state->copy_input.push_back(true);
    }
    state->host_inputs.push_back(viewOf(info, data));
  }
  for (const TensorInfo& info : setup.outputs) {
    state->pinned.push_back(allocatePinned(info.sizeInBytes()));
    state->host_outputs.push_back(viewOf(info, state->pinned.back().get()));
  }
  // The CPU kernel sees its constants where the host views put them.
  std::vector<const std::byte*> host_constants;
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    host_constants.push_back(setup.constants[i] != nullptr ? state->host_inputs[i].data : nullptr);
  }
  state->cpu_state = cpu.prepare(KernelSetup{setup.params, setup.inputs, setup.outputs, host_constants, nullptr});
  return state;
}

void runOnHost(const KernelCall& call) {
  const auto& s = *static_cast<const HostStepState*>(call.state);
  const cudaStream_t stream = queueOf(call.queue).stream;
  for (uint32_t i = 0; i < call.input_count; ++i) {
    if (!s.copy_input[i]) continue;
    const uint64_t bytes = s.host_inputs[i].numElements() * dtypeSize(s.host_inputs[i].dtype);
    cudaMemcpyAsync(s.host_inputs[i].data, call.inputs[i].data, bytes, cudaMemcpyDeviceToHost, stream);
  }
  cudaLaunchHostFunc(stream, runCpuKernel, const_cast<HostStepState*>(&s));
  for (uint32_t i = 0; i < call.output_count; ++i) {
    const uint64_t bytes = s.host_outputs[i].numElements() * dtypeSize(s.host_outputs[i].dtype);
    cudaMemcpyAsync(call.outputs[i].data, s.host_outputs[i].data, bytes, cudaMemcpyHostToDevice, stream);
  }
}

void useQueueDevice(void* queue) { check(cudaSetDevice(queueOf(queue).device), "cudaSetDevice"); }

void synchronizeQueue(void* queue) { check(cudaStreamSynchronize(queueOf(queue).stream), "cudaStreamSynchronize"); }

}  // namespace kiln::cuda
