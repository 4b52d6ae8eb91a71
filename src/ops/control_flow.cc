// Control flow: If, Loop and Scan. Their subgraphs (branches, bodies) are
// inferred here, with their inputs typed by the operator's rules and the
// values they capture typed as the enclosing graph has them; the compiler
// then lowers each subgraph to a sub-program (docs/compiler.md).
//
// Shapes must agree across iterations and branches: a loop-carried value
// keeps its shape, and If's branches give outputs of one type. Where they
// differ the output dimension is unknown, which the compiler reports.
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

Graph& subgraph(const InferenceContext& context, const std::string& name) {
  const auto it = context.node().attributes.find(name);
  if (it == context.node().attributes.end() || !std::holds_alternative<GraphPtr>(it->second) ||
      !std::get<GraphPtr>(it->second)) {
    context.fail("needs the graph attribute '{}'", name);
  }
  return *std::get<GraphPtr>(it->second);
}

bool isOneElement(const ValueType& type) {
  return type.hasStaticShape() &&
         std::all_of(type.shape->begin(), type.shape->end(), [](const Dim& d) { return d.size == 1; });
}

// One type that both branches' outputs fit: equal dims stay, others become
// unknown. One element in both, of different ranks (an exporter's [] in one
// branch and [1] in the other, as PaddlePaddle's Loop bodies have), is one
// value whatever its rank: the lower rank is taken (it broadcasts as either
// would), and the runtime's byte copy of the branch's output is exact.
ValueType merge(const InferenceContext& context, size_t index, const ValueType& a, const ValueType& b) {
  if (a.dtype != b.dtype && a.dtype != DType::kUndefined && b.dtype != DType::kUndefined) {
    context.fail("output {} is {} in then_branch but {} in else_branch", index, dtypeName(a.dtype), dtypeName(b.dtype));
  }
  if (isOneElement(a) && isOneElement(b) && a.dtype == b.dtype) return a.shape->size() <= b.shape->size() ? a : b;
  ValueType merged{a.dtype != DType::kUndefined ? a.dtype : b.dtype, std::nullopt};
  if (a.shape && b.shape && a.shape->size() == b.shape->size()) {
    merged.shape.emplace();
    for (size_t d = 0; d < a.shape->size(); ++d) {
      merged.shape->push_back((*a.shape)[d] == (*b.shape)[d] ? (*a.shape)[d] : Dim{});
    }
  }
  return merged;
}

// When the output shapes are not all known (the branches differ, or a
// branch's shapes need folding that only the main graph gets), the
// condition's value decides them: asking for it records it as wanted (a
// shape input when it comes from a model input), and a constant condition
// is inlined by constant folding (passes/if_inlining.h).
void inferIf(InferenceContext& context) {
  const std::vector<ValueType> then_types = context.inferSubgraph(subgraph(context, "then_branch"), {});
  const std::vector<ValueType> else_types = context.inferSubgraph(subgraph(context, "else_branch"), {});
  if (then_types.size() != context.outputCount() || else_types.size() != context.outputCount()) {
    context.fail("has {} outputs, but then_branch gives {} and else_branch {}", context.outputCount(),
                 then_types.size(), else_types.size());
  }
  bool known = true;
  for (size_t i = 0; i < then_types.size(); ++i) {
    context.output(i) = merge(context, i, then_types[i], else_types[i]);
    known = known && context.output(i).hasStaticShape();
  }
  if (known) return;
  if (const ConstantPtr condition = context.inputConstant(0); condition && condition->info.numElements() == 1) {
    const bool taken = std::any_of(condition->bytes.begin(), condition->bytes.end(), [](std::byte b) { return b != std::byte{0}; });
    for (size_t i = 0; i < then_types.size(); ++i) context.output(i) = taken ? then_types[i] : else_types[i];
  }
}

ValueType scalar(DType dtype) { return ValueType::tensor(dtype, {}); }

// Loop(M?, cond?, v_initial...) with body(iter_num, cond, v...) -> (cond,
// v..., scan...). Scan outputs stack one slice per iteration: their first
// dimension is M when M is a constant (the compiler checks that the loop
// cannot end earlier), else unknown.
void inferLoop(InferenceContext& context) {
  const size_t carried = context.inputCount() - 2;
  std::vector<ValueType> body_inputs{scalar(DType::kI64), scalar(DType::kBool)};
  for (size_t i = 0; i < carried; ++i) body_inputs.push_back(context.inputType(2 + i));
  const std::vector<ValueType> body_outputs = context.inferSubgraph(subgraph(context, "body"), body_inputs);
  if (body_outputs.size() < 1 + carried) {
    context.fail("body gives {} outputs, fewer than the condition and {} loop-carried values", body_outputs.size(),
                 carried);
  }
  const size_t scans = body_outputs.size() - 1 - carried;
  if (context.outputCount() != carried + scans) {
    context.fail("has {} outputs, but its body gives {} loop-carried values and {} scan outputs", context.outputCount(),
                 carried, scans);
  }
  for (size_t i = 0; i < carried; ++i) {
    const ValueType& initial = context.inputType(2 + i);
    const ValueType& next = body_outputs[1 + i];
    context.output(i) = merge(context, i, initial, next);
  }
  Dim trip{};
  if (context.hasInput(0)) {
    if (const auto m = context.constantInts(0); m && m->size() == 1) trip = Dim::known(std::max<int64_t>((*m)[0], 0));
  }
  for (size_t j = 0; j < scans; ++j) {
    const ValueType& slice = body_outputs[1 + carried + j];
    ValueType stacked{slice.dtype, std::nullopt};
    if (slice.shape) {
      stacked.shape = std::vector<Dim>{trip};
      stacked.shape->insert(stacked.shape->end(), slice.shape->begin(), slice.shape->end());
    }
    context.output(carried + j) = stacked;
  }
}

// Scan (opset 9+): inputs are N states then M scanned tensors; the body
// takes the states and one slice of each scanned tensor along its axis.
void inferScan(InferenceContext& context) {
  const int64_t scan_inputs = context.node().intAttribute("num_scan_inputs", 0);
  if (scan_inputs < 1 || static_cast<size_t>(scan_inputs) > context.inputCount()) {
    context.fail("num_scan_inputs is {}, with {} inputs", scan_inputs, context.inputCount());
  }
  const size_t states = context.inputCount() - static_cast<size_t>(scan_inputs);
  const std::vector<int64_t> input_axes =
      context.node().intsAttribute("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(scan_inputs), 0));
  if (input_axes.size() != static_cast<size_t>(scan_inputs)) context.fail("scan_input_axes needs {} axes", scan_inputs);
  std::vector<ValueType> body_inputs;
  for (size_t i = 0; i < states; ++i) body_inputs.push_back(context.inputType(i));
  Dim length{};
  for (size_t k = 0; k < input_axes.size(); ++k) {
    const size_t input = states + k;
    const std::vector<Dim>* shape = knownShape(context, input);
    ValueType slice{context.inputType(input).dtype, std::nullopt};
    if (shape) {
      const size_t axis = normalizeAxis(context, input_axes[k], shape->size());
      std::vector<Dim> dims = *shape;
      if (k == 0) length = dims[axis];
      if (dims[axis].isKnown() && length.isKnown() && dims[axis].size != length.size) {
        context.fail("scanned inputs have lengths {} and {}", length.size, dims[axis].size);
      }
      dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
      slice.shape = dims;
    }
    body_inputs.push_back(slice);
  }
  const std::vector<ValueType> body_outputs = context.inferSubgraph(subgraph(context, "body"), body_inputs);
  if (body_outputs.size() != context.outputCount() || body_outputs.size() < states) {
    context.fail("has {} outputs, its body gives {}", context.outputCount(), body_outputs.size());
  }
  const size_t scans = body_outputs.size() - states;
  const std::vector<int64_t> output_axes =
      context.node().intsAttribute("scan_output_axes", std::vector<int64_t>(scans, 0));
  if (output_axes.size() != scans) context.fail("scan_output_axes needs {} axes", scans);
  for (size_t i = 0; i < states; ++i) context.output(i) = merge(context, i, context.inputType(i), body_outputs[i]);
  for (size_t j = 0; j < scans; ++j) {
    const ValueType& slice = body_outputs[states + j];
    ValueType stacked{slice.dtype, std::nullopt};
    if (slice.shape) {
      std::vector<Dim> dims = *slice.shape;
      const size_t axis = normalizeAxis(context, output_axes[j], dims.size() + 1);
      dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(axis), length);
      stacked.shape = dims;
    }
    context.output(states + j) = stacked;
  }
}

}  // namespace

void registerControlFlowOps(OpRegistry& registry) {
  constexpr size_t kMany = 1 << 16;
  registry.add(OpSchema{"", "If", 1, 1, 1, 1, kMany, inferIf});
  registry.add(OpSchema{"", "Loop", 1, 2, kMany, 1, kMany, inferLoop});
  registry.add(OpSchema{"", "Scan", 9, 1, kMany, 1, kMany, inferScan});
}

}  // namespace kiln
