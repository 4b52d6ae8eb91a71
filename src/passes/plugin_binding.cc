#include "passes/plugin_binding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/json_escape.h"
#include "ops/op_schema.h"
#include "plugins/plugin_registry.h"

namespace kiln {
namespace {

std::string jsonNumber(const Node& node, const std::string& key, double value) {
  if (!std::isfinite(value)) {
    throw GraphError(fmt::format("node '{}' ({}.{}): attribute '{}' is {}, which the JSON handed to plugins cannot carry",
                                 node.name, node.domain, node.op_type, key, value));
  }
  return fmt::format("{:.17g}", value);
}

template <typename T, typename Format>
std::string jsonList(const std::vector<T>& items, Format format) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + format(items[i]);
  return out + "]";
}

// The node's attributes as one JSON object, keys in order.
std::string attributesJson(const Node& node) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, attribute] : node.attributes) {
    std::string value;
    if (const auto* i = std::get_if<int64_t>(&attribute)) {
      value = std::to_string(*i);
    } else if (const auto* f = std::get_if<float>(&attribute)) {
      value = jsonNumber(node, key, *f);
    } else if (const auto* s = std::get_if<std::string>(&attribute)) {
      value = "\"" + jsonEscape(*s) + "\"";
    } else if (const auto* is = std::get_if<std::vector<int64_t>>(&attribute)) {
      value = jsonList(*is, [](int64_t v) { return std::to_string(v); });
    } else if (const auto* fs = std::get_if<std::vector<float>>(&attribute)) {
      value = jsonList(*fs, [&](float v) { return jsonNumber(node, key, v); });
    } else if (const auto* ss = std::get_if<std::vector<std::string>>(&attribute)) {
      value = jsonList(*ss, [](const std::string& v) { return "\"" + jsonEscape(v) + "\""; });
    } else {
      throw GraphError(fmt::format("node '{}' ({}.{}): attribute '{}' is a tensor or a graph; plugin ops take numbers, "
                                   "strings and lists of them",
                                   node.name, node.domain, node.op_type, key));
    }
    out += fmt::format("{}\"{}\": {}", first ? "" : ", ", jsonEscape(key), value);
    first = false;
  }
  return out + "}";
}

int64_t opsetFor(const std::map<std::string, int64_t>& opsets, const std::string& domain) {
  const auto it = opsets.find(domain);
  return it == opsets.end() ? 1 : it->second;
}

void bindIn(Graph& graph, const std::map<std::string, int64_t>& opsets, std::vector<const PluginLibrary*>& used) {
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (node.removed) continue;
    for (auto& [key, attribute] : node.attributes) {
      if (auto* body = std::get_if<GraphPtr>(&attribute)) bindIn(**body, opsets, used);
      if (auto* bodies = std::get_if<std::vector<GraphPtr>>(&attribute)) {
        for (GraphPtr& body : *bodies) bindIn(*body, opsets, used);
      }
    }
    const int64_t version = opsetFor(opsets, node.domain);
    if (OpRegistry::global().find(node.domain, node.op_type, version) != nullptr) continue;
    const PluginOp* op = PluginRegistry::global().findOp(node.domain, node.op_type, version);
    if (op == nullptr) continue;
    Attributes params;
    params["plugin_domain"] = op->domain;
    params["plugin_op"] = op->name;
    params["plugin_version"] = int64_t{op->abi.since_version};
    params["plugin_library"] = op->library->name;
    params["attributes"] = attributesJson(node);
    params["plugin_stateless"] = int64_t{op->abi.is_stateless != 0};
    params["plugin_inplace"] = int64_t{op->abi.num_inplace};
    params["plugin_elementwise"] = int64_t{op->abi.is_elementwise != 0};
    node.attributes = std::move(params);
    node.domain = "kiln";
    node.op_type = "Plugin";
    if (std::find(used.begin(), used.end(), op->library) == used.end()) used.push_back(op->library);
  }
}

}  // namespace

std::vector<const PluginLibrary*> bindPluginOps(Graph& graph, const std::map<std::string, int64_t>& opsets) {
  std::vector<const PluginLibrary*> used;
  bindIn(graph, opsets, used);
  return used;
}

namespace {

void collectLibraries(const Graph& graph, std::vector<const PluginLibrary*>& used) {
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    if (node.removed) continue;
    for (const Graph* subgraph : node.subgraphs()) collectLibraries(*subgraph, used);
    if (!isPluginOp(node)) continue;
    const std::string name = node.stringAttribute("plugin_library", "");
    const PluginLibrary* library = PluginRegistry::global().findLibrary(name);
    if (library == nullptr) throw GraphError(fmt::format("node '{}': plugin library '{}' is not loaded", node.name, name));
    if (std::find(used.begin(), used.end(), library) == used.end()) used.push_back(library);
  }
}

}  // namespace

std::vector<const PluginLibrary*> usedPluginLibraries(const Graph& graph) {
  std::vector<const PluginLibrary*> used;
  collectLibraries(graph, used);
  return used;
}

bool isPluginOp(const Node& node) { return node.domain == "kiln" && node.op_type == "Plugin"; }

bool isStatelessPluginOp(const Node& node) {
  return isPluginOp(node) && node.intAttribute("plugin_stateless", 0) != 0;
}

}  // namespace kiln
