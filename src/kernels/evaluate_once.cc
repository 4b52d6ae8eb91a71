#include "kernels/evaluate_once.h"

#include "kernels/cpu/denormals.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {

std::optional<std::vector<std::vector<std::byte>>> evaluateOnce(const std::string& kernel, const ParamMap& params,
                                                               std::span<const TensorInfo> inputs,
                                                               std::span<const std::byte* const> data,
                                                               std::span<const TensorInfo> outputs) {
  const KernelDef* def = KernelRegistry::cpu().find(kernel);
  if (def == nullptr) return std::nullopt;
  // A type inference could not fix (lenient inference of a crafted model)
  // would be read by the kernels as an omitted input, or sized as 0 bytes
  // where they write elements: not evaluated (graph_run_fuzz: a MatMul of
  // two such values wrote a float into an empty buffer).
  for (const TensorInfo& output : outputs) {
    if (output.dtype == DType::kUndefined) return std::nullopt;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype == DType::kUndefined && (i >= data.size() || data[i] != nullptr || !inputs[i].shape.empty())) {
      return std::nullopt;
    }
  }
  // An empty constant (Slice's starts of a crafted model, say) has no bytes
  // and so, from a std::vector, a null pointer, which the kernels read as
  // "omitted" (or, for prepare, "not a constant"): it gets this address.
  alignas(64) static const std::byte kEmpty[64] = {};
  std::vector<const std::byte*> bytes(data.begin(), data.end());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (bytes[i] == nullptr && inputs[i].dtype != DType::kUndefined && inputs[i].sizeInBytes() == 0) bytes[i] = kEmpty;
  }
  std::unique_ptr<KernelState> state;
  try {
    state = def->prepare(KernelSetup{params, inputs, outputs, bytes});
  } catch (const Error&) {
    return std::nullopt;
  }
  std::vector<TensorView> input_views;
  for (size_t i = 0; i < inputs.size(); ++i) {
    input_views.push_back(bytes[i] == nullptr ? TensorView{} : viewOf(inputs[i], const_cast<std::byte*>(bytes[i])));
  }
  std::vector<std::vector<std::byte>> results;
  std::vector<TensorView> output_views;
  for (const TensorInfo& info : outputs) {
    results.emplace_back(info.sizeInBytes());
    results.back().reserve(1);  // an empty output gets a real address too (memcpy of 0 bytes to null is undefined)
    output_views.push_back(viewOf(info, results.back().data()));
  }
  // In the mode runs use by default (kernels/cpu/denormals.h): a folded
  // Ceil of a denormal is then 0, as the same node gives when it runs.
  const DenormalsScope denormals(/*flush=*/true);
  def->run(KernelCall{input_views.data(), static_cast<uint32_t>(input_views.size()), output_views.data(),
                      static_cast<uint32_t>(output_views.size()), state.get()});
  return results;
}

}  // namespace kiln
