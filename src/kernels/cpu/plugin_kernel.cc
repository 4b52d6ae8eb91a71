// kiln.Plugin: a step that runs an op from a plugin library
// (include/kiln/plugin.h). The compiler rewrites each node of a plugin op
// into one (passes/plugin_binding.h); its parameters name the op and carry
// the node's attributes as JSON:
//   plugin_domain, plugin_op, plugin_version  the op (its definition's
//                                             since_version)
//   plugin_library                            the library's file name
//   attributes                                the JSON for create()
//   plugin_workspace                          1: the last output is the
//                                             planned workspace
// prepare finds the op among the loaded plugins, creates its state and
// checks that the plugin's shape inference still gives the planned output
// types (a different library would not). run hands the plugin its tensors
// as KilnTensors built on the stack: no allocation per call.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "plugins/plugin_instance.h"

namespace kiln {
namespace {

// Operands per call kiln builds on the stack (registration allows no more).
constexpr uint32_t kMaxPluginOperands = 64;

struct PluginState : KernelState {
  std::unique_ptr<PluginInstance> instance;
  uint32_t outputs = 0;       // the op's outputs, without the workspace
  bool workspace = false;
  bool elementwise = false;   // run in slices across threads
  // Per input, the alignment its allocator hook asked for minus one (0:
  // none), empty when it asked for none; the compiler planned it, run checks
  // it (an external arena could break it).
  std::vector<uint64_t> alignment_masks;
};

// The allocator hook's layouts, asked again of the loaded library, must be
// the ones the package was planned with.
void checkLayouts(PluginState& state, const KernelSetup& setup) {
  const std::vector<int64_t> alignments = setup.params.getInts("plugin_input_alignments", {});
  const std::vector<int64_t> paddings = setup.params.getInts("plugin_input_paddings", {});
  const std::vector<InputLayout> wanted = state.instance->inputLayouts(setup.inputs);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const InputLayout planned = i < alignments.size() && i < paddings.size()
                                    ? InputLayout{static_cast<uint64_t>(alignments[i]), static_cast<uint64_t>(paddings[i])}
                                    : InputLayout{};
    if (setup.inputs[i].dtype != DType::kUndefined && planned != wanted[i]) {
      state.instance->fail(fmt::format("input {} is planned {}-byte aligned with {} bytes of padding but the loaded "
                                       "plugin asks for {} and {} (a different version of the library?)",
                                       i, planned.alignment, planned.padding_bytes, wanted[i].alignment,
                                       wanted[i].padding_bytes));
    }
    state.alignment_masks.push_back(planned.alignment - 1);
  }
  if (alignments.empty()) state.alignment_masks.clear();  // nothing to check per call
}

std::unique_ptr<KernelState> preparePlugin(const KernelSetup& setup) {
  const std::string domain = setup.params.getString("plugin_domain", "");
  const std::string name = setup.params.getString("plugin_op", "");
  const int64_t version = setup.params.getInt("plugin_version", 1);
  const std::string library = setup.params.getString("plugin_library", "");
  const PluginOp* op = PluginRegistry::global().findOp(domain, name, version);
  if (op == nullptr && library == kHostLibrary) {
    throw UsageError(fmt::format("the model calls host function {}.{}, which this process has not registered "
                                 "(kiln::registerHostOp, kiln.register_host_op)",
                                 domain, name));
  }
  if (op == nullptr) {
    throw UsageError(fmt::format("the model uses op {}.{} from plugin library '{}', which is not loaded (kiln loads "
                                 "the libraries a package names from KILN_PLUGIN_PATH or the package's folder)",
                                 domain, name, library));
  }
  if (op->library->name != library) {
    throw UsageError(fmt::format("the model uses op {}.{} from plugin library '{}', but the loaded one comes from '{}'",
                                 domain, name, library, op->library->name));
  }
  auto state = std::make_unique<PluginState>();
  state->instance = std::make_unique<PluginInstance>(*op, setup.params.getString("attributes", "{}"));
  state->workspace = setup.params.getInt("plugin_workspace", 0) != 0;
  const size_t outputs = setup.outputs.size() - (state->workspace ? 1 : 0);
  if (setup.inputs.size() > kMaxPluginOperands || outputs > kMaxPluginOperands) {
    state->instance->fail(fmt::format("kiln runs plugin ops of at most {} inputs and outputs", kMaxPluginOperands));
  }
  state->outputs = static_cast<uint32_t>(outputs);
  // The package may place in-place outputs over their inputs only for an op
  // that is in place (the verifier lets such a step through on this).
  if (setup.params.getInt("plugin_inplace", 0) != static_cast<int64_t>(op->abi.num_inplace)) {
    state->instance->fail(fmt::format("the package says {} outputs are in place, the op has {}",
                                      setup.params.getInt("plugin_inplace", 0), op->abi.num_inplace));
  }
  // A library found at load may be another build than the compile's: its
  // shapes are checked again. (Not a host function's: it is the process's
  // own, and calling it here would take a Python host function's GIL on
  // whatever thread loads the model, a device's reset among them.)
  const std::vector<TensorInfo> inferred = library == kHostLibrary
                                               ? std::vector<TensorInfo>(setup.outputs.begin(),
                                                                         setup.outputs.begin() + outputs)
                                               : state->instance->infer(setup.inputs, outputs);
  for (size_t i = 0; i < outputs; ++i) {
    if (inferred[i].dtype != setup.outputs[i].dtype || inferred[i].shape != setup.outputs[i].shape) {
      state->instance->fail(fmt::format("output {} is planned as {} {} but the loaded plugin infers {} {} (a "
                                        "different version of the library?)",
                                        i, dtypeName(setup.outputs[i].dtype), setup.outputs[i].shapeString(),
                                        dtypeName(inferred[i].dtype), inferred[i].shapeString()));
    }
  }
  checkLayouts(*state, setup);
  const bool laid_out = !state->alignment_masks.empty();
  // Slices would start anywhere: an op with layout wishes runs whole.
  bool same_sizes = op->abi.is_elementwise != 0 && !state->workspace && !laid_out;
  for (const auto& infos : {setup.inputs, setup.outputs.first(outputs)}) {
    for (const TensorInfo& info : infos) {
      same_sizes = same_sizes && info.dtype != DType::kUndefined &&
                   info.numElements() == setup.outputs[0].numElements() &&
                   dtypeSize(info.dtype) * 8 == dtypePackedBits(info.dtype);
    }
  }
  state->elementwise = same_sizes;
  return state;
}

// The ABI's view of a kiln tensor; `dims` points into the view.
KilnTensor abiTensor(const TensorView& view) {
  return KilnTensor{view.data, static_cast<int32_t>(view.dtype), static_cast<int32_t>(view.rank), view.dims.data()};
}

// Calls compute; on failure fills `error` and returns false.
bool computeOnce(const PluginState& state, KilnTensor* inputs, uint32_t input_count, KilnTensor* outputs,
                 void* workspace, uint64_t workspace_bytes, char* error, size_t capacity) {
  const KilnOp& abi = state.instance->op().abi;
  return abi.compute(state.instance->state(), inputs, static_cast<int32_t>(input_count), outputs,
                     static_cast<int32_t>(state.outputs), workspace, workspace_bytes, error, capacity) == 0;
}

void runPlugin(const KernelCall& call) {
  const auto& state = *static_cast<const PluginState*>(call.state);
  const KilnOp& abi = state.instance->op().abi;
  KilnTensor inputs[kMaxPluginOperands];
  KilnTensor outputs[kMaxPluginOperands];
  for (uint32_t i = 0; i < call.input_count; ++i) inputs[i] = abiTensor(call.inputs[i]);
  for (uint32_t i = 0; i < state.outputs; ++i) outputs[i] = abiTensor(call.outputs[i]);
  // In place: the output holds the input's values and is the input the op
  // sees. Where the compiler could not give the output the input's memory
  // (another step still reads the input), the values are copied first.
  for (uint32_t i = 0; i < abi.num_inplace; ++i) {
    const uint64_t bytes = call.inputs[i].numElements() * dtypeSize(call.inputs[i].dtype);
    if (outputs[i].data != inputs[i].data && bytes > 0) std::memcpy(outputs[i].data, inputs[i].data, bytes);
    inputs[i].data = outputs[i].data;
  }
  for (size_t i = 0; i < state.alignment_masks.size(); ++i) {
    const auto address = reinterpret_cast<uintptr_t>(inputs[i].data);
    if ((address & state.alignment_masks[i]) != 0) {
      state.instance->fail(fmt::format("input {} lies at {:#x}, not {}-byte aligned as its allocator hook asks (an "
                                       "external arena less aligned than its size?)",
                                       i, address, state.alignment_masks[i] + 1));
    }
  }
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
  if (state.workspace) {
    const TensorView& view = call.outputs[call.output_count - 1];
    workspace = view.data;
    workspace_bytes = view.numElements();
  }
  // Only its first byte is set: zeroing all of it costs more than a small
  // op's call (the ABI has the plugin write a NUL-terminated message).
  char error[512];
  error[0] = '\0';
  bool ok = true;
  if (state.elementwise) {
    // Slices of the flat range, each a rank-1 tensor of its own, one per
    // thread; the first failing slice's message is reported.
    const int64_t n = static_cast<int64_t>(call.outputs[0].numElements());
    int failed = 0;
    parallelForElements(n, [&](int64_t begin, int64_t end) {
      int64_t count = end - begin;
      KilnTensor in[kMaxPluginOperands];
      KilnTensor out[kMaxPluginOperands];
      const auto slice = [&](const KilnTensor& whole) {
        KilnTensor part = whole;
        if (part.data != nullptr) {
          part.data = static_cast<std::byte*>(part.data) + begin * static_cast<int64_t>(dtypeSize(static_cast<DType>(part.dtype)));
        }
        part.rank = 1;
        part.dims = &count;
        return part;
      };
      for (uint32_t i = 0; i < call.input_count; ++i) in[i] = slice(inputs[i]);
      for (uint32_t i = 0; i < state.outputs; ++i) out[i] = slice(outputs[i]);
      char slice_error[512];
      slice_error[0] = '\0';
      if (!computeOnce(state, in, call.input_count, out, nullptr, 0, slice_error, sizeof slice_error)) {
#pragma omp critical(kiln_plugin_error)
        if (failed++ == 0) std::memcpy(error, slice_error, sizeof error);
      }
    });
    ok = failed == 0;
  } else {
    ok = computeOnce(state, inputs, call.input_count, outputs, workspace, workspace_bytes, error, sizeof error);
  }
  if (!ok) state.instance->fail("compute failed: " + callbackMessage(error, sizeof error));
}

}  // namespace

void registerPluginKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"kiln.Plugin", &preparePlugin, &runPlugin});
}

}  // namespace kiln
