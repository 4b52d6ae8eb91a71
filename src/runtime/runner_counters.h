// RunnerCounters: the ModelRunner's live counters behind RunnerStatistics
// (include/kiln/runner_statistics.h).
//
// Requests add to them when they are submitted or refused (the caller's
// thread) and when they complete (the thread that answers their last rows,
// a device or main-loop thread). All are relaxed atomics: each is exact,
// a snapshot of several is not a single instant.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>

#include "kiln/error.h"
#include "kiln/queue_manager.h"
#include "kiln/runner_statistics.h"

namespace kiln {

struct RunnerCounters {
  std::atomic<uint64_t> submitted{0}, refused{0}, in_flight{0}, succeeded{0};
  std::atomic<uint64_t> cancelled{0}, deadline_exceeded{0}, usage_errors{0}, application_errors{0},
      recoverable_errors{0}, unknown_errors{0};
  // Queue and run times of the timed requests (one in `timed_every`,
  // ModelRunnerConfig::statistics_sample_every, chosen by `sequence`).
  uint64_t timed_every = 8;  // set before the first request, then read only
  std::atomic<uint64_t> sequence{0};
  std::atomic<uint64_t> timed{0}, queue_ns{0}, run_ns{0}, max_queue_ns{0}, max_run_ns{0};
  std::array<std::atomic<uint64_t>, kTimeBucketSeconds.size() + 1> queue_histogram{}, run_histogram{};

  // Whether the next request is timed.
  bool timeNext() {
    return timed_every == 1 || sequence.fetch_add(1, std::memory_order_relaxed) % timed_every == 0;
  }

  // A request completed with `error` (null: success); `admission` says
  // whether and when it started (for timed requests).
  void complete(const std::exception_ptr& error, const QueueAdmission& admission,
                std::chrono::steady_clock::time_point submitted_at) {
    if (!error) {
      succeeded.fetch_add(1, std::memory_order_relaxed);
    } else {
      errorClass(error).fetch_add(1, std::memory_order_relaxed);
    }
    if (admission.timed && admission.state.load(std::memory_order_acquire) == QueueAdmission::kStarted) {
      const auto now = std::chrono::steady_clock::now();
      const std::chrono::steady_clock::time_point started(
          std::chrono::steady_clock::duration(admission.started.load(std::memory_order_relaxed)));
      const uint64_t queued = nanoseconds(started - submitted_at);
      const uint64_t ran = nanoseconds(now - started);
      timed.fetch_add(1, std::memory_order_relaxed);
      queue_ns.fetch_add(queued, std::memory_order_relaxed);
      run_ns.fetch_add(ran, std::memory_order_relaxed);
      raise(max_queue_ns, queued);
      raise(max_run_ns, ran);
      queue_histogram[timeBucket(static_cast<double>(queued) * 1e-9)].fetch_add(1, std::memory_order_relaxed);
      run_histogram[timeBucket(static_cast<double>(ran) * 1e-9)].fetch_add(1, std::memory_order_relaxed);
    }
    in_flight.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>& errorClass(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const RequestCancelledError&) {
      return cancelled;
    } catch (const DeadlineExceededError&) {
      return deadline_exceeded;
    } catch (const UsageError&) {
      return usage_errors;
    } catch (const ApplicationRuntimeError&) {
      return application_errors;
    } catch (const RecoverableDeviceError&) {
      return recoverable_errors;
    } catch (...) {
      return unknown_errors;
    }
  }
  static uint64_t nanoseconds(std::chrono::steady_clock::duration d) {
    return static_cast<uint64_t>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
  }
  static void raise(std::atomic<uint64_t>& maximum, uint64_t value) {
    uint64_t seen = maximum.load(std::memory_order_relaxed);
    while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
};

}  // namespace kiln
