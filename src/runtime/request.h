// RequestState: the runner's record of one execute call in flight, shared
// by the caller's Future and the queue entries that answer it.
//
// It counts the output rows still to be answered (over every entry of
// every chunk, flushed ones included) and keeps the first error. The entry
// that answers the last rows publishes the result (`answered`, release)
// and wakes a waiting caller. Two references keep it alive, the caller's
// Future and the runner's answer; the last one to let go deletes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>

#include "kiln/queue_manager.h"
#include "kiln/request_future.h"
#include "runtime/runner_counters.h"
#include "runtime/event_count.h"

namespace kiln {

struct RequestState {
  explicit RequestState(uint64_t rows) : remaining(rows) {}

  std::atomic<uint64_t> remaining;
  std::mutex error_mutex;  // taken only on the error path
  std::exception_ptr error;
  OutputTensors tensors;   // runner-allocated outputs
  std::atomic<uint32_t> answered{0};
  EventCount answer_event;
  std::atomic<uint32_t> references{2};
  // Cancellation and deadline: every queue entry of the request points here.
  QueueAdmission admission;
  // Statistics (null: not counted) and the caller's completion callback.
  RunnerCounters* counters = nullptr;
  std::chrono::steady_clock::time_point submitted_at;
  std::function<void(const std::exception_ptr&)> on_complete;

  // QueueEntry::done of every output entry.
  static void rowsDone(void* context, uint64_t rows, const std::exception_ptr& failure) {
    static_cast<RequestState*>(context)->answer(failure, rows);
  }

  // Answers `rows` rows, with `failure` when not null.
  void answer(const std::exception_ptr& failure, uint64_t rows) {
    if (failure) {
      std::lock_guard lock(error_mutex);
      if (!error) error = failure;
    }
    if (remaining.fetch_sub(rows, std::memory_order_acq_rel) != rows) return;
    // The last rows: every other writer of `error` is done (acq_rel above).
    if (counters != nullptr) counters->complete(error, admission, submitted_at);
    if (on_complete) {
      // The caller's code, on a runner thread: a throw must not escape.
      try {
        on_complete(error);
      } catch (...) {
      }
    }
    answered.store(1, std::memory_order_release);
    answer_event.notifyAll();
    release();
  }

  void release() {
    if (references.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
};

}  // namespace kiln
