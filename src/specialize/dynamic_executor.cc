#include "kiln/dynamic_executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <optional>

#include "compiler/compile_program.h"
#include "compiler/runtime_shapes.h"
#include "format/graph_package.h"
#include "ir/graph_codec.h"
#include "kernels/evaluate_once.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "specialize/host_loop.h"

namespace kiln {
namespace {

constexpr size_t kNotFrom = static_cast<size_t>(-1);

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// Where a host loop (host_loop.h) reads a value: an input of the model, or a
// constant of its graph.
struct Source {
  size_t input = kNotFrom;
  ConstantPtr constant;
};

// A Loop whose body changes shape per iteration, run on the host: the body
// is a model of its own, specialized per iteration's signature.
struct HostLoopPlan {
  HostLoopSpec spec;
  std::shared_ptr<DynamicExecutor::Impl> body;
  std::optional<Source> trip_count, condition;
  std::vector<Source> initial, captures;
  std::vector<TensorRef> initial_refs, capture_refs;  // per call
  std::vector<HostTensor> outputs;                    // the Loop's, per call
};

// A node evaluated on the host on the values it reads (runtime_shapes.h,
// NodeStage).
struct EagerNodePlan {
  std::string op_type, domain;
  Attributes attributes;
  size_t output_count = 0;
  std::vector<std::optional<Source>> inputs;  // nullopt: absent
  std::vector<ConstantPtr> values;            // per call: the inputs
  std::vector<ConstantPtr> outputs;           // per call
};

// One specialization: the signature it was compiled for, the graph it was
// compiled from (its initializers back the executable's constants) and the
// prepared executable. A staged plan's executable is the model's first stage:
// it writes what the rest reads into `stage_buffers`, and `rest` runs the
// rest of the model, specialized on those values.
struct Plan {
  std::vector<TensorInfo> input_infos;
  std::vector<std::vector<std::byte>> shape_values;  // per shape input, its bytes
  std::shared_ptr<Graph> graph;
  std::vector<ConstantPtr> constants;  // back the executor's constants
  std::unique_ptr<Executor> executor;
  std::vector<TensorSlot> outputs;
  std::byte* bound_arena = nullptr;  // the arena the executor's views point into
  bool ran = false;                  // a run() has used it: later runs count as cache hits
  std::vector<std::byte*> output_pointers;  // per call, from the allocator (sized once)

  std::shared_ptr<DynamicExecutor::Impl> rest;  // staged plans only: the model after the first stage
  std::vector<size_t> rest_from_model;      // per input of the rest: a model input index, or kNotFrom
  std::vector<size_t> rest_from_stage;      // per input of the rest: a stage buffer index, or kNotFrom
  std::vector<TensorInfo> rest_infos;       // per call
  std::vector<const std::byte*> rest_data;  // per call
  std::string staged_reason;        // what made it staged, for outputsFor's error
  std::vector<std::vector<std::byte>> stage_buffers;
  std::vector<std::byte*> stage_pointers;

  // Host-stage plans only (no executor): a Loop run on the host, or a node
  // evaluated on the host; `rest` is what follows, reading their outputs
  // where rest_from_stage says.
  std::unique_ptr<HostLoopPlan> host_loop;
  std::unique_ptr<EagerNodePlan> eager_node;
};

std::string signatureString(std::span<const TensorInfo> infos) {
  std::vector<std::string> parts;
  for (const TensorInfo& info : infos) parts.push_back(info.toString());
  return fmt::format("({})", fmt::join(parts, ", "));
}

}  // namespace

struct DynamicExecutor::Impl {
  std::unique_ptr<PackageReader> reader;  // null for a stage of a model (RestStage)
  std::string source;
  std::string model_name;
  std::vector<std::byte> graph_bytes;
  std::map<std::string, int64_t> opsets;
  std::map<std::string, ConstantPtr> external_constants;  // decoded once, shared by every plan
  std::vector<TensorSlot> inputs;
  std::vector<TensorSlot> outputs;
  std::vector<std::string> shape_inputs;
  std::vector<size_t> shape_input_indices;
  DynamicExecutorOptions options;

  std::list<Plan> plans;  // most recently used first
  std::unique_ptr<std::byte, FreeDeleter> arena;
  uint64_t arena_bytes = 0;
  std::atomic<uint64_t> hits{0}, misses{0}, evictions{0};
  std::atomic<size_t> cached{0};
  std::atomic<uint64_t> arena_size{0};

  bool matches(const Plan& plan, std::span<const TensorInfo> infos, std::span<const std::byte* const> data) const {
    for (size_t i = 0; i < infos.size(); ++i) {
      if (plan.input_infos[i].shape != infos[i].shape) return false;
    }
    for (size_t k = 0; k < shape_input_indices.size(); ++k) {
      const auto& stored = plan.shape_values[k];
      if (std::memcmp(stored.data(), data[shape_input_indices[k]], stored.size()) != 0) return false;
    }
    return true;
  }

  void checkCall(std::span<const TensorInfo> infos, std::span<const std::byte* const> data) const {
    if (infos.size() != inputs.size() || data.size() != inputs.size()) {
      throw UsageError(fmt::format("the model takes {} inputs, got {} shapes and {} buffers", inputs.size(),
                                   infos.size(), data.size()));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      const TensorInfo& declared = inputs[i].info;
      if (infos[i].dtype != declared.dtype) {
        throw UsageError(fmt::format("input '{}' must be {}, got {}", inputs[i].name, dtypeName(declared.dtype),
                                     dtypeName(infos[i].dtype)));
      }
      bool fits = infos[i].isStatic() && (declared.shape.empty() || infos[i].shape.size() == declared.shape.size());
      for (size_t d = 0; fits && d < declared.shape.size(); ++d) {
        fits = declared.shape[d] == kDynamicDim || declared.shape[d] == infos[i].shape[d];
      }
      if (!fits) {
        throw UsageError(fmt::format("input '{}' has shape {}, which does not fit the model's {}", inputs[i].name,
                                     infos[i].toString(), declared.toString()));
      }
      if (data[i] == nullptr && infos[i].numElements() > 0) {
        throw UsageError(fmt::format("input '{}' has no data", inputs[i].name));
      }
    }
  }

  // Compiles the graph for this signature: concrete input shapes, and the
  // shape inputs' values as constants.
  Plan compile(std::span<const TensorInfo> infos, std::span<const std::byte* const> data) {
    Plan plan;
    plan.input_infos.assign(infos.begin(), infos.end());
    plan.graph = std::make_shared<Graph>(decodeGraph(graph_bytes, source, [&](const std::string& name) {
      const auto it = external_constants.find(name);
      return it == external_constants.end() ? nullptr : it->second;
    }));
    Graph& graph = *plan.graph;
    for (size_t i = 0; i < infos.size(); ++i) {
      graph.value(graph.inputs()[i]).type = ValueType::tensor(infos[i].dtype, infos[i].shape);
    }
    for (size_t index : shape_input_indices) {
      const TensorInfo& info = infos[index];
      const auto* bytes = data[index];
      std::vector<std::byte> copy(bytes, bytes + info.sizeInBytes());
      plan.shape_values.push_back(copy);
      const ValueId input = graph.inputs()[index];
      std::string name = graph.value(input).name + ":value";
      while (graph.findValue(name)) name += "'";
      const ValueId constant = graph.addInitializer(name, makeConstant(info, std::move(copy)));
      // The input stays an input of the executable (the caller still passes
      // it); every reader now sees its value as a constant.
      graph.replaceAllUses(input, constant);
    }
    const CompileOptions compile_options = compileOptions();
    CompiledProgram program;
    try {
      // Shapes that depend on values the model computes: the model runs in
      // stages (runtime_shapes.h).
      const RuntimeShapes shapes = analyzeRuntimeShapes(graph, opsets, compile_options);
      if (shapes.dynamic) {
        if (std::optional<StagedGraph> staged = splitAtUnknownShapes(graph)) {
          compileStaged(plan, *staged, infos, compile_options, shapes.reason);
          return plan;
        }
        if (std::optional<LoopStage> looped = splitAtDynamicLoop(graph)) {
          compileHostLoop(plan, *looped, compile_options, shapes.reason);
          return plan;
        }
        // Where values change by design (a Loop body), a shape computed from
        // them is found by evaluating its node; elsewhere the values are in
        // the signature, and a shape still unknown is an error of the model.
        std::optional<NodeStage> eager = anyVarying() ? splitAtUnknownNode(graph) : std::nullopt;
        if (eager) {
          compileEagerNode(plan, *eager, compile_options, shapes.reason);
          return plan;
        }
      }
      program = compileProgram(graph, opsets, compile_options);
    } catch (const Error& e) {
      throw UsageError(fmt::format("cannot run model '{}' with inputs {}: {}", model_name, signatureString(infos),
                                   e.what()));
    }
    prepareExecutor(plan, std::move(program));
    for (size_t i = 0; i < outputs.size(); ++i) {
      plan.outputs.push_back({outputs[i].name, plan.executor->outputs().at(i).info});
    }
    plan.output_pointers.resize(outputs.size());
    return plan;
  }

  CompileOptions compileOptions() const {
    CompileOptions compile_options;
    compile_options.model_name = model_name;
    compile_options.channels_last = options.channels_last;
    compile_options.has_kernel = [](const std::string& name) { return KernelRegistry::cpu().find(name) != nullptr; };
    compile_options.evaluate_kernel = &evaluateOnce;
    return compile_options;
  }

  // The plan's executor for `program` (its constants kept by the plan).
  void prepareExecutor(Plan& plan, CompiledProgram program) {
    ExecutorOptions executor_options{.threads = options.threads, .external_arena = true};
    std::map<std::string, ConstantPtr> constants;
    for (size_t c = 0; c < program.spec.constants.size(); ++c) constants[program.spec.constants[c]] = program.constants[c];
    plan.constants = program.constants;
    plan.executor = std::make_unique<Executor>(
        std::move(program.spec),
        [&constants](const std::string& name) -> std::span<const std::byte> { return constants.at(name)->bytes; },
        executor_options);
  }

  // A staged plan: the prefix compiled now, into buffers of its own; the
  // rest as a model of its own, whose inputs are those buffers and the
  // model inputs it reads, specialized per call on what the prefix gave.
  void compileStaged(Plan& plan, StagedGraph& staged, std::span<const TensorInfo> infos,
                     const CompileOptions& compile_options, const std::string& reason);

  // A host-loop plan: the Loop's body and what follows the Loop, each a
  // model of its own.
  void compileHostLoop(Plan& plan, LoopStage& stage, const CompileOptions& compile_options,
                       const std::string& reason);
  // A node evaluated on the host, then what follows it.
  void compileEagerNode(Plan& plan, NodeStage& stage, const CompileOptions& compile_options,
                        const std::string& reason);
  // Where a host stage reads a value of the model's graph.
  Source sourceOf(const Graph& graph, const std::string& name) const;
  // plan.rest over what follows a host stage: inputs named `stage_outputs`
  // come from the stage (rest_from_stage), the others from the model.
  void compileRestAfter(Plan& plan, const Graph& after, const std::vector<std::string>& stage_outputs,
                        const std::string& what, const CompileOptions& compile_options);
  void runHostStagePlan(Plan& plan, std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
                        const OutputAllocator& allocate, StepTrace* trace);

  // Per input: whether its value changes by design from one call to the
  // next (a Loop's iteration number and carried values, and what a stage
  // computes from them). Such values never enter the signature: a shape
  // that depends on them is found by evaluating its node on the host.
  std::vector<bool> varying;
  bool anyVarying() const { return std::find(varying.begin(), varying.end(), true) != varying.end(); }
  bool isVarying(size_t input) const { return input < varying.size() && varying[input]; }

  // A stage of this model (a part after a cut, a Loop body) as a model of
  // its own: `graph` with these declared inputs and outputs.
  std::shared_ptr<Impl> stageModel(const std::string& what, const Graph& graph, std::vector<TensorSlot> stage_inputs,
                                   std::vector<TensorSlot> stage_outputs, std::vector<bool> stage_varying,
                                   const CompileOptions& compile_options) const {
    auto stage = std::make_shared<Impl>();
    stage->source = source;
    stage->model_name = model_name + " (" + what + ")";
    stage->opsets = opsets;
    stage->options = options;
    stage->options.plan_cache_capacity = std::max<size_t>(options.plan_cache_capacity, 1);
    stage->inputs = std::move(stage_inputs);
    stage->outputs = std::move(stage_outputs);
    stage->varying = std::move(stage_varying);
    stage->graph_bytes = encodeGraph(graph, [](const Value&) { return false; });
    // Which of its inputs its shapes read (the Loop's step count, say).
    Graph analyzed = decodeGraph(stage->graph_bytes, source, [](const std::string&) { return nullptr; });
    for (const std::string& name : analyzeRuntimeShapes(analyzed, opsets, compile_options).shape_inputs) {
      const auto it = std::find_if(stage->inputs.begin(), stage->inputs.end(),
                                   [&](const TensorSlot& s) { return s.name == name; });
      const auto index = static_cast<size_t>(it - stage->inputs.begin());
      if (stage->isVarying(index)) continue;
      stage->shape_inputs.push_back(name);
      stage->shape_input_indices.push_back(index);
    }
    return stage;
  }

  // Runs one call (see DynamicExecutor::run with an allocator).
  void runCall(std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
               const OutputAllocator& allocate, StepTrace* trace);

  Plan& planFor(std::span<const TensorInfo> infos, std::span<const std::byte* const> data) {
    checkCall(infos, data);
    for (auto it = plans.begin(); it != plans.end(); ++it) {
      if (!matches(*it, infos, data)) continue;
      plans.splice(plans.begin(), plans, it);  // no allocation
      return plans.front();
    }
    ++misses;
    plans.push_front(compile(infos, data));
    while (plans.size() > options.plan_cache_capacity) {
      plans.pop_back();
      ++evictions;
    }
    cached = plans.size();
    return plans.front();
  }

  // Grows the shared arena to `needed` bytes (contents are not kept: it only
  // holds intermediates of one call).
  void reserveArena(uint64_t needed) {
    if (needed <= arena_bytes && arena) return;
    const uint64_t size = (std::max<uint64_t>(needed, 64) + 63) / 64 * 64;
    arena.reset(static_cast<std::byte*>(std::aligned_alloc(64, size)));
    if (!arena) throw std::bad_alloc();
    arena_bytes = size;
    arena_size = size;
  }
};

void DynamicExecutor::Impl::compileStaged(Plan& plan, StagedGraph& staged, std::span<const TensorInfo> infos,
                                          const CompileOptions& compile_options, const std::string& reason) {
  plan.staged_reason = reason;
  std::vector<std::string> stage_names;  // the prefix's outputs (passes may replace their values)
  for (ValueId id : staged.prefix.outputs()) stage_names.push_back(staged.prefix.value(id).name);
  plan.graph = std::make_shared<Graph>(std::move(staged.prefix));
  prepareExecutor(plan, compileProgram(*plan.graph, opsets, compile_options));
  const std::vector<TensorSlot>& stage_slots = plan.executor->outputs();
  for (const TensorSlot& slot : stage_slots) {
    plan.stage_buffers.emplace_back(std::max<uint64_t>(slot.info.sizeInBytes(), 1));
    plan.stage_pointers.push_back(plan.stage_buffers.back().data());
  }

  std::vector<TensorSlot> rest_inputs;
  std::vector<bool> rest_varying;
  for (ValueId id : staged.rest.inputs()) {
    const std::string& name = staged.rest.value(id).name;
    const auto stage = std::find(stage_names.begin(), stage_names.end(), name);
    const auto model = std::find_if(inputs.begin(), inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
    if (stage != stage_names.end()) {
      const auto index = static_cast<size_t>(stage - stage_names.begin());
      plan.rest_from_stage.push_back(index);
      plan.rest_from_model.push_back(kNotFrom);
      rest_inputs.push_back({name, stage_slots[index].info});
      rest_varying.push_back(anyVarying());
    } else if (model != inputs.end()) {
      const auto index = static_cast<size_t>(model - inputs.begin());
      plan.rest_from_stage.push_back(kNotFrom);
      plan.rest_from_model.push_back(index);
      rest_inputs.push_back({name, infos[index]});
      rest_varying.push_back(isVarying(index));
    } else {
      throw GraphError(fmt::format("staging lost value '{}'", name));  // a bug, not bad input
    }
    // The rest sees its inputs with the shapes they have now.
    staged.rest.value(id).type = ValueType::tensor(rest_inputs.back().info.dtype, rest_inputs.back().info.shape);
  }
  plan.rest_infos.resize(rest_inputs.size());
  plan.rest_data.resize(rest_inputs.size());
  plan.rest = stageModel("after its first stage", staged.rest, std::move(rest_inputs), outputs,
                         std::move(rest_varying), compile_options);
}

Source DynamicExecutor::Impl::sourceOf(const Graph& graph, const std::string& name) const {
  const auto model = std::find_if(inputs.begin(), inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
  if (model != inputs.end()) return Source{static_cast<size_t>(model - inputs.begin()), nullptr};
  const auto value = graph.findValue(name);
  if (!value || !graph.value(*value).initializer) {
    throw GraphError(fmt::format("staging lost value '{}'", name));  // a bug, not bad input
  }
  return Source{kNotFrom, graph.value(*value).initializer};
}

void DynamicExecutor::Impl::compileRestAfter(Plan& plan, const Graph& after,
                                             const std::vector<std::string>& stage_outputs, const std::string& what,
                                             const CompileOptions& compile_options) {
  std::vector<TensorSlot> rest_inputs;
  std::vector<bool> rest_varying;
  for (ValueId id : after.inputs()) {
    const std::string& name = after.value(id).name;
    const auto output = std::find(stage_outputs.begin(), stage_outputs.end(), name);
    if (output != stage_outputs.end()) {
      plan.rest_from_stage.push_back(static_cast<size_t>(output - stage_outputs.begin()));
      plan.rest_from_model.push_back(kNotFrom);
      rest_varying.push_back(anyVarying());
    } else {
      const Source from = sourceOf(*plan.graph, name);
      if (from.input == kNotFrom) throw GraphError(fmt::format("staging lost value '{}'", name));
      plan.rest_from_stage.push_back(kNotFrom);
      plan.rest_from_model.push_back(from.input);
      rest_varying.push_back(isVarying(from.input));
    }
    rest_inputs.push_back({name, anchorInfo(after.value(id).type)});
  }
  plan.rest_infos.resize(rest_inputs.size());
  plan.rest_data.resize(rest_inputs.size());
  plan.rest = stageModel(what, after, std::move(rest_inputs), outputs, std::move(rest_varying), compile_options);
}

void DynamicExecutor::Impl::compileHostLoop(Plan& plan, LoopStage& stage, const CompileOptions& compile_options,
                                            const std::string& reason) {
  plan.staged_reason = reason;
  const Graph& graph = *plan.graph;
  auto loop = std::make_unique<HostLoopPlan>();
  const std::vector<std::string>& loop_inputs = stage.loop_inputs;
  if (!loop_inputs.empty() && !loop_inputs[0].empty()) loop->trip_count = sourceOf(graph, loop_inputs[0]);
  if (loop_inputs.size() > 1 && !loop_inputs[1].empty()) loop->condition = sourceOf(graph, loop_inputs[1]);
  for (size_t i = 2; i < loop_inputs.size(); ++i) loop->initial.push_back(sourceOf(graph, loop_inputs[i]));
  for (const std::string& name : stage.captures) loop->captures.push_back(sourceOf(graph, name));
  loop->initial_refs.resize(loop->initial.size());
  loop->capture_refs.resize(loop->captures.size());

  const Graph& body = stage.body;
  loop->spec.iteration_info = anchorInfo(body.value(body.inputs().at(0)).type);
  loop->spec.condition_info = anchorInfo(body.value(body.inputs().at(1)).type);
  loop->spec.unchanged = stage.unchanged;
  loop->spec.body_outputs = stage.body_outputs;
  const size_t scans = stage.loop_outputs.size() - stage.unchanged.size();
  for (size_t j = body.outputs().size() - scans; j < body.outputs().size(); ++j) {
    loop->spec.scans.push_back(anchorInfo(body.value(body.outputs()[j]).type));
  }
  // The iteration number, the condition and the carried values change at
  // every iteration; the values read from outside do not.
  std::vector<TensorSlot> body_inputs, body_outputs;
  std::vector<bool> body_varying;
  for (ValueId id : body.inputs()) {
    body_inputs.push_back({body.value(id).name, anchorInfo(body.value(id).type)});
    body_varying.push_back(body_varying.size() < 2 + stage.unchanged.size());
    // Carried values may change shape (inference saw the first iteration).
    if (body_varying.back() && body_varying.size() > 2) body_inputs.back().info.shape.clear();
  }
  for (size_t i = 0; i < loop->captures.size(); ++i) {
    body_varying[2 + stage.unchanged.size() + i] = isVarying(loop->captures[i].input);
  }
  for (ValueId id : body.outputs()) body_outputs.push_back({body.value(id).name, anchorInfo(body.value(id).type)});
  loop->body = stageModel("Loop body", body, std::move(body_inputs), std::move(body_outputs), std::move(body_varying),
                          compile_options);
  compileRestAfter(plan, stage.after, stage.loop_outputs, "after its Loop", compile_options);
  plan.host_loop = std::move(loop);
}

void DynamicExecutor::Impl::compileEagerNode(Plan& plan, NodeStage& stage, const CompileOptions& compile_options,
                                             const std::string& reason) {
  plan.staged_reason = reason;
  auto node = std::make_unique<EagerNodePlan>();
  node->op_type = stage.op_type;
  node->domain = stage.domain;
  node->attributes = stage.attributes;
  node->output_count = stage.outputs.size();
  for (const std::string& name : stage.inputs) {
    node->inputs.push_back(name.empty() ? std::nullopt : std::optional(sourceOf(*plan.graph, name)));
  }
  node->values.resize(node->inputs.size());
  compileRestAfter(plan, stage.after, stage.outputs, "after its " + stage.op_type, compile_options);
  plan.eager_node = std::move(node);
}

void DynamicExecutor::Impl::runHostStagePlan(Plan& plan, std::span<const TensorInfo> infos,
                                             std::span<const std::byte* const> data, const OutputAllocator& allocate,
                                             StepTrace* trace) {
  const auto ref = [&](const Source& from) {
    return from.input != kNotFrom ? TensorRef{infos[from.input], data[from.input]}
                                  : TensorRef{from.constant->info, from.constant->bytes.data()};
  };
  std::function<TensorRef(size_t)> stage_output;
  if (plan.host_loop) {
    HostLoopPlan& loop = *plan.host_loop;
    for (size_t i = 0; i < loop.initial.size(); ++i) loop.initial_refs[i] = ref(loop.initial[i]);
    for (size_t i = 0; i < loop.captures.size(); ++i) loop.capture_refs[i] = ref(loop.captures[i]);
    const std::optional<TensorRef> trip_count = loop.trip_count ? std::optional(ref(*loop.trip_count)) : std::nullopt;
    const std::optional<TensorRef> condition = loop.condition ? std::optional(ref(*loop.condition)) : std::nullopt;
    runHostLoop(
        loop.spec, trip_count ? &*trip_count : nullptr, condition ? &*condition : nullptr, loop.initial_refs,
        loop.capture_refs,
        [&](std::span<const TensorInfo> body_infos, std::span<const std::byte* const> body_data,
            const OutputAllocator& body_allocate) { loop.body->runCall(body_infos, body_data, body_allocate, trace); },
        loop.outputs);
    stage_output = [&](size_t k) { return TensorRef{loop.outputs.at(k).info, loop.outputs.at(k).bytes.data()}; };
  } else {
    EagerNodePlan& node = *plan.eager_node;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!node.inputs[i]) continue;
      const TensorRef value = ref(*node.inputs[i]);
      node.values[i] = node.inputs[i]->constant
                           ? node.inputs[i]->constant
                           : makeConstant(value.info, std::vector<std::byte>(value.data, value.data + value.info.sizeInBytes()));
    }
    try {
      node.outputs = evaluateNode(node.op_type, node.domain, node.attributes, node.output_count, node.values, opsets,
                                  compileOptions());
    } catch (const Error& e) {
      throw UsageError(fmt::format("cannot run model '{}' with inputs {}: {}", model_name, signatureString(infos),
                                   e.what()));
    }
    stage_output = [&](size_t k) { return TensorRef{node.outputs.at(k)->info, node.outputs.at(k)->bytes.data()}; };
  }
  for (size_t i = 0; i < plan.rest_infos.size(); ++i) {
    if (plan.rest_from_model[i] != kNotFrom) {
      plan.rest_infos[i] = infos[plan.rest_from_model[i]];
      plan.rest_data[i] = data[plan.rest_from_model[i]];
    } else {
      const TensorRef output = stage_output(plan.rest_from_stage[i]);
      plan.rest_infos[i] = output.info;
      plan.rest_data[i] = output.data;
    }
  }
  plan.rest->runCall(plan.rest_infos, plan.rest_data, allocate, trace);
}

void DynamicExecutor::Impl::runCall(std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
                                    const OutputAllocator& allocate, StepTrace* trace) {
  Plan& plan = planFor(infos, data);
  // A call is a hit when its plan was compiled before it (outputsFor() and
  // run() of one call look the plan up twice, but count once).
  if (plan.ran) ++hits;
  plan.ran = true;
  if (plan.host_loop || plan.eager_node) return runHostStagePlan(plan, infos, data, allocate, trace);
  reserveArena(plan.executor->arenaBytes());
  if (plan.bound_arena != arena.get()) {
    plan.executor->setArena(arena.get());
    plan.bound_arena = arena.get();
  }
  const auto execute = [&](std::span<std::byte* const> into) {
    if (trace != nullptr) {
      plan.executor->runTraced(data, into, *trace);
    } else {
      plan.executor->run(data, into);
    }
  };
  if (!plan.rest) {
    for (size_t i = 0; i < plan.outputs.size(); ++i) plan.output_pointers[i] = allocate(i, plan.outputs[i].info);
    execute(plan.output_pointers);
    return;
  }
  execute(plan.stage_pointers);
  for (size_t i = 0; i < plan.rest_infos.size(); ++i) {
    if (plan.rest_from_model[i] != kNotFrom) {
      plan.rest_infos[i] = infos[plan.rest_from_model[i]];
      plan.rest_data[i] = data[plan.rest_from_model[i]];
    } else {
      plan.rest_infos[i] = plan.rest->inputs[i].info;
      plan.rest_data[i] = plan.stage_pointers[plan.rest_from_stage[i]];
    }
  }
  plan.rest->runCall(plan.rest_infos, plan.rest_data, allocate, trace);
}

DynamicExecutor::DynamicExecutor(const std::filesystem::path& package, const std::string& model,
                                 const DynamicExecutorOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (options.threads < 0) throw UsageError(fmt::format("threads must be 0 or more, got {}", options.threads));
  if (options.plan_cache_capacity == 0) throw UsageError("plan_cache_capacity must be at least 1");
  m.options = options;
  m.source = package.string();
  m.reader = std::make_unique<PackageReader>(package);
  const auto metadata = m.reader->metadata();
  if (metadata.empty()) throw UsageError(m.source + " holds no model");
  const MetadataBlob* chosen = model.empty() ? metadata.front() : m.reader->findMetadata(model);
  if (chosen == nullptr) throw UsageError(fmt::format("{} holds no model named '{}'", m.source, model));
  if (model.empty() && metadata.size() > 1) {
    throw UsageError(fmt::format("{} holds {} models: name one", m.source, metadata.size()));
  }
  const Metadata& meta = chosen->metadata();
  if (!isGraphPackage(meta)) {
    throw UsageError(fmt::format("model '{}' in {} has static shapes: run it with kiln::Executor", chosen->name(),
                                 m.source));
  }
  m.model_name = chosen->name();
  for (const auto& [key, value] : meta.options) {
    if (!key.starts_with("opset:")) continue;
    const std::string domain = key.substr(6) == "ai.onnx" ? "" : key.substr(6);
    try {
      m.opsets[domain] = std::stoll(value);
    } catch (const std::exception&) {
      throw FormatError(m.source, chosen->info().offset, fmt::format("option {} is not a number: '{}'", key, value));
    }
  }
  const ExecutableBlob* executable = m.reader->findExecutable(meta.executable);
  const auto bytes = executable->read();
  m.graph_bytes.assign(bytes.begin(), bytes.end());
  for (const TensorDataBlob* blob : m.reader->tensorData()) {
    const auto data = blob->data();
    m.external_constants[blob->name()] = makeConstant(blob->tensorInfo(), std::vector<std::byte>(data.begin(), data.end()));
  }
  // Decoding once here checks the graph, so that a corrupt package fails at load.
  const Graph graph = decodeGraph(m.graph_bytes, m.source, [&](const std::string& name) {
    const auto it = m.external_constants.find(name);
    return it == m.external_constants.end() ? nullptr : it->second;
  });
  for (const Anchor* anchor : meta.inputs()) m.inputs.push_back({anchor->name, anchor->info});
  for (const Anchor* anchor : meta.outputs()) m.outputs.push_back({anchor->name, anchor->info});
  if (m.inputs.size() != graph.inputs().size() || m.outputs.size() != graph.outputs().size()) {
    throw FormatError(m.source, chosen->info().offset, "metadata and graph disagree on the inputs or outputs");
  }
  m.shape_inputs = shapeInputsOf(meta);
  for (const std::string& name : m.shape_inputs) {
    const auto it = std::find_if(m.inputs.begin(), m.inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
    if (it == m.inputs.end()) {
      throw FormatError(m.source, chosen->info().offset, fmt::format("shape input '{}' is not an input", name));
    }
    m.shape_input_indices.push_back(static_cast<size_t>(it - m.inputs.begin()));
  }
}

DynamicExecutor::~DynamicExecutor() = default;

bool hasRuntimeShapes(const std::filesystem::path& package, const std::string& model) {
  const PackageReader reader(package);
  const auto metadata = reader.metadata();
  const MetadataBlob* chosen =
      model.empty() ? (metadata.empty() ? nullptr : metadata.front()) : reader.findMetadata(model);
  return chosen != nullptr && isGraphPackage(chosen->metadata());
}

const std::vector<TensorSlot>& DynamicExecutor::inputs() const { return impl_->inputs; }
const std::vector<TensorSlot>& DynamicExecutor::outputs() const { return impl_->outputs; }
const std::vector<std::string>& DynamicExecutor::shapeInputs() const { return impl_->shape_inputs; }

const std::vector<TensorSlot>& DynamicExecutor::outputsFor(std::span<const TensorInfo> input_infos,
                                                           std::span<const std::byte* const> inputs) {
  const Plan& plan = impl_->planFor(input_infos, inputs);
  if (plan.rest) {
    throw UsageError(fmt::format("the output shapes of model '{}' depend on values it computes ({}): run it with an "
                                 "OutputAllocator (kiln.Runner does)",
                                 impl_->model_name, plan.staged_reason));
  }
  return plan.outputs;
}

void DynamicExecutor::run(std::span<const TensorInfo> input_infos, std::span<const std::byte* const> inputs,
                          std::span<std::byte* const> outputs, StepTrace* trace) {
  const std::vector<TensorSlot>& expected = outputsFor(input_infos, inputs);
  if (outputs.size() != expected.size()) {
    throw UsageError(fmt::format("run() needs {} outputs, got {}", expected.size(), outputs.size()));
  }
  impl_->runCall(input_infos, inputs, [&](size_t index, const TensorInfo&) { return outputs[index]; }, trace);
}

void DynamicExecutor::run(std::span<const TensorInfo> input_infos, std::span<const std::byte* const> inputs,
                          const OutputAllocator& allocate, StepTrace* trace) {
  impl_->runCall(input_infos, inputs, allocate, trace);
}

DynamicMemoryStats DynamicExecutor::memoryStats() const {
  const Impl& m = *impl_;
  return {m.arena_size.load(), m.hits.load(), m.misses.load(), m.evictions.load(), m.cached.load()};
}

void DynamicExecutor::shrink() {
  Impl& m = *impl_;
  m.plans.clear();
  m.cached = 0;
  m.arena.reset();
  m.arena_bytes = 0;
  m.arena_size = 0;
}

}  // namespace kiln
