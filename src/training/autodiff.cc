#include "training/autodiff.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "kiln/error.h"
#include "passes/plugin_binding.h"
#include "plugins/plugin_registry.h"
#include "training/gradient_rules.h"
#include "training/training_mode.h"

namespace kiln {
namespace {

// The values that depend on any of `wrt` (the forward pass from them).
std::set<ValueId> dependents(const Graph& graph, const std::vector<NodeId>& order, std::span<const ValueId> wrt) {
  std::set<ValueId> reached(wrt.begin(), wrt.end());
  for (NodeId id : order) {
    const Node& node = graph.node(id);
    const bool depends = std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) { return reached.contains(v); });
    if (depends) reached.insert(node.outputs.begin(), node.outputs.end());
  }
  return reached;
}

// `json` (a JSON object) with "key": value added.
std::string withJsonInt(const std::string& json, const char* key, int64_t value) {
  const size_t close = json.rfind('}');
  if (close == std::string::npos) throw GraphError(fmt::format("plugin attributes '{}' are no JSON object", json));
  const bool empty = json.find_first_not_of(" \t\n{", 0) == close;
  return fmt::format("{}{}\"{}\": {}}}", json.substr(0, close), empty ? "" : ", ", key, value);
}

// The gradients of a bound plugin op's inputs from the op it declares as
// its gradient op (the reference's <op>_grad, same library and domain),
// given the forward node's attributes. Its inputs: the gradient of each
// output (zeros where none flows), then the forward inputs, then the
// forward outputs. separate_gradients 0: one node whose outputs are the
// gradients of every input; 1: one node per input that needs one, with
// the attribute input_grad_index.
std::vector<ValueId> pluginGradients(GradientBuilder& b, const Node& node, const std::vector<ValueId>& output_grads,
                                     const std::set<ValueId>& reached, const std::map<std::string, int64_t>& opsets) {
  const std::string domain = node.stringAttribute("plugin_domain", ""), name = node.stringAttribute("plugin_op", "");
  const std::string gradient = node.stringAttribute("plugin_gradient", "");
  if (gradient.empty()) {
    throw GraphError(fmt::format("node '{}' (plugin op {}.{}) lies between the loss and a value to differentiate, and "
                                 "its plugin declares no gradient op (gradient_op)",
                                 node.name, domain, name));
  }
  const auto version = opsets.find(domain);
  const PluginOp* op = PluginRegistry::global().findOp(domain, gradient, version == opsets.end() ? 1 : version->second);
  if (op == nullptr) {
    throw GraphError(fmt::format("node '{}' (plugin op {}.{}): its gradient op {}.{} is not registered by a loaded "
                                 "plugin",
                                 node.name, domain, name, domain, gradient));
  }
  Graph& graph = b.graph();
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    inputs.push_back(output_grads[i] != kNoValue
                         ? output_grads[i]
                         : b.add("Expand", {b.scalar(0.0, b.dtypeOf(node.outputs[i])), b.int64s(b.shapeOf(node.outputs[i]))}));
  }
  inputs.insert(inputs.end(), node.inputs.begin(), node.inputs.end());
  inputs.insert(inputs.end(), node.outputs.begin(), node.outputs.end());
  const std::string forward_attributes = node.stringAttribute("attributes", "{}");
  const std::string base = (node.name.empty() ? name : node.name) + "_grad";
  std::vector<ValueId> grads(node.inputs.size(), kNoValue);
  if (node.intAttribute("plugin_separate_gradients", 0) == 0) {
    std::vector<std::string> names;
    for (size_t i = 0; i < node.inputs.size(); ++i) names.push_back(uniqueName(graph, fmt::format("{}_{}", base, i)));
    const NodeId id = graph.addNode("Plugin", inputs, names, boundPluginAttributes(*op, forward_attributes), "kiln");
    graph.node(id).name = base;
    return graph.node(id).outputs;
  }
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue || !reached.contains(node.inputs[i])) continue;
    const std::string attributes = withJsonInt(forward_attributes, "input_grad_index", static_cast<int64_t>(i));
    const std::string output = uniqueName(graph, fmt::format("{}_{}", base, i));
    const NodeId id = graph.addNode("Plugin", inputs, {output}, boundPluginAttributes(*op, attributes), "kiln");
    graph.node(id).name = output;
    grads[i] = graph.node(id).outputs[0];
  }
  return grads;
}

}  // namespace

std::vector<ValueId> appendGradients(Graph& graph, ValueId loss, std::span<const ValueId> wrt,
                                     const std::map<std::string, int64_t>& opsets, std::vector<bool>* has_gradient) {
  GradientBuilder b(graph, opsets);
  if (b.opset() < 13) {
    throw UsageError(fmt::format("gradients need the model at opset 13 or later (it is at {})", b.opset()));
  }
  const std::vector<int64_t> loss_shape = b.shapeOf(loss);
  int64_t elements = 1;
  for (int64_t d : loss_shape) elements *= d;
  if (elements != 1) {
    throw UsageError(fmt::format("the loss '{}' must be one element; it has shape [{}]", graph.value(loss).name,
                                 fmt::join(loss_shape, ", ")));
  }
  const DType dtype = b.dtypeOf(loss);
  exposeDropoutMasks(graph);
  const std::vector<NodeId> order = graph.topologicalOrder();  // the forward nodes only: taken before adding any
  const std::set<ValueId> reached = dependents(graph, order, wrt);

  // gradients[v]: d loss / d v, summed over the paths found so far.
  std::map<ValueId, ValueId> gradients;
  gradients[loss] = b.add("Expand", {b.scalar(1.0, dtype), b.int64s(loss_shape)});
  const auto accumulate = [&](ValueId value, ValueId gradient) {
    const auto [it, inserted] = gradients.try_emplace(value, gradient);
    if (!inserted) it->second = b.add("Add", {it->second, gradient});
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    // A copy: adding nodes may move the graph's node storage.
    const Node node = graph.node(*it);
    std::vector<ValueId> output_grads;
    bool flows = false;
    for (ValueId output : node.outputs) {
      const auto found = gradients.find(output);
      output_grads.push_back(found == gradients.end() ? kNoValue : found->second);
      flows = flows || found != gradients.end();
    }
    const bool needed = std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) { return reached.contains(v); });
    if (!flows || !needed) continue;
    std::vector<ValueId> input_grads;
    if (isPluginOp(node)) {
      input_grads = pluginGradients(b, node, output_grads, reached, opsets);
    } else if (!node.domain.empty()) {
      throw GraphError(fmt::format("node '{}' ({}.{}) lies between the loss and a value to differentiate, and kiln has "
                                   "no gradient rules for ops outside the ONNX domain",
                                   node.name, node.domain, node.op_type));
    } else {
      const GradientRule* rule = findGradientRule(node.op_type);
      if (rule == nullptr) {
        throw GraphError(fmt::format("node '{}' ({}) lies between the loss and a value to differentiate, and kiln has "
                                     "no gradient rule for {} yet (it has: {})",
                                     node.name, node.op_type, node.op_type, fmt::join(gradientRuleNames(), ", ")));
      }
      if (output_grads[0] == kNoValue) continue;  // rules differentiate through the first output
      input_grads = (*rule)(b, node, output_grads);
    }
    for (size_t i = 0; i < node.inputs.size() && i < input_grads.size(); ++i) {
      if (input_grads[i] != kNoValue && reached.contains(node.inputs[i])) accumulate(node.inputs[i], input_grads[i]);
    }
  }
  std::vector<ValueId> result;
  for (ValueId value : wrt) {
    const auto found = gradients.find(value);
    if (has_gradient != nullptr) has_gradient->push_back(found != gradients.end());
    if (found != gradients.end()) {
      result.push_back(found->second);
      continue;
    }
    // The loss does not depend on it: zeros of its shape. (Asked for by
    // name, a value the loss depends on only through inputs that get no
    // gradient is an error: zeros would be a wrong answer.)
    if (has_gradient == nullptr) {
      const ValueId one[] = {value};
      if (dependents(graph, order, one).contains(loss)) {
        throw UsageError(fmt::format("the loss depends on '{}' only through inputs kiln does not differentiate (an "
                                     "exponent, a Dropout ratio, running statistics, shapes or indices)",
                                     graph.value(value).name));
      }
    }
    const DType value_type = b.dtypeOf(value);
    result.push_back(b.add("Expand", {b.scalar(0.0, value_type), b.int64s(b.shapeOf(value))}));
  }
  return result;
}

std::vector<std::string> namesWithGradients(const Graph& graph, const std::string& loss,
                                            const std::vector<std::string>& candidates,
                                            const std::map<std::string, int64_t>& opsets) {
  Graph scratch = graph;
  const std::optional<ValueId> loss_value = scratch.findValue(loss);
  if (!loss_value) throw UsageError(fmt::format("training: the loss '{}' is no value of the model", loss));
  std::vector<ValueId> wrt;
  for (const std::string& name : candidates) wrt.push_back(*scratch.findValue(name));
  std::vector<bool> has_gradient;
  appendGradients(scratch, *loss_value, wrt, opsets, &has_gradient);
  std::vector<std::string> names;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (has_gradient[i]) names.push_back(candidates[i]);
  }
  return names;
}

std::vector<std::string> differentiableOps() { return gradientRuleNames(); }

}  // namespace kiln
