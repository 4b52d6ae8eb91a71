#include "passes/layernorm_fusion.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// Whether ReduceMean `id` reduces the last axis only, keeping it.
bool reducesLastAxis(const Graph& graph, NodeId id, size_t rank) {
  const Node& node = graph.node(id);
  if (node.intAttribute("keepdims", 1) != 1) return false;
  std::vector<int64_t> axes = node.intsAttribute("axes", {});
  if (node.inputs.size() > 1 && node.inputs[1] != kNoValue) {  // opset 18: axes as an input
    const ConstantPtr& c = graph.value(node.inputs[1]).initializer;
    if (!c || c->info.dtype != DType::kI64) return false;
    axes.resize(static_cast<size_t>(c->info.numElements()));
    std::memcpy(axes.data(), c->bytes.data(), c->bytes.size());
  }
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == static_cast<int64_t>(rank) - 1);
}

// Both fusions start from a ReduceMean: LayerNorm's mean of x, RMS norm's
// mean of squares.
class NormalizationFusion {
 public:
  enum class Kind { kLayerNorm, kRmsNorm };
  NormalizationFusion(Graph& graph, Kind kind) : graph_(graph), pinned_(pinnedValues(graph)), kind_(kind) {}

  size_t run() {
    size_t fused = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed || !isOp(graph_, id, "ReduceMean")) continue;
      if (kind_ == Kind::kLayerNorm ? tryLayerNorm(id) : tryRmsNorm(id)) ++fused;
    }
    return fused;
  }

 private:
  std::optional<NodeId> reader(ValueId value, const char* op) const { return onlyReader(graph_, pinned_, value, op); }

  bool reducesLastAxis(NodeId id, size_t rank) const { return kiln::reducesLastAxis(graph_, id, rank); }

  // A new initializer of `channels` ones, named after `near`: the gamma of a
  // normalization written without one.
  ValueId ones(ValueId near, int64_t channels) {
    std::vector<float> values(static_cast<size_t>(channels), 1.0f);
    std::vector<std::byte> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return graph_.addInitializer(uniqueName(graph_, graph_.value(near).name + "/ones"),
                                 makeConstant(TensorInfo{DType::kF32, {channels}}, std::move(bytes)));
  }

  // An f32 initializer of shape [channels].
  bool isChannelVector(ValueId id, int64_t channels) const {
    const ConstantPtr& c = id == kNoValue ? nullptr : graph_.value(id).initializer;
    return c && c->info.dtype == DType::kF32 && c->info.shape == std::vector<int64_t>{channels};
  }

  bool tryLayerNorm(NodeId mean_id) {
    const ValueId x = graph_.node(mean_id).inputs[0];
    const ValueType& type = graph_.value(x).type;
    if (type.dtype != DType::kF32 || !type.shape || type.shape->empty() || !type.shape->back().isKnown()) return false;
    const size_t rank = type.shape->size();
    const int64_t channels = type.shape->back().size;
    if (!reducesLastAxis(mean_id, rank)) return false;

    const ValueId m = graph_.node(mean_id).outputs[0];
    const auto sub = reader(m, "Sub");
    if (!sub || graph_.node(*sub).inputs[0] != x) return false;
    const ValueId d = graph_.node(*sub).outputs[0];
    // d is read by the square and the division, nothing else (Mul(d, d)
    // reads it twice).
    std::set<NodeId> d_readers;
    for (const Use& use : graph_.value(d).users) d_readers.insert(use.node);
    if (pinned_.contains(d) || d_readers.size() != 2) return false;
    std::optional<NodeId> square, div;
    for (const NodeId user : d_readers) {
      if (isOp(graph_, user, "Pow") && graph_.node(user).inputs[0] == d &&
          scalarConstant(graph_, graph_.node(user).inputs[1], rank) == 2.0f) {
        square = user;
      } else if (isOp(graph_, user, "Mul") && graph_.node(user).inputs[0] == d && graph_.node(user).inputs[1] == d) {
        square = user;
      } else if (isOp(graph_, user, "Div") && graph_.node(user).inputs[0] == d) {
        div = user;
      }
    }
    if (!square || !div) return false;
    const auto var = reader(graph_.node(*square).outputs[0], "ReduceMean");
    if (!var || !reducesLastAxis(*var, rank)) return false;
    const auto add_eps = reader(graph_.node(*var).outputs[0], "Add");
    if (!add_eps) return false;
    const std::optional<float> epsilon =
        scalarConstant(graph_, otherOperand(graph_, *add_eps, graph_.node(*var).outputs[0]), rank);
    if (!epsilon) return false;
    const auto sqrt = reader(graph_.node(*add_eps).outputs[0], "Sqrt");
    if (!sqrt || reader(graph_.node(*sqrt).outputs[0], "Div") != div || graph_.node(*div).inputs[1] != graph_.node(*sqrt).outputs[0]) {
      return false;
    }

    std::vector<NodeId> nodes = {mean_id, *sub, *square, *var, *add_eps, *sqrt, *div};
    ValueId end = graph_.node(*div).outputs[0];
    ValueId gamma = kNoValue, beta = kNoValue;
    if (const auto mul = reader(end, "Mul"); mul && isChannelVector(otherOperand(graph_, *mul, end), channels)) {
      gamma = otherOperand(graph_, *mul, end);
      nodes.push_back(*mul);
      end = graph_.node(*mul).outputs[0];
    }
    if (const auto add = reader(end, "Add"); add && isChannelVector(otherOperand(graph_, *add, end), channels)) {
      beta = otherOperand(graph_, *add, end);
      nodes.push_back(*add);
      end = graph_.node(*add).outputs[0];
    }
    if (gamma == kNoValue) gamma = ones(end, channels);

    // The last node becomes the LayerNormalization so that `end` keeps its
    // value (name, graph-output slot); the others go, readers first.
    const NodeId last = nodes.back();
    for (uint32_t i = 0; i < graph_.node(last).inputs.size(); ++i) graph_.setNodeInput(last, i, kNoValue);
    Node& node = graph_.node(last);
    node.op_type = "LayerNormalization";
    node.domain.clear();
    node.attributes = {{"axis", int64_t{-1}}, {"epsilon", *epsilon}};
    node.inputs.assign(beta == kNoValue ? 2 : 3, kNoValue);
    graph_.setNodeInput(last, 0, x);
    graph_.setNodeInput(last, 1, gamma);
    if (beta != kNoValue) graph_.setNodeInput(last, 2, beta);
    for (auto it = nodes.rbegin() + 1; it != nodes.rend(); ++it) graph_.removeNode(*it);
    return true;
  }

  // x when `square` is Pow(x, 2) or Mul(x, x).
  ValueId squared(NodeId square, size_t rank) const {
    const Node& node = graph_.node(square);
    if (isOp(graph_, square, "Pow") && scalarConstant(graph_, node.inputs[1], rank) == 2.0f) return node.inputs[0];
    if (isOp(graph_, square, "Mul") && node.inputs[0] == node.inputs[1]) return node.inputs[0];
    return kNoValue;
  }

  // RMS normalization as T5's and LLaMA's exports write it:
  //   v = ReduceMean(Pow(x, 2) | Mul(x, x), axes=[last], keepdims=1)
  //   s = Sqrt(Add(v, epsilon))
  //   n = Mul(x, Div(1, s)) | Mul(x, Reciprocal(s)) | Div(x, s)   (operands in either order)
  //   y = Mul(n, gamma)                                            (optional; either order)
  bool tryRmsNorm(NodeId mean_id) {
    const ValueId sq = graph_.node(mean_id).inputs[0];
    const NodeId square = graph_.value(sq).producer;
    if (square == kNoNode || pinned_.contains(sq) || graph_.value(sq).users.size() != 1) return false;
    const ValueType& type = graph_.value(sq).type;
    if (type.dtype != DType::kF32 || !type.shape || type.shape->empty() || !type.shape->back().isKnown()) return false;
    const size_t rank = type.shape->size();
    const int64_t channels = type.shape->back().size;
    const ValueId x = squared(square, rank);
    if (x == kNoValue || !reducesLastAxis(mean_id, rank)) return false;
    const ValueId v = graph_.node(mean_id).outputs[0];
    const auto add_eps = reader(v, "Add");
    if (!add_eps) return false;
    const std::optional<float> epsilon = scalarConstant(graph_, otherOperand(graph_, *add_eps, v), rank);
    const auto sqrt = epsilon ? reader(graph_.node(*add_eps).outputs[0], "Sqrt") : std::nullopt;
    if (!sqrt) return false;
    std::vector<NodeId> nodes = {square, mean_id, *add_eps, *sqrt};
    const ValueId s = graph_.node(*sqrt).outputs[0];
    ValueId end = kNoValue;
    if (const auto div = reader(s, "Div")) {
      const Node& node = graph_.node(*div);
      if (node.inputs[1] != s) return false;
      if (node.inputs[0] == x) {  // x / s
        nodes.push_back(*div);
        end = node.outputs[0];
      } else if (scalarConstant(graph_, node.inputs[0], rank) == 1.0f) {  // (1 / s), times x below
        nodes.push_back(*div);
      } else {
        return false;
      }
    } else if (const auto reciprocal = reader(s, "Reciprocal")) {
      nodes.push_back(*reciprocal);
    } else {
      return false;
    }
    if (end == kNoValue) {
      const ValueId r = graph_.node(nodes.back()).outputs[0];
      const auto mul = reader(r, "Mul");
      if (!mul || otherOperand(graph_, *mul, r) != x) return false;
      nodes.push_back(*mul);
      end = graph_.node(*mul).outputs[0];
    }
    if (graph_.value(end).type.shape != type.shape) return false;
    ValueId gamma = kNoValue;
    if (const auto mul = reader(end, "Mul"); mul && isChannelVector(otherOperand(graph_, *mul, end), channels)) {
      gamma = otherOperand(graph_, *mul, end);
      nodes.push_back(*mul);
    }
    if (gamma == kNoValue) gamma = ones(end, channels);
    replaceByFusedNode(graph_, nodes, "RMSNormalization", {{"axis", int64_t{-1}}, {"epsilon", *epsilon}},
                       {x, gamma}, graph_.node(mean_id).name);
    return true;
  }

  Graph& graph_;
  const std::set<ValueId> pinned_;
  const Kind kind_;
};

}  // namespace

size_t fuseRmsNorms(Graph& graph) { return NormalizationFusion(graph, NormalizationFusion::Kind::kRmsNorm).run(); }

size_t fuseLayerNorms(Graph& graph) { return NormalizationFusion(graph, NormalizationFusion::Kind::kLayerNorm).run(); }

}  // namespace kiln
