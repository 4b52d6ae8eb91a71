// KernelRegistry::cuda(): every cuda kernel, registered once by family.
#include "kernels/cuda/cuda_kernels.h"

namespace kiln {

const KernelRegistry& KernelRegistry::cuda() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    cuda::registerCudaElementwiseKernels(r);
    cuda::registerCudaMatMulKernels(r);
    cuda::registerCudaNormalizationKernels(r);
    cuda::registerCudaDataMovementKernels(r);
    cuda::registerCudaReductionKernels(r);
    cuda::registerCudaConvKernels(r);
    cuda::registerCudaPoolKernels(r);
    cuda::registerCudaAttentionKernels(r);
    return r;
  }();
  return registry;
}

}  // namespace kiln
