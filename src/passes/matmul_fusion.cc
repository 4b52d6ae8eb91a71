#include "passes/matmul_fusion.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/fused_activation.h"
#include "passes/activation_match.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// oneDNN's DNNL_MAX_NDIMS: the fused kernels have no path beyond it.
constexpr size_t kMaxFusedRank = 12;

class MatMulFusion {
 public:
  MatMulFusion(Graph& graph, bool fuse_clip) : graph_(graph), pinned_(pinnedValues(graph)), fuse_clip_(fuse_clip) {}

  size_t run() {
    size_t fused = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (graph_.node(id).removed) continue;  // absorbed by an earlier chain
      if (isOp(id, "MatMul")) {
        fused += fuseMatMul(id) ? 1 : 0;
      } else if (isOp(id, "Gemm")) {
        fused += fuseGemm(id) ? 1 : 0;
      }
    }
    return fused;
  }

 private:
  bool isOp(NodeId id, std::string_view op) const { return kiln::isOp(graph_, id, op); }

  const std::vector<Dim>& shapeOf(ValueId id) const { return *graph_.value(id).type.shape; }

  // f32 with a static shape, and no zero-sized dimension when `nonempty`.
  bool isStaticF32(ValueId id, bool nonempty = false) const {
    if (id == kNoValue) return false;
    const ValueType& type = graph_.value(id).type;
    if (type.dtype != DType::kF32 || !type.hasStaticShape()) return false;
    for (const Dim& dim : *type.shape) {
      if (nonempty && dim.size == 0) return false;
    }
    return true;
  }

  std::optional<NodeId> onlyReader(ValueId value, std::string_view op) const {
    return kiln::onlyReader(graph_, pinned_, value, op);
  }
  ValueId otherOperand(NodeId id, ValueId value) const { return kiln::otherOperand(graph_, id, value); }
  std::optional<ActivationMatch> matchActivation(ValueId x) const {
    return kiln::matchActivation(graph_, pinned_, x, fuse_clip_);
  }

  bool fuseMatMul(NodeId id);
  bool fuseGemm(NodeId id);
  void rewrite(const std::vector<NodeId>& chain, const std::string& op, Attributes attributes,
               const std::vector<ValueId>& inputs);

  Graph& graph_;
  const std::set<ValueId> pinned_;
  const bool fuse_clip_;
};

// ------------------------------------------------------------------ chains

bool MatMulFusion::fuseMatMul(NodeId id) {
  const Node& matmul = graph_.node(id);
  const ValueId a = matmul.inputs[0], b = matmul.inputs[1];
  ValueId value = matmul.outputs[0];
  if (!isStaticF32(a, true) || !isStaticF32(b, true) || !isStaticF32(value)) return false;
  if (shapeOf(a).size() < 2 || shapeOf(b).size() < 2 || shapeOf(value).size() > kMaxFusedRank) return false;
  const std::vector<Dim>& out = shapeOf(value);

  std::vector<NodeId> chain = {id};
  ValueId bias = kNoValue, residual = kNoValue;
  if (const auto add = onlyReader(value, "Add")) {
    const ValueId other = otherOperand(*add, value);
    const ConstantPtr constant = other == kNoValue ? nullptr : graph_.value(other).initializer;
    bool row = constant && isStaticF32(other) && !shapeOf(other).empty() && shapeOf(other).size() <= out.size() &&
               shapeOf(other).back() == out.back();
    for (size_t d = 0; row && d + 1 < shapeOf(other).size(); ++d) row = shapeOf(other)[d].size == 1;
    if (row) {
      bias = other;
      chain.push_back(*add);
      value = graph_.node(*add).outputs[0];
    }
  }
  if (const auto add = onlyReader(value, "Add")) {
    const ValueId other = otherOperand(*add, value);
    if (isStaticF32(other) && shapeOf(other) == out) {
      residual = other;
      chain.push_back(*add);
      value = graph_.node(*add).outputs[0];
    }
  }
  Attributes attributes;
  if (const auto activation = matchActivation(value)) {
    chain.insert(chain.end(), activation->nodes.begin(), activation->nodes.end());
    setActivation(attributes, *activation);
  }
  if (chain.size() == 1) return false;
  std::vector<ValueId> inputs = {a, b};
  if (bias != kNoValue || residual != kNoValue) inputs.push_back(bias);
  if (residual != kNoValue) inputs.push_back(residual);
  rewrite(chain, "FusedMatMul", std::move(attributes), inputs);
  return true;
}

bool MatMulFusion::fuseGemm(NodeId id) {
  const Node& gemm = graph_.node(id);
  const std::vector<ValueId> inputs = gemm.inputs;
  for (ValueId input : inputs) {
    if (input != kNoValue && !isStaticF32(input, true)) return false;
  }
  if (!isStaticF32(gemm.outputs[0])) return false;
  const auto activation = matchActivation(gemm.outputs[0]);
  if (!activation) return false;
  Attributes attributes = gemm.attributes;
  setActivation(attributes, *activation);
  std::vector<NodeId> chain = {id};
  chain.insert(chain.end(), activation->nodes.begin(), activation->nodes.end());
  rewrite(chain, "FusedGemm", std::move(attributes), inputs);
  return true;
}

// The chain's last node becomes the fused node, named after the MatMul or
// Gemm (for profiles).
void MatMulFusion::rewrite(const std::vector<NodeId>& chain, const std::string& op, Attributes attributes,
                           const std::vector<ValueId>& inputs) {
  replaceByFusedNode(graph_, chain, op, std::move(attributes), inputs, graph_.node(chain.front()).name);
}

}  // namespace

size_t fuseMatMuls(Graph& graph, bool fuse_clip) { return MatMulFusion(graph, fuse_clip).run(); }

}  // namespace kiln
