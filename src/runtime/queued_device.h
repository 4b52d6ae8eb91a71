// QueuedDevice: the job queues, worker threads, sticky failure state and
// fault injection that every device with its own memory shares (sim, cuda).
//
// A derived device supplies what differs: how a copy moves bytes
// (runCopy), how a compute job runs and reports the device's errors
// (runCompute), what a thread does once when it starts (onWorkerStart) and
// what reset() does to memory (loseMemory). Everything else is here:
//   - two fixed-size rings of DeviceJob pointers (kQueueCapacity each), one
//     served by a copy thread, one by a compute thread, in submission order,
//     so that submitting allocates nothing. A submit to a full queue waits
//     for room; a `done` callback must therefore not fill the queue of the
//     thread it runs on (that submit throws UsageError instead);
//   - the sticky failed state: after an injected fault of a reset class, or
//     a device error the derived device reports with markFailed(), every
//     later job fails with the same class ("<id>: needs a reset after: ...")
//     until reset() (for ever after kRecoverableRestart, which reset()
//     throws again);
//   - fault injection on compute jobs (FaultConfig), scripted by job number
//     or random with a seeded generator, so that every error class can be
//     tested on any device.
//
// Lifetime: a derived constructor calls startWorkers() last, and a derived
// destructor calls stopWorkers() first (the workers call the derived hooks,
// which must not run on a half-built or half-destroyed object).
//
// Thread safety: as Device. `done` and compute run on the device threads
// without any device lock held, so `done` may submit to this device; it
// must not throw, and must not call synchronize() or reset().
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/device.h"

namespace kiln {

class QueuedDevice : public Device {
 public:
  static constexpr size_t kQueueCapacity = 1024;
  static_assert(kQueueCapacity >= Device::kMinQueuedJobs);

  ~QueuedDevice() override;

  void submit(DeviceJob& job) override;
  void synchronize() override;
  void reset() override;

 protected:
  // Throws UsageError for a fault rate outside [0, 1].
  QueuedDevice(DeviceInfo info, const FaultConfig& faults);

  void startWorkers();
  void stopWorkers() noexcept;

  // Hooks, each called on one worker thread. They return the job's error
  // (null on success) instead of throwing.
  virtual std::exception_ptr runCopy(const DeviceJob& job) = 0;
  virtual std::exception_ptr runCompute(const DeviceJob& job);
  virtual void onWorkerStart(bool /*compute*/) {}
  // reset(): what happens to the contents of device memory.
  virtual void loseMemory() = 0;

  // Inside runCompute: the number of the job being run (0-based, as
  // ScriptedFault::at_job counts).
  uint64_t runningComputeJob() const { return next_compute_job_ - 1; }

  // The exception of error class `kind` for this device.
  std::exception_ptr failureOf(FaultKind kind, const std::string& message) const;
  // Enters the sticky failed state (a no-op for kRecoverableRerun, or when
  // the device has already failed). Any thread.
  void markFailed(FaultKind kind, std::string message);
  // The error of a failure that outlives resets (kRecoverableRestart), or
  // null. Any thread.
  std::exception_ptr permanentFailure() const;

 private:
  // A FIFO of job pointers with a fixed capacity. Guarded by mutex_.
  class JobRing {
   public:
    bool empty() const { return count_ == 0; }
    bool full() const { return count_ == slots_.size(); }
    void push(DeviceJob* job) {
      slots_[(head_ + count_) % slots_.size()] = job;
      ++count_;
    }
    DeviceJob* pop() {
      DeviceJob* job = slots_[head_];
      head_ = (head_ + 1) % slots_.size();
      --count_;
      return job;
    }

   private:
    std::array<DeviceJob*, kQueueCapacity> slots_{};
    size_t head_ = 0;   // oldest job
    size_t count_ = 0;  // jobs queued
  };

  // One queue and the thread that serves it.
  struct Queue {
    explicit Queue(const char* queue_name) : name(queue_name) {}
    const char* name;  // for messages: "copy", "compute"
    JobRing ring;
    std::condition_variable has_work;  // the worker waits on it
    std::condition_variable has_room;  // submitters wait on it when full
    std::thread thread;
  };

  void serve(Queue& queue, bool compute);
  // The fault (if any) that compute job `job_number` gets; compute worker only.
  bool drawFault(uint64_t job_number, FaultKind* kind);
  void refuseOnWorker(const char* what) const;

  const FaultConfig faults_;

  // Work. Invariant: submitted_ - completed_ jobs are queued or running;
  // synchronize() waits for them to be equal.
  mutable std::mutex mutex_;
  Queue copies_{"copy"};
  Queue computes_{"compute"};
  std::condition_variable idle_;  // signalled when completed_ reaches submitted_
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  bool started_ = false;
  // The sticky failure: set by an error of a reset class, cleared by reset().
  bool failed_ = false;
  FaultKind failure_kind_ = FaultKind::kApplicationError;
  std::string failure_message_;

  // Fault injection state, touched only by the compute worker.
  std::vector<ScriptedFault> script_;  // sorted by at_job
  size_t script_next_ = 0;             // first entry not yet passed
  std::mt19937_64 random_;
  bool random_faults_ = false;  // any fault rate above 0
  uint64_t next_compute_job_ = 0;
};

}  // namespace kiln
