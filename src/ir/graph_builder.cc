#include "kiln/graph_builder.h"

#include "kiln/error.h"

namespace kiln {

GraphBuilder::GraphBuilder(std::string name) : graph_(std::make_shared<Graph>(std::move(name))) {}

ValueId GraphBuilder::input(const std::string& name, DType dtype, const std::vector<int64_t>& dims) {
  return graph_->addInput(name, ValueType::tensor(dtype, dims));
}

ValueId GraphBuilder::input(const std::string& name, ValueType type) { return graph_->addInput(name, std::move(type)); }

ValueId GraphBuilder::constant(const std::string& name, TensorInfo info, std::vector<std::byte> bytes) {
  return graph_->addInitializer(name, makeConstant(std::move(info), std::move(bytes)));
}

ValueId GraphBuilder::op(const std::string& op_type, const std::vector<ValueId>& inputs, Attributes attributes,
                         const std::string& domain) {
  return ops(op_type, inputs, 1, std::move(attributes), domain).front();
}

std::vector<ValueId> GraphBuilder::ops(const std::string& op_type, const std::vector<ValueId>& inputs,
                                       size_t num_outputs, Attributes attributes, const std::string& domain) {
  if (!graph_) throw UsageError("GraphBuilder used after build()");
  const NodeId node =
      graph_->addNode(op_type, inputs, std::vector<std::string>(num_outputs), std::move(attributes), domain);
  return graph_->node(node).outputs;
}

void GraphBuilder::output(ValueId value) { graph_->addOutput(value); }

GraphPtr GraphBuilder::build() {
  if (!graph_) throw UsageError("GraphBuilder::build() called twice");
  verifyGraph(*graph_);
  return std::move(graph_);
}

}  // namespace kiln
