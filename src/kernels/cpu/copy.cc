// kiln.Copy: copies its input's bytes into its output, whatever their shapes
// (the compiler uses it where a view, such as a Reshape, must land in an
// output buffer). kiln.Assign is the same copy into a variable's memory (a
// training step's update, the last steps of its main program). Neither is
// an ONNX operator.
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

struct CopyState : KernelState {
  size_t bytes = 0;
};

std::unique_ptr<KernelState> prepareCopy(const KernelSetup& setup) {
  if (setup.inputs.size() != 1 || setup.outputs.size() != 1) throw UsageError("kiln.Copy takes one input and one output");
  const uint64_t in = setup.inputs[0].sizeInBytes();
  const uint64_t out = setup.outputs[0].sizeInBytes();
  if (in != out) throw UsageError(fmt::format("kiln.Copy: input has {} bytes, output {}", in, out));
  auto state = std::make_unique<CopyState>();
  state->bytes = in;
  return state;
}

void runCopy(const KernelCall& call) {
  const auto& state = static_cast<const CopyState&>(*call.state);
  if (call.outputs[0].data != call.inputs[0].data) std::memcpy(call.outputs[0].data, call.inputs[0].data, state.bytes);
}

}  // namespace

void registerCopyKernels(KernelRegistry& registry) {
  registry.add({"kiln.Copy", prepareCopy, runCopy});
  registry.add({"kiln.Assign", prepareCopy, runCopy});
}

}  // namespace kiln
