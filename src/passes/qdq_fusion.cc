#include "passes/qdq_fusion.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The f32 values of initializer `id`, or nothing (absent, not f32).
std::optional<std::vector<float>> floatsOf(const Graph& graph, ValueId id) {
  const Constant* c = initializerOf(graph, id);
  if (c == nullptr || c->info.dtype != DType::kF32) return std::nullopt;
  std::vector<float> values(c->info.numElements());
  if (!values.empty()) std::memcpy(values.data(), c->bytes.data(), values.size() * sizeof(float));
  return values;
}

// One side of a quantized group: the integer value and its quantization
// parameters, each one value (per tensor).
struct Quantized {
  ValueId data = kNoValue;   // the integer tensor (DQ's input, or Q's output)
  ValueId scale = kNoValue;  // f32, one value
  ValueId zero = kNoValue;   // of the integer type, one value; made when the node has none
  DType type = DType::kUndefined;
  float scale_value = 0;
  int32_t zero_value = 0;
};

class QdqFusion {
 public:
  explicit QdqFusion(Graph& graph) : graph_(graph), pinned_(pinnedValues(graph)) {}

  size_t run() {
    size_t fused = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed) continue;
      if (isOp(graph_, id, "Conv")) {
        fused += fuseConv(id) ? 1 : 0;
      } else if (isOp(graph_, id, "MatMul")) {
        fused += fuseMatMul(id) ? 1 : 0;
      } else if (isOp(graph_, id, "Gemm")) {
        fused += fuseGemm(id) ? 1 : 0;
      } else if (isOp(graph_, id, "Add") || isOp(graph_, id, "Mul")) {
        fused += fuseBinary(id) ? 1 : 0;
      } else if (movesData(graph_.node(id))) {
        fused += fuseDataMovement(id) ? 1 : 0;
      }
    }
    return fused;
  }

 private:
  // The per-tensor parameters of quantization node `id` (QuantizeLinear or
  // DequantizeLinear), over the 8-bit value `data`; nothing unless both are
  // initializers of one value (the zero point may be absent).
  std::optional<Quantized> perTensor(NodeId id, ValueId data) {
    const std::optional<PerTensorQuantization> params = perTensorQuantization(graph_, id);
    if (!params) return std::nullopt;
    const Node& node = graph_.node(id);
    Quantized q;
    q.data = data;
    q.type = params->type;
    q.scale = node.inputs[1];
    q.scale_value = params->scale;
    q.zero_value = params->zero;
    q.zero = node.inputs.size() > 2 && node.inputs[2] != kNoValue ? node.inputs[2] : zeroOf(q.type);
    return q;
  }

  // Input `value` as the output of a per-tensor DequantizeLinear.
  std::optional<Quantized> dequantized(ValueId value) {
    const NodeId producer = graph_.value(value).producer;
    if (producer == kNoNode || !isOp(graph_, producer, "DequantizeLinear")) return std::nullopt;
    return perTensor(producer, graph_.node(producer).inputs[0]);
  }

  // The QuantizeLinear that alone reads `value`, and its parameters.
  std::optional<std::pair<NodeId, Quantized>> quantizedBy(ValueId value) {
    const std::optional<NodeId> q = onlyReader(graph_, pinned_, value, "QuantizeLinear");
    if (!q) return std::nullopt;
    std::optional<Quantized> params = perTensor(*q, graph_.node(*q).outputs[0]);
    if (!params) return std::nullopt;
    return std::pair{*q, *params};
  }

  // A zero point of 0 of `type`, one initializer per type.
  ValueId zeroOf(DType type) {
    ValueId& zero = type == DType::kU8 ? zero_u8_ : zero_i8_;
    if (zero == kNoValue) {
      zero = graph_.addInitializer(uniqueName(graph_, type == DType::kU8 ? "qdq/zero_u8" : "qdq/zero_i8"),
                                   makeConstant(TensorInfo{type, {}}, std::vector<std::byte>(1)));
    }
    return zero;
  }

  // Weights that a DequantizeLinear of an 8-bit initializer makes.
  struct QuantizedWeights {
    ValueId data = kNoValue;  // the 8-bit initializer
    ValueId scale = kNoValue;
    ValueId zero = kNoValue;   // made when the node has none
    std::vector<float> scales;  // one, or one per channel
    int64_t channels = 0;       // along the channel axis
  };

  // The weights that make `value`: an 8-bit initializer of `rank` dimensions
  // (a Conv's: at least 3) whose scale and zero point are one value, or one
  // per channel along `channel_axis` (a Conv's 0, a MatMul's 1).
  std::optional<QuantizedWeights> quantizedWeights(ValueId value, size_t min_rank, size_t max_rank,
                                                   int64_t channel_axis) {
    const NodeId producer = graph_.value(value).producer;
    if (producer == kNoNode || !isOp(graph_, producer, "DequantizeLinear")) return std::nullopt;
    const Node& dq = graph_.node(producer);
    const Constant* w = initializerOf(graph_, dq.inputs[0]);
    if (w == nullptr || !isInteger8(w->info.dtype) || w->info.shape.size() < min_rank ||
        w->info.shape.size() > max_rank || dq.intAttribute("block_size", 0) != 0) {
      return std::nullopt;
    }
    QuantizedWeights weights;
    weights.data = dq.inputs[0];
    weights.scale = dq.inputs[1];
    weights.channels = w->info.shape[static_cast<size_t>(channel_axis)];
    const std::optional<std::vector<float>> scales = floatsOf(graph_, dq.inputs[1]);
    if (!scales) return std::nullopt;
    const auto count = static_cast<int64_t>(scales->size());
    const int64_t axis = dq.intAttribute("axis", 1);
    const bool on_channels = axis == channel_axis || axis + static_cast<int64_t>(w->info.shape.size()) == channel_axis;
    if (count != 1 && (count != weights.channels || !on_channels)) return std::nullopt;
    weights.scales = *scales;
    weights.zero = dq.inputs.size() > 2 ? dq.inputs[2] : kNoValue;
    if (weights.zero == kNoValue) {
      weights.zero = zeroOf(w->info.dtype);
      return weights;
    }
    const Constant* z = initializerOf(graph_, weights.zero);
    if (z == nullptr || z->info.dtype != w->info.dtype || static_cast<int64_t>(z->info.numElements()) != count) {
      return std::nullopt;
    }
    return weights;
  }

  bool fuseConv(NodeId conv) {
    const Node& node = graph_.node(conv);
    if (node.inputs.size() < 2) return false;
    const std::optional<Quantized> x = dequantized(node.inputs[0]);
    if (!x) return false;
    const std::optional<QuantizedWeights> w = quantizedWeights(node.inputs[1], 3, SIZE_MAX, 0);
    if (!w) return false;
    std::vector<NodeId> group{conv};
    const auto q = quantizedOutput(node.outputs[0], group);
    if (!q) return false;
    const Quantized& y = q->second;
    // The bias, as i32 at the scale x_scale * w_scale.
    std::vector<ValueId> inputs{x->data, x->scale, x->zero, w->data, w->scale, w->zero, y.scale, y.zero};
    if (node.inputs.size() > 2 && node.inputs[2] != kNoValue) {
      const ValueId bias = quantizedBias(node.inputs[2], x->scale_value, w->scales, w->channels);
      if (bias == kNoValue) return false;
      inputs.push_back(bias);
    }
    Attributes attributes = node.attributes;
    const std::string name = node.name;
    replaceByFusedNode(graph_, group, "QLinearConv", std::move(attributes), inputs, name + "/quantized");
    graph_.node(group.back()).domain.clear();
    return true;
  }

  // The QuantizeLinear of `value`: directly, or after a Relu or Clip that
  // alone reads it and changes nothing the quantization would not. Appends
  // the activation, if any, and the QuantizeLinear to `group`.
  std::optional<std::pair<NodeId, Quantized>> quantizedOutput(ValueId value, std::vector<NodeId>& group) {
    std::optional<NodeId> activation;
    for (const char* op : {"Relu", "Clip"}) {
      activation = onlyReader(graph_, pinned_, value, op);
      if (activation) break;
    }
    const auto q = quantizedBy(activation ? graph_.node(*activation).outputs[0] : value);
    if (!q) return std::nullopt;
    if (activation) {
      const std::optional<std::pair<float, float>> bounds = activationBounds(*activation);
      if (!bounds || !quantizationAbsorbs(q->second, bounds->first, bounds->second)) return std::nullopt;
      group.push_back(*activation);
    }
    group.push_back(q->first);
    return q;
  }

  // The bounds a Relu ([0, inf)) or Clip (constant min and max, each
  // optional) clamps to; nothing for a Clip with computed bounds.
  std::optional<std::pair<float, float>> activationBounds(NodeId id) const {
    const Node& node = graph_.node(id);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    if (node.op_type == "Relu") return std::pair{0.0f, kInf};
    float low = node.floatAttribute("min", -kInf);  // before opset 11
    float high = node.floatAttribute("max", kInf);
    for (size_t i = 1; i < node.inputs.size() && i < 3; ++i) {
      if (node.inputs[i] == kNoValue) continue;
      const std::optional<float> bound = scalarConstant(graph_, node.inputs[i], 1);
      if (!bound) return std::nullopt;
      (i == 1 ? low : high) = *bound;
    }
    return std::pair{low, high};
  }

  // Whether quantizing with `y` already does what clamping to [low, high]
  // does: QuantizeLinear is monotonic and saturates, so Q(clamp(v)) = Q(v)
  // for every v exactly when Q(low) is the type's lowest value and Q(high)
  // its highest.
  static bool quantizationAbsorbs(const Quantized& y, float low, float high) {
    const float lowest = y.type == DType::kU8 ? 0.0f : -128.0f;
    const float highest = lowest + 255.0f;
    auto quantize = [&](float v) {
      return std::clamp(std::nearbyint(v / y.scale_value) + static_cast<float>(y.zero_value), lowest, highest);
    };
    return quantize(low) == lowest && quantize(high) == highest;
  }

  // Bias `value` ([M] f32: an initializer, or DequantizeLinear of an i32
  // initializer with zero point 0) as an i32 initializer at scale
  // x_scale * w_scale[m]; kNoValue when it is neither.
  ValueId quantizedBias(ValueId value, float x_scale, const std::vector<float>& w_scale, int64_t channels) {
    std::vector<double> real(static_cast<size_t>(channels));
    std::vector<int32_t> exact;  // the i32 values, when their scale is already QLinearConv's
    auto bias_scale = [&](int64_t m) { return x_scale * w_scale[w_scale.size() == 1 ? 0 : static_cast<size_t>(m)]; };
    const NodeId producer = graph_.value(value).producer;
    if (producer != kNoNode) {
      if (!isOp(graph_, producer, "DequantizeLinear")) return kNoValue;
      const Node& dq = graph_.node(producer);
      const Constant* b = initializerOf(graph_, dq.inputs[0]);
      const std::optional<std::vector<float>> scale = floatsOf(graph_, dq.inputs[1]);
      if (b == nullptr || b->info.dtype != DType::kI32 || static_cast<int64_t>(b->info.numElements()) != channels ||
          !scale || (scale->size() != 1 && static_cast<int64_t>(scale->size()) != channels)) {
        return kNoValue;
      }
      if (dq.inputs.size() > 2 && dq.inputs[2] != kNoValue) {
        const Constant* z = initializerOf(graph_, dq.inputs[2]);
        if (z == nullptr || !allZero(*z)) return kNoValue;
      }
      std::vector<int32_t> ints(static_cast<size_t>(channels));
      std::memcpy(ints.data(), b->bytes.data(), ints.size() * sizeof(int32_t));
      bool same_scale = true;
      for (int64_t m = 0; m < channels; ++m) {
        const float s = (*scale)[scale->size() == 1 ? 0 : static_cast<size_t>(m)];
        real[static_cast<size_t>(m)] = static_cast<double>(ints[static_cast<size_t>(m)]) * s;
        same_scale = same_scale && s == bias_scale(m);
      }
      if (same_scale) exact = std::move(ints);
    } else {
      const std::optional<std::vector<float>> b = floatsOf(graph_, value);
      if (!b || static_cast<int64_t>(b->size()) != channels) return kNoValue;
      for (int64_t m = 0; m < channels; ++m) real[static_cast<size_t>(m)] = (*b)[static_cast<size_t>(m)];
    }
    if (exact.empty()) {
      exact.resize(static_cast<size_t>(channels));
      for (int64_t m = 0; m < channels; ++m) {
        const double q = std::nearbyint(real[static_cast<size_t>(m)] / bias_scale(m));
        if (!(std::fabs(q) < 2147483520.0)) return kNoValue;  // no i32 holds it (or not a number)
        exact[static_cast<size_t>(m)] = static_cast<int32_t>(q);
      }
    }
    std::vector<std::byte> bytes(exact.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), exact.data(), bytes.size());
    return graph_.addInitializer(uniqueName(graph_, graph_.value(value).name + "/i32"),
                                 makeConstant(TensorInfo{DType::kI32, {channels}}, std::move(bytes)));
  }

  // Q(MatMul(DQ(a), DQ(w))): w an 8-bit initializer of 2 dimensions, its
  // scale one value or one per column (axis 1).
  bool fuseMatMul(NodeId matmul) {
    const Node& node = graph_.node(matmul);
    if (node.inputs.size() != 2) return false;
    const std::optional<Quantized> a = dequantized(node.inputs[0]);
    if (!a) return false;
    const std::optional<QuantizedWeights> w = quantizedWeights(node.inputs[1], 2, 2, 1);
    if (!w) return false;
    const auto q = quantizedBy(node.outputs[0]);
    if (!q) return false;
    const Quantized& y = q->second;
    const std::string name = node.name;
    replaceByFusedNode(graph_, {matmul, q->first}, "QLinearMatMul", {},
                       {a->data, a->scale, a->zero, w->data, w->scale, w->zero, y.scale, y.zero},
                       name + "/quantized");
    graph_.node(q->first).domain.clear();
    return true;
  }

  // Q(Gemm(DQ(a), DQ(w), bias)) with alpha = beta = 1 and a not transposed:
  // w an 8-bit initializer whose scale is one value or one per output column,
  // the bias (absent, [n] or [1, n]) f32 or DequantizeLinear of i32. Becomes
  // kiln.QLinearMatMul over w as [k, n] (transposed here when transB is set)
  // with the bias in i32 at a_scale * w_scale, as a QLinearConv's.
  bool fuseGemm(NodeId gemm) {
    const Node& node = graph_.node(gemm);
    if (node.inputs.size() < 2 || node.floatAttribute("alpha", 1.0f) != 1.0f ||
        node.floatAttribute("beta", 1.0f) != 1.0f || node.intAttribute("transA", 0) != 0) {
      return false;
    }
    const bool transposed = node.intAttribute("transB", 0) != 0;
    const std::optional<Quantized> a = dequantized(node.inputs[0]);
    if (!a) return false;
    const std::optional<QuantizedWeights> w = quantizedWeights(node.inputs[1], 2, 2, transposed ? 0 : 1);
    if (!w) return false;
    std::vector<NodeId> group{gemm};
    const auto q = quantizedOutput(node.outputs[0], group);
    if (!q) return false;
    const Quantized& y = q->second;
    const Constant& weights = *initializerOf(graph_, w->data);
    const int64_t n = w->channels;
    const int64_t k = weights.info.shape[transposed ? 1 : 0];
    ValueId bias = kNoValue;
    if (node.inputs.size() > 2 && node.inputs[2] != kNoValue) {
      const ValueType& c = graph_.value(node.inputs[2]).type;
      const std::optional<TensorInfo> info = c.hasStaticShape() ? c.tensorInfo() : std::nullopt;
      const bool per_column = info && !info->shape.empty() && info->shape.back() == n &&
                              info->numElements() == static_cast<uint64_t>(n);
      if (!per_column) return false;
      bias = quantizedBias(node.inputs[2], a->scale_value, w->scales, n);
      if (bias == kNoValue) return false;
    }
    ValueId matrix = w->data;
    if (transposed) {
      std::vector<std::byte> bytes(weights.bytes.size());
      for (int64_t row = 0; row < n; ++row) {
        for (int64_t col = 0; col < k; ++col) {
          bytes[static_cast<size_t>(col * n + row)] = weights.bytes[static_cast<size_t>(row * k + col)];
        }
      }
      matrix = graph_.addInitializer(uniqueName(graph_, graph_.value(w->data).name + "/kn"),
                                     makeConstant(TensorInfo{weights.info.dtype, {k, n}}, std::move(bytes)));
    }
    std::vector<ValueId> inputs{a->data, a->scale, a->zero, matrix, w->scale, w->zero, y.scale, y.zero};
    if (bias != kNoValue) inputs.push_back(bias);
    const std::string name = node.name;
    replaceByFusedNode(graph_, group, "QLinearMatMul", {}, inputs, name + "/quantized");
    return true;
  }

  // Q(Add(DQ(a), DQ(b))) and Q(Mul(...)) of one shape (no broadcasting) and
  // one 8-bit type: kiln.QLinearAdd, kiln.QLinearMul.
  bool fuseBinary(NodeId id) {
    const Node& node = graph_.node(id);
    if (node.inputs.size() != 2) return false;
    const std::optional<Quantized> a = dequantized(node.inputs[0]);
    const std::optional<Quantized> b = dequantized(node.inputs[1]);
    if (!a || !b) return false;
    const ValueType& out = graph_.value(node.outputs[0]).type;
    if (!out.hasStaticShape()) return false;
    for (ValueId operand : node.inputs) {
      if (graph_.value(operand).type.shape != out.shape) return false;
    }
    std::vector<NodeId> group{id};
    const auto q = quantizedOutput(node.outputs[0], group);
    if (!q) return false;
    const Quantized& y = q->second;
    if (a->type != y.type || b->type != y.type) return false;
    const std::string name = node.name;
    const std::string op = "QLinear" + node.op_type;
    replaceByFusedNode(graph_, group, op, {},
                       {a->data, a->scale, a->zero, b->data, b->scale, b->zero, y.scale, y.zero}, name + "/quantized");
    return true;
  }

  // Operators whose outputs are elements of their data inputs (MaxPool
  // picks them, the others move them, Resize in nearest mode copies them):
  // on quantized data with one scale and zero point they commute with the
  // quantization, exactly.
  bool movesData(const Node& node) const {
    static const std::set<std::string> kOps = {"MaxPool", "Concat",   "Reshape", "Transpose",    "Flatten",
                                               "Squeeze", "Unsqueeze", "Slice",   "Gather",       "DepthToSpace",
                                               "SpaceToDepth", "Split"};
    if (!node.domain.empty()) return false;
    if (node.op_type == "Resize") return node.stringAttribute("mode", "nearest") == "nearest" && node.outputs.size() == 1;
    return kOps.contains(node.op_type) && (node.outputs.size() == 1 || node.op_type == "Split");
  }

  // Q(op(DQ(x), ...)) with equal parameters: op over x itself. Concat's
  // every input is a data input; the others' is input 0 (the rest are
  // shapes, axes or indices, left as they are). A Concat whose inputs'
  // parameters differ from its output's becomes kiln.QLinearConcat, which
  // requantizes them as it copies.
  bool fuseDataMovement(NodeId id) {
    const Node& node = graph_.node(id);
    if (node.inputs.empty()) return false;
    // Every output quantized (Split has several), all with one type, scale
    // and zero point.
    std::vector<NodeId> quantizations;
    std::optional<Quantized> out;
    for (ValueId output : node.outputs) {
      const auto q = quantizedBy(output);
      if (!q || (out && (q->second.type != out->type || q->second.scale_value != out->scale_value ||
                         q->second.zero_value != out->zero_value))) {
        return false;
      }
      // Several outputs are rewired below, which would rename a model output.
      if (node.outputs.size() > 1 && pinned_.contains(q->second.data)) return false;
      quantizations.push_back(q->first);
      out = q->second;
    }
    if (!out) return false;
    const Quantized& y = *out;
    std::vector<ValueId> inputs = node.inputs;
    const bool concat = node.op_type == "Concat";
    const size_t data_inputs = concat ? inputs.size() : 1;
    std::vector<float> scales;
    std::vector<int64_t> zero_points;
    bool requantizes = false;
    for (size_t i = 0; i < data_inputs; ++i) {
      const std::optional<Quantized> x = dequantized(inputs[i]);
      if (!x || x->type != y.type) return false;
      if (x->scale_value != y.scale_value || x->zero_value != y.zero_value) {
        if (!concat) return false;
        requantizes = true;
      }
      scales.push_back(x->scale_value);
      zero_points.push_back(x->zero_value);
      inputs[i] = x->data;
    }
    Attributes attributes = node.attributes;
    const std::string op = node.op_type;
    const std::string name = node.name;
    if (requantizes) {
      scales.push_back(y.scale_value);
      zero_points.push_back(y.zero_value);
      attributes["scales"] = std::move(scales);
      attributes["zero_points"] = std::move(zero_points);
      replaceByFusedNode(graph_, {id, quantizations[0]}, "QLinearConcat", std::move(attributes), inputs,
                         name + "/quantized");
      return true;
    }
    if (quantizations.size() == 1) {
      replaceByFusedNode(graph_, {id, quantizations[0]}, op, std::move(attributes), inputs, name + "/quantized");
      graph_.node(quantizations[0]).domain.clear();
      return true;
    }
    // Several outputs (Split): the node reads the 8-bit data and each
    // QuantizeLinear's readers read its output instead.
    for (size_t i = 0; i < data_inputs; ++i) graph_.setNodeInput(id, static_cast<uint32_t>(i), inputs[i]);
    for (size_t k = 0; k < quantizations.size(); ++k) {
      const Node& node_now = graph_.node(id);
      const ValueId raw = node_now.outputs[k];
      const ValueId quantized = graph_.node(quantizations[k]).outputs[0];
      graph_.value(raw).type.dtype = y.type;
      graph_.replaceAllUses(quantized, raw);
      graph_.removeNode(quantizations[k]);
    }
    return true;
  }

  Graph& graph_;
  const std::set<ValueId> pinned_;
  ValueId zero_u8_ = kNoValue;
  ValueId zero_i8_ = kNoValue;
};

}  // namespace

size_t fuseQdq(Graph& graph) { return QdqFusion(graph).run(); }

}  // namespace kiln
