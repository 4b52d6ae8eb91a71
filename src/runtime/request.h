// Request: the runner's record of one execute call in flight.
//
// It counts the output rows still to be answered (over every entry of
// every chunk, flushed ones included) and keeps the first error. The
// entry that answers the last rows resolves the promise and deletes the
// request: after that no entry refers to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <future>
#include <mutex>

namespace kiln {

struct Request {
  explicit Request(uint64_t rows) : remaining(rows) {}

  std::atomic<uint64_t> remaining;
  std::mutex error_mutex;
  std::exception_ptr error;
  std::promise<void> promise;

  // QueueEntry::done of every output entry.
  static void rowsDone(void* context, uint64_t rows, const std::exception_ptr& failure) {
    static_cast<Request*>(context)->answer(failure, rows);
  }

  // Answers `rows` rows, with `failure` when not null.
  void answer(const std::exception_ptr& failure, uint64_t rows) {
    if (failure) {
      std::lock_guard lock(error_mutex);
      if (!error) error = failure;
    }
    if (remaining.fetch_sub(rows, std::memory_order_acq_rel) != rows) return;
    // The last rows: every other writer of `error` is done.
    if (error) {
      promise.set_exception(error);
    } else {
      promise.set_value();
    }
    delete this;
  }
};

}  // namespace kiln
