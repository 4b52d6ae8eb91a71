#include "kiln/dynamic_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "compiler/runtime_shapes.h"
#include "core/log.h"
#include "format/graph_package.h"
#include "ir/graph_codec.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "plugins/package_plugins.h"
#include "specialize/executor_impl.h"

namespace kiln {

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

void DynamicExecutor::Impl::runCall(std::span<const TensorInfo> infos, std::span<const std::byte* const> data,
                                    const OutputAllocator& allocate, StepTrace* trace) {
  Plan& plan = planFor(infos, data);
  // A call is a hit when its plan was compiled before it (outputsFor() and
  // run() of one call look the plan up twice, but count once).
  if (plan.ran) ++hits;
  plan.ran = true;
  if (plan.host_loop || plan.eager_node) return runHostStagePlan(plan, infos, data, allocate, trace);
  reserveArena(plan.executor->arenaBytes());
  if (plan.bound_arena != arenaData()) {
    plan.executor->setArena(arenaData());
    plan.bound_arena = arenaData();
  }
  if (!plan.rest) {
    for (size_t i = 0; i < plan.outputs.size(); ++i) plan.output_pointers[i] = allocate(i, plan.outputs[i].info);
    runExecutor(plan, data, plan.output_pointers, trace);
    return;
  }
  runExecutor(plan, data, plan.stage_pointers, trace);
  // The stage buffers hold the prefix's outputs with the shapes the rest
  // declares for them.
  const auto stage_output = [&](size_t k) {
    return specialize::StageOutput{&plan.executor->outputs()[k].info, plan.stage_pointers[k]};
  };
  runRest(plan, infos, data, stage_output, allocate, trace);
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
  loadPackagePlugins(meta.options, package, options.check_plugin_hash);
  m.model_name = chosen->name();
  m.target = meta.target.device_kind;
  if (m.target != "cpu" && m.target != "cuda") {
    throw UsageError(fmt::format("model '{}' targets device kind '{}', which this runtime cannot run", m.model_name,
                                 m.target));
  }
  m.tf32 = meta.options.contains(std::string(kCudaTf32Option));
  m.fp16 = meta.options.contains(std::string(kCudaFp16Option));
  m.bf16 = meta.options.contains(std::string(kCudaBf16Option));
  if (m.target == "cuda") {
    if (options.device) {
      if (options.device->info().kind != DeviceKind::kCuda) {
        throw UsageError(fmt::format("model '{}' was compiled for cuda devices and cannot run on {}", m.model_name,
                                     options.device->id()));
      }
      m.device = options.device;
    } else {
      DeviceManager manager;
      m.device = manager.getDevice(meta.target, DeviceConstraints{.kind = DeviceKind::kCuda});
    }
  } else if (options.device) {
    throw UsageError(fmt::format("model '{}' was compiled for cpu; a device is for cuda packages (compile it with "
                                 "--target cuda)",
                                 m.model_name));
  }
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

// Device errors: after one that leaves the device failed, the device is
// reset and the plans forgotten (recoverDevice) before the error goes on.
template <typename Call>
decltype(auto) DynamicExecutor::Impl::recoveringDevice(const Call& call) {
  try {
    return call();
  } catch (const DeviceError& error) {
    const auto* recoverable = dynamic_cast<const RecoverableDeviceError*>(&error);
    if (device && (recoverable == nullptr || recoverable->recoveryAction() != RecoveryAction::kRerun)) {
      try {
        recoverDevice();
      } catch (const Error& reset_error) {
        log::warning("{}: resetting {} after a device error failed: {}", source, device->id(), reset_error.what());
      }
    }
    throw;
  }
}

const std::vector<TensorSlot>& DynamicExecutor::outputsFor(std::span<const TensorInfo> input_infos,
                                                           std::span<const std::byte* const> inputs) {
  const Plan& plan = impl_->recoveringDevice([&]() -> const Plan& { return impl_->planFor(input_infos, inputs); });
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
  impl_->recoveringDevice([&] {
    impl_->runCall(input_infos, inputs, [&](size_t index, const TensorInfo&) { return outputs[index]; }, trace);
  });
}

void DynamicExecutor::run(std::span<const TensorInfo> input_infos, std::span<const std::byte* const> inputs,
                          const OutputAllocator& allocate, StepTrace* trace) {
  impl_->recoveringDevice([&] { impl_->runCall(input_infos, inputs, allocate, trace); });
}

DynamicMemoryStats DynamicExecutor::memoryStats() const {
  const Impl& m = *impl_;
  return {m.arena_size.load(), m.hits.load(), m.misses.load(), m.evictions.load(), m.cached.load()};
}

void DynamicExecutor::shrink() {
  Impl& m = *impl_;
  m.plans.clear();
  m.cached = 0;
  m.device_constants.clear();
  m.device_arena = DeviceBuffer();
  m.arena.reset();
  m.arena_bytes = 0;
  m.arena_size = 0;
}

}  // namespace kiln
