#include "kernels/cuda/elementwise_pass.h"

#include <string>
#include <vector>

#include "kernels/cuda/elementwise_codegen.h"
#include "kernels/cuda/runtime_compiler.h"

namespace kiln::cuda {
namespace {

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

void ElementwisePass::prepare(const DeviceProgram& program, const Indexing& indexing, uint64_t elements,
                              const CudaQueue& queue) {
  program_ = program;
  indexing_ = indexing;
  elements_ = elements;
  scalar_kernel_ = vector_kernel_ = nullptr;
  if (!runtimeCompilerEnabled()) return;
  const std::optional<ElementwiseSource> source = elementwiseSource(program, indexing, elements);
  if (!source) return;
  std::vector<const char*> names = {"kiln_elementwise_v1"};
  if (source->vector_width == 4) names.push_back("kiln_elementwise_v4");
  std::string error;
  const std::vector<cudaKernel_t> kernels = compileKernels(source->text, names, queue.compute_capability, &error);
  if (kernels.empty()) return;  // compileKernels said why, once
  scalar_kernel_ = kernels[0];
  if (kernels.size() > 1) vector_kernel_ = kernels[1];
}

void ElementwisePass::launch(const Pointers& pointers, cudaStream_t stream) const {
  if (scalar_kernel_ == nullptr) {
    launchElementwise(program_, indexing_, pointers, elements_, stream);
    return;
  }
  bool vector = vector_kernel_ != nullptr && aligned16(pointers.out);
  for (int k = 0; vector && k < program_.inputs; ++k) vector = aligned16(pointers.in[k]);
  const uint64_t threads = vector ? elements_ / 4 : elements_;
  const auto blocks = static_cast<unsigned>((threads + kElementwiseBlock - 1) / kElementwiseBlock);
  Pointers arguments = pointers;
  void* parameters[] = {&arguments};
  cudaLaunchKernel(reinterpret_cast<const void*>(vector ? vector_kernel_ : scalar_kernel_), dim3(blocks),
                   dim3(kElementwiseBlock), parameters, 0, stream);
}

}  // namespace kiln::cuda
