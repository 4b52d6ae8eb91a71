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

// `c` as n values, one per output column: an f32 constant of one value
// (repeated), or of n values along axis `n_axis` of a tensor of rank `rank`
// aligned to the right (every other dimension 1), of rank at most `rank` (so
// that broadcasting it adds no dimension).
std::optional<std::vector<float>> perColumn(const Constant* c, int64_t n, size_t n_axis, size_t rank) {
  if (c == nullptr || c->info.dtype != DType::kF32 || c->info.shape.size() > rank) return std::nullopt;
  const auto count = static_cast<int64_t>(c->info.numElements());
  std::vector<float> values(static_cast<size_t>(count));
  if (count > 0) std::memcpy(values.data(), c->bytes.data(), values.size() * sizeof(float));
  if (count == 1) return std::vector<float>(static_cast<size_t>(n), values[0]);
  const std::vector<int64_t>& dims = c->info.shape;
  const size_t offset = rank - dims.size();  // dims[i] stands at axis offset + i
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != (offset + i == n_axis ? n : 1)) return std::nullopt;
  }
  return offset <= n_axis ? std::optional(values) : std::nullopt;
}

struct Int8Weights {
  ValueId w = kNoValue;      // the i8 initializer, [k, n] or (n_axis 0) [n, k]
  std::vector<float> scale;  // n values
};

const Constant* int8Matrix(const Graph& graph, ValueId id) {
  const Constant* c = initializerOf(graph, id);
  return c != nullptr && c->info.dtype == DType::kI8 && c->info.shape.size() == 2 ? c : nullptr;
}

// The int8 weights and per-column scales that `b` expands, if it is one of
// the header's two forms; n_axis: the axis of b that is the product's
// columns (1 for MatMul, 0 for Gemm with transB).
std::optional<Int8Weights> int8WeightsOf(const Graph& graph, ValueId b, size_t n_axis) {
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
      auto scale = perColumn(initializerOf(graph, node.inputs[1 - side]), matrix->info.shape[n_axis], n_axis, 2);
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
    const bool per_column = axis == static_cast<int64_t>(n_axis) || axis == static_cast<int64_t>(n_axis) - 2;
    if (scale == nullptr || (scale->info.numElements() != 1 && !per_column)) return std::nullopt;
    auto values = perColumn(scale, matrix->info.shape[n_axis], 0, 1);
    if (values) return Int8Weights{node.inputs[0], std::move(*values)};
  }
  return std::nullopt;
}

// w [n, k] as [k, n].
ConstantPtr transposed(const Constant& w) {
  const int64_t n = w.info.shape[0];
  const int64_t k = w.info.shape[1];
  std::vector<std::byte> bytes(w.bytes.size());
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < n; ++j) bytes[static_cast<size_t>(i * n + j)] = w.bytes[static_cast<size_t>(j * k + i)];
  }
  return makeConstant(TensorInfo{DType::kI8, {k, n}}, std::move(bytes));
}

ConstantPtr floats(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, {static_cast<int64_t>(values.size())}}, std::move(bytes));
}

// The product of MatMul or Gemm node `id` over int8 weights, rewritten;
// false (nothing changed) when it is not one the header describes.
bool rewrite(Graph& graph, const std::set<ValueId>& pinned, NodeId id) {
  // (Copies: adding initializers below may move the graph's nodes.)
  const Node matmul = graph.node(id);
  const bool gemm = matmul.op_type == "Gemm";
  if (matmul.inputs.size() < 2 || matmul.outputs.size() != 1) return false;
  // Gemm: alpha * A x op(B) + beta * C with A not transposed and alpha 1;
  // C, if any, a constant row that becomes the bias.
  std::optional<std::vector<float>> bias;
  size_t n_axis = 1;
  if (gemm) {
    if (matmul.floatAttribute("alpha", 1.0f) != 1.0f || matmul.intAttribute("transA", 0) != 0) return false;
    n_axis = matmul.intAttribute("transB", 0) != 0 ? 0 : 1;
  } else if (matmul.inputs.size() != 2) {
    return false;
  }
  const std::optional<Int8Weights> weights = int8WeightsOf(graph, matmul.inputs[1], n_axis);
  if (!weights) return false;
  const Constant& w = *graph.value(weights->w).initializer;
  const int64_t k = w.info.shape[1 - n_axis];
  const int64_t n = w.info.shape[n_axis];
  if (k < 1 || k > kMaxDepth || n < 1) return false;
  if (gemm && matmul.inputs.size() > 2 && matmul.inputs[2] != kNoValue) {
    bias = perColumn(initializerOf(graph, matmul.inputs[2]), n, 1, 2);
    if (!bias) return false;
    const float beta = matmul.floatAttribute("beta", 1.0f);
    for (float& b : *bias) b *= beta;
  }

  const ValueId out = matmul.outputs[0];
  std::vector<NodeId> chain = {id};
  ValueId end = out;
  const auto add = bias ? std::nullopt : onlyReader(graph, pinned, out, "Add");
  if (add) {
    const ValueId addend = otherOperand(graph, *add, out);
    if (addend != kNoValue) bias = perColumn(initializerOf(graph, addend), n, 0, 1);
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
  const ValueId w_kn = n_axis == 1 ? weights->w : graph.addInitializer(uniqueName(graph, base + ":int8_w"), transposed(w));
  std::vector<ValueId> inputs = {matmul.inputs[0], w_kn,
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
    if (!graph.node(id).removed && (isOp(graph, id, "MatMul") || isOp(graph, id, "Gemm")) && rewrite(graph, pinned, id)) {
      ++rewritten;
    }
  }
  return rewritten;
}

}  // namespace kiln
