// EventCount: lets a thread sleep until another thread changes a condition
// it polls, without a mutex on the fast path (the lock-free queues use it
// for "data arrived" and "room freed").
//
//   waiter:    t = ec.prepareWait();
//              if (condition()) { ec.cancelWait(); ... }
//              else ec.wait(t, deadline);        // then check again
//   notifier:  make condition() true (a release store); ec.notifyAll();
//
// notifyAll() costs one fence and one load when nobody waits. Correctness
// (no lost wake-up) comes from the waiter announcing itself (an RMW) before
// it reads the condition, and the notifier reading the waiter count after
// its store, both sequentially consistent; a waiter that is still woken
// spuriously checks its condition again.
//
// Thread safety: any number of waiters and notifiers.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <ctime>

namespace kiln {

class EventCount {
 public:
  uint32_t prepareWait() {
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    return epoch_.load(std::memory_order_seq_cst);
  }
  void cancelWait() { waiters_.fetch_sub(1, std::memory_order_seq_cst); }

  // Sleeps until notified after prepareWait() returned `ticket`, or until
  // `timeout` passes (negative: no limit). Returns false on timeout.
  bool wait(uint32_t ticket, std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1)) {
    bool notified = true;
    while (epoch_.load(std::memory_order_seq_cst) == ticket) {
      timespec limit{};
      timespec* limit_pointer = nullptr;
      if (timeout.count() >= 0) {
        limit.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
        limit.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
        limit_pointer = &limit;
      }
      const long result = syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAIT_PRIVATE, ticket,
                                  limit_pointer, nullptr, 0);
      // A timed wait returns after one sleep either way: the caller checks
      // its condition and its own deadline.
      if (timeout.count() >= 0) {
        notified = !(result == -1 && errno == ETIMEDOUT);
        break;
      }
    }
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
    return notified;
  }

  void notifyAll() {
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer does not model fences: an RMW gives the same order
    // in a form it sees (it writes the line, so it is not used otherwise).
    if (waiters_.fetch_add(0, std::memory_order_seq_cst) == 0) return;
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) == 0) return;
#endif
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }

 private:
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  alignas(64) std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> waiters_{0};
};

}  // namespace kiln
