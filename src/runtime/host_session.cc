#include "kiln/host_session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "kiln/training.h"
#include "plugins/replica_all_reduce.h"
#include "runtime/device_internal.h"
#include "runtime/device_sync.h"

namespace kiln {
namespace {

struct FreeAligned {
  void operator()(std::byte* data) const noexcept { device_internal::freeAligned(data); }
};
using HostBytes = std::unique_ptr<std::byte, FreeAligned>;

// One replica: its device, the model on it, and (on a device with its own
// memory) the device buffers its main-program operands are staged in.
struct Replica {
  std::shared_ptr<Device> device;
  std::unique_ptr<Executable> executable;
  std::vector<DeviceBuffer> staged_inputs;
  std::vector<DeviceBuffer> staged_outputs;
  // The operands of the current round, as runMain takes them.
  std::vector<const std::byte*> inputs;
  std::vector<std::byte*> outputs;
  // Reused job lists: a round allocates nothing.
  std::vector<DeviceJob> copies_in, compute, copies_out;
  // A training package's replicas: the group its gradients are averaged
  // over (plugins/replica_all_reduce.h), and its index there.
  ReplicaGroup* group = nullptr;
  uint32_t index = 0;
};

// The main program, on whichever thread runs it (the caller's, or a sim
// device's), as replica `index` of its group.
void runMainOf(void* context) {
  Replica& replica = *static_cast<Replica*>(context);
  const ReplicaScope scope(replica.group, replica.index);
  replica.executable->runMain(replica.inputs, replica.outputs);
}

// One replica's round, its operands set: copies in, the main program,
// copies out.
void runReplicaRound(Replica& replica) {
  if (replica.device->usesHostMemory()) {
    runMainOf(&replica);
    return;
  }
  runJobsAndWait(*replica.device, replica.copies_in);
  replica.compute[0] = DeviceJob{.kind = DeviceJob::Kind::kCompute, .compute = &runMainOf, .context = &replica};
  runJobsAndWait(*replica.device, replica.compute);
  runJobsAndWait(*replica.device, replica.copies_out);
}

// The replicas of a training package run each round at once, one thread
// each, as their all-reduce needs: threads started at attach and kept, so
// that a round allocates nothing.
class ReplicaWorkers {
 public:
  explicit ReplicaWorkers(std::vector<Replica>& replicas) : replicas_(replicas), group_(static_cast<uint32_t>(replicas.size())) {
    for (uint32_t r = 0; r < replicas.size(); ++r) {
      replicas[r].group = &group_;
      replicas[r].index = r;
    }
    for (uint32_t r = 0; r < replicas.size(); ++r) threads_.emplace_back([this, r] { work(r); });
  }

  ~ReplicaWorkers() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    start_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  // Runs one round on every replica; rethrows the first replica's error.
  void runRound() {
    {
      std::lock_guard lock(mutex_);
      done_ = 0;
      error_ = nullptr;
      ++round_;
    }
    start_.notify_all();
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return done_ == threads_.size(); });
    if (error_) {
      group_.reset();
      std::rethrow_exception(error_);
    }
  }

 private:
  void work(uint32_t r) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stopping_ || round_ != seen; });
        if (stopping_) return;
        seen = round_;
      }
      std::exception_ptr error;
      try {
        runReplicaRound(replicas_[r]);
      } catch (...) {
        error = std::current_exception();
        group_.abort();  // the others stop waiting for this replica's gradients
      }
      std::lock_guard lock(mutex_);
      if (error && !error_) error_ = error;
      if (++done_ == threads_.size()) finished_.notify_one();
    }
  }

  std::vector<Replica>& replicas_;
  ReplicaGroup group_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  uint64_t round_ = 0;
  size_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace

struct HostSession::Impl {
  std::shared_ptr<const PackageReader> package;
  HostSessionOptions options;
  std::unique_ptr<DeviceManager> own_manager;
  Metadata metadata;
  std::string model;
  std::vector<Anchor> inputs, outputs, variables, constants;
  std::map<std::string, HostBytes> host;  // the host copy of each variable
  std::vector<Replica> replicas;          // empty while detached
  std::unique_ptr<ReplicaWorkers> workers;  // a training package's replicas (more than one), while attached
  std::vector<const std::byte*> input_base;  // run()'s operands, reused: a run allocates nothing
  std::vector<std::byte*> output_base;
  bool stale = false;                     // the devices' variables may differ from the host copy
  uint64_t to_host = 0, from_host = 0, main_runs = 0;

  const Anchor* variable(const std::string& name) const {
    for (const Anchor& anchor : variables) {
      if (anchor.name == name) return &anchor;
    }
    return nullptr;
  }

  void requireAttached(const char* what) const {
    if (replicas.empty()) throw UsageError(fmt::format("{}: the session is not attached (attach first)", what));
  }

  // The bytes each main-program operand takes per round and replica.
  void checkOperand(const Anchor& anchor, uint64_t bytes, DType dtype, const void* data, const char* kind) const {
    const uint64_t slices = uint64_t{options.num_host_transfers} * options.replication_factor;
    const uint64_t expected = anchor.info.sizeInBytes() * slices;
    if (dtype != DType::kUndefined && dtype != anchor.info.dtype) {
      throw UsageError(fmt::format("{} '{}' is {}, got {}", kind, anchor.name, dtypeName(anchor.info.dtype),
                                   dtypeName(dtype)));
    }
    if (bytes != expected || (data == nullptr && expected > 0)) {
      throw UsageError(fmt::format("{} '{}' needs {} bytes ({} x {} of {} {}: num_host_transfers x "
                                   "replication_factor x the anchor), got {}",
                                   kind, anchor.name, expected, options.num_host_transfers,
                                   options.replication_factor, dtypeName(anchor.info.dtype),
                                   anchor.info.shapeString(), bytes));
    }
  }
};

HostSession::HostSession(std::shared_ptr<const PackageReader> package, HostSessionOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (!package) throw UsageError("HostSession needs a package");
  if (options.replication_factor < 1 || options.num_host_transfers < 1) {
    throw UsageError(fmt::format("replication_factor ({}) and num_host_transfers ({}) must be 1 or more",
                                 options.replication_factor, options.num_host_transfers));
  }
  m.package = std::move(package);
  m.options = std::move(options);
  const auto all = m.package->metadata();
  if (all.empty()) throw UsageError("the package holds no model");
  if (m.options.model.empty() && all.size() > 1) throw UsageError(fmt::format("the package holds {} models: name one", all.size()));
  const MetadataBlob* chosen = m.options.model.empty() ? all.front() : m.package->findMetadata(m.options.model);
  if (chosen == nullptr) throw UsageError(fmt::format("the package holds no model named '{}'", m.options.model));
  m.model = chosen->name();
  m.metadata = chosen->metadata();
  // Replicas of a training step would each train on their own slices and
  // drift apart: keeping them in step needs the gradients averaged over
  // them (kReplicaAllReduce), which the package must have been compiled with.
  registerReplicaAllReduce();
  const auto all_reduce = m.metadata.options.find(kGradientAllReduceOption);
  const bool replicated = all_reduce != m.metadata.options.end() && all_reduce->second == kReplicaAllReduce;
  if (!m.metadata.is_inference && m.options.replication_factor > 1 && !replicated) {
    throw UsageError(fmt::format("model '{}' is a training package; replicas of it (replication_factor {}) would "
                                 "train apart: compile it for replicas (kiln.compile_training(..., "
                                 "data_parallel=\"replicas\"))",
                                 m.model, m.options.replication_factor));
  }
  for (const Anchor* anchor : m.metadata.mainInputs()) m.inputs.push_back(*anchor);
  for (const Anchor* anchor : m.metadata.outputs()) m.outputs.push_back(*anchor);
  for (const Anchor& anchor : m.metadata.anchors) {
    if (!m.metadata.isLoadAnchor(anchor)) continue;
    const bool is_variable = std::any_of(m.metadata.anchors.begin(), m.metadata.anchors.end(), [&](const Anchor& a) {
      return m.metadata.isSaveAnchor(a) && a.name == anchor.name;
    });
    (is_variable ? m.variables : m.constants).push_back(anchor);
  }
  for (const Anchor& anchor : m.variables) {
    const TensorDataBlob* data = m.package->findTensorData(anchor.name);
    if (data == nullptr || data->data().size() != anchor.info.sizeInBytes()) {
      throw UsageError(fmt::format("variable '{}' has no data of its size in the package", anchor.name));
    }
    HostBytes bytes(device_internal::allocateAligned(anchor.info.sizeInBytes()));
    if (!bytes) throw UsageError(fmt::format("no host memory for variable '{}'", anchor.name));
    std::memcpy(bytes.get(), data->data().data(), data->data().size());
    m.host[anchor.name] = std::move(bytes);
  }
}

HostSession::~HostSession() = default;

const std::vector<Anchor>& HostSession::inputs() const { return impl_->inputs; }
const std::vector<Anchor>& HostSession::outputs() const { return impl_->outputs; }
const std::vector<Anchor>& HostSession::variables() const { return impl_->variables; }
const std::vector<Anchor>& HostSession::constants() const { return impl_->constants; }
const HostSessionOptions& HostSession::options() const { return impl_->options; }
bool HostSession::isAttached() const { return !impl_->replicas.empty(); }
uint64_t HostSession::weightsToHostCount() const { return impl_->to_host; }
uint64_t HostSession::weightsFromHostCount() const { return impl_->from_host; }
uint64_t HostSession::mainRuns() const { return impl_->main_runs; }

bool HostSession::attach() {
  Impl& m = *impl_;
  if (!m.replicas.empty()) return false;
  if (!m.options.device_manager && !m.own_manager) m.own_manager = std::make_unique<DeviceManager>();
  DeviceManager& manager = m.options.device_manager ? *m.options.device_manager : *m.own_manager;
  const uint32_t replicas = m.options.replication_factor;
  const bool specific = m.options.device.find(':') != std::string::npos;
  if (specific && replicas > 1) {
    throw UsageError(fmt::format("device '{}' is one device; {} replicas need a device kind", m.options.device, replicas));
  }
  std::vector<Replica> attached(replicas);
  for (uint32_t r = 0; r < replicas; ++r) {
    Replica& replica = attached[r];
    if (specific) {
      replica.device = manager.getSpecificDevice(m.options.device, m.options.device_wait);
    } else {
      DeviceConstraints constraints;
      if (!m.options.device.empty()) constraints.kind = parseDeviceKind(m.options.device);
      // Replicas on the cpu share its cores.
      constraints.cpu_threads = std::max<uint32_t>(1, device_internal::hostCores() / replicas);
      replica.device = manager.getDevice(m.metadata.target, constraints, m.options.device_wait);
    }
    replica.executable = std::make_unique<Executable>(m.package, m.model, replica.device, m.options.executable);
    if (!replica.device->usesHostMemory()) {
      for (const Anchor& anchor : m.inputs) replica.staged_inputs.push_back(replica.device->allocate(std::max<uint64_t>(anchor.info.sizeInBytes(), 1)));
      for (const Anchor& anchor : m.outputs) replica.staged_outputs.push_back(replica.device->allocate(std::max<uint64_t>(anchor.info.sizeInBytes(), 1)));
    }
    replica.inputs.resize(m.inputs.size());
    replica.outputs.resize(m.outputs.size());
    replica.copies_in.resize(m.inputs.size());
    replica.compute.resize(1);
    replica.copies_out.resize(m.outputs.size());
  }
  m.replicas = std::move(attached);
  try {
    weightsFromHost();
  } catch (...) {
    m.replicas.clear();
    throw;
  }
  if (!m.metadata.is_inference && replicas > 1) m.workers = std::make_unique<ReplicaWorkers>(m.replicas);
  return true;
}

bool HostSession::detach() {
  Impl& m = *impl_;
  if (m.replicas.empty()) return false;
  if (m.stale) weightsToHost();
  m.workers.reset();
  m.replicas.clear();  // gives the devices back
  return true;
}

void HostSession::weightsFromHost() {
  Impl& m = *impl_;
  m.requireAttached("weights_from_host");
  for (Replica& replica : m.replicas) {
    replica.executable->runLoad([&](const Anchor& anchor) -> std::span<const std::byte> {
      const auto host = m.host.find(anchor.name);
      if (host != m.host.end()) return {host->second.get(), anchor.info.sizeInBytes()};
      if (const TensorDataBlob* tensor = m.package->findTensorData(anchor.name)) return tensor->data();
      throw UsageError(fmt::format("model '{}': load anchor '{}' has no data in the package", m.model, anchor.name));
    });
  }
  ++m.from_host;
  m.stale = false;
}

void HostSession::weightsToHost() {
  Impl& m = *impl_;
  m.requireAttached("weights_to_host");
  // Replicas keep their variables in step: the first one's are everyone's.
  m.replicas.front().executable->runSave([&](const Anchor& anchor) -> std::span<std::byte> {
    return {m.host.at(anchor.name).get(), anchor.info.sizeInBytes()};
  });
  ++m.to_host;
  m.stale = false;
}

void HostSession::run(const InputMemoryView& inputs, const OutputMemoryView& outputs) {
  Impl& m = *impl_;
  m.requireAttached("run");
  // Every anchor given is looked up below; more names than anchors means
  // some are unknown (only then is the list of them built).
  if (inputs.size() > m.inputs.size() || outputs.size() > m.outputs.size()) {
    std::vector<std::string> unknown;
    const auto known = [](const std::vector<Anchor>& anchors, const std::string& name) {
      return std::any_of(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.name == name; });
    };
    for (const auto& entry : inputs) {
      if (!known(m.inputs, entry.first)) unknown.push_back(entry.first);
    }
    for (const auto& entry : outputs) {
      if (!known(m.outputs, entry.first)) unknown.push_back(entry.first);
    }
    throw UsageError(fmt::format("model '{}' has no input or output named {}", m.model, fmt::join(unknown, ", ")));
  }
  std::vector<const std::byte*>& input_base = m.input_base;
  std::vector<std::byte*>& output_base = m.output_base;
  input_base.resize(m.inputs.size());
  output_base.resize(m.outputs.size());
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const auto found = inputs.find(m.inputs[i].name);
    if (found == inputs.end()) throw UsageError(fmt::format("input '{}' ({} {}) is missing", m.inputs[i].name, dtypeName(m.inputs[i].info.dtype), m.inputs[i].info.shapeString()));
    m.checkOperand(m.inputs[i], found->second.bytes, found->second.dtype, found->second.data, "input");
    input_base[i] = static_cast<const std::byte*>(found->second.data);
  }
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const auto found = outputs.find(m.outputs[i].name);
    if (found == outputs.end()) throw UsageError(fmt::format("output '{}' ({} {}) is missing", m.outputs[i].name, dtypeName(m.outputs[i].info.dtype), m.outputs[i].info.shapeString()));
    m.checkOperand(m.outputs[i], found->second.bytes, found->second.dtype, found->second.data, "output");
    output_base[i] = static_cast<std::byte*>(found->second.data);
  }
  if (!m.variables.empty()) m.stale = true;  // the main program may change them (the reference's rule)
  const uint32_t replicas = m.options.replication_factor;
  for (uint32_t n = 0; n < m.options.num_host_transfers; ++n) {
    for (uint32_t r = 0; r < replicas; ++r) {
      Replica& replica = m.replicas[r];
      const uint64_t slice = uint64_t{n} * replicas + r;
      for (size_t i = 0; i < m.inputs.size(); ++i) {
        const uint64_t bytes = m.inputs[i].info.sizeInBytes();
        const std::byte* host = input_base[i] == nullptr ? nullptr : input_base[i] + slice * bytes;
        if (replica.device->usesHostMemory()) {
          replica.inputs[i] = host;
          continue;
        }
        replica.inputs[i] = replica.staged_inputs[i].data();
        replica.copies_in[i] = DeviceJob{.kind = DeviceJob::Kind::kCopyToDevice,
                                         .destination = replica.staged_inputs[i].data(), .source = host, .bytes = bytes};
      }
      for (size_t o = 0; o < m.outputs.size(); ++o) {
        const uint64_t bytes = m.outputs[o].info.sizeInBytes();
        std::byte* host = output_base[o] == nullptr ? nullptr : output_base[o] + slice * bytes;
        if (replica.device->usesHostMemory()) {
          replica.outputs[o] = host;
          continue;
        }
        replica.outputs[o] = replica.staged_outputs[o].data();
        replica.copies_out[o] = DeviceJob{.kind = DeviceJob::Kind::kCopyToHost, .destination = host,
                                          .source = replica.staged_outputs[o].data(), .bytes = bytes};
      }
      if (!m.workers) runReplicaRound(replica);  // replicas of an inference package: one after another
      ++m.main_runs;
    }
    if (m.workers) m.workers->runRound();  // a training package's: all at once
  }
}

std::span<const std::byte> HostSession::readTensor(const std::string& name) { return readTensors({name}).front(); }

std::vector<std::span<const std::byte>> HostSession::readTensors(const std::vector<std::string>& names) {
  Impl& m = *impl_;
  std::vector<std::span<const std::byte>> result;
  bool needs_variables = false;
  for (const std::string& name : names) {
    if (m.variable(name) != nullptr) {
      needs_variables = true;
      continue;
    }
    const bool constant = std::any_of(m.constants.begin(), m.constants.end(), [&](const Anchor& a) { return a.name == name; });
    if (!constant) {
      throw UsageError(fmt::format("model '{}' has no variable or constant named '{}'", m.model, name));
    }
  }
  // One transfer for every variable asked for, and only when the host copy
  // may be out of date.
  if (needs_variables && !m.replicas.empty() && m.stale) weightsToHost();
  for (const std::string& name : names) {
    if (const Anchor* anchor = m.variable(name)) {
      result.emplace_back(m.host.at(name).get(), anchor->info.sizeInBytes());
    } else {
      result.push_back(m.package->findTensorData(name)->data());
    }
  }
  return result;
}

void HostSession::writeVariable(const std::string& name, std::span<const std::byte> bytes) {
  writeVariables({{name, bytes}});
}

void HostSession::writeVariables(const std::vector<std::pair<std::string, std::span<const std::byte>>>& values) {
  Impl& m = *impl_;
  // Everything is checked before anything changes.
  for (const auto& [name, bytes] : values) {
    const Anchor* anchor = m.variable(name);
    if (anchor == nullptr) {
      throw UsageError(fmt::format("model '{}' has no variable named '{}' (variables: {})", m.model, name,
                                   fmt::join([&] {
                                     std::vector<std::string> names;
                                     for (const Anchor& a : m.variables) names.push_back(a.name);
                                     return names;
                                   }(), ", ")));
    }
    if (bytes.size() != anchor->info.sizeInBytes()) {
      throw UsageError(fmt::format("variable '{}' is {} {} ({} bytes), got {} bytes", name,
                                   dtypeName(anchor->info.dtype), anchor->info.shapeString(),
                                   anchor->info.sizeInBytes(), bytes.size()));
    }
  }
  // The host copy must hold the devices' other variables first: a stale
  // copy written back would undo what runs changed.
  if (!m.replicas.empty() && m.stale) weightsToHost();
  for (const auto& [name, bytes] : values) std::memcpy(m.host.at(name).get(), bytes.data(), bytes.size());
  if (!m.replicas.empty()) weightsFromHost();
}

}  // namespace kiln
