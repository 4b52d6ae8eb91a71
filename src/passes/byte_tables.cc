#include "passes/byte_tables.h"

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

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

// Makes `id` kiln.Lookup8(x, table), its attributes dropped.
void becomeLookup(Graph& graph, NodeId id, ValueId x, const ConstantPtr& table) {
  const ValueId table_value = graph.addInitializer(uniqueName(graph, graph.node(id).name + "/table"), table);
  for (uint32_t i = 0; i < graph.node(id).inputs.size(); ++i) graph.setNodeInput(id, i, kNoValue);
  graph.node(id).inputs.assign(2, kNoValue);
  graph.setNodeInput(id, 0, x);
  graph.setNodeInput(id, 1, table_value);
  graph.node(id).op_type = "Lookup8";
  graph.node(id).attributes.clear();
}

class Composer {
 public:
  Composer(Graph& graph, const ConstantEvaluator& evaluate)
      : graph_(graph), evaluate_(evaluate), pinned_(pinnedValues(graph)) {}

  // One pass over the graph; returns the steps removed.
  size_t run() {
    size_t removed = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed) continue;
      if (isTableStep(graph_, graph_.node(id))) {
        removed += composeChain(id);
      } else if (isQuantizedBinary(graph_.node(id))) {
        removed += composeBinary(id);
      }
    }
    return removed;
  }

 private:
  // The table step that makes `value`, when its one reader is the node at
  // hand and it is not pinned; else kNoNode.
  NodeId onlyTableFeeding(ValueId value) const {
    const NodeId producer = graph_.value(value).producer;
    if (producer == kNoNode || !isTableStep(graph_, graph_.node(producer)) || pinned_.contains(value) ||
        graph_.value(value).users.size() != 1) {
      return kNoNode;
    }
    return producer;
  }

  // Two table steps in a row: the second's table of the first's.
  size_t composeChain(NodeId second) {
    const NodeId first = onlyTableFeeding(graph_.node(second).inputs[0]);
    if (first == kNoNode) return 0;
    const ValueId x = graph_.node(first).inputs[0];
    const std::optional<ConstantPtr> inner =
        applied(graph_, graph_.node(first), everyByte(graph_.value(x).type.dtype), evaluate_);
    if (!inner) return 0;
    const std::optional<ConstantPtr> table = applied(graph_, graph_.node(second), *inner, evaluate_);
    if (!table) return 0;
    becomeLookup(graph_, second, x, *table);
    graph_.removeNode(first);
    return 1;
  }

  static bool isQuantizedBinary(const Node& node) {
    return !node.removed && node.domain == "kiln" && (node.op_type == "QLinearMul" || node.op_type == "QLinearAdd") &&
           node.inputs.size() == 8;
  }

  // kiln.QLinearMul or kiln.QLinearAdd of x and a table step of x (SiLU's
  // x * Sigmoid(x), a hard-swish's x * HardSigmoid(x), each quantized), or
  // of two table steps of x, or of x and x: a function of x's byte, so a
  // table too, computed by the node's own kernel over the 256 bytes.
  size_t composeBinary(NodeId id) {
    const Node& node = graph_.node(id);
    const ValueType& out = graph_.value(node.outputs[0]).type;
    // The operands' source and each one's table step, if it is one.
    std::array<NodeId, 2> steps{};
    std::array<ValueId, 2> sources{};
    for (size_t k = 0; k < 2; ++k) {
      const ValueId operand = node.inputs[k * 3];
      if (graph_.value(operand).type != out) return 0;
      steps[k] = onlyTableFeeding(operand);
      sources[k] = steps[k] == kNoNode ? operand : graph_.node(steps[k]).inputs[0];
    }
    if (sources[0] != sources[1]) return 0;
    const ValueId x = sources[0];
    if (graph_.value(x).type != out) return 0;
    std::vector<ConstantPtr> inputs(8);
    for (size_t i : {1u, 2u, 4u, 5u, 6u, 7u}) {
      const Value& param = graph_.value(node.inputs[i]);
      if (param.kind != ValueKind::kInitializer) return 0;
      inputs[i] = param.initializer;
    }
    const ConstantPtr bytes = everyByte(graph_.value(x).type.dtype);
    for (size_t k = 0; k < 2; ++k) {
      if (steps[k] == kNoNode) {
        inputs[k * 3] = bytes;
        continue;
      }
      const std::optional<ConstantPtr> operand = applied(graph_, graph_.node(steps[k]), bytes, evaluate_);
      if (!operand) return 0;
      inputs[k * 3] = *operand;
    }
    const std::optional<std::vector<ConstantPtr>> table = evaluate_(node, inputs, {TensorInfo{out.dtype, {256}}});
    if (!table || table->size() != 1 || (*table)[0] == nullptr) return 0;
    becomeLookup(graph_, id, x, (*table)[0]);
    size_t removed = 0;
    for (const NodeId step : steps) {
      if (step != kNoNode && !graph_.node(step).removed) {
        graph_.removeNode(step);
        ++removed;
      }
    }
    return removed;
  }

  Graph& graph_;
  const ConstantEvaluator& evaluate_;
  const std::set<ValueId> pinned_;
};

}  // namespace

size_t composeByteTables(Graph& graph, const ConstantEvaluator& evaluate) {
  if (!evaluate) return 0;
  size_t removed = 0;
  // A step made a table may join a chain with a step before it: again until
  // nothing changes.
  for (size_t pass = 0; pass < 4; ++pass) {
    const size_t now = Composer(graph, evaluate).run();
    removed += now;
    if (now == 0) break;
  }
  return removed;
}

}  // namespace kiln
