// DynamicExecutor's implementation, shared by dynamic_executor.cc (the
// public API, specialization, staged plans) and host_stages.cc (a Loop run
// on the host, a node evaluated on the host). Internal to src/specialize.
//
// A model (or a stage of one, or a Loop body) is an Impl: its graph, its
// declared inputs and outputs, the inputs whose values enter the signature,
// and a cache of Plans, one per signature. A Plan is a compiled executor;
// or an executor for the model's first stage and a `rest`; or a host stage
// (host_loop, eager_node) and a `rest`.
#pragma once

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
#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "runtime/device_internal.h"
#include "specialize/host_loop.h"

namespace kiln {
namespace specialize {

inline constexpr size_t kNotFrom = static_cast<size_t>(-1);

// One output of a stage, read in place.
struct StageOutput {
  const TensorInfo* info = nullptr;
  const std::byte* data = nullptr;
};

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

// A plan's memory on a device (a cuda graph package): its own constants
// (those of the package are shared by every plan: Impl::device_constants),
// the buffers its executor reads the call's inputs from and writes its
// outputs to, and room for the copy jobs that fill and empty them. Made
// when the plan is compiled: a call allocates nothing.
struct DevicePlan {
  std::vector<DeviceBuffer> constants;
  std::vector<DeviceBuffer> inputs, outputs;
  std::vector<const std::byte*> input_pointers;
  std::vector<std::byte*> output_pointers;
  std::vector<DeviceJob> jobs;
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
  std::unique_ptr<DevicePlan> on_device;    // null when the plan runs on the host

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

inline std::string signatureString(std::span<const TensorInfo> infos) {
  std::vector<std::string> parts;
  for (const TensorInfo& info : infos) parts.push_back(info.toString());
  return fmt::format("({})", fmt::join(parts, ", "));
}

}  // namespace specialize

using specialize::DevicePlan;
using specialize::EagerNodePlan;
using specialize::FreeDeleter;
using specialize::HostLoopPlan;
using specialize::kNotFrom;
using specialize::Plan;
using specialize::signatureString;
using specialize::Source;

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

  // Where the plans run: the host (null), or the GPU of a cuda package,
  // which then holds the constants, the arena and each call's tensors (the
  // call's own buffers stay host memory). Declared before everything that
  // holds its memory, which must go first.
  std::shared_ptr<Device> device;
  std::string target = "cpu";  // the package's: the compile target of every specialization
  bool tf32 = false, fp16 = false, bf16 = false;
  std::map<const Constant*, DeviceBuffer> device_constants;  // the package's constants, uploaded once
  DeviceBuffer device_arena;

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
        // A shape that no signature fixes (one computed from values that
        // change by design, as a Loop's step count, or the size of a
        // selection: NonZero, NonMaxSuppression) is found by evaluating its
        // node on the host; what follows is specialized on the shapes it
        // gave. Elsewhere the values are in the signature, and a shape still
        // unknown is an error of the model.
        std::optional<NodeStage> eager = splitAtUnknownNode(graph, /*selections_only=*/!anyVarying());
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
    compile_options.target = target;
    // cuDNN and the cuda kernels take the model's own NCHW layout.
    compile_options.channels_last = options.channels_last && target != "cuda";
    compile_options.tf32 = tf32;
    compile_options.fp16 = fp16;
    compile_options.bf16 = bf16;
    compile_options.has_kernel = [](const std::string& name) { return KernelRegistry::cpu().find(name) != nullptr; };
    compile_options.evaluate_kernel = &evaluateOnce;
    return compile_options;
  }

  // The plan's executor for `program` (its constants kept by the plan).
  void prepareExecutor(Plan& plan, CompiledProgram program) {
    if (device) return prepareDeviceExecutor(plan, std::move(program));
    ExecutorOptions executor_options{
        .threads = options.threads, .flush_denormals = options.flush_denormals, .external_arena = true};
    std::map<std::string, ConstantPtr> constants;
    for (size_t c = 0; c < program.spec.constants.size(); ++c) constants[program.spec.constants[c]] = program.constants[c];
    plan.constants = program.constants;
    plan.executor = std::make_unique<Executor>(
        std::move(program.spec),
        [&constants](const std::string& name) -> std::span<const std::byte> { return constants.at(name)->bytes; },
        executor_options);
  }

  // prepareExecutor on the device (device_plans.cc): the program's
  // constants uploaded, buffers for the call's tensors, a cuda executor.
  void prepareDeviceExecutor(Plan& plan, CompiledProgram program);

  // Runs the plan's executor on the call's host buffers: in place on the
  // host; on the device, its inputs copied in, the program run by a
  // compute job, its outputs copied back (device_plans.cc).
  void runExecutor(Plan& plan, std::span<const std::byte* const> data, std::span<std::byte* const> into,
                   StepTrace* trace);

  // After a device error that needs a reset: resets the device and forgets
  // what its memory held (every plan, the uploaded constants, the arena),
  // so that the next call compiles again. The error still reaches the
  // caller, whose call did not run.
  void recoverDevice();
  // Runs call(), recovering the device from an error that needs it
  // (dynamic_executor.cc).
  template <typename Call>
  decltype(auto) recoveringDevice(const Call& call);

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
    stage->device = device;
    stage->target = target;
    stage->tf32 = tf32;
    stage->fp16 = fp16;
    stage->bf16 = bf16;
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

  // Runs plan.rest on the model inputs it reads and on what the stage before
  // it gave: stage_output(k) is that stage's output k as a StageOutput (no
  // copy of its TensorInfo: a staged plan's steady state allocates nothing).
  template <typename StageOutputOf>
  void runRest(Plan& plan, std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
               const StageOutputOf& stage_output, const OutputAllocator& allocate, StepTrace* trace) {
    for (size_t i = 0; i < plan.rest_infos.size(); ++i) {
      if (plan.rest_from_model[i] != kNotFrom) {
        plan.rest_infos[i] = infos[plan.rest_from_model[i]];
        plan.rest_data[i] = data[plan.rest_from_model[i]];
      } else {
        const specialize::StageOutput output = stage_output(plan.rest_from_stage[i]);
        plan.rest_infos[i] = *output.info;
        plan.rest_data[i] = output.data;
      }
    }
    plan.rest->runCall(plan.rest_infos, plan.rest_data, allocate, trace);
  }

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
  // holds intermediates of one call). A size the machine cannot give (a
  // request's shapes asking for terabytes) is a UsageError, and the arena
  // stays as it was.
  void reserveArena(uint64_t needed) {
    if (needed <= arena_bytes && arenaData() != nullptr) return;
    const uint64_t size = std::max<uint64_t>(needed, 64);
    if (device) {
      device_arena = DeviceBuffer();  // the old one goes first: the device may not hold both
      device_arena = device->allocate(size);
    } else {
      arena.reset(device_internal::allocateArena(size, source + " (these input shapes)"));
    }
    arena_bytes = size;
    arena_size = size;
  }
  std::byte* arenaData() const { return device ? device_arena.data() : arena.get(); }
};

}  // namespace kiln
