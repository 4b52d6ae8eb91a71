#include "passes/byte_tables.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

bool isInteger8(DType dtype) { return dtype == DType::kU8 || dtype == DType::kI8; }

// A step whose output is a function of the byte it reads: kiln.Lookup8, or
// a kiln.FusedElementwise of one 8-bit input of its output's shape that
// writes 8 bits.
bool isTableStep(const Graph& graph, const Node& node) {
  if (node.removed || node.domain != "kiln" || node.outputs.size() != 1 || node.inputs.empty() ||
      node.inputs[0] == kNoValue) {
    return false;
  }
  const ValueType& in = graph.value(node.inputs[0]).type;
  const ValueType& out = graph.value(node.outputs[0]).type;
  if (!isInteger8(in.dtype) || !isInteger8(out.dtype) || !in.hasStaticShape() || in.shape != out.shape) return false;
  if (node.op_type == "Lookup8") return node.inputs.size() == 2;
  return node.op_type == "FusedElementwise" && node.inputs.size() == 1 &&
         node.hasAttribute(std::string(kProgramDequantizeAttribute)) &&
         node.hasAttribute(std::string(kProgramQuantizeAttribute)) &&
         !node.hasAttribute(std::string(kProgramUpsampleAttribute));
}

// The step's output for each of the 256 byte values of its input (`bytes`,
// of the input's type), by its kernel; nothing when it cannot be evaluated.
std::optional<ConstantPtr> applied(const Graph& graph, const Node& node, const ConstantPtr& bytes,
                                   const ConstantEvaluator& evaluate) {
  const DType out = graph.value(node.outputs[0]).type.dtype;
  std::vector<ConstantPtr> inputs{bytes};
  if (node.op_type == "Lookup8") {
    const Value& table = graph.value(node.inputs[1]);
    if (table.kind != ValueKind::kInitializer) return std::nullopt;
    inputs.push_back(table.initializer);
  }
  const std::optional<std::vector<ConstantPtr>> result = evaluate(node, inputs, {TensorInfo{out, {256}}});
  if (!result || result->size() != 1 || (*result)[0] == nullptr) return std::nullopt;
  return (*result)[0];
}

ConstantPtr everyByte(DType dtype) {
  std::vector<std::byte> bytes(256);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i);
  return makeConstant(TensorInfo{dtype, {256}}, std::move(bytes));
}

}  // namespace

size_t composeByteTables(Graph& graph, const ConstantEvaluator& evaluate) {
  if (!evaluate) return 0;
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t removed = 0;
  for (NodeId second : graph.topologicalOrder()) {
    if (!isTableStep(graph, graph.node(second))) continue;
    const ValueId link = graph.node(second).inputs[0];
    const NodeId first = graph.value(link).producer;
    if (first == kNoNode || !isTableStep(graph, graph.node(first)) || pinned.contains(link) ||
        graph.value(link).users.size() != 1) {
      continue;
    }
    const ValueId x = graph.node(first).inputs[0];
    const std::optional<ConstantPtr> inner = applied(graph, graph.node(first), everyByte(graph.value(x).type.dtype), evaluate);
    if (!inner) continue;
    const std::optional<ConstantPtr> table = applied(graph, graph.node(second), *inner, evaluate);
    if (!table) continue;
    const ValueId table_value = graph.addInitializer(uniqueName(graph, graph.node(second).name + "/table"), *table);
    Node& node = graph.node(second);
    for (uint32_t i = 0; i < node.inputs.size(); ++i) graph.setNodeInput(second, i, kNoValue);
    graph.node(second).inputs.assign(2, kNoValue);
    graph.setNodeInput(second, 0, x);
    graph.setNodeInput(second, 1, table_value);
    graph.node(second).op_type = "Lookup8";
    graph.node(second).attributes.clear();
    graph.removeNode(first);
    ++removed;
  }
  return removed;
}

}  // namespace kiln
