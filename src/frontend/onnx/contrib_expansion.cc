#include "frontend/onnx/contrib_expansion.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/error.h"

namespace kiln {
namespace {

constexpr const char* kDomain = "com.microsoft";
constexpr int64_t kOnnxFloat = 1;  // TensorProto.FLOAT

// One contrib node being rewritten: helpers that add the replacement nodes
// next to it, then swap its outputs for theirs.
class Rewrite {
 public:
  Rewrite(Graph& graph, NodeId id)
      : graph_(graph), id_(id), node_(graph.node(id)), prefix_(node_.name.empty() ? node_.op_type : node_.name) {}
  Rewrite(const Rewrite&) = delete;
  Rewrite& operator=(const Rewrite&) = delete;

  const Node& node() const { return node_; }
  const Graph& graph() const { return graph_; }

  [[noreturn]] void fail(const std::string& message) const {
    throw GraphError(fmt::format("node '{}' ({}.{}): {}", prefix_, kDomain, node_.op_type, message));
  }

  // Input i, or kNoValue when it is absent.
  ValueId in(size_t i) const { return i < node_.inputs.size() ? node_.inputs[i] : kNoValue; }
  ValueId required(size_t i, const char* what) const {
    if (in(i) == kNoValue) fail(fmt::format("input {} ({}) is required", i, what));
    return in(i);
  }

  // Whether output i exists and something reads it.
  bool outputUsed(size_t i) const {
    if (i >= node_.outputs.size() || node_.outputs[i] == kNoValue) return false;
    const ValueId v = node_.outputs[i];
    if (!graph_.value(v).users.empty()) return true;
    for (ValueId out : graph_.outputs()) {
      if (out == v) return true;
    }
    return false;
  }
  void refuseOutput(size_t i, const char* what) const {
    if (outputUsed(i)) fail(fmt::format("output {} ({}) is read, which kiln does not compute", i, what));
  }

  ValueId scalar(float value) {
    std::vector<std::byte> bytes(sizeof value);
    std::memcpy(bytes.data(), &value, sizeof value);
    return graph_.addInitializer(fresh("const"), makeConstant(TensorInfo{DType::kF32, {}}, std::move(bytes)));
  }
  ValueId integer(int64_t value) {  // an i64 scalar
    std::vector<std::byte> bytes(sizeof value);
    std::memcpy(bytes.data(), &value, sizeof value);
    return graph_.addInitializer(fresh("const"), makeConstant(TensorInfo{DType::kI64, {}}, std::move(bytes)));
  }
  ValueId ints(const std::vector<int64_t>& values) {
    std::vector<std::byte> bytes(values.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return graph_.addInitializer(fresh("shape"),
                                 makeConstant(TensorInfo{DType::kI64, {static_cast<int64_t>(values.size())}},
                                              std::move(bytes)));
  }

  ValueId op(const std::string& type, const std::vector<ValueId>& inputs, Attributes attributes = {},
             const std::string& domain = "") {
    const NodeId added = graph_.addNode(type, inputs, {fresh(type)}, std::move(attributes), domain);
    graph_.node(added).name = prefix_ + "/" + type;
    return graph_.node(added).outputs[0];
  }

  ValueId gelu(ValueId x) {  // the Erf form exporters write, which matmul_fusion.h recognises
    const ValueId erf = op("Erf", {op("Div", {x, scalar(static_cast<float>(std::sqrt(2.0)))})});
    return op("Mul", {op("Mul", {x, op("Add", {erf, scalar(1.0f)})}), scalar(0.5f)});
  }

  // Output i of the contrib node becomes `value`, under the output's name;
  // then the node goes. Outputs not given must be unread.
  void finish(const std::vector<std::pair<size_t, ValueId>>& replaced) {
    const Node& node = node_;
    std::vector<std::pair<ValueId, std::string>> renames;
    for (const auto& [index, value] : replaced) {
      const ValueId old = node.outputs[index];
      renames.emplace_back(value, graph_.value(old).name);
      graph_.replaceAllUses(old, value);
    }
    graph_.removeNode(id_);
    for (size_t i = 0; i < renames.size(); ++i) {
      graph_.renameValue(node.outputs[replaced[i].first], fresh(renames[i].second + "/replaced"));
      graph_.renameValue(renames[i].first, renames[i].second);
    }
  }

 private:
  std::string fresh(const std::string& base) const { return uniqueName(graph_, prefix_ + "/" + base); }

  Graph& graph_;
  const NodeId id_;
  const Node node_;  // a copy: adding nodes may move the graph's
  const std::string prefix_;
};

void skipLayerNorm(Rewrite& r, bool simplified) {
  r.refuseOutput(1, "mean");
  r.refuseOutput(2, "inverse standard deviation");
  // (input + bias) + skip: the input is mostly a MatMul's product, and the
  // matmul fusion takes a bias Add, then a residual Add, after it.
  ValueId sum = r.required(0, "input");
  const ValueId bias = r.in(simplified ? 3 : 4);
  if (bias != kNoValue) sum = r.op("Add", {sum, bias});
  sum = r.op("Add", {sum, r.required(1, "skip")});
  const float epsilon = r.node().floatAttribute("epsilon", 1e-12f);
  ValueId y;
  if (simplified) {
    y = r.op("RMSNormalization", {sum, r.required(2, "gamma")}, {{"axis", int64_t{-1}}, {"epsilon", epsilon}}, "kiln");
  } else {
    std::vector<ValueId> inputs = {sum, r.required(2, "gamma")};
    if (r.in(3) != kNoValue) inputs.push_back(r.in(3));
    y = r.op("LayerNormalization", inputs, {{"axis", int64_t{-1}}, {"epsilon", epsilon}});
  }
  std::vector<std::pair<size_t, ValueId>> replaced = {{0, y}};
  if (r.outputUsed(3)) replaced.emplace_back(3, sum);
  r.finish(replaced);
}

// MatMulIntegerToFloat's tail: kiln.MatMulIntegerToFloat(A, B, a_zero,
// b_zero, a_scale * b_scale), plus the bias.
ValueId integerProduct(Rewrite& r, ValueId a, ValueId b, ValueId a_scale, ValueId b_scale, ValueId a_zero,
                       ValueId b_zero, ValueId bias) {
  const ValueId scale = r.op("Mul", {a_scale, b_scale});
  ValueId y = r.op("MatMulIntegerToFloat", {a, b, a_zero, b_zero, scale}, {}, "kiln");
  if (bias != kNoValue) y = r.op("Add", {y, bias});
  return y;
}

// EmbedLayerNormalization's mask_index outputs (lengths, [batch]) -> the raw
// [batch, keys] masks they were counted from.
using RawMasks = std::map<ValueId, ValueId>;

// EmbedLayerNormalization's tables and parameters; QEmbedLayerNormalization
// gives them dequantized.
struct Embeddings {
  ValueId word, position, segment, gamma, beta;
};

void embedLayerNorm(Rewrite& r, int64_t opset, RawMasks& raw_masks, const Embeddings& e, ValueId position_ids) {
  if (opset < 10) r.fail(fmt::format("needs ai.onnx opset 10 or newer for Slice, found {}", opset));
  const ValueId ids = r.required(0, "input_ids");
  ValueId sum = r.op("Gather", {e.word, ids});
  ValueId positions;
  if (position_ids != kNoValue) {
    positions = r.op("Gather", {e.position, position_ids});
  } else {  // rows 0 .. S-1, S the sequence length of input_ids
    const ValueId length = r.op("Slice", {r.op("Shape", {ids}), r.ints({1}), r.ints({2})});
    positions = r.op("Slice", {e.position, r.ints({0}), length, r.ints({0})});
  }
  sum = r.op("Add", {sum, positions});
  if (r.in(1) != kNoValue && e.segment != kNoValue) sum = r.op("Add", {sum, r.op("Gather", {e.segment, r.in(1)})});
  const ValueId y = r.op("LayerNormalization", {sum, e.gamma, e.beta},
                         {{"axis", int64_t{-1}}, {"epsilon", r.node().floatAttribute("epsilon", 1e-12f)}});
  std::vector<std::pair<size_t, ValueId>> replaced = {{0, y}};
  if (r.outputUsed(1)) {
    // mask_index: the count of ones in each row of the mask (zeros without one).
    const ValueId mask = r.in(7);
    if (mask == kNoValue) r.fail("output 1 (mask_index) is read but there is no mask (input 7)");
    const ValueId ones = r.op("Cast", {mask}, {{"to", int64_t{6}}});  // int32
    const ValueId count = opset >= 13 ? r.op("ReduceSum", {ones, r.ints({1})}, {{"keepdims", int64_t{0}}})
                                      : r.op("ReduceSum", {ones}, {{"axes", std::vector<int64_t>{1}},
                                                                  {"keepdims", int64_t{0}}});
    replaced.emplace_back(1, count);
    raw_masks[count] = mask;
  }
  if (r.outputUsed(2)) replaced.emplace_back(2, sum);
  r.finish(replaced);
}

void embedLayerNorm(Rewrite& r, int64_t opset, RawMasks& raw_masks) {
  const Embeddings e = {r.required(2, "word_embedding"), r.required(3, "position_embedding"), r.in(4),
                        r.required(5, "gamma"), r.required(6, "beta")};
  embedLayerNorm(r, opset, raw_masks, e, r.in(8));
}

// QEmbedLayerNormalization: the same with 8-bit tables, gamma and beta,
// each dequantized by its scale (inputs 8-12) and zero point (13-17).
void quantizedEmbedLayerNorm(Rewrite& r, int64_t opset, RawMasks& raw_masks) {
  const auto dequantized = [&](size_t value, size_t scale, const char* what) {
    if (r.in(value) == kNoValue) return kNoValue;
    std::vector<ValueId> inputs = {r.in(value), r.required(scale, what)};
    if (r.in(scale + 5) != kNoValue) inputs.push_back(r.in(scale + 5));
    return r.op("DequantizeLinear", inputs);
  };
  const Embeddings e = {dequantized(2, 8, "word_embedding_scale"), dequantized(3, 9, "position_embedding_scale"),
                        dequantized(4, 10, "segment_embedding_scale"), dequantized(5, 11, "gamma_scale"),
                        dequantized(6, 12, "beta_scale")};
  if (e.word == kNoValue || e.position == kNoValue || e.gamma == kNoValue || e.beta == kNoValue) {
    r.fail("the word and position embeddings, gamma and beta are required");
  }
  embedLayerNorm(r, opset, raw_masks, e, kNoValue);
}

// Whether 1-D `lengths` has one element per batch row of `input`, both known.
bool sameBatch(const Graph& graph, ValueId lengths, ValueId input) {
  const ValueType& l = graph.value(lengths).type;
  const ValueType& x = graph.value(input).type;
  return l.shape && x.shape && l.shape->size() == 1 && !x.shape->empty() && l.shape->front().isKnown() &&
         l.shape->front() == x.shape->front();
}

// Where Attention and QAttention keep their inputs.
struct AttentionInputs {
  size_t mask, past, attention_bias;  // indices; attention_bias SIZE_MAX where there is none
  bool quantized;                     // QAttention: 8-bit input and weights with scales and zero points
};
constexpr AttentionInputs kAttention = {3, 4, 5, false};
constexpr AttentionInputs kQAttention = {5, 8, SIZE_MAX, true};

void attention(Graph& graph, Rewrite& r, int64_t opset, const RawMasks& raw_masks, const AttentionInputs& at) {
  const Node& node = r.node();
  if (opset < 10) r.fail(fmt::format("needs ai.onnx opset 10 or newer for Slice, found {}", opset));
  if (r.in(at.past) != kNoValue) r.fail(fmt::format("past state (input {}) is not supported", at.past));
  r.refuseOutput(1, "present");
  if (node.intAttribute("do_rotary", 0) != 0) r.fail("do_rotary is not supported");
  const int64_t heads = node.intAttribute("num_heads", 0);
  if (heads < 1) r.fail("num_heads must be positive");
  // q, k, v: input x (a column range of the weights) (+ that range of the
  // bias). The weights are constants in practice, whose slices constant
  // folding makes once; three products then cost what one did, and the
  // matmul fusions take their biases. QAttention's products are
  // MatMulIntegerToFloat's, with per-column weight scales and zero points
  // sliced like the weights.
  const ValueId input = r.required(0, "input");
  const ValueId weights = r.required(1, "weights");
  std::vector<int64_t> sizes = node.intsAttribute("qkv_hidden_sizes", {});
  const ValueType& weights_type = graph.value(weights).type;
  if (!weights_type.shape || weights_type.shape->size() != 2 || !weights_type.shape->back().isKnown()) {
    r.fail("the weights must be 2-D with a known width");
  }
  const int64_t width = weights_type.shape->back().size;
  if (sizes.empty()) sizes = {width / 3, width / 3, width / 3};  // equal thirds
  const auto columnsOf = [&](ValueId x, int64_t begin, int64_t end) {
    return r.op("Slice", {x, r.ints({begin}), r.ints({end}), r.ints({-1})});
  };
  // A weight scale or zero point: one value for all columns, or one per column.
  const auto perColumn = [&](ValueId x, int64_t begin, int64_t end) {
    if (x == kNoValue) return x;
    const ValueType& type = graph.value(x).type;
    if (!type.shape) r.fail("weight scales and zero points need a known shape");
    if (type.shape->empty() || (type.shape->size() == 1 && (*type.shape)[0].size == 1)) return x;
    if (type.shape->size() != 1 || (*type.shape)[0].size != width) {
      r.fail(fmt::format("weight scales and zero points must hold one value or {} (one per column)", width));
    }
    return columnsOf(x, begin, end);
  };
  const auto project = [&](int64_t begin, int64_t end) {
    const ValueId columns = columnsOf(weights, begin, end);
    ValueId product;
    if (at.quantized) {
      product = integerProduct(r, input, columns, r.required(3, "input_scale"),
                               perColumn(r.required(4, "weight_scale"), begin, end), r.in(6),
                               perColumn(r.in(7), begin, end), kNoValue);
    } else {
      product = r.op("MatMul", {input, columns});
    }
    if (r.in(2) != kNoValue) product = r.op("Add", {product, columnsOf(r.in(2), begin, end)});
    return product;
  };
  if (sizes.size() != 3 || sizes[0] != sizes[1] || sizes[0] % heads != 0 || sizes[2] % heads != 0 ||
      sizes[0] + sizes[1] + sizes[2] != width) {
    r.fail("qkv_hidden_sizes must be [q, k, v] with q = k, each a multiple of num_heads, summing to the weights' width");
  }
  const ValueId q = project(0, sizes[0]);
  const ValueId k = project(sizes[0], sizes[0] + sizes[1]);
  const ValueId v = project(sizes[0] + sizes[1], width);
  // The additive mask [batch, 1, 1, keys] and the attention bias.
  ValueId mask = kNoValue;
  if (r.in(at.mask) != kNoValue) {
    // A raw [batch, keys] mask of ones and zeros; or the lengths an
    // EmbedLayerNormalization counted from one (its right-padding mask:
    // the raw mask masks the same keys).
    ValueId raw = r.in(at.mask);
    const auto counted = raw_masks.find(raw);
    if (counted != raw_masks.end()) raw = counted->second;
    const ValueType& type = graph.value(raw).type;
    const size_t rank = counted != raw_masks.end() ? 2 : type.shape ? type.shape->size() : 0;
    ValueId allowed;
    if (rank == 2) {
      allowed = r.op("Cast", {raw}, {{"to", kOnnxFloat}});
    } else if (rank == 1 && sameBatch(graph, raw, input) && opset >= 11) {
      // [batch] lengths of right-padded rows (the [2 * batch] form with the
      // starts of left padding is not supported): key j is allowed while
      // j < length, keys counted by the input's sequence axis.
      const ValueId keys = r.op("Slice", {r.op("Shape", {input}), r.ints({1}), r.ints({2})});
      const ValueId positions =
          r.op("Range", {r.integer(0), r.op("Reshape", {keys, r.ints({})}), r.integer(1)});
      const ValueId lengths = r.op("Reshape", {r.op("Cast", {raw}, {{"to", int64_t{7}}}), r.ints({-1, 1})});  // i64
      allowed = r.op("Cast", {r.op("Less", {positions, lengths})}, {{"to", kOnnxFloat}});
    } else {
      r.fail("mask_index must be a raw [batch, keys] mask or [batch] lengths (opset 11 or newer) of known shape; "
             "other forms are not supported");
    }
    const float filter = node.floatAttribute("mask_filter_value", -10000.0f);
    const ValueId additive = r.op("Mul", {r.op("Sub", {r.scalar(1.0f), allowed}), r.scalar(filter)});
    mask = r.op("Reshape", {additive, r.ints({0, 1, 1, -1})});
  }
  const ValueId bias = at.attention_bias == SIZE_MAX ? kNoValue : r.in(at.attention_bias);
  if (bias != kNoValue) mask = mask == kNoValue ? bias : r.op("Add", {mask, bias});
  Attributes attributes = {{"q_num_heads", heads}, {"kv_num_heads", heads},
                           {"is_causal", node.intAttribute("unidirectional", 0)}};
  if (node.floatAttribute("scale", 0.0f) != 0.0f) {
    attributes["scale"] = node.floatAttribute("scale", 0.0f);
  }
  std::vector<ValueId> inputs = {q, k, v};
  if (mask != kNoValue) inputs.push_back(mask);
  r.finish({{0, r.op("Attention", inputs, std::move(attributes), "kiln")}});
}

}  // namespace

namespace {

int expandIn(Graph& graph, int64_t default_opset, RawMasks& raw_masks);

// onnxruntime's QOperator-format contrib ops as the QDQ groups they compute
// (passes/qdq_fusion.h and the elementwise fusion's quantized I/O then run
// them in integers): (De)QuantizeLinear of `x` with `scale` and an optional
// zero point, per tensor or along `axis` (opset 13+).
ValueId quantizeLinear(Rewrite& r, const char* op, ValueId x, ValueId scale, ValueId zero, int64_t axis = 1) {
  std::vector<ValueId> inputs{x, scale};
  if (zero != kNoValue) inputs.push_back(zero);
  Attributes attributes;
  if (axis != 1) attributes["axis"] = axis;
  return r.op(op, inputs, attributes);
}

// QLinearAdd / QLinearMul(A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp?).
void quantizedBinary(Rewrite& r, const char* op) {
  const ValueId a = quantizeLinear(r, "DequantizeLinear", r.required(0, "A"), r.required(1, "A_scale"), r.in(2));
  const ValueId b = quantizeLinear(r, "DequantizeLinear", r.required(3, "B"), r.required(4, "B_scale"), r.in(5));
  r.finish({{0, quantizeLinear(r, "QuantizeLinear", r.op(op, {a, b}), r.required(6, "C_scale"), r.in(7))}});
}

// QLinearGlobalAveragePool(X, x_scale, x_zp, y_scale, y_zp) {channels_last = 0}.
void quantizedGlobalAveragePool(Rewrite& r) {
  if (r.node().intAttribute("channels_last", 0) != 0) r.fail("channels_last = 1 is not supported");
  const ValueId x = quantizeLinear(r, "DequantizeLinear", r.required(0, "X"), r.required(1, "x_scale"), r.in(2));
  r.finish({{0, quantizeLinear(r, "QuantizeLinear", r.op("GlobalAveragePool", {x}), r.required(3, "y_scale"),
                               r.in(4))}});
}

// QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?) {alpha,
// transA, transB}: C is i32 at scale a_scale * b_scale; without y_scale the
// output is f32. b_scale per column of the product needs opset 13.
void quantizedGemm(Rewrite& r, int64_t default_opset) {
  const Node& node = r.node();
  const bool trans_b = node.intAttribute("transB", 0) != 0;
  const ValueId b_scale = r.required(4, "b_scale");
  const Value& scale = r.graph().value(b_scale);
  const bool per_column = scale.kind != ValueKind::kInitializer || scale.initializer->info.numElements() != 1;
  if (per_column && default_opset < 13) r.fail("a b_scale per column needs opset 13 or later");
  const ValueId a = quantizeLinear(r, "DequantizeLinear", r.required(0, "A"), r.required(1, "a_scale"), r.in(2));
  const ValueId b =
      quantizeLinear(r, "DequantizeLinear", r.required(3, "B"), b_scale, r.in(5), per_column && trans_b ? 0 : 1);
  std::vector<ValueId> inputs{a, b};
  if (r.in(6) != kNoValue) {
    inputs.push_back(quantizeLinear(r, "DequantizeLinear", r.in(6), r.op("Mul", {r.required(1, "a_scale"), b_scale}),
                                    kNoValue, per_column ? 0 : 1));
  }
  Attributes attributes = {{"alpha", node.floatAttribute("alpha", 1.0f)},
                           {"transA", node.intAttribute("transA", 0)},
                           {"transB", node.intAttribute("transB", 0)}};
  ValueId y = r.op("Gemm", inputs, attributes);
  if (r.in(7) != kNoValue) y = quantizeLinear(r, "QuantizeLinear", y, r.in(7), r.in(8));
  r.finish({{0, y}});
}

}  // namespace

int expandContribOps(Graph& graph, int64_t default_opset) {
  RawMasks raw_masks;
  return expandIn(graph, default_opset, raw_masks);
}

namespace {

int expandIn(Graph& graph, int64_t default_opset, RawMasks& raw_masks) {
  int count = 0;
  for (NodeId id : graph.nodeIds()) {
    for (auto& [key, attribute] : graph.node(id).attributes) {
      if (GraphPtr* sub = std::get_if<GraphPtr>(&attribute); sub && *sub) count += expandContribOps(**sub, default_opset);
      if (auto* subs = std::get_if<std::vector<GraphPtr>>(&attribute)) {
        for (GraphPtr& sub : *subs) count += sub ? expandContribOps(*sub, default_opset) : 0;
      }
    }
    const std::string domain = graph.node(id).domain;
    const std::string op = graph.node(id).op_type;
    // onnxruntime defines SimplifiedLayerNormalization in the default domain.
    if (domain != kDomain && !(domain.empty() && op == "SimplifiedLayerNormalization")) continue;
    Rewrite r(graph, id);
    if (op == "Gelu") {
      r.finish({{0, r.gelu(r.required(0, "X"))}});
    } else if (op == "BiasGelu") {
      r.finish({{0, r.gelu(r.op("Add", {r.required(0, "A"), r.required(1, "B")}))}});
    } else if (op == "FastGelu") {
      ValueId x = r.required(0, "X");
      if (r.in(1) != kNoValue) x = r.op("Add", {x, r.in(1)});
      // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
      const ValueId cube = r.op("Mul", {r.op("Mul", {x, x}), x});
      const ValueId inner = r.op("Add", {x, r.op("Mul", {cube, r.scalar(0.044715f)})});
      const ValueId t = r.op("Tanh", {r.op("Mul", {inner, r.scalar(static_cast<float>(std::sqrt(2.0 / M_PI)))})});
      r.finish({{0, r.op("Mul", {r.op("Mul", {x, r.scalar(0.5f)}), r.op("Add", {t, r.scalar(1.0f)})})}});
    } else if (op == "QuickGelu") {
      const ValueId x = r.required(0, "X");
      const float alpha = r.node().floatAttribute("alpha", 1.702f);
      r.finish({{0, r.op("Mul", {x, r.op("Sigmoid", {r.op("Mul", {x, r.scalar(alpha)})})})}});
    } else if (op == "SkipLayerNormalization") {
      skipLayerNorm(r, false);
    } else if (op == "SkipSimplifiedLayerNormalization") {
      skipLayerNorm(r, true);
    } else if (op == "SimplifiedLayerNormalization") {
      r.refuseOutput(1, "inverse standard deviation");
      const Attributes attributes = {{"axis", r.node().intAttribute("axis", -1)},
                                     {"epsilon", r.node().floatAttribute("epsilon", 1e-5f)}};
      r.finish({{0, r.op("RMSNormalization", {r.required(0, "X"), r.required(1, "scale")}, attributes, "kiln")}});
    } else if (op == "FusedMatMul") {
      const Node& node = r.node();
      if (node.intAttribute("transBatchA", 0) != 0 || node.intAttribute("transBatchB", 0) != 0) {
        r.fail("transBatchA and transBatchB are not supported");
      }
      const auto lastTwoSwapped = [&](ValueId x) {
        const ValueType& type = graph.value(x).type;
        if (!type.shape || type.shape->size() < 2) r.fail("transA/transB need inputs of known rank 2 or more");
        std::vector<int64_t> perm;
        for (size_t i = 0; i < type.shape->size(); ++i) perm.push_back(static_cast<int64_t>(i));
        std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
        return r.op("Transpose", {x}, {{"perm", perm}});
      };
      ValueId a = r.required(0, "A"), b = r.required(1, "B");
      if (node.intAttribute("transA", 0) != 0) a = lastTwoSwapped(a);
      if (node.intAttribute("transB", 0) != 0) b = lastTwoSwapped(b);
      ValueId y = r.op("MatMul", {a, b});
      const float alpha = r.node().floatAttribute("alpha", 1.0f);
      if (alpha != 1.0f) y = r.op("Mul", {y, r.scalar(alpha)});
      r.finish({{0, y}});
    } else if (op == "MatMulIntegerToFloat") {
      r.finish({{0, integerProduct(r, r.required(0, "A"), r.required(1, "B"), r.required(2, "a_scale"),
                                   r.required(3, "b_scale"), r.in(4), r.in(5), r.in(6))}});
    } else if (op == "DynamicQuantizeMatMul") {
      const NodeId quantize = graph.addNode("DynamicQuantizeLinear", {r.required(0, "A")}, {"", "", ""});
      const Node& q = graph.node(quantize);
      const ValueId aq = q.outputs[0], a_scale = q.outputs[1], a_zero = q.outputs[2];
      r.finish({{0, integerProduct(r, aq, r.required(1, "B"), a_scale, r.required(2, "b_scale"), a_zero, r.in(3),
                                   r.in(4))}});
    } else if (op == "EmbedLayerNormalization") {
      embedLayerNorm(r, default_opset, raw_masks);
    } else if (op == "QEmbedLayerNormalization") {
      quantizedEmbedLayerNorm(r, default_opset, raw_masks);
    } else if (op == "Attention") {
      attention(graph, r, default_opset, raw_masks, kAttention);
    } else if (op == "QAttention") {
      attention(graph, r, default_opset, raw_masks, kQAttention);
    } else if (op == "QLinearAdd") {
      quantizedBinary(r, "Add");
    } else if (op == "QLinearMul") {
      quantizedBinary(r, "Mul");
    } else if (op == "QLinearGlobalAveragePool") {
      quantizedGlobalAveragePool(r);
    } else if (op == "QGemm") {
      quantizedGemm(r, default_opset);
    } else {
      continue;  // other contrib ops: kernels of their own, or reported as unsupported
    }
    ++count;
  }
  return count;
}

}  // namespace
}  // namespace kiln
