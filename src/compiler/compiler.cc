#include "kiln/compiler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <set>

#include "compiler/memory_planner.h"
#include "format/executable_spec.h"
#include "kiln/error.h"
#include "kiln/package_writer.h"
#include "ops/shape_inference.h"
#include "passes/batchnorm_folding.h"
#include "passes/blocked_conv.h"
#include "passes/channels_last.h"
#include "passes/conv_fusion.h"
#include "passes/common_subexpression.h"
#include "passes/constant_folding.h"
#include "passes/elementwise_fusion.h"
#include "passes/layernorm_fusion.h"
#include "passes/matmul_fusion.h"

namespace kiln {
namespace {

// Operators whose output is their first input's bytes reinterpreted: they
// become aliases, not steps.
bool isView(const Node& node) {
  static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  return node.domain.empty() && kViews.contains(node.op_type);
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

ParamMap paramsOf(const Node& node) {
  ParamMap params;
  for (const auto& [key, attribute] : node.attributes) {
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::string> ||
                        std::is_same_v<T, std::vector<int64_t>>) {
            params.set(key, value);
          } else if constexpr (std::is_same_v<T, float>) {
            params.set(key, static_cast<double>(value));
          } else if constexpr (std::is_same_v<T, std::vector<float>>) {
            params.set(key, std::vector<double>(value.begin(), value.end()));
          } else if constexpr (std::is_same_v<T, ConstantPtr>) {
            // A one-element tensor (ConstantOfShape's value) passes as a
            // number: an int for integer and bool types, a float otherwise.
            if (!value || value->info.numElements() != 1) {
              throw GraphError(fmt::format("node '{}' ({}): tensor attribute '{}' must hold one element to be passed "
                                           "to a kernel",
                                           node.name, node.op_type, key));
            }
            params.set(key, scalarOf(*value));
          } else {
            throw GraphError(fmt::format("node '{}' ({}): attribute '{}' (tensor, graph or string list) cannot be "
                                         "passed to a kernel yet",
                                         node.name, node.op_type, key));
          }
        },
        attribute);
  }
  return params;
}

// Removes nodes whose outputs nothing reads, repeatedly.
void removeDeadNodes(Graph& graph) {
  std::set<ValueId> outputs(graph.outputs().begin(), graph.outputs().end());
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

class Lowering {
 public:
  Lowering(const Graph& graph, const CompileOptions& options, int64_t opset)
      : graph_(graph), options_(options), opset_(opset) {}

  ExecutableSpec lower(CompileReport& report) {
    checkKernels();
    index_.assign(graph_.valueCount(), kNoValueIndex);
    for (ValueId id : graph_.inputs()) {
      spec_.inputs.push_back(define(id, ValueStorage::kInput, static_cast<uint32_t>(spec_.inputs.size())));
    }
    for (ValueId id : graph_.initializers()) {
      if (!neededAtRunTime(id)) continue;
      const uint32_t constant = static_cast<uint32_t>(spec_.constants.size());
      spec_.constants.push_back(graph_.value(id).name);
      define(id, ValueStorage::kConstant, constant);
      report.constant_bytes += graph_.value(id).initializer->bytes.size();
    }
    report.constants = spec_.constants.size();
    for (NodeId id : graph_.topologicalOrder()) lowerNode(graph_.node(id), report);
    bindOutputs();
    planArena(report);
    report.steps = spec_.steps.size();
    return std::move(spec_);
  }

 private:
  // Views read only their first input at run time (a Reshape's shape was
  // used at compile time).
  bool neededAtRunTime(ValueId id) const {
    if (isGraphOutput(id)) return true;
    return std::any_of(graph_.value(id).users.begin(), graph_.value(id).users.end(), [&](const Use& use) {
      return !(isView(graph_.node(use.node)) && use.input_index > 0);
    });
  }

  bool isGraphOutput(ValueId id) const {
    return std::find(graph_.outputs().begin(), graph_.outputs().end(), id) != graph_.outputs().end();
  }

  uint32_t define(ValueId id, ValueStorage storage, uint32_t index, uint64_t offset = 0) {
    const Value& value = graph_.value(id);
    const auto info = value.type.tensorInfo();
    if (!info || !info->isStatic()) {
      throw GraphError(fmt::format("value '{}' has shape {} at compile time; kiln needs static shapes (fix the "
                                   "inputs with --shape or --batch)",
                                   value.name, value.type.toString()));
    }
    index_[id] = static_cast<uint32_t>(spec_.values.size());
    spec_.values.push_back(ValueSpec{value.name, *info, storage, offset, index});
    return index_[id];
  }

  void checkKernels() const {
    if (!options_.has_kernel) return;
    std::set<std::string> missing;
    for (NodeId id : graph_.nodeIds()) {
      const Node& node = graph_.node(id);
      if (!isView(node) && !options_.has_kernel(kernelName(node))) {
        missing.insert(fmt::format("op '{}' (domain '{}')", node.op_type, node.domain.empty() ? "ai.onnx" : node.domain));
      }
    }
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
    const auto& shape = graph_.value(node.inputs[0]).type.shape;
    const auto rank = static_cast<int64_t>(shape ? shape->size() : 0);
    int64_t axis = node.intAttribute("axis", 1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) {
      throw GraphError(fmt::format("node '{}' ({}, opset {}): axis {} of a rank-{} input uses the pre-opset-13 "
                                   "flattening semantics, which kiln does not implement yet (only the last axis)",
                                   node.name, node.op_type, opset_, axis, rank));
    }
  }

  void lowerNode(const Node& node, CompileReport& report) {
    checkSoftmaxSemantics(node);
    const ValueId first_input = node.inputs.empty() ? kNoValue : node.inputs[0];
    // A view aliases its input's memory, wherever that lives; only a view
    // that is a graph output is copied, into the caller's output buffer.
    if (isView(node) && first_input != kNoValue && !isGraphOutput(node.outputs[0])) {
      define(node.outputs[0], ValueStorage::kAlias, index_[first_input]);
      ++report.views;
      return;
    }
    StepSpec step;
    step.kernel = isView(node) ? "kiln.Copy" : kernelName(node);
    if (!isView(node)) step.params = paramsOf(node);
    const size_t input_count = isView(node) ? 1 : node.inputs.size();
    for (size_t i = 0; i < input_count; ++i) {
      step.inputs.push_back(node.inputs[i] == kNoValue ? kNoValueIndex : index_.at(node.inputs[i]));
    }
    for (ValueId output : node.outputs) step.outputs.push_back(define(output, ValueStorage::kArena, 0));
    spec_.steps.push_back(std::move(step));
  }

  // Graph outputs live in the caller's buffers. An output that a step writes
  // becomes kOutput; one that is a graph input, a constant, a view or another
  // output's value gets a copy step.
  void bindOutputs() {
    std::set<uint32_t> taken;
    for (uint32_t i = 0; i < graph_.outputs().size(); ++i) {
      const uint32_t value = index_.at(graph_.outputs()[i]);
      ValueSpec& spec = spec_.values[value];
      if (spec.storage == ValueStorage::kArena && taken.insert(value).second) {
        spec.storage = ValueStorage::kOutput;
        spec.index = i;
        spec_.outputs.push_back(value);
        continue;
      }
      ValueSpec copy{spec.name + ":output", spec.info, ValueStorage::kOutput, 0, i};
      spec_.values.push_back(copy);
      const auto copy_index = static_cast<uint32_t>(spec_.values.size() - 1);
      spec_.steps.push_back(StepSpec{"kiln.Copy", {value}, {copy_index}, {}});
      spec_.outputs.push_back(copy_index);
    }
  }

  // Lifetimes of arena values over step indices; an alias keeps its base
  // alive for as long as it is read.
  void planArena(CompileReport& report) {
    std::vector<uint32_t> arena_values;
    std::vector<TensorLifetime> lifetimes;
    std::vector<int64_t> slot(spec_.values.size(), -1);
    auto rootOf = [&](uint32_t value) {
      while (spec_.values[value].storage == ValueStorage::kAlias) value = spec_.values[value].index;
      return value;
    };
    for (uint32_t s = 0; s < spec_.steps.size(); ++s) {
      for (uint32_t output : spec_.steps[s].outputs) {
        const uint32_t root = rootOf(output);
        if (spec_.values[root].storage != ValueStorage::kArena || slot[root] >= 0) continue;
        slot[root] = static_cast<int64_t>(lifetimes.size());
        arena_values.push_back(root);
        lifetimes.push_back({spec_.values[root].info.sizeInBytes(), s, s});
      }
      for (uint32_t input : spec_.steps[s].inputs) {
        if (input == kNoValueIndex) continue;
        const uint32_t root = rootOf(input);
        if (slot[root] >= 0) lifetimes[static_cast<size_t>(slot[root])].last_step = s;
      }
    }
    const MemoryPlan plan = planMemory(lifetimes);
    for (size_t i = 0; i < arena_values.size(); ++i) spec_.values[arena_values[i]].offset = plan.offsets[i];
    spec_.arena_bytes = plan.arena_bytes;
    report.arena_bytes = plan.arena_bytes;
    report.lower_bound_bytes = plan.lower_bound_bytes;
    report.naive_bytes = plan.naive_bytes;
    report.plan_summary = describePlan(plan);
  }

  const Graph& graph_;
  const CompileOptions& options_;
  int64_t opset_;  // of the default domain
  ExecutableSpec spec_;
  std::vector<uint32_t> index_;  // graph ValueId -> spec value index
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

}  // namespace

CompileReport compile(Graph& graph, const std::map<std::string, int64_t>& opsets, const std::filesystem::path& output,
                      const CompileOptions& options) {
  auto progress = [&](const std::string& stage, double fraction) {
    if (options.progress) options.progress(stage, fraction);
  };
  // Folding shape arithmetic makes more shapes concrete; infer again until
  // nothing more folds.
  progress("inferring types", 0.0);
  inferTypes(graph, opsets);
  while (foldConstants(graph) > 0) inferTypes(graph, opsets);
  // Inference-mode BatchNormalization after a Conv becomes the Conv's
  // weights and bias (ConvTranspose is not handled).
  if (foldBatchNormIntoConv(graph) > 0) inferTypes(graph, opsets);
  // Repeated work computed once, then MatMul/Gemm chains as single oneDNN steps.
  eliminateCommonSubexpressions(graph);
  const auto default_opset = opsets.find("");
  if (fuseLayerNorms(graph, default_opset == opsets.end() ? 1 : default_opset->second) > 0) inferTypes(graph, opsets);
  if (fuseMatMuls(graph) > 0) inferTypes(graph, opsets);
  if (options.channels_last && convertToChannelsLast(graph) > 0) inferTypes(graph, opsets);
  // Activations and residual Adds after a channels-last Conv become its
  // oneDNN post-ops.
  fuseConvPostOps(graph);
  // 3x3 convolutions move to oneDNN's blocked layout, where it has Winograd.
  if (options.channels_last) useBlockedConvs(graph);
  // What elementwise work is left, in connected groups, as single steps that
  // make one pass over memory each.
  if (fuseElementwise(graph) > 0) inferTypes(graph, opsets);
  removeDeadNodes(graph);
  verifyGraph(graph, /*require_types=*/true);

  CompileReport report;
  progress("planning memory", 0.1);
  const ExecutableSpec spec =
      Lowering(graph, options, default_opset == opsets.end() ? 1 : default_opset->second).lower(report);

  constexpr uint32_t kLoadProgram = 0;
  constexpr uint32_t kMainProgram = 1;
  Metadata metadata;
  metadata.executable = options.model_name;
  metadata.programs = {{kLoadProgram, "load"}, {kMainProgram, "main"}};
  metadata.program_flow = {.load = {kLoadProgram}, .main = {kMainProgram}, .save = {}};
  metadata.options = {{"memory.arena_bytes", std::to_string(report.arena_bytes)},
                      {"memory.lower_bound_bytes", std::to_string(report.lower_bound_bytes)},
                      {"memory.naive_bytes", std::to_string(report.naive_bytes)}};
  for (uint32_t value : spec.inputs) {
    metadata.anchors.push_back(anchorFor(spec.values[value], AnchorDirection::kInput, kMainProgram));
  }
  for (const ValueSpec& value : spec.values) {
    if (value.storage == ValueStorage::kConstant) {
      metadata.anchors.push_back(anchorFor(value, AnchorDirection::kInput, kLoadProgram));
    }
  }
  for (uint32_t value : spec.outputs) {
    Anchor anchor = anchorFor(spec.values[value], AnchorDirection::kOutput, kMainProgram);
    anchor.name = graph.value(graph.outputs()[spec.values[value].index]).name;
    anchor.handle = "d2h_" + anchor.name;
    metadata.anchors.push_back(anchor);
  }

  // Writing the weights is most of the work on large models: it reports
  // progress by bytes.
  progress("writing package", 0.2);
  PackageWriter writer(output);
  writer.writeExecutable(options.model_name, encodeExecutable(spec));
  writer.writeMetadata(options.model_name, metadata);
  uint64_t written = 0;
  for (const ValueSpec& value : spec.values) {
    if (value.storage != ValueStorage::kConstant) continue;
    const Value& source = graph.value(*graph.findValue(value.name));
    writer.writeTensorData(value.name, value.info, source.initializer->bytes);
    written += source.initializer->bytes.size();
    const double share = static_cast<double>(written) / static_cast<double>(std::max<uint64_t>(report.constant_bytes, 1));
    progress("writing package", std::min(1.0, 0.2 + 0.8 * share));
  }
  writer.close();
  progress("done", 1.0);
  return report;
}

}  // namespace kiln
