#include "kiln/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "kiln/error.h"

namespace kiln {

// ------------------------------------------------------------- ValueType

ValueType ValueType::tensor(DType dtype, const std::vector<int64_t>& dims) {
  std::vector<Dim> shape;
  shape.reserve(dims.size());
  for (int64_t dim : dims) shape.push_back(dim >= 0 ? Dim::known(dim) : Dim{});
  return ValueType{dtype, std::move(shape)};
}

bool ValueType::hasStaticShape() const {
  return shape.has_value() && std::all_of(shape->begin(), shape->end(), [](const Dim& d) { return d.isKnown(); });
}

std::optional<TensorInfo> ValueType::tensorInfo() const {
  if (!shape) return std::nullopt;
  TensorInfo info{dtype, {}};
  for (const Dim& dim : *shape) info.shape.push_back(dim.size);
  return info;
}

std::string ValueType::toString() const {
  if (dtype == DType::kUndefined && !shape) return "?";
  std::string text(dtype == DType::kUndefined ? "?" : dtypeName(dtype));
  if (!shape) return text + "[*]";
  text += "[";
  for (size_t i = 0; i < shape->size(); ++i) {
    const Dim& dim = (*shape)[i];
    if (i) text += ", ";
    text += dim.isKnown() ? std::to_string(dim.size) : (dim.symbol.empty() ? "?" : dim.symbol);
  }
  return text + "]";
}

ConstantPtr makeConstant(TensorInfo info, std::vector<std::byte> bytes) {
  if (!info.isStatic()) throw UsageError("constant with dynamic shape " + info.shapeString());
  if (bytes.size() != info.sizeInBytes()) {
    throw UsageError(fmt::format("constant {} needs {} bytes, got {}", info.toString(), info.sizeInBytes(),
                                 bytes.size()));
  }
  return std::make_shared<const Constant>(Constant{std::move(info), std::move(bytes)});
}

// ------------------------------------------------------------------ Node

namespace {

template <typename T>
T typedAttribute(const Node& node, const std::string& key, const T& fallback, std::string_view type_name) {
  const auto it = node.attributes.find(key);
  if (it == node.attributes.end()) return fallback;
  if (const T* value = std::get_if<T>(&it->second)) return *value;
  throw UsageError(fmt::format("attribute '{}' of {} node '{}' is not {}", key, node.op_type, node.name, type_name));
}

}  // namespace

int64_t Node::intAttribute(const std::string& key, int64_t fallback) const {
  return typedAttribute(*this, key, fallback, "an int");
}
float Node::floatAttribute(const std::string& key, float fallback) const {
  return typedAttribute(*this, key, fallback, "a float");
}
std::string Node::stringAttribute(const std::string& key, const std::string& fallback) const {
  return typedAttribute(*this, key, fallback, "a string");
}
std::vector<int64_t> Node::intsAttribute(const std::string& key, const std::vector<int64_t>& fallback) const {
  return typedAttribute(*this, key, fallback, "a list of ints");
}

std::vector<const Graph*> Node::subgraphs() const {
  std::vector<const Graph*> graphs;
  for (const auto& [key, attribute] : attributes) {
    if (const GraphPtr* graph = std::get_if<GraphPtr>(&attribute)) {
      if (*graph) graphs.push_back(graph->get());
    } else if (const auto* list = std::get_if<std::vector<GraphPtr>>(&attribute)) {
      for (const GraphPtr& g : *list) {
        if (g) graphs.push_back(g.get());
      }
    }
  }
  return graphs;
}

// ----------------------------------------------------------------- Graph

Graph::Graph(std::string name) : name_(std::move(name)) {}

ValueId Graph::addValue(Value value) {
  if (value.name.empty()) throw UsageError("values need a name");
  if (names_.contains(value.name)) {
    throw UsageError(fmt::format("graph '{}' already has a value named '{}'", name_, value.name));
  }
  const auto id = static_cast<ValueId>(values_.size());
  names_.emplace(value.name, id);
  values_.push_back(std::move(value));
  return id;
}

ValueId Graph::addInput(const std::string& name, ValueType type) {
  const ValueId id = addValue(Value{name, std::move(type), ValueKind::kGraphInput, kNoNode, 0, nullptr, {}});
  inputs_.push_back(id);
  return id;
}

ValueId Graph::addInitializer(const std::string& name, ConstantPtr data) {
  if (!data) throw UsageError(fmt::format("initializer '{}' has no data", name));
  ValueType type{data->info.dtype, std::vector<Dim>{}};
  for (int64_t dim : data->info.shape) type.shape->push_back(Dim::known(dim));
  const ValueId id = addValue(Value{name, std::move(type), ValueKind::kInitializer, kNoNode, 0, std::move(data), {}});
  initializers_.push_back(id);
  return id;
}

ValueId Graph::addOuterScopeValue(const std::string& name, ValueType type) {
  const ValueId id = addValue(Value{name, std::move(type), ValueKind::kOuterScope, kNoNode, 0, nullptr, {}});
  outer_scope_values_.push_back(id);
  return id;
}

NodeId Graph::addNode(const std::string& op_type, const std::vector<ValueId>& inputs,
                      const std::vector<std::string>& output_names, Attributes attributes,
                      const std::string& domain) {
  if (op_type.empty()) throw UsageError("a node needs an op type");
  for (ValueId input : inputs) {
    if (input != kNoValue && input >= values_.size()) {
      throw UsageError(fmt::format("{} node reads value id {}, which graph '{}' does not have", op_type, input, name_));
    }
  }
  const auto id = static_cast<NodeId>(nodes_.size());
  Node node;
  node.op_type = op_type;
  node.domain = domain;
  node.name = fmt::format("{}_{}", op_type, id);
  node.attributes = std::move(attributes);
  for (uint32_t i = 0; i < output_names.size(); ++i) {
    std::string name = output_names[i];
    if (name.empty()) name = fmt::format("{}:{}", node.name, i);
    node.outputs.push_back(addValue(Value{std::move(name), {}, ValueKind::kNodeOutput, id, i, nullptr, {}}));
  }
  node.inputs = inputs;
  nodes_.push_back(std::move(node));
  for (uint32_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] != kNoValue) addUse(inputs[i], {id, i});
  }
  return id;
}

void Graph::addOutput(ValueId value) {
  if (value >= values_.size()) throw UsageError(fmt::format("graph '{}' has no value id {}", name_, value));
  outputs_.push_back(value);
}

const Value& Graph::value(ValueId id) const { return values_.at(id); }
Value& Graph::value(ValueId id) { return values_.at(id); }
const Node& Graph::node(NodeId id) const { return nodes_.at(id); }
Node& Graph::node(NodeId id) { return nodes_.at(id); }

std::vector<NodeId> Graph::nodeIds() const {
  std::vector<NodeId> ids;
  ids.reserve(nodes_.size());
  for (NodeId id = 0; id < nodes_.size(); ++id) {
    if (!nodes_[id].removed) ids.push_back(id);
  }
  return ids;
}

std::optional<ValueId> Graph::findValue(std::string_view name) const {
  const auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

void Graph::addUse(ValueId value, Use use) { values_.at(value).users.push_back(use); }

void Graph::dropUse(ValueId value, Use use) {
  auto& users = values_.at(value).users;
  const auto it = std::find(users.begin(), users.end(), use);
  if (it != users.end()) users.erase(it);
}

void Graph::setNodeInput(NodeId node_id, uint32_t input_index, ValueId value) {
  Node& n = nodes_.at(node_id);
  if (input_index >= n.inputs.size()) {
    throw UsageError(fmt::format("node '{}' has {} inputs; cannot set input {}", n.name, n.inputs.size(), input_index));
  }
  if (value != kNoValue && value >= values_.size()) throw UsageError(fmt::format("no value id {}", value));
  if (n.inputs[input_index] != kNoValue) dropUse(n.inputs[input_index], {node_id, input_index});
  n.inputs[input_index] = value;
  if (value != kNoValue) addUse(value, {node_id, input_index});
}

void Graph::replaceAllUses(ValueId from, ValueId to) {
  if (from == to) return;
  const std::vector<Use> uses = values_.at(from).users;
  for (const Use& use : uses) setNodeInput(use.node, use.input_index, to);
  std::replace(outputs_.begin(), outputs_.end(), from, to);
}

void Graph::setOutput(size_t index, ValueId value) {
  if (index >= outputs_.size()) throw UsageError(fmt::format("graph '{}' has no output {}", name_, index));
  if (value >= values_.size()) throw UsageError(fmt::format("graph '{}' has no value id {}", name_, value));
  outputs_[index] = value;
}

void Graph::renameValue(ValueId id, const std::string& name) {
  Value& v = values_.at(id);
  if (v.name == name) return;
  if (names_.contains(name)) throw UsageError(fmt::format("graph '{}' already has a value named '{}'", name_, name));
  names_.erase(v.name);
  names_.emplace(name, id);
  v.name = name;
}

void Graph::removeNode(NodeId node_id) {
  Node& n = nodes_.at(node_id);
  if (n.removed) return;
  for (ValueId output : n.outputs) {
    if (!values_[output].users.empty() || std::find(outputs_.begin(), outputs_.end(), output) != outputs_.end()) {
      throw UsageError(fmt::format("cannot remove node '{}': its output '{}' is still used", n.name,
                                   values_[output].name));
    }
  }
  for (uint32_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] != kNoValue) dropUse(n.inputs[i], {node_id, i});
  }
  n.removed = true;
}

void collectCapturedNames(const Graph& subgraph, std::set<std::string>& names) {
  for (ValueId id : subgraph.outerScopeValues()) names.insert(subgraph.value(id).name);
  // A nested subgraph's reads resolve in the nearest graph that defines the
  // name: those `subgraph` defines itself are not read from outside it.
  std::set<std::string> nested_reads;
  for (NodeId id : subgraph.nodeIds()) {
    for (const Graph* nested : subgraph.node(id).subgraphs()) collectCapturedNames(*nested, nested_reads);
  }
  for (const std::string& name : nested_reads) {
    const auto own = subgraph.findValue(name);
    if (!own || subgraph.value(*own).kind == ValueKind::kOuterScope) names.insert(name);
  }
}

void collectSubgraphReads(const Graph& graph, std::set<std::string>& names) {
  for (NodeId id : graph.nodeIds()) {
    for (const Graph* sub : graph.node(id).subgraphs()) collectCapturedNames(*sub, names);
  }
}

std::vector<NodeId> Graph::topologicalOrder() const {
  // Kahn's algorithm over live nodes; a min-heap of ids keeps insertion order
  // among nodes that are ready at the same time. A node with subgraphs also
  // waits for the values they read by name (a Loop body reading a value
  // computed before the Loop).
  std::vector<uint32_t> pending(nodes_.size(), 0);
  std::map<ValueId, std::vector<NodeId>> capture_readers;
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (NodeId id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].removed) continue;
    for (ValueId input : nodes_[id].inputs) {
      if (input != kNoValue && values_[input].kind == ValueKind::kNodeOutput) ++pending[id];
    }
    std::set<std::string> captured;
    for (const Graph* sub : nodes_[id].subgraphs()) collectCapturedNames(*sub, captured);
    for (const std::string& name : captured) {
      const auto value = findValue(name);
      if (!value || values_[*value].kind != ValueKind::kNodeOutput || values_[*value].producer == id ||
          nodes_[values_[*value].producer].removed) {
        continue;
      }
      capture_readers[*value].push_back(id);
      ++pending[id];
    }
    if (pending[id] == 0) ready.push(id);
  }
  std::vector<NodeId> order;
  while (!ready.empty()) {
    const NodeId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (ValueId output : nodes_[id].outputs) {
      for (const Use& use : values_[output].users) {
        if (--pending[use.node] == 0) ready.push(use.node);
      }
      const auto readers = capture_readers.find(output);
      if (readers == capture_readers.end()) continue;
      for (NodeId reader : readers->second) {
        if (--pending[reader] == 0) ready.push(reader);
      }
    }
  }
  if (order.size() != nodeIds().size()) {
    std::vector<std::string> stuck;
    for (NodeId id = 0; id < nodes_.size(); ++id) {
      if (!nodes_[id].removed && pending[id] > 0) stuck.push_back(nodes_[id].name);
    }
    throw GraphError(fmt::format("graph '{}' has a cycle through nodes: {}", name_, fmt::join(stuck, ", ")));
  }
  return order;
}

std::string uniqueName(const Graph& graph, const std::string& base) {
  std::string name = base;
  for (int i = 1; graph.findValue(name); ++i) name = fmt::format("{}_{}", base, i);
  return name;
}

}  // namespace kiln
