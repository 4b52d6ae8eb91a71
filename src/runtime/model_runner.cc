#include "kiln/model_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "runtime/request.h"
#include "runtime/runner_counters.h"

namespace kiln {
namespace {

// What the runner does after a device error (the reference's table).
enum class ErrorAction { kResetDevice, kKeepServing, kStop };

ErrorAction actionFor(const std::exception_ptr& error, bool auto_reset) {
  try {
    std::rethrow_exception(error);
  } catch (const ApplicationRuntimeError&) {
    return auto_reset ? ErrorAction::kResetDevice : ErrorAction::kStop;
  } catch (const RecoverableDeviceError& e) {
    if (e.recoveryAction() == RecoveryAction::kDeviceReset) return auto_reset ? ErrorAction::kResetDevice : ErrorAction::kStop;
    if (e.recoveryAction() == RecoveryAction::kRerun) return ErrorAction::kKeepServing;
    return ErrorAction::kStop;
  } catch (...) {
    return ErrorAction::kStop;
  }
}

const Metadata& chooseMetadata(const PackageReader& package, const std::string& model) {
  const auto all = package.metadata();
  if (all.empty()) throw UsageError(fmt::format("{} holds no model", fmt::join(package.sources(), ", ")));
  if (model.empty()) {
    if (all.size() > 1) throw UsageError(fmt::format("{} holds {} models: set ModelRunnerConfig::model", fmt::join(package.sources(), ", "), all.size()));
    return all.front()->metadata();
  }
  const MetadataBlob* found = package.findMetadata(model);
  if (found == nullptr) throw UsageError(fmt::format("{} holds no model named '{}'", fmt::join(package.sources(), ", "), model));
  return found->metadata();
}

}  // namespace

struct ModelRunner::Impl {
  struct Replica {
    std::shared_ptr<Device> device;
    std::unique_ptr<Session> session;
    QueueManager* queues = nullptr;
    std::thread thread;
    bool running = false;  // its thread serves (guarded by submit_mutex)
    // Why it stopped, until reset() restarts it (guarded by submit_mutex).
    // A stopped replica is out of rotation: requests go to the others.
    std::exception_ptr failure;
  };

  std::shared_ptr<const PackageReader> package;
  ModelRunnerConfig config;
  std::unique_ptr<DeviceManager> own_manager;
  std::vector<Replica> replicas;
  std::vector<Anchor> inputs;   // user anchors, as each replica's session has them
  std::vector<Anchor> outputs;
  std::vector<QueueLayout> input_layouts;
  std::vector<QueueLayout> output_layouts;
  bool lockstep = false;  // per-replica anchors: every request runs on every replica
  std::vector<bool> input_per_replica;
  std::vector<bool> output_per_replica;

  std::mutex submit_mutex;
  // Set (by the device thread, through SessionOptions::on_failure) when a
  // replica's main loop fails, before any request sees the error; cleared
  // under submit_mutex once the requests enqueued before it are failed.
  // New requests for that replica wait on `error_handled` meanwhile, so
  // that they run after the reset instead of failing with an error that
  // happened before they came.
  std::unique_ptr<std::atomic<bool>[]> error_pending;
  std::condition_variable error_handled;
  std::atomic<bool> in_call{false};  // overlap check when !thread_safe
  std::atomic<bool> closing{false};
  bool draining = false;  // drain() was called: new requests are refused (guarded by submit_mutex)
  std::mutex reset_mutex;  // one reset() at a time
  RunnerCounters counters;
  size_t next_replica = 0;
  std::atomic<uint64_t> resets{0};

  uint32_t replicaCount() const { return static_cast<uint32_t>(replicas.size()); }
  // Under submit_mutex: the replica the next chunk goes to (lockstep: 0),
  // or the error to answer it with when none can take it.
  std::exception_ptr pickReplica(uint32_t& target);
  void start(uint32_t r);
  // Resets a stopped replica's device and reloads its model.
  void resetReplica(Replica& replica);
  void shutdown();
  void serve(uint32_t r);
  uint64_t validate(const InputMemoryView& in, const OutputMemoryView* out) const;
  std::vector<int64_t> outputShape(size_t j, uint64_t rows) const;
  // Enqueues the request; false (nothing enqueued) when `try_only` and its
  // first chunk finds no replica ready to take it at once.
  bool submit(const InputMemoryView& in, const OutputMemoryView& out, RequestState* request, uint64_t rows,
              bool try_only);
  // Under submit_mutex: the first full queue of replica r, or null.
  TensorQueue* fullQueue(uint32_t r) const;
  std::optional<Future<void>> request(const InputMemoryView& in, const OutputMemoryView& out,
                                      const RequestOptions& options, bool try_only);
  std::optional<Future<OutputTensors>> request(const InputMemoryView& in, const RequestOptions& options,
                                               bool try_only);
  // A new request's state, counted as in flight.
  RequestState* newRequest(uint64_t rows, const RequestOptions& options);
  // Enqueues a validated request, or forgets it when a try finds no room.
  template <typename T>
  std::optional<Future<T>> enqueue(Future<T> future, RequestState* state, const InputMemoryView& in,
                                   const OutputMemoryView& out, uint64_t rows, bool try_only);
};

// Under submit_mutex (serve() clears `running` under it when it ends).
void ModelRunner::Impl::start(uint32_t r) {
  replicas[r].thread = std::thread([this, r] { serve(r); });
  replicas[r].running = true;
}

void ModelRunner::Impl::resetReplica(Replica& replica) {
  // What the executable made for the device (kernels' state, CUDA graphs)
  // goes before the device's memory is reset under it.
  replica.device->synchronize();
  replica.session->executable().invalidate();
  replica.device->reset();
  resets.fetch_add(1, std::memory_order_relaxed);
  replica.session->runLoadPrograms();
}

// The main-loop thread of replica `r`: runs the main programs and, after
// an error, fails what was enqueued and resets, keeps serving or stops.
void ModelRunner::Impl::serve(uint32_t r) {
  Replica& replica = replicas[r];
  for (;;) {
    {
      // `closing` is read under the lock that the destructor sets it under:
      // a stop() that the session used up while this thread handled an
      // error (Finish clears it) cannot leave the loop running for ever.
      std::lock_guard lock(submit_mutex);
      if (closing.load(std::memory_order_relaxed)) break;
    }
    std::exception_ptr error;
    try {
      replica.session->runMainPrograms();
    } catch (...) {
      error = std::current_exception();
    }
    if (!error) break;
    const ErrorAction action = actionFor(error, config.auto_reset);
    {
      // Under the submit lock no request is half enqueued: every one in the
      // queues now was enqueued before the error and gets it.
      std::lock_guard lock(submit_mutex);
      replica.session->failQueuedEntries(error);
      error_pending[r].store(false, std::memory_order_release);
      error_handled.notify_all();
      if (closing.load(std::memory_order_relaxed)) break;
      if (action == ErrorAction::kStop) {
        replica.failure = error;
        replica.running = false;
        return;
      }
    }
    if (action == ErrorAction::kResetDevice) {
      try {
        resetReplica(replica);
      } catch (...) {
        std::lock_guard lock(submit_mutex);
        replica.session->failQueuedEntries(std::current_exception());
        replica.failure = std::current_exception();
        replica.running = false;
        return;
      }
    }
  }
  std::lock_guard lock(submit_mutex);
  replica.running = false;
}

ModelRunner::ModelRunner(const std::filesystem::path& package, ModelRunnerConfig config)
    : ModelRunner(std::make_shared<const PackageReader>(package), std::move(config)) {}

ModelRunner::ModelRunner(const std::vector<std::filesystem::path>& packages, ModelRunnerConfig config)
    : ModelRunner(std::make_shared<const PackageReader>(packages), std::move(config)) {}

ModelRunner::ModelRunner(std::shared_ptr<const PackageReader> package, ModelRunnerConfig config)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (!package) throw UsageError("ModelRunner needs a package");
  m.package = std::move(package);
  m.config = std::move(config);
  const uint32_t n = m.config.replication_factor;
  if (n == 0) throw UsageError("replication_factor must be at least 1");
  if (m.config.ring_buffer_size_multiplier == 0) throw UsageError("ring_buffer_size_multiplier must be at least 1");
  if (m.config.statistics_sample_every == 0) throw UsageError("statistics_sample_every must be at least 1");
  if (!(m.config.adaptive_timeout >= 0)) throw UsageError("adaptive_timeout must be a fraction >= 0");
  m.counters.timed_every = m.config.statistics_sample_every;
  const Metadata& metadata = chooseMetadata(*m.package, m.config.model);
  if (metadata.replication_factor > 1 && metadata.replication_factor != n) {
    throw UsageError(fmt::format("the model was compiled for {} replicas; ModelRunnerConfig::replication_factor is {}",
                                 metadata.replication_factor, n));
  }
  m.lockstep = metadata.replication_factor > 1;

  DeviceManager* manager = m.config.device_manager;
  if (manager == nullptr) {
    m.own_manager = std::make_unique<DeviceManager>();
    manager = m.own_manager.get();
  }
  DeviceConstraints constraints;
  constraints.kind = m.config.device_kind;
  const DeviceKind kind = m.config.device_kind.value_or(parseDeviceKind(metadata.target.device_kind));
  if (kind == DeviceKind::kCpu && n > 1) {
    constraints.cpu_threads = std::max(1u, std::thread::hardware_concurrency() / n);
  }
  SessionOptions session_options;
  session_options.timeout = m.config.timeout_ns;
  session_options.adaptive_timeout = m.config.adaptive_timeout;
  session_options.flush_callback = m.config.flush_callback;
  session_options.pipeline_depth = m.config.pipeline_depth;
  session_options.executable.threads = m.config.threads;
  session_options.executable.flush_denormals = m.config.flush_denormals;
  m.replicas.resize(n);
  m.error_pending = std::make_unique<std::atomic<bool>[]>(n);
  for (uint32_t r = 0; r < n; ++r) {
    m.replicas[r].device = manager->getDevice(metadata.target, constraints, m.config.device_wait_config);
    session_options.on_failure = [&m, r](const std::exception_ptr&) {
      m.error_pending[r].store(true, std::memory_order_release);
    };
    m.replicas[r].session =
        std::make_unique<Session>(m.package, m.replicas[r].device, session_options, m.config.model);
  }
  Session& first = *m.replicas[0].session;
  m.inputs = first.userInputs();
  m.outputs = first.userOutputs();
  if (m.outputs.empty()) throw UsageError("the model has no outputs to run for");
  const uint32_t batch_dim = m.config.batching_dim;
  for (const Anchor& anchor : m.inputs) {
    m.input_layouts.push_back(queueLayoutOf(anchor.info, batch_dim));
    m.input_per_replica.push_back(m.lockstep && anchor.is_per_replica);
  }
  for (const Anchor& anchor : m.outputs) {
    m.output_layouts.push_back(queueLayoutOf(anchor.info, batch_dim));
    m.output_per_replica.push_back(m.lockstep && anchor.is_per_replica);
  }
  uint64_t batch_rows = 1;
  for (const QueueLayout& layout : m.input_layouts) batch_rows = std::max(batch_rows, layout.batch_rows);
  const size_t capacity = std::max<size_t>(2, m.config.ring_buffer_size_multiplier * batch_rows);
  for (uint32_t r = 0; r < n; ++r) {
    Session& session = *m.replicas[r].session;
    session.runLoadPrograms();
    m.replicas[r].queues = &session.createQueueManager(capacity, batch_dim);
  }
  try {
    std::lock_guard lock(m.submit_mutex);
    for (uint32_t r = 0; r < n; ++r) m.start(r);
  } catch (...) {
    // No joinable thread may be destroyed: stop the replicas started.
    m.shutdown();
    throw;
  }
}

ModelRunner::~ModelRunner() { impl_->shutdown(); }

void ModelRunner::Impl::shutdown() {
  Impl& m = *this;
  {
    std::lock_guard lock(m.submit_mutex);
    m.closing.store(true, std::memory_order_release);
    m.error_handled.notify_all();
  }
  for (auto& replica : m.replicas) {
    if (replica.session) replica.session->stop();
  }
  for (auto& replica : m.replicas) {
    if (replica.thread.joinable()) replica.thread.join();
  }
  // No request may wait forever on a runner that is gone.
  const auto gone = std::make_exception_ptr(UsageError("the ModelRunner was destroyed before the request ran"));
  std::lock_guard lock(m.submit_mutex);
  for (auto& replica : m.replicas) {
    if (replica.session) replica.session->failQueuedEntries(gone);
  }
}

std::vector<int64_t> ModelRunner::Impl::outputShape(size_t j, uint64_t rows) const {
  std::vector<int64_t> shape = outputs[j].info.shape;
  if (config.batching_dim != kNoBatchDim) {
    shape[config.batching_dim] = static_cast<int64_t>(rows);
  } else if (!shape.empty()) {
    shape[0] *= static_cast<int64_t>(rows);
  }
  if (output_per_replica[j]) shape.insert(shape.begin(), replicaCount());
  return shape;
}

namespace {

std::vector<DataDesc> describe(const std::vector<Anchor>& anchors, const std::vector<bool>& per_replica, uint32_t n) {
  std::vector<DataDesc> result;
  for (size_t i = 0; i < anchors.size(); ++i) {
    DataDesc desc{anchors[i].name, anchors[i].info.shape, anchors[i].info.dtype, anchors[i].info.sizeInBytes()};
    if (per_replica[i]) {
      desc.shape.insert(desc.shape.begin(), n);
      desc.size_in_bytes *= n;
    }
    result.push_back(std::move(desc));
  }
  return result;
}

}  // namespace

std::vector<DataDesc> ModelRunner::getExecuteInputs() const {
  return describe(impl_->inputs, impl_->input_per_replica, impl_->replicaCount());
}
std::vector<DataDesc> ModelRunner::getExecuteOutputs() const {
  return describe(impl_->outputs, impl_->output_per_replica, impl_->replicaCount());
}

// Checks a request against the anchors; returns its rows (in queue-layout
// rows: whole tensors without batching_dim).
uint64_t ModelRunner::Impl::validate(const InputMemoryView& in, const OutputMemoryView* out) const {
  const bool batching = config.batching_dim != kNoBatchDim;
  std::optional<uint64_t> rows;
  std::string rows_from;
  std::vector<std::string> missing;
  auto check = [&](const Anchor& anchor, const QueueLayout& layout, bool per_replica, const void* data, uint64_t bytes,
                   DType dtype, const char* what) {
    if (dtype != DType::kUndefined && dtype != anchor.info.dtype) {
      throw UsageError(fmt::format("{} '{}' is {}, the request gives {}", what, anchor.name,
                                   dtypeName(anchor.info.dtype), dtypeName(dtype)));
    }
    if (data == nullptr) throw UsageError(fmt::format("{} '{}': the request gives no memory (null)", what, anchor.name));
    const uint64_t copies = per_replica ? replicaCount() : 1;
    const uint64_t row = layout.bytesOf(1) * copies;
    if (row == 0) {
      // An empty tensor ([0, 4]): it holds no data and has no say in how
      // many rows the request has (dividing by its size crashed).
      if (bytes != 0) {
        throw UsageError(fmt::format("{} '{}' ({}) holds no data, but the request gives {} bytes", what, anchor.name,
                                     anchor.info.toString(), bytes));
      }
      return;
    }
    if (bytes == 0 || bytes % row != 0) {
      if (batching) {
        throw UsageError(fmt::format("{} '{}' ({}) has {} bytes: not a whole number of rows of {} bytes on batching "
                                     "dimension {}",
                                     what, anchor.name, anchor.info.toString(), bytes, row, config.batching_dim));
      }
      throw UsageError(fmt::format("{} '{}' has {} bytes; without batching_dim a request holds a whole number of "
                                   "compiled tensors of {} bytes ({}); set batching_dim for other batch sizes",
                                   what, anchor.name, bytes, row, anchor.info.toString()));
    }
    const uint64_t found = bytes / row;
    if (rows && *rows != found) {
      throw UsageError(fmt::format("the request's anchors disagree on the batch: '{}' has {} {} and '{}' has {}",
                                   rows_from, *rows, batching ? "rows" : "compiled batches", anchor.name, found));
    }
    rows = found;
    rows_from = anchor.name;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto found = in.find(inputs[i].name);
    if (found == in.end()) {
      missing.push_back(inputs[i].name);
      continue;
    }
    check(inputs[i], input_layouts[i], input_per_replica[i], found->second.data, found->second.bytes,
          found->second.dtype, "input");
  }
  if (out != nullptr) {
    for (size_t j = 0; j < outputs.size(); ++j) {
      const auto found = out->find(outputs[j].name);
      if (found == out->end()) {
        missing.push_back(outputs[j].name);
        continue;
      }
      check(outputs[j], output_layouts[j], output_per_replica[j], found->second.data, found->second.bytes,
            found->second.dtype, "output");
    }
  }
  if (config.validate_io_params) {
    std::vector<std::string> extra;
    auto known = [](const std::vector<Anchor>& anchors, const std::string& name) {
      return std::any_of(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.name == name; });
    };
    for (const auto& entry : in) {
      if (!known(inputs, entry.first)) extra.push_back(entry.first);
    }
    if (out != nullptr) {
      for (const auto& entry : *out) {
        if (!known(outputs, entry.first)) extra.push_back(entry.first);
      }
    }
    if (!missing.empty() || !extra.empty()) {
      std::vector<std::string> expected;
      for (const Anchor& a : inputs) expected.push_back("input " + a.name);
      if (out != nullptr) {
        for (const Anchor& a : outputs) expected.push_back("output " + a.name);
      }
      throw UsageError(fmt::format("the request does not match the model's anchors: missing [{}], unknown [{}]; "
                                   "expected [{}] (turn validate_io_params off to give only a sub-model's anchors)",
                                   fmt::join(missing, ", "), fmt::join(extra, ", "), fmt::join(expected, ", ")));
    }
  }
  if (!rows) {
    // Nothing to size the request by: one device batch.
    uint64_t batch_rows = 1;
    for (const QueueLayout& layout : input_layouts) batch_rows = std::max(batch_rows, layout.batch_rows);
    rows = batching ? batch_rows : 1;
  }
  return *rows;
}

std::exception_ptr ModelRunner::Impl::pickReplica(uint32_t& target) {
  const uint32_t n = replicaCount();
  if (lockstep) {
    // Every replica runs every request: one stopped replica stops them all.
    target = 0;
    for (const Replica& replica : replicas) {
      if (replica.failure) return replica.failure;
    }
    return nullptr;
  }
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t r = static_cast<uint32_t>((next_replica + k) % n);
    if (!replicas[r].failure) {
      target = r;
      return nullptr;
    }
  }
  return replicas[next_replica % n].failure;  // all stopped
}

TensorQueue* ModelRunner::Impl::fullQueue(uint32_t r) const {
  for (const auto& queue : replicas[r].queues->inputQueues()) {
    if (queue->full()) return queue.get();
  }
  for (const auto& queue : replicas[r].queues->outputQueues()) {
    if (queue->full()) return queue.get();
  }
  return nullptr;
}

// Enqueues the request's entries, chunk by chunk; each chunk goes into
// every queue of its replica at once under the submit lock, after waiting
// (unlocked) until all those queues have room, so that a failing replica
// can always take the lock and no request is ever half enqueued. A chunk
// goes to the next replica in turn that is serving and has room now; it
// waits only when none has (so one replica that resets or lags does not
// hold every caller up).
bool ModelRunner::Impl::submit(const InputMemoryView& in, const OutputMemoryView& out, RequestState* request,
                               uint64_t rows, bool try_only) {
  const uint32_t n = replicaCount();
  uint64_t chunk_rows = rows;
  if (!lockstep && n > 1) {
    chunk_rows = 1;
    for (const QueueLayout& layout : input_layouts) chunk_rows = std::max(chunk_rows, layout.batch_rows);
  }
  for (uint64_t first = 0; first < rows; first += chunk_rows) {
    const uint64_t take = std::min(chunk_rows, rows - first);
    for (;;) {
      std::unique_lock lock(submit_mutex);
      if (closing.load(std::memory_order_acquire) || draining) {
        lock.unlock();
        request->answer(std::make_exception_ptr(UsageError(draining ? "the ModelRunner is draining: it takes no new requests"
                                                                    : "the ModelRunner is shutting down")),
                        take * outputs.size() * (lockstep ? n : 1));
        break;
      }
      uint32_t target = 0;
      if (std::exception_ptr stopped = pickReplica(target)) {
        lock.unlock();
        request->answer(stopped, take * outputs.size() * (lockstep ? n : 1));
        break;
      }
      if (!lockstep) {
        for (uint32_t k = 0; k < n; ++k) {
          const uint32_t r = (target + k) % n;
          if (!replicas[r].failure && !error_pending[r].load(std::memory_order_acquire) && fullQueue(r) == nullptr) {
            target = r;
            break;
          }
        }
      }
      const uint32_t last = lockstep ? n : target + 1;
      bool pending = false;
      TensorQueue* full = nullptr;
      for (uint32_t r = target; r < last; ++r) {
        pending |= error_pending[r].load(std::memory_order_acquire);
        if (full == nullptr) full = fullQueue(r);
      }
      if ((pending || full != nullptr) && try_only && first == 0) return false;
      if (pending) {
        error_handled.wait(lock);
        continue;
      }
      if (full != nullptr) {
        lock.unlock();
        full->waitForRoom();
        continue;
      }
      for (uint32_t r = target; r < last; ++r) {
        QueueManager& queues = *replicas[r].queues;
        for (size_t i = 0; i < inputs.size(); ++i) {
          const QueueLayout& layout = input_layouts[i];
          const auto found = in.find(inputs[i].name);
          std::byte* data = nullptr;
          if (found != in.end()) {
            data = const_cast<std::byte*>(static_cast<const std::byte*>(found->second.data));
            if (input_per_replica[i]) data += r * (found->second.bytes / n);
            data += first * layout.row_bytes;
          }
          queues.inputQueues()[i]->enqueue(QueueEntry{.data = data, .rows = take, .outer_stride = rows * layout.row_bytes,
                                                      .done = nullptr, .context = nullptr,
                                                      .admission = &request->admission});
        }
        for (size_t j = 0; j < outputs.size(); ++j) {
          const QueueLayout& layout = output_layouts[j];
          const auto found = out.find(outputs[j].name);
          std::byte* data = nullptr;
          // Without per-replica outputs, replica 0's result is the answer.
          if (found != out.end() && (!lockstep || output_per_replica[j] || r == 0)) {
            data = static_cast<std::byte*>(found->second.data);
            if (output_per_replica[j]) data += r * (found->second.bytes / n);
            data += first * layout.row_bytes;
          }
          queues.outputQueues()[j]->enqueue(QueueEntry{.data = data, .rows = take, .outer_stride = rows * layout.row_bytes,
                                                       .done = &RequestState::rowsDone, .context = request,
                                                       .admission = &request->admission});
        }
      }
      next_replica = target + 1;
      break;
    }
  }
  return true;
}

namespace {

// Marks one call in progress when the runner is not thread-safe.
class CallGuard {
 public:
  CallGuard(std::atomic<bool>& in_call, bool thread_safe) : in_call_(thread_safe ? nullptr : &in_call) {
    if (in_call_ != nullptr && in_call_->exchange(true, std::memory_order_acquire)) {
      in_call_ = nullptr;
      throw UsageError("ModelRunner: two threads called execute at once but the runner was built with "
                       "thread_safe = false");
    }
  }
  ~CallGuard() {
    if (in_call_ != nullptr) in_call_->store(false, std::memory_order_release);
  }

 private:
  std::atomic<bool>* in_call_;
};

}  // namespace

// The two kinds of request, blocking or not: validated, then enqueued.
RequestState* ModelRunner::Impl::newRequest(uint64_t rows, const RequestOptions& options) {
  auto* state = new RequestState(rows * outputs.size() * (lockstep ? replicaCount() : 1));
  state->admission.deadline = options.deadline;
  state->on_complete = options.on_complete;
  state->counters = &counters;
  if (counters.timeNext()) {
    state->admission.timed = true;
    state->submitted_at = std::chrono::steady_clock::now();
  }
  counters.in_flight.fetch_add(1, std::memory_order_relaxed);
  return state;
}

template <typename T>
std::optional<Future<T>> ModelRunner::Impl::enqueue(Future<T> future, RequestState* state, const InputMemoryView& in,
                                                    const OutputMemoryView& out, uint64_t rows, bool try_only) {
  if (!submit(in, out, state, rows, try_only)) {
    // Nothing was enqueued: the request never was. The Future lets go of
    // its reference as it goes out of scope, the runner of its own here.
    counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    counters.refused.fetch_add(1, std::memory_order_relaxed);
    state->release();
    return std::nullopt;
  }
  counters.submitted.fetch_add(1, std::memory_order_relaxed);
  return future;
}

std::optional<Future<void>> ModelRunner::Impl::request(const InputMemoryView& in, const OutputMemoryView& out,
                                                       const RequestOptions& options, bool try_only) {
  CallGuard guard(in_call, config.thread_safe);
  const uint64_t rows = validate(in, &out);
  RequestState* state = newRequest(rows, options);
  return enqueue(Future<void>(state), state, in, out, rows, try_only);
}

std::optional<Future<OutputTensors>> ModelRunner::Impl::request(const InputMemoryView& in, const RequestOptions& options,
                                                                bool try_only) {
  CallGuard guard(in_call, config.thread_safe);
  const uint64_t rows = validate(in, nullptr);
  RequestState* state = newRequest(rows, options);
  Future<OutputTensors> result(state);
  OutputMemoryView views;
  for (size_t j = 0; j < outputs.size(); ++j) {
    HostTensor& tensor = state->tensors[outputs[j].name];
    tensor.info = TensorInfo{outputs[j].info.dtype, outputShape(j, rows)};
    try {
      tensor.bytes.resize(tensor.info.sizeInBytes());
    } catch (const std::bad_alloc&) {
      counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
      state->release();  // the runner's reference: it will never answer (the Future lets go of its own)
      throw UsageError(fmt::format("cannot allocate the {} bytes of output '{}' ({}) for a request of {} rows",
                                   tensor.info.sizeInBytes(), outputs[j].name, tensor.info.toString(), rows));
    }
    views[outputs[j].name] = TensorMemoryView{tensor.bytes.data(), tensor.bytes.size(), tensor.info.dtype};
  }
  return enqueue(std::move(result), state, in, views, rows, try_only);
}

Future<void> ModelRunner::executeAsync(const InputMemoryView& inputs, const OutputMemoryView& outputs,
                                       const RequestOptions& options) {
  return std::move(*impl_->request(inputs, outputs, options, false));
}

Future<OutputTensors> ModelRunner::executeAsync(const InputMemoryView& inputs, const RequestOptions& options) {
  return std::move(*impl_->request(inputs, options, false));
}

std::optional<Future<void>> ModelRunner::tryExecuteAsync(const InputMemoryView& inputs,
                                                         const OutputMemoryView& outputs,
                                                         const RequestOptions& options) {
  return impl_->request(inputs, outputs, options, true);
}

std::optional<Future<OutputTensors>> ModelRunner::tryExecuteAsync(const InputMemoryView& inputs,
                                                                  const RequestOptions& options) {
  return impl_->request(inputs, options, true);
}

bool ModelRunner::drain(std::chrono::nanoseconds bound) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.submit_mutex);
    m.draining = true;
  }
  // Requests taken before are answered; partial batches need not wait for
  // their timeout.
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    if (m.counters.in_flight.load(std::memory_order_acquire) == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    for (auto& replica : m.replicas) replica.queues->flushAll();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool ModelRunner::isReady() const {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.submit_mutex);
    if (m.draining || m.closing.load(std::memory_order_relaxed)) return false;
  }
  const uint32_t serving = replicasServing();
  return m.lockstep ? serving == m.replicaCount() : serving > 0;
}

RunnerStatistics ModelRunner::statistics() const {
  const Impl& m = *impl_;
  const RunnerCounters& c = m.counters;
  auto load = [](const std::atomic<uint64_t>& counter) { return counter.load(std::memory_order_relaxed); };
  RunnerStatistics stats;
  stats.submitted = load(c.submitted);
  stats.refused = load(c.refused);
  stats.in_flight = load(c.in_flight);
  stats.succeeded = load(c.succeeded);
  stats.cancelled = load(c.cancelled);
  stats.deadline_exceeded = load(c.deadline_exceeded);
  stats.usage_errors = load(c.usage_errors);
  stats.application_errors = load(c.application_errors);
  stats.recoverable_errors = load(c.recoverable_errors);
  stats.unknown_errors = load(c.unknown_errors);
  for (const auto& replica : m.replicas) {
    stats.batches_run += replica.session->batchesRun();
    stats.batches_flushed += replica.session->batchesFlushed();
    const std::vector<uint64_t> histogram = replica.session->batchRowsHistogram();
    if (stats.rows_histogram.size() < histogram.size()) stats.rows_histogram.resize(histogram.size());
    for (size_t k = 0; k < histogram.size(); ++k) stats.rows_histogram[k] += histogram[k];
  }
  stats.timed = load(c.timed);
  stats.queue_seconds = static_cast<double>(load(c.queue_ns)) * 1e-9;
  stats.run_seconds = static_cast<double>(load(c.run_ns)) * 1e-9;
  stats.max_queue_seconds = static_cast<double>(load(c.max_queue_ns)) * 1e-9;
  stats.max_run_seconds = static_cast<double>(load(c.max_run_ns)) * 1e-9;
  for (size_t b = 0; b < stats.queue_histogram.size(); ++b) {
    stats.queue_histogram[b] = load(c.queue_histogram[b]);
    stats.run_histogram[b] = load(c.run_histogram[b]);
  }
  return stats;
}

OutputTensors ModelRunner::execute(const InputMemoryView& inputs) { return executeAsync(inputs).get(); }

void ModelRunner::execute(const InputMemoryView& inputs, const OutputMemoryView& outputs) {
  executeAsync(inputs, outputs).get();
}

void ModelRunner::reset() {
  Impl& m = *impl_;
  std::lock_guard serialised(m.reset_mutex);
  std::exception_ptr first_error;
  for (uint32_t r = 0; r < m.replicaCount(); ++r) {
    Impl::Replica& replica = m.replicas[r];
    {
      // An error being handled (reported to its requests, the replica not
      // yet marked) is waited for: its thread then resets the replica or
      // marks it stopped under this lock. A replica still serving after
      // that is healthy (one that fails later waits for the next reset());
      // only a stopped replica's failure is cleared.
      std::unique_lock lock(m.submit_mutex);
      m.error_handled.wait(lock, [&] {
        return !m.error_pending[r].load(std::memory_order_acquire) || m.closing.load(std::memory_order_relaxed);
      });
      if (replica.running) continue;
    }
    if (replica.thread.joinable()) replica.thread.join();
    try {
      m.resetReplica(replica);
    } catch (...) {
      std::lock_guard lock(m.submit_mutex);
      replica.failure = std::current_exception();
      if (!first_error) first_error = replica.failure;
      continue;  // stays out of rotation; the others still get reset
    }
    std::lock_guard lock(m.submit_mutex);
    replica.failure = nullptr;
    m.start(r);
  }
  if (first_error) std::rethrow_exception(first_error);
}

uint32_t ModelRunner::replicasServing() const {
  Impl& m = *impl_;
  std::lock_guard lock(m.submit_mutex);
  uint32_t serving = 0;
  for (uint32_t r = 0; r < m.replicaCount(); ++r) {
    // A replica whose error is being handled (error_pending, set before any
    // request sees the error) is not serving now either.
    const Impl::Replica& replica = m.replicas[r];
    if (replica.running && !replica.failure && !m.error_pending[r].load(std::memory_order_acquire)) ++serving;
  }
  return serving;
}

uint64_t ModelRunner::resets() const { return impl_->resets.load(std::memory_order_relaxed); }
uint64_t ModelRunner::batchesRun() const {
  uint64_t total = 0;
  for (const auto& replica : impl_->replicas) total += replica.session->batchesRun();
  return total;
}
uint64_t ModelRunner::batchesFlushed() const {
  uint64_t total = 0;
  for (const auto& replica : impl_->replicas) total += replica.session->batchesFlushed();
  return total;
}
const ModelRunnerConfig& ModelRunner::config() const { return impl_->config; }
std::vector<std::string> ModelRunner::deviceIds() const {
  std::vector<std::string> ids;
  for (const auto& replica : impl_->replicas) ids.push_back(replica.device->id());
  return ids;
}

uint64_t ModelRunner::deviceMemoryInUse() const {
  uint64_t bytes = 0;
  std::vector<const Device*> counted;  // replicas may share a device
  for (const auto& replica : impl_->replicas) {
    if (std::find(counted.begin(), counted.end(), replica.device.get()) != counted.end()) continue;
    counted.push_back(replica.device.get());
    bytes += replica.device->memoryInUse();
  }
  return bytes;
}

}  // namespace kiln
