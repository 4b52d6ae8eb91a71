// GraphBuilder: builds a Graph by hand in a few lines. Tests use it, and so
// will custom operators' composite builders.
//
//   GraphBuilder b("mlp");
//   ValueId x = b.input("x", DType::kF32, {-1, 784});       // -1: dynamic
//   ValueId w = b.constant<float>("w", {784, 10}, weights);
//   ValueId y = b.op("Relu", {b.op("MatMul", {x, w})});
//   b.output(y);
//   GraphPtr graph = b.build();                             // verified
//
// Thread safety: none; one builder per thread.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "main");

  // A graph input; a negative dimension is dynamic.
  ValueId input(const std::string& name, DType dtype, const std::vector<int64_t>& dims);
  ValueId input(const std::string& name, ValueType type);

  // An initializer holding `values` with shape `dims`.
  template <typename T>
  ValueId constant(const std::string& name, const std::vector<int64_t>& dims, const std::vector<T>& values) {
    std::vector<std::byte> bytes(values.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return constant(name, TensorInfo{dtypeOf<T>(), dims}, std::move(bytes));
  }
  ValueId constant(const std::string& name, TensorInfo info, std::vector<std::byte> bytes);

  // A node with one output; returns that output.
  ValueId op(const std::string& op_type, const std::vector<ValueId>& inputs, Attributes attributes = {},
             const std::string& domain = "");
  // A node with `num_outputs` outputs.
  std::vector<ValueId> ops(const std::string& op_type, const std::vector<ValueId>& inputs, size_t num_outputs,
                           Attributes attributes = {}, const std::string& domain = "");

  void output(ValueId value);

  // The graph so far, for edits the builder does not offer (types, names).
  Graph& graph() { return *graph_; }

  // Verifies the graph (GraphError if broken) and hands it over; the builder
  // must not be used afterwards.
  GraphPtr build();

 private:
  GraphPtr graph_;
};

}  // namespace kiln
