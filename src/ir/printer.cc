// Graph::toString: the text form of the IR, for --print-ir and errors.
//
//   graph main(x: f32[1, 3], w: f32[3, 4] = constant) {
//     y: f32[1, 4] = MatMul(x, w)
//     z: f32[1, 4] = LeakyRelu(y) {alpha: 0.1}
//     return z
//   }
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/graph.h"

namespace kiln {
namespace {

void printGraph(const Graph& graph, int indent, std::string& out);

std::string valueName(const Graph& graph, ValueId id) {
  return id == kNoValue ? std::string("<none>") : graph.value(id).name;
}

std::string attributeText(const Attribute& attribute, int indent) {
  struct Printer {
    int indent;
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(float v) const { return fmt::format("{}", v); }
    std::string operator()(const std::string& v) const { return fmt::format("\"{}\"", v); }
    std::string operator()(const ConstantPtr& v) const {
      return v ? fmt::format("tensor {}{}", dtypeName(v->info.dtype), v->info.shapeString()) : "tensor <null>";
    }
    std::string operator()(const GraphPtr& v) const {
      std::string text;
      if (v) printGraph(*v, indent + 1, text);
      return "\n" + text + fmt::format("{:{}}", "", indent * 2);
    }
    std::string operator()(const std::vector<int64_t>& v) const { return fmt::format("[{}]", fmt::join(v, ", ")); }
    std::string operator()(const std::vector<float>& v) const { return fmt::format("[{}]", fmt::join(v, ", ")); }
    std::string operator()(const std::vector<std::string>& v) const {
      return fmt::format("[\"{}\"]", fmt::join(v, "\", \""));
    }
    std::string operator()(const std::vector<ConstantPtr>& v) const {
      std::vector<std::string> parts;
      for (const ConstantPtr& c : v) parts.push_back((*this)(c));
      return fmt::format("[{}]", fmt::join(parts, ", "));
    }
    std::string operator()(const std::vector<GraphPtr>& v) const {
      std::string text;
      for (const GraphPtr& g : v) text += (*this)(g);
      return text;
    }
  };
  return std::visit(Printer{indent}, attribute);
}

void printGraph(const Graph& graph, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent) * 2, ' ');
  std::vector<std::string> params;
  for (ValueId id : graph.inputs()) params.push_back(fmt::format("{}: {}", graph.value(id).name, graph.value(id).type.toString()));
  for (ValueId id : graph.initializers()) {
    params.push_back(fmt::format("{}: {} = constant", graph.value(id).name, graph.value(id).type.toString()));
  }
  for (ValueId id : graph.outerScopeValues()) params.push_back(fmt::format("{}: outer", graph.value(id).name));
  out += fmt::format("{}graph {}({}) {{\n", pad, graph.name(), fmt::join(params, ", "));
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    std::vector<std::string> results;
    for (ValueId output : node.outputs) {
      results.push_back(fmt::format("{}: {}", graph.value(output).name, graph.value(output).type.toString()));
    }
    std::vector<std::string> arguments;
    for (ValueId input : node.inputs) arguments.push_back(valueName(graph, input));
    std::string line = fmt::format("{}  {} = {}{}({})", pad, fmt::join(results, ", "),
                                   node.domain.empty() ? "" : node.domain + ".", node.op_type,
                                   fmt::join(arguments, ", "));
    if (!node.attributes.empty()) {
      std::vector<std::string> attributes;
      for (const auto& [key, value] : node.attributes) {
        attributes.push_back(fmt::format("{}: {}", key, attributeText(value, indent + 2)));
      }
      line += fmt::format(" {{{}}}", fmt::join(attributes, ", "));
    }
    out += line + "\n";
  }
  std::vector<std::string> outputs;
  for (ValueId id : graph.outputs()) outputs.push_back(valueName(graph, id));
  out += fmt::format("{}  return {}\n{}}}\n", pad, fmt::join(outputs, ", "), pad);
}

}  // namespace

std::string Graph::toString() const {
  std::string out;
  printGraph(*this, 0, out);
  return out;
}

}  // namespace kiln
