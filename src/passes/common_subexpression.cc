#include "passes/common_subexpression.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/checksum.h"
#include "passes/plugin_binding.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

bool sameConstant(const ConstantPtr& a, const ConstantPtr& b) {
  if (a == b) return true;
  return a && b && a->info == b->info && a->bytes == b->bytes;
}

// Attribute equality as stated in the header: floats by bits, tensors by
// content, subgraphs never (callers skip nodes that have any).
struct AttributeEquals {
  bool operator()(float a, float b) const { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }
  bool operator()(const std::vector<float>& a, const std::vector<float>& b) const {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), *this);
  }
  bool operator()(const ConstantPtr& a, const ConstantPtr& b) const { return sameConstant(a, b); }
  bool operator()(const std::vector<ConstantPtr>& a, const std::vector<ConstantPtr>& b) const {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), sameConstant);
  }
  bool operator()(const GraphPtr&, const GraphPtr&) const { return false; }
  bool operator()(const std::vector<GraphPtr>&, const std::vector<GraphPtr>&) const { return false; }
  template <typename T>
  bool operator()(const T& a, const T& b) const {
    return a == b;
  }
  template <typename T, typename U>
  bool operator()(const T&, const U&) const {
    return false;  // different alternatives
  }
};

bool sameAttributes(const Attributes& a, const Attributes& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.first == y.first && std::visit(AttributeEquals{}, x.second, y.second);
  });
}

bool hasSubgraph(const Node& node) {
  return std::any_of(node.attributes.begin(), node.attributes.end(), [](const auto& entry) {
    return std::holds_alternative<GraphPtr>(entry.second) || std::holds_alternative<std::vector<GraphPtr>>(entry.second);
  });
}

bool mayMerge(const Node& node) {
  static const std::set<std::string> kNondeterministic = {
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"};
  if (!node.domain.empty() && node.domain != "kiln") return false;
  if (node.domain.empty() && kNondeterministic.contains(node.op_type)) return false;
  if (isPluginOp(node) && !isStatelessPluginOp(node)) return false;  // plugin ops are stateful unless they say not
  return !node.outputs.empty() && !hasSubgraph(node);
}

bool sameComputation(const Node& a, const Node& b) {
  return a.domain == b.domain && a.op_type == b.op_type && a.inputs == b.inputs &&
         a.outputs.size() == b.outputs.size() && sameAttributes(a.attributes, b.attributes);
}

// What two mergeable nodes must share; equal nodes hash equally (attribute
// values are left out: sameComputation compares them).
size_t nodeHash(const Node& node) {
  size_t h = std::hash<std::string>{}(node.domain) * 31 + std::hash<std::string>{}(node.op_type);
  for (ValueId input : node.inputs) h = h * 1000003 + input;
  for (const auto& [key, value] : node.attributes) h = h * 31 + std::hash<std::string>{}(key);
  return h;
}

bool definesPinned(const std::set<ValueId>& pinned, const Node& node) {
  return std::any_of(node.outputs.begin(), node.outputs.end(), [&](ValueId v) { return pinned.contains(v); });
}

size_t mergeInitializers(Graph& graph, const std::set<ValueId>& pinned) {
  std::unordered_map<uint64_t, std::vector<ValueId>> kept;  // bytes hash -> kept initializers
  size_t merged = 0;
  for (ValueId id : graph.initializers()) {
    const ConstantPtr& constant = graph.value(id).initializer;
    std::vector<ValueId>& candidates = kept[checksum64(constant->bytes)];
    const auto same = std::find_if(candidates.begin(), candidates.end(), [&](ValueId other) {
      return sameConstant(graph.value(other).initializer, constant);
    });
    if (same == candidates.end()) {
      candidates.push_back(id);
      continue;
    }
    ValueId keep = *same;
    ValueId drop = id;
    if (pinned.contains(drop)) {
      if (pinned.contains(keep)) continue;  // merging would rename an output
      std::swap(keep, drop);
      *same = keep;
    }
    if (graph.value(drop).users.empty()) continue;
    graph.replaceAllUses(drop, keep);
    ++merged;
  }
  return merged;
}

// One sweep in topological order; returns the number of nodes merged away.
size_t mergeNodes(Graph& graph, const std::set<ValueId>& pinned) {
  std::unordered_map<size_t, std::vector<NodeId>> kept;  // nodeHash -> kept nodes
  size_t merged = 0;
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    if (!mayMerge(node)) continue;
    std::vector<NodeId>& candidates = kept[nodeHash(node)];
    const auto same = std::find_if(candidates.begin(), candidates.end(),
                                   [&](NodeId other) { return sameComputation(graph.node(other), node); });
    if (same == candidates.end()) {
      candidates.push_back(id);
      continue;
    }
    NodeId keep = *same;
    NodeId drop = id;
    if (definesPinned(pinned, graph.node(drop))) {
      if (definesPinned(pinned, graph.node(keep))) continue;  // merging would rename an output
      std::swap(keep, drop);
      *same = keep;
    }
    const std::vector<ValueId> from = graph.node(drop).outputs;
    const std::vector<ValueId> to = graph.node(keep).outputs;
    for (size_t i = 0; i < from.size(); ++i) graph.replaceAllUses(from[i], to[i]);
    graph.removeNode(drop);
    ++merged;
  }
  return merged;
}

}  // namespace

CseResult eliminateCommonSubexpressions(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  CseResult result;
  result.initializers = mergeInitializers(graph, pinned);
  for (size_t merged = mergeNodes(graph, pinned); merged > 0; merged = mergeNodes(graph, pinned)) {
    result.nodes += merged;
  }
  return result;
}

}  // namespace kiln
