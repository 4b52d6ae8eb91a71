#include "passes/integer_matmul_fusion.h"

#include <set>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

constexpr int64_t kOnnxFloat = 1;  // TensorProto.FLOAT, Cast's `to` for f32

// Whether `scale` is f32 with one element or one per column of `product`,
// broadcasting to it from the right.
bool isProductScale(const Graph& graph, ValueId scale, const std::vector<Dim>& product) {
  const ValueType& type = graph.value(scale).type;
  if (type.dtype != DType::kF32 || !type.hasStaticShape() || type.shape->size() > product.size()) return false;
  const std::vector<Dim>& dims = *type.shape;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (dims[i].size != 1) return false;
  }
  return dims.empty() || dims.back().size == 1 || dims.back().size == product.back().size;
}

bool fuseAt(Graph& graph, const std::set<ValueId>& pinned, NodeId id) {
  const Node& matmul = graph.node(id);
  const ValueId product = matmul.outputs[0];
  const ValueType& type = graph.value(product).type;
  if (type.dtype != DType::kI32 || !type.hasStaticShape() || type.shape->empty()) return false;
  const auto cast = onlyReader(graph, pinned, product, "Cast");
  if (!cast || graph.node(*cast).intAttribute("to", 0) != kOnnxFloat) return false;
  const ValueId sums = graph.node(*cast).outputs[0];
  const auto mul = onlyReader(graph, pinned, sums, "Mul");
  if (!mul) return false;
  const ValueId scale = otherOperand(graph, *mul, sums);
  if (scale == kNoValue || !isProductScale(graph, scale, *type.shape)) return false;
  const ValueType& out = graph.value(graph.node(*mul).outputs[0]).type;
  if (out.dtype != DType::kF32 || out.shape != type.shape) return false;
  std::vector<ValueId> inputs = matmul.inputs;
  inputs.resize(4, kNoValue);
  inputs.push_back(scale);
  std::vector<NodeId> chain = {id, *cast, *mul};
  // An Add of a bias [N] or of a residual of the product's shape.
  const ValueId scaled = graph.node(*mul).outputs[0];
  if (const auto add = onlyReader(graph, pinned, scaled, "Add")) {
    const ValueId addend = otherOperand(graph, *add, scaled);
    const ValueType& added = graph.value(graph.node(*add).outputs[0]).type;
    const ValueType* a = addend == kNoValue ? nullptr : &graph.value(addend).type;
    const bool bias = a && a->hasStaticShape() && a->shape->size() == 1 && isProductScale(graph, addend, *type.shape) &&
                      a->shape->back().size == type.shape->back().size;
    const bool residual = a && a->dtype == DType::kF32 && a->shape == type.shape;
    if ((bias || residual) && added.shape == type.shape) {
      inputs.push_back(addend);
      chain.push_back(*add);
    }
  }
  const std::string name = matmul.name;
  replaceByFusedNode(graph, chain, "MatMulIntegerToFloat", {}, inputs, name);
  return true;
}

}  // namespace

size_t fuseIntegerMatMuls(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t fused = 0;
  for (NodeId id : graph.topologicalOrder()) {
    if (!graph.node(id).removed && isOp(graph, id, "MatMulInteger") && fuseAt(graph, pinned, id)) ++fused;
  }
  return fused;
}

}  // namespace kiln
