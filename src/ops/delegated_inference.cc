#include "ops/delegated_inference.h"

#include <limits>

namespace kiln {

std::optional<std::vector<Dim>> delegatedShape(const InferenceContext& context, const std::string& op,
                                               const std::vector<size_t>& inputs) {
  constexpr int64_t kNewest = std::numeric_limits<int64_t>::max();
  const OpSchema* schema = OpRegistry::global().find("", op, kNewest);
  if (schema == nullptr) context.fail("kiln has no schema for {}, whose shape rule this operator uses", op);
  Graph scratch("delegated");
  std::vector<ValueId> ids;
  for (size_t index : inputs) {
    if (!context.hasInput(index)) {
      ids.push_back(kNoValue);
      continue;
    }
    const std::string name = "input" + std::to_string(index);
    if (ConstantPtr constant = context.inputConstant(index); constant && constant->info.dtype == DType::kF32) {
      ids.push_back(scratch.addInitializer(name, constant));
      continue;
    }
    ids.push_back(scratch.addInput(name, ValueType{DType::kF32, context.inputType(index).shape}));
  }
  const NodeId id = scratch.addNode(op, ids, {""}, context.node().attributes);
  Node& node = scratch.node(id);
  node.name = context.node().name;
  InferenceContext inner(scratch, node, schema->since_version);
  try {
    schema->infer(inner);
  } catch (const GraphError& error) {
    throw GraphError(std::string(error.what()) + " (" + context.node().op_type + " takes its shape rule from " + op +
                     ")");
  }
  return inner.output(0).shape;
}

}  // namespace kiln
