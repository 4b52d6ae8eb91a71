#include "passes/batchnorm_folding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The values of an f32 initializer, widened to double; nullopt otherwise.
std::optional<std::vector<double>> readF32(const Graph& graph, ValueId id) {
  if (id == kNoValue) return std::nullopt;
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c || c->info.dtype != DType::kF32) return std::nullopt;
  std::vector<double> values(static_cast<size_t>(c->info.numElements()));
  for (size_t i = 0; i < values.size(); ++i) {
    float v;
    std::memcpy(&v, c->bytes.data() + i * sizeof(float), sizeof(float));
    values[i] = v;
  }
  return values;
}

ConstantPtr toF32(const std::vector<double>& values, const std::vector<int64_t>& dims) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<float>(values[i]);
    std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(float));
  }
  return makeConstant(TensorInfo{DType::kF32, dims}, std::move(bytes));
}

// A BatchNormalization's parameters per channel: a = scale / sqrt(var +
// epsilon), with mean and beta; nullopt unless scale, B, mean and var are f32
// initializers of `channels` values each.
struct Normalization {
  std::vector<double> a, mean, beta;
};

std::optional<Normalization> readNormalization(const Graph& graph, const Node& bn, size_t channels) {
  const auto scale = readF32(graph, bn.inputs[1]);
  const auto beta = readF32(graph, bn.inputs[2]);
  const auto mean = readF32(graph, bn.inputs[3]);
  const auto var = readF32(graph, bn.inputs[4]);
  for (const auto* p : {&scale, &beta, &mean, &var}) {
    if (!*p || (*p)->size() != channels) return std::nullopt;
  }
  const double epsilon = bn.floatAttribute("epsilon", 1e-5f);
  Normalization n{std::vector<double>(channels), *mean, *beta};
  for (size_t c = 0; c < channels; ++c) n.a[c] = (*scale)[c] / std::sqrt((*var)[c] + epsilon);
  return n;
}

// Folds BatchNormalization `bn_id` into its producing Conv if eligible.
bool tryFold(Graph& graph, NodeId bn_id) {
  const Node& bn = graph.node(bn_id);
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty()) return false;
  if (bn.outputs.size() != 1 || bn.intAttribute("training_mode", 0) != 0) return false;
  if (bn.inputs.size() != 5 || bn.inputs[0] == kNoValue) return false;
  const ValueId bn_out = bn.outputs[0];
  if (isGraphOutput(graph, bn_out)) return false;

  const Value& x = graph.value(bn.inputs[0]);
  if (x.kind != ValueKind::kNodeOutput || x.users.size() != 1 || isGraphOutput(graph, bn.inputs[0])) return false;
  const NodeId conv_id = x.producer;
  const Node& conv = graph.node(conv_id);
  if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) return false;
  if (conv.inputs.size() < 2 || conv.inputs.size() > 3) return false;

  const auto w = readF32(graph, conv.inputs[1]);
  if (!w) return false;
  const std::vector<int64_t> w_dims = graph.value(conv.inputs[1]).initializer->info.shape;
  if (w_dims.empty() || w_dims[0] <= 0) return false;
  const auto channels = static_cast<size_t>(w_dims[0]);
  const bool has_bias = conv.inputs.size() == 3 && conv.inputs[2] != kNoValue;
  std::vector<double> bias(channels, 0.0);
  if (has_bias) {
    auto b = readF32(graph, conv.inputs[2]);
    if (!b || b->size() != channels) return false;
    bias = std::move(*b);
  }
  const std::optional<Normalization> n = readNormalization(graph, bn, channels);
  if (!n) return false;

  // W is [M, C/group, k...]: each output channel is a contiguous block.
  const size_t per_channel = w->size() / channels;
  std::vector<double> folded_w(w->size());
  std::vector<double> folded_b(channels);
  for (size_t m = 0; m < channels; ++m) {
    for (size_t i = m * per_channel; i < (m + 1) * per_channel; ++i) folded_w[i] = (*w)[i] * n->a[m];
    folded_b[m] = (bias[m] - n->mean[m]) * n->a[m] + n->beta[m];
  }

  const std::string base = conv.name.empty() ? graph.value(conv.outputs[0]).name : conv.name;
  const ValueId new_w = graph.addInitializer(uniqueName(graph, base + ":W_folded"), toF32(folded_w, w_dims));
  const ValueId new_b =
      graph.addInitializer(uniqueName(graph, base + ":B_folded"), toF32(folded_b, {static_cast<int64_t>(channels)}));

  // An omitted optional input is kNoValue: giving a bias-less Conv a third
  // input slot keeps use lists in step; setNodeInput then fills it.
  Node& conv_mut = graph.node(conv_id);
  if (conv_mut.inputs.size() < 3) conv_mut.inputs.resize(3, kNoValue);
  graph.setNodeInput(conv_id, 1, new_w);
  graph.setNodeInput(conv_id, 2, new_b);

  const ValueId conv_out = graph.node(conv_id).outputs[0];
  graph.replaceAllUses(bn_out, conv_out);
  graph.removeNode(bn_id);
  return true;
}


// Rewrites BatchNormalization `bn_id` as Mul and Add if eligible.
bool tryScaleShift(Graph& graph, NodeId bn_id) {
  const Node& bn = graph.node(bn_id);
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty()) return false;
  if (bn.outputs.size() != 1 || bn.intAttribute("training_mode", 0) != 0) return false;
  if (bn.inputs.size() != 5 || bn.inputs[0] == kNoValue) return false;
  const ValueId x = bn.inputs[0];
  const ValueType& x_type = graph.value(x).type;
  if (x_type.dtype != DType::kF32 || !x_type.shape || x_type.shape->size() < 2) return false;
  const Dim channel_dim = (*x_type.shape)[1];
  if (!channel_dim.isKnown()) return false;
  const auto channels = static_cast<size_t>(channel_dim.size);
  const std::optional<Normalization> n = readNormalization(graph, bn, channels);
  if (!n) return false;
  const std::vector<double>& a = n->a;
  std::vector<double> b(channels);
  for (size_t c = 0; c < channels; ++c) b[c] = n->beta[c] - n->mean[c] * a[c];
  std::vector<int64_t> dims(x_type.shape->size() - 1, 1);
  dims[0] = static_cast<int64_t>(channels);
  const ValueId out = bn.outputs[0];
  const std::string name = graph.value(out).name;
  const std::string base = bn.name.empty() ? name : bn.name;
  const ValueId a_value = graph.addInitializer(uniqueName(graph, base + ":scale"), toF32(a, dims));
  const ValueId b_value = graph.addInitializer(uniqueName(graph, base + ":shift"), toF32(b, dims));
  graph.renameValue(out, uniqueName(graph, name + ":batchnorm"));
  const NodeId mul = graph.addNode("Mul", {x, a_value}, {uniqueName(graph, base + ":scaled")});
  const NodeId add = graph.addNode("Add", {graph.node(mul).outputs[0], b_value}, {name});
  graph.replaceAllUses(out, graph.node(add).outputs[0]);
  graph.removeNode(bn_id);
  return true;
}

}  // namespace

size_t rewriteBatchNormAsScaleShift(Graph& graph) {
  size_t rewritten = 0;
  for (NodeId id : graph.nodeIds()) {
    if (tryScaleShift(graph, id)) ++rewritten;
  }
  return rewritten;
}


size_t foldBatchNormIntoConv(Graph& graph) {
  size_t folded = 0;
  for (NodeId id : graph.nodeIds()) {
    if (tryFold(graph, id)) ++folded;
  }
  return folded;
}

}  // namespace kiln
