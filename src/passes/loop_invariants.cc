#include "passes/loop_invariants.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

bool isRandom(const Node& node) {
  static const std::set<std::string> kRandom = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                "RandomUniformLike", "Bernoulli", "Multinomial"};
  return kRandom.contains(node.op_type);
}

bool isBodyOutput(const Graph& body, ValueId id) {
  return std::find(body.outputs().begin(), body.outputs().end(), id) != body.outputs().end();
}

// The body's outer-scope value named `name` (made when missing); kNoValue
// when the body has another value of that name.
ValueId outerValue(Graph& body, const std::string& name, const ValueType& type) {
  if (const auto existing = body.findValue(name)) {
    return body.value(*existing).kind == ValueKind::kOuterScope ? *existing : kNoValue;
  }
  return body.addOuterScopeValue(name, type);
}

// Points every node input reading `from` at `to` (graph outputs unchanged).
size_t redirectReads(Graph& body, ValueId from, ValueId to) {
  const std::vector<Use> users = body.value(from).users;
  for (const Use& use : users) body.setNodeInput(use.node, use.input_index, to);
  return users.size();
}

// Step 1 (see the header): unchanged carried values read from outside.
size_t readUnchangedFromOutside(const Graph& graph, const Node& loop, Graph& body) {
  size_t changed = 0;
  const size_t carried = body.inputs().size() - 2;
  for (size_t k = 0; k < carried && 1 + k < body.outputs().size(); ++k) {
    const ValueId input = body.inputs()[2 + k];
    if (body.outputs()[1 + k] != input || 2 + k >= loop.inputs.size() || loop.inputs[2 + k] == kNoValue) continue;
    if (body.value(input).users.empty()) continue;
    const Value& initial = graph.value(loop.inputs[2 + k]);
    // Exporters often give the carried input the initial value's own name
    // (Paddle's do): the body input then hides the outer value. Renaming the
    // input frees the name; body inputs are bound by position, and a nested
    // subgraph reading the name still gets the same (unchanged) tensor.
    if (body.value(input).name == initial.name) body.renameValue(input, uniqueName(body, initial.name + ":carried"));
    const ValueId outer = outerValue(body, initial.name, initial.type);
    if (outer != kNoValue) changed += redirectReads(body, input, outer);
  }
  return changed;
}

// Whether body node `id` can move into `graph` (step 2).
bool movable(const Graph& graph, const Graph& body, NodeId id) {
  const Node& node = body.node(id);
  if (!node.domain.empty() || !node.subgraphs().empty() || isRandom(node) || node.outputs.empty()) return false;
  for (ValueId input : node.inputs) {
    if (input == kNoValue) continue;
    const Value& value = body.value(input);
    if (value.kind == ValueKind::kInitializer) continue;
    if (value.kind != ValueKind::kOuterScope || !graph.findValue(value.name)) return false;
  }
  for (ValueId output : node.outputs) {
    if (isBodyOutput(body, output) || graph.findValue(body.value(output).name)) return false;
  }
  return true;
}

// Moves body node `id` into `graph`; the body reads its outputs by name.
void moveOut(Graph& graph, Graph& body, NodeId id) {
  const Node node = body.node(id);
  std::vector<ValueId> inputs;
  for (ValueId input : node.inputs) {
    if (input == kNoValue) {
      inputs.push_back(kNoValue);
    } else if (body.value(input).kind == ValueKind::kInitializer) {
      inputs.push_back(graph.addInitializer(uniqueName(graph, body.value(input).name), body.value(input).initializer));
    } else {
      inputs.push_back(*graph.findValue(body.value(input).name));
    }
  }
  std::vector<std::string> names;
  for (ValueId output : node.outputs) names.push_back(body.value(output).name);
  const NodeId moved = graph.addNode(node.op_type, inputs, names, node.attributes, node.domain);
  graph.node(moved).name = node.name;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ValueId output = node.outputs[i];
    const ValueType type = body.value(output).type;
    graph.value(graph.node(moved).outputs[i]).type = type;
    body.renameValue(output, uniqueName(body, names[i] + ":moved"));
    redirectReads(body, output, body.addOuterScopeValue(names[i], type));
  }
  body.removeNode(id);
}

}  // namespace

size_t hoistLoopInvariants(Graph& graph) {
  size_t changed = 0;
  for (NodeId id : graph.nodeIds()) {
    Node& loop = graph.node(id);
    if (!loop.domain.empty() || loop.op_type != "Loop") continue;
    const auto attribute = loop.attributes.find("body");
    if (attribute == loop.attributes.end() || !std::holds_alternative<GraphPtr>(attribute->second)) continue;
    const GraphPtr& shared = std::get<GraphPtr>(attribute->second);
    if (!shared || shared->inputs().size() < 2) continue;
    auto body = std::make_shared<Graph>(*shared);
    size_t moved = readUnchangedFromOutside(graph, loop, *body);
    for (bool again = true; again;) {
      again = false;
      for (NodeId node : body->topologicalOrder()) {
        if (!movable(graph, *body, node)) continue;
        moveOut(graph, *body, node);
        ++moved;
        again = true;
      }
    }
    if (moved == 0) continue;
    // (addNode may have moved the graph's nodes: look the Loop up again.)
    graph.node(id).attributes["body"] = GraphPtr(body);
    changed += moved;
  }
  return changed;
}

}  // namespace kiln
