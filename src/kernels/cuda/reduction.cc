// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceSumSquare, ReduceL1,
// ReduceL2 and ReduceLogSumExp on cuda, f32, over axes that are adjacent
// once size-1 dimensions are set aside (the common cases: the last axes, the
// spatial axes of NCHW, everything); other axis sets and dtypes are
// declined. Kernel in normalization_kernels.cu.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

struct ReduceState final : KernelState {
  int64_t outer = 1, reduced = 1, inner = 1;
  Reduction reduction = Reduction::kSum;
  uint64_t copy_bytes = 0;  // noop_with_empty_axes: a copy
};

// By Reduction value.
constexpr const char* kNames[] = {"ReduceSum",       "ReduceMean", "ReduceMax", "ReduceMin",
                                  "ReduceSumSquare", "ReduceL2",   "ReduceL1",  "ReduceLogSumExp"};

template <Reduction kReduction>
std::unique_ptr<KernelState> prepareReduce(const KernelSetup& setup) {
  const std::string op = kNames[static_cast<int>(kReduction)];
  const TensorInfo& x = setup.inputs[0];
  if (x.dtype != DType::kF32) throw KernelUnsupported(op + " on cuda: inputs other than f32");
  std::vector<int64_t> axes = setup_helpers::reduceAxes(op, setup, x.shape.size());
  auto state = std::make_unique<ReduceState>();
  state->reduction = kReduction;
  if (axes.empty() && setup.params.getInt("noop_with_empty_axes", 0) != 0) {
    state->copy_bytes = x.sizeInBytes();
    return state;
  }
  std::vector<bool> reduced(x.shape.size(), axes.empty());
  for (int64_t axis : axes) reduced[static_cast<size_t>(axis)] = true;
  // outer | reduced | inner, skipping size-1 dimensions wherever they are.
  int phase = 0;  // 0 outer, 1 reduced, 2 inner
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (x.shape[d] == 1) continue;
    if (reduced[d]) {
      if (phase == 2) throw KernelUnsupported(op + " on cuda: axes that are not adjacent");
      phase = 1;
      state->reduced *= x.shape[d];
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? state->outer : state->inner) *= x.shape[d];
    }
  }
  return state;
}

void runReduce(const KernelCall& call) {
  const auto& s = *static_cast<const ReduceState*>(call.state);
  const cudaStream_t stream = queueOf(call.queue).stream;
  if (s.copy_bytes != 0) {
    cudaMemcpyAsync(call.outputs[0].data, call.inputs[0].data, s.copy_bytes, cudaMemcpyDeviceToDevice, stream);
    return;
  }
  launchReduce(call.inputs[0].as<const float>(), call.outputs[0].as<float>(), s.outer, s.reduced, s.inner, s.reduction,
               stream);
}

}  // namespace

void registerCudaReductionKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"ReduceSum", &prepareReduce<Reduction::kSum>, &runReduce});
  registry.add(KernelDef{"ReduceMean", &prepareReduce<Reduction::kMean>, &runReduce});
  registry.add(KernelDef{"ReduceMax", &prepareReduce<Reduction::kMax>, &runReduce});
  registry.add(KernelDef{"ReduceMin", &prepareReduce<Reduction::kMin>, &runReduce});
  registry.add(KernelDef{"ReduceSumSquare", &prepareReduce<Reduction::kSumSquare>, &runReduce});
  registry.add(KernelDef{"ReduceL1", &prepareReduce<Reduction::kL1>, &runReduce});
  registry.add(KernelDef{"ReduceL2", &prepareReduce<Reduction::kL2>, &runReduce});
  registry.add(KernelDef{"ReduceLogSumExp", &prepareReduce<Reduction::kLogSumExp>, &runReduce});
}

}  // namespace kiln::cuda
