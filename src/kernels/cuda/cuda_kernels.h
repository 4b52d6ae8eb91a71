// The families of cuda kernels, each registering its kernels in
// KernelRegistry::cuda() (registry.cc).
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace kiln::cuda {

void registerCudaElementwiseKernels(KernelRegistry& registry);
void registerCudaMatMulKernels(KernelRegistry& registry);
void registerCudaNormalizationKernels(KernelRegistry& registry);
void registerCudaDataMovementKernels(KernelRegistry& registry);
void registerCudaReductionKernels(KernelRegistry& registry);
void registerCudaConvKernels(KernelRegistry& registry);
void registerCudaPoolKernels(KernelRegistry& registry);
void registerCudaAttentionKernels(KernelRegistry& registry);

}  // namespace kiln::cuda
