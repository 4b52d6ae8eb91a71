#include "kiln/executable.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "format/executable_spec.h"
#include "format/graph_package.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/package_reader.h"
#include "plugins/package_plugins.h"
#include "runtime/device_sync.h"
#if KILN_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace kiln {
namespace {

std::string mebibytes(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

struct Executable::Impl {
  std::shared_ptr<const PackageReader> package;
  std::shared_ptr<Device> device;
  std::string name;
  Metadata metadata;
  std::string source;  // for messages
  ExecutableSpec spec;
  int threads = 0;
  bool cuda_graphs = true;
  bool flush_denormals = true;
  std::vector<Anchor> load_anchors;
  std::vector<Anchor> main_inputs;
  std::vector<Anchor> main_outputs;
  std::vector<Anchor> save_anchors;
  DeviceBuffer arena;
  // Weights: device copies (sim) or the host bytes in place (cpu).
  std::map<std::string, DeviceBuffer> weight_buffers;
  std::map<std::string, std::span<const std::byte>> weights;
  // Built by runLoad: the kernels are prepared over the weights as they sit
  // on the device.
  std::unique_ptr<Executor> executor;
};

Executable::Executable(std::shared_ptr<const PackageReader> package, const std::string& model,
                       std::shared_ptr<Device> device, const ExecutableOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (!package || !device) throw UsageError("Executable needs a package and a device");
  m.package = std::move(package);
  m.device = std::move(device);
  m.source = fmt::format("{}", fmt::join(m.package->sources(), ", "));
  const auto all = m.package->metadata();
  if (all.empty()) throw UsageError(m.source + " holds no model");
  if (model.empty() && all.size() > 1) throw UsageError(fmt::format("{} holds {} models: name one", m.source, all.size()));
  const MetadataBlob* chosen = model.empty() ? all.front() : m.package->findMetadata(model);
  if (chosen == nullptr) throw UsageError(fmt::format("{} holds no model named '{}'", m.source, model));
  m.name = chosen->name();
  m.metadata = chosen->metadata();
  if (isGraphPackage(m.metadata)) {
    throw UsageError(fmt::format("model '{}' has shapes known only at run time; the runtime runs packages with "
                                 "static shapes (compile with fixed input shapes, or use kiln::DynamicExecutor)",
                                 m.name));
  }
  const std::string& kind = m.metadata.target.device_kind;
  if (kind != "cpu" && kind != "sim" && kind != "cuda") {
    throw UsageError(fmt::format("model '{}' targets device kind '{}', which this runtime cannot run", m.name, kind));
  }
  // cuda packages hold cuda steps; cpu and sim ones hold CPU steps.
  if ((kind == "cuda") != (m.device->info().kind == DeviceKind::kCuda)) {
    throw UsageError(fmt::format("model '{}' was compiled for '{}' devices and cannot run on {} (compile it with "
                                 "--target {})",
                                 m.name, kind, m.device->id(), deviceKindName(m.device->info().kind)));
  }
  loadPackagePlugins(m.metadata.options, m.package->sources().front(), options.check_plugin_hash);
  m.threads = options.threads > 0 ? options.threads : static_cast<int>(m.device->info().compute_threads);
  m.cuda_graphs = options.cuda_graphs;
  m.flush_denormals = options.flush_denormals;

  const ExecutableBlob* blob = m.package->findExecutable(m.metadata.executable);
  const std::string where = m.source + " (executable '" + blob->name() + "')";
  m.spec = decodeExecutable(blob->read(), where);
  checkAnchorsMatch(m.metadata, m.spec, where, chosen->info().offset);  // as verifyModels
  // Anchors by program: those of the load programs are the weights.
  for (const Anchor& anchor : m.metadata.anchors) {
    if (m.metadata.isLoadAnchor(anchor)) {
      m.load_anchors.push_back(anchor);
    } else if (m.metadata.isSaveAnchor(anchor)) {
      m.save_anchors.push_back(anchor);
    } else if (anchor.direction == AnchorDirection::kInput) {
      m.main_inputs.push_back(anchor);
    } else {
      m.main_outputs.push_back(anchor);
    }
  }
  for (const Anchor& anchor : m.load_anchors) {
    if (!anchor.info.isStatic()) throw FormatError(m.source, chosen->info().offset, "load anchor '" + anchor.name + "' has a dynamic shape");
  }

  // Everything the model keeps on the device must fit before anything is
  // allocated, so that a model too large fails with the whole picture.
  uint64_t needed = m.spec.arena_bytes;
  if (!m.device->usesHostMemory()) {
    for (const Anchor& anchor : m.load_anchors) needed += anchor.info.sizeInBytes();
  }
  const uint64_t capacity = m.device->info().memory_bytes;
  const uint64_t in_use = m.device->memoryInUse();
  if (needed + in_use > capacity) {
    throw UsageError(fmt::format("model '{}' needs {} of device memory on {} (arena {}, weights {}); the device has {} "
                                 "with {} in use",
                                 m.name, mebibytes(needed), m.device->id(), mebibytes(m.spec.arena_bytes),
                                 mebibytes(needed - m.spec.arena_bytes), mebibytes(capacity), mebibytes(in_use)));
  }
  m.arena = m.device->allocate(std::max<uint64_t>(m.spec.arena_bytes, 64));
}

Executable::~Executable() = default;

const std::string& Executable::name() const { return impl_->name; }
const Metadata& Executable::metadata() const { return impl_->metadata; }
const PackageReader& Executable::package() const { return *impl_->package; }
Device& Executable::device() const { return *impl_->device; }
const std::vector<Anchor>& Executable::loadAnchors() const { return impl_->load_anchors; }
const std::vector<Anchor>& Executable::mainInputs() const { return impl_->main_inputs; }
const std::vector<Anchor>& Executable::mainOutputs() const { return impl_->main_outputs; }
const std::vector<Anchor>& Executable::saveAnchors() const { return impl_->save_anchors; }
bool Executable::loaded() const { return impl_->executor != nullptr; }
void Executable::invalidate() { impl_->executor.reset(); }
uint64_t Executable::stepsRun() const { return impl_->executor ? impl_->executor->stepsRun() : 0; }

uint64_t Executable::deviceBytes() const {
  uint64_t bytes = impl_->arena.size();
  for (const auto& [name, buffer] : impl_->weight_buffers) bytes += buffer.size();
  return bytes;
}

void Executable::runLoad(const LoadSource& source) {
  Impl& m = *impl_;
  m.executor.reset();
  std::vector<DeviceJob> copies;
  // The weights' host bytes, which cuda kernels read while they prepare.
  std::map<std::string, std::span<const std::byte>> host_weights;
  // Variables the main program writes get device memory of their own, on
  // the cpu too (the source may be a read-only mapping of the package).
  const std::set<std::string> written = writtenConstants(m.spec);
  for (const Anchor& anchor : m.load_anchors) {
    const std::span<const std::byte> bytes = source(anchor);
    host_weights[anchor.name] = bytes;
    if (bytes.size() != anchor.info.sizeInBytes()) {
      throw UsageError(fmt::format("load anchor '{}' is {}; its source holds {} bytes", anchor.name,
                                   anchor.info.toString(), bytes.size()));
    }
    if (m.device->usesHostMemory() && !written.contains(anchor.name)) {
      m.weights[anchor.name] = bytes;
      continue;
    }
    DeviceBuffer& buffer = m.weight_buffers[anchor.name];
    if (!buffer) buffer = m.device->allocate(std::max<uint64_t>(bytes.size(), 1));
    m.weights[anchor.name] = {buffer.data(), bytes.size()};
    copies.push_back(DeviceJob{.kind = DeviceJob::Kind::kCopyToDevice, .destination = buffer.data(),
                               .source = bytes.data(), .bytes = bytes.size()});
  }
  runJobsAndWait(*m.device, copies);
  // Constants the executable names are the load anchors (the compiler names
  // each TensorData after its value).
  auto constants = [&](const std::string& constant) -> std::span<const std::byte> {
    const auto found = m.weights.find(constant);
    if (found == m.weights.end()) throw FormatError(m.source, 0, "constant '" + constant + "' has no load anchor");
    return found->second;
  };
  ExecutorOptions options;
  options.threads = m.threads;
  options.flush_denormals = m.flush_denormals;
  options.external_arena = true;
  if (m.device->info().kind == DeviceKind::kCuda) {
    options.cuda = true;
    options.queue = m.device->kernelQueue();
    options.host_constants = [&](const std::string& constant) { return host_weights.at(constant); };
    options.cuda_graphs = m.cuda_graphs;
#if KILN_HAVE_CUDA
    // KILN_CUDA_GRAPHS=0 turns graphs off for every executable on the device.
    if (const auto* gpu = dynamic_cast<const CudaDevice*>(m.device.get())) options.cuda_graphs &= gpu->config().graphs;
#endif
  }
  auto executor = std::make_unique<Executor>(m.spec, constants, options);
  executor->setArena(m.arena.data());
  m.executor = std::move(executor);
}

void Executable::runMain(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs) {
  if (!impl_->executor) {
    throw UsageError(fmt::format("model '{}' on {}: run the load programs before the main program (again after a "
                                 "device reset)",
                                 impl_->name, impl_->device->id()));
  }
  impl_->executor->run(inputs, outputs);
}

void Executable::runMainTraced(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs,
                               StepTrace& trace) {
  if (!impl_->executor) throw UsageError(fmt::format("model '{}': run the load programs first", impl_->name));
  impl_->executor->runTraced(inputs, outputs, trace);
}

void Executable::runSave(const SaveSink& sink) {
  Impl& m = *impl_;
  if (m.save_anchors.empty()) return;
  if (!m.executor) throw UsageError(fmt::format("model '{}': run the load programs before the save programs", m.name));
  std::vector<DeviceJob> copies;
  for (const Anchor& anchor : m.save_anchors) {
    const std::span<std::byte> into = sink(anchor);
    const std::span<const std::byte> from = m.weights.at(anchor.name);  // the verifier paired it with a load anchor
    if (into.size() != from.size()) {
      throw UsageError(fmt::format("save anchor '{}' is {}; its sink holds {} bytes", anchor.name,
                                   anchor.info.toString(), into.size()));
    }
    if (into.data() == from.data() || from.empty()) continue;  // cpu: the weights are the sink's bytes
    copies.push_back(DeviceJob{.kind = DeviceJob::Kind::kCopyToHost, .destination = into.data(), .source = from.data(),
                               .bytes = from.size()});
  }
  runJobsAndWait(*m.device, copies);
}

}  // namespace kiln
