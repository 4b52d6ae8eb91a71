#include "kiln/session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "runtime/main_loop.h"

namespace kiln {

struct Session::Impl {
  std::shared_ptr<const PackageReader> package;
  SessionOptions options;
  std::unique_ptr<Executable> executable;
  std::vector<MainInputSource> input_sources;  // per executable main input
  std::vector<Anchor> user_inputs;
  std::vector<Anchor> user_outputs;
  std::map<std::string, std::span<const std::byte>> user_load_bytes;  // excluded load anchors
  std::vector<std::string> excluded_load;
  std::unique_ptr<QueueManager> queues;
  std::unique_ptr<MainLoop> loop;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> flushed{0};
  std::unique_ptr<std::atomic<uint64_t>[]> rows_histogram;  // batch rows + 1 counters
  uint64_t histogram_size = 0;

  bool excluded(const Anchor& anchor) const {
    for (const auto& predicate : options.exclude_from_binding) {
      if (predicate && predicate(anchor)) return true;
    }
    return false;
  }
};

Session::Session(std::shared_ptr<const PackageReader> package, std::shared_ptr<Device> device, SessionOptions options,
                 const std::string& model)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (options.pipeline_depth < 1 || options.pipeline_depth > SessionOptions::kMaxPipelineDepth) {
    throw UsageError(fmt::format("pipeline_depth is {}; it must be 1 to {}", options.pipeline_depth,
                                 SessionOptions::kMaxPipelineDepth));
  }
  m.package = package;
  m.options = std::move(options);
  m.executable = std::make_unique<Executable>(std::move(package), model, std::move(device), m.options.executable);
  for (const Anchor& anchor : m.executable->loadAnchors()) {
    if (!m.package->isPackageProvided(anchor) || m.excluded(anchor)) m.excluded_load.push_back(anchor.name);
  }
  for (const Anchor& anchor : m.executable->mainInputs()) {
    MainInputSource source;
    const bool provided = m.package->isPackageProvided(anchor) && !m.excluded(anchor);
    if (provided) {
      if (const TensorDataBlob* tensor = m.package->findTensorData(anchor.name)) {
        source.tensor = tensor->data();
      } else {
        source.feed = m.package->findFeedData(anchor.name);
        if (source.feed->count() == 0) throw UsageError("FeedData '" + anchor.name + "' holds no items");
      }
    } else {
      if (!anchor.info.isStatic()) {
        throw UsageError(fmt::format("input '{}' of model '{}' has a dynamic shape {}; the runtime runs static shapes",
                                     anchor.name, m.executable->name(), anchor.info.shapeString()));
      }
      source.queue = static_cast<int>(m.user_inputs.size());
      m.user_inputs.push_back(anchor);
    }
    m.input_sources.push_back(source);
  }
  m.user_outputs = m.executable->mainOutputs();
}

Session::~Session() { stop(); }

Executable& Session::executable() { return *impl_->executable; }
Device& Session::device() { return impl_->executable->device(); }
const std::vector<Anchor>& Session::userInputs() const { return impl_->user_inputs; }
const std::vector<Anchor>& Session::userOutputs() const { return impl_->user_outputs; }
std::vector<std::string> Session::unboundLoadAnchors() const { return impl_->excluded_load; }
QueueManager* Session::queueManager() { return impl_->queues.get(); }
uint64_t Session::batchesRun() const { return impl_->batches.load(std::memory_order_relaxed); }
uint64_t Session::batchesFlushed() const { return impl_->flushed.load(std::memory_order_relaxed); }
std::vector<uint64_t> Session::batchRowsHistogram() const {
  std::vector<uint64_t> histogram(impl_->histogram_size);
  for (size_t k = 0; k < histogram.size(); ++k) histogram[k] = impl_->rows_histogram[k].load(std::memory_order_relaxed);
  return histogram;
}

void Session::bindTensor(const std::string& anchor, std::span<const std::byte> bytes) {
  Impl& m = *impl_;
  for (const Anchor& load : m.executable->loadAnchors()) {
    if (load.name != anchor) continue;
    if (bytes.size() != load.info.sizeInBytes()) {
      throw UsageError(fmt::format("bindTensor('{}'): the anchor is {}, got {} bytes", anchor, load.info.toString(),
                                   bytes.size()));
    }
    m.user_load_bytes[anchor] = bytes;
    return;
  }
  throw UsageError(fmt::format("bindTensor('{}'): model '{}' has no load anchor of that name", anchor,
                               m.executable->name()));
}

void Session::runLoadPrograms() {
  Impl& m = *impl_;
  std::vector<std::string> missing;
  for (const std::string& name : m.excluded_load) {
    if (!m.user_load_bytes.contains(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    throw UsageError(fmt::format("model '{}': load anchors {} are not bound by the package (or excluded from binding) "
                                 "and were not given with bindTensor()",
                                 m.executable->name(), fmt::join(missing, ", ")));
  }
  m.executable->runLoad([&](const Anchor& anchor) -> std::span<const std::byte> {
    const auto user = m.user_load_bytes.find(anchor.name);
    if (user != m.user_load_bytes.end()) return user->second;
    if (const TensorDataBlob* tensor = m.package->findTensorData(anchor.name)) return tensor->data();
    return m.package->findFeedData(anchor.name)->item(0);
  });
}

QueueManager& Session::createQueueManager(size_t capacity, uint32_t batch_dim) {
  Impl& m = *impl_;
  if (m.loop) throw UsageError("createQueueManager() while the main programs run: stop() first");
  std::vector<QueueLayout> input_layouts;
  std::vector<QueueLayout> output_layouts;
  auto layout = [&](const Anchor& anchor) {
    return queueLayoutOf(anchor.info, batch_dim == kAnchorBatchDim ? anchor.batch_dim : batch_dim);
  };
  for (const Anchor& anchor : m.user_inputs) input_layouts.push_back(layout(anchor));
  for (const Anchor& anchor : m.user_outputs) output_layouts.push_back(layout(anchor));
  // The main loop takes rows from all queues in step.
  auto check = [&](const std::vector<Anchor>& anchors, const std::vector<QueueLayout>& layouts) {
    for (size_t i = 0; i < anchors.size(); ++i) {
      const QueueLayout& first = input_layouts.empty() ? output_layouts.front() : input_layouts.front();
      const std::string& first_name = m.user_inputs.empty() ? m.user_outputs.front().name : m.user_inputs.front().name;
      if (layouts[i].batch_rows != first.batch_rows) {
        throw UsageError(fmt::format("anchors '{}' and '{}' have batches of {} and {} rows; the queues of one session "
                                     "must batch alike (choose batch_dim)",
                                     first_name, anchors[i].name, first.batch_rows, layouts[i].batch_rows));
      }
    }
  };
  check(m.user_inputs, input_layouts);
  check(m.user_outputs, output_layouts);
  m.queues = std::make_unique<QueueManager>(m.user_inputs, m.user_outputs, input_layouts, output_layouts, capacity);
  m.histogram_size = 1 + (!input_layouts.empty()    ? input_layouts.front().batch_rows
                          : !output_layouts.empty() ? output_layouts.front().batch_rows
                                                    : 1);
  m.rows_histogram = std::make_unique<std::atomic<uint64_t>[]>(m.histogram_size);
  return *m.queues;
}

void Session::runMainPrograms() {
  Impl& m = *impl_;
  if (!m.executable->loaded()) {
    throw UsageError(fmt::format("model '{}': run the load programs first (again after a device reset)",
                                 m.executable->name()));
  }
  if (!m.queues) throw UsageError("runMainPrograms() needs a QueueManager: call createQueueManager() first");
  if (m.loop) throw UsageError("runMainPrograms() is already running");
  MainLoopConfig config;
  config.executable = m.executable.get();
  config.queues = m.queues.get();
  config.inputs = m.input_sources;
  for (size_t j = 0; j < m.user_outputs.size(); ++j) config.outputs.push_back(static_cast<int>(j));
  config.timeout = m.options.timeout;
  config.adaptive_timeout = m.options.adaptive_timeout;
  config.flush_callback = &m.options.flush_callback;
  config.on_failure = &m.options.on_failure;
  config.depth = m.options.pipeline_depth;
  config.batches = &m.batches;
  config.flushed = &m.flushed;
  config.rows_histogram = m.rows_histogram.get();
  m.loop = std::make_unique<MainLoop>(std::move(config));
  // A stop() that came before this call counts (a runner may stop before
  // its serving thread got here); it is used up when the loop ends.
  struct Finish {
    Impl& m;
    ~Finish() {
      m.loop.reset();
      m.stop.store(false, std::memory_order_release);
    }
  } finish{m};
  m.loop->run(m.stop);
  if (m.queues->disconnected()) {
    failQueuedEntries(std::make_exception_ptr(UsageError("the session's queues were disconnected")));
  }
}

void Session::stop() {
  Impl& m = *impl_;
  m.stop.store(true, std::memory_order_release);
  if (m.queues) m.queues->activity().notifyAll();
}

void Session::failQueuedEntries(const std::exception_ptr& error) {
  Impl& m = *impl_;
  if (!m.queues) return;
  auto drain = [&](const std::vector<std::unique_ptr<TensorQueue>>& queues) {
    for (const auto& queue : queues) {
      while (QueueEntry* entry = queue->front()) {
        const QueueEntry taken = *entry;
        queue->pop();
        if (taken.done != nullptr) taken.done(taken.context, taken.rows, error);
      }
    }
  };
  drain(m.queues->inputQueues());
  drain(m.queues->outputQueues());
}

void Session::runSavePrograms(const SaveSink& sink) { impl_->executable->runSave(sink); }

}  // namespace kiln
