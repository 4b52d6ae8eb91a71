#include "kiln/compiler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "compiler/compile_program.h"
#include "compiler/memory_planner.h"
#include "compiler/runtime_shapes.h"
#include "format/executable_spec.h"
#include "format/graph_package.h"
#include "ir/graph_codec.h"
#include "kiln/error.h"
#include "kiln/package_writer.h"
#include "ops/shape_inference.h"
#include "passes/attention_fusion.h"
#include "passes/float16_storage.h"
#include "passes/batchnorm_folding.h"
#include "passes/conv_tap_trimming.h"
#include "passes/blocked_conv.h"
#include "passes/byte_tables.h"
#include "passes/channels_last.h"
#include "passes/conv_fusion.h"
#include "passes/common_subexpression.h"
#include "passes/constant_folding.h"
#include "passes/expression_expansion.h"
#include "passes/float16_in_float32.h"
#include "passes/activation_quantization.h"
#include "passes/global_pool_rewrite.h"
#include "passes/identity_removal.h"
#include "core/elementwise_program.h"
#include "core/math_mode.h"
#include "passes/elementwise_fusion.h"
#include "passes/upsample_fusion.h"
#include "passes/integer_matmul_fusion.h"
#include "passes/qdq_fusion.h"
#include "passes/layernorm_fusion.h"
#include "passes/matmul_fusion.h"
#include "passes/one_hot_lookup.h"
#include "passes/plugin_binding.h"
#include "plugins/package_plugins.h"
#include "plugins/plugin_instance.h"
#include "training/autodiff.h"
#include "training/training_mode.h"
#include "training/training_step.h"
#include "passes/transpose_composition.h"
#include "passes/unit_axis_cancellation.h"

namespace kiln {
namespace {

// Whether Transpose `node` keeps the order of its input's axes longer than
// 1 (it only moves axes of size 1): then it moves no element.
bool movesOnlyUnitAxes(const Graph& graph, const Node& node) {
  const ValueType& in = graph.value(node.inputs[0]).type;
  if (!in.hasStaticShape()) return false;
  const auto rank = static_cast<int64_t>(in.shape->size());
  std::vector<int64_t> perm = node.intsAttribute("perm", {});
  if (perm.empty()) {  // the default: the axes reversed
    for (int64_t axis = rank - 1; axis >= 0; --axis) perm.push_back(axis);
  }
  int64_t last = -1;
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= rank) return false;
    if ((*in.shape)[static_cast<size_t>(axis)].size == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

// Whether Slice `node` keeps every element in order: its output has its
// input's static shape and its steps are absent or constant ones (a full
// range with step -1 would reverse). tf2onnx writes such Slices for
// TensorFlow's strided_slice of a whole tensor.
bool slicesEverything(const Graph& graph, const Node& node) {
  const ValueType& in = graph.value(node.inputs[0]).type;
  const ValueType& out = graph.value(node.outputs[0]).type;
  if (!in.hasStaticShape() || in.shape != out.shape || in.dtype != out.dtype) return false;
  if (node.inputs.size() < 5 || node.inputs[4] == kNoValue) return true;
  const ConstantPtr& steps = graph.value(node.inputs[4]).initializer;
  if (!steps || (steps->info.dtype != DType::kI64 && steps->info.dtype != DType::kI32)) return false;
  for (uint64_t i = 0; i < steps->info.numElements(); ++i) {
    int64_t step = 0;
    if (steps->info.dtype == DType::kI64) {
      std::memcpy(&step, steps->bytes.data() + i * 8, 8);
    } else {
      int32_t narrow = 0;
      std::memcpy(&narrow, steps->bytes.data() + i * 4, 4);
      step = narrow;
    }
    if (step != 1) return false;
  }
  return true;
}

// Operators whose output is their first input's bytes reinterpreted: they
// become aliases, not steps. A Cast to the type its input already has is one
// (exporters leave them in: T5's norms cast f32 to f32 before every one), so
// is a Transpose that only moves axes of size 1 (the layout changes around a
// Conv over [N, C, L, 1] often compose to one), and so is a Slice that keeps
// everything.
bool isView(const Graph& graph, const Node& node) {
  static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  if (!node.domain.empty() || node.inputs.empty() || node.outputs.size() != 1) return false;
  if (node.op_type == "Cast" && node.inputs.size() == 1) {
    const DType from = graph.value(node.inputs[0]).type.dtype;
    return from != DType::kUndefined && from == graph.value(node.outputs[0]).type.dtype;
  }
  if (node.op_type == "Transpose" && node.inputs.size() == 1) return movesOnlyUnitAxes(graph, node);
  if (node.op_type == "Slice") return slicesEverything(graph, node);
  return kViews.contains(node.op_type);
}

// The one element of `constant`, as a kernel parameter.
ParamValue scalarOf(const Constant& constant) {
  const std::byte* data = constant.bytes.data();
  auto read = [data]<typename T>(T) {
    T v;
    std::memcpy(&v, data, sizeof v);
    return v;
  };
  auto bitsToFloat = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  };
  switch (constant.info.dtype) {
    case DType::kF32: return static_cast<double>(read(float{}));
    case DType::kF64: return read(double{});
    case DType::kBF16: return bitsToFloat(static_cast<uint32_t>(read(uint16_t{})) << 16);
    case DType::kF16: {
      const uint16_t h = read(uint16_t{});
      const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
      const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
      if (exponent == 0x1F) return bitsToFloat(sign | 0x7F800000u | (mantissa << 13));
      if (exponent != 0) return bitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
      const double magnitude = static_cast<double>(mantissa) * 5.9604644775390625e-8;  // 2^-24
      return sign != 0 ? -magnitude : magnitude;
    }
    case DType::kBool:
    case DType::kU8: return static_cast<int64_t>(read(uint8_t{}));
    case DType::kI8: return static_cast<int64_t>(read(int8_t{}));
    case DType::kU16: return static_cast<int64_t>(read(uint16_t{}));
    case DType::kI16: return static_cast<int64_t>(read(int16_t{}));
    case DType::kU32: return static_cast<int64_t>(read(uint32_t{}));
    case DType::kI32: return static_cast<int64_t>(read(int32_t{}));
    case DType::kU64:
    case DType::kI64: return read(int64_t{});  // u64 keeps its bits
    default:
      throw GraphError(fmt::format("a {} tensor attribute cannot be passed to a kernel", dtypeName(constant.info.dtype)));
  }
}

std::string kernelName(const Node& node) { return node.domain.empty() ? node.op_type : node.domain + "." + node.op_type; }

// Sets the math attribute (core/math_mode.h) to `mode` on every node of the
// `ops`: --tf32 (cuda) on products and convolutions, --bf16 (cpu) on
// products, which kernels/cpu/matmul.cc applies where the weights are constant.
template <size_t N>
void setMathMode(Graph& graph, const std::array<std::string_view, N>& ops, std::string_view mode) {
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (node.removed) continue;
    if (std::find(ops.begin(), ops.end(), kernelName(node)) != ops.end()) {
      node.attributes[std::string(kMathAttribute)] = std::string(mode);
    }
  }
}

// A tensor attribute as a kernel parameter: its elements, flattened, as a
// list of doubles (f32, f64) or of integers (integer and bool types). The
// ai.onnx.ml TreeEnsemble holds its splits and leaf weights this way.
ParamValue tensorParam(const Node& node, const std::string& key, const Constant& tensor) {
  const uint64_t count = tensor.info.numElements();
  const std::byte* bytes = tensor.bytes.data();
  auto read = [&]<typename T>(T, uint64_t i) {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    return v;
  };
  std::vector<double> reals;
  std::vector<int64_t> ints;
  for (uint64_t i = 0; i < count; ++i) {
    switch (tensor.info.dtype) {
      case DType::kF32: reals.push_back(read(float{}, i)); break;
      case DType::kF64: reals.push_back(read(double{}, i)); break;
      case DType::kI64: ints.push_back(read(int64_t{}, i)); break;
      case DType::kI32: ints.push_back(read(int32_t{}, i)); break;
      case DType::kI16: ints.push_back(read(int16_t{}, i)); break;
      case DType::kI8: ints.push_back(read(int8_t{}, i)); break;
      case DType::kU8: case DType::kBool: ints.push_back(read(uint8_t{}, i)); break;
      case DType::kU16: ints.push_back(read(uint16_t{}, i)); break;
      case DType::kU32: ints.push_back(read(uint32_t{}, i)); break;
      default:
        throw GraphError(fmt::format("node '{}' ({}): tensor attribute '{}' of type {} cannot be passed to a kernel",
                                     node.name, node.op_type, key, dtypeName(tensor.info.dtype)));
    }
  }
  const bool real = tensor.info.dtype == DType::kF32 || tensor.info.dtype == DType::kF64;
  return real ? ParamValue{std::move(reals)} : ParamValue{std::move(ints)};
}

ParamMap paramsOf(const Node& node) {
  ParamMap params;
  for (const auto& entry : node.attributes) {
    // Named, not a structured binding: clang before 16 cannot capture those.
    const std::string& key = entry.first;
    const auto& attribute = entry.second;
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::string> ||
                        std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<std::string>>) {
            params.set(key, value);
          } else if constexpr (std::is_same_v<T, float>) {
            params.set(key, static_cast<double>(value));
          } else if constexpr (std::is_same_v<T, std::vector<float>>) {
            params.set(key, std::vector<double>(value.begin(), value.end()));
          } else if constexpr (std::is_same_v<T, ConstantPtr>) {
            // ConstantOfShape's one-element `value` passes as a number (an
            // int for integer and bool types, a float otherwise); other
            // tensor attributes (TreeEnsemble's) as lists.
            if (node.op_type == "ConstantOfShape") {
              if (!value || value->info.numElements() != 1) {
                throw GraphError(fmt::format("node '{}' ({}): tensor attribute '{}' must hold one element", node.name,
                                             node.op_type, key));
              }
              params.set(key, scalarOf(*value));
            } else {
              params.set(key, tensorParam(node, key, *value));
            }
          } else if constexpr (std::is_same_v<T, GraphPtr>) {
            // If/Loop/Scan subgraphs are lowered to sub-programs.
          } else {
            throw GraphError(fmt::format("node '{}' ({}): attribute '{}' (a list of tensors or graphs) "
                                         "cannot be passed to a kernel yet",
                                         node.name, node.op_type, key));
          }
        },
        attribute);
  }
  return params;
}


// Constant folding's fallback: the node's own kernel, run once.
ConstantEvaluator kernelFolding(const CompileOptions& options) {
  if (!options.evaluate_kernel) return {};
  return [&options](const Node& node, const std::vector<ConstantPtr>& inputs,
                    const std::vector<TensorInfo>& outputs) -> std::optional<std::vector<ConstantPtr>> {
    ParamMap params;
    try {
      params = paramsOf(node);
    } catch (const GraphError&) {
      return std::nullopt;  // attributes a kernel cannot take
    }
    std::vector<TensorInfo> infos;
    std::vector<const std::byte*> data;
    for (const ConstantPtr& input : inputs) {
      infos.push_back(input ? input->info : TensorInfo{});
      data.push_back(input ? input->bytes.data() : nullptr);
    }
    auto results = options.evaluate_kernel(kernelName(node), params, infos, data, outputs);
    if (!results || results->size() != outputs.size()) return std::nullopt;
    std::vector<ConstantPtr> constants;
    for (size_t i = 0; i < outputs.size(); ++i) constants.push_back(makeConstant(outputs[i], std::move((*results)[i])));
    return constants;
  };
}

// Removes nodes whose outputs nothing reads, repeatedly. Values that
// subgraphs read by name count as read.
void removeDeadNodes(Graph& graph) {
  std::set<ValueId> outputs(graph.outputs().begin(), graph.outputs().end());
  std::set<std::string> captured;
  collectSubgraphReads(graph, captured);
  for (const std::string& name : captured) {
    if (const auto id = graph.findValue(name)) outputs.insert(*id);
  }
  bool changed = true;
  while (changed) {
    changed = false;
    for (NodeId id : graph.nodeIds()) {
      const Node& node = graph.node(id);
      const bool used = std::any_of(node.outputs.begin(), node.outputs.end(), [&](ValueId v) {
        return !graph.value(v).users.empty() || outputs.contains(v);
      });
      if (!used) {
        graph.removeNode(id);
        changed = true;
      }
    }
  }
}

bool isControlFlow(const Node& node) {
  return node.domain.empty() && (node.op_type == "If" || node.op_type == "Loop" || node.op_type == "Scan");
}

// Lowers a graph to an ExecutableSpec: values get storage, nodes become
// steps, subgraphs of If/Loop/Scan become sub-programs, and the arena is
// planned, sub-programs inside their control-flow step's workspace.
class Lowering {
 public:
  Lowering(const Graph& graph, const CompileOptions& options, int64_t opset, const Variables& variables,
           const Assignments& assignments)
      : graph_(graph), options_(options), opset_(opset), variables_(variables), assignments_(assignments) {}

  ExecutableSpec lower(CompileReport& report, std::vector<ConstantPtr>& constants) {
    checkKernels(graph_);
    collectSubgraphReads(graph_, captured_);
    Scope top{&graph_, std::vector<uint32_t>(graph_.valueCount(), kNoValueIndex), nullptr};
    scope_ = &top;
    for (ValueId id : graph_.inputs()) {
      const auto variable = variables_.find(graph_.value(id).name);
      if (variable != variables_.end()) {
        // A variable is the constant it was (a load anchor), only unfolded.
        spec_.constants.push_back(variable->first);
        constant_data_.push_back(variable->second);
        define(id, ValueStorage::kConstant, static_cast<uint32_t>(spec_.constants.size() - 1));
        continue;
      }
      spec_.inputs.push_back(define(id, ValueStorage::kInput, static_cast<uint32_t>(spec_.inputs.size())));
    }
    defineConstants(graph_, report);
    for (NodeId id : graph_.topologicalOrder()) lowerNode(graph_.node(id), report, spec_.steps);
    bindOutputs();
    planArena(report);
    report.steps = spec_.steps.size();
    for (const StepSpec& step : spec_.steps) ++report.step_kernels[step.kernel];
    for (const SubProgramSpec& program : spec_.subprograms) {
      for (const StepSpec& step : program.steps) ++report.step_kernels[step.kernel];
    }
    constants = std::move(constant_data_);
    return std::move(spec_);
  }

 private:
  // The spec value of each of a graph's values, and the graph around it.
  struct Scope {
    const Graph* graph;
    std::vector<uint32_t> index;  // ValueId -> spec value index
    const Scope* parent;
  };

  const Graph& graph() const { return *scope_->graph; }

  // The spec value of `id` in the current graph; captured values resolve in
  // the enclosing scopes by name.
  uint32_t indexOf(ValueId id) const {
    const Scope* scope = scope_;
    ValueId value = id;
    while (scope->index.at(value) == kNoValueIndex && scope->graph->value(value).kind == ValueKind::kOuterScope) {
      const std::string& name = scope->graph->value(value).name;
      scope = scope->parent;
      const auto outer = scope == nullptr ? std::nullopt : scope->graph->findValue(name);
      if (!outer) throw GraphError(fmt::format("captured value '{}' is not defined in an enclosing graph", name));
      value = *outer;
    }
    const uint32_t index = scope->index.at(value);
    if (index == kNoValueIndex) {
      throw GraphError(fmt::format("value '{}' is read before it is computed", scope->graph->value(value).name));
    }
    return index;
  }

  // Views read only their first input at run time (a Reshape's shape was
  // used at compile time).
  bool neededAtRunTime(ValueId id) const {
    if (isGraphOutput(id)) return true;
    if (scope_->parent != nullptr) return true;  // subgraph constants: cheap, keep them all
    const auto& users = graph().value(id).users;
    return captured_.contains(graph().value(id).name) || std::any_of(users.begin(), users.end(), [&](const Use& use) {
             return !(isView(graph(), graph().node(use.node)) && use.input_index > 0);
           });
  }

  bool isGraphOutput(ValueId id) const {
    return std::find(graph().outputs().begin(), graph().outputs().end(), id) != graph().outputs().end();
  }

  void defineConstants(const Graph& g, CompileReport& report) {
    for (ValueId id : g.initializers()) {
      if (!neededAtRunTime(id)) continue;
      const uint32_t constant = static_cast<uint32_t>(spec_.constants.size());
      // Subgraph constants get their graph's name as a prefix: names are
      // only unique within one graph.
      const std::string name = scope_->parent == nullptr ? g.value(id).name : subgraphPrefix() + g.value(id).name;
      spec_.constants.push_back(name);
      constant_data_.push_back(g.value(id).initializer);
      define(id, ValueStorage::kConstant, constant);
      report.constant_bytes += g.value(id).initializer->bytes.size();
    }
    report.constants = spec_.constants.size();
  }

  std::string subgraphPrefix() const { return fmt::format("sub{}/", subprogram_counter_); }

  uint32_t define(ValueId id, ValueStorage storage, uint32_t index, uint64_t offset = 0) {
    const Value& value = graph().value(id);
    const auto info = value.type.tensorInfo();
    if (!info || !info->isStatic()) {
      throw GraphError(fmt::format("value '{}' has shape {} at compile time; kiln needs static shapes (fix the "
                                   "inputs with --shape or --batch)",
                                   value.name, value.type.toString()));
    }
    scope_->index[id] = static_cast<uint32_t>(spec_.values.size());
    spec_.values.push_back(ValueSpec{value.name, *info, storage, offset, index});
    return scope_->index[id];
  }

  uint32_t defineRaw(const std::string& name, TensorInfo info) {
    spec_.values.push_back(ValueSpec{name, std::move(info), ValueStorage::kArena, 0, 0});
    return static_cast<uint32_t>(spec_.values.size() - 1);
  }

  void checkKernels(const Graph& g) const {
    if (!options_.has_kernel) return;
    std::set<std::string> missing;
    std::function<void(const Graph&)> visit = [&](const Graph& graph) {
      for (NodeId id : graph.nodeIds()) {
        const Node& node = graph.node(id);
        if (!isView(graph, node) && !isControlFlow(node) && !options_.has_kernel(kernelName(node))) {
          missing.insert(
              fmt::format("op '{}' (domain '{}')", node.op_type, node.domain.empty() ? "ai.onnx" : node.domain));
        }
        for (const Graph* sub : node.subgraphs()) visit(*sub);
      }
    };
    visit(g);
    if (!missing.empty()) {
      throw GraphError(fmt::format("Unsupported: {} operator{} without a CPU kernel: {}", missing.size(),
                                   missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
    }
  }

  // Before opset 13, Softmax-like ops normalise over the input flattened to
  // 2-D at `axis`; the kernels implement the opset-13 form (one axis). The
  // two agree only when the axis is the last one.
  void checkSoftmaxSemantics(const Node& node) const {
    static const std::set<std::string> kSoftmaxLike = {"Softmax", "LogSoftmax", "Hardmax"};
    if (!node.domain.empty() || !kSoftmaxLike.contains(node.op_type) || opset_ >= 13) return;
    const auto& shape = graph().value(node.inputs[0]).type.shape;
    const auto rank = static_cast<int64_t>(shape ? shape->size() : 0);
    int64_t axis = node.intAttribute("axis", 1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) {
      throw GraphError(fmt::format("node '{}' ({}, opset {}): axis {} of a rank-{} input uses the pre-opset-13 "
                                   "flattening semantics, which kiln does not implement yet (only the last axis)",
                                   node.name, node.op_type, opset_, axis, rank));
    }
  }

  void lowerNode(const Node& node, CompileReport& report, std::vector<StepSpec>& steps) {
    checkSoftmaxSemantics(node);
    if (isControlFlow(node)) {
      lowerControlFlow(node, report, steps);
      return;
    }
    const ValueId first_input = node.inputs.empty() ? kNoValue : node.inputs[0];
    // A view aliases its input's memory, wherever that lives; only a view
    // that is a graph output is copied, into the caller's output buffer.
    if (isView(graph(), node) && first_input != kNoValue && !isGraphOutput(node.outputs[0])) {
      define(node.outputs[0], ValueStorage::kAlias, indexOf(first_input));
      ++report.views;
      return;
    }
    StepSpec step;
    step.kernel = isView(graph(), node) ? "kiln.Copy" : kernelName(node);
    if (!isView(graph(), node)) step.params = paramsOf(node);
    const size_t input_count = isView(graph(), node) ? 1 : node.inputs.size();
    for (size_t i = 0; i < input_count; ++i) {
      step.inputs.push_back(node.inputs[i] == kNoValue ? kNoValueIndex : indexOf(node.inputs[i]));
    }
    if (isPluginOp(node)) {
      lowerPluginStep(node, step, steps);
    } else {
      for (ValueId output : node.outputs) step.outputs.push_back(define(output, ValueStorage::kArena, 0));
    }
    steps.push_back(std::move(step));
  }

  // A plugin op's step: its inputs where its allocator hook wants them, and
  // its outputs.
  void lowerPluginStep(const Node& node, StepSpec& step, std::vector<StepSpec>& steps) {
    const PluginOp* op = PluginRegistry::global().findOp(node.stringAttribute("plugin_domain", ""),
                                                         node.stringAttribute("plugin_op", ""),
                                                         node.intAttribute("plugin_version", 1));
    if (op == nullptr) throw GraphError(fmt::format("node '{}': its plugin op is not loaded", node.name));
    const PluginInstance instance(*op, node.stringAttribute("attributes", "{}"));
    const std::vector<bool> copied = placePluginInputs(instance, step, steps);
    lowerPluginOutputs(node, instance, copied, step);
  }

  // The allocator hook: each input the op wants laid out (aligned, padded)
  // is planned that way where it is an arena value, or through a view at an
  // aligned offset of one; anything else (a model input, a constant, a view
  // elsewhere) is copied into an arena value planned that way. The layouts
  // go into the step's parameters, for the kernel and the verifier. Returns
  // which inputs were copied.
  std::vector<bool> placePluginInputs(const PluginInstance& instance, StepSpec& step, std::vector<StepSpec>& steps) {
    std::vector<TensorInfo> infos;
    for (uint32_t index : step.inputs) infos.push_back(index == kNoValueIndex ? TensorInfo{} : spec_.values[index].info);
    const std::vector<InputLayout> layouts = instance.inputLayouts(infos);
    std::vector<bool> copied(step.inputs.size(), false);
    if (std::all_of(layouts.begin(), layouts.end(), [](const InputLayout& l) { return l.isDefault(); })) return copied;
    std::vector<int64_t> alignments, paddings;
    for (size_t i = 0; i < layouts.size(); ++i) {
      alignments.push_back(static_cast<int64_t>(layouts[i].alignment));
      paddings.push_back(static_cast<int64_t>(layouts[i].padding_bytes));
      if (layouts[i].isDefault() || requestLayout(step.inputs[i], layouts[i])) continue;
      const ValueSpec& source = spec_.values[step.inputs[i]];
      const uint32_t copy = defineRaw(source.name + ":laid_out", source.info);
      steps.push_back(StepSpec{"kiln.Copy", {step.inputs[i]}, {copy}, {}, {}});
      requestLayout(copy, layouts[i]);
      step.inputs[i] = copy;
      copied[i] = true;
    }
    step.params.set("plugin_input_alignments", alignments);
    step.params.set("plugin_input_paddings", paddings);
    return copied;
  }

  // Asks that value `index` lie as `layout`. True when it will: an arena
  // value, or a view at an aligned offset in one, has its root planned so
  // (aligned, and long enough for the padding past the view), and memory
  // the caller or the package gives may already hold it
  // (storageHoldsLayout). False when it needs a copy.
  bool requestLayout(uint32_t index, const InputLayout& layout) {
    uint64_t offset = 0;
    uint32_t root = index;
    while (spec_.values[root].storage == ValueStorage::kAlias) {
      offset += spec_.values[root].offset;
      root = spec_.values[root].index;
    }
    if (offset % layout.alignment != 0) return false;
    const ValueStorage storage = spec_.values[root].storage;
    const TensorInfo& info = spec_.values[index].info;
    if (storage != ValueStorage::kArena) {
      return storageHoldsLayout(storage, dtypeSize(info.dtype), layout.alignment, layout.padding_bytes);
    }
    InputLayout& planned = layouts_[root];
    planned.alignment = std::max(planned.alignment, layout.alignment);
    const uint64_t end = offset + info.sizeInBytes() + layout.padding_bytes;
    const uint64_t root_bytes = spec_.values[root].info.sizeInBytes();
    if (end > root_bytes) planned.padding_bytes = std::max(planned.padding_bytes, end - root_bytes);
    return true;
  }

  // A plugin op's outputs: an in-place output takes its input's memory when
  // nothing else reads that input (or the input is the copy the allocator
  // hook made), else the kernel copies the input into the output first and
  // the output gets the input's layout. A workspace the plugin asks for is
  // one more output, planned like any other arena value.
  void lowerPluginOutputs(const Node& node, const PluginInstance& instance, const std::vector<bool>& copied,
                          StepSpec& step) {
    const auto inplace = static_cast<size_t>(node.intAttribute("plugin_inplace", 0));
    const std::vector<int64_t> alignments = step.params.getInts("plugin_input_alignments", {});
    const std::vector<int64_t> paddings = step.params.getInts("plugin_input_paddings", {});
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const ValueId input = o < inplace && o < node.inputs.size() ? node.inputs[o] : kNoValue;
      const bool over_input = input != kNoValue && !isGraphOutput(node.outputs[o]) &&
                              ((o < copied.size() && copied[o]) || mayWriteOver(node, input));
      if (over_input) {
        step.outputs.push_back(define(node.outputs[o], ValueStorage::kAlias, step.inputs[o]));
        continue;
      }
      step.outputs.push_back(define(node.outputs[o], ValueStorage::kArena, 0));
      if (input != kNoValue && o < alignments.size() && (alignments[o] > 1 || paddings[o] > 0)) {
        layouts_[step.outputs.back()] = InputLayout{static_cast<uint64_t>(alignments[o]),
                                                    static_cast<uint64_t>(paddings[o])};
      }
    }
    std::vector<TensorInfo> inputs, outputs;
    for (uint32_t index : step.inputs) inputs.push_back(index == kNoValueIndex ? TensorInfo{} : spec_.values[index].info);
    for (uint32_t index : step.outputs) outputs.push_back(spec_.values[index].info);
    const uint64_t workspace = instance.workspaceBytes(inputs, outputs);
    if (workspace > 0) {
      step.params.set("plugin_workspace", int64_t{1});
      step.outputs.push_back(defineRaw(fmt::format("{}:workspace", node.name),
                                       TensorInfo{DType::kU8, {static_cast<int64_t>(workspace)}}));
    }
  }

  // Whether `node` may overwrite `input`: an arena value of its own (not a
  // view, constant or model input) that no other node or subgraph reads.
  bool mayWriteOver(const Node& node, ValueId input) const {
    const Value& value = graph().value(input);
    if (value.kind != ValueKind::kNodeOutput || isGraphOutput(input) || captured_.contains(value.name)) return false;
    if (spec_.values[indexOf(input)].storage != ValueStorage::kArena) return false;
    return std::count(node.inputs.begin(), node.inputs.end(), input) == 1 &&
           std::all_of(value.users.begin(), value.users.end(),
                       [&](const Use& use) { return &graph().node(use.node) == &node; });
  }

  // An If, Loop or Scan step: its subgraphs become sub-programs, planned
  // into one workspace (its last output) that lives in the parent's arena
  // while the step runs.
  void lowerControlFlow(const Node& node, CompileReport& report, std::vector<StepSpec>& steps) {
    StepSpec step;
    step.kernel = "kiln." + node.op_type;
    step.params = paramsOf(node);
    for (ValueId input : node.inputs) step.inputs.push_back(input == kNoValue ? kNoValueIndex : indexOf(input));
    std::set<uint32_t> captured;
    uint64_t workspace = 0;
    std::vector<std::vector<uint32_t>> region_values;
    const std::vector<std::string> order =
        node.op_type == "If" ? std::vector<std::string>{"then_branch", "else_branch"} : std::vector<std::string>{"body"};
    for (const std::string& name : order) {
      const auto it = node.attributes.find(name);
      if (it == node.attributes.end() || !std::holds_alternative<GraphPtr>(it->second)) {
        throw GraphError(fmt::format("node '{}' ({}) has no graph attribute '{}'", node.name, node.op_type, name));
      }
      region_values.emplace_back();
      const auto [program, bytes] = lowerSubgraph(*std::get<GraphPtr>(it->second), report, captured, region_values.back());
      step.subprograms.push_back(program);
      workspace = std::max(workspace, bytes);
    }
    step.params.set("captured_from", static_cast<int64_t>(step.inputs.size()));
    step.params.set("workspace_bytes", static_cast<int64_t>(workspace));
    step.inputs.insert(step.inputs.end(), captured.begin(), captured.end());
    for (ValueId output : node.outputs) step.outputs.push_back(define(output, ValueStorage::kArena, 0));
    const uint32_t workspace_value = defineRaw(fmt::format("{}:workspace", node.name),
                                               TensorInfo{DType::kU8, {static_cast<int64_t>(std::max<uint64_t>(workspace, 1))}});
    // Its regions were planned from offset 0 of it: it is aligned for the
    // most aligned value in them.
    for (const auto& region : region_values) {
      for (uint32_t value : region) {
        const auto layout = layouts_.find(value);
        if (layout == layouts_.end()) continue;
        InputLayout& own = layouts_[workspace_value];
        own.alignment = std::max(own.alignment, layout->second.alignment);
      }
    }
    step.outputs.push_back(workspace_value);
    workspaces_.push_back({workspace_value, std::move(region_values)});
    steps.push_back(std::move(step));
  }

  // Lowers `body` into a sub-program; returns its index and the bytes its
  // arena values need (planned from offset 0 of its region). Outer values
  // it reads go into `captured`.
  std::pair<uint32_t, uint64_t> lowerSubgraph(const Graph& body, CompileReport& report, std::set<uint32_t>& captured,
                                              std::vector<uint32_t>& region) {
    ++subprogram_counter_;
    Scope scope{&body, std::vector<uint32_t>(body.valueCount(), kNoValueIndex), scope_};
    Scope* saved = scope_;
    scope_ = &scope;
    SubProgramSpec program;
    for (ValueId id : body.inputs()) program.inputs.push_back(define(id, ValueStorage::kArena, 0));
    defineConstants(body, report);
    for (ValueId id : body.outerScopeValues()) {
      const uint32_t index = indexOf(id);
      scope.index[id] = index;
      captured.insert(index);
    }
    for (NodeId id : body.topologicalOrder()) lowerNode(body.node(id), report, program.steps);
    for (ValueId id : body.outputs()) program.outputs.push_back(indexOf(id));
    scope_ = saved;
    // The formal inputs and the outputs live through the whole sub-program:
    // the executor writes the inputs before and reads the outputs after it.
    const uint64_t bytes = planRegion(program.steps, program.inputs, program.outputs, region);
    spec_.subprograms.push_back(std::move(program));
    return {static_cast<uint32_t>(spec_.subprograms.size() - 1), bytes};
  }

  // A training update `value` of `variable` computed by a fused elementwise
  // step that no later step reads the variable after (nor an alias of it)
  // is written straight over the variable: the value becomes the variable's
  // constant, and no kiln.Assign copies it. The step may read the variable
  // itself (same shape: it reads each block before storing it). Returns
  // false, changing nothing, where that does not hold.
  bool updateInPlace(uint32_t value, uint32_t variable) {
    ValueSpec& update = spec_.values[value];
    const ValueSpec& target = spec_.values[variable];
    if (update.storage != ValueStorage::kArena || target.storage != ValueStorage::kConstant ||
        update.info != target.info || layouts_.contains(value)) {
      return false;
    }
    size_t producer = spec_.steps.size();
    for (size_t s = 0; s < spec_.steps.size(); ++s) {
      const std::vector<uint32_t>& outputs = spec_.steps[s].outputs;
      if (std::find(outputs.begin(), outputs.end(), value) != outputs.end()) producer = s;
    }
    if (producer == spec_.steps.size() || spec_.steps[producer].kernel != "kiln.FusedElementwise") return false;
    for (size_t s = producer + 1; s < spec_.steps.size(); ++s) {
      if (!spec_.steps[s].subprograms.empty()) return false;  // its sub-programs may read the variable
      for (uint32_t input : spec_.steps[s].inputs) {
        if (input != kNoValueIndex && rootOf(input) == variable) return false;
      }
    }
    for (const ValueSpec& other : spec_.values) {
      if (other.storage == ValueStorage::kAlias && other.index == value) return false;  // a view of the update
    }
    update.storage = ValueStorage::kConstant;
    update.index = target.index;
    update.offset = 0;
    return true;
  }

  // Graph outputs live in the caller's buffers. An output that a step writes
  // becomes kOutput; one that is a graph input, a constant, a view or another
  // output's value gets a copy step.
  void bindOutputs() {
    std::set<uint32_t> taken;
    for (uint32_t i = 0; i < graph_.outputs().size(); ++i) {
      const uint32_t value = indexOf(graph_.outputs()[i]);
      if (const auto assigned = assignments_.find(i); assigned != assignments_.end()) {
        // A training update: written over its variable, after every step
        // that reads the variable (these are the program's last steps).
        const std::optional<ValueId> variable = graph_.findValue(assigned->second);
        if (!variable) throw GraphError(fmt::format("variable '{}' is gone from the graph", assigned->second));
        if (updateInPlace(value, indexOf(*variable))) continue;
        spec_.steps.push_back(StepSpec{"kiln.Assign", {value}, {indexOf(*variable)}, {}, {}});
        continue;
      }
      ValueSpec& spec = spec_.values[value];
      // A value a plugin wants laid out stays in the arena (the caller's
      // buffer would not hold the layout) and is copied out.
      if (spec.storage == ValueStorage::kArena && !layouts_.contains(value) && taken.insert(value).second) {
        spec.storage = ValueStorage::kOutput;
        spec.index = i;
        spec_.outputs.push_back(value);
        continue;
      }
      ValueSpec copy{spec.name + ":output", spec.info, ValueStorage::kOutput, 0, i};
      spec_.values.push_back(copy);
      const auto copy_index = static_cast<uint32_t>(spec_.values.size() - 1);
      spec_.steps.push_back(StepSpec{"kiln.Copy", {value}, {copy_index}, {}, {}});
      spec_.outputs.push_back(copy_index);
    }
  }

  uint32_t rootOf(uint32_t value) const {
    while (spec_.values[value].storage == ValueStorage::kAlias) value = spec_.values[value].index;
    return value;
  }

  // Plans the arena values that `steps` define (and `formal` ones) over step
  // indices; an alias keeps its base alive for as long as it is read; values
  // in `whole` live from the first step to the last. Sets their offsets
  // from 0 and returns the plan; `planned` receives the values placed.
  MemoryPlan planSteps(const std::vector<StepSpec>& steps, const std::vector<uint32_t>& formal,
                       const std::vector<uint32_t>& whole, std::vector<uint32_t>& planned) {
    std::vector<TensorLifetime> lifetimes;
    std::map<uint32_t, size_t> slot;
    const auto last = static_cast<uint32_t>(steps.empty() ? 0 : steps.size() - 1);
    auto add = [&](uint32_t root, uint32_t step) {
      if (spec_.values[root].storage != ValueStorage::kArena || slot.contains(root)) return;
      slot[root] = lifetimes.size();
      planned.push_back(root);
      const auto layout = layouts_.find(root);
      const InputLayout wanted = layout == layouts_.end() ? InputLayout{} : layout->second;
      lifetimes.push_back({spec_.values[root].info.sizeInBytes() + wanted.padding_bytes, step, step, wanted.alignment});
    };
    for (uint32_t value : formal) add(value, 0);
    for (uint32_t s = 0; s < steps.size(); ++s) {
      for (uint32_t output : steps[s].outputs) add(rootOf(output), s);
      for (uint32_t input : steps[s].inputs) {
        if (input == kNoValueIndex) continue;
        const auto it = slot.find(rootOf(input));
        if (it != slot.end()) lifetimes[it->second].last_step = s;
      }
    }
    for (uint32_t value : whole) {
      const auto it = slot.find(rootOf(value));
      if (it == slot.end()) continue;
      lifetimes[it->second].first_step = 0;
      lifetimes[it->second].last_step = last;
    }
    const MemoryPlan plan = planMemory(lifetimes);
    for (size_t i = 0; i < planned.size(); ++i) spec_.values[planned[i]].offset = plan.offsets[i];
    return plan;
  }

  uint64_t planRegion(const std::vector<StepSpec>& steps, const std::vector<uint32_t>& formal,
                      const std::vector<uint32_t>& outputs, std::vector<uint32_t>& region) {
    std::vector<uint32_t> whole = formal;
    whole.insert(whole.end(), outputs.begin(), outputs.end());
    const MemoryPlan plan = planSteps(steps, formal, whole, region);
    return plan.arena_bytes;
  }

  // Moves the values of workspace `w`'s regions to where the workspace was
  // placed; nested workspaces move with their parent's region.
  void placeWorkspace(size_t w, uint64_t base) {
    for (const auto& region : workspaces_[w].regions) {
      for (uint32_t value : region) {
        spec_.values[value].offset += base;
        for (size_t nested = 0; nested < workspaces_.size(); ++nested) {
          if (workspaces_[nested].value == value) placeWorkspace(nested, spec_.values[value].offset);
        }
      }
    }
  }

  void planArena(CompileReport& report) {
    std::vector<uint32_t> planned;
    const MemoryPlan plan = planSteps(spec_.steps, {}, {}, planned);
    for (uint32_t value : planned) {
      for (size_t w = 0; w < workspaces_.size(); ++w) {
        if (workspaces_[w].value == value) placeWorkspace(w, spec_.values[value].offset);
      }
    }
    spec_.arena_bytes = plan.arena_bytes;
    report.arena_bytes = plan.arena_bytes;
    report.lower_bound_bytes = plan.lower_bound_bytes;
    report.naive_bytes = plan.naive_bytes;
    report.plan_summary = describePlan(plan);
  }

  struct Workspace {
    uint32_t value;                            // the control-flow step's workspace output
    std::vector<std::vector<uint32_t>> regions;  // per sub-program, the values planned in it
  };

  const Graph& graph_;
  const CompileOptions& options_;
  int64_t opset_;  // of the default domain
  const Variables& variables_;
  const Assignments& assignments_;
  ExecutableSpec spec_;
  Scope* scope_ = nullptr;
  std::vector<ConstantPtr> constant_data_;  // per spec constant
  std::vector<Workspace> workspaces_;
  std::map<uint32_t, InputLayout> layouts_;  // arena values a plugin's allocator hook wants laid out
  std::set<std::string> captured_;
  size_t subprogram_counter_ = 0;
};

Anchor anchorFor(const ValueSpec& value, AnchorDirection direction, uint32_t program) {
  Anchor anchor;
  anchor.name = value.name;
  anchor.handle = (direction == AnchorDirection::kInput ? "h2d_" : "d2h_") + value.name;
  anchor.programs = {program};
  anchor.info = value.info;
  anchor.direction = direction;
  return anchor;
}


// Model inputs up to this many elements may be shape inputs (a Reshape's
// target shape, Range's limits); larger ones are data, and a shape that
// depends on data is an error at specialization.
constexpr uint64_t kMaxShapeInputElements = 64;

bool hasUnknownShape(const Graph& graph, const Node& node) {
  return std::any_of(node.outputs.begin(), node.outputs.end(),
                     [&](ValueId v) { return !graph.value(v).type.hasStaticShape(); });
}

}  // namespace

// Infers what can be inferred, folds what can be folded, and follows every
// value whose contents a schema needed (and did not have) back to the
// model inputs it is computed from. Shape and Size end the walk: their
// results depend on shapes only.
RuntimeShapes analyzeRuntimeShapes(Graph& graph, const std::map<std::string, int64_t>& opsets,
                                   const CompileOptions& options) {
  std::vector<ValueId> wanted;
  const InferenceOptions lenient{.lenient = true, .wanted_values = &wanted};
  inferTypes(graph, opsets, lenient);
  const ConstantEvaluator fold = kernelFolding(options);
  while (foldConstants(graph, fold) > 0) {
    wanted.clear();
    inferTypes(graph, opsets, lenient);
  }
  RuntimeShapes result;
  for (ValueId id : graph.inputs()) {
    if (!graph.value(id).type.hasStaticShape() && result.reason.empty()) {
      result.reason = fmt::format("input '{}' is {}", graph.value(id).name, graph.value(id).type.toString());
    }
  }
  // Any value whose shape is still unknown (If branches of different
  // shapes, a shape computed from data) is fixed at run time too.
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    for (ValueId output : node.outputs) {
      if (!graph.value(output).type.hasStaticShape() && result.reason.empty()) {
        result.reason = fmt::format("value '{}' of {} is {}", graph.value(output).name, node.op_type,
                                    graph.value(output).type.toString());
      }
    }
    // A Loop body that slices by the step count changes shape per iteration.
    if (result.reason.empty() && !hasStaticSubgraphs(node)) {
      result.reason = fmt::format("the body of {} '{}' has shapes known only while it runs", node.op_type, node.name);
    }
  }
  result.dynamic = !result.reason.empty();
  std::vector<ValueId> stack;
  for (ValueId id : wanted) {
    const auto& users = graph.value(id).users;
    if (std::any_of(users.begin(), users.end(), [&](const Use& use) { return hasUnknownShape(graph, graph.node(use.node)); })) {
      stack.push_back(id);
    }
  }
  std::set<ValueId> seen;
  std::set<std::string> shape_inputs;
  while (!stack.empty()) {
    const ValueId id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second) continue;
    const Value& value = graph.value(id);
    if (value.kind == ValueKind::kGraphInput) {
      const auto info = value.type.tensorInfo();
      if (info && info->isStatic() && info->numElements() <= kMaxShapeInputElements) shape_inputs.insert(value.name);
      continue;
    }
    if (value.kind != ValueKind::kNodeOutput) continue;
    const Node& producer = graph.node(value.producer);
    if (producer.domain.empty() && (producer.op_type == "Shape" || producer.op_type == "Size")) continue;
    for (ValueId input : producer.inputs) {
      if (input != kNoValue) stack.push_back(input);
    }
  }
  result.shape_inputs.assign(shape_inputs.begin(), shape_inputs.end());
  if (!result.shape_inputs.empty() && !result.dynamic) {
    result.reason = fmt::format("shapes depend on the values of input{} {}", result.shape_inputs.size() == 1 ? "" : "s",
                                fmt::join(result.shape_inputs, ", "));
  }
  result.dynamic |= !result.shape_inputs.empty();
  return result;
}

std::vector<ConstantPtr> evaluateNode(const std::string& op_type, const std::string& domain,
                                      const Attributes& attributes, size_t output_count,
                                      const std::vector<ConstantPtr>& inputs,
                                      const std::map<std::string, int64_t>& opsets, const CompileOptions& options) {
  Graph graph("evaluate " + op_type);
  std::vector<ValueId> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    values.push_back(inputs[i] ? graph.addInitializer("input" + std::to_string(i), inputs[i]) : kNoValue);
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < output_count; ++i) names.push_back("output" + std::to_string(i));
  const NodeId id = graph.addNode(op_type, values, names, attributes, domain);
  for (ValueId output : graph.node(id).outputs) graph.addOutput(output);
  inferTypes(graph, opsets);
  std::vector<TensorInfo> infos;
  for (ValueId output : graph.node(id).outputs) {
    const auto info = graph.value(output).type.tensorInfo();
    if (!info || !info->isStatic()) {
      throw UsageError(fmt::format("{}: the output type {} is not static even with every input known", op_type,
                                   graph.value(output).type.toString()));
    }
    infos.push_back(*info);
  }
  const ConstantEvaluator kernel = kernelFolding(options);
  const auto results = kernel ? kernel(graph.node(id), inputs, infos) : std::nullopt;
  if (!results) throw UsageError(fmt::format("{}: no CPU kernel evaluates it on these inputs", op_type));
  return *results;
}

TensorInfo anchorInfo(const ValueType& type) {
  TensorInfo info;
  info.dtype = type.dtype;
  if (type.shape) {
    for (const Dim& dim : *type.shape) info.shape.push_back(dim.isKnown() ? dim.size : kDynamicDim);
  }
  return info;
}

namespace {

// Initializers at least this large are written as TensorData blobs (mapped,
// shared by every specialization); smaller ones stay inside the graph.
constexpr uint64_t kExternalInitializerBytes = 1024;

std::string opsetOptionKey(const std::string& domain) { return "opset:" + (domain.empty() ? std::string("ai.onnx") : domain); }

CompileReport writeGraphPackage(const Graph& graph, const std::map<std::string, int64_t>& opsets,
                                const RuntimeShapes& runtime, const std::vector<std::string>& output_names,
                                const std::filesystem::path& output, const CompileOptions& options) {
  auto external = [](const Value& value) { return value.initializer->bytes.size() >= kExternalInitializerBytes; };
  Metadata metadata;
  metadata.target.device_kind = options.target;
  metadata.executable = options.model_name;
  metadata.programs = {{0, "load"}, {1, "main"}};
  metadata.program_flow = {.load = {0}, .main = {1}, .save = {}};
  metadata.options[std::string(kExecutableFormatOption)] = std::string(kGraphExecutableFormat);
  std::string shape_inputs;
  for (const std::string& name : runtime.shape_inputs) shape_inputs += (shape_inputs.empty() ? "" : ",") + name;
  if (!shape_inputs.empty()) metadata.options[std::string(kShapeInputsOption)] = shape_inputs;
  if (options.tf32) metadata.options[std::string(kCudaTf32Option)] = "1";
  if (options.fp16) metadata.options[std::string(kCudaFp16Option)] = "1";
  if (options.bf16) metadata.options[std::string(kCudaBf16Option)] = "1";
  for (const auto& [domain, version] : opsets) metadata.options[opsetOptionKey(domain)] = std::to_string(version);
  recordPlugins(metadata.options, usedPluginLibraries(graph));
  auto anchor = [&](const Value& value, AnchorDirection direction) {
    Anchor a;
    a.name = value.name;
    a.handle = (direction == AnchorDirection::kInput ? "h2d_" : "d2h_") + value.name;
    a.programs = {1};
    a.info = anchorInfo(value.type);
    a.direction = direction;
    return a;
  };
  for (ValueId id : graph.inputs()) metadata.anchors.push_back(anchor(graph.value(id), AnchorDirection::kInput));
  for (size_t i = 0; i < graph.outputs().size(); ++i) {
    Anchor a = anchor(graph.value(graph.outputs()[i]), AnchorDirection::kOutput);
    a.name = output_names[i];
    a.handle = "d2h_" + a.name;
    metadata.anchors.push_back(a);
  }

  CompileReport report;
  report.runtime_shapes = true;
  report.runtime_shapes_reason = runtime.reason;
  PackageWriter writer(output);
  writer.writeExecutable(options.model_name, encodeGraph(graph, external));
  writer.writeMetadata(options.model_name, metadata);
  for (ValueId id : graph.initializers()) {
    const Value& value = graph.value(id);
    if (!external(value)) continue;
    writer.writeTensorData(value.name, value.initializer->info, value.initializer->bytes);
    ++report.constants;
    report.constant_bytes += value.initializer->bytes.size();
  }
  writer.close();
  return report;
}

// The layout-independent passes over the subgraphs of control flow (If
// branches, Loop and Scan bodies), innermost first, so that the sub-models
// an If selects between run fused like the main graph. Layout passes stay
// on the main graph: a subgraph's captured values keep their layout.
void optimizeSubgraphs(Graph& graph, const std::map<std::string, int64_t>& opsets,
                       const ElementwiseFusionLimits& limits, bool fuse_clip) {
  for (NodeId id : graph.nodeIds()) {
    for (const auto& [key, attribute] : graph.node(id).attributes) {
      if (!std::holds_alternative<GraphPtr>(attribute)) continue;
      Graph& body = *std::get<GraphPtr>(attribute);
      optimizeSubgraphs(body, opsets, limits, fuse_clip);
      const CseResult merged = eliminateCommonSubexpressions(body);
      size_t changed = merged.nodes + merged.initializers;
      changed += fuseLayerNorms(body);
      changed += fuseMatMuls(body, fuse_clip);
      changed += fuseElementwise(body, limits);
      if (changed > 0) inferTypes(body, opsets);
    }
  }
}

// Makes each named weight a graph input for the passes (nothing folds an
// input) and returns their data, for lowering to make them constants again.
Variables detachVariables(Graph& graph, const std::vector<std::string>& names) {
  Variables variables;
  for (const std::string& name : names) {
    const std::optional<ValueId> found = graph.findValue(name);
    if (!found || graph.value(*found).kind != ValueKind::kInitializer) {
      std::vector<std::string> weights;
      for (ValueId id : graph.initializers()) weights.push_back(graph.value(id).name);
      if (weights.size() > 8) weights.resize(8);
      throw UsageError(fmt::format("variable '{}' is not a weight (initializer) of the model{}; its weights include: "
                                   "{}",
                                   name, found ? "" : " (no value of that name)", fmt::join(weights, ", ")));
    }
    if (variables.contains(name)) continue;
    const ValueId weight = *found;
    const ConstantPtr data = graph.value(weight).initializer;
    graph.renameValue(weight, name + ":weight");
    const ValueId input = graph.addInput(name, ValueType::tensor(data->info.dtype, data->info.shape));
    graph.replaceAllUses(weight, input);
    variables[name] = data;
  }
  return variables;
}

// A package with variables keeps the ONNX model it was compiled from, so
// that trained or rewritten weights can be exported back into it
// (Session.export_onnx): the opaque blob kSourceModelBlob.
void embedSourceModel(PackageWriter& writer, const CompileOptions& options) {
  std::ifstream file(options.source_model, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof()) throw UsageError(fmt::format("cannot read the source model '{}'", options.source_model));
  writer.writeOpaque(std::string(kSourceModelBlob), options.model_name, std::as_bytes(std::span(bytes)));
}

// CompileOptions::gradients_of: the gradients as outputs named
// "<value>_grad", after the model's own.
void appendGradientOutputs(Graph& graph, const std::map<std::string, int64_t>& opsets, const CompileOptions& options,
                           std::vector<std::string>& output_names) {
  inferTypes(graph, opsets);
  const auto find = [&](const std::string& name, const char* what) {
    const std::optional<ValueId> found = graph.findValue(name);
    if (!found) throw UsageError(fmt::format("the {} '{}' is no value of the model", what, name));
    return *found;
  };
  const ValueId loss = find(options.gradients_of, "loss");
  std::vector<ValueId> wrt;
  for (const std::string& name : options.gradients_wrt) wrt.push_back(find(name, "value to differentiate by"));
  const std::vector<ValueId> gradients = appendGradients(graph, loss, wrt, opsets);
  for (size_t i = 0; i < gradients.size(); ++i) {
    // A gradient may be another's value (a shared path) or a model value
    // passed through: a named Identity gives every output a name of its own.
    const std::string name = uniqueName(graph, options.gradients_wrt[i] + "_grad");
    const ValueId output = graph.node(graph.addNode("Identity", {gradients[i]}, {name})).outputs[0];
    graph.addOutput(output);
    output_names.push_back(name);
  }
}

// The weights a training package trains: those named, or every f32
// initializer of the main graph the loss has a gradient for, running
// statistics aside.
std::vector<std::string> trainableWeights(const Graph& graph, const std::map<std::string, int64_t>& opsets,
                                         const TrainingOptions& training) {
  const std::vector<std::string> statistics = runningStatistics(graph);
  const auto isStatistic = [&](const std::string& name) {
    return std::find(statistics.begin(), statistics.end(), name) != statistics.end();
  };
  for (const std::string& name : training.trainable) {
    if (isStatistic(name)) {
      throw UsageError(fmt::format("training: '{}' is a BatchNormalization running statistic, which training updates "
                                   "from the batches and never trains",
                                   name));
    }
  }
  if (!training.trainable.empty()) return training.trainable;
  std::vector<std::string> candidates;
  for (ValueId id : graph.initializers()) {
    const Value& value = graph.value(id);
    if (value.initializer && value.initializer->info.dtype == DType::kF32 && !isStatistic(value.name)) {
      candidates.push_back(value.name);
    }
  }
  // Only those with a gradient: a Dropout's ratio or an exponent stays a
  // constant the compiler can fold and the rules can read.
  const std::vector<std::string> names = namesWithGradients(graph, training.loss, candidates, opsets);
  if (names.empty()) throw UsageError("training: the model has no f32 weights (initializers) to train");
  return names;
}

// CompileOptions::training: the gradients and the optimiser's updates; each
// update becomes a trailing graph output that lowering writes over its
// variable. The optimiser's state joins `variables`.
Assignments appendTrainingUpdates(Graph& graph, const std::map<std::string, int64_t>& opsets,
                                  const TrainingOptions& training, const std::vector<std::string>& trainable,
                                  Variables& variables, std::vector<std::string>& output_names) {
  inferTypes(graph, opsets);
  const std::optional<ValueId> loss = graph.findValue(training.loss);
  if (!loss) throw UsageError(fmt::format("training: the loss '{}' is no value of the model", training.loss));
  std::vector<ValueId> weights;
  for (const std::string& name : trainable) weights.push_back(*graph.findValue(name));
  const std::vector<std::pair<std::string, ValueId>> statistics = enterTrainingMode(graph, training.seed);
  TrainingStep step = appendTrainingStep(graph, opsets, *loss, weights, training.optimizer,
                                         training.gradient_accumulation, training.gradient_all_reduce);
  step.updates.insert(step.updates.end(), statistics.begin(), statistics.end());
  variables.insert(step.state.begin(), step.state.end());
  Assignments assignments;
  for (const auto& [variable, value] : step.updates) {
    assignments[graph.outputs().size()] = variable;
    graph.addOutput(value);
    output_names.push_back(variable + ":next");
  }
  return assignments;
}

}  // namespace

CompiledProgram compileProgram(Graph& graph, const std::map<std::string, int64_t>& opsets,
                               const CompileOptions& options, const Variables& variables,
                               const Assignments& assignments) {
  // Folding shape arithmetic makes more shapes concrete; infer again until
  // nothing more folds.
  inferTypes(graph, opsets);
  const ConstantEvaluator fold = kernelFolding(options);
  while (foldConstants(graph, fold) > 0) inferTypes(graph, opsets);
  // Identities (Paddle puts one after nearly every operator) would hide
  // each operator from the next from here on.
  if (removeIdentities(graph) > 0) inferTypes(graph, opsets);
  // Inference-mode BatchNormalization after a Conv becomes the Conv's
  // weights and bias; any other becomes a per-channel Mul and Add.
  if (foldBatchNormIntoConv(graph) + rewriteBatchNormAsScaleShift(graph) > 0) inferTypes(graph, opsets);
  // Kernel taps that read only padding (a 3x3 Conv over a map one row high)
  // are dropped.
  if (trimPaddingTaps(graph) > 0) inferTypes(graph, opsets);
  // Squeeze ... Unsqueeze around elementwise work (Keras Conv1D exports)
  // cancel, so that the layout pass sees Conv meet Conv.
  if (cancelUnitAxisPairs(graph) > 0) {
    removeDeadNodes(graph);
    inferTypes(graph, opsets);
  }
  // one_hot(ids) @ W (TensorFlow and JAX embeddings) as a row lookup; its
  // rewrite uses Where, which opset 9 introduced.
  const auto default_opset = opsets.find("");
  if (default_opset != opsets.end() && default_opset->second >= 9 && replaceOneHotMatMuls(graph) > 0) {
    removeDeadNodes(graph);
    inferTypes(graph, opsets);
  }
  // Repeated work computed once, then MatMul/Gemm chains as single oneDNN steps.
  eliminateCommonSubexpressions(graph);
  // Attention chains first: the matmul fusion would take their scores'
  // MatMul and the elementwise fusion their scale and mask. Both targets
  // have a fused kernel.
  if (options.fuse_attention && fuseAttention(graph, default_opset == opsets.end() ? 1 : default_opset->second) > 0) {
    removeDeadNodes(graph);  // the heads' split and merge the fused nodes no longer read
    inferTypes(graph, opsets);
  }
  if (fuseLayerNorms(graph) > 0) inferTypes(graph, opsets);
  if (options.target == "cpu" && fuseRmsNorms(graph) > 0) inferTypes(graph, opsets);
  if (fuseMatMuls(graph, options.fuse_clip) > 0) inferTypes(graph, opsets);
  if (options.target == "cpu" && fuseIntegerMatMuls(graph) > 0) inferTypes(graph, opsets);
  // Reductions over an image's spatial axes as the global pools they are,
  // which the channels-last pass keeps in NHWC.
  if (options.channels_last && reductionsToGlobalPools(graph) > 0) inferTypes(graph, opsets);
  if (options.channels_last && convertToChannelsLast(graph) > 0) inferTypes(graph, opsets);
  // Activations and residual Adds after a channels-last Conv become its
  // oneDNN post-ops.
  fuseConvPostOps(graph, /*nchw=*/options.target == "cuda", options.fuse_clip);
  if (options.channels_last) fuseQuantizedResidualAdds(graph);
  // 3x3 convolutions move to oneDNN's blocked layout, where it has Winograd.
  if (options.channels_last) useBlockedConvs(graph);
  // Layout changes that meet the model's own Transposes: one move, or none.
  if (composeTransposes(graph) > 0) {
    removeDeadNodes(graph);
    inferTypes(graph, opsets);
  }
  // What elementwise work is left, in connected groups, as single steps that
  // make one pass over memory each.
  ElementwiseFusionLimits limits{.quantized_io = true};
  if (options.target == "cuda") {
    limits = {.max_inputs = kCudaMaxProgramInputs, .max_ops = kCudaMaxProgramOps,
              .max_immediates = kCudaMaxProgramImmediates};
  }
  if (fuseElementwise(graph, limits) > 0) inferTypes(graph, opsets);
  // Chains of 8-bit table steps (a quantized model's scalings and
  // activations, each between its own quantizations) as one table.
  // (The fusion leaves the DequantizeLinears it absorbed, unread.)
  if (options.target == "cpu") {
    removeDeadNodes(graph);
    composeByteTables(graph, kernelFolding(options));
  }
  // A feature pyramid's nearest upsampling read by such a step, in it.
  if (options.target == "cpu" && fuseUpsampling(graph) > 0) {
    removeDeadNodes(graph);
    inferTypes(graph, opsets);
  }
  if (options.fp16 && storeInFloat16(graph, DType::kF16) > 0) inferTypes(graph, opsets);
  if (options.bf16 && options.target == "cuda" && storeInFloat16(graph, DType::kBF16) > 0) inferTypes(graph, opsets);
  if (options.bf16 && options.target == "cpu") setMathMode(graph, kBf16ProductOps, kMathBf16);
  if (options.tf32) setMathMode(graph, kTf32Ops, kMathTf32);
  optimizeSubgraphs(graph, opsets, limits, options.fuse_clip);
  removeDeadNodes(graph);
  verifyGraph(graph, /*require_types=*/true);

  CompiledProgram program;
  program.spec = Lowering(graph, options, default_opset == opsets.end() ? 1 : default_opset->second, variables,
                          assignments)
                     .lower(program.report, program.constants);
  return program;
}

CompileReport compile(Graph& graph, const std::map<std::string, int64_t>& opsets, const std::filesystem::path& output,
                      const CompileOptions& options) {
  auto progress = [&](const std::string& stage, double fraction) {
    if (options.progress) options.progress(stage, fraction);
  };
  progress("inferring types", 0.0);
  // Passes may replace an output value (folding it to a constant, say); the
  // model's outputs keep their names.
  std::vector<std::string> output_names;
  for (ValueId id : graph.outputs()) output_names.push_back(graph.value(id).name);
  // Nodes of loaded plugins' ops become kiln.Plugin nodes before anything
  // infers types (ops/plugin_ops.cc infers them through the plugin), and
  // before autodiff, which differentiates composite ops through their
  // bodies and the others through their gradient ops (the gradient nodes
  // and the all-reduce it adds are bound as they are added).
  bindPluginOps(graph, opsets);
  std::vector<std::string> variable_names = options.variables;
  const std::vector<std::string> trainable = options.training ? trainableWeights(graph, opsets, *options.training)
                                                               : std::vector<std::string>{};
  variable_names.insert(variable_names.end(), trainable.begin(), trainable.end());
  if (options.training) {
    const std::vector<std::string> statistics = runningStatistics(graph);
    variable_names.insert(variable_names.end(), statistics.begin(), statistics.end());
  }
  Variables variables = detachVariables(graph, variable_names);
  if (!options.gradients_of.empty()) appendGradientOutputs(graph, opsets, options, output_names);
  Assignments assignments;
  if (options.training) {
    assignments = appendTrainingUpdates(graph, opsets, *options.training, trainable, variables, output_names);
  }
  // kiln.Expression nodes become the ONNX operators they are written with.
  expandExpressions(graph, opsets.contains("") ? opsets.at("") : 1);
  if (options.float16_in_float32) computeFloat16InFloat32(graph);
  size_t int8_matmuls = 0;
  if (options.quantize_activations) {
    if (options.target != "cpu") throw UsageError("quantize_activations (--quantize-activations) is for the cpu target");
    // The activations it fuses are matched on known shapes; lenient, as
    // a model with run-time shapes may have values no shape is known for.
    inferTypes(graph, opsets, InferenceOptions{.lenient = true});
    int8_matmuls = quantizeActivations(graph);
  }
  if (options.target == "cpu") {
    // QDQ groups as integer operators, before folding expands their
    // weights; lenient, as run-time shapes leave some values unknown. Only
    // a model with DequantizeLinear nodes pays for the inference it needs.
    const std::vector<NodeId> ids = graph.nodeIds();
    const bool quantized = std::any_of(ids.begin(), ids.end(), [&](NodeId id) {
      return graph.node(id).domain.empty() && graph.node(id).op_type == "DequantizeLinear";
    });
    if (quantized) {
      inferTypes(graph, opsets, InferenceOptions{.lenient = true});
      if (fuseQdq(graph) > 0) removeDeadNodes(graph);
    }
  }
  const RuntimeShapes runtime = analyzeRuntimeShapes(graph, opsets, options);
  if (options.tf32 && options.target != "cuda") throw UsageError("tf32 (--tf32) is for the cuda target");
  if (options.fp16 && options.target != "cuda") throw UsageError("fp16 (--fp16) is for the cuda target");
  if (options.fp16 && options.bf16) throw UsageError("fp16 and bf16 (--fp16, --bf16) exclude each other: choose one");
  if (options.target != "cpu" && options.target != "cuda") {
    throw UsageError("unknown compile target '" + options.target + "': expected cpu or cuda");
  }
  if (runtime.dynamic && !variables.empty()) {
    throw UsageError(fmt::format("variables (--variables) need static shapes, and this model's are known only at run "
                                 "time ({}); fix them with --shape or --batch",
                                 runtime.reason));
  }
  if (runtime.dynamic) {
    progress("writing package", 0.2);
    CompileReport report = writeGraphPackage(graph, opsets, runtime, output_names, output, options);
    report.int8_matmuls = int8_matmuls;
    progress("done", 1.0);
    return report;
  }
  CompileOptions effective = options;
  if (options.target == "cuda") {
    // cuDNN and the cuda kernels take the model's own NCHW layout.
    effective.channels_last = false;
  }
  CompiledProgram program = compileProgram(graph, opsets, effective, variables, assignments);
  progress("planning memory", 0.1);
  CompileReport report = program.report;
  report.int8_matmuls = int8_matmuls;
  const ExecutableSpec& spec = program.spec;

  constexpr uint32_t kLoadProgram = 0;
  constexpr uint32_t kMainProgram = 1;
  Metadata metadata;
  metadata.target.device_kind = options.target;
  metadata.is_inference = !options.training.has_value();
  metadata.executable = options.model_name;
  metadata.programs = {{kLoadProgram, "load"}, {kMainProgram, "main"}};
  metadata.program_flow = {.load = {kLoadProgram}, .main = {kMainProgram}, .save = {}};
  // Variables: a save program whose anchors read them back, one per
  // variable, named as its load anchor.
  constexpr uint32_t kSaveProgram = 2;
  if (!variables.empty()) {
    metadata.programs[kSaveProgram] = "save";
    metadata.program_flow.save = {kSaveProgram};
  }
  metadata.options = {{"memory.arena_bytes", std::to_string(report.arena_bytes)},
                      {"memory.lower_bound_bytes", std::to_string(report.lower_bound_bytes)},
                      {"memory.naive_bytes", std::to_string(report.naive_bytes)}};
  recordPlugins(metadata.options, usedPluginLibraries(graph));
  if (options.training && !options.training->gradient_all_reduce.empty()) {
    // How the replicas (or processes) of this training package stay in step.
    metadata.options[std::string(kGradientAllReduceOption)] = options.training->gradient_all_reduce;
  }
  for (uint32_t value : spec.inputs) {
    metadata.anchors.push_back(anchorFor(spec.values[value], AnchorDirection::kInput, kMainProgram));
  }
  // One load anchor per constant, named as its TensorData blob (a
  // subgraph's constants carry a scope prefix that their values lack).
  std::vector<bool> anchored(spec.constants.size(), false);
  for (const ValueSpec& value : spec.values) {
    if (value.storage != ValueStorage::kConstant || anchored[value.index]) continue;
    anchored[value.index] = true;
    Anchor anchor = anchorFor(value, AnchorDirection::kInput, kLoadProgram);
    anchor.name = spec.constants[value.index];
    anchor.handle = "h2d_" + anchor.name;
    metadata.anchors.push_back(anchor);
  }
  for (uint32_t value : spec.outputs) {
    Anchor anchor = anchorFor(spec.values[value], AnchorDirection::kOutput, kMainProgram);
    anchor.name = output_names.at(spec.values[value].index);
    anchor.handle = "d2h_" + anchor.name;
    metadata.anchors.push_back(anchor);
  }
  for (const auto& [name, data] : variables) {
    Anchor anchor;
    anchor.name = name;
    anchor.handle = "d2h_" + name;
    anchor.programs = {kSaveProgram};
    anchor.info = data->info;
    anchor.direction = AnchorDirection::kOutput;
    metadata.anchors.push_back(anchor);
  }

  // Writing the weights is most of the work on large models: it reports
  // progress by bytes.
  progress("writing package", 0.2);
  PackageWriter writer(output);
  writer.writeExecutable(options.model_name, encodeExecutable(spec));
  writer.writeMetadata(options.model_name, metadata);
  uint64_t written = 0;
  for (size_t c = 0; c < spec.constants.size(); ++c) {
    const Constant& constant = *program.constants[c];
    writer.writeTensorData(spec.constants[c], constant.info, constant.bytes);
    written += constant.bytes.size();
    const double share = static_cast<double>(written) / static_cast<double>(std::max<uint64_t>(report.constant_bytes, 1));
    progress("writing package", std::min(1.0, 0.2 + 0.8 * share));
  }
  if (!variables.empty() && !options.source_model.empty()) embedSourceModel(writer, options);
  writer.close();
  progress("done", 1.0);
  return report;
}

}  // namespace kiln
