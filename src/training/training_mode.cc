#include "training/training_mode.h"

#include <fmt/format.h>

#include <set>

#include "kiln/error.h"
#include "training/gradient_rules.h"

namespace kiln {
namespace {

// Replaces node `id` by one with `output_count` outputs, the given inputs
// and attributes: its outputs keep their names and readers, the new ones
// get fresh values. Returns the new node.
NodeId rebuildNode(Graph& graph, NodeId id, size_t output_count, const std::vector<ValueId>& inputs,
                   Attributes attributes) {
  const Node old = graph.node(id);  // a copy: adding a node moves the storage
  std::vector<std::string> names;
  for (size_t i = 0; i < output_count; ++i) {
    if (i < old.outputs.size() && old.outputs[i] != kNoValue) {
      const std::string name = graph.value(old.outputs[i]).name;
      graph.renameValue(old.outputs[i], uniqueName(graph, name + ":before_training"));
      names.push_back(name);
    } else {
      names.emplace_back();
    }
  }
  const NodeId fresh = graph.addNode(old.op_type, inputs, names, std::move(attributes), old.domain);
  for (size_t i = 0; i < old.outputs.size() && i < output_count; ++i) {
    if (old.outputs[i] != kNoValue) graph.replaceAllUses(old.outputs[i], graph.node(fresh).outputs[i]);
  }
  graph.removeNode(id);
  graph.node(fresh).name = old.name;
  return fresh;
}

ValueId constantTrue(Graph& graph) {
  return graph.addInitializer(uniqueName(graph, "training_mode"),
                              makeConstant(TensorInfo{DType::kBool, {}}, {std::byte{1}}));
}

bool isInput(const Graph& graph, ValueId value) {
  return std::find(graph.inputs().begin(), graph.inputs().end(), value) != graph.inputs().end();
}

// SplitMix64's finaliser: distinct per-node seeds from one training seed.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> runningStatistics(const Graph& graph) {
  std::set<std::string> names;
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    if (node.op_type != "BatchNormalization" || !node.domain.empty()) continue;
    for (size_t i = 3; i < 5 && i < node.inputs.size(); ++i) {
      if (graph.value(node.inputs[i]).initializer) names.insert(graph.value(node.inputs[i]).name);
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::pair<std::string, ValueId>> enterTrainingMode(Graph& graph, uint64_t seed) {
  std::vector<std::pair<std::string, ValueId>> updates;
  uint64_t dropouts = 0;
  for (NodeId id : graph.nodeIds()) {
    const Node node = graph.node(id);
    if (!node.domain.empty()) continue;
    if (node.op_type == "BatchNormalization") {
      if (node.outputs.size() > 3) {
        throw GraphError(fmt::format("node '{}' (BatchNormalization): its saved mean and variance outputs (before "
                                     "opset 14) are not supported in training",
                                     node.name));
      }
      Attributes attributes = node.attributes;
      attributes["training_mode"] = int64_t{1};
      const NodeId fresh = rebuildNode(graph, id, 3, node.inputs, std::move(attributes));
      for (size_t i = 3; i < 5; ++i) {
        if (isInput(graph, node.inputs[i])) updates.emplace_back(graph.value(node.inputs[i]).name, graph.node(fresh).outputs[i - 2]);
      }
    } else if (node.op_type == "Dropout") {
      std::vector<ValueId> inputs = node.inputs;
      inputs.resize(3, kNoValue);
      inputs[2] = constantTrue(graph);
      Attributes attributes = node.attributes;
      if (!attributes.contains("seed")) attributes["seed"] = static_cast<int64_t>(mix(seed + ++dropouts) >> 1);
      attributes["kiln_mask_per_run"] = int64_t{1};
      rebuildNode(graph, id, 2, inputs, std::move(attributes));
    }
  }
  return updates;
}

void exposeDropoutMasks(Graph& graph) {
  for (NodeId id : graph.nodeIds()) {
    const Node node = graph.node(id);
    if (node.op_type != "Dropout" || !node.domain.empty() || !dropoutTrains(graph, node)) continue;
    if (node.outputs.size() >= 2 && node.outputs[1] != kNoValue) continue;
    rebuildNode(graph, id, 2, node.inputs, node.attributes);
  }
}

}  // namespace kiln
