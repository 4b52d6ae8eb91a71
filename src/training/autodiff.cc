#include "training/autodiff.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "kiln/error.h"
#include "training/gradient_rules.h"

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

}  // namespace

std::vector<ValueId> appendGradients(Graph& graph, ValueId loss, std::span<const ValueId> wrt,
                                     const std::map<std::string, int64_t>& opsets) {
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
    if (!node.domain.empty()) continue;
    std::vector<ValueId> output_grads;
    bool flows = false;
    for (ValueId output : node.outputs) {
      const auto found = gradients.find(output);
      output_grads.push_back(found == gradients.end() ? kNoValue : found->second);
      flows = flows || found != gradients.end();
    }
    const bool needed = std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) { return reached.contains(v); });
    if (!flows || !needed) continue;
    const GradientRule* rule = findGradientRule(node.op_type);
    if (rule == nullptr) {
      throw GraphError(fmt::format("node '{}' ({}) lies between the loss and a value to differentiate, and kiln has "
                                   "no gradient rule for {} yet (it has: {})",
                                   node.name, node.op_type, node.op_type, fmt::join(gradientRuleNames(), ", ")));
    }
    if (output_grads[0] == kNoValue) continue;  // rules differentiate through the first output
    const std::vector<ValueId> input_grads = (*rule)(b, node, output_grads);
    for (size_t i = 0; i < node.inputs.size() && i < input_grads.size(); ++i) {
      if (input_grads[i] != kNoValue && reached.contains(node.inputs[i])) accumulate(node.inputs[i], input_grads[i]);
    }
  }
  std::vector<ValueId> result;
  for (ValueId value : wrt) {
    const auto found = gradients.find(value);
    if (found != gradients.end()) {
      result.push_back(found->second);
      continue;
    }
    // The loss does not depend on it: zeros of its shape.
    const DType value_type = b.dtypeOf(value);
    result.push_back(b.add("Expand", {b.scalar(0.0, value_type), b.int64s(b.shapeOf(value))}));
  }
  return result;
}

std::vector<std::string> differentiableOps() { return gradientRuleNames(); }

}  // namespace kiln
