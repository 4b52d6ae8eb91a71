#include <fmt/format.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {

TensorView viewOf(const TensorInfo& info, std::byte* data) {
  // A view holds kMaxRank dimensions (a chain of GatherNDs grows the rank
  // by two a step: rank 34 wrote past them; graph_run_fuzz).
  if (info.shape.size() > kMaxRank) {
    throw UsageError(fmt::format("a tensor of rank {} ({}): kiln's kernels take at most {} dimensions",
                                 info.shape.size(), info.shapeString(), kMaxRank));
  }
  TensorView view;
  view.data = data;
  view.dtype = info.dtype;
  view.rank = static_cast<uint32_t>(info.shape.size());
  for (uint32_t i = 0; i < view.rank; ++i) view.dims[i] = info.shape[i];
  return view;
}

const KernelRegistry& KernelRegistry::cpu() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    registerElementwiseKernels(r);
    registerFusedElementwiseKernels(r);
    registerMatMulKernels(r);
    registerCopyKernels(r);
    registerDataMovementKernels(r);
    registerReductionKernels(r);
    registerConvKernels(r);
    registerPoolKernels(r);
    registerNormalizationKernels(r);
    registerIndexingKernels(r);
    registerTransformerKernels(r);
    registerLossKernels(r);
    registerFeatureNormalizationKernels(r);
    registerRecurrentKernels(r);
    registerCastKernels(r);
    registerQuantizationKernels(r);
    registerQuantizedConvKernels(r);
    registerQuantizedAddKernels(r);
    registerByteTableKernels(r);
    registerDynamicInt8Kernels(r);
    registerSignalKernels(r);
    registerSamplingKernels(r);
    registerLinearAttentionKernels(r);
    registerFlexAttentionKernels(r);
    registerSelectionKernels(r);
    registerMlKernels(r);
    registerPluginKernels(r);
    return r;
  }();
  return registry;
}

#if !KILN_HAVE_CUDA
// Builds without CUDA have no cuda kernels.
const KernelRegistry& KernelRegistry::cuda() {
  static const KernelRegistry registry;
  return registry;
}
#endif

void KernelRegistry::add(KernelDef def) {
  const std::string name = def.name;
  if (!kernels_.emplace(name, std::move(def)).second) throw UsageError("kernel registered twice: " + name);
}

const KernelDef* KernelRegistry::find(std::string_view name) const {
  const auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> KernelRegistry::names() const {
  std::vector<std::string> result;
  for (const auto& [name, def] : kernels_) result.push_back(name);
  return result;
}

}  // namespace kiln
