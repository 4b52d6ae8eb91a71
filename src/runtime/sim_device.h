// SimDevice: a simulated accelerator on the host (include/kiln/device.h).
//
// It exercises every code path a real accelerator needs, on any machine:
//   - its own memory space with a capacity: allocate() counts the bytes in
//     use and refuses a request beyond SimDeviceConfig::memory_bytes. The
//     memory is host memory underneath, but usesHostMemory() is false, so
//     callers must move data with copy jobs as they would for a GPU.
//   - a transfer thread that runs copy jobs in submission order, each taking
//     transfer_latency_ns + bytes / transfer_bytes_per_second;
//   - a compute worker that runs compute jobs in submission order on its own
//     thread, with compute_threads OpenMP threads for the kernels;
//   - fault injection on compute jobs (scripted by job number, or random
//     with a seeded generator), of every error class of error.h, including
//     the sticky "needs a reset" state that only reset() clears.
// Features: the host CPU's (it runs the CPU kernels), so a cpu package that
// asks for "avx2" runs on sim exactly where it runs on cpu.
//
// Queues are fixed-size rings of DeviceJob pointers (kQueueCapacity each),
// so submitting allocates nothing. A submit to a full queue waits for room;
// a `done` callback must therefore not fill the queue of the thread it runs
// on (that submit throws UsageError instead of waiting forever).
//
// Thread safety: as Device. `done` and compute run on the device threads
// without any device lock held, so `done` may submit to this device; it
// must not throw, and must not call synchronize() or reset().
// The destructor waits for every submitted job, then stops the threads;
// every DeviceBuffer must be destroyed before the device.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/device.h"
#include "runtime/device_lock.h"

namespace kiln {

class SimDevice final : public Device {
 public:
  static constexpr size_t kQueueCapacity = 1024;
  static_assert(kQueueCapacity >= Device::kMinQueuedJobs);

  // Device "sim:<index>". `lock` is the attachment (DeviceManager's); it is
  // released when the device is destroyed. Tests may pass null to make a
  // device that no lock guards.
  SimDevice(uint32_t index, const SimDeviceConfig& config, std::unique_ptr<DeviceLock> lock = nullptr);
  ~SimDevice() override;

  // What SimDevice(index, config) would report, without creating it.
  static DeviceInfo describe(uint32_t index, const SimDeviceConfig& config);

  bool usesHostMemory() const override { return false; }
  DeviceBuffer allocate(uint64_t bytes) override;
  uint64_t memoryInUse() const override;
  void submit(DeviceJob& job) override;
  void synchronize() override;
  void reset() override;

 protected:
  void release(std::byte* data, uint64_t bytes) noexcept override;

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
  std::exception_ptr runCopy(const DeviceJob& job);
  std::exception_ptr runCompute(const DeviceJob& job);
  // The fault (if any) that compute job `job_number` gets; compute worker only.
  bool drawFault(uint64_t job_number, FaultKind* kind);
  std::exception_ptr failureOf(FaultKind kind, const std::string& message) const;
  void refuseOnWorker(const char* what) const;

  const SimDeviceConfig config_;
  const std::unique_ptr<DeviceLock> lock_;

  // Memory space. allocations_ maps each live block to its size, so that
  // reset() can overwrite them all; in_use_ is their sum.
  mutable std::mutex memory_mutex_;
  std::unordered_map<std::byte*, uint64_t> allocations_;
  std::atomic<uint64_t> in_use_{0};

  // Work. Invariant: submitted_ - completed_ jobs are queued or running;
  // synchronize() waits for them to be equal.
  std::mutex mutex_;
  Queue copies_{"copy"};
  Queue computes_{"compute"};
  std::condition_variable idle_;  // signalled when completed_ reaches submitted_
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  // The sticky failure: set by a fault of a reset class, cleared by reset().
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
