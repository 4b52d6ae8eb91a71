#include "frontend/onnx/flex_attention_expansion.h"

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln {
namespace {

// What the expansion keeps of the FlexAttention node (which adding nodes to
// the graph may move).
struct FlexNode {
  NodeId id;
  std::string name;
  ValueId q, k, v, y;
  Attributes score_attributes;  // scale, softmax_precision
  GraphPtr score_mod, prob_mod;
};

[[noreturn]] void fail(const FlexNode& flex, const std::string& message) {
  throw GraphError(fmt::format("node '{}' (FlexAttention): {}", flex.name, message));
}

// Inlines the one-input, one-output `body` into `graph` with its input
// reading `input`; returns the value its output became.
ValueId inlineModifier(Graph& graph, const FlexNode& flex, const char* attribute, const Graph& body, ValueId input) {
  if (body.inputs().size() != 1 || body.outputs().size() != 1) {
    fail(flex, fmt::format("the {} subgraph must have one input and one output, found {} and {}", attribute,
                           body.inputs().size(), body.outputs().size()));
  }
  const std::string prefix = fmt::format("{}/{}/", flex.name, attribute);
  std::map<ValueId, ValueId> mapped{{body.inputs()[0], input}};
  for (ValueId id : body.initializers()) {
    mapped[id] = graph.addInitializer(uniqueName(graph, prefix + body.value(id).name), body.value(id).initializer);
  }
  for (ValueId id : body.outerScopeValues()) {
    const auto outer = graph.findValue(body.value(id).name);
    if (!outer) fail(flex, fmt::format("the {} subgraph reads '{}', which is not visible here", attribute, body.value(id).name));
    mapped[id] = *outer;
  }
  for (NodeId id : body.topologicalOrder()) {
    const Node& node = body.node(id);
    if (!node.subgraphs().empty()) {
      fail(flex, fmt::format("the {} subgraph's node '{}' ({}) has subgraphs of its own, which kiln does not inline",
                             attribute, node.name, node.op_type));
    }
    std::vector<ValueId> inputs;
    for (ValueId in : node.inputs) inputs.push_back(in == kNoValue ? kNoValue : mapped.at(in));
    std::vector<std::string> outputs;
    for (ValueId out : node.outputs) outputs.push_back(uniqueName(graph, prefix + body.value(out).name));
    const NodeId added = graph.addNode(node.op_type, inputs, outputs, node.attributes, node.domain);
    graph.node(added).name = prefix + node.name;
    for (size_t i = 0; i < node.outputs.size(); ++i) mapped[node.outputs[i]] = graph.node(added).outputs[i];
  }
  return mapped.at(body.outputs()[0]);
}

GraphPtr graphAttribute(const Node& node, const char* key) {
  const auto it = node.attributes.find(key);
  if (it == node.attributes.end()) return nullptr;
  const GraphPtr* graph = std::get_if<GraphPtr>(&it->second);
  if (graph == nullptr) throw GraphError(fmt::format("node '{}' (FlexAttention): attribute '{}' must be a graph", node.name, key));
  return *graph;
}

ValueId addOne(Graph& graph, const std::string& op, const std::string& domain, const std::vector<ValueId>& inputs,
               const std::string& output, Attributes attributes, const std::string& node_name) {
  const NodeId id = graph.addNode(op, inputs, {uniqueName(graph, output)}, std::move(attributes), domain);
  graph.node(id).name = node_name;
  return graph.node(id).outputs[0];
}

void expand(Graph& graph, const FlexNode& flex) {
  const std::string& p = flex.name;
  ValueId scores = addOne(graph, "FlexAttentionScores", "kiln", {flex.q, flex.k}, p + "/scores", flex.score_attributes,
                          p + "/scores");
  if (flex.score_mod) scores = inlineModifier(graph, flex, "score_mod", *flex.score_mod, scores);
  int64_t softmax = 1;  // FlexAttentionOutput applies it, unless prob_mod needs the probabilities
  if (flex.prob_mod) {
    scores = addOne(graph, "Softmax", "", {scores}, p + "/probs", {{"axis", int64_t{-1}}}, p + "/softmax");
    scores = inlineModifier(graph, flex, "prob_mod", *flex.prob_mod, scores);
    softmax = 0;
  }
  const ValueId y = addOne(graph, "FlexAttentionOutput", "kiln", {scores, flex.v}, p + "/Y", {{"softmax", softmax}},
                           p + "/output");
  // Y keeps its name (it may be a graph output, or read by name in a subgraph).
  const std::string name = graph.value(flex.y).name;
  graph.replaceAllUses(flex.y, y);
  graph.removeNode(flex.id);
  graph.renameValue(flex.y, uniqueName(graph, name + "/replaced"));
  graph.renameValue(y, name);
}

}  // namespace

int expandFlexAttentionModifiers(Graph& graph) {
  int count = 0;
  for (NodeId id : graph.nodeIds()) {
    for (auto& [key, attribute] : graph.node(id).attributes) {
      if (GraphPtr* sub = std::get_if<GraphPtr>(&attribute); sub && *sub) count += expandFlexAttentionModifiers(**sub);
      if (auto* subs = std::get_if<std::vector<GraphPtr>>(&attribute)) {
        for (GraphPtr& sub : *subs) count += sub ? expandFlexAttentionModifiers(*sub) : 0;
      }
    }
    const Node& node = graph.node(id);
    if (node.domain != "ai.onnx.preview" || node.op_type != "FlexAttention") continue;
    FlexNode flex{id, node.name.empty() ? "flex_attention" : node.name, kNoValue, kNoValue, kNoValue, kNoValue, {},
                  graphAttribute(node, "score_mod"), graphAttribute(node, "prob_mod")};
    if (!flex.score_mod && !flex.prob_mod) continue;
    if (node.inputs.size() != 3 || node.outputs.size() != 1) fail(flex, "takes Q, K and V and gives Y");
    flex.q = node.inputs[0];
    flex.k = node.inputs[1];
    flex.v = node.inputs[2];
    flex.y = node.outputs[0];
    if (flex.q == kNoValue || flex.k == kNoValue || flex.v == kNoValue) fail(flex, "Q, K and V are required");
    for (const char* key : {"scale", "softmax_precision"}) {
      if (const auto it = node.attributes.find(key); it != node.attributes.end()) flex.score_attributes.emplace(key, it->second);
    }
    expand(graph, flex);
    ++count;
  }
  return count;
}

}  // namespace kiln
