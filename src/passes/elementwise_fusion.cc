#include "passes/elementwise_fusion.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

constexpr size_t kAnyRank = std::numeric_limits<size_t>::max();

// What a candidate node computes, as one instruction of a program: the op,
// its parameters, and the values it reads as operands (Pow's exponent and
// Clip's bounds are parameters, not operands).
struct Candidate {
  ElementwiseOp op = ElementwiseOp::kRelu;
  float alpha = 0;
  float beta = 0;
  std::vector<ValueId> operands;  // one or two
  bool cube = false;              // Pow(x, 3): two instructions, Square(x) then Mul(x^2, x)
};

bool isStaticF32(const Graph& graph, ValueId id) {
  if (id == kNoValue) return false;
  const ValueType& type = graph.value(id).type;
  return type.dtype == DType::kF32 && type.hasStaticShape();
}

// The ops that need nothing but their one input.
const std::map<std::string, ElementwiseOp, std::less<>> kPlainUnary = {
    {"Relu", ElementwiseOp::kRelu},         {"Sigmoid", ElementwiseOp::kSigmoid},
    {"HardSwish", ElementwiseOp::kHardSwish}, {"Softplus", ElementwiseOp::kSoftplus},
    {"Tanh", ElementwiseOp::kTanh},         {"Exp", ElementwiseOp::kExp},
    {"Log", ElementwiseOp::kLog},           {"Sqrt", ElementwiseOp::kSqrt},
    {"Erf", ElementwiseOp::kErf},           {"Abs", ElementwiseOp::kAbs},
    {"Neg", ElementwiseOp::kNeg},           {"Reciprocal", ElementwiseOp::kReciprocal},
    {"Floor", ElementwiseOp::kFloor},       {"Ceil", ElementwiseOp::kCeil}};
const std::map<std::string, ElementwiseOp, std::less<>> kBinary = {
    {"Add", ElementwiseOp::kAdd}, {"Sub", ElementwiseOp::kSub}, {"Mul", ElementwiseOp::kMul},
    {"Div", ElementwiseOp::kDiv}, {"Max", ElementwiseOp::kMax}, {"Min", ElementwiseOp::kMin}};

// The op and its parameters when `node` is one the header lists (its types
// not yet checked).
std::optional<Candidate> describeOp(const Graph& graph, const Node& node) {
  const std::vector<ValueId>& in = node.inputs;
  Candidate c;
  if (const auto it = kPlainUnary.find(node.op_type); it != kPlainUnary.end() && in.size() == 1) {
    c.op = it->second;
  } else if (const auto binary = kBinary.find(node.op_type); binary != kBinary.end() && in.size() == 2) {
    c.op = binary->second;
    c.operands = in;
  } else if (node.op_type == "LeakyRelu" && in.size() == 1) {
    c = {ElementwiseOp::kLeakyRelu, node.floatAttribute("alpha", 0.01f), 0, {}};
  } else if (node.op_type == "Elu" && in.size() == 1) {
    c = {ElementwiseOp::kElu, node.floatAttribute("alpha", 1.0f), 0, {}};
  } else if (node.op_type == "HardSigmoid" && in.size() == 1) {
    c = {ElementwiseOp::kHardSigmoid, node.floatAttribute("alpha", 0.2f), node.floatAttribute("beta", 0.5f), {}};
  } else if (node.op_type == "Gelu" && in.size() == 1) {
    const std::string approximate = node.stringAttribute("approximate", "none");
    if (approximate != "none" && approximate != "tanh") return std::nullopt;
    c.op = approximate == "none" ? ElementwiseOp::kGelu : ElementwiseOp::kGeluTanh;
  } else if (node.op_type == "Clip" && !in.empty() && in.size() <= 3) {
    // As the Clip kernel: an absent bound is the attribute (before opset
    // 11) or unbounded.
    c.op = ElementwiseOp::kClip;
    float bounds[2] = {node.floatAttribute("min", -std::numeric_limits<float>::infinity()),
                       node.floatAttribute("max", std::numeric_limits<float>::infinity())};
    for (size_t k = 0; k < 2; ++k) {
      if (k + 1 >= in.size() || in[k + 1] == kNoValue) continue;
      const std::optional<float> bound = scalarConstant(graph, in[k + 1], kAnyRank);
      if (!bound) return std::nullopt;
      bounds[k] = *bound;
    }
    c.alpha = bounds[0];
    c.beta = bounds[1];
  } else if (node.op_type == "Pow" && in.size() == 2) {
    const std::optional<float> exponent = scalarConstant(graph, in[1], kAnyRank);
    if (exponent == 2.0f || exponent == 3.0f) {
      c.op = ElementwiseOp::kSquare;
      c.cube = exponent == 3.0f;  // (x * x) * x: within 2 ulp of pow, as the Pow kernel's cube
    } else if (exponent == 0.5f) {
      c.op = ElementwiseOp::kPowHalf;
    } else {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (c.operands.empty()) c.operands = {in[0]};
  return c;
}

std::optional<Candidate> describe(const Graph& graph, NodeId id) {
  const Node& node = graph.node(id);
  if (node.removed || !node.domain.empty() || node.outputs.size() != 1) return std::nullopt;
  if (!isStaticF32(graph, node.outputs[0])) return std::nullopt;
  std::optional<Candidate> c = describeOp(graph, node);
  if (!c) return std::nullopt;
  for (ValueId operand : c->operands) {
    if (!isStaticF32(graph, operand)) return std::nullopt;
  }
  return c;
}

class ElementwiseFusion {
 public:
  ElementwiseFusion(Graph& graph, const ElementwiseFusionLimits& limits)
      : graph_(graph),
        limits_(limits),
        pinned_(pinnedValues(graph)),
        candidates_(graph.nodeCount()),
        group_(graph.nodeCount(), 0) {}

  size_t run() {
    const std::vector<NodeId> order = graph_.topologicalOrder();
    position_.assign(graph_.nodeCount(), 0);
    for (size_t i = 0; i < order.size(); ++i) {
      position_[order[i]] = i;
      candidates_[order[i]] = describe(graph_, order[i]);
    }
    size_t fused = 0;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (!candidates_[*it] || group_[*it] != 0) continue;
      const std::vector<NodeId> nodes = grow(*it);
      if ((nodes.size() >= 2 || readsOrWritesQuantized(nodes)) && rewrite(nodes)) ++fused;
    }
    return fused;
  }

 private:
  const std::vector<Dim>& shapeOf(ValueId id) const { return *graph_.value(id).type.shape; }

  std::vector<NodeId> grow(NodeId sink);
  bool rewrite(const std::vector<NodeId>& nodes);

  // Quantized I/O (see the header): the per-tensor DequantizeLinear of 8-bit
  // data that makes `value`, if any; the per-tensor QuantizeLinear that alone
  // reads the group's output `value`, if any.
  std::optional<NodeId> dequantizedFrom(ValueId value) const;
  std::optional<NodeId> quantizedBy(ValueId value) const;
  bool readsOrWritesQuantized(const std::vector<NodeId>& nodes) const;

  // Whether `producer` may join a group of `ops` instructions that reads
  // `outside` and `immediates` from outside it; if so, updates all three.
  bool fitsLimits(NodeId producer, size_t& ops, std::set<ValueId>& outside, std::set<ValueId>& immediates) const;

  Graph& graph_;
  const ElementwiseFusionLimits limits_;
  const std::set<ValueId> pinned_;
  std::vector<std::optional<Candidate>> candidates_;  // by NodeId
  std::vector<size_t> group_;                         // by NodeId: the group's number, 0 for none yet
  std::vector<size_t> position_;                      // by NodeId: in topological order
  size_t groups_ = 0;
};

// The group whose sink is `sink`, in graph order. A producer whose other
// readers are not all in the group yet is tried again when the last of them
// joins (each joining node offers its operands' producers).
std::vector<NodeId> ElementwiseFusion::grow(NodeId sink) {
  const size_t group = ++groups_;
  const std::vector<Dim>& shape = shapeOf(graph_.node(sink).outputs[0]);
  std::vector<NodeId> nodes = {sink};
  group_[sink] = group;
  std::set<ValueId> outside, immediates;  // what the group reads from outside it
  size_t ops = 0;                         // the group's instructions
  fitsLimits(sink, ops, outside, immediates);
  for (size_t next = 0; next < nodes.size(); ++next) {
    for (ValueId operand : candidates_[nodes[next]]->operands) {
      const Value& value = graph_.value(operand);
      if (value.kind != ValueKind::kNodeOutput) continue;
      const NodeId producer = value.producer;
      if (!candidates_[producer] || group_[producer] != 0) continue;
      if (shapeOf(operand) != shape || pinned_.contains(operand)) continue;
      const bool read_inside = std::all_of(value.users.begin(), value.users.end(),
                                           [&](const Use& use) { return group_[use.node] == group; });
      if (!read_inside || !fitsLimits(producer, ops, outside, immediates)) continue;
      group_[producer] = group;
      nodes.push_back(producer);
    }
  }
  std::sort(nodes.begin(), nodes.end(), [&](NodeId a, NodeId b) { return position_[a] < position_[b]; });
  return nodes;
}

bool ElementwiseFusion::fitsLimits(NodeId producer, size_t& ops, std::set<ValueId>& outside,
                                   std::set<ValueId>& immediates) const {
  const size_t producer_ops = candidates_[producer]->cube ? 2 : 1;
  std::set<ValueId> new_outside = outside, new_immediates = immediates;
  new_outside.erase(graph_.node(producer).outputs[0]);
  for (ValueId operand : candidates_[producer]->operands) {
    (scalarConstant(graph_, operand, kAnyRank) ? new_immediates : new_outside).insert(operand);
  }
  if (ops + producer_ops > limits_.max_ops || new_outside.size() > limits_.max_inputs ||
      new_immediates.size() > limits_.max_immediates) {
    return false;
  }
  outside = std::move(new_outside);
  immediates = std::move(new_immediates);
  ops += producer_ops;
  return true;
}

std::optional<NodeId> ElementwiseFusion::dequantizedFrom(ValueId value) const {
  if (!limits_.quantized_io) return std::nullopt;
  const NodeId producer = graph_.value(value).producer;
  if (producer == kNoNode || !perTensorQuantization(graph_, producer)) return std::nullopt;
  if (!isOp(graph_, producer, "DequantizeLinear")) return std::nullopt;
  const ValueId data = graph_.node(producer).inputs[0];
  if (graph_.value(data).kind == ValueKind::kInitializer) return std::nullopt;  // constant folding's
  return producer;
}

std::optional<NodeId> ElementwiseFusion::quantizedBy(ValueId value) const {
  if (!limits_.quantized_io) return std::nullopt;
  const std::optional<NodeId> q = onlyReader(graph_, pinned_, value, "QuantizeLinear");
  if (!q || !perTensorQuantization(graph_, *q)) return std::nullopt;
  return q;
}

bool ElementwiseFusion::readsOrWritesQuantized(const std::vector<NodeId>& nodes) const {
  if (!limits_.quantized_io) return false;
  if (quantizedBy(graph_.node(nodes.back()).outputs[0])) return true;
  for (NodeId id : nodes) {
    for (ValueId operand : candidates_[id]->operands) {
      if (dequantizedFrom(operand)) return true;
    }
  }
  return false;
}

// Writes the program of `nodes` (in graph order; the last is the sink) and
// replaces them by the fused node, unless the header's limits forbid it.
bool ElementwiseFusion::rewrite(const std::vector<NodeId>& nodes) {
  std::set<ValueId> results;  // the members' outputs
  for (NodeId id : nodes) results.insert(graph_.node(id).outputs[0]);
  // Inputs and immediates first: their count fixes the results' slots.
  std::vector<ValueId> inputs;
  std::vector<ValueId> immediate_values;
  ElementwiseProgram program;
  for (NodeId id : nodes) {
    for (ValueId operand : candidates_[id]->operands) {
      if (results.contains(operand)) continue;
      const std::optional<float> immediate = scalarConstant(graph_, operand, kAnyRank);
      std::vector<ValueId>& list = immediate ? immediate_values : inputs;
      if (std::find(list.begin(), list.end(), operand) != list.end()) continue;
      list.push_back(operand);
      if (immediate) program.immediates.push_back(*immediate);
    }
  }
  program.input_count = inputs.size();
  std::map<ValueId, size_t> result_of;  // a member's output -> its (last) instruction
  auto slotOf = [&](ValueId operand) -> int64_t {
    if (const auto result = result_of.find(operand); result != result_of.end()) {
      return program.resultSlot(result->second);
    }
    const auto input = std::find(inputs.begin(), inputs.end(), operand);
    if (input != inputs.end()) return input - inputs.begin();
    const auto immediate = std::find(immediate_values.begin(), immediate_values.end(), operand);
    return program.immediateSlot(static_cast<size_t>(immediate - immediate_values.begin()));
  };
  for (NodeId id : nodes) {
    const Candidate& c = *candidates_[id];
    const int64_t first = slotOf(c.operands[0]);
    program.ops.push_back(c.op);
    program.operands.push_back(first);
    program.operands.push_back(c.operands.size() > 1 ? slotOf(c.operands[1]) : kNoOperand);
    program.alpha.push_back(c.alpha);
    program.beta.push_back(c.beta);
    if (c.cube) {
      program.ops.push_back(ElementwiseOp::kMul);
      program.operands.push_back(program.resultSlot(program.ops.size() - 2));
      program.operands.push_back(first);
      program.alpha.push_back(0);
      program.beta.push_back(0);
    }
    result_of[graph_.node(id).outputs[0]] = program.ops.size() - 1;
  }

  // The inputs' broadcast gives the output's dimensions (immediates have
  // one element) but not always its rank.
  size_t rank = 0;
  for (ValueId input : inputs) rank = std::max(rank, shapeOf(input).size());
  if (inputs.empty() || rank != shapeOf(graph_.node(nodes.back()).outputs[0]).size()) return false;
  if (assignRegisters(program).count > kMaxProgramRegisters) return false;

  Attributes attributes;
  attributes[std::string(kProgramOpsAttribute)] = joinElementwiseOps(program.ops);
  attributes[std::string(kProgramOperandsAttribute)] = program.operands;
  attributes[std::string(kProgramAlphaAttribute)] = program.alpha;
  attributes[std::string(kProgramBetaAttribute)] = program.beta;
  if (!program.immediates.empty()) attributes[std::string(kProgramImmediatesAttribute)] = program.immediates;
  // Quantized I/O: 8-bit inputs read through their DequantizeLinear, and the
  // output through the QuantizeLinear that reads it.
  std::vector<float> dequantize(2 * inputs.size(), 0.0f);
  size_t dequantized = 0;
  for (size_t i = 0; i < inputs.size() && dequantized < kMaxDequantizedInputs; ++i) {
    const std::optional<NodeId> dq = dequantizedFrom(inputs[i]);
    if (!dq) continue;
    const PerTensorQuantization q = *perTensorQuantization(graph_, *dq);
    dequantize[2 * i] = q.scale;
    dequantize[2 * i + 1] = static_cast<float>(q.zero);
    inputs[i] = graph_.node(*dq).inputs[0];
    ++dequantized;
  }
  if (dequantized > 0) attributes[std::string(kProgramDequantizeAttribute)] = dequantize;
  std::vector<NodeId> replaced = nodes;
  if (const std::optional<NodeId> q = quantizedBy(graph_.node(nodes.back()).outputs[0])) {
    const PerTensorQuantization params = *perTensorQuantization(graph_, *q);
    attributes[std::string(kProgramQuantizeAttribute)] = std::vector<float>{params.scale, static_cast<float>(params.zero)};
    attributes[std::string(kProgramQuantizeTypeAttribute)] = static_cast<int64_t>(params.type);
    replaced.push_back(*q);
  }
  if (replaced.size() < 2 && dequantized == 0) return false;
  const std::string name = graph_.node(nodes.back()).name;
  replaceByFusedNode(graph_, replaced, "FusedElementwise", std::move(attributes), inputs, name);
  return true;
}

}  // namespace

size_t fuseElementwise(Graph& graph, const ElementwiseFusionLimits& limits) {
  return ElementwiseFusion(graph, limits).run();
}

}  // namespace kiln
