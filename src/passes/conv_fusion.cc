#include "passes/conv_fusion.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/fused_activation.h"
#include "passes/activation_match.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

struct Chain {
  std::vector<std::string> kinds;
  std::vector<float> alphas;
  std::vector<float> betas;
  ValueId residual = kNoValue;
  ValueId output = kNoValue;   // the last value of the chain
  std::vector<NodeId> nodes;   // in graph order
};

// An Add reading `value` (its only reader) and another tensor of the same
// static type: the residual Add.
bool matchResidualAdd(const Graph& graph, const std::set<ValueId>& pinned, ValueId value, Chain& chain) {
  if (chain.residual != kNoValue) return false;
  const std::optional<NodeId> add_id = onlyReader(graph, pinned, value, "Add");
  if (!add_id) return false;
  const Node& add = graph.node(*add_id);
  const ValueId other = otherOperand(graph, *add_id, value);
  if (other == kNoValue) return false;
  const ValueType& other_type = graph.value(other).type;
  if (other_type != graph.value(value).type || !other_type.hasStaticShape()) return false;
  chain.kinds.push_back("Add");
  chain.alphas.push_back(0);
  chain.betas.push_back(0);
  chain.residual = other;
  chain.nodes.push_back(*add_id);
  chain.output = add.outputs[0];
  return true;
}

// A Mul, Add, Sub or Div of `value` (its only reader) and a one-element f32
// constant: alpha * value + beta. Consecutive ones merge into one post-op
// (PP-LCNetV3 scales and shifts every activation by learned scalars before
// and after it).
bool matchScalarLinear(const Graph& graph, const std::set<ValueId>& pinned, ValueId value, Chain& chain) {
  if (pinned.contains(value) || graph.value(value).users.size() != 1) return false;
  const NodeId id = graph.value(value).users[0].node;
  const Node& node = graph.node(id);
  if (!node.domain.empty() || node.inputs.size() != 2 || node.outputs.size() != 1) return false;
  const ValueId other = otherOperand(graph, id, value);
  if (other == kNoValue) return false;
  const std::optional<float> c = scalarConstant(graph, other, graph.value(value).type.shape->size());
  if (!c) return false;
  const bool first = node.inputs[0] == value;
  float alpha = 1, beta = 0;
  if (node.op_type == "Mul") {
    alpha = *c;
  } else if (node.op_type == "Add") {
    beta = *c;
  } else if (node.op_type == "Sub" && first) {
    beta = -*c;
  } else if (node.op_type == "Div" && first && *c != 0.0f) {
    alpha = 1.0f / *c;
  } else {
    return false;
  }
  if (!chain.kinds.empty() && chain.kinds.back() == "Linear") {
    // a2 * (a1 x + b1) + b2
    chain.betas.back() = alpha * chain.betas.back() + beta;
    chain.alphas.back() *= alpha;
  } else if (std::find(chain.kinds.begin(), chain.kinds.end(), "Linear") != chain.kinds.end()) {
    // oneDNN 2.6 applies the first eltwise_linear's alpha and beta to a
    // second one in the same chain (seen as an offset of exactly the first
    // beta): one Linear per Conv.
    return false;
  } else {
    chain.kinds.emplace_back("Linear");
    chain.alphas.push_back(alpha);
    chain.betas.push_back(beta);
  }
  chain.nodes.push_back(id);
  chain.output = node.outputs[0];
  return true;
}

// The f32 values of initializer `id`, or nullopt.
std::optional<std::vector<float>> floatsOf(const Graph& graph, ValueId id) {
  if (id == kNoValue || !graph.value(id).initializer) return std::nullopt;
  const Constant& c = *graph.value(id).initializer;
  if (c.info.dtype != DType::kF32) return std::nullopt;
  std::vector<float> values(static_cast<size_t>(c.info.numElements()));
  std::memcpy(values.data(), c.bytes.data(), c.bytes.size());
  return values;
}

ConstantPtr floatConstant(const std::vector<float>& values, std::vector<int64_t> dims) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, std::move(dims)}, std::move(bytes));
}

// The per-output-channel values of constant `id` read by a binary op with
// a Conv output of `rank` dimensions whose channels lie on `channel_axis`:
// one value for all (a scalar), or one per channel on that axis (1 on every
// other), as f32. Nothing otherwise.
std::optional<std::vector<float>> channelValues(const Graph& graph, ValueId id, size_t rank, size_t channel_axis,
                                                size_t channels) {
  const auto values = floatsOf(graph, id);
  if (!values) return std::nullopt;
  const std::vector<int64_t>& dims = graph.value(id).initializer->info.shape;
  if (dims.size() > rank) return std::nullopt;
  if (values->size() == 1) return std::vector<float>(channels, values->front());
  if (values->size() != channels) return std::nullopt;
  const size_t offset = rank - dims.size();  // dims align to the right
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] != 1 && d + offset != channel_axis) return std::nullopt;
  }
  return values;
}

// A Mul, Add, Sub or Div right after Conv `id` by a scalar or per-channel
// constant becomes the Conv's weights and bias when they are constants:
// alpha * (W x + B) + beta is (alpha W) x + (alpha B + beta), per output
// channel. Frees the one Linear post-op a Conv may have for what follows its
// activation, and takes a bias exporters write apart (tf2onnx's BiasAdd
// after a squeezed Conv1D). Returns whether it folded.
bool foldLinearIntoWeights(Graph& graph, const std::set<ValueId>& pinned, NodeId id, bool channels_last,
                           bool transposed) {
  const Node& conv = graph.node(id);
  const ValueId conv_out = conv.outputs[0];
  if (pinned.contains(conv_out) || graph.value(conv_out).users.size() != 1) return false;
  const NodeId op_id = graph.value(conv_out).users[0].node;
  const Node& op = graph.node(op_id);
  if (!op.domain.empty() || op.inputs.size() != 2 || op.outputs.size() != 1) return false;
  const ValueId other = otherOperand(graph, op_id, conv_out);
  const auto w = floatsOf(graph, conv.inputs[1]);
  const bool has_bias = conv.inputs.size() > 2 && conv.inputs[2] != kNoValue;
  const auto b = has_bias ? floatsOf(graph, conv.inputs[2]) : std::nullopt;
  const auto& out_shape = graph.value(conv_out).type.shape;
  if (other == kNoValue || !w || (has_bias && !b) || !out_shape) return false;
  const std::vector<int64_t> w_dims = graph.value(conv.inputs[1]).initializer->info.shape;
  // Output channels: Conv's weights [M, C, k...], ConvTranspose's [C, M, k...]
  // (group 1).
  if (w_dims.size() < 2) return false;
  const auto channels = static_cast<size_t>(w_dims[transposed ? 1 : 0]);
  const size_t rank = out_shape->size();
  const auto c = channelValues(graph, other, rank, channels_last ? rank - 1 : 1, channels);
  // The op's output must have the Conv output's shape (no broadcast beyond it).
  if (!c || graph.value(op.outputs[0]).type.shape != out_shape) return false;
  const bool first = op.inputs[0] == conv_out;
  std::vector<float> alpha(channels, 1.0f), beta(channels, 0.0f);
  for (size_t m = 0; m < channels; ++m) {
    const float v = (*c)[m];
    if (op.op_type == "Mul") {
      alpha[m] = v;
    } else if (op.op_type == "Add") {
      beta[m] = v;
    } else if (op.op_type == "Sub" && first) {
      beta[m] = -v;
    } else if (op.op_type == "Div" && first && v != 0.0f) {
      alpha[m] = 1.0f / v;
    } else {
      return false;
    }
  }
  std::vector<float> scaled_w = *w, shifted_b(channels);
  // The weights of output channel m: one run of `per_channel` values, or
  // (transposed) one run of `kernel` values per input channel.
  const size_t per_channel = scaled_w.size() / channels;
  const size_t kernel = transposed ? per_channel / static_cast<size_t>(w_dims[0]) : per_channel;
  for (size_t i = 0; i < scaled_w.size(); ++i) {
    const size_t m = transposed ? i / kernel % channels : i / per_channel;
    scaled_w[i] *= alpha[m];
  }
  for (size_t m = 0; m < channels; ++m) shifted_b[m] = alpha[m] * (b ? (*b)[m] : 0.0f) + beta[m];
  const std::string base = graph.value(conv_out).name;
  const ValueId new_w = graph.addInitializer(uniqueName(graph, base + ":W_scaled"), floatConstant(scaled_w, w_dims));
  const ValueId new_b = graph.addInitializer(uniqueName(graph, base + ":B_shifted"),
                                             floatConstant(shifted_b, {static_cast<int64_t>(channels)}));
  if (graph.node(id).inputs.size() < 3) graph.node(id).inputs.resize(3, kNoValue);
  graph.setNodeInput(id, 1, new_w);
  graph.setNodeInput(id, 2, new_b);
  // The linear op's output keeps its name and readers; the Conv produces it.
  replaceKeepingName(graph, graph.node(op_id).outputs[0], conv_out, "/folded");
  graph.removeNode(op_id);
  return true;
}

Chain followChain(const Graph& graph, const std::set<ValueId>& pinned, ValueId start, bool fuse_clip) {
  Chain chain;
  chain.output = start;
  while (chain.kinds.size() < kMaxPostOps) {
    if (matchScalarLinear(graph, pinned, chain.output, chain)) continue;
    if (const auto activation = matchActivation(graph, pinned, chain.output, fuse_clip)) {
      chain.kinds.emplace_back(fusedActivationName(activation->kind));
      chain.alphas.push_back(activation->alpha);
      chain.betas.push_back(activation->beta);
      chain.nodes.insert(chain.nodes.end(), activation->nodes.begin(), activation->nodes.end());
      chain.output = activation->end;
      continue;
    }
    if (!matchResidualAdd(graph, pinned, chain.output, chain)) break;
  }
  return chain;
}

std::string joined(const std::vector<std::string>& kinds) {
  std::string text;
  for (const std::string& kind : kinds) text += (text.empty() ? "" : ",") + kind;
  return text;
}

}  // namespace

const std::vector<int64_t>& weightDims(const Graph& graph, const Node& node) {
  return graph.value(node.inputs[1]).initializer->info.shape;
}

// A kiln.NhwcConvTranspose that the CPU kernel runs as one matmul
// (kernels/cpu/patch_conv_transpose.h): 2-D, group 1, kernel equal to its
// strides, no pads, dilation or output padding, constant weights and bias.
// Other ones keep oneDNN's deconvolution, which runs post-ops on its
// reference kernel (PP-OCR's detector: 2.8 ms without, 68 with a Relu).
bool isPatchConvTranspose(const Graph& graph, const Node& node) {
  if (node.domain != "kiln" || node.op_type != "NhwcConvTranspose" || node.inputs.size() < 2) return false;
  const Value& w = graph.value(node.inputs[1]);
  const bool bias_ok = node.inputs.size() < 3 || node.inputs[2] == kNoValue || graph.value(node.inputs[2]).initializer;
  if (!w.initializer || !bias_ok || w.initializer->info.shape.size() != 4) return false;
  const std::vector<int64_t>& dims = w.initializer->info.shape;
  const std::vector<int64_t> kernel = {dims[2], dims[3]};
  const std::string auto_pad = node.stringAttribute("auto_pad", "NOTSET");
  return node.intAttribute("group", 1) == 1 && node.intsAttribute("kernel_shape", kernel) == kernel &&
         node.intsAttribute("strides", {1, 1}) == kernel && node.intsAttribute("dilations", {1, 1}) == std::vector<int64_t>{1, 1} &&
         node.intsAttribute("pads", {0, 0, 0, 0}) == std::vector<int64_t>{0, 0, 0, 0} &&
         node.intsAttribute("output_padding", {0, 0}) == std::vector<int64_t>{0, 0} && !node.hasAttribute("output_shape") &&
         (auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad.empty());
}

size_t fuseConvPostOps(Graph& graph, bool nchw, bool fuse_clip) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t fused = 0;
  for (NodeId id : graph.nodeIds()) {
    const Node& conv = graph.node(id);
    if (conv.removed) continue;
    const bool transposed = isPatchConvTranspose(graph, conv);
    const bool channels_last = (conv.op_type == "NhwcConv" && conv.domain == "kiln") || transposed;
    const bool plain = nchw && conv.op_type == "Conv" && conv.domain.empty();
    if (!(channels_last || plain) || conv.outputs.size() != 1) continue;
    if (conv.hasAttribute("post_ops")) continue;
    while (foldLinearIntoWeights(graph, pinned, id, channels_last, transposed)) {
    }
    // A patch ConvTranspose's product has KW * OC columns; under one vector
    // (16) oneDNN applies post-ops a few lanes at a time (DBNet's last 2x2
    // upsampling to one channel: 1.0 ms, 2.0 ms with its Sigmoid fused, where
    // the Sigmoid alone takes 0.15 ms).
    if (transposed && weightDims(graph, conv)[1] * weightDims(graph, conv)[3] < 16) continue;
    const ValueId conv_out = graph.node(id).outputs[0];
    const Chain chain = followChain(graph, pinned, conv_out, fuse_clip);
    if (chain.kinds.empty()) continue;

    // The chain's last value keeps its name and readers (graph outputs
    // included); the Conv now produces it.
    replaceKeepingName(graph, chain.output, conv_out, "/fused");
    for (auto it = chain.nodes.rbegin(); it != chain.nodes.rend(); ++it) graph.removeNode(*it);

    Node& node = graph.node(id);
    if (plain) {  // the kiln domain is where the extra attributes are defined
      node.domain = "kiln";
      node.op_type = "FusedConv";
    }
    node.attributes["post_ops"] = joined(chain.kinds);
    node.attributes["post_op_alpha"] = chain.alphas;
    node.attributes["post_op_beta"] = chain.betas;
    if (chain.residual != kNoValue) {
      node.inputs.resize(4, kNoValue);  // an omitted bias stays kNoValue
      graph.setNodeInput(id, 3, chain.residual);
    }
    fused += chain.kinds.size();
  }
  return fused;
}

// The real range [(lowest - zero) * scale, (highest - zero) * scale] that
// quantizing with this one-value scale and 8-bit zero point saturates to;
// nothing unless both are initializers.
std::optional<std::vector<float>> quantizedRange(const Graph& graph, ValueId scale, ValueId zero) {
  const Constant* s = initializerOf(graph, scale);
  const Constant* z = initializerOf(graph, zero);
  if (s == nullptr || z == nullptr || s->info.dtype != DType::kF32 || s->info.numElements() != 1 ||
      z->info.numElements() != 1 || (z->info.dtype != DType::kU8 && z->info.dtype != DType::kI8)) {
    return std::nullopt;
  }
  float scale_value = 0;
  std::memcpy(&scale_value, s->bytes.data(), sizeof(float));
  const bool is_signed = z->info.dtype == DType::kI8;
  const auto byte = static_cast<uint8_t>(z->bytes[0]);
  const float zero_value = is_signed ? static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
  const float lowest = is_signed ? -128.0f : 0.0f;
  return std::vector<float>{(lowest - zero_value) * scale_value, (lowest + 255.0f - zero_value) * scale_value};
}

size_t fuseQuantizedResidualAdds(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t fused = 0;
  for (NodeId id : graph.topologicalOrder()) {
    const Node& add = graph.node(id);
    if (add.removed || add.domain != "kiln" || add.op_type != "QLinearAdd" || add.inputs.size() != 8) continue;
    for (const uint32_t side : {0u, 3u}) {
      // The Conv's output: input `side` (with its scale and zero point after
      // it); the residual: the other operand.
      const ValueId conv_out = graph.node(id).inputs[side];
      const NodeId conv = graph.value(conv_out).producer;
      if (conv == kNoNode || graph.node(conv).domain != "kiln" || graph.node(conv).op_type != "NhwcQLinearConv" ||
          graph.node(conv).inputs.size() > 9 || pinned.contains(conv_out) || graph.value(conv_out).users.size() != 1) {
        continue;
      }
      const uint32_t other = 3 - side;
      const Node& add_now = graph.node(id);
      const ValueId residual = add_now.inputs[other];
      const ValueType& type = graph.value(conv_out).type;
      if (graph.value(residual).type != type || !type.hasStaticShape()) continue;
      bool constant_params = true;
      for (uint32_t i : {1u, 2u, 4u, 5u, 6u, 7u}) {
        constant_params = constant_params && graph.value(add_now.inputs[i]).kind == ValueKind::kInitializer;
      }
      // The Conv's own saturation, which the fused form keeps as a clip.
      const std::optional<std::vector<float>> range =
          quantizedRange(graph, graph.node(conv).inputs[6], graph.node(conv).inputs[7]);
      if (!constant_params || !range) continue;
      const ValueId residual_scale = add_now.inputs[other + 1], residual_zero = add_now.inputs[other + 2];
      const ValueId y_scale = add_now.inputs[6], y_zero = add_now.inputs[7];
      const ValueId sum = add_now.outputs[0];
      // The Add's output keeps its name and readers; the Conv now makes it,
      // quantized with the Add's parameters, the residual read by oneDNN's
      // sum post-op (kernels/cpu/quantized_conv.cc).
      replaceKeepingName(graph, sum, conv_out, "/fused");
      graph.removeNode(id);
      graph.node(conv).attributes["residual_clip"] = *range;
      graph.setNodeInput(conv, 6, y_scale);
      graph.setNodeInput(conv, 7, y_zero);
      graph.node(conv).inputs.resize(12, kNoValue);  // an omitted bias stays kNoValue
      graph.setNodeInput(conv, 9, residual);
      graph.setNodeInput(conv, 10, residual_scale);
      graph.setNodeInput(conv, 11, residual_zero);
      ++fused;
      break;
    }
  }
  return fused;
}

}  // namespace kiln
