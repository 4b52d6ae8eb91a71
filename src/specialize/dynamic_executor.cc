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

namespace kiln {
namespace {

constexpr size_t kNotFrom = static_cast<size_t>(-1);

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
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

  auto rest = std::make_shared<Impl>();
  rest->source = source;
  rest->model_name = model_name + " (after its first stage)";
  rest->opsets = opsets;
  rest->options = options;
  rest->options.plan_cache_capacity = std::max<size_t>(options.plan_cache_capacity, 1);
  for (ValueId id : staged.rest.inputs()) {
    const std::string& name = staged.rest.value(id).name;
    const auto stage = std::find(stage_names.begin(), stage_names.end(), name);
    const auto model = std::find_if(inputs.begin(), inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
    if (stage != stage_names.end()) {
      const auto index = static_cast<size_t>(stage - stage_names.begin());
      plan.rest_from_stage.push_back(index);
      plan.rest_from_model.push_back(kNotFrom);
      rest->inputs.push_back({name, stage_slots[index].info});
    } else if (model != inputs.end()) {
      const auto index = static_cast<size_t>(model - inputs.begin());
      plan.rest_from_stage.push_back(kNotFrom);
      plan.rest_from_model.push_back(index);
      rest->inputs.push_back({name, infos[index]});
    } else {
      throw GraphError(fmt::format("staging lost value '{}'", name));  // a bug, not bad input
    }
    // The rest sees its inputs with the shapes they have now.
    staged.rest.value(id).type = ValueType::tensor(rest->inputs.back().info.dtype, rest->inputs.back().info.shape);
  }
  rest->outputs = outputs;
  rest->graph_bytes = encodeGraph(staged.rest, [](const Value&) { return false; });
  // Which of the rest's inputs its shapes read (the Loop's step count, say).
  Graph analyzed = decodeGraph(rest->graph_bytes, source, [](const std::string&) { return nullptr; });
  rest->shape_inputs = analyzeRuntimeShapes(analyzed, opsets, compile_options).shape_inputs;
  for (const std::string& name : rest->shape_inputs) {
    const auto it = std::find_if(rest->inputs.begin(), rest->inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
    rest->shape_input_indices.push_back(static_cast<size_t>(it - rest->inputs.begin()));
  }
  plan.rest_infos.resize(rest->inputs.size());
  plan.rest_data.resize(rest->inputs.size());
  plan.rest = std::move(rest);
}

void DynamicExecutor::Impl::runCall(std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
                                    const OutputAllocator& allocate, StepTrace* trace) {
  Plan& plan = planFor(infos, data);
  // A call is a hit when its plan was compiled before it (outputsFor() and
  // run() of one call look the plan up twice, but count once).
  if (plan.ran) ++hits;
  plan.ran = true;
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
