#include "kiln/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/log.h"
#include "format/executable_spec.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "kiln/step_trace.h"
#include "format/graph_package.h"
#include "kernels/cpu/denormals.h"
#include "runtime/device_internal.h"
#include "plugins/package_plugins.h"
#include "runtime/program.h"
#if KILN_HAVE_CUDA
#include "kernels/cuda/cuda_steps.h"
#endif

namespace kiln {
namespace {

// A step's trace event arguments: its output value and the type of each of
// its inputs and outputs ("f32[1,64,56,56]").
std::string traceArgs(const ExecutableSpec& spec, const StepSpec& step) {
  auto types = [&](const std::vector<uint32_t>& values) {
    std::vector<std::string> list;
    for (uint32_t v : values) {
      if (v == kNoValueIndex) {
        list.push_back("\"none\"");
      } else {
        const TensorInfo& info = spec.values[v].info;
        list.push_back(fmt::format("\"{}[{}]\"", dtypeName(info.dtype), fmt::join(info.shape, ",")));
      }
    }
    return fmt::format("[{}]", fmt::join(list, ", "));
  };
  const std::string output = step.outputs.empty() ? "" : spec.values[step.outputs.front()].name;
  return fmt::format("\"op\": \"{}\", \"output\": \"{}\", \"inputs\": {}, \"outputs\": {}", jsonEscape(step.kernel),
                     jsonEscape(output), types(step.inputs), types(step.outputs));
}

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// A view whose data pointer depends on the call: it points into input or
// output buffer `buffer` at `offset`.
struct CallBinding {
  uint32_t view;
  bool is_output;
  uint32_t buffer;
  uint64_t offset;
};

}  // namespace

struct Executor::Impl {
  std::unique_ptr<PackageReader> reader;  // null for an in-memory executable
  std::string source;                     // the package path, for messages
  std::map<std::string, std::span<const std::byte>> constant_bytes;
  // The constants the program writes (kiln.Assign: a training package's
  // variables): from a package file, copies of their own (the file is
  // mapped read-only); never handed to kernels as constants.
  std::set<std::string> written;
  std::vector<std::unique_ptr<std::byte, FreeDeleter>> written_copies;
  ExecutableSpec spec;
  std::vector<TensorSlot> inputs;
  std::vector<TensorSlot> outputs;
  std::unique_ptr<std::byte, FreeDeleter> own_arena;
  std::byte* arena = nullptr;
  std::vector<TensorView> views;  // the steps' inputs and outputs, step by step
  std::vector<Program> programs;  // the sub-programs of control flow, as in spec.subprograms
  std::vector<Step> steps;
  uint64_t steps_run = 0;
  std::vector<std::string> step_trace_args;  // per step, made on the first traced run
  std::vector<CallBinding> bindings;
  std::vector<std::pair<uint32_t, uint64_t>> arena_views;  // (view, offset in the arena)

  int threads = 0;
  bool flush_denormals = true;
  // cuda: where steps launch, the host bytes of constants for prepare, and
  // the captured graphs of the main program with the current call's key.
  bool cuda = false;
  void* queue = nullptr;
  ConstantBytes host_constants;
#if KILN_HAVE_CUDA
  std::unique_ptr<cuda::ProgramGraphs> graphs;
#endif
  // Where control flow reaches the views' bytes: the host's memory, or
  // the cuda device's (then the program is not captured as a graph).
  std::unique_ptr<ViewMemory> device_view_memory;
  ViewMemory* view_memory = &hostViewMemory();
  std::vector<const void*> graph_key;
  std::map<std::string, size_t> host_steps;  // cuda: steps run on the host, by kernel

  // The kernels (oneDNN's and ours) parallelise with OpenMP, whose thread
  // count is a setting of the calling thread: set it on the threads that
  // prepare and run.
  void useThreads() const {
    if (threads > 0) omp_set_num_threads(threads);
  }

  // Checks the call's buffer counts and points the views at them.
  void bind(std::span<const std::byte* const> call_inputs, std::span<std::byte* const> call_outputs);

  // Where value `index` lives: its root value and the byte offset in it.
  std::pair<uint32_t, uint64_t> rootOf(uint32_t index) const {
    uint64_t offset = 0;
    while (spec.values[index].storage == ValueStorage::kAlias) {
      offset += spec.values[index].offset;
      index = spec.values[index].index;
    }
    return {index, offset};
  }

  // The data pointer of a value fixed at load, or nullptr with a binding for
  // values in the caller's buffers.
  std::byte* fixedData(uint32_t index, uint32_t view) {
    const auto [root, offset] = rootOf(index);
    const ValueSpec& value = spec.values[root];
    switch (value.storage) {
      case ValueStorage::kArena:
        arena_views.emplace_back(view, value.offset + offset);
        return arena == nullptr ? nullptr : arena + value.offset + offset;
      case ValueStorage::kConstant:
        // Kernels take non-const views; constants are only ever read.
        return const_cast<std::byte*>(constant_bytes.at(spec.constants[value.index]).data()) + offset;
      case ValueStorage::kInput:
      case ValueStorage::kOutput:
        bindings.push_back({view, value.storage == ValueStorage::kOutput, value.index, offset});
        return nullptr;
      case ValueStorage::kAlias: break;
    }
    return nullptr;
  }

  // Binds every constant to its TensorData blob, checking its type; the
  // written ones to copies.
  void bindPackageConstants() {
    written = writtenConstants(spec);
    for (const std::string& name : spec.constants) {
      const TensorDataBlob* blob = reader->findTensorData(name);
      if (blob == nullptr) throw FormatError(source, 0, "constant '" + name + "' has no TensorData blob");
      constant_bytes[name] = blob->data();
      if (!written.contains(name)) continue;
      const std::span<const std::byte> bytes = blob->data();
      written_copies.emplace_back(device_internal::allocateArena(bytes.size(), source));
      if (!bytes.empty()) std::memcpy(written_copies.back().get(), bytes.data(), bytes.size());
      constant_bytes[name] = {written_copies.back().get(), bytes.size()};
    }
    for (const ValueSpec& value : spec.values) {
      if (value.storage != ValueStorage::kConstant) continue;
      const TensorDataBlob* blob = reader->findTensorData(spec.constants[value.index]);
      if (blob->tensorInfo() != value.info) {
        throw FormatError(blob->info().source, blob->info().offset,
                          fmt::format("constant '{}' is {} but the executable expects {}", value.name,
                                      blob->tensorInfo().toString(), value.info.toString()));
      }
    }
  }

  // The caller's constants; those the program writes must be writable
  // memory the caller owns (Executable gives them device buffers).
  void bindMemoryConstants(const ConstantBytes& lookup) {
    written = writtenConstants(spec);
    for (const std::string& name : spec.constants) constant_bytes[name] = lookup(name);
    for (const ValueSpec& value : spec.values) {
      if (value.storage != ValueStorage::kConstant) continue;
      if (constant_bytes.at(spec.constants[value.index]).size() != value.info.sizeInBytes()) {
        throw UsageError(fmt::format("constant '{}' has {} bytes, the executable expects {}", value.name,
                                     constant_bytes.at(spec.constants[value.index]).size(), value.info.sizeInBytes()));
      }
    }
  }

  void setArena(std::byte* base) {
    arena = base;
    for (const auto& [view, offset] : arena_views) views[view].data = base + offset;
  }

  void finishLoad(const ExecutorOptions& options) {
    for (uint32_t value : spec.inputs) inputs.push_back({spec.values[value].name, spec.values[value].info});
    cuda = options.cuda;
    queue = options.queue;
    host_constants = options.host_constants;
    if (cuda) {
#if KILN_HAVE_CUDA
      if (!options.external_arena) throw UsageError("a cuda executor takes its arena from its device (external_arena)");
      if (!host_constants) throw UsageError("a cuda executor needs the host bytes of its constants");
      const bool control_flow = std::any_of(spec.steps.begin(), spec.steps.end(),
                                            [](const StepSpec& step) { return isControlFlowKernel(step.kernel); });
      if (control_flow) {
        // A condition is read on the host, which a CUDA graph cannot wait for.
        device_view_memory = cuda::createViewMemory(queue);
        view_memory = device_view_memory.get();
      } else if (options.cuda_graphs) {
        graphs = std::make_unique<cuda::ProgramGraphs>(queue, 8);
      }
      graph_key.resize(inputs.size() + outputs.size());
      cuda::useQueueDevice(queue);
#else
      throw UsageError("this build of kiln has no CUDA kernels");
#endif
    }
    if (!options.external_arena) {
      // Checked: a declared size near 2^64 used to round up to 0 bytes, and
      // the kernels wrote into that (issue 12).
      own_arena.reset(device_internal::allocateArena(spec.arena_bytes, source));
      arena = own_arena.get();
    }
    prepare();
    if (!host_steps.empty()) {
      std::string list;
      for (const auto& [kernel, count] : host_steps) list += fmt::format("{}{} x{}", list.empty() ? "" : ", ", kernel, count);
      log::warning("{}: steps without a cuda kernel for their variant run on the host (slower): {}", source, list);
    }
  }

  uint32_t addView(uint32_t value) {
    const auto view = static_cast<uint32_t>(views.size());
    views.push_back(viewOf(spec.values[value].info, fixedData(value, view)));
    return view;
  }

  void prepare() {
    const KernelRegistry& kernels = KernelRegistry::cpu();
    std::set<std::string> missing;
    auto check = [&](const std::vector<StepSpec>& list) {
      for (const StepSpec& step : list) {
        if (!isControlFlowKernel(step.kernel) && kernels.find(step.kernel) == nullptr &&
            (!cuda || KernelRegistry::cuda().find(step.kernel) == nullptr)) {
          missing.insert(step.kernel);
        }
      }
    };
    check(spec.steps);
    for (const SubProgramSpec& program : spec.subprograms) check(program.steps);
    if (!missing.empty()) {
      throw UsageError(fmt::format("this build of kiln has no CPU kernel for: {} (the package needs a newer kiln)",
                                   fmt::join(missing, ", ")));
    }
    // Control-flow steps keep pointers to their sub-programs: no reallocation.
    programs.reserve(spec.subprograms.size());
    for (const SubProgramSpec& sub : spec.subprograms) {
      Program program;
      for (uint32_t input : sub.inputs) program.input_views.push_back(addView(input));
      program.steps = prepareSteps(sub.steps);
      for (uint32_t output : sub.outputs) program.output_views.push_back(addView(output));
      programs.push_back(std::move(program));
    }
    steps = prepareSteps(spec.steps);
  }

  // Picks step's kernel: the cpu one, or on cuda the cuda one when there is
  // one and the cpu one as a host step otherwise.
  void prepareKernel(const std::string& name, const KernelSetup& setup, Step& step) {
    const KernelDef* cpu_kernel = KernelRegistry::cpu().find(name);
#if KILN_HAVE_CUDA
    if (cuda) {
      if (const KernelDef* kernel = KernelRegistry::cuda().find(name)) {
        try {
          step.state = kernel->prepare(setup);
          step.run = kernel->run;
          return;
        } catch (const KernelUnsupported&) {
          // This variant runs on the host below.
        }
      }
      if (cpu_kernel == nullptr) throw UsageError("no cuda kernel for this step, and no CPU kernel to run on the host");
      ++host_steps[name];
      step.run = cuda::runOnHost;
      step.state = cuda::prepareOnHost(*cpu_kernel, setup);
      return;
    }
#endif
    step.run = cpu_kernel->run;
    step.state = cpu_kernel->prepare(setup);
  }

  std::vector<Step> prepareSteps(const std::vector<StepSpec>& list) {
    std::vector<Step> prepared;
    for (const StepSpec& step_spec : list) {
      Step step;
      step.first_input = static_cast<uint32_t>(views.size());
      step.input_count = static_cast<uint32_t>(step_spec.inputs.size());
      step.output_count = static_cast<uint32_t>(step_spec.outputs.size());
      std::vector<TensorInfo> input_infos;
      std::vector<const std::byte*> constants;
      for (uint32_t input : step_spec.inputs) {
        if (input == kNoValueIndex) {
          views.push_back(TensorView{});
          input_infos.push_back(TensorInfo{});
          constants.push_back(nullptr);
          continue;
        }
        addView(input);
        input_infos.push_back(spec.values[input].info);
        const auto [root, offset] = rootOf(input);
        // A variable the program writes is data, not a constant to pack.
        const bool constant = spec.values[root].storage == ValueStorage::kConstant &&
                              !written.contains(spec.constants[spec.values[root].index]);
        if (constant && cuda) {
          // Kernels read constants on the host at prepare time.
          constants.push_back(host_constants(spec.constants[spec.values[root].index]).data() + offset);
        } else {
          constants.push_back(constant ? views.back().data : nullptr);
        }
      }
      step.first_output = static_cast<uint32_t>(views.size());
      std::vector<TensorInfo> output_infos;
      for (uint32_t output : step_spec.outputs) {
        addView(output);
        output_infos.push_back(spec.values[output].info);
      }
      try {
        if (isControlFlowKernel(step_spec.kernel)) {
          std::vector<const Program*> subprograms;
          for (uint32_t index : step_spec.subprograms) subprograms.push_back(&programs.at(index));
          step.control = prepareControlFlow(step_spec.kernel, step_spec.params, std::move(subprograms), views, step);
        } else {
          const KernelSetup setup{step_spec.params, input_infos, output_infos, constants, queue};
          prepareKernel(step_spec.kernel, setup, step);
        }
      } catch (const Error& e) {
        throw UsageError(fmt::format("step {} ({}): {}", prepared.size(), step_spec.kernel, e.what()));
      }
      prepared.push_back(std::move(step));
    }
    return prepared;
  }
};

Executor::Executor(const std::filesystem::path& package, const std::string& model, const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (options.threads < 0) throw UsageError(fmt::format("threads must be 0 or more, got {}", options.threads));
  m.threads = options.threads;
  m.flush_denormals = options.flush_denormals;
  // Kernels may size their work split by the thread count when prepared.
  m.useThreads();
  m.reader = std::make_unique<PackageReader>(package);
  m.source = package.string();
  const auto metadata = m.reader->metadata();
  if (metadata.empty()) throw UsageError(package.string() + " holds no model");
  const MetadataBlob* chosen = model.empty() ? metadata.front() : m.reader->findMetadata(model);
  if (chosen == nullptr) throw UsageError(fmt::format("{} holds no model named '{}'", package.string(), model));
  if (model.empty() && metadata.size() > 1) {
    throw UsageError(fmt::format("{} holds {} models: name one", package.string(), metadata.size()));
  }
  if (chosen->metadata().target.device_kind != "cpu") {
    throw UsageError(fmt::format("model '{}' targets device '{}'; this executor runs 'cpu' models", chosen->name(),
                                 chosen->metadata().target.device_kind));
  }
  if (isGraphPackage(chosen->metadata())) {
    throw UsageError(fmt::format("model '{}' in {} has shapes known only at run time: load it with "
                                 "kiln::DynamicExecutor (kiln.Runner in Python does)",
                                 chosen->name(), package.string()));
  }
  // The plugin libraries its steps call, before any step is prepared.
  loadPackagePlugins(chosen->metadata().options, package, options.check_plugin_hash);
  const ExecutableBlob* executable = m.reader->findExecutable(chosen->metadata().executable);
  // The checks of verifyModels (`kiln dump --verify`), in the same words.
  const std::string where = package.string() + " (executable '" + executable->name() + "')";
  m.spec = decodeExecutable(executable->read(), where);
  m.bindPackageConstants();
  // A package with a shrunk anchor wrote past the caller's block (issue 12).
  checkAnchorsMatch(chosen->metadata(), m.spec, where, chosen->info().offset);
  for (const Anchor* anchor : chosen->metadata().outputs()) m.outputs.push_back({anchor->name, anchor->info});
  m.finishLoad(options);
}

Executor::Executor(ExecutableSpec spec, const ConstantBytes& constants, const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (options.threads < 0) throw UsageError(fmt::format("threads must be 0 or more, got {}", options.threads));
  m.threads = options.threads;
  m.flush_denormals = options.flush_denormals;
  m.useThreads();
  m.source = "(in-memory executable)";
  m.spec = std::move(spec);
  m.bindMemoryConstants(constants);
  for (uint32_t value : m.spec.outputs) {
    // Output values carry their model output name unless a copy step made
    // them ("name:output").
    std::string name = m.spec.values[value].name;
    if (name.ends_with(":output")) name.resize(name.size() - 7);
    m.outputs.push_back({name, m.spec.values[value].info});
  }
  m.finishLoad(options);
}

Executor::~Executor() = default;

const std::vector<TensorSlot>& Executor::inputs() const { return impl_->inputs; }
const std::vector<TensorSlot>& Executor::outputs() const { return impl_->outputs; }
uint64_t Executor::arenaBytes() const { return impl_->spec.arena_bytes; }
void Executor::setArena(std::byte* arena) { impl_->setArena(arena); }
uint64_t Executor::stepsRun() const { return impl_->steps_run; }
size_t Executor::stepCount() const { return impl_->steps.size(); }

void Executor::run(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs) {
  Impl& m = *impl_;
  m.bind(inputs, outputs);
  m.useThreads();
  const DenormalsScope denormals(m.flush_denormals);
#if KILN_HAVE_CUDA
  if (m.graphs) {
    // One graph per set of call buffers: the captured kernels hold them.
    for (size_t i = 0; i < inputs.size(); ++i) m.graph_key[i] = inputs[i];
    for (size_t i = 0; i < outputs.size(); ++i) m.graph_key[inputs.size() + i] = outputs[i];
    const bool captured = m.graphs->run(
        m.graph_key,
        [](void* context) {
          Impl& self = *static_cast<Impl*>(context);
          ProgramRunner(self.views, self.steps_run, self.queue, *self.view_memory).run(self.steps);
        },
        &m);
    if (!captured) m.steps_run += m.steps.size();
    return;
  }
#endif
  ProgramRunner(m.views, m.steps_run, m.queue, *m.view_memory).run(m.steps);
}

void Executor::runProfiled(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs,
                           std::span<uint64_t> step_ns) {
  Impl& m = *impl_;
  if (step_ns.size() != m.steps.size()) {
    throw UsageError(fmt::format("runProfiled() needs {} step times, got {}", m.steps.size(), step_ns.size()));
  }
  m.bind(inputs, outputs);
  m.useThreads();
  const DenormalsScope denormals(m.flush_denormals);
  ProgramRunner runner(m.views, m.steps_run, m.queue, *m.view_memory);
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    runner.runStep(m.steps[i]);
#if KILN_HAVE_CUDA
    if (m.cuda) cuda::synchronizeQueue(m.queue);
#endif
    step_ns[i] += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }
}

void Executor::runTraced(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs,
                         StepTrace& trace) {
  Impl& m = *impl_;
  if (m.step_trace_args.empty()) {
    for (const StepSpec& step : m.spec.steps) m.step_trace_args.push_back(traceArgs(m.spec, step));
  }
  m.bind(inputs, outputs);
  m.useThreads();
  const DenormalsScope denormals(m.flush_denormals);
  ProgramRunner runner(m.views, m.steps_run, m.queue, *m.view_memory);
  const uint64_t run = trace.nextRun();
  const uint64_t run_start = trace.now();
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const uint64_t start = trace.now();
    runner.runStep(m.steps[i]);
#if KILN_HAVE_CUDA
    if (m.cuda) cuda::synchronizeQueue(m.queue);
#endif
    trace.add(TraceEvent{m.spec.steps[i].kernel, "step", start, trace.now() - start, m.step_trace_args[i]});
  }
  trace.add(TraceEvent{fmt::format("run {}", run), "run", run_start, trace.now() - run_start,
                       fmt::format("\"steps\": {}", m.steps.size())});
}

const std::string& Executor::stepKernel(size_t index) const { return impl_->spec.steps.at(index).kernel; }

std::string Executor::stepDescription(size_t index) const {
  const StepSpec& step = impl_->spec.steps.at(index);
  if (step.outputs.empty()) return step.kernel;
  const ValueSpec& value = impl_->spec.values[step.outputs.front()];
  return fmt::format("{} -> {} {}", step.kernel, value.name, value.info.toString());
}

void Executor::Impl::bind(std::span<const std::byte* const> call_inputs, std::span<std::byte* const> call_outputs) {
  if (call_inputs.size() != inputs.size() || call_outputs.size() != outputs.size()) {
    throw UsageError(fmt::format("run() needs {} inputs and {} outputs, got {} and {}", inputs.size(), outputs.size(),
                                 call_inputs.size(), call_outputs.size()));
  }
  // An empty tensor's buffer may be null (an empty vector's data()); the
  // kernels get a real address, which they never read or write past.
  alignas(64) static std::byte empty_tensor[64];
  for (const CallBinding& binding : bindings) {
    std::byte* base =
        binding.is_output ? call_outputs[binding.buffer] : const_cast<std::byte*>(call_inputs[binding.buffer]);
    if (base == nullptr) {
      if (views[binding.view].numElements() != 0) {
        throw UsageError(fmt::format("run(): {} {} is a null pointer", binding.is_output ? "output" : "input",
                                     binding.buffer));
      }
      base = empty_tensor;
    }
    views[binding.view].data = base + binding.offset;
  }
}

}  // namespace kiln
