#include "kiln/queue_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/error.h"
#include "runtime/event_count.h"

namespace kiln {

QueueLayout queueLayoutOf(const TensorInfo& info, uint32_t batch_dim) {
  QueueLayout layout;
  if (!info.isStatic()) throw UsageError("a queue needs a static shape, got " + info.toString());
  if (batch_dim == kNoBatchDim) {
    layout.row_bytes = info.sizeInBytes();
    return layout;
  }
  if (batch_dim >= info.shape.size()) {
    throw UsageError(fmt::format("batch dimension {} is out of range for a tensor of shape {}", batch_dim,
                                 info.shapeString()));
  }
  layout.batch_rows = static_cast<uint64_t>(info.shape[batch_dim]);
  if (layout.batch_rows == 0) throw UsageError("batch dimension of size 0 in shape " + info.shapeString());
  uint64_t inner = dtypeSize(info.dtype);
  for (size_t d = 0; d < info.shape.size(); ++d) {
    if (d < batch_dim) layout.outer *= static_cast<uint64_t>(info.shape[d]);
    if (d > batch_dim) inner *= static_cast<uint64_t>(info.shape[d]);
  }
  layout.row_bytes = inner;
  return layout;
}

TensorQueue::TensorQueue(const Anchor& anchor, const QueueLayout& layout, size_t capacity, EventCount* activity)
    : anchor_(anchor), layout_(layout), ring_(capacity), activity_(activity), room_freed_(std::make_unique<EventCount>()) {}

TensorQueue::~TensorQueue() = default;

void TensorQueue::check(const QueueEntry& entry) const {
  if (disconnected()) throw UsageError(fmt::format("queue '{}' is disconnected", name()));
  if (entry.rows == 0) throw UsageError(fmt::format("queue '{}': an entry needs at least one row", name()));
  if (entry.outer_stride != 0 && entry.outer_stride < entry.rows * layout_.row_bytes) {
    throw UsageError(fmt::format("queue '{}': outer stride {} is smaller than {} rows of {} bytes", name(),
                                 entry.outer_stride, entry.rows, layout_.row_bytes));
  }
}

bool TensorQueue::tryEnqueue(const QueueEntry& entry) {
  check(entry);
  if (!ring_.tryPush(entry)) return false;
  activity_->notifyAll();
  return true;
}

void TensorQueue::enqueue(const QueueEntry& entry) {
  check(entry);
  // Spin briefly (the main loop frees room within microseconds when it is
  // running), then sleep until it pops.
  for (int spin = 0; spin < 64; ++spin) {
    if (ring_.tryPush(entry)) {
      activity_->notifyAll();
      return;
    }
  }
  for (;;) {
    const uint32_t ticket = room_freed_->prepareWait();
    if (ring_.tryPush(entry)) {
      room_freed_->cancelWait();
      activity_->notifyAll();
      return;
    }
    if (disconnected()) {
      room_freed_->cancelWait();
      throw UsageError(fmt::format("queue '{}' is disconnected", name()));
    }
    room_freed_->wait(ticket);
  }
}

void TensorQueue::enqueue(std::byte* data, uint64_t bytes, void (*done)(void*, uint64_t, const std::exception_ptr&),
                          void* context) {
  const uint64_t row = layout_.bytesOf(1);
  if (row == 0 || bytes == 0 || bytes % row != 0) {
    throw UsageError(fmt::format("queue '{}': {} bytes is not a whole number of rows of {} bytes ({})", name(), bytes,
                                 row, anchor_.info.toString()));
  }
  enqueue(QueueEntry{.data = data, .rows = bytes / row, .outer_stride = 0, .done = done, .context = context});
}

void TensorQueue::waitForRoom() {
  for (;;) {
    const uint32_t ticket = room_freed_->prepareWait();
    if (!ring_.full() || disconnected()) {
      room_freed_->cancelWait();
      return;
    }
    room_freed_->wait(ticket);
  }
}

void TensorQueue::pop() {
  ring_.pop();
  room_freed_->notifyAll();
}

QueueManager::QueueManager(const std::vector<Anchor>& inputs, const std::vector<Anchor>& outputs,
                           const std::vector<QueueLayout>& input_layouts,
                           const std::vector<QueueLayout>& output_layouts, size_t capacity)
    : activity_(std::make_unique<EventCount>()) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs_.push_back(std::make_unique<TensorQueue>(inputs[i], input_layouts.at(i), capacity, activity_.get()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs_.push_back(std::make_unique<TensorQueue>(outputs[i], output_layouts.at(i), capacity, activity_.get()));
  }
}

QueueManager::~QueueManager() = default;

namespace {

TensorQueue& findQueue(const std::vector<std::unique_ptr<TensorQueue>>& queues, const std::string& anchor,
                       const char* direction) {
  std::vector<std::string> names;
  for (const auto& queue : queues) {
    if (queue->name() == anchor) return *queue;
    names.push_back(queue->name());
  }
  throw UsageError(fmt::format("no {} queue named '{}'; the {} queues are: {}", direction, anchor, direction,
                               names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", "))));
}

}  // namespace

TensorQueue& QueueManager::inputQueue(const std::string& anchor) { return findQueue(inputs_, anchor, "input"); }
TensorQueue& QueueManager::outputQueue(const std::string& anchor) { return findQueue(outputs_, anchor, "output"); }

void QueueManager::flushAll() {
  flush_requested_.store(true, std::memory_order_release);
  activity_->notifyAll();
}

bool QueueManager::takeFlushRequest() { return flush_requested_.exchange(false, std::memory_order_acq_rel); }

void QueueManager::disconnectAll() {
  disconnected_.store(true, std::memory_order_release);
  for (const auto& queue : inputs_) queue->disconnected_.store(true, std::memory_order_release);
  for (const auto& queue : outputs_) queue->disconnected_.store(true, std::memory_order_release);
  for (const auto& queue : inputs_) queue->room_freed_->notifyAll();
  for (const auto& queue : outputs_) queue->room_freed_->notifyAll();
  activity_->notifyAll();
}

}  // namespace kiln
