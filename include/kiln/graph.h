// Graph: the compiler's intermediate representation of a model.
//
// A Graph is a list of nodes in SSA form. Every value has exactly one
// definition: a graph input, an initializer (constant weights), a value
// captured from an enclosing graph (for the bodies of If/Loop/Scan), or one
// output of one node. Nodes refer to values by ValueId; each value keeps the
// list of its uses, which the Graph's editing methods keep in step.
//
// Invariants (checked by verifyGraph):
//   - value names are unique within a graph;
//   - a node's inputs are values of this graph (kNoValue marks an omitted
//     optional input), and its outputs are values it alone produces;
//   - each value's `users` lists exactly the (node, input index) pairs that
//     read it, over live nodes;
//   - the nodes can be ordered so that every value is defined before use.
// Removed nodes stay in the node table as tombstones (ids stay stable while
// passes run); nodeIds() lists the live ones.
//
// Ownership: a Graph owns its values and nodes; subgraphs are owned through
// GraphPtr attributes; constants are shared, immutable, through ConstantPtr.
// Thread safety: none; a Graph is built and transformed by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln {

using ValueId = uint32_t;
using NodeId = uint32_t;
inline constexpr ValueId kNoValue = UINT32_MAX;
inline constexpr NodeId kNoNode = UINT32_MAX;

// One dimension: a known size, or a size known only at run time, which may
// carry a symbol shared with other dimensions ("batch", "seq").
struct Dim {
  int64_t size = kDynamicDim;  // >= 0 when known
  std::string symbol;          // for unknown sizes: "" when anonymous

  static Dim known(int64_t size) { return Dim{size, {}}; }
  static Dim symbolic(std::string symbol) { return Dim{kDynamicDim, std::move(symbol)}; }
  bool isKnown() const { return size >= 0; }
  friend bool operator==(const Dim&, const Dim&) = default;
};

// The type of a value: element type and shape. The shape is std::nullopt
// while even the rank is unknown (before shape inference).
struct ValueType {
  DType dtype = DType::kUndefined;
  std::optional<std::vector<Dim>> shape;

  static ValueType tensor(DType dtype, const std::vector<int64_t>& dims);
  static ValueType unknown() { return {}; }

  bool hasStaticShape() const;
  // The TensorInfo, with unknown dimensions as kDynamicDim; nullopt when the
  // rank is unknown.
  std::optional<TensorInfo> tensorInfo() const;
  // "f32[1, 3, batch, ?]", "f32[*]" (unknown rank), "?" (unknown dtype).
  std::string toString() const;

  friend bool operator==(const ValueType&, const ValueType&) = default;
};

// Constant tensor data (initializers, tensor attributes). Static shape;
// bytes.size() == info.sizeInBytes().
struct Constant {
  TensorInfo info;
  std::vector<std::byte> bytes;
};
using ConstantPtr = std::shared_ptr<const Constant>;

// Makes a constant, checking that the byte count matches the TensorInfo.
ConstantPtr makeConstant(TensorInfo info, std::vector<std::byte> bytes);

class Graph;
using GraphPtr = std::shared_ptr<Graph>;

// A node attribute, as in ONNX: scalars, lists, tensors and subgraphs.
using Attribute = std::variant<int64_t, float, std::string, ConstantPtr, GraphPtr, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>, std::vector<ConstantPtr>,
                               std::vector<GraphPtr>>;
using Attributes = std::map<std::string, Attribute>;

enum class ValueKind : uint8_t { kGraphInput, kInitializer, kOuterScope, kNodeOutput };

// One read of a value: input `input_index` of node `node`.
struct Use {
  NodeId node;
  uint32_t input_index;
  friend bool operator==(const Use&, const Use&) = default;
};

struct Value {
  std::string name;
  ValueType type;
  ValueKind kind = ValueKind::kNodeOutput;
  NodeId producer = kNoNode;     // for kNodeOutput
  uint32_t output_index = 0;     // for kNodeOutput
  ConstantPtr initializer;       // for kInitializer
  std::vector<Use> users;
};

struct Node {
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain
  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attributes attributes;
  bool removed = false;

  bool hasAttribute(const std::string& key) const { return attributes.contains(key); }
  // Typed attribute access: the value, `fallback` when absent; throws
  // UsageError when present with another type.
  int64_t intAttribute(const std::string& key, int64_t fallback) const;
  float floatAttribute(const std::string& key, float fallback) const;
  std::string stringAttribute(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> intsAttribute(const std::string& key, const std::vector<int64_t>& fallback) const;
  // The subgraphs held in attributes (If branches, Loop and Scan bodies).
  std::vector<const Graph*> subgraphs() const;
};

class Graph {
 public:
  explicit Graph(std::string name = "main");

  const std::string& name() const { return name_; }

  // Definitions. Names must be unique in the graph (UsageError otherwise).
  ValueId addInput(const std::string& name, ValueType type);
  ValueId addInitializer(const std::string& name, ConstantPtr data);
  // A value of an enclosing graph that this (sub)graph reads by name.
  ValueId addOuterScopeValue(const std::string& name, ValueType type = {});
  // Adds a node reading `inputs` and defining one value per output name; an
  // empty output name gets a generated unique name. Returns the node's id.
  NodeId addNode(const std::string& op_type, const std::vector<ValueId>& inputs,
                 const std::vector<std::string>& output_names, Attributes attributes = {},
                 const std::string& domain = "");
  void addOutput(ValueId value);

  const Value& value(ValueId id) const;
  Value& value(ValueId id);
  const Node& node(NodeId id) const;
  Node& node(NodeId id);
  size_t valueCount() const { return values_.size(); }
  size_t nodeCount() const { return nodes_.size(); }  // tombstones included

  // Live nodes in the order they were added.
  std::vector<NodeId> nodeIds() const;
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::vector<ValueId>& initializers() const { return initializers_; }
  const std::vector<ValueId>& outerScopeValues() const { return outer_scope_values_; }
  std::optional<ValueId> findValue(std::string_view name) const;

  // Editing, keeping use lists in step.
  void setNodeInput(NodeId node, uint32_t input_index, ValueId value);
  // Every use of `from`, graph outputs included, reads `to` instead.
  void replaceAllUses(ValueId from, ValueId to);
  // Graph output `index` becomes `value` (the model's output names are the
  // values' names).
  void setOutput(size_t index, ValueId value);
  // Gives value `id` a new name, unique in the graph (UsageError otherwise).
  void renameValue(ValueId id, const std::string& name);
  // Removes a node whose outputs are unused and are not graph outputs.
  void removeNode(NodeId node);

  // Live nodes ordered so that every value is defined before it is read;
  // ties keep insertion order. Throws GraphError when there is a cycle.
  std::vector<NodeId> topologicalOrder() const;

  // The text form used by `kiln compile --print-ir` and in error messages.
  std::string toString() const;

 private:
  ValueId addValue(Value value);
  void addUse(ValueId value, Use use);
  void dropUse(ValueId value, Use use);

  std::string name_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::vector<ValueId> initializers_;
  std::vector<ValueId> outer_scope_values_;
  std::map<std::string, ValueId, std::less<>> names_;
};

// `base`, or `base_N` (N = 1, 2, ...), whichever no value of `graph` is named
// yet: the name of a value a rewrite adds.
std::string uniqueName(const Graph& graph, const std::string& base);

// Adds the names that `subgraph` and the subgraphs inside it read from the
// graphs enclosing `subgraph` (outer-scope values that `subgraph` itself
// does not define).
void collectCapturedNames(const Graph& subgraph, std::set<std::string>& names);

// Adds the names that the subgraphs of `graph`'s nodes read from outside
// them: values of `graph` (or of graphs enclosing it) they capture.
void collectSubgraphReads(const Graph& graph, std::set<std::string>& names);

// Every broken invariant of `graph` and its subgraphs (recursively), as
// messages; empty when the graph is well formed. With `require_types`, every
// value must also have a dtype. Outer-scope values of a subgraph must name a
// value visible in an enclosing graph.
std::vector<std::string> findGraphProblems(const Graph& graph, bool require_types = false);

// Throws GraphError listing every problem (and the printed graph) if any.
void verifyGraph(const Graph& graph, bool require_types = false);

}  // namespace kiln
