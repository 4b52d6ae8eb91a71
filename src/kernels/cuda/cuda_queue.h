// CudaQueue: what a CUDA kernel launches on. One per cuda device: its
// compute stream and the library handles bound to it, with a workspace for
// cuBLASLt and cuDNN. KernelSetup::queue and KernelCall::queue point at it
// for cuda steps (null for cpu ones).
//
// Thread safety: a queue serves one thread at a time (the device's compute
// worker, or the thread that loads an executable before any job runs).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::cuda {

struct CudaQueue {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  void* workspace = nullptr;  // device memory for cuBLASLt and cuDNN
  size_t workspace_bytes = 0;
  int sm_count = 0;
  int compute_capability = 0;  // 90 for sm_90

  ~CudaQueue();
};

// Creates the stream, handles and workspace on `device`. Throws
// UsageError naming the library call that failed.
std::unique_ptr<CudaQueue> createQueue(int device);

// Throws UsageError "<what>: <CUDA's message>" when `status` is an error.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
void check(cudnnStatus_t status, const char* what);

inline const CudaQueue& queueOf(const void* queue) { return *static_cast<const CudaQueue*>(queue); }

}  // namespace kiln::cuda
