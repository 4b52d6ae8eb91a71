#include "kernels/cuda/step_timer.h"

#include <cuda_runtime.h>

#include <limits>
#include <vector>

#include "kernels/cuda/cuda_queue.h"

namespace kiln::cuda {
namespace {

constexpr int kWarmups = 2;
constexpr int kRuns = 5;

// Zero-filled device buffers for a list of tensors, freed on destruction.
class StandIns {
 public:
  bool allocate(std::span<const TensorInfo> infos) {
    for (const TensorInfo& info : infos) {
      void* data = nullptr;
      if (info.dtype != DType::kUndefined) {
        const size_t bytes = std::max<size_t>(info.sizeInBytes(), 1);
        if (cudaMalloc(&data, bytes) != cudaSuccess || cudaMemset(data, 0, bytes) != cudaSuccess) return false;
        buffers_.push_back(data);
      }
      views_.push_back(info.dtype == DType::kUndefined ? TensorView{} : viewOf(info, static_cast<std::byte*>(data)));
    }
    return true;
  }
  ~StandIns() {
    for (void* buffer : buffers_) cudaFree(buffer);
  }
  TensorView* views() { return views_.data(); }

 private:
  std::vector<void*> buffers_;
  std::vector<TensorView> views_;
};

}  // namespace

double timeStep(RunKernel run, const KernelState& state, const KernelSetup& setup) {
  constexpr double kFailed = std::numeric_limits<double>::infinity();
  const CudaQueue& queue = queueOf(setup.queue);
  StandIns inputs, outputs;
  if (!inputs.allocate(setup.inputs) || !outputs.allocate(setup.outputs)) {
    cudaGetLastError();
    return kFailed;
  }
  const KernelCall call{inputs.views(), static_cast<uint32_t>(setup.inputs.size()), outputs.views(),
                        static_cast<uint32_t>(setup.outputs.size()), &state, setup.queue};
  for (int i = 0; i < kWarmups; ++i) run(call);
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, queue.stream);
  for (int i = 0; i < kRuns; ++i) run(call);
  cudaEventRecord(stop, queue.stream);
  float ms = 0;
  const bool ok = cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok) {
    cudaGetLastError();
    return kFailed;
  }
  return static_cast<double>(ms) / kRuns;
}

}  // namespace kiln::cuda
