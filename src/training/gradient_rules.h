// The per-operator gradient rules behind appendGradients (autodiff.h), and
// the helpers they build nodes with.
//
// A rule gets a copy of the forward node and the gradient of each of its
// outputs (kNoValue where none flows) and returns one gradient per input
// (kNoValue for inputs that have none: integer operands, shapes, axes).
// Rules add plain ONNX nodes at opset 13 or later.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

class GradientBuilder {
 public:
  GradientBuilder(Graph& graph, const std::map<std::string, int64_t>& opsets);

  Graph& graph() { return graph_; }
  int64_t opset() const { return opset_; }

  // A node with one output; its value.
  ValueId add(const std::string& op_type, const std::vector<ValueId>& inputs, Attributes attributes = {});
  // Constants: an int64 list (shapes, axes), and a scalar of `dtype` (f32 or f64).
  ValueId int64s(const std::vector<int64_t>& values);
  ValueId scalar(double value, DType dtype);
  // The static shape and dtype of a value, types inferred first for the
  // nodes added since (GraphError when unknown).
  std::vector<int64_t> shapeOf(ValueId value);
  DType dtypeOf(ValueId value);
  // `gradient` (of a value broadcast to its shape) summed back to `shape`:
  // over the leading axes `shape` lacks and the axes where it has 1.
  ValueId sumToShape(ValueId gradient, const std::vector<int64_t>& shape);
  // x^T of the last two axes.
  ValueId transposeLastTwo(ValueId value);
  // The mean over `axes`, kept as 1s (ReduceMean's axes are an input from
  // opset 18, an attribute before).
  ValueId meanOver(ValueId value, const std::vector<int64_t>& axes);

 private:
  TensorInfo infoOf(ValueId value);

  Graph& graph_;
  const std::map<std::string, int64_t>& opsets_;
  int64_t opset_;
};

using GradientRule =
    std::function<std::vector<ValueId>(GradientBuilder& b, const Node& node, const std::vector<ValueId>& output_grads)>;

// Input `i` of `node`, kNoValue when omitted.
inline ValueId inputOf(const Node& node, size_t i) { return i < node.inputs.size() ? node.inputs[i] : kNoValue; }

// The rules of gradient_rules_nn.cc: convolution and pooling; the
// normalisations and Dropout.
void addConvolutionRules(std::map<std::string, GradientRule>& rules);
void addNormalizationRules(std::map<std::string, GradientRule>& rules);

// Whether Dropout `node` drops (its training_mode a constant true); throws
// GraphError when training_mode is not constant.
bool dropoutTrains(const Graph& graph, const Node& node);

// The rule for a default-domain op, or null.
const GradientRule* findGradientRule(const std::string& op_type);
std::vector<std::string> gradientRuleNames();

}  // namespace kiln
