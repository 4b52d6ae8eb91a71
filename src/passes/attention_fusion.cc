#include "passes/attention_fusion.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

using Shape = std::vector<int64_t>;

// ONNX TensorProto.FLOAT, Cast's `to` for f32.
constexpr int64_t kOnnxFloat = 1;

// What the chain around one Softmax matched.
struct AttentionChain {
  std::vector<NodeId> nodes;  // in graph order; the last becomes the fused node
  ValueId q4 = kNoValue, kt4 = kNoValue, v4 = kNoValue, y4 = kNoValue;
  ValueId mask = kNoValue;
  float scale = 1.0f;
  std::string name;
};

class AttentionFusion {
 public:
  AttentionFusion(Graph& graph, int64_t default_opset)
      : graph_(graph), pinned_(pinnedValues(graph)), default_opset_(default_opset) {}

  size_t run() {
    size_t fused = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed || !isOp(graph_, id, "Softmax")) continue;
      if (auto chain = match(id)) {
        rewrite(*chain);
        ++fused;
      }
    }
    return fused;
  }

 private:
  // The value's static f32 shape, or nothing.
  std::optional<Shape> shapeOf(ValueId id) const {
    if (id == kNoValue) return std::nullopt;
    const ValueType& type = graph_.value(id).type;
    if (type.dtype != DType::kF32 || !type.hasStaticShape()) return std::nullopt;
    Shape shape;
    for (const Dim& dim : *type.shape) shape.push_back(dim.size);
    return shape;
  }

  // The node that makes `id`, when it is `op` of the default domain.
  std::optional<NodeId> producer(ValueId id, std::string_view op) const {
    if (id == kNoValue) return std::nullopt;
    const NodeId node = graph_.value(id).producer;
    if (node == kNoNode || !isOp(graph_, node, op)) return std::nullopt;
    return node;
  }

  // Whether the chain may swallow `id`: one reader, not pinned.
  bool internal(ValueId id) const { return graph_.value(id).users.size() == 1 && !pinned_.contains(id); }

  bool hasPerm(NodeId transpose, const Shape& perm) const {
    return graph_.node(transpose).intsAttribute("perm", {}) == perm;
  }

  // x4 = Mul(x, c) with c a scalar f32 initializer and x4 read only by the
  // chain: folds c into the scale and returns x; else returns x4.
  ValueId peelScale(ValueId x4, AttentionChain& chain) const {
    const auto mul = producer(x4, "Mul");
    if (!mul || !internal(x4)) return x4;
    const std::vector<ValueId>& in = graph_.node(*mul).inputs;
    for (int i = 0; i < 2; ++i) {
      if (const auto c = scalarConstant(graph_, in[1 - i], 4); c && shapeOf(in[i])) {
        chain.scale *= *c;
        chain.nodes.push_back(*mul);
        return in[i];
      }
    }
    return x4;
  }

  // The scores before the mask: MatMul(Q4, Kt4), optionally scaled.
  bool matchScores(ValueId scores, AttentionChain& chain) const {
    if (!internal(scores)) return false;
    NodeId scale_node = kNoNode;
    if (const auto div = producer(scores, "Div")) {
      const auto c = scalarConstant(graph_, graph_.node(*div).inputs[1], 4);
      if (!c || *c == 0) return false;
      chain.scale /= *c;
      scale_node = *div;
      scores = graph_.node(*div).inputs[0];
    } else if (const auto mul = producer(scores, "Mul")) {
      const std::vector<ValueId>& in = graph_.node(*mul).inputs;
      const int constant = scalarConstant(graph_, in[1], 4) ? 1 : scalarConstant(graph_, in[0], 4) ? 0 : -1;
      if (constant < 0) return false;
      chain.scale *= *scalarConstant(graph_, in[constant], 4);
      scale_node = *mul;
      scores = in[1 - constant];
    }
    if (scale_node != kNoNode && !internal(scores)) return false;
    const auto matmul = producer(scores, "MatMul");
    if (!matmul) return false;
    chain.q4 = peelScale(graph_.node(*matmul).inputs[0], chain);
    chain.kt4 = peelScale(graph_.node(*matmul).inputs[1], chain);
    chain.nodes.push_back(*matmul);
    if (scale_node != kNoNode) chain.nodes.push_back(scale_node);
    chain.name = graph_.node(*matmul).name;
    return true;
  }

  std::optional<AttentionChain> match(NodeId softmax) const {
    AttentionChain chain;
    const Node& node = graph_.node(softmax);
    const auto scores_shape = shapeOf(node.inputs[0]);
    if (!scores_shape || scores_shape->size() != 4) return std::nullopt;
    const int64_t axis = node.intAttribute("axis", default_opset_ >= 13 ? -1 : 1);
    if (axis != -1 && axis != 3) return std::nullopt;

    // Backwards from the Softmax: Cast?, Add(mask)?, then the scores.
    std::vector<NodeId> tail;  // nodes after the scores, in reverse
    ValueId value = node.inputs[0];
    if (const auto cast = producer(value, "Cast")) {
      const ValueId from = graph_.node(*cast).inputs[0];
      if (graph_.node(*cast).intAttribute("to", 0) != kOnnxFloat || !shapeOf(from) || !internal(value)) {
        return std::nullopt;
      }
      tail.push_back(*cast);
      value = from;
    }
    if (const auto add = producer(value, "Add"); add && internal(value)) {
      const std::vector<ValueId>& in = graph_.node(*add).inputs;
      for (int i = 0; i < 2 && chain.mask == kNoValue; ++i) {
        AttentionChain attempt;
        if (shapeOf(in[i]) == scores_shape && maskFits(in[1 - i], *scores_shape) && matchScores(in[i], attempt)) {
          chain = std::move(attempt);
          chain.mask = in[1 - i];
        }
      }
      if (chain.mask == kNoValue) return std::nullopt;
      tail.push_back(*add);
    } else if (!matchScores(value, chain)) {
      return std::nullopt;
    }
    chain.nodes.insert(chain.nodes.end(), tail.rbegin(), tail.rend());
    chain.nodes.push_back(softmax);

    // Forwards: Where(IsNaN(P), 0, P)?, then MatMul(P, V4).
    ValueId probs = node.outputs[0];
    if (pinned_.contains(probs)) return std::nullopt;
    const std::vector<Use>& users = graph_.value(probs).users;
    if (users.size() == 2) {
      const bool nan_first = isOp(graph_, users[0].node, "IsNaN");
      const NodeId is_nan = users[nan_first ? 0 : 1].node;
      const NodeId where = users[nan_first ? 1 : 0].node;
      if (!isOp(graph_, is_nan, "IsNaN") || !isOp(graph_, where, "Where")) return std::nullopt;
      const std::vector<ValueId>& in = graph_.node(where).inputs;
      const ValueId flags = graph_.node(is_nan).outputs[0];
      const auto zero = scalarConstant(graph_, in[1], 4);
      if (in[0] != flags || !internal(flags) || !zero || *zero != 0 || in[2] != probs) return std::nullopt;
      chain.nodes.push_back(is_nan);
      chain.nodes.push_back(where);
      probs = graph_.node(where).outputs[0];
    }
    const auto pv = onlyReader(graph_, pinned_, probs, "MatMul");
    if (!pv || graph_.node(*pv).inputs[0] != probs) return std::nullopt;
    chain.nodes.push_back(*pv);
    chain.v4 = graph_.node(*pv).inputs[1];
    chain.y4 = graph_.node(*pv).outputs[0];

    // Shapes: Q4 [B, H, S, D], Kt4 [B, H, D, T], V4 [B, H, T, Dv].
    const auto q = shapeOf(chain.q4), kt = shapeOf(chain.kt4), v = shapeOf(chain.v4), y = shapeOf(chain.y4);
    if (!q || !kt || !v || !y || q->size() != 4 || kt->size() != 4 || v->size() != 4) return std::nullopt;
    const int64_t b = (*q)[0], h = (*q)[1], s = (*q)[2], d = (*q)[3], t = (*kt)[3];
    if (*kt != Shape{b, h, d, t} || (*v)[0] != b || (*v)[1] != h || (*v)[2] != t ||
        *scores_shape != Shape{b, h, s, t} || *y != Shape{b, h, s, (*v)[3]}) {
      return std::nullopt;
    }
    if (std::min({b, h, s, d, t, (*v)[3]}) < 1) return std::nullopt;
    return chain;
  }

  // Whether `mask` is an f32 value that broadcasts to `scores` [B, H, S, T]
  // along all but its last axis, which is T.
  bool maskFits(ValueId mask, const Shape& scores) const {
    const auto m = shapeOf(mask);
    if (!m || m->empty() || m->size() > 4 || m->back() != scores.back()) return false;
    for (size_t i = 0; i < m->size(); ++i) {
      const int64_t size = (*m)[m->size() - 1 - i];
      if (size != 1 && size != scores[3 - i]) return false;
    }
    return true;
  }

  // x [B, L, H * D] when x4 is Transpose(Reshape(x, [B, L, H, D]), perm)
  // for the exporters' perms; kNoValue otherwise.
  ValueId splitSource(ValueId x4, const Shape& perm) const {
    const auto transpose = producer(x4, "Transpose");
    if (!transpose || !hasPerm(*transpose, perm)) return kNoValue;
    const ValueId split = graph_.node(*transpose).inputs[0];
    const auto reshape = producer(split, "Reshape");
    if (!reshape) return kNoValue;
    const ValueId x = graph_.node(*reshape).inputs[0];
    const auto r = shapeOf(split), xs = shapeOf(x);
    if (!r || !xs || r->size() != 4 || xs->size() != 3) return kNoValue;
    if ((*r)[0] != (*xs)[0] || (*r)[1] != (*xs)[1] || (*r)[2] * (*r)[3] != (*xs)[2]) return kNoValue;
    return x;
  }

  // K4 [B, H, T, D] when Kt4 [B, H, D, T] is its transpose as exporters
  // write it: Transpose(K4, [0, 1, 3, 2]), or (the dynamo export)
  // Reshape(Transpose(Reshape(K4, [B * H, T, D]), [0, 2, 1]), [B, H, D, T]).
  ValueId transposedKeys(ValueId kt4) const {
    if (const auto transpose = producer(kt4, "Transpose")) {
      return hasPerm(*transpose, {0, 1, 3, 2}) ? graph_.node(*transpose).inputs[0] : kNoValue;
    }
    const auto outer = producer(kt4, "Reshape");
    const auto transpose = outer ? producer(graph_.node(*outer).inputs[0], "Transpose") : std::nullopt;
    const auto inner = transpose && hasPerm(*transpose, {0, 2, 1})
                           ? producer(graph_.node(*transpose).inputs[0], "Reshape")
                           : std::nullopt;
    if (!inner) return kNoValue;
    const ValueId k4 = graph_.node(*inner).inputs[0];
    const auto kt = shapeOf(kt4), ks = shapeOf(k4);
    if (!kt || !ks || *ks != Shape{(*kt)[0], (*kt)[1], (*kt)[3], (*kt)[2]}) return kNoValue;
    return k4;
  }

  // k [B, T, H * D] behind Kt4 [B, H, D, T]: Transpose(Reshape(k, [B, T, H,
  // D]), [0, 2, 3, 1]), the transpose of a K4 split like Q4, or
  // Reshape(Transpose(k, [0, 2, 1]), [B, H, D, T]).
  ValueId keySource(ValueId kt4) const {
    if (const ValueId k = splitSource(kt4, {0, 2, 3, 1}); k != kNoValue) return k;
    if (const ValueId k4 = transposedKeys(kt4); k4 != kNoValue) return splitSource(k4, {0, 2, 1, 3});
    const auto reshape = producer(kt4, "Reshape");
    if (!reshape) return kNoValue;
    const ValueId merged = graph_.node(*reshape).inputs[0];  // [B, H * D, T]
    const auto transpose = producer(merged, "Transpose");
    if (!transpose || !hasPerm(*transpose, {0, 2, 1})) return kNoValue;
    const ValueId k = graph_.node(*transpose).inputs[0];
    const auto kt = shapeOf(kt4), ks = shapeOf(k);
    if (!kt || !ks || ks->size() != 3 || *ks != Shape{(*kt)[0], (*kt)[3], (*kt)[1] * (*kt)[2]}) return kNoValue;
    return k;
  }

  // Y when Y4 goes back as Reshape(Transpose(Y4, [0, 2, 1, 3]), [B, S, H *
  // Dv]): appends the two nodes to the chain. kNoValue otherwise.
  ValueId mergedOutput(AttentionChain& chain) const {
    const auto transpose = onlyReader(graph_, pinned_, chain.y4, "Transpose");
    if (!transpose || !hasPerm(*transpose, {0, 2, 1, 3})) return kNoValue;
    const ValueId heads = graph_.node(*transpose).outputs[0];
    const auto reshape = onlyReader(graph_, pinned_, heads, "Reshape");
    if (!reshape || graph_.node(*reshape).inputs[0] != heads) return kNoValue;
    const ValueId y = graph_.node(*reshape).outputs[0];
    const auto y4 = shapeOf(chain.y4), ys = shapeOf(y);
    if (!ys || *ys != Shape{(*y4)[0], (*y4)[2], (*y4)[1] * (*y4)[3]}) return kNoValue;
    chain.nodes.push_back(*transpose);
    chain.nodes.push_back(*reshape);
    return y;
  }

  void rewrite(AttentionChain& chain) {
    const int64_t heads = (*shapeOf(chain.q4))[1];
    Attributes attributes;
    attributes["scale"] = chain.scale;
    std::vector<ValueId> inputs;
    const ValueId q = splitSource(chain.q4, {0, 2, 1, 3});
    const ValueId k = keySource(chain.kt4);
    const ValueId v = splitSource(chain.v4, {0, 2, 1, 3});
    if (q != kNoValue && k != kNoValue && v != kNoValue && mergedOutput(chain) != kNoValue) {
      attributes["q_num_heads"] = heads;
      attributes["kv_num_heads"] = heads;
      inputs = {q, k, v};
    } else {
      inputs = {chain.q4, keysOf(chain), chain.v4};
    }
    if (chain.mask != kNoValue) inputs.push_back(chain.mask);
    replaceByFusedNode(graph_, chain.nodes, "Attention", std::move(attributes), inputs, chain.name);
  }

  // K4 [B, H, T, D] for a 4-D node: the value Kt4 transposes, or a new
  // Transpose of Kt4.
  ValueId keysOf(const AttentionChain& chain) {
    if (const ValueId k4 = transposedKeys(chain.kt4); k4 != kNoValue) return k4;
    const Shape kt = *shapeOf(chain.kt4);
    const std::string name = uniqueName(graph_, graph_.value(chain.kt4).name + "/keys");
    const NodeId transpose = graph_.addNode("Transpose", {chain.kt4}, {name}, {{"perm", Shape{0, 1, 3, 2}}});
    const ValueId keys = graph_.node(transpose).outputs[0];
    graph_.value(keys).type = ValueType::tensor(DType::kF32, {kt[0], kt[1], kt[3], kt[2]});
    return keys;
  }

  Graph& graph_;
  const std::set<ValueId> pinned_;
  const int64_t default_opset_;
};

}  // namespace

size_t fuseAttention(Graph& graph, int64_t default_opset) { return AttentionFusion(graph, default_opset).run(); }

}  // namespace kiln
