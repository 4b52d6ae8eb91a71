// SimDevice (sim_device.h): two worker threads over two fixed-size rings,
// a counted memory space, and fault injection.
//
// Job numbers and faults. Compute job n (0-based over the device's life) is
// checked in this order: a device in the sticky failed state fails it with
// "needs a reset after: ..."; else a scripted fault at n; else the random
// draws. The generator draws once per fault kind for every compute job, in
// FaultKind order, whatever the outcome, so whether job n fails depends
// only on the seed, the rates and n: the same seed fails the same jobs.
#include "runtime/sim_device.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kiln/error.h"
#include "runtime/device_internal.h"
#include "runtime/device_lock.h"

namespace kiln {
namespace {

namespace di = device_internal;
using Clock = std::chrono::steady_clock;

// Waits until `deadline` without oversleeping by more than a spin: the OS
// wakes a sleeper tens of microseconds late, which would swamp short
// simulated transfers, so the last stretch is spent yielding.
void waitUntil(Clock::time_point deadline) {
  constexpr auto kSpin = std::chrono::microseconds(50);
  if (deadline - Clock::now() > kSpin) std::this_thread::sleep_until(deadline - kSpin);
  while (Clock::now() < deadline) std::this_thread::yield();
}

std::chrono::nanoseconds transferTime(const SimDeviceConfig& config, uint64_t bytes) {
  double ns = static_cast<double>(config.transfer_latency_ns);
  if (config.transfer_bytes_per_second > 0) ns += static_cast<double>(bytes) * 1e9 / config.transfer_bytes_per_second;
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

}  // namespace

DeviceInfo SimDevice::describe(uint32_t index, const SimDeviceConfig& config) {
  DeviceInfo info;
  info.id = fmt::format("sim:{}", index);
  info.kind = DeviceKind::kSim;
  info.memory_bytes = config.memory_bytes;
  info.compute_threads = std::max<uint32_t>(config.compute_threads, 1);
  info.features = di::hostCpuFeatures();
  info.transfer_latency_ns = config.transfer_latency_ns;
  info.transfer_bytes_per_second = config.transfer_bytes_per_second;
  return info;
}

SimDevice::SimDevice(uint32_t index, const SimDeviceConfig& config, std::unique_ptr<DeviceLock> lock)
    : Device(describe(index, config)),
      config_(config),
      lock_(std::move(lock)),
      script_(config.fault_script),
      random_(config.fault_seed) {
  for (size_t k = 0; k < kFaultKinds; ++k) {
    const double rate = config.fault_rates[k];
    if (!(rate >= 0 && rate <= 1)) {
      throw UsageError(fmt::format("{}: fault rate of '{}' must be in [0, 1], got {}", id(),
                                   faultKindName(static_cast<FaultKind>(k)), rate));
    }
    if (rate > 0) random_faults_ = true;
  }
  std::stable_sort(script_.begin(), script_.end(),
                   [](const ScriptedFault& a, const ScriptedFault& b) { return a.at_job < b.at_job; });
  copies_.thread = std::thread([this] { serve(copies_, false); });
  computes_.thread = std::thread([this] {
    // Kernels parallelise with OpenMP; its thread count is per calling
    // thread, so setting it here once covers every compute job.
    omp_set_num_threads(static_cast<int>(info_.compute_threads));
    serve(computes_, true);
  });
}

SimDevice::~SimDevice() {
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
  // Buffers still alive break the contract (the device must outlive them);
  // free their memory anyway rather than leak it.
  for (const auto& [data, size] : allocations_) di::freeAligned(data);
}

DeviceBuffer SimDevice::allocate(uint64_t bytes) {
  const uint64_t size = bytes == 0 ? 1 : bytes;  // an empty tensor still gets a block
  std::lock_guard lock(memory_mutex_);
  const uint64_t in_use = in_use_.load(std::memory_order_relaxed);
  if (size > info_.memory_bytes - in_use) {
    throw UsageError(fmt::format("{}: out of device memory: asked {} with {} of {} in use", id(), di::humanBytes(size),
                                 di::humanBytes(in_use), di::humanBytes(info_.memory_bytes)));
  }
  std::byte* data = di::allocateAligned(size);
  if (data == nullptr) {
    throw UsageError(fmt::format("{}: out of host memory for device memory: asked {} with {} of {} in use", id(),
                                 di::humanBytes(size), di::humanBytes(in_use), di::humanBytes(info_.memory_bytes)));
  }
  try {
    allocations_.emplace(data, size);
  } catch (...) {
    di::freeAligned(data);
    throw;
  }
  in_use_.store(in_use + size, std::memory_order_relaxed);
  return DeviceBuffer(this, data, size);
}

uint64_t SimDevice::memoryInUse() const { return in_use_.load(std::memory_order_relaxed); }

void SimDevice::release(std::byte* data, uint64_t bytes) noexcept {
  std::lock_guard lock(memory_mutex_);
  allocations_.erase(data);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  di::freeAligned(data);
}

void SimDevice::submit(DeviceJob& job) {
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

void SimDevice::refuseOnWorker(const char* what) const {
  const std::thread::id self = std::this_thread::get_id();
  if (self == copies_.thread.get_id() || self == computes_.thread.get_id()) {
    throw UsageError(fmt::format("{}: {}() called from a device thread (inside done), where it would wait forever",
                                 id(), what));
  }
}

void SimDevice::synchronize() {
  refuseOnWorker("synchronize");
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return completed_ == submitted_; });
}

void SimDevice::reset() {
  refuseOnWorker("reset");
  synchronize();
  {
    std::lock_guard lock(memory_mutex_);
    for (const auto& [data, size] : allocations_) std::memset(data, 0xCD, size);
  }
  {
    std::lock_guard lock(mutex_);
    failed_ = false;
    failure_message_.clear();
  }
  resets_.fetch_add(1, std::memory_order_relaxed);
}

void SimDevice::serve(Queue& queue, bool compute) {
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
      if (failed_) error = failureOf(failure_kind_, "needs a reset after: " + failure_message_);
    }
    queue.has_room.notify_one();

    if (compute) {
      const uint64_t job_number = next_compute_job_++;
      FaultKind fault{};
      // Draw even on a failed device, so that job n's draw never depends
      // on what happened before it.
      const bool faulted = drawFault(job_number, &fault);
      if (error == nullptr && faulted) {
        const std::string message = fmt::format("compute job {} failed: injected fault '{}'", job_number,
                                                faultKindName(fault));
        if (fault != FaultKind::kRecoverableRerun) {
          std::lock_guard lock(mutex_);
          failed_ = true;
          failure_kind_ = fault;
          failure_message_ = message;
        }
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

std::exception_ptr SimDevice::runCopy(const DeviceJob& job) {
  waitUntil(Clock::now() + transferTime(config_, job.bytes));
  if (job.bytes != 0) std::memcpy(job.destination, job.source, job.bytes);
  return nullptr;
}

std::exception_ptr SimDevice::runCompute(const DeviceJob& job) {
  try {
    job.compute(job.context);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

bool SimDevice::drawFault(uint64_t job_number, FaultKind* kind) {
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
      if (!hit && draw < config_.fault_rates[k]) {
        *kind = static_cast<FaultKind>(k);
        hit = true;
      }
    }
  }
  return hit;
}

std::exception_ptr SimDevice::failureOf(FaultKind kind, const std::string& message) const {
  switch (kind) {
    case FaultKind::kApplicationError: return std::make_exception_ptr(ApplicationRuntimeError(id(), message));
    case FaultKind::kRecoverableReset:
      return std::make_exception_ptr(RecoverableDeviceError(id(), message, RecoveryAction::kDeviceReset));
    case FaultKind::kRecoverableRerun:
      return std::make_exception_ptr(RecoverableDeviceError(id(), message, RecoveryAction::kRerun));
    case FaultKind::kUnknown: return std::make_exception_ptr(UnknownDeviceError(id(), message));
  }
  return std::make_exception_ptr(UnknownDeviceError(id(), message));
}

}  // namespace kiln
