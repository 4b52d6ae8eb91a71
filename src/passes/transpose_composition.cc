#include "passes/transpose_composition.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The perm of Transpose `id` over an input of rank `rank` (the default is
// the axes reversed), or nothing when it is not a permutation of them.
std::optional<std::vector<int64_t>> permOf(const Graph& graph, NodeId id, size_t rank) {
  std::vector<int64_t> perm = graph.node(id).intsAttribute("perm", {});
  if (perm.empty()) {
    for (size_t axis = rank; axis-- > 0;) perm.push_back(static_cast<int64_t>(axis));
  }
  if (perm.size() != rank) return std::nullopt;
  std::vector<bool> seen(rank, false);
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(axis)]) return std::nullopt;
    seen[static_cast<size_t>(axis)] = true;
  }
  return perm;
}

}  // namespace

size_t composeTransposes(Graph& graph) {
  size_t rewritten = 0;
  for (NodeId outer : graph.topologicalOrder()) {
    if (graph.node(outer).removed || !isOp(graph, outer, "Transpose")) continue;
    const ValueId middle = graph.node(outer).inputs[0];
    const NodeId inner = graph.value(middle).producer;
    if (inner == kNoNode || !isOp(graph, inner, "Transpose")) continue;
    const ValueId x = graph.node(inner).inputs[0];
    const ValueType& type = graph.value(x).type;
    if (!type.shape) continue;
    const auto p1 = permOf(graph, inner, type.shape->size());
    const auto p2 = permOf(graph, outer, type.shape->size());
    if (!p1 || !p2) continue;
    std::vector<int64_t> composed;
    bool identity = true;
    for (size_t i = 0; i < p2->size(); ++i) {
      composed.push_back((*p1)[static_cast<size_t>((*p2)[i])]);
      identity = identity && composed.back() == static_cast<int64_t>(i);
    }
    graph.setNodeInput(outer, 0, x);
    Node& node = graph.node(outer);
    if (identity) {
      node.op_type = "Identity";
      node.attributes.clear();
    } else {
      node.attributes["perm"] = composed;
    }
    ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln
