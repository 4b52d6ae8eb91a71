#include "passes/plugin_binding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/json_escape.h"
#include "kiln/plugin.h"
#include "ops/op_schema.h"
#include "passes/pass_helpers.h"
#include "plugins/plugin_instance.h"
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
  for (const auto& entry : node.attributes) {
    const std::string& key = entry.first;  // not a structured binding: lambdas below capture it
    const Attribute& attribute = entry.second;
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

// What a composite op's build() adds its body with (KilnGraphBuilder's
// context): the graph, and the values by id (the node's inputs first).
struct CompositeBuild {
  Graph* graph = nullptr;
  const Node* node = nullptr;  // a copy, stable while nodes are added
  std::vector<ValueId> values;
  std::string prefix;
};

std::string copyError(char* error, size_t capacity, const std::string& message) {
  if (error != nullptr && capacity > 0) std::snprintf(error, capacity, "%s", message.c_str());
  return message;
}

Attribute attributeOf(const KilnAttribute& a) {
  if (a.name == nullptr) throw GraphError("an attribute without a name");
  const auto count = static_cast<size_t>(std::max(a.count, 0));
  switch (a.kind) {
    case KILN_ATTRIBUTE_INT: return a.i;
    case KILN_ATTRIBUTE_FLOAT: return static_cast<float>(a.f);
    case KILN_ATTRIBUTE_STRING: return std::string(a.s == nullptr ? "" : a.s);
    case KILN_ATTRIBUTE_INTS: return std::vector<int64_t>(a.ints, a.ints + (a.ints == nullptr ? 0 : count));
    case KILN_ATTRIBUTE_FLOATS: {
      std::vector<float> floats;
      for (size_t i = 0; a.floats != nullptr && i < count; ++i) floats.push_back(static_cast<float>(a.floats[i]));
      return floats;
    }
    default: throw GraphError(fmt::format("attribute '{}' has the unknown kind {}", a.name, a.kind));
  }
}

int addBodyNode(void* context, const char* domain, const char* op_type, const int32_t* inputs, int32_t input_count,
                const KilnAttribute* attributes, int32_t attribute_count, int32_t* outputs, int32_t output_count,
                char* error, size_t capacity) {
  auto& build = *static_cast<CompositeBuild*>(context);
  try {
    if (op_type == nullptr || op_type[0] == '\0') throw GraphError("a node without an op_type");
    if (input_count < 0 || input_count > 64 || output_count < 1 || output_count > 64) {
      throw GraphError(fmt::format("{}: {} inputs and {} outputs", op_type, input_count, output_count));
    }
    std::vector<ValueId> operands;
    for (int32_t i = 0; i < input_count; ++i) {
      const int32_t id = inputs[i];
      if (id == -1) {
        operands.push_back(kNoValue);
        continue;
      }
      if (id < 0 || static_cast<size_t>(id) >= build.values.size()) {
        throw GraphError(fmt::format("{}: input {} is value {}, which does not exist", op_type, i, id));
      }
      operands.push_back(build.values[id]);
    }
    Attributes node_attributes;
    for (int32_t i = 0; i < attribute_count; ++i) node_attributes[attributes[i].name] = attributeOf(attributes[i]);
    std::vector<std::string> names;
    for (int32_t i = 0; i < output_count; ++i) names.push_back(uniqueName(*build.graph, build.prefix + "/" + op_type));
    const NodeId id = build.graph->addNode(op_type, operands, names, std::move(node_attributes), domain == nullptr ? "" : domain);
    build.graph->node(id).name = uniqueName(*build.graph, build.prefix + "/" + op_type);
    for (int32_t i = 0; i < output_count; ++i) {
      outputs[i] = static_cast<int32_t>(build.values.size());
      build.values.push_back(build.graph->node(id).outputs[i]);
    }
    return 0;
  } catch (const Error& e) {
    copyError(error, capacity, e.what());
    return 1;
  }
}

int addBodyConstant(void* context, const KilnTensorType* type, const void* data, int32_t* value, char* error,
                    size_t capacity) {
  auto& build = *static_cast<CompositeBuild*>(context);
  try {
    if (type == nullptr || type->rank < 0 || type->rank > KILN_PLUGIN_MAX_RANK) throw GraphError("a constant of no valid rank");
    TensorInfo info;
    info.dtype = static_cast<DType>(type->dtype);
    if (type->dtype <= 0 || type->dtype > 255 || dtypeSize(info.dtype) == 0) {
      throw GraphError(fmt::format("a constant of the unknown dtype {}", type->dtype));
    }
    for (int32_t d = 0; d < type->rank; ++d) {
      if (type->dims[d] < 0) throw GraphError(fmt::format("a constant with the dimension {}", type->dims[d]));
      info.shape.push_back(type->dims[d]);
    }
    const uint64_t bytes = info.sizeInBytes();
    if (bytes > (uint64_t{1} << 32)) throw GraphError(fmt::format("a constant of {} bytes", bytes));
    if (data == nullptr && bytes > 0) throw GraphError("a constant without data");
    std::vector<std::byte> copy(bytes);
    if (bytes > 0) std::memcpy(copy.data(), data, bytes);
    const ValueId id = build.graph->addInitializer(uniqueName(*build.graph, build.prefix + "/constant"),
                                                   makeConstant(std::move(info), std::move(copy)));
    *value = static_cast<int32_t>(build.values.size());
    build.values.push_back(id);
    return 0;
  } catch (const Error& e) {
    copyError(error, capacity, e.what());
    return 1;
  }
}

// Replaces composite op `op`'s node `id` by the body its build() makes.
void expandComposite(Graph& graph, NodeId id, const PluginOp& op) {
  const Node node = graph.node(id);
  CompositeBuild build{&graph, &node, node.inputs, node.name.empty() ? op.name : node.name};
  const KilnGraphBuilder builder{sizeof(KilnGraphBuilder), &build, &addBodyNode, &addBodyConstant};
  const PluginInstance instance(op, attributesJson(node));
  std::vector<int32_t> inputs(node.inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = node.inputs[i] == kNoValue ? -1 : static_cast<int32_t>(i);
  std::vector<int32_t> outputs(node.outputs.size(), -1);
  char error[512] = {0};
  if (op.abi.build(instance.state(), &builder, inputs.data(), static_cast<int32_t>(inputs.size()), outputs.data(),
                   static_cast<int32_t>(outputs.size()), error, sizeof error) != 0) {
    throw GraphError(fmt::format("node '{}': {}: build failed: {}", node.name, op.describe(),
                                 callbackMessage(error, sizeof error)));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i] < 0 || static_cast<size_t>(outputs[i]) >= build.values.size() || build.values[outputs[i]] == kNoValue) {
      throw GraphError(fmt::format("node '{}': {}: build gave output {} the value id {}", node.name, op.describe(), i,
                                   outputs[i]));
    }
    ValueId body_output = build.values[outputs[i]];
    // An output that is an input or a constant still needs a node of its own.
    if (graph.value(body_output).kind != ValueKind::kNodeOutput) {
      body_output = graph.node(graph.addNode("Identity", {body_output}, {uniqueName(graph, build.prefix + "/output")}))
                        .outputs[0];
    }
    replaceKeepingName(graph, node.outputs[i], body_output, "/composite");
  }
  graph.removeNode(id);
}

int64_t opsetFor(const std::map<std::string, int64_t>& opsets, const std::string& domain) {
  const auto it = opsets.find(domain);
  return it == opsets.end() ? 1 : it->second;
}

// Binds the plugin ops of `graph` (and its subgraphs); returns how many
// composite nodes it expanded (their bodies may hold plugin ops in turn).
size_t bindIn(Graph& graph, const std::map<std::string, int64_t>& opsets, std::vector<const PluginLibrary*>& used) {
  size_t expanded = 0;
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (node.removed) continue;
    for (auto& [key, attribute] : node.attributes) {
      if (auto* body = std::get_if<GraphPtr>(&attribute)) expanded += bindIn(**body, opsets, used);
      if (auto* bodies = std::get_if<std::vector<GraphPtr>>(&attribute)) {
        for (GraphPtr& body : *bodies) expanded += bindIn(*body, opsets, used);
      }
    }
    const int64_t version = opsetFor(opsets, node.domain);
    if (OpRegistry::global().find(node.domain, node.op_type, version) != nullptr) continue;
    const PluginOp* op = PluginRegistry::global().findOp(node.domain, node.op_type, version);
    if (op == nullptr) continue;
    if (op->abi.build != nullptr) {
      expandComposite(graph, id, *op);
      ++expanded;
      continue;
    }
    node.attributes = boundPluginAttributes(*op, attributesJson(node));
    node.domain = "kiln";
    node.op_type = "Plugin";
    if (std::find(used.begin(), used.end(), op->library) == used.end()) used.push_back(op->library);
  }
  return expanded;
}

}  // namespace

Attributes boundPluginAttributes(const PluginOp& op, const std::string& attributes_json) {
  Attributes params;
  params["plugin_domain"] = op.domain;
  params["plugin_op"] = op.name;
  params["plugin_version"] = int64_t{op.abi.since_version};
  params["plugin_library"] = op.library->name;
  params["attributes"] = attributes_json;
  params["plugin_stateless"] = int64_t{op.abi.is_stateless != 0};
  params["plugin_inplace"] = int64_t{op.abi.num_inplace};
  params["plugin_elementwise"] = int64_t{op.abi.is_elementwise != 0};
  if (!op.gradient_op.empty()) {
    params["plugin_gradient"] = op.gradient_op;
    params["plugin_separate_gradients"] = int64_t{op.abi.separate_gradients != 0};
  }
  return params;
}

std::vector<const PluginLibrary*> bindPluginOps(Graph& graph, const std::map<std::string, int64_t>& opsets) {
  // Composite bodies may use composite ops in turn: a few rounds, no more
  // (a body that builds its own op would never end).
  constexpr int kMaxRounds = 16;
  std::vector<const PluginLibrary*> used;
  for (int round = 0; round < kMaxRounds; ++round) {
    if (bindIn(graph, opsets, used) == 0) return used;
  }
  throw GraphError(fmt::format("composite plugin ops still expand after {} rounds: a body builds its own op", kMaxRounds));
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
