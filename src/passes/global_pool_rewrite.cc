#include "passes/global_pool_rewrite.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The node's axes, from its constant input 1 or its attribute; empty when
// neither gives them.
std::vector<int64_t> axesOf(const Graph& graph, const Node& node) {
  if (node.inputs.size() > 1 && node.inputs[1] != kNoValue) {
    const ConstantPtr& c = graph.value(node.inputs[1]).initializer;
    if (!c || c->info.dtype != DType::kI64) return {};
    std::vector<int64_t> axes(static_cast<size_t>(c->info.numElements()));
    std::memcpy(axes.data(), c->bytes.data(), axes.size() * sizeof(int64_t));
    return axes;
  }
  return node.intsAttribute("axes", {});
}

bool overSpatialAxes(const Graph& graph, NodeId id) {
  const Node& node = graph.node(id);
  if (node.inputs.empty() || node.inputs[0] == kNoValue || node.intAttribute("keepdims", 1) != 1) return false;
  const ValueType& x = graph.value(node.inputs[0]).type;
  if (x.dtype != DType::kF32 || !x.shape || x.shape->size() != 4) return false;
  std::vector<int64_t> axes = axesOf(graph, node);
  for (int64_t& axis : axes) axis = axis < 0 ? axis + 4 : axis;
  std::sort(axes.begin(), axes.end());
  return axes == std::vector<int64_t>{2, 3};
}

}  // namespace

size_t reductionsToGlobalPools(Graph& graph) {
  size_t rewritten = 0;
  for (NodeId id : graph.nodeIds()) {
    const bool mean = isOp(graph, id, "ReduceMean");
    if (!(mean || isOp(graph, id, "ReduceMax")) || !overSpatialAxes(graph, id)) continue;
    Node& node = graph.node(id);
    if (node.inputs.size() > 1) graph.setNodeInput(id, 1, kNoValue);
    graph.node(id).inputs.resize(1);
    Node& pool = graph.node(id);
    pool.op_type = mean ? "GlobalAveragePool" : "GlobalMaxPool";
    pool.attributes.clear();
    ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln
