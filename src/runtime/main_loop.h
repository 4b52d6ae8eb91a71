// MainLoop: the engine behind Session::runMainPrograms().
//
// Each iteration gathers one device batch from the queues (batch_rows rows
// per anchor, possibly from several entries, flushing a partial batch after
// the timeout), then runs it in a "slot": the slot's staging buffers, copy
// jobs and compute job are made once, so an iteration allocates nothing.
//
//   host memory device (cpu): one slot, run inline on the loop's thread;
//     a batch that is exactly one contiguous entry per anchor is bound in
//     place (zero copy), otherwise rows are gathered into host staging.
//   device with its own memory (sim): `depth` slots in flight. Copies in
//     -> compute -> copies out are chained from the jobs' `done` callbacks
//     on the device threads while this thread gathers the next batch, so
//     transfers overlap compute.
//
// Queue delay: a partial batch waits up to the timeout for more rows. With
// an adaptive timeout it waits longer, up to a fraction of the recent batch
// run time, but only while requests come concurrently: then the callers
// that the last batch answered are about to send their next requests, and
// waiting a little for them makes one full batch instead of two partial
// ones (a batch costs the same with 1 row as with all). A lone caller never
// waits for it. Signs of concurrency: the last batch carried parts of
// several requests, rows were queued before this batch began, or another
// batch is still on the device.
//
// Invariants: a slot is busy from submission until its last job's done has
// called every completion of its entries; the loop reuses a slot only when
// it is free; the first device error stops the loop, which waits for the
// busy slots and rethrows it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kiln/executable.h"
#include "kiln/queue_manager.h"
#include "kiln/session.h"
#include "runtime/event_count.h"

namespace kiln {

class FeedDataBlob;

// Where each main-program input of the executable comes from.
struct MainInputSource {
  int queue = -1;                         // index in QueueManager::inputQueues(), or -1:
  std::span<const std::byte> tensor;      // package-provided TensorData, every batch
  const FeedDataBlob* feed = nullptr;     // or package-provided FeedData, item per batch
};

struct MainLoopConfig {
  Executable* executable = nullptr;
  QueueManager* queues = nullptr;
  std::vector<MainInputSource> inputs;  // per Executable::mainInputs()
  std::vector<int> outputs;             // per mainOutputs(): index in outputQueues()
  std::chrono::nanoseconds timeout{0};
  // SessionOptions::adaptive_timeout (0: off).
  double adaptive_timeout = 0;
  const FlushCallback* flush_callback = nullptr;
  const std::function<void(const std::exception_ptr&)>* on_failure = nullptr;
  uint32_t depth = 1;
  // Counters the loop adds to (batches run, batches flushed partial); they
  // outlive the loop and may be read from any thread.
  std::atomic<uint64_t>* batches = nullptr;
  std::atomic<uint64_t>* flushed = nullptr;
  // rows_histogram[k] counts batches that carried k rows from the queues
  // (k = 0 .. the batch's rows; the rest was flush padding).
  std::atomic<uint64_t>* rows_histogram = nullptr;
};

class MainLoop {
 public:
  explicit MainLoop(MainLoopConfig config);
  ~MainLoop();

  // Runs until `stop` becomes true or the queues are disconnected; throws
  // the first device error (see the invariants above).
  void run(const std::atomic<bool>& stop);

  struct Slot;

 private:
  enum class Gather { kComplete, kEmpty, kStopped };
  Gather gatherBatch(Slot& slot, const std::atomic<bool>& stop);
  void flushRest(Slot& slot, const std::string& waiting_for, bool call_back);
  // The adaptive timeout (see the top): how long this partial batch may wait.
  // Called when `slot` is first found partial; `rows_waiting`: rows were
  // queued before it began.
  std::chrono::nanoseconds batchTimeout(const Slot& slot, bool rows_waiting);
  void recordBatchTime(std::chrono::steady_clock::time_point submitted);
  void runInline(Slot& slot);
  void submit(Slot& slot);
  void recordFailure(const std::exception_ptr& error);
  void waitForSlot(Slot& slot);
  void waitIdle();

  MainLoopConfig config_;
  bool host_memory_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::byte> zeros_;  // flush data for a device with its own memory
  EventCount slot_freed_;
  std::atomic<uint32_t> finishing_{0};  // device threads inside SlotCallbacks::finish
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  uint64_t feed_index_ = 0;
  // The adaptive timeout's state: a moving average of the batches' run
  // times, from submission to answer (written where batches finish, on
  // device threads), and whether requests came concurrently of late
  // (the loop's thread only).
  std::atomic<int64_t> batch_ns_{0};
  bool concurrent_ = false;

  friend struct SlotCallbacks;
};

}  // namespace kiln
