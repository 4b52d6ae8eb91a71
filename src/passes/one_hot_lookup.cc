#include "passes/one_hot_lookup.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

bool isIndexType(DType dtype) { return dtype == DType::kI32 || dtype == DType::kI64; }

// The values of an i32 or i64 initializer, widened.
std::optional<std::vector<int64_t>> integerValues(const Graph& graph, ValueId id) {
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c || !isIndexType(c->info.dtype)) return std::nullopt;
  std::vector<int64_t> values(static_cast<size_t>(c->info.numElements()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (c->info.dtype == DType::kI64) {
      std::memcpy(&values[i], c->bytes.data() + i * 8, 8);
    } else {
      int32_t v;
      std::memcpy(&v, c->bytes.data() + i * 4, 4);
      values[i] = v;
    }
  }
  return values;
}

// Whether `id` is an integer constant 0, 1, ..., d - 1 along its last axis,
// every other dimension 1.
bool isRange(const Graph& graph, ValueId id, int64_t d) {
  const auto values = integerValues(graph, id);
  if (!values || static_cast<int64_t>(values->size()) != d) return false;
  const std::vector<int64_t>& dims = graph.value(id).initializer->info.shape;
  if (dims.empty() || dims.back() != d) return false;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (dims[i] != 1) return false;
  }
  for (int64_t i = 0; i < d; ++i) {
    if ((*values)[static_cast<size_t>(i)] != i) return false;
  }
  return true;
}

// A scalar constant of integer type `dtype` holding `value`.
ConstantPtr integerScalar(DType dtype, int64_t value) {
  std::vector<std::byte> bytes(dtypeSize(dtype));
  if (dtype == DType::kI64) {
    std::memcpy(bytes.data(), &value, 8);
  } else {
    const auto narrow = static_cast<int32_t>(value);
    std::memcpy(bytes.data(), &narrow, 4);
  }
  return makeConstant(TensorInfo{dtype, {}}, std::move(bytes));
}

struct OneHot {
  ValueId ids = kNoValue;
  int64_t depth = 0;
};

// The one-hot of `value` when it is Cast(Equal(ids, range), f32) read only
// along the chain (see the header).
std::optional<OneHot> oneHotOf(const Graph& graph, const std::set<ValueId>& pinned, ValueId value) {
  const NodeId cast = graph.value(value).producer;
  if (cast == kNoNode || !isOp(graph, cast, "Cast") || pinned.contains(value) || graph.value(value).users.size() != 1) {
    return std::nullopt;
  }
  if (graph.value(value).type.dtype != DType::kF32) return std::nullopt;
  const ValueId equal_out = graph.node(cast).inputs[0];
  const NodeId equal = graph.value(equal_out).producer;
  if (equal == kNoNode || !isOp(graph, equal, "Equal") || pinned.contains(equal_out) ||
      graph.value(equal_out).users.size() != 1) {
    return std::nullopt;
  }
  const ValueType& out = graph.value(value).type;
  if (!out.hasStaticShape() || out.shape->empty()) return std::nullopt;
  const int64_t depth = out.shape->back().size;
  for (int side = 0; side < 2; ++side) {
    const ValueId ids = graph.node(equal).inputs[static_cast<size_t>(side)];
    const ValueId range = graph.node(equal).inputs[static_cast<size_t>(1 - side)];
    const ValueType& ids_type = graph.value(ids).type;
    if (!isIndexType(ids_type.dtype) || !ids_type.hasStaticShape() || ids_type.shape->empty()) continue;
    if (ids_type.shape->back().size != 1 || ids_type.shape->size() != out.shape->size()) continue;
    if (!isRange(graph, range, depth)) continue;
    return OneHot{ids, depth};
  }
  return std::nullopt;
}

// W with a row of zeros appended, when it is a finite f32 constant [depth, n].
std::optional<ConstantPtr> extendedTable(const Graph& graph, ValueId w, int64_t depth) {
  const ConstantPtr& c = graph.value(w).initializer;
  if (!c || c->info.dtype != DType::kF32 || c->info.shape.size() != 2 || c->info.shape[0] != depth) return std::nullopt;
  const int64_t n = c->info.shape[1];
  std::vector<float> rows(static_cast<size_t>((depth + 1) * n), 0.0f);
  std::memcpy(rows.data(), c->bytes.data(), c->bytes.size());
  for (int64_t i = 0; i < depth * n; ++i) {
    if (!std::isfinite(rows[static_cast<size_t>(i)])) return std::nullopt;
  }
  std::vector<std::byte> bytes(rows.size() * sizeof(float));
  std::memcpy(bytes.data(), rows.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, {depth + 1, n}}, std::move(bytes));
}

bool rewrite(Graph& graph, const std::set<ValueId>& pinned, NodeId matmul) {
  const Node& node = graph.node(matmul);
  if (node.inputs.size() != 2 || node.outputs.size() != 1) return false;
  const auto one_hot = oneHotOf(graph, pinned, node.inputs[0]);
  if (!one_hot) return false;
  const auto table = extendedTable(graph, node.inputs[1], one_hot->depth);
  // (Copies: adding values below may move the graph's values and nodes.)
  const ValueType out_type = graph.value(node.outputs[0]).type;
  if (!table || !out_type.hasStaticShape()) return false;

  const ValueId out = node.outputs[0];
  const std::string base = graph.value(out).name;
  const ValueId ids = one_hot->ids;
  const DType index_type = graph.value(ids).type.dtype;
  auto name = [&](const std::string& suffix) { return uniqueName(graph, base + ":onehot_" + suffix); };
  auto output = [&](NodeId id) { return graph.node(id).outputs[0]; };
  const ValueId zero = graph.addInitializer(name("zero"), integerScalar(index_type, 0));
  const ValueId depth = graph.addInitializer(name("depth"), integerScalar(index_type, one_hot->depth));
  const ValueId rows = graph.addInitializer(name("table"), *table);
  std::vector<std::byte> shape_bytes(out_type.shape->size() * sizeof(int64_t));
  for (size_t i = 0; i < out_type.shape->size(); ++i) {
    const int64_t size = (*out_type.shape)[i].size;
    std::memcpy(shape_bytes.data() + i * sizeof(int64_t), &size, sizeof(int64_t));
  }
  const ValueId shape = graph.addInitializer(
      name("shape"), makeConstant(TensorInfo{DType::kI64, {static_cast<int64_t>(out_type.shape->size())}},
                                  std::move(shape_bytes)));
  // An id outside [0, depth) sets no position of the one-hot: the zero row.
  const NodeId negative = graph.addNode("Less", {ids, zero}, {name("negative")});
  const NodeId not_negative = graph.addNode("Not", {output(negative)}, {name("not_negative")});
  const NodeId below = graph.addNode("Less", {ids, depth}, {name("below")});
  const NodeId valid = graph.addNode("And", {output(not_negative), output(below)}, {name("valid")});
  const NodeId safe = graph.addNode("Where", {output(valid), ids, depth}, {name("ids")});
  const NodeId gather = graph.addNode("Gather", {rows, output(safe)}, {name("rows")}, {{"axis", int64_t{0}}});
  const NodeId reshape = graph.addNode("Reshape", {output(gather), shape}, {name("reshaped")});
  const ValueId result = output(reshape);
  graph.value(result).type = graph.value(out).type;
  replaceKeepingName(graph, out, result, "/one_hot_matmul");
  graph.removeNode(matmul);
  return true;
}

}  // namespace

size_t replaceOneHotMatMuls(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t replaced = 0;
  for (NodeId id : graph.nodeIds()) {
    if (!graph.node(id).removed && isOp(graph, id, "MatMul") && rewrite(graph, pinned, id)) ++replaced;
  }
  return replaced;
}

}  // namespace kiln
