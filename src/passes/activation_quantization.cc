#include "passes/activation_quantization.h"

#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "passes/activation_match.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

constexpr int64_t kMaxDepth = 8192;  // kDynamicInt8MaxDepth, kernels/cpu/dynamic_int8_matmul.h
constexpr int64_t kOnnxFloat = 1;    // TensorProto.FLOAT, Cast's `to` for f32

const Constant* initializerOf(const Graph& graph, ValueId id) {
  if (id == kNoValue) return nullptr;
  const Value& value = graph.value(id);
  return value.kind == ValueKind::kInitializer ? value.initializer.get() : nullptr;
}

// `c` as n values, one per column: an f32 constant of one value (repeated)
// or of n values along its last axis, every other dimension 1, of rank at
// most `max_rank` (so that broadcasting it adds no dimension).
std::optional<std::vector<float>> perColumn(const Constant* c, int64_t n, size_t max_rank) {
  if (c == nullptr || c->info.dtype != DType::kF32 || c->info.shape.size() > max_rank) return std::nullopt;
  const std::vector<int64_t>& dims = c->info.shape;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (dims[i] != 1) return std::nullopt;
  }
  const auto count = static_cast<int64_t>(c->info.numElements());
  std::vector<float> values(static_cast<size_t>(count));
  if (count > 0) std::memcpy(values.data(), c->bytes.data(), values.size() * sizeof(float));
  if (count == 1) return std::vector<float>(static_cast<size_t>(n), values[0]);
  if (count == n) return values;
  return std::nullopt;
}

bool allZero(const Constant& c) {
  for (std::byte b : c.bytes) {
    if (b != std::byte{0}) return false;
  }
  return true;
}

struct Int8Weights {
  ValueId w = kNoValue;      // the i8 initializer [k, n]
  std::vector<float> scale;  // n values
};

const Constant* int8Matrix(const Graph& graph, ValueId id) {
  const Constant* c = initializerOf(graph, id);
  return c != nullptr && c->info.dtype == DType::kI8 && c->info.shape.size() == 2 ? c : nullptr;
}

// The int8 weights and per-column scales that `b` expands, if it is one of
// the header's two forms.
std::optional<Int8Weights> int8WeightsOf(const Graph& graph, ValueId b) {
  const NodeId producer = graph.value(b).producer;
  if (producer == kNoNode) return std::nullopt;
  const Node& node = graph.node(producer);
  if (isOp(graph, producer, "Mul") && node.inputs.size() == 2) {
    for (size_t side = 0; side < 2; ++side) {
      const NodeId cast = graph.value(node.inputs[side]).producer;
      if (cast == kNoNode || !isOp(graph, cast, "Cast") || graph.node(cast).intAttribute("to", 0) != kOnnxFloat) continue;
      const ValueId w = graph.node(cast).inputs[0];
      const Constant* matrix = int8Matrix(graph, w);
      if (matrix == nullptr) continue;
      auto scale = perColumn(initializerOf(graph, node.inputs[1 - side]), matrix->info.shape[1], 2);
      if (scale) return Int8Weights{w, std::move(*scale)};
    }
    return std::nullopt;
  }
  if (isOp(graph, producer, "DequantizeLinear") && node.inputs.size() >= 2) {
    const Constant* matrix = int8Matrix(graph, node.inputs[0]);
    if (matrix == nullptr || node.intAttribute("block_size", 0) != 0) return std::nullopt;
    if (node.intAttribute("output_dtype", kOnnxFloat) != kOnnxFloat) return std::nullopt;
    if (node.inputs.size() >= 3 && node.inputs[2] != kNoValue) {
      const Constant* zero = initializerOf(graph, node.inputs[2]);
      if (zero == nullptr || !allZero(*zero)) return std::nullopt;
    }
    const Constant* scale = initializerOf(graph, node.inputs[1]);
    const int64_t axis = node.intAttribute("axis", 1);
    if (scale == nullptr || (scale->info.numElements() != 1 && axis != 1 && axis != -1)) return std::nullopt;
    auto values = perColumn(scale, matrix->info.shape[1], 1);
    if (values) return Int8Weights{node.inputs[0], std::move(*values)};
  }
  return std::nullopt;
}

ConstantPtr floats(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, {static_cast<int64_t>(values.size())}}, std::move(bytes));
}

bool rewrite(Graph& graph, const std::set<ValueId>& pinned, NodeId id) {
  // (Copies: adding initializers below may move the graph's nodes.)
  const Node matmul = graph.node(id);
  if (matmul.inputs.size() != 2 || matmul.outputs.size() != 1) return false;
  const std::optional<Int8Weights> weights = int8WeightsOf(graph, matmul.inputs[1]);
  if (!weights) return false;
  const std::vector<int64_t> w_shape = graph.value(weights->w).initializer->info.shape;
  if (w_shape[0] < 1 || w_shape[0] > kMaxDepth || w_shape[1] < 1) return false;
  const int64_t n = w_shape[1];

  const ValueId out = matmul.outputs[0];
  std::vector<NodeId> chain = {id};
  std::optional<std::vector<float>> bias;
  ValueId end = out;
  if (const auto add = onlyReader(graph, pinned, out, "Add")) {
    const ValueId addend = otherOperand(graph, *add, out);
    if (addend != kNoValue) bias = perColumn(initializerOf(graph, addend), n, 1);
    if (bias) {
      chain.push_back(*add);
      end = graph.node(*add).outputs[0];
    }
  }
  // The kernel applies an activation with one vector loop (not Swish, two).
  Attributes attributes;
  const auto activation = matchActivation(graph, pinned, end);
  if (activation && activation->kind != FusedActivation::kSwish && activation->kind != FusedActivation::kLinear) {
    chain.insert(chain.end(), activation->nodes.begin(), activation->nodes.end());
    setActivation(attributes, *activation);
  }
  const std::string base = graph.value(out).name;
  std::vector<ValueId> inputs = {matmul.inputs[0], weights->w,
                                 graph.addInitializer(uniqueName(graph, base + ":int8_scale"), floats(weights->scale))};
  if (bias) inputs.push_back(graph.addInitializer(uniqueName(graph, base + ":int8_bias"), floats(*bias)));
  replaceByFusedNode(graph, chain, "DynamicInt8MatMul", std::move(attributes), inputs, matmul.name);
  return true;
}

}  // namespace

size_t quantizeActivations(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t rewritten = 0;
  for (NodeId id : graph.nodeIds()) {
    if (!graph.node(id).removed && isOp(graph, id, "MatMul") && rewrite(graph, pinned, id)) ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln
