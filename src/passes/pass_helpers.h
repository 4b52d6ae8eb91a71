// Queries about a graph that several passes ask, and small editing helpers.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

// Values whose names a pass must keep: the graph's outputs (the model's output
// names) and the values that subgraphs of its nodes read by name, at any
// depth (those reads have no entry in Value::users).
std::set<ValueId> pinnedValues(const Graph& graph);

// Whether `id` is one of the graph's outputs.
bool isGraphOutput(const Graph& graph, ValueId id);

// Whether node `id` is `op` of the default domain with one output.
bool isOp(const Graph& graph, NodeId id, std::string_view op);

// The node that is the only reader of `value`, if it is `op` and `value` may
// disappear into a fused node (it is not in `pinned`).
std::optional<NodeId> onlyReader(const Graph& graph, const std::set<ValueId>& pinned, ValueId value,
                                 std::string_view op);

// The other input of binary node `id` when exactly one input is `value`;
// kNoValue otherwise.
ValueId otherOperand(const Graph& graph, NodeId id, ValueId value);

// The dimensions of `id` when its shape is static, or nothing.
std::optional<std::vector<int64_t>> staticShape(const Graph& graph, ValueId id);

// The initializer `id` holds, or nullptr (kNoValue, or not an initializer).
const Constant* initializerOf(const Graph& graph, ValueId id);

// Whether every byte of `c` is 0 (an all-zero zero point, say).
bool allZero(const Constant& c);

// The parameters of a QuantizeLinear or DequantizeLinear node `id` that
// quantizes per tensor to or from 8 bits: a one-element f32 initializer
// scale (positive, finite), a one-element zero point initializer of the
// integer type or none (0). `type` is the integer side's (u8 or i8).
struct PerTensorQuantization {
  float scale = 1;
  int32_t zero = 0;
  DType type = DType::kUndefined;
};
std::optional<PerTensorQuantization> perTensorQuantization(const Graph& graph, NodeId id);

// The value of a one-element f32 initializer of at most `rank` dimensions.
std::optional<float> scalarConstant(const Graph& graph, ValueId id, size_t rank);

// Every use of `from` (graph outputs included) reads `to` instead, and `to`
// takes `from`'s name, which the model's outputs and subgraphs go by;
// `from` becomes "<name><suffix>", unread. The usual end of a rewrite whose
// new value stands for an old one (whose producer the caller then removes).
void replaceKeepingName(Graph& graph, ValueId from, ValueId to, const std::string& suffix);

// Replaces `nodes`, in graph order, by one node of the kiln domain: the last
// node becomes `op` reading `inputs`, with `attributes` and the name `name`,
// so that its output keeps its value (name, type, graph-output slot); the
// others go. Every output of the others must be read only by `nodes`.
void replaceByFusedNode(Graph& graph, const std::vector<NodeId>& nodes, const std::string& op, Attributes attributes,
                        const std::vector<ValueId>& inputs, std::string name);

// Copies `node` of `from` into `to`: inputs through `mapped` (kNoValue stays
// kNoValue; every other input must be there), outputs added to `mapped`. The
// copy keeps the node's name, attributes (subgraphs shared), output names and
// types. Returns its id.
NodeId copyNode(const Graph& from, const Node& node, Graph& to, std::map<ValueId, ValueId>& mapped);

}  // namespace kiln
