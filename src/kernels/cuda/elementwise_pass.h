// ElementwisePass: one elementwise program run over a step's tensors
// (elementwise_launch.h), prepared at load. Used by the elementwise steps
// and by the post-ops passes of products and convolutions.
//
// prepare has the runtime compiler (runtime_compiler.h) make a kernel
// specialized to the program, its shapes and strides
// (elementwise_codegen.h); where it cannot (64-bit sizes, NVRTC missing or
// refusing, KILN_CUDA_JIT=0), the pass runs on the interpreter kernel,
// which computes the same thing more slowly. launch only enqueues.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

class ElementwisePass {
 public:
  // `elements` outputs of `program` over inputs found through `indexing`,
  // for the GPU of `queue`.
  void prepare(const DeviceProgram& program, const Indexing& indexing, uint64_t elements, const CudaQueue& queue);

  void launch(const Pointers& pointers, cudaStream_t stream) const;

  // True when launch runs a kernel the runtime compiler made.
  bool specialized() const { return scalar_kernel_ != nullptr; }
  int inputs() const { return program_.inputs; }

 private:
  DeviceProgram program_;
  Indexing indexing_;
  uint64_t elements_ = 0;
  cudaKernel_t scalar_kernel_ = nullptr;  // kiln_elementwise_v1
  cudaKernel_t vector_kernel_ = nullptr;  // kiln_elementwise_v4, where the shapes allow it
};

}  // namespace kiln::cuda
