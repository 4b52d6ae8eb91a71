// The CPU kernel families, one file each; KernelRegistry::cpu() registers
// them all. Adding a family: write its file, declare its function here and
// call it in kernel_registry.cc.
#pragma once

namespace kiln {

class KernelRegistry;

void registerElementwiseKernels(KernelRegistry& registry);  // elementwise.cc: unary, binary with broadcasting
void registerMatMulKernels(KernelRegistry& registry);       // matmul.cc: MatMul, Gemm
void registerCopyKernels(KernelRegistry& registry);         // copy.cc: kiln.Copy (byte copy for views)

}  // namespace kiln
