#include "runtime/main_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kiln/blob.h"
#include "kiln/error.h"
#include "runtime/device_internal.h"

namespace kiln {
namespace {

// A run of rows of one anchor inside the device batch: `rows` rows taken
// from user memory `data` (nullptr: flush data), whose outer blocks lie
// `stride` bytes apart, placed at row `row_offset` of the batch.
struct Part {
  std::byte* data;
  uint64_t rows;
  uint64_t stride;
  uint64_t row_offset;
};

struct Completion {
  void (*done)(void*, uint64_t, const std::exception_ptr&);
  void* context;
  uint64_t rows;
};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, FreeDeleter>;

HostBuffer allocateHost(uint64_t bytes) {
  HostBuffer buffer(device_internal::allocateAligned(bytes));  // checked rounding; null when too large
  if (!buffer) throw std::bad_alloc();
  return buffer;
}

// How long the loop polls empty queues before it sleeps.
constexpr std::chrono::microseconds kSpin(50);

// One anchor's gathering state within a batch.
struct Gathering {
  TensorQueue* queue;
  uint64_t need;
};

}  // namespace

struct MainLoop::Slot {
  MainLoop* loop = nullptr;
  std::chrono::steady_clock::time_point submitted;  // with an adaptive timeout only
  std::vector<std::vector<Part>> in_parts, out_parts;
  std::vector<DeviceBuffer> in_device, out_device;
  std::vector<HostBuffer> in_host, out_host;
  std::vector<const std::byte*> bound_in;
  std::vector<std::byte*> bound_out;
  std::vector<bool> out_direct;
  std::vector<Completion> completions;
  std::vector<DeviceJob> copies_in, copies_out;
  DeviceJob compute;
  std::atomic<size_t> pending{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  // The error is the caller's (its flush_callback threw or gave views of the
  // wrong size): it fails this batch's requests, not the session.
  bool caller_error = false;
  uint64_t padded_rows = 0;  // rows of this batch that flushRest padded
  std::atomic<bool> busy{false};
  std::vector<Gathering> gathering;  // inputs with a queue, then outputs
  std::vector<std::vector<Part>*> part_lists;  // the part list of each gathering

  void setError(const std::exception_ptr& e) {
    std::lock_guard lock(error_mutex);
    if (!error) error = e;
  }
};

// The device-thread side of a slot: each stage's last job starts the next.
struct SlotCallbacks {
  static void compute(void* context) {
    auto* slot = static_cast<MainLoop::Slot*>(context);
    slot->loop->config_.executable->runMain(slot->bound_in, slot->bound_out);
  }
  static void copyInDone(DeviceJob& job, std::exception_ptr error) {
    auto* slot = static_cast<MainLoop::Slot*>(job.owner);
    if (error) slot->setError(error);
    if (slot->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) startCompute(*slot);
  }
  static void startCompute(MainLoop::Slot& slot) {
    if (slot.error) return finish(slot);
    slot.loop->config_.executable->device().submit(slot.compute);
  }
  static void computeDone(DeviceJob& job, std::exception_ptr error) {
    auto* slot = static_cast<MainLoop::Slot*>(job.owner);
    if (error) slot->setError(error);
    if (slot->error || slot->copies_out.empty()) return finish(*slot);
    slot->pending.store(slot->copies_out.size(), std::memory_order_release);
    Device& device = slot->loop->config_.executable->device();
    for (DeviceJob& copy : slot->copies_out) device.submit(copy);
  }
  static void copyOutDone(DeviceJob& job, std::exception_ptr error) {
    auto* slot = static_cast<MainLoop::Slot*>(job.owner);
    if (error) slot->setError(error);
    if (slot->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(*slot);
  }
  // Answers every entry of the batch, then frees the slot.
  static void finish(MainLoop::Slot& slot) {
    MainLoop& loop = *slot.loop;
    // The loop may be destroyed as soon as the slot is free: waitIdle()
    // also waits for this count, whose decrement is the last access here.
    loop.finishing_.fetch_add(1, std::memory_order_relaxed);
    // Counted before the answers, so that a caller who got its result sees
    // its batch counted; a failure is recorded before the answers too, so
    // that a caller who saw the error finds the session failing.
    loop.config_.batches->fetch_add(1, std::memory_order_relaxed);
    if (loop.config_.adaptive_timeout > 0 && !slot.error) loop.recordBatchTime(slot.submitted);
    if (slot.error && !slot.caller_error) loop.recordFailure(slot.error);
    for (const Completion& completion : slot.completions) completion.done(completion.context, completion.rows, slot.error);
    slot.busy.store(false, std::memory_order_release);
    loop.slot_freed_.notifyAll();
    loop.finishing_.fetch_sub(1, std::memory_order_release);
  }
};

MainLoop::MainLoop(MainLoopConfig config) : config_(std::move(config)) {
  Executable& executable = *config_.executable;
  Device& device = executable.device();
  host_memory_ = device.usesHostMemory();
  const uint32_t depth = host_memory_ ? 1 : std::max<uint32_t>(config_.depth, 1);
  const auto& inputs = executable.mainInputs();
  const auto& outputs = executable.mainOutputs();
  const auto& input_queues = config_.queues->inputQueues();
  const auto& output_queues = config_.queues->outputQueues();

  size_t max_copies_in = 0;
  size_t max_copies_out = 0;
  size_t max_completions = 0;
  uint64_t widest_block = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int q = config_.inputs[i].queue;
    if (q < 0) {
      ++max_copies_in;
      continue;
    }
    const QueueLayout& layout = input_queues[q]->layout();
    max_copies_in += layout.batch_rows * layout.outer;
    max_completions += layout.batch_rows;
    widest_block = std::max(widest_block, layout.batch_rows * layout.row_bytes);
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    const QueueLayout& layout = output_queues[config_.outputs[j]]->layout();
    max_copies_out += layout.batch_rows * layout.outer;
    max_completions += layout.batch_rows;
  }
  if (!host_memory_) zeros_.assign(widest_block, std::byte{0});

  for (uint32_t s = 0; s < depth; ++s) {
    auto slot = std::make_unique<Slot>();
    slot->loop = this;
    slot->in_parts.resize(inputs.size());
    slot->out_parts.resize(outputs.size());
    slot->bound_in.resize(inputs.size());
    slot->bound_out.resize(outputs.size());
    slot->out_direct.resize(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint64_t bytes = inputs[i].info.sizeInBytes();
      if (host_memory_) {
        slot->in_host.push_back(allocateHost(bytes));
      } else {
        slot->in_device.push_back(device.allocate(std::max<uint64_t>(bytes, 1)));
      }
      const int q = config_.inputs[i].queue;
      if (q >= 0) slot->in_parts[i].reserve(input_queues[q]->layout().batch_rows);
    }
    for (size_t j = 0; j < outputs.size(); ++j) {
      const uint64_t bytes = outputs[j].info.sizeInBytes();
      if (host_memory_) {
        slot->out_host.push_back(allocateHost(bytes));
      } else {
        slot->out_device.push_back(device.allocate(std::max<uint64_t>(bytes, 1)));
      }
      slot->out_parts[j].reserve(output_queues[config_.outputs[j]]->layout().batch_rows);
    }
    slot->completions.reserve(max_completions);
    slot->copies_in.reserve(max_copies_in);
    slot->copies_out.reserve(max_copies_out);
    slot->gathering.reserve(inputs.size() + outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (config_.inputs[i].queue >= 0) slot->part_lists.push_back(&slot->in_parts[i]);
    }
    for (auto& list : slot->out_parts) slot->part_lists.push_back(&list);
    slot->compute.kind = DeviceJob::Kind::kCompute;
    slot->compute.compute = &SlotCallbacks::compute;
    slot->compute.context = slot.get();
    slot->compute.done = &SlotCallbacks::computeDone;
    slot->compute.owner = slot.get();
    slots_.push_back(std::move(slot));
  }
}

MainLoop::~MainLoop() { waitIdle(); }

void MainLoop::recordFailure(const std::exception_ptr& error) {
  bool first = false;
  {
    std::lock_guard lock(error_mutex_);
    if (!error_) {
      error_ = error;
      first = true;
    }
  }
  if (first && config_.on_failure != nullptr && *config_.on_failure) {
    // The caller's code, on a device thread: a throw must not terminate.
    try {
      (*config_.on_failure)(error);
    } catch (...) {
    }
  }
  failed_.store(true, std::memory_order_release);
  config_.queues->activity().notifyAll();
  slot_freed_.notifyAll();
}

void MainLoop::waitForSlot(Slot& slot) {
  while (slot.busy.load(std::memory_order_acquire)) {
    const uint32_t ticket = slot_freed_.prepareWait();
    if (!slot.busy.load(std::memory_order_acquire)) {
      slot_freed_.cancelWait();
      break;
    }
    slot_freed_.wait(ticket);
  }
}

void MainLoop::waitIdle() {
  for (auto& slot : slots_) waitForSlot(*slot);
  // A device thread may still be between freeing its slot and leaving.
  while (finishing_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

// Takes rows from the front entries of all queues in step: a row of the
// batch is taken only when every queue has it, so that the queues stay
// aligned (row k of every anchor belongs to the same request) even when a
// partial batch is flushed while a request is half enqueued. Every queue
// needs the same number of rows (createQueueManager checks the layouts).
// Returns true when it took any.
// Whether the request at the queues' fronts may run: a runner request
// starts here (kQueued -> kStarted) unless it was cancelled or its deadline
// passed (QueueAdmission).
static bool admit(QueueAdmission& admission) {
  uint8_t state = admission.state.load(std::memory_order_acquire);
  if (state == QueueAdmission::kQueued) {
    // The clock is read only when a deadline or the statistics need it.
    const bool has_deadline = admission.deadline != std::chrono::steady_clock::time_point::max();
    const auto now = has_deadline || admission.timed ? std::chrono::steady_clock::now()
                                                      : std::chrono::steady_clock::time_point{};
    uint8_t expected = QueueAdmission::kQueued;
    if (has_deadline && now >= admission.deadline) {
      admission.state.compare_exchange_strong(expected, QueueAdmission::kExpired, std::memory_order_acq_rel);
    } else {
      // Published by the kStarted store.
      admission.started.store(now.time_since_epoch().count(), std::memory_order_relaxed);
      admission.state.compare_exchange_strong(expected, QueueAdmission::kStarted, std::memory_order_acq_rel);
    }
    state = admission.state.load(std::memory_order_acquire);
  }
  return state == QueueAdmission::kStarted;
}

// Drops the not-admitted request at the queues' fronts from every queue,
// answering its entries; none of its memory is read or written.
static void dropFronts(std::vector<Gathering>& gathering, uint8_t state) {
  const std::exception_ptr error =
      state == QueueAdmission::kCancelled
          ? std::make_exception_ptr(RequestCancelledError("the request was cancelled before it ran"))
          : std::make_exception_ptr(DeadlineExceededError("the request's deadline passed before it ran"));
  for (Gathering& g : gathering) {
    const QueueEntry taken = *g.queue->front();
    g.queue->pop();
    if (taken.done != nullptr) taken.done(taken.context, taken.rows, error);
  }
}

static bool takeAvailable(std::vector<Gathering>& gathering, std::vector<std::vector<Part>*>& parts,
                          std::vector<Completion>& completions) {
  bool took = false;
  while (!gathering.empty() && gathering[0].need > 0) {
    uint64_t take = gathering[0].need;
    for (const Gathering& g : gathering) {
      const QueueEntry* entry = g.queue->front();
      if (entry == nullptr) return took;
      take = std::min(take, entry->rows);
    }
    // The fronts are one request's entries (the queues are filled and
    // taken in step): it runs whole or not at all.
    if (QueueAdmission* admission = gathering[0].queue->front()->admission; admission != nullptr && !admit(*admission)) {
      dropFronts(gathering, admission->state.load(std::memory_order_acquire));
      continue;
    }
    for (size_t k = 0; k < gathering.size(); ++k) {
      Gathering& g = gathering[k];
      const QueueLayout& layout = g.queue->layout();
      QueueEntry* entry = g.queue->front();
      const uint64_t stride = entry->outer_stride != 0 ? entry->outer_stride : entry->rows * layout.row_bytes;
      parts[k]->push_back(Part{entry->data, take, stride, layout.batch_rows - g.need});
      if (entry->done != nullptr) completions.push_back(Completion{entry->done, entry->context, take});
      g.need -= take;
      if (take == entry->rows) {
        g.queue->pop();
      } else {
        // The rest of the entry goes to the next batch.
        if (entry->data != nullptr) entry->data += take * layout.row_bytes;
        entry->rows -= take;
        entry->outer_stride = stride;
      }
    }
    took = true;
  }
  return took;
}

void MainLoop::flushRest(Slot& slot, const std::string& waiting_for, bool call_back) {
  const InputMemoryView* input_view = nullptr;
  const OutputMemoryView* output_view = nullptr;
  if (call_back && config_.flush_callback != nullptr && *config_.flush_callback) {
    try {
      (*config_.flush_callback)(waiting_for, input_view, output_view);
    } catch (const std::exception& e) {
      slot.setError(std::make_exception_ptr(UsageError(fmt::format("flush_callback threw: {}", e.what()))));
      slot.caller_error = true;
      input_view = nullptr;
      output_view = nullptr;
    } catch (...) {
      slot.setError(std::make_exception_ptr(UsageError("flush_callback threw a non-standard exception")));
      slot.caller_error = true;
      input_view = nullptr;
      output_view = nullptr;
    }
  }
  const size_t queued_inputs = slot.gathering.size() - slot.out_parts.size();
  size_t k = 0;
  auto fill = [&](std::vector<Part>& parts, Gathering& g, bool is_input) {
    if (g.need == 0) return;
    const QueueLayout& layout = g.queue->layout();
    slot.padded_rows = std::max(slot.padded_rows, g.need);
    std::byte* data = nullptr;
    uint64_t bytes = 0;
    bool given = false;
    if (is_input && input_view != nullptr) {
      const auto found = input_view->find(g.queue->name());
      if (found != input_view->end()) {
        data = const_cast<std::byte*>(static_cast<const std::byte*>(found->second.data));
        bytes = found->second.bytes;
        given = true;
      }
    } else if (!is_input && output_view != nullptr) {
      const auto found = output_view->find(g.queue->name());
      if (found != output_view->end()) {
        data = static_cast<std::byte*>(found->second.data);
        bytes = found->second.bytes;
        given = true;
      }
    }
    if (given && bytes != layout.bytesOf(g.need)) {
      slot.setError(std::make_exception_ptr(UsageError(
          fmt::format("flush_callback gave {} bytes for '{}'; the {} missing rows need {}", bytes, g.queue->name(),
                      g.need, layout.bytesOf(g.need)))));
      slot.caller_error = true;
      data = nullptr;
    }
    parts.push_back(Part{data, g.need, g.need * layout.row_bytes, layout.batch_rows - g.need});
    g.need = 0;
  };
  for (size_t i = 0; i < slot.in_parts.size(); ++i) {
    if (config_.inputs[i].queue < 0) continue;
    fill(slot.in_parts[i], slot.gathering[k++], true);
  }
  for (size_t j = 0; j < slot.out_parts.size(); ++j) fill(slot.out_parts[j], slot.gathering[queued_inputs + j], false);
  config_.flushed->fetch_add(1, std::memory_order_relaxed);
}

void MainLoop::recordBatchTime(std::chrono::steady_clock::time_point submitted) {
  const int64_t ran = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - submitted).count();
  // A moving average over about 4 batches; concurrent finishes may lose
  // an update, which only makes the average a little older.
  const int64_t average = batch_ns_.load(std::memory_order_relaxed);
  batch_ns_.store(average == 0 ? ran : (3 * average + ran) / 4, std::memory_order_relaxed);
}

std::chrono::nanoseconds MainLoop::batchTimeout(const Slot& slot, bool rows_waiting) {
  if (!(config_.adaptive_timeout > 0)) return config_.timeout;  // off (or not a number)
  // Signs of concurrent callers besides the last batch's requests: rows
  // that were waiting before this batch began came while the last one ran;
  // a batch still on the device holds other callers' requests.
  const bool other_running = std::any_of(slots_.begin(), slots_.end(), [&](const std::unique_ptr<Slot>& other) {
    return other.get() != &slot && other->busy.load(std::memory_order_acquire);
  });
  if (!concurrent_ && !rows_waiting && !other_running) return config_.timeout;
  // At most a minute, whatever the fraction: the product must fit.
  const double wait_ns = std::min(config_.adaptive_timeout * static_cast<double>(batch_ns_.load(std::memory_order_relaxed)),
                                  60e9);
  return std::max(config_.timeout, std::chrono::nanoseconds(static_cast<int64_t>(wait_ns)));
}

MainLoop::Gather MainLoop::gatherBatch(Slot& slot, const std::atomic<bool>& stop) {
  const auto& input_queues = config_.queues->inputQueues();
  const auto& output_queues = config_.queues->outputQueues();
  slot.completions.clear();
  slot.gathering.clear();
  slot.error = nullptr;
  slot.caller_error = false;
  slot.padded_rows = 0;
  for (size_t i = 0; i < slot.in_parts.size(); ++i) {
    slot.in_parts[i].clear();
    const int q = config_.inputs[i].queue;
    if (q < 0) continue;
    slot.gathering.push_back(Gathering{input_queues[q].get(), input_queues[q]->layout().batch_rows});
  }
  for (size_t j = 0; j < slot.out_parts.size(); ++j) {
    slot.out_parts[j].clear();
    TensorQueue* queue = output_queues[config_.outputs[j]].get();
    slot.gathering.push_back(Gathering{queue, queue->layout().batch_rows});
  }

  bool any = false;
  std::chrono::steady_clock::time_point started;
  // Rows waiting before the batch begins came while the last one ran: a
  // sign of concurrent callers for the adaptive timeout.
  const bool rows_waiting = !slot.gathering.empty() && slot.gathering[0].queue->front() != nullptr;
  std::chrono::nanoseconds timeout{0};
  auto complete = [&] {
    return std::all_of(slot.gathering.begin(), slot.gathering.end(), [](const Gathering& g) { return g.need == 0; });
  };
  auto waitingFor = [&]() -> std::string {
    for (const Gathering& g : slot.gathering) {
      if (g.need > 0) return g.queue->name();
    }
    return "";
  };
  for (;;) {
    any |= takeAvailable(slot.gathering, slot.part_lists, slot.completions);
    if (complete()) return Gather::kComplete;
    if (failed_.load(std::memory_order_acquire)) return Gather::kStopped;
    const bool stopping = stop.load(std::memory_order_acquire) || config_.queues->disconnected();
    if (stopping || config_.queues->takeFlushRequest()) {
      if (!any) {
        if (stopping) return Gather::kEmpty;
        continue;
      }
      flushRest(slot, waitingFor(), false);
      return stopping ? Gather::kStopped : Gather::kComplete;
    }
    std::chrono::nanoseconds remaining(-1);
    if (any) {
      // The clock starts when the batch is first found partial (a batch
      // that fills at once never reads it).
      if (started == std::chrono::steady_clock::time_point{}) {
        started = std::chrono::steady_clock::now();
        timeout = batchTimeout(slot, rows_waiting);
      }
      remaining = timeout - (std::chrono::steady_clock::now() - started);
      if (remaining.count() <= 0) {
        flushRest(slot, waitingFor(), true);
        return Gather::kComplete;
      }
    }
    // A spin of up to kSpin catches the next request of a busy caller
    // without a sleep (so its enqueue needs no system call to wake us);
    // then sleep until a queue, stop() or a failure says something.
    auto rowsReady = [&] {
      return std::all_of(slot.gathering.begin(), slot.gathering.end(),
                         [](const Gathering& g) { return g.queue->front() != nullptr; });
    };
    bool ready = false;
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    do {
      for (int spin = 0; spin < 64 && !ready; ++spin) ready = rowsReady();
    } while (!ready && std::chrono::steady_clock::now() < spin_until && !stop.load(std::memory_order_relaxed));
    if (ready) continue;
    EventCount& activity = config_.queues->activity();
    const uint32_t ticket = activity.prepareWait();
    bool wake = stop.load(std::memory_order_acquire) || config_.queues->disconnected() ||
                failed_.load(std::memory_order_acquire);
    wake |= rowsReady();
    if (wake) {
      activity.cancelWait();
      continue;
    }
    activity.wait(ticket, remaining);
  }
}

// The bytes of main input `i` that the package provides, for this batch.
static std::span<const std::byte> fedBytes(const MainInputSource& source, uint64_t batch) {
  if (source.feed != nullptr) return source.feed->item(batch % source.feed->count());
  return source.tensor;
}

static bool isWholeBatch(const std::vector<Part>& parts, const QueueLayout& layout) {
  return parts.size() == 1 && parts[0].data != nullptr && parts[0].rows == layout.batch_rows &&
         (layout.outer == 1 || parts[0].stride == layout.batch_rows * layout.row_bytes);
}

void MainLoop::runInline(Slot& slot) {
  const auto& input_queues = config_.queues->inputQueues();
  const auto& output_queues = config_.queues->outputQueues();
  if (!slot.error) {
    try {
      for (size_t i = 0; i < slot.in_parts.size(); ++i) {
        const MainInputSource& source = config_.inputs[i];
        if (source.queue < 0) {
          slot.bound_in[i] = fedBytes(source, feed_index_).data();
          continue;
        }
        const QueueLayout& layout = input_queues[source.queue]->layout();
        const std::vector<Part>& parts = slot.in_parts[i];
        if (isWholeBatch(parts, layout)) {
          slot.bound_in[i] = parts[0].data;  // zero copy
          continue;
        }
        std::byte* staging = slot.in_host[i].get();
        const uint64_t block = layout.batch_rows * layout.row_bytes;
        for (const Part& part : parts) {
          for (uint64_t o = 0; o < layout.outer; ++o) {
            std::byte* to = staging + o * block + part.row_offset * layout.row_bytes;
            if (part.data == nullptr) {
              std::memset(to, 0, part.rows * layout.row_bytes);
            } else {
              std::memcpy(to, part.data + o * part.stride, part.rows * layout.row_bytes);
            }
          }
        }
        slot.bound_in[i] = staging;
      }
      for (size_t j = 0; j < slot.out_parts.size(); ++j) {
        const QueueLayout& layout = output_queues[config_.outputs[j]]->layout();
        slot.out_direct[j] = isWholeBatch(slot.out_parts[j], layout);
        slot.bound_out[j] = slot.out_direct[j] ? slot.out_parts[j][0].data : slot.out_host[j].get();
      }
      config_.executable->runMain(slot.bound_in, slot.bound_out);
      for (size_t j = 0; j < slot.out_parts.size(); ++j) {
        if (slot.out_direct[j]) continue;
        const QueueLayout& layout = output_queues[config_.outputs[j]]->layout();
        const uint64_t block = layout.batch_rows * layout.row_bytes;
        for (const Part& part : slot.out_parts[j]) {
          if (part.data == nullptr) continue;
          for (uint64_t o = 0; o < layout.outer; ++o) {
            std::memcpy(part.data + o * part.stride, slot.out_host[j].get() + o * block + part.row_offset * layout.row_bytes,
                        part.rows * layout.row_bytes);
          }
        }
      }
    } catch (...) {
      slot.setError(std::current_exception());
    }
  }
  ++feed_index_;
  slot.busy.store(true, std::memory_order_relaxed);
  SlotCallbacks::finish(slot);
}

void MainLoop::submit(Slot& slot) {
  const auto& input_queues = config_.queues->inputQueues();
  const auto& output_queues = config_.queues->outputQueues();
  slot.copies_in.clear();
  slot.copies_out.clear();
  auto copy = [](std::vector<DeviceJob>& jobs, DeviceJob::Kind kind, std::byte* to, const std::byte* from,
                 uint64_t bytes, void (*done)(DeviceJob&, std::exception_ptr), Slot* owner) {
    DeviceJob& job = jobs.emplace_back();
    job.kind = kind;
    job.destination = to;
    job.source = from;
    job.bytes = bytes;
    job.done = done;
    job.owner = owner;
  };
  for (size_t i = 0; i < slot.in_parts.size(); ++i) {
    std::byte* device_input = slot.in_device[i].data();
    slot.bound_in[i] = device_input;
    const MainInputSource& source = config_.inputs[i];
    if (source.queue < 0) {
      const std::span<const std::byte> bytes = fedBytes(source, feed_index_);
      copy(slot.copies_in, DeviceJob::Kind::kCopyToDevice, device_input, bytes.data(), bytes.size(),
           &SlotCallbacks::copyInDone, &slot);
      continue;
    }
    const QueueLayout& layout = input_queues[source.queue]->layout();
    const uint64_t block = layout.batch_rows * layout.row_bytes;
    for (const Part& part : slot.in_parts[i]) {
      for (uint64_t o = 0; o < layout.outer; ++o) {
        const std::byte* from = part.data == nullptr ? zeros_.data() : part.data + o * part.stride;
        copy(slot.copies_in, DeviceJob::Kind::kCopyToDevice, device_input + o * block + part.row_offset * layout.row_bytes,
             from, part.rows * layout.row_bytes, &SlotCallbacks::copyInDone, &slot);
      }
    }
  }
  for (size_t j = 0; j < slot.out_parts.size(); ++j) {
    std::byte* device_output = slot.out_device[j].data();
    slot.bound_out[j] = device_output;
    const QueueLayout& layout = output_queues[config_.outputs[j]]->layout();
    const uint64_t block = layout.batch_rows * layout.row_bytes;
    for (const Part& part : slot.out_parts[j]) {
      if (part.data == nullptr) continue;  // flushed rows: dropped
      for (uint64_t o = 0; o < layout.outer; ++o) {
        copy(slot.copies_out, DeviceJob::Kind::kCopyToHost, part.data + o * part.stride,
             device_output + o * block + part.row_offset * layout.row_bytes, part.rows * layout.row_bytes,
             &SlotCallbacks::copyOutDone, &slot);
      }
    }
  }
  ++feed_index_;
  slot.busy.store(true, std::memory_order_release);
  if (slot.error) return SlotCallbacks::finish(slot);
  if (slot.copies_in.empty()) return SlotCallbacks::startCompute(slot);
  slot.pending.store(slot.copies_in.size(), std::memory_order_release);
  Device& device = config_.executable->device();
  for (DeviceJob& job : slot.copies_in) device.submit(job);
}

void MainLoop::run(const std::atomic<bool>& stop) {
  {
    std::lock_guard lock(error_mutex_);
    error_ = nullptr;
  }
  failed_.store(false, std::memory_order_release);
  size_t next = 0;
  for (;;) {
    Slot& slot = *slots_[next];
    waitForSlot(slot);
    if (failed_.load(std::memory_order_acquire)) break;
    // stop() ends the loop after the batches in flight, also while every
    // batch comes full (gatherBatch looks at it only when one is partial).
    if (stop.load(std::memory_order_acquire)) break;
    Gather gathered;
    try {
      gathered = gatherBatch(slot, stop);
    } catch (...) {
      // Every request already taken from a queue is answered, whatever
      // threw; the session then stops with the error.
      slot.setError(std::current_exception());
      slot.busy.store(true, std::memory_order_relaxed);
      SlotCallbacks::finish(slot);
      break;
    }
    if (gathered == Gather::kEmpty) break;
    if (config_.adaptive_timeout > 0 && !slot.part_lists.empty()) {
      // Parts of several requests (a flushed batch's last part is padding).
      concurrent_ = slot.part_lists[0]->size() > (slot.padded_rows > 0 ? 2u : 1u);
    }
    if (config_.rows_histogram != nullptr && !slot.gathering.empty()) {
      const uint64_t rows = slot.gathering[0].queue->layout().batch_rows - slot.padded_rows;
      config_.rows_histogram[rows].fetch_add(1, std::memory_order_relaxed);
    }
    if (failed_.load(std::memory_order_acquire)) {
      // The rows just taken belong to requests enqueued before the failure.
      {
        std::lock_guard lock(error_mutex_);
        slot.setError(error_);
      }
      slot.busy.store(true, std::memory_order_relaxed);
      SlotCallbacks::finish(slot);
      break;
    }
    if (config_.adaptive_timeout > 0) slot.submitted = std::chrono::steady_clock::now();
    if (host_memory_) {
      runInline(slot);
    } else {
      submit(slot);
    }
    next = (next + 1) % slots_.size();
    if (gathered == Gather::kStopped) break;
  }
  waitIdle();
  std::lock_guard lock(error_mutex_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kiln
