// kiln.Plugin's schema: a node bound to a plugin op (passes/plugin_binding.h)
// infers its outputs through the plugin's own infer callback. Unknown
// dimensions cross as KILN_DIM_UNKNOWN (symbols are not passed); an input of
// unknown rank leaves the outputs unknown, to be fixed at run time. What the
// plugin refuses (or infers wrongly) is a UsageError naming the node, the
// op and the plugin.
#include <fmt/format.h>

#include <limits>

#include "ops/op_families.h"
#include "ops/op_schema.h"
#include "plugins/plugin_instance.h"

namespace kiln {
namespace {

void pluginInference(InferenceContext& context) {
  const Node& node = context.node();
  const std::string domain = node.stringAttribute("plugin_domain", "");
  const std::string name = node.stringAttribute("plugin_op", "");
  const PluginOp* op = PluginRegistry::global().findOp(domain, name, node.intAttribute("plugin_version", 1));
  if (op == nullptr) {
    context.fail("op {}.{} of plugin library '{}' is not loaded", domain, name,
                 node.stringAttribute("plugin_library", ""));
  }
  std::vector<TensorInfo> inputs;
  for (size_t i = 0; i < context.inputCount(); ++i) {
    if (!context.hasInput(i)) {
      inputs.push_back(TensorInfo{});  // an omitted optional input: dtype undefined
      continue;
    }
    const ValueType& type = context.inputType(i);
    if (!type.shape) context.fail("input {} has no known rank yet", i);
    TensorInfo info;
    info.dtype = type.dtype;
    for (const Dim& dim : *type.shape) info.shape.push_back(dim.isKnown() ? dim.size : kDynamicDim);
    inputs.push_back(std::move(info));
  }
  try {
    const PluginInstance instance(*op, node.stringAttribute("attributes", "{}"));
    const std::vector<TensorInfo> outputs = instance.infer(inputs, context.outputCount());
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::vector<Dim> dims;
      for (int64_t size : outputs[i].shape) dims.push_back(size >= 0 ? Dim::known(size) : Dim{});
      context.output(i) = ValueType{outputs[i].dtype, std::move(dims)};
    }
  } catch (const UsageError& e) {
    // The plugin refused inputs it was given in full: a hard error, which
    // lenient inference (run-time-shape analysis) must not take for a
    // shape that is merely unknown yet.
    throw UsageError(fmt::format("node '{}': {}", node.name, e.what()));
  }
}

}  // namespace

void registerPluginOps(OpRegistry& registry) {
  constexpr size_t kMany = std::numeric_limits<size_t>::max();
  registry.add(OpSchema{"kiln", "Plugin", 1, 0, kMany, 1, kMany, pluginInference});
}

}  // namespace kiln
