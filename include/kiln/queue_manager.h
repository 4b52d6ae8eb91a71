// QueueManager: one lock-free queue per user anchor of a Session.
//
// Each queue is a single-producer single-consumer RingBuffer of entries
// that point to USER memory: an input entry says where the session reads
// the next rows of the anchor from, an output entry where it writes them.
// Data moves between user memory and the device exactly when the device
// needs it; the queues never copy tensor data. This lets the caller prepare
// the next inputs while the device runs (the reference's I/O overlap).
//
// Rows: a queue's anchor may have a batch dimension (Anchor::batch_dim, or
// the one the ModelRunner batches on). The device runs `batchRows()` rows
// at a time; an entry may hold any number of rows, and the session gathers
// entries (from several callers) into one device batch, splitting an entry
// over two batches when needed. Without a batch dimension an entry is the
// whole tensor (one row). An entry's memory is the rows' bytes laid out as
// the anchor's tensor with `rows` in the batch dimension; when the batch
// dimension is not the outermost, `outer_stride` says how far apart the
// outer blocks lie in user memory (so that an entry can be a slice of a
// larger user tensor).
//
// Completion: `done(context, rows, error)` is called, on a device thread,
// once for each device batch that used part of the entry, with how many of
// its rows that batch finished (input: read, output: written) and the
// batch's error (null on success). The entry is finished when the rows add
// up; its memory must stay valid until then.
//
// Thread safety: each queue has one producer side (enqueue*, one thread at
// a time) and one consumer side (the session's main loop). flushAll and
// disconnectAll may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kiln/metadata.h"
#include "kiln/ring_buffer.h"

namespace kiln {

class EventCount;

// Admission of a request that may be cancelled, or expire, before it
// starts (the ModelRunner's requests; plain entries have none). Every
// entry of the request, in every queue, points to the same one. The main
// loop moves kQueued to kStarted (compare-and-swap) as it takes the
// request's first rows; a request found kCancelled, or still kQueued
// after its deadline (then marked kExpired), is never run: the loop drops
// its entries, answering them with RequestCancelledError or
// DeadlineExceededError, and touches none of their memory.
struct QueueAdmission {
  enum State : uint8_t { kQueued, kStarted, kCancelled, kExpired };
  std::atomic<uint8_t> state{kQueued};
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  bool timed = false;  // record `started` (the runner times a sample of requests)
  // When a loop admitted it (steady_clock ticks), set with kStarted when
  // timed. Atomic: replicas' loops that share a request's rows may both
  // admit it at once; one wins the state change, both store a time.
  std::atomic<std::chrono::steady_clock::rep> started{0};

  // kQueued -> kCancelled; false when the request started (or ended) first.
  bool cancel() {
    uint8_t expected = kQueued;
    return state.compare_exchange_strong(expected, kCancelled, std::memory_order_acq_rel);
  }
};

struct QueueEntry {
  // Input: read from; output: written to. nullptr: flush data (an input
  // reads zeros, an output is discarded).
  std::byte* data = nullptr;
  uint64_t rows = 1;
  uint64_t outer_stride = 0;  // 0: the rows are contiguous ([outer][rows][row])
  void (*done)(void* context, uint64_t rows, const std::exception_ptr& error) = nullptr;
  void* context = nullptr;
  QueueAdmission* admission = nullptr;  // null: always runs
};

// The layout of one anchor as the queues and the device see it.
struct QueueLayout {
  uint64_t batch_rows = 1;  // rows the device runs at once
  uint64_t outer = 1;       // product of the dimensions before the batch one
  uint64_t row_bytes = 0;   // bytes of one row of one outer block
  // Bytes of `rows` contiguous rows.
  uint64_t bytesOf(uint64_t rows) const { return outer * rows * row_bytes; }
};

// Session::createQueueManager's batch_dim meaning "each anchor's own
// Anchor::batch_dim" (whole tensors where an anchor has none).
inline constexpr uint32_t kAnchorBatchDim = 0xFFFFFFFEu;

// The layout of `info` batched on `batch_dim` (kNoBatchDim: the whole tensor
// is one row). Throws UsageError when batch_dim >= rank.
QueueLayout queueLayoutOf(const TensorInfo& info, uint32_t batch_dim);

class TensorQueue {
 public:
  // `activity` is notified after each enqueue (the main loop sleeps on it).
  TensorQueue(const Anchor& anchor, const QueueLayout& layout, size_t capacity, EventCount* activity);
  ~TensorQueue();
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;

  const Anchor& anchor() const { return anchor_; }
  const std::string& name() const { return anchor_.name; }
  const QueueLayout& layout() const { return layout_; }
  size_t capacity() const { return ring_.capacity(); }
  size_t size() const { return ring_.size(); }

  // Producer side. Adds `entry`, waiting while the queue is full (back-
  // pressure). Throws UsageError when the queue is disconnected or the
  // entry is malformed (no rows; a stride smaller than the rows).
  void enqueue(const QueueEntry& entry);
  // The whole-tensor form: `bytes` must be a whole number of rows.
  void enqueue(std::byte* data, uint64_t bytes, void (*done)(void*, uint64_t, const std::exception_ptr&) = nullptr,
               void* context = nullptr);
  // Like enqueue, but returns false instead of waiting when full.
  bool tryEnqueue(const QueueEntry& entry);
  // Producer side: true when an enqueue would wait; waits until it would
  // not (or the queue is disconnected).
  bool full() const { return ring_.full(); }
  void waitForRoom();

  // Consumer side (the session's main loop).
  QueueEntry* front() { return ring_.front(); }
  void pop();
  bool disconnected() const { return disconnected_.load(std::memory_order_acquire); }

 private:
  friend class QueueManager;
  void check(const QueueEntry& entry) const;

  Anchor anchor_;
  QueueLayout layout_;
  RingBuffer<QueueEntry> ring_;
  EventCount* activity_;
  std::unique_ptr<EventCount> room_freed_;
  std::atomic<bool> disconnected_{false};
};

class QueueManager {
 public:
  // One queue per anchor, each holding `capacity` entries.
  QueueManager(const std::vector<Anchor>& inputs, const std::vector<Anchor>& outputs,
               const std::vector<QueueLayout>& input_layouts, const std::vector<QueueLayout>& output_layouts,
               size_t capacity);
  ~QueueManager();

  // Throws UsageError listing the queues that exist.
  TensorQueue& inputQueue(const std::string& anchor);
  TensorQueue& outputQueue(const std::string& anchor);
  const std::vector<std::unique_ptr<TensorQueue>>& inputQueues() const { return inputs_; }
  const std::vector<std::unique_ptr<TensorQueue>>& outputQueues() const { return outputs_; }

  // Asks the main loop to run the batch it is assembling now, padded with
  // flush data, instead of waiting for the timeout (the end of a stream).
  void flushAll();
  bool takeFlushRequest();

  // The main loop stops reading these queues: enqueue throws from now on,
  // and the entries still queued finish with an error when the main loop
  // next looks at them.
  void disconnectAll();
  bool disconnected() const { return disconnected_.load(std::memory_order_acquire); }

  // Wakes the main loop (after a flush or disconnect request, or when any
  // queue gets data).
  EventCount& activity() { return *activity_; }

 private:
  std::vector<std::unique_ptr<TensorQueue>> inputs_;
  std::vector<std::unique_ptr<TensorQueue>> outputs_;
  std::unique_ptr<EventCount> activity_;
  std::atomic<bool> flush_requested_{false};
  std::atomic<bool> disconnected_{false};
};

}  // namespace kiln
