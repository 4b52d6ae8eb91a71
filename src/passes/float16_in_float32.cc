#include "passes/float16_in_float32.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/float_formats.h"

namespace kiln {
namespace {

constexpr int64_t kOnnxFloat = 1;
constexpr int64_t kOnnxFloat16 = 10;

ConstantPtr toFloat32(const Constant& half) {
  const uint64_t count = half.info.numElements();
  std::vector<std::byte> bytes(count * sizeof(float));
  for (uint64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, half.bytes.data() + i * 2, 2);
    const float value = halfToFloat(bits);
    std::memcpy(bytes.data() + i * sizeof(float), &value, sizeof value);
  }
  return makeConstant(TensorInfo{DType::kF32, half.info.shape}, std::move(bytes));
}

// A name not yet taken in `graph`, from `base`.
std::string freshName(const Graph& graph, std::string base) {
  while (graph.findValue(base)) base += "'";
  return base;
}

// Every reader of `from` (graph outputs included), except node `except`,
// reads `to` instead.
void redirectUses(Graph& graph, ValueId from, ValueId to, NodeId except) {
  const std::vector<Use> users = graph.value(from).users;
  for (const Use& use : users) {
    if (use.node != except) graph.setNodeInput(use.node, use.input_index, to);
  }
  for (size_t i = 0; i < graph.outputs().size(); ++i) {
    if (graph.outputs()[i] == from) graph.setOutput(i, to);
  }
}

// Adds `value_f16` -> Cast(to f32) and makes its readers read the result.
void castToFloat32After(Graph& graph, ValueId value) {
  const std::string name = freshName(graph, graph.value(value).name + ":f32");
  const NodeId cast = graph.addNode("Cast", {value}, {name}, Attributes{{"to", kOnnxFloat}});
  const ValueId result = graph.node(cast).outputs[0];
  graph.value(result).type = graph.value(value).type;
  graph.value(result).type.dtype = DType::kF32;
  redirectUses(graph, value, result, cast);
}

size_t convertScope(Graph& graph, bool main) {
  size_t converted = 0;
  for (ValueId id : graph.initializers()) {
    Value& value = graph.value(id);
    if (!value.initializer || value.initializer->info.dtype != DType::kF16) continue;
    value.initializer = toFloat32(*value.initializer);
    value.type.dtype = DType::kF32;
    ++converted;
  }
  for (ValueId id : graph.outerScopeValues()) {
    if (graph.value(id).type.dtype == DType::kF16) graph.value(id).type.dtype = DType::kF32;
  }
  if (!main) {
    for (ValueId id : graph.inputs()) {
      if (graph.value(id).type.dtype == DType::kF16) graph.value(id).type.dtype = DType::kF32;
    }
  }
  std::vector<ValueId> rounded;  // outputs of the model's own Casts to f16
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    for (auto& [key, attribute] : node.attributes) {
      if (auto* sub = std::get_if<GraphPtr>(&attribute); sub && *sub) converted += convertScope(**sub, false);
      if (auto* tensor = std::get_if<ConstantPtr>(&attribute); tensor && *tensor && (*tensor)->info.dtype == DType::kF16) {
        *tensor = toFloat32(**tensor);
      }
      if (auto* type = std::get_if<int64_t>(&attribute); type && key == "dtype" && *type == kOnnxFloat16) {
        *type = kOnnxFloat;
      }
    }
    const bool cast_to_half = node.domain.empty() && node.op_type == "Cast" && node.intAttribute("to", 0) == kOnnxFloat16;
    if (cast_to_half) {  // whether or not the model typed its output
      rounded.push_back(node.outputs[0]);
      continue;
    }
    for (ValueId output : node.outputs) {
      if (output == kNoValue || graph.value(output).type.dtype != DType::kF16) continue;
      graph.value(output).type.dtype = DType::kF32;
      ++converted;
    }
  }
  for (ValueId value : rounded) castToFloat32After(graph, value);
  return converted;
}

}  // namespace

size_t computeFloat16InFloat32(Graph& graph) {
  bool any = false;
  for (ValueId id = 0; id < graph.valueCount() && !any; ++id) any = graph.value(id).type.dtype == DType::kF16;
  if (!any) return 0;
  std::vector<bool> half_output;
  for (ValueId id : graph.outputs()) half_output.push_back(graph.value(id).type.dtype == DType::kF16);
  const std::vector<ValueId> inputs = graph.inputs();
  size_t converted = convertScope(graph, true);
  for (ValueId input : inputs) {
    if (graph.value(input).type.dtype == DType::kF16) castToFloat32After(graph, input);
  }
  for (size_t i = 0; i < half_output.size(); ++i) {
    if (!half_output[i]) continue;
    const ValueId value = graph.outputs()[i];
    if (graph.value(value).type.dtype == DType::kF16) continue;  // a Cast to f16 or an f16 input: already so
    const std::string name = freshName(graph, graph.value(value).name + ":f16");
    const NodeId cast = graph.addNode("Cast", {value}, {name}, Attributes{{"to", kOnnxFloat16}});
    const ValueId result = graph.node(cast).outputs[0];
    graph.value(result).type = graph.value(value).type;
    graph.value(result).type.dtype = DType::kF16;
    graph.setOutput(i, result);
  }
  return converted;
}

}  // namespace kiln
