#include "passes/channels_last.h"

#include <array>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

using Perm = std::array<int64_t, 4>;
constexpr Perm kToNhwc{0, 2, 3, 1};  // NCHW -> NHWC: out[i] = in[kToNhwc[i]]
constexpr Perm kToNchw{0, 3, 1, 2};

// The channels-last axis that holds NCHW axis `axis` (negative axes count
// from the end, as in ONNX).
int64_t nhwcAxis(int64_t axis) {
  if (axis < 0) axis += 4;
  for (int64_t i = 0; i < 4; ++i) {
    if (kToNhwc[i] == axis) return i;
  }
  return axis;  // out of range: left for shape inference to report
}

const std::set<std::string>& convertedOps() {
  static const std::set<std::string> kOps = {"Conv",          "ConvTranspose", "MaxPool",     "AveragePool",
                                             "GlobalAveragePool", "GlobalMaxPool", "Resize", "QLinearConv"};
  return kOps;
}

// Operators that compute each output element from the input elements at the
// same position (after broadcasting): indifferent to the layout.
const std::set<std::string>& elementwiseOps() {
  static const std::set<std::string> kOps = {
      "Abs",  "Add",       "Cast",        "Ceil",    "Celu",  "Clip",    "Div",      "Elu",  "Erf",
      "Exp",  "Floor",     "Gelu",        "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Max", "Mean",
      "Min",  "Mish",      "Mul",         "Neg",     "Pow",   "PRelu",   "Reciprocal", "Relu", "Round",
      "Selu", "Sigmoid",   "Sign",        "Softplus", "Softsign", "Sqrt", "Sub",      "Sum",  "Tanh",
      "ThresholdedRelu",
      // Not arithmetic, but layout-blind all the same: the Identity that keeps
      // a fused value's name (squeeze-excite blocks end up with one between
      // a Conv and its Relu).
      "Identity"};
  return kOps;
}

std::vector<Dim> permuted(const std::vector<Dim>& dims, const Perm& perm) {
  std::vector<Dim> out;
  for (int64_t axis : perm) out.push_back(dims[static_cast<size_t>(axis)]);
  return out;
}

bool isRank4(const Value& value, DType dtype) {
  return value.type.dtype == dtype && value.type.shape && value.type.shape->size() == 4;
}

bool isInteger8Rank4(const Value& value) { return isRank4(value, DType::kU8) || isRank4(value, DType::kI8); }

bool isSingleConstant(const Graph& graph, ValueId id) {
  const Constant* c = initializerOf(graph, id);
  return c != nullptr && c->info.numElements() == 1;
}

// A QLinearConv that kiln.NhwcQLinearConv runs (kernels/cpu/quantized_conv.cc):
// 2-D, i8 weights with zero points 0, constant parameters, one scale and zero
// point for the activations.
bool isIntegerConv(const Graph& graph, const Node& node) {
  const std::vector<ValueId>& in = node.inputs;
  if (in.size() < 8 || !isInteger8Rank4(graph.value(in[0]))) return false;
  const Constant* w = initializerOf(graph, in[3]);
  const Constant* w_scale = initializerOf(graph, in[4]);
  const Constant* w_zero = initializerOf(graph, in[5]);
  if (w == nullptr || w->info.dtype != DType::kI8 || w->info.shape.size() != 4 || w_scale == nullptr ||
      w_zero == nullptr || !allZero(*w_zero)) {
    return false;
  }
  for (size_t i : {1u, 2u, 6u, 7u}) {
    if (!isSingleConstant(graph, in[i])) return false;
  }
  return in.size() < 9 || in[8] == kNoValue || initializerOf(graph, in[8]) != nullptr;
}

bool hasRank4Outputs(const Graph& graph, const Node& node) {
  for (ValueId output : node.outputs) {
    const Value& v = graph.value(output);
    if (!v.type.shape || v.type.shape->size() != 4) return false;
  }
  return true;
}

// A constant of rank <= 4, seen as 4-D with leading 1s, permuted to NHWC.
ConstantPtr permutedConstant(const Constant& c) {
  std::array<int64_t, 4> d{1, 1, 1, 1};
  const size_t rank = c.info.shape.size();
  for (size_t i = 0; i < rank; ++i) d[4 - rank + i] = c.info.shape[i];
  const size_t element = dtypeSize(c.info.dtype);
  std::vector<std::byte> bytes(c.bytes.size());
  size_t out = 0;
  for (int64_t n = 0; n < d[0]; ++n) {
    for (int64_t h = 0; h < d[2]; ++h) {
      for (int64_t w = 0; w < d[3]; ++w) {
        for (int64_t ch = 0; ch < d[1]; ++ch) {
          const auto in = static_cast<size_t>(((n * d[1] + ch) * d[2] + h) * d[3] + w);
          std::memcpy(bytes.data() + out * element, c.bytes.data() + in * element, element);
          ++out;
        }
      }
    }
  }
  return makeConstant(TensorInfo{c.info.dtype, {d[0], d[2], d[3], d[1]}}, std::move(bytes));
}

class ChannelsLast {
 public:
  explicit ChannelsLast(Graph& graph) : graph_(graph) {}

  size_t run() {
    size_t converted = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (isConvertible(graph_.node(id))) {
        convertLayoutOp(id);
        ++converted;
      } else if (isAgnostic(graph_.node(id))) {
        convertAgnosticOp(id);
      } else {
        for (uint32_t i = 0; i < graph_.node(id).inputs.size(); ++i) {
          const ValueId input = graph_.node(id).inputs[i];
          if (nhwc_.contains(input)) graph_.setNodeInput(id, i, toNchw(input));
        }
      }
    }
    for (size_t i = 0; i < graph_.outputs().size(); ++i) {
      if (nhwc_.contains(graph_.outputs()[i])) graph_.setOutput(i, toNchw(graph_.outputs()[i]));
    }
    keepNamesReadBySubgraphs();
    return converted;
  }

 private:
  bool isConvertible(const Node& node) const {
    if (!node.domain.empty() || !convertedOps().contains(node.op_type)) return false;
    if (node.inputs.empty() || node.inputs[0] == kNoValue || node.outputs.size() != 1) return false;
    if (node.op_type == "QLinearConv") return isIntegerConv(graph_, node);
    const Value& x = graph_.value(node.inputs[0]);
    // MaxPool and a nearest Resize pick elements: 8-bit data as well.
    const bool picks = node.op_type == "MaxPool" ||
                       (node.op_type == "Resize" && node.stringAttribute("mode", "nearest") == "nearest");
    if (!isRank4(x, DType::kF32) && !(picks && isInteger8Rank4(x))) return false;
    if (node.op_type == "AveragePool" && node.intAttribute("count_include_pad", 0) != 0 &&
        node.intAttribute("ceil_mode", 0) != 0) {
      return false;
    }
    if (node.op_type == "Resize") {
      // The opset-11 form, resizing only H and W (what the kernel does).
      if (node.inputs.size() < 3 || node.hasAttribute("axes")) return false;
      std::vector<Dim> in = *graph_.value(node.inputs[0]).type.shape;
      if (nhwc_.contains(node.inputs[0])) in = permuted(in, kToNchw);
      const ValueType& out = graph_.value(node.outputs[0]).type;
      if (!out.shape || out.shape->size() != 4) return false;
      for (size_t d = 0; d < 2; ++d) {
        if (!in[d].isKnown() || in[d] != (*out.shape)[d]) return false;
      }
    }
    return true;
  }

  // Whether input `value` of an elementwise node can be read in NHWC: it is
  // channels-last already, or converted for another reader already, or a
  // scalar, or a constant we can permute.
  bool readableInNhwc(ValueId value) const {
    if (value == kNoValue || nhwc_.contains(value) || to_nhwc_.contains(value)) return true;
    const Value& v = graph_.value(value);
    if (v.type.hasStaticShape() && v.type.tensorInfo()->numElements() == 1) return true;
    return v.kind == ValueKind::kInitializer && v.initializer->info.shape.size() <= 4;
  }

  // An elementwise operator: the ONNX ones above; QuantizeLinear and
  // DequantizeLinear with one scale and zero point (per-axis ones index
  // channels by their axis); kiln.QLinearAdd and kiln.QLinearMul (their
// parameters are one value).
  bool isElementwise(const Node& node) const {
    if (node.domain == "kiln") return node.op_type == "QLinearAdd" || node.op_type == "QLinearMul";
    if (!node.domain.empty()) return false;
    if (node.op_type == "QuantizeLinear" || node.op_type == "DequantizeLinear") {
      if (node.intAttribute("block_size", 0) != 0) return false;
      for (size_t i = 1; i < node.inputs.size(); ++i) {
        const ValueType& type = graph_.value(node.inputs[i]).type;
        if (node.inputs[i] != kNoValue && !(type.hasStaticShape() && type.tensorInfo()->numElements() == 1)) return false;
      }
      return true;
    }
    return elementwiseOps().contains(node.op_type);
  }

  // Ops of any layout once their axis is renumbered.
  static bool isConcatOrSplit(const Node& node) {
    if (node.domain == "kiln") return node.op_type == "QLinearConcat";
    return node.domain.empty() && (node.op_type == "Concat" || node.op_type == "Split");
  }

  bool isAgnostic(const Node& node) const {
    const bool elementwise = isElementwise(node);
    if (!elementwise && !isConcatOrSplit(node)) return false;
    if (!hasRank4Outputs(graph_, node)) return false;
    bool any_nhwc = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId input = node.inputs[i];
      any_nhwc = any_nhwc || nhwc_.contains(input);
      // Split's optional second input holds sizes, not data.
      if (node.op_type == "Split" && i > 0) continue;
      if (!readableInNhwc(input)) return false;
    }
    return any_nhwc;
  }

  void convertLayoutOp(NodeId id) {
    const ValueId x = graph_.node(id).inputs[0];
    if (!nhwc_.contains(x)) graph_.setNodeInput(id, 0, toNhwc(x));
    Node& node = graph_.node(id);
    node.op_type = "Nhwc" + node.op_type;
    node.domain = "kiln";
    markOutputsNhwc(node);
  }

  void convertAgnosticOp(NodeId id) {
    const Node& node = graph_.node(id);
    for (uint32_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId input = graph_.node(id).inputs[i];
      if (input == kNoValue || nhwc_.contains(input)) continue;
      if (node.op_type == "Split" && i > 0) continue;
      if (const auto converted = to_nhwc_.find(input); converted != to_nhwc_.end()) {
        graph_.setNodeInput(id, i, converted->second);
        continue;
      }
      const Value& v = graph_.value(input);
      if (v.kind == ValueKind::kInitializer && v.initializer->info.numElements() > 1) {
        graph_.setNodeInput(id, i, permutedInitializer(input));
      }
    }
    Node& mutable_node = graph_.node(id);
    if (isConcatOrSplit(mutable_node)) {
      mutable_node.attributes["axis"] = nhwcAxis(mutable_node.intAttribute("axis", 0));
    }
    markOutputsNhwc(mutable_node);
  }

  // The node's outputs now hold NHWC data: rename them ("<name>/nhwc") and
  // permute their types; the original names go to the NCHW copies.
  void markOutputsNhwc(const Node& node) {
    for (ValueId output : node.outputs) {
      Value& v = graph_.value(output);
      original_names_[output] = v.name;
      graph_.renameValue(output, uniqueName(graph_, v.name + "/nhwc"));
      if (v.type.shape) v.type.shape = permuted(*v.type.shape, kToNhwc);
      nhwc_.insert(output);
    }
  }

  ValueId addTranspose(ValueId input, const Perm& perm, const std::string& name) {
    ValueType type = graph_.value(input).type;
    if (type.shape) type.shape = permuted(*type.shape, perm);
    const NodeId id = graph_.addNode("Transpose", {input}, {name},
                                     {{"perm", std::vector<int64_t>(perm.begin(), perm.end())}});
    const ValueId output = graph_.node(id).outputs[0];
    graph_.value(output).type = type;
    return output;
  }

  // NCHW value `value` in NHWC, one Transpose per value.
  ValueId toNhwc(ValueId value) {
    auto [it, inserted] = to_nhwc_.try_emplace(value, kNoValue);
    if (inserted) it->second = addTranspose(value, kToNhwc, uniqueName(graph_, graph_.value(value).name + "/nhwc"));
    return it->second;
  }

  // Channels-last value `value` back in NCHW, under its original name.
  ValueId toNchw(ValueId value) {
    auto [it, inserted] = to_nchw_.try_emplace(value, kNoValue);
    if (inserted) it->second = addTranspose(value, kToNchw, uniqueName(graph_, original_names_.at(value)));
    return it->second;
  }

  ValueId permutedInitializer(ValueId value) {
    auto [it, inserted] = permuted_constants_.try_emplace(value, kNoValue);
    if (inserted) {
      const Value& v = graph_.value(value);
      it->second = graph_.addInitializer(uniqueName(graph_, v.name + "/nhwc"), permutedConstant(*v.initializer));
    }
    return it->second;
  }

  static void collectOuterScopeNames(const Graph& graph, std::set<std::string>& names) {
    for (NodeId id : graph.nodeIds()) {
      for (const Graph* subgraph : graph.node(id).subgraphs()) {
        for (ValueId outer : subgraph->outerScopeValues()) names.insert(subgraph->value(outer).name);
        collectOuterScopeNames(*subgraph, names);
      }
    }
  }

  void keepNamesReadBySubgraphs() {
    std::set<std::string> names;
    collectOuterScopeNames(graph_, names);
    if (names.empty()) return;
    for (const auto& [value, name] : original_names_) {
      if (names.contains(name)) toNchw(value);
    }
  }

  Graph& graph_;
  std::set<ValueId> nhwc_;                       // values holding NHWC data
  std::map<ValueId, std::string> original_names_;  // of the values in nhwc_
  std::map<ValueId, ValueId> to_nhwc_;           // NCHW value -> its NHWC Transpose
  std::map<ValueId, ValueId> to_nchw_;           // NHWC value -> its NCHW Transpose
  std::map<ValueId, ValueId> permuted_constants_;
};

}  // namespace

size_t convertToChannelsLast(Graph& graph) { return ChannelsLast(graph).run(); }

}  // namespace kiln
