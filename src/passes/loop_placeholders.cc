#include "passes/loop_placeholders.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kiln {
namespace {

// The value of a one-element integer or bool initializer, as nonzero-ness
// for bool and as a number otherwise; nullopt when `id` is not one.
std::optional<int64_t> constantScalar(const Graph& graph, ValueId id) {
  const Value& value = graph.value(id);
  if (!value.initializer || value.initializer->info.numElements() != 1) return std::nullopt;
  const Constant& c = *value.initializer;
  switch (c.info.dtype) {
    case DType::kBool: return c.bytes[0] != std::byte{0} ? 1 : 0;
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, c.bytes.data(), sizeof v);
      return v;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, c.bytes.data(), sizeof v);
      return v;
    }
    default: return std::nullopt;
  }
}

// Whether Loop node `node` runs its body at least once, whatever the inputs.
bool runsAtLeastOnce(const Graph& graph, const Node& node) {
  const bool trip_ok = node.inputs.empty() || node.inputs[0] == kNoValue ||
                       constantScalar(graph, node.inputs[0]).value_or(0) >= 1;
  const bool cond_ok = node.inputs.size() < 2 || node.inputs[1] == kNoValue ||
                       constantScalar(graph, node.inputs[1]).value_or(0) != 0;
  return trip_ok && cond_ok;
}


// Whether the body reads `input` (directly, as an output, or from a nested subgraph).
bool bodyReads(const Graph& body, ValueId input) {
  if (!body.value(input).users.empty()) return true;
  if (std::find(body.outputs().begin(), body.outputs().end(), input) != body.outputs().end()) return true;
  std::set<std::string> captured;
  collectSubgraphReads(body, captured);
  return captured.contains(body.value(input).name);
}

}  // namespace

size_t fillLoopPlaceholders(Graph& graph) {
  size_t replaced = 0;
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (!node.domain.empty() || node.op_type != "Loop" || !runsAtLeastOnce(graph, node)) continue;
    const auto it = node.attributes.find("body");
    if (it == node.attributes.end() || !std::holds_alternative<GraphPtr>(it->second)) continue;
    const Graph& body = *std::get<GraphPtr>(it->second);
    const size_t carried = node.inputs.size() - 2;
    if (body.inputs().size() != carried + 2 || body.outputs().size() < carried + 1) continue;
    for (size_t k = 0; k < carried; ++k) {
      const ValueId initial = node.inputs[2 + k];
      if (initial == kNoValue) continue;
      const ValueType& given = body.value(body.outputs()[1 + k]).type;
      const auto info = given.tensorInfo();
      if (!info || !info->isStatic() || graph.value(initial).type == given) continue;
      if (bodyReads(body, body.inputs()[2 + k])) continue;
      std::string name = graph.value(initial).name + ":placeholder";
      while (graph.findValue(name)) name += "'";
      const ValueId zeros = graph.addInitializer(name, makeConstant(*info, std::vector<std::byte>(info->sizeInBytes())));
      graph.setNodeInput(id, static_cast<uint32_t>(2 + k), zeros);
      ++replaced;
    }
  }
  return replaced;
}

}  // namespace kiln
