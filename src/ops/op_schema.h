// Operator schemas: what kiln knows about each operator it supports, keyed
// by (domain, op type, opset version): how many inputs and outputs it takes
// and how to infer its outputs' types and shapes from its inputs.
//
// A schema is registered with the first opset version whose semantics it
// implements (`since_version`); lookup for a model's opset picks the newest
// schema not newer than it, as ONNX does. One file per op family
// (elementwise.cc, shape_ops.cc, ...) defines a register function listed in
// op_families.h; OpRegistry::global() calls them all on first use.
//
// Thread safety: global() is built once (thread-safe static); lookups are
// read-only and may run concurrently.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/graph.h"

namespace kiln {

// What an inference function sees of one node: its inputs' types and, where
// known, their constant values; it fills in its outputs' types.
class InferenceContext {
 public:
  InferenceContext(const Graph& graph, const Node& node, int64_t opset);

  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }
  size_t inputCount() const { return node_.inputs.size(); }
  size_t outputCount() const { return node_.outputs.size(); }
  // False for an omitted optional input (or one past the end).
  bool hasInput(size_t index) const;
  // The type of input `index`; requires hasInput(index).
  const ValueType& inputType(size_t index) const;
  // The input's rank and dims when its shape is known; fails otherwise.
  const std::vector<Dim>& inputShape(size_t index) const;
  // The value of a constant input (an initializer), or nullptr. Asking for
  // a value that is not constant is recorded when a recorder is set: those
  // are the values the shapes depend on (see InferenceOptions).
  ConstantPtr inputConstant(size_t index) const;
  // The value of a constant input, or nullptr, without recording a
  // non-constant one as a value shapes depend on: for ops (NonZero,
  // NonMaxSuppression) whose inputs are data that changes from call to
  // call, never a signature's shape input (runtime_shapes.h evaluates them
  // as the model runs).
  ConstantPtr dataConstant(size_t index) const;
  // The integer values of a constant i32/i64 input, or nullopt.
  std::optional<std::vector<int64_t>> constantInts(size_t index) const;

  void recordWantedConstants(std::vector<ValueId>* sink) { wanted_ = sink; }

  // For control flow: infers subgraph `body` (an attribute of this node)
  // with its inputs typed `input_types` and the values it captures typed as
  // this node's graph has them; returns its outputs' types.
  std::vector<ValueType> inferSubgraph(Graph& body, const std::vector<ValueType>& input_types) const;
  void setOpsets(const std::map<std::string, int64_t>* opsets, bool lenient) {
    opsets_ = opsets;
    lenient_ = lenient;
  }

  ValueType& output(size_t index) { return outputs_.at(index); }
  std::vector<ValueType>& outputs() { return outputs_; }

  // Throws GraphError: "node 'name' (Op): <message>".
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    failWith(fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  [[noreturn]] void failWith(const std::string& message) const;
  const Graph& graph_;
  const Node& node_;
  int64_t opset_;
  std::vector<ValueType> outputs_;
  std::vector<ValueId>* wanted_ = nullptr;
  const std::map<std::string, int64_t>* opsets_ = nullptr;
  bool lenient_ = false;
};

using InferFunction = std::function<void(InferenceContext&)>;

struct OpSchema {
  std::string domain;  // "" = ai.onnx
  std::string op_type;
  int64_t since_version = 1;
  size_t min_inputs = 0;
  size_t max_inputs = 0;
  size_t min_outputs = 1;
  size_t max_outputs = 1;
  InferFunction infer;
};

class OpRegistry {
 public:
  static OpRegistry& global();

  void add(OpSchema schema);
  // The schema for `op_type` in `domain` at `opset`, or nullptr.
  const OpSchema* find(const std::string& domain, const std::string& op_type, int64_t opset) const;
  // Every registered (domain, op type), sorted.
  std::vector<std::pair<std::string, std::string>> operators() const;

 private:
  // (domain, op) -> since_version -> schema
  std::map<std::pair<std::string, std::string>, std::map<int64_t, OpSchema>> schemas_;
};

}  // namespace kiln
