// QueuedDevice (queued_device.h): two worker threads over two fixed-size
// rings, the sticky failed state, and fault injection.
//
// Job numbers and faults. Compute job n (0-based over the device's life) is
// checked in this order: a device in the sticky failed state fails it with
// "needs a reset after: ..."; else a scripted fault at n; else the random
// draws. The generator draws once per fault kind for every compute job, in
// FaultKind order, whatever the outcome, so whether job n fails depends
// only on the seed, the rates and n: the same seed fails the same jobs.
#include "runtime/queued_device.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/error.h"
#include "runtime/device_internal.h"

namespace kiln {

namespace di = device_internal;

QueuedDevice::QueuedDevice(DeviceInfo info, const FaultConfig& faults)
    : Device(std::move(info)), faults_(faults), script_(faults.fault_script), random_(faults.fault_seed) {
  for (size_t k = 0; k < kFaultKinds; ++k) {
    const double rate = faults.fault_rates[k];
    if (!(rate >= 0 && rate <= 1)) {
      throw UsageError(fmt::format("{}: fault rate of '{}' must be in [0, 1], got {}", id(),
                                   faultKindName(static_cast<FaultKind>(k)), rate));
    }
    if (rate > 0) random_faults_ = true;
  }
  std::stable_sort(script_.begin(), script_.end(),
                   [](const ScriptedFault& a, const ScriptedFault& b) { return a.at_job < b.at_job; });
}

QueuedDevice::~QueuedDevice() { stopWorkers(); }

void QueuedDevice::startWorkers() {
  started_ = true;
  copies_.thread = std::thread([this] {
    onWorkerStart(false);
    serve(copies_, false);
  });
  computes_.thread = std::thread([this] {
    onWorkerStart(true);
    serve(computes_, true);
  });
}

void QueuedDevice::stopWorkers() noexcept {
  if (!started_) return;
  started_ = false;
  {
    // Drain first: a `done` still running may submit to the other queue,
    // whose worker must still be there to serve it.
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return completed_ == submitted_; });
    stopping_ = true;
  }
  copies_.has_work.notify_all();
  computes_.has_work.notify_all();
  copies_.thread.join();
  computes_.thread.join();
}

void QueuedDevice::submit(DeviceJob& job) {
  di::checkJob(id(), job);
  Queue& queue = job.kind == DeviceJob::Kind::kCompute ? computes_ : copies_;
  {
    std::unique_lock lock(mutex_);
    if (queue.ring.full()) {
      // The worker of this queue cannot make room while it waits here.
      if (std::this_thread::get_id() == queue.thread.get_id()) {
        throw UsageError(fmt::format("{}: a done callback on the {} thread submitted to its full {} queue ({} jobs)",
                                     id(), queue.name, queue.name, kQueueCapacity));
      }
      queue.has_room.wait(lock, [&queue] { return !queue.ring.full(); });
    }
    queue.ring.push(&job);
    ++submitted_;
  }
  queue.has_work.notify_one();
}

void QueuedDevice::refuseOnWorker(const char* what) const {
  const std::thread::id self = std::this_thread::get_id();
  if (self == copies_.thread.get_id() || self == computes_.thread.get_id()) {
    throw UsageError(fmt::format("{}: {}() called from a device thread (inside done), where it would wait forever",
                                 id(), what));
  }
}

void QueuedDevice::synchronize() {
  refuseOnWorker("synchronize");
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return completed_ == submitted_; });
}

void QueuedDevice::reset() {
  refuseOnWorker("reset");
  synchronize();
  {
    // A failure of the restart class outlives resets (see FaultKind).
    std::lock_guard lock(mutex_);
    if (failed_ && failure_kind_ == FaultKind::kRecoverableRestart) {
      std::rethrow_exception(failureOf(failure_kind_, "cannot be reset in this process after: " + failure_message_));
    }
  }
  loseMemory();
  {
    std::lock_guard lock(mutex_);
    failed_ = false;
    failure_message_.clear();
  }
  resets_.fetch_add(1, std::memory_order_relaxed);
}

std::exception_ptr QueuedDevice::runCompute(const DeviceJob& job) {
  try {
    job.compute(job.context);
  } catch (...) {
    return device_internal::asDeviceError(id(), std::current_exception());
  }
  return nullptr;
}

std::exception_ptr QueuedDevice::permanentFailure() const {
  std::lock_guard lock(mutex_);
  if (!failed_ || failure_kind_ != FaultKind::kRecoverableRestart) return nullptr;
  return failureOf(failure_kind_, "unusable in this process after: " + failure_message_);
}

void QueuedDevice::markFailed(FaultKind kind, std::string message) {
  if (kind == FaultKind::kRecoverableRerun) return;
  std::lock_guard lock(mutex_);
  if (failed_) return;
  failed_ = true;
  failure_kind_ = kind;
  failure_message_ = std::move(message);
}

void QueuedDevice::serve(Queue& queue, bool compute) {
  for (;;) {
    DeviceJob* job = nullptr;
    std::exception_ptr error;
    {
      std::unique_lock lock(mutex_);
      queue.has_work.wait(lock, [&] { return stopping_ || !queue.ring.empty(); });
      if (queue.ring.empty()) return;  // stopping, and nothing left
      job = queue.ring.pop();
      // The failed state as of this job's start: jobs queued before a fault
      // but started after it fail too, as the reference runtime's do.
      if (failed_) {
        const bool for_good = failure_kind_ == FaultKind::kRecoverableRestart;
        error = failureOf(failure_kind_, (for_good ? "unusable in this process after: " : "needs a reset after: ") +
                                             failure_message_);
      }
    }
    queue.has_room.notify_one();

    if (compute) {
      const uint64_t job_number = next_compute_job_++;
      FaultKind fault{};
      // Draw even on a failed device, so that job n's draw never depends
      // on what happened before it.
      const bool faulted = drawFault(job_number, &fault);
      if (error == nullptr && faulted) {
        const std::string message =
            fmt::format("compute job {} failed: injected fault '{}'", job_number, faultKindName(fault));
        markFailed(fault, message);
        error = failureOf(fault, message);
      }
      if (error == nullptr) error = runCompute(*job);
      compute_jobs_.fetch_add(1, std::memory_order_relaxed);
    } else if (error == nullptr) {
      error = runCopy(*job);
    }

    // The job is the submitter's again once `done` starts: do not touch it
    // after this call. No lock is held, so `done` may submit more work.
    job->done(*job, std::move(error));
    {
      std::lock_guard lock(mutex_);
      if (++completed_ == submitted_) idle_.notify_all();
    }
  }
}

bool QueuedDevice::drawFault(uint64_t job_number, FaultKind* kind) {
  bool hit = false;
  // Scripted faults, in job order; entries for jobs already past are skipped.
  while (script_next_ < script_.size() && script_[script_next_].at_job < job_number) ++script_next_;
  if (script_next_ < script_.size() && script_[script_next_].at_job == job_number) {
    *kind = script_[script_next_].kind;
    hit = true;
  }
  if (random_faults_) {
    for (size_t k = 0; k < kFaultKinds; ++k) {
      // 53 random bits as a double in [0, 1): the same on every platform,
      // unlike std::uniform_real_distribution.
      const double draw = static_cast<double>(random_() >> 11) * 0x1.0p-53;
      if (!hit && draw < faults_.fault_rates[k]) {
        *kind = static_cast<FaultKind>(k);
        hit = true;
      }
    }
  }
  return hit;
}

std::exception_ptr QueuedDevice::failureOf(FaultKind kind, const std::string& message) const {
  switch (kind) {
    case FaultKind::kApplicationError: return std::make_exception_ptr(ApplicationRuntimeError(id(), message));
    case FaultKind::kRecoverableReset:
      return std::make_exception_ptr(RecoverableDeviceError(id(), message, RecoveryAction::kDeviceReset));
    case FaultKind::kRecoverableRerun:
      return std::make_exception_ptr(RecoverableDeviceError(id(), message, RecoveryAction::kRerun));
    case FaultKind::kUnknown: return std::make_exception_ptr(UnknownDeviceError(id(), message));
    case FaultKind::kRecoverableRestart:
      return std::make_exception_ptr(RecoverableDeviceError(id(), message, RecoveryAction::kRestartProcess));
  }
  return std::make_exception_ptr(UnknownDeviceError(id(), message));
}

}  // namespace kiln
