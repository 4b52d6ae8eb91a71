#include "kernels/cuda/cuda_queue.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln::cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw UsageError(fmt::format("{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status)));
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw UsageError(fmt::format("{}: {} ({})", what, cublasGetStatusString(status), cublasGetStatusName(status)));
  }
}

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw UsageError(fmt::format("{}: {}", what, cudnnGetErrorString(status)));
}

CudaQueue::~CudaQueue() {
  // Teardown errors cannot be reported (and a lost context fails them all).
  if (cudnn != nullptr) cudnnDestroy(cudnn);
  if (cublas_lt != nullptr) cublasLtDestroy(cublas_lt);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (workspace != nullptr) cudaFree(workspace);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

std::unique_ptr<CudaQueue> createQueue(int device) {
  auto queue = std::make_unique<CudaQueue>();
  queue->device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  // cuBLASLt wants a few MiB of scratch; cuDNN's fastest algorithms for
  // large batches (FFT, Winograd) want hundreds: 512 MiB on GPUs of 16 GiB
  // or more (onnxruntime lets cuDNN take what it asks for), 64 MiB below.
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const size_t kWorkspaceBytes = total_bytes >= (16ull << 30) ? (512ull << 20) : (64ull << 20);
  check(cudaStreamCreateWithFlags(&queue->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&queue->cublas), "cublasCreate");
  check(cublasSetStream(queue->cublas, queue->stream), "cublasSetStream");
  // f32 stays f32: TF32 tensor cores only where a package opts in.
  check(cublasSetMathMode(queue->cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  check(cublasLtCreate(&queue->cublas_lt), "cublasLtCreate");
  check(cudnnCreate(&queue->cudnn), "cudnnCreate");
  check(cudnnSetStream(queue->cudnn, queue->stream), "cudnnSetStream");
  check(cudaMalloc(&queue->workspace, kWorkspaceBytes), "cudaMalloc (kernel workspace)");
  queue->workspace_bytes = kWorkspaceBytes;
  check(cublasSetWorkspace(queue->cublas, queue->workspace, kWorkspaceBytes), "cublasSetWorkspace");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  queue->sm_count = properties.multiProcessorCount;
  queue->compute_capability = properties.major * 10 + properties.minor;
  return queue;
}

}  // namespace kiln::cuda
