#include "passes/expression_expansion.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/error.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// ONNX operator of each one-argument function.
const std::map<std::string, std::string>& unaryFunctions() {
  static const std::map<std::string, std::string> functions = {
      {"abs", "Abs"},   {"acos", "Acos"},   {"asin", "Asin"},     {"atan", "Atan"},   {"ceil", "Ceil"},
      {"cos", "Cos"},   {"cosh", "Cosh"},   {"erf", "Erf"},       {"exp", "Exp"},     {"floor", "Floor"},
      {"log", "Log"},   {"neg", "Neg"},     {"reciprocal", "Reciprocal"}, {"relu", "Relu"}, {"round", "Round"},
      {"sigmoid", "Sigmoid"}, {"sign", "Sign"}, {"sin", "Sin"},   {"sinh", "Sinh"},   {"softplus", "Softplus"},
      {"sqrt", "Sqrt"}, {"tan", "Tan"},     {"tanh", "Tanh"}};
  return functions;
}
const std::map<std::string, std::string>& binaryFunctions() {
  static const std::map<std::string, std::string> functions = {{"max", "Max"}, {"min", "Min"}, {"pow", "Pow"}};
  return functions;
}

// Parses the text and adds one node per operation to the graph as it goes
// (recursive descent; each parse function returns the value it computed).
class ExpressionParser {
 public:
  ExpressionParser(Graph& graph, const Node& node, std::map<std::string, ValueId> names, int64_t opset)
      : graph_(graph), node_(node), names_(std::move(names)), text_(node.stringAttribute("expression", "")),
        opset_(opset) {}

  ValueId parse() {
    if (text_.find_first_not_of(" \t") == std::string::npos) fail("the expression is empty");
    const ValueId result = parseSum();
    skipSpace();
    if (at_ < text_.size()) fail(fmt::format("unexpected '{}'", text_[at_]));
    return result;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GraphError(fmt::format("node '{}' (kiln.Expression): expression \"{}\" column {}: {}", node_.name, text_,
                                 at_ + 1, what));
  }
  void skipSpace() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool accept(char c) {
    skipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }

  ValueId emit(const std::string& op, std::vector<ValueId> inputs) {
    const std::string name = uniqueName(graph_, node_.name.empty() ? "expression" : node_.name + "/" + op);
    return graph_.node(graph_.addNode(op, inputs, {name})).outputs[0];
  }

  // sum := product (('+' | '-') product)*
  ValueId parseSum() {
    ValueId left = parseProduct();
    for (;;) {
      if (accept('+')) {
        left = emit("Add", {left, parseProduct()});
      } else if (accept('-')) {
        left = emit("Sub", {left, parseProduct()});
      } else {
        return left;
      }
    }
  }
  // product := unary (('*' | '/') unary)*
  ValueId parseProduct() {
    ValueId left = parseUnary();
    for (;;) {
      if (accept('*')) {
        left = emit("Mul", {left, parseUnary()});
      } else if (accept('/')) {
        left = emit("Div", {left, parseUnary()});
      } else {
        return left;
      }
    }
  }
  // unary := '-' unary | '+' unary | power
  ValueId parseUnary() {
    if (accept('-')) return emit("Neg", {parseUnary()});
    if (accept('+')) return parseUnary();
    return parsePower();
  }
  // power := primary ('^' unary)?   (right-associative: 2^3^2 = 2^9)
  ValueId parsePower() {
    const ValueId base = parsePrimary();
    if (accept('^')) return emit("Pow", {base, parseUnary()});
    return base;
  }
  // primary := number | name | function '(' arguments ')' | '(' sum ')'
  ValueId parsePrimary() {
    skipSpace();
    if (at_ >= text_.size()) fail("expected an operand, found the end");
    const char c = text_[at_];
    if (c == '(') {
      ++at_;
      const ValueId inner = parseSum();
      expect(')');
      return inner;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return parseNumber();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return parseName();
    fail(fmt::format("expected an operand, found '{}'", c));
  }
  ValueId parseNumber() {
    const size_t start = at_;
    const char* begin = text_.c_str() + at_;
    char* end = nullptr;
    const double value = std::strtod(begin, &end);
    if (end == begin) fail("malformed number");
    at_ += static_cast<size_t>(end - begin);
    // In the first input's element type (the expression's type): written
    // in f64 and Cast to that type when it is known already (constant
    // folding folds the Cast), else CastLike'd to it (opset 15 on), else
    // f32.
    const DType dtype = graph_.value(node_.inputs.at(0)).type.dtype;
    const bool cast = dtype != DType::kF32 && (dtype != DType::kUndefined || opset_ >= 15);
    const std::string base = fmt::format("{}/constant_{}", node_.name.empty() ? "expression" : node_.name, start);
    const ValueId constant =
        graph_.addInitializer(uniqueName(graph_, base), cast ? scalar(value) : scalar(static_cast<float>(value)));
    if (!cast) return constant;
    if (dtype == DType::kUndefined) return emit("CastLike", {constant, node_.inputs.at(0)});
    const std::string name = uniqueName(graph_, base + "/cast");
    return graph_.node(graph_.addNode("Cast", {constant}, {name}, {{"to", static_cast<int64_t>(dtype)}})).outputs[0];
  }
  ValueId parseName() {
    const size_t start = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_' ||
                                  text_[at_] == '.' || text_[at_] == ':' || text_[at_] == '/')) {
      ++at_;
    }
    const std::string name = text_.substr(start, at_ - start);
    skipSpace();
    if (at_ < text_.size() && text_[at_] == '(') {
      ++at_;
      if (const auto unary = unaryFunctions().find(name); unary != unaryFunctions().end()) {
        const ValueId argument = parseSum();
        expect(')');
        return emit(unary->second, {argument});
      }
      if (const auto binary = binaryFunctions().find(name); binary != binaryFunctions().end()) {
        const ValueId first = parseSum();
        expect(',');
        const ValueId second = parseSum();
        expect(')');
        return emit(binary->second, {first, second});
      }
      at_ = start;
      fail(fmt::format("unknown function '{}'", name));
    }
    const auto input = names_.find(name);
    if (input == names_.end()) {
      at_ = start;
      std::string known;
      for (const auto& [input_name, value] : names_) known += (known.empty() ? "" : ", ") + input_name;
      fail(fmt::format("'{}' is not an input of the node (its inputs: {})", name, known));
    }
    return input->second;
  }

  template <typename T>
  static ConstantPtr scalar(T value) {
    std::vector<std::byte> bytes(sizeof value);
    std::memcpy(bytes.data(), &value, sizeof value);
    return makeConstant(TensorInfo{std::is_same_v<T, double> ? DType::kF64 : DType::kF32, {}}, std::move(bytes));
  }

  Graph& graph_;
  const Node& node_;
  std::map<std::string, ValueId> names_;
  std::string text_;
  int64_t opset_;
  size_t at_ = 0;
};

void expandNode(Graph& graph, NodeId id, int64_t opset) {
  const Node node = graph.node(id);  // a copy: adding nodes moves the graph's storage
  if (node.outputs.size() != 1) {
    throw GraphError(fmt::format("node '{}' (kiln.Expression) has {} outputs, 1 expected", node.name, node.outputs.size()));
  }
  if (node.inputs.empty()) throw GraphError(fmt::format("node '{}' (kiln.Expression) has no inputs", node.name));
  const std::vector<std::string> given = node.hasAttribute("input_names")
                                             ? std::get<std::vector<std::string>>(node.attributes.at("input_names"))
                                             : std::vector<std::string>{};
  if (!given.empty() && given.size() != node.inputs.size()) {
    throw GraphError(fmt::format("node '{}' (kiln.Expression): input_names has {} names for {} inputs", node.name,
                                 given.size(), node.inputs.size()));
  }
  std::map<std::string, ValueId> names;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue) throw GraphError(fmt::format("node '{}' (kiln.Expression): input {} is omitted", node.name, i));
    names[given.empty() ? graph.value(node.inputs[i]).name : given[i]] = node.inputs[i];
  }
  ExpressionParser parser(graph, node, names, opset);
  ValueId result = parser.parse();
  // An expression that is one of its inputs still needs a node of its own.
  if (graph.value(result).kind != ValueKind::kNodeOutput || result == node.inputs[0]) {
    result = graph.node(graph.addNode("Identity", {result}, {uniqueName(graph, node.name + "/identity")})).outputs[0];
  }
  replaceKeepingName(graph, node.outputs[0], result, "/expression");
  graph.removeNode(id);
}

}  // namespace

size_t expandExpressions(Graph& graph, int64_t opset) {
  size_t count = 0;
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (node.removed) continue;
    for (auto& [key, attribute] : node.attributes) {
      if (auto* body = std::get_if<GraphPtr>(&attribute)) count += expandExpressions(**body, opset);
      if (auto* bodies = std::get_if<std::vector<GraphPtr>>(&attribute)) {
        for (GraphPtr& body : *bodies) count += expandExpressions(*body, opset);
      }
    }
    if (node.domain == "kiln" && node.op_type == "Expression") {
      expandNode(graph, id, opset);
      ++count;
    }
  }
  return count;
}

}  // namespace kiln
