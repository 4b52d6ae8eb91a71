#include "passes/constant_folding.h"
#include "passes/if_inlining.h"
#include "passes/loop_invariants.h"
#include "passes/loop_placeholders.h"
#include "passes/pass_helpers.h"
#include "passes/plugin_binding.h"

#include <set>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "core/wrapping_arithmetic.h"
#include "kiln/error.h"

namespace kiln {
namespace {

// A small integer tensor, row-major.
struct IntTensor {
  std::vector<int64_t> dims;
  std::vector<int64_t> values;
};

std::optional<IntTensor> readInts(const Graph& graph, ValueId id) {
  if (id == kNoValue) return std::nullopt;
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c || c->info.numElements() > kMaxFoldedElements) return std::nullopt;
  IntTensor t{c->info.shape, std::vector<int64_t>(c->info.numElements())};
  for (size_t i = 0; i < t.values.size(); ++i) {
    switch (c->info.dtype) {
      case DType::kI64: std::memcpy(&t.values[i], c->bytes.data() + i * 8, 8); break;
      case DType::kI32: {
        int32_t v;
        std::memcpy(&v, c->bytes.data() + i * 4, 4);
        t.values[i] = v;
        break;
      }
      default: return std::nullopt;
    }
  }
  return t;
}

ConstantPtr toConstant(const IntTensor& t, DType dtype) {
  std::vector<std::byte> bytes(t.values.size() * dtypeSize(dtype));
  for (size_t i = 0; i < t.values.size(); ++i) {
    if (dtype == DType::kI32) {
      const auto v = static_cast<int32_t>(t.values[i]);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else if (dtype == DType::kF32) {
      const auto v = static_cast<float>(t.values[i]);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else if (dtype == DType::kBool || dtype == DType::kU8) {
      bytes[i] = static_cast<std::byte>(t.values[i] != 0);
    } else {
      std::memcpy(bytes.data() + i * 8, &t.values[i], 8);
    }
  }
  return makeConstant(TensorInfo{dtype, t.dims}, std::move(bytes));
}

size_t normalized(int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) throw GraphError(fmt::format("axis {} out of range for rank {}", axis, rank));
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

// Elementwise binary op with numpy broadcasting over small tensors; nullopt
// when the result would not be small.
std::optional<IntTensor> broadcast(const IntTensor& a, const IntTensor& b, const std::function<int64_t(int64_t, int64_t)>& f) {
  const size_t rank = std::max(a.dims.size(), b.dims.size());
  auto dimOf = [&](const IntTensor& t, size_t i) {
    const size_t offset = rank - t.dims.size();
    return i < offset ? int64_t{1} : t.dims[i - offset];
  };
  IntTensor out;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = dimOf(a, i), db = dimOf(b, i);
    if (da != db && da != 1 && db != 1) throw GraphError("cannot broadcast constant shapes");
    out.dims.push_back(da == 1 ? db : da);  // 1 against 0 is 0, not max(1, 0)
  }
  // Checked: a zero dimension makes it empty whatever the others; otherwise
  // a count past kMaxFoldedElements is left to run time (it is no shape).
  const std::optional<int64_t> elements = elementCount(out.dims);
  if (!elements || *elements > int64_t{kMaxFoldedElements}) return std::nullopt;
  const int64_t count = *elements;
  out.values.resize(static_cast<size_t>(count));
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t i = rank; i-- > 0;) {
      const int64_t coord = rest % out.dims[i];
      rest /= out.dims[i];
      const int64_t da = dimOf(a, i), db = dimOf(b, i);
      ia += (da == 1 ? 0 : coord) * sa;
      ib += (db == 1 ? 0 : coord) * sb;
      sa *= da;
      sb *= db;
    }
    out.values[static_cast<size_t>(flat)] = f(a.values[static_cast<size_t>(ia)], b.values[static_cast<size_t>(ib)]);
  }
  return out;
}

// Evaluates `node` if it is foldable; returns its output (one) or nullopt.
std::optional<std::pair<IntTensor, DType>> evaluate(const Graph& graph, const Node& node) {
  if (!node.domain.empty() || node.outputs.size() != 1) return std::nullopt;
  const std::string& op = node.op_type;
  auto input = [&](size_t i) { return i < node.inputs.size() ? readInts(graph, node.inputs[i]) : std::nullopt; };
  const DType out_dtype = graph.value(node.outputs[0]).type.dtype;

  if (op == "Shape" || op == "Size") {
    const ValueType& type = graph.value(node.inputs[0]).type;
    if (!type.hasStaticShape()) return std::nullopt;
    std::vector<int64_t> dims;
    for (const Dim& d : *type.shape) dims.push_back(d.size);
    if (op == "Size") {
      const std::optional<int64_t> n = elementCount(dims);
      if (!n) return std::nullopt;
      return std::pair{IntTensor{{}, {*n}}, DType::kI64};
    }
    const auto rank = static_cast<int64_t>(dims.size());
    int64_t start = node.intAttribute("start", 0), end = node.intAttribute("end", rank);
    start = std::clamp(start < 0 ? start + rank : start, int64_t{0}, rank);
    end = std::clamp(end < 0 ? end + rank : end, int64_t{0}, rank);
    std::vector<int64_t> slice(dims.begin() + start, dims.begin() + std::max(start, end));
    return std::pair{IntTensor{{static_cast<int64_t>(slice.size())}, slice}, DType::kI64};
  }
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] != kNoValue && !input(i)) return std::nullopt;  // every input must be a small int constant
  }
  if (node.inputs.empty()) return std::nullopt;
  const IntTensor a = *input(0);
  const DType in_dtype = graph.value(node.inputs[0]).initializer->info.dtype;

  // The kernels' integer semantics (core/wrapping_arithmetic.h): values of
  // i32 tensors are widened here and narrowed back by toConstant, which
  // wraps them as the 32-bit kernel would.
  static const std::map<std::string, std::function<int64_t(int64_t, int64_t)>> kBinary = {
      {"Add", wrapAdd<int64_t>}, {"Sub", wrapSub<int64_t>}, {"Mul", wrapMul<int64_t>},
      {"Div", [](int64_t x, int64_t y) { return wrapDiv(x, y); }},
      {"Equal", [](int64_t x, int64_t y) { return int64_t{x == y}; }},
      {"Less", [](int64_t x, int64_t y) { return int64_t{x < y}; }},
      {"Greater", [](int64_t x, int64_t y) { return int64_t{x > y}; }},
      {"Max", [](int64_t x, int64_t y) { return std::max(x, y); }},
      {"Min", [](int64_t x, int64_t y) { return std::min(x, y); }}};
  if (const auto it = kBinary.find(op); it != kBinary.end() && node.inputs.size() == 2) {
    std::optional<IntTensor> out = broadcast(a, *input(1), it->second);
    if (!out) return std::nullopt;
    return std::pair{std::move(*out), out_dtype};
  }
  if (op == "Identity") return std::pair{a, in_dtype};
  if (op == "Neg") {
    IntTensor out = a;
    for (int64_t& v : out.values) v = wrapSub(int64_t{0}, v);
    return std::pair{out, in_dtype};
  }
  if (op == "Cast" && (out_dtype == DType::kI64 || out_dtype == DType::kI32 || out_dtype == DType::kF32)) {
    return std::pair{a, out_dtype};
  }
  if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Flatten") {
    const ValueType& type = graph.value(node.outputs[0]).type;
    if (!type.hasStaticShape()) return std::nullopt;
    IntTensor out = a;
    out.dims.clear();
    for (const Dim& d : *type.shape) out.dims.push_back(d.size);
    return std::pair{out, in_dtype};
  }
  if (op == "Concat") {
    const size_t axis = normalized(node.intAttribute("axis", 0), std::max<size_t>(a.dims.size(), 1));
    if (a.dims.size() != 1 || axis != 0) return std::nullopt;
    IntTensor out{{0}, {}};
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const IntTensor part = *input(i);
      if (part.dims.size() != 1) return std::nullopt;
      out.values.insert(out.values.end(), part.values.begin(), part.values.end());
    }
    out.dims[0] = static_cast<int64_t>(out.values.size());
    return std::pair{out, in_dtype};
  }
  if (op == "Gather" && node.intAttribute("axis", 0) == 0 && a.dims.size() == 1) {
    const IntTensor indices = *input(1);
    IntTensor out{indices.dims, {}};
    for (int64_t index : indices.values) {
      const int64_t n = a.dims[0];
      if (index < -n || index >= n) return std::nullopt;
      out.values.push_back(a.values[static_cast<size_t>(index < 0 ? index + n : index)]);
    }
    return std::pair{out, in_dtype};
  }
  // One value each (a crafted model may give none: left to the kernel).
  auto scalarOf = [&](size_t i) -> std::optional<int64_t> {
    const auto t = input(i);
    if (!t || t->values.size() != 1) return std::nullopt;
    return t->values[0];
  };
  if (op == "Slice" && a.dims.size() == 1 && node.inputs.size() >= 3) {
    const int64_t n = a.dims[0];
    const auto first = scalarOf(1), last = scalarOf(2);
    const auto stride = node.inputs.size() > 4 && node.inputs[4] != kNoValue ? scalarOf(4) : std::optional<int64_t>(1);
    if (!first || !last || stride != 1) return std::nullopt;
    if (node.inputs.size() > 3 && node.inputs[3] != kNoValue && scalarOf(3) != 0 && scalarOf(3) != -1) return std::nullopt;
    int64_t start = *first, end = *last;
    start = std::clamp(start < 0 ? start + n : start, int64_t{0}, n);
    end = std::clamp(end < 0 ? end + n : end, int64_t{0}, n);
    IntTensor out{{std::max<int64_t>(0, end - start)}, {}};
    for (int64_t i = start; i < end; ++i) out.values.push_back(a.values[static_cast<size_t>(i)]);
    return std::pair{out, in_dtype};
  }
  if (op == "Range") {
    const auto first = scalarOf(0), limit = scalarOf(1), delta = scalarOf(2);
    if (!first || !limit || !delta || *delta == 0) return std::nullopt;
    IntTensor out{{0}, {}};
    for (int64_t v = *first; *delta > 0 ? v < *limit : v > *limit;) {
      out.values.push_back(v);
      const std::optional<int64_t> next = checkedAdd(v, *delta);
      if (out.values.size() > kMaxFoldedElements || !next) return std::nullopt;
      v = *next;
    }
    out.dims[0] = static_cast<int64_t>(out.values.size());
    return std::pair{out, in_dtype};
  }
  return std::nullopt;
}

}  // namespace

// The outputs of a node whose inputs are all constants, from `evaluate`;
// nullopt when something is not static and deterministic, or when folding
// would blow the package up: outputs are folded when each is small, or when
// together they take at most kMaxFoldGrowth times the constant inputs' bytes.
// That folds the weight rearrangements exporters leave in graphs (Slice,
// Concat, Transpose of weights, as Silero VAD's LSTM has) and int8 weights
// dequantized in the graph (Cast to f32, then Mul by the scale: 4x the bytes,
// as onnxruntime folds them), but not a ConstantOfShape, Expand or Tile that
// makes a large tensor out of a small one.
std::optional<std::vector<ConstantPtr>> evaluateWith(const Graph& graph, const Node& node,
                                                     const ConstantEvaluator& evaluate) {
  static const std::set<std::string> kNeverFolded = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                     "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout",
                                                     "If", "Loop", "Scan"};
  if (!evaluate || node.inputs.empty() || kNeverFolded.contains(node.op_type) || !node.subgraphs().empty() ||
      (isPluginOp(node) && !isStatelessPluginOp(node))) {
    return std::nullopt;
  }
  std::vector<ConstantPtr> inputs;
  for (ValueId input : node.inputs) {
    if (input == kNoValue) {
      inputs.push_back(nullptr);
      continue;
    }
    if (!graph.value(input).initializer) return std::nullopt;
    inputs.push_back(graph.value(input).initializer);
  }
  uint64_t input_bytes = 0;
  for (const ConstantPtr& input : inputs) input_bytes += input ? input->info.sizeInBytes() : 0;
  std::vector<TensorInfo> outputs;
  uint64_t output_bytes = 0;
  bool small = true;
  for (ValueId output : node.outputs) {
    const auto info = graph.value(output).type.tensorInfo();
    if (!info || !info->isStatic() || info->dtype == DType::kUndefined) return std::nullopt;  // no type to make
    small = small && info->numElements() <= kMaxFoldedElements;
    output_bytes += info->sizeInBytes();
    outputs.push_back(*info);
  }
  constexpr uint64_t kMaxFoldGrowth = 4;
  if (!small && output_bytes > kMaxFoldGrowth * input_bytes) return std::nullopt;
  return evaluate(node, inputs, outputs);
}

// Reshape, Flatten, Squeeze, Unsqueeze and Identity of a constant: the same
// bytes under the output's static shape. They have no kernel to evaluate
// them (the compiler makes them views), and a bias reshaped to [1, C, 1, 1]
// must be a constant for the channels-last pass to store it permuted.
std::optional<ConstantPtr> foldView(const Graph& graph, const Node& node) {
  static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  if (!node.domain.empty() || !kViews.contains(node.op_type) || node.inputs.empty() || node.outputs.size() != 1) {
    return std::nullopt;
  }
  const ValueId input = node.inputs[0];
  if (input == kNoValue || !graph.value(input).initializer) return std::nullopt;
  const auto info = graph.value(node.outputs[0]).type.tensorInfo();
  const Constant& data = *graph.value(input).initializer;
  if (!info || !info->isStatic() || info->dtype != data.info.dtype || info->sizeInBytes() != data.bytes.size()) {
    return std::nullopt;
  }
  return makeConstant(*info, data.bytes);
}

// Gives `output` the value `data`: its readers read a new initializer, which
// takes over the name (the model's output names are its values' names, and
// subgraphs read values by name).
void replaceWithConstant(Graph& graph, ValueId output, ConstantPtr data) {
  const std::string name = graph.value(output).name;
  const ValueId constant = graph.addInitializer(name + ":folded", std::move(data));
  graph.replaceAllUses(output, constant);
  graph.renameValue(output, name + ":unfolded");
  graph.renameValue(constant, name);
}

// A CastLike of a constant to a value whose type is known is a Cast of it
// (the second input gives only its type): rewritten so that it folds, as
// kiln.Expression's constants need when their type was not known yet.
bool castLikeAsCast(Graph& graph, NodeId id) {
  const Node& node = graph.node(id);
  if (!node.domain.empty() || node.op_type != "CastLike" || node.inputs.size() != 2 || node.outputs.size() != 1 ||
      node.inputs[0] == kNoValue || node.inputs[1] == kNoValue || !graph.value(node.inputs[0]).initializer) {
    return false;
  }
  const DType to = graph.value(node.inputs[1]).type.dtype;
  if (to == DType::kUndefined) return false;
  Attributes attributes = node.attributes;
  attributes["to"] = static_cast<int64_t>(to);
  const ValueId input = node.inputs[0];
  const ValueId output = node.outputs[0];
  const std::string name = node.name;
  const NodeId cast = graph.addNode("Cast", {input}, {uniqueName(graph, graph.value(output).name + ":cast")},
                                    std::move(attributes));
  graph.node(cast).name = name;
  replaceKeepingName(graph, output, graph.node(cast).outputs[0], ":castlike");
  graph.removeNode(id);
  return true;
}

size_t foldConstants(Graph& graph, const ConstantEvaluator& evaluate_node) {
  size_t folded = 0;
  for (NodeId id : graph.topologicalOrder()) {
    if (castLikeAsCast(graph, id)) {
      ++folded;  // the Cast folds in the next round
      continue;
    }
    Node& node = graph.node(id);
    if (const auto result = evaluate(graph, node)) {
      replaceWithConstant(graph, node.outputs[0], toConstant(result->first, result->second));
    } else if (auto view = foldView(graph, node)) {
      replaceWithConstant(graph, node.outputs[0], std::move(*view));
    } else if (const auto outputs = evaluateWith(graph, node, evaluate_node)) {
      const std::vector<ValueId> values = node.outputs;
      for (size_t i = 0; i < values.size(); ++i) replaceWithConstant(graph, values[i], (*outputs)[i]);
    } else {
      continue;
    }
    graph.removeNode(id);
    ++folded;
  }
  // Constants decide which If branch runs and whether a Loop surely runs;
  // what a Loop body computes from constants and outside values alone runs
  // once, before the Loop.
  return folded + inlineConstantIfs(graph) + fillLoopPlaceholders(graph) + hoistLoopInvariants(graph);
}

}  // namespace kiln
