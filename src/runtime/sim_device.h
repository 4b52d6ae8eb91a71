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
// The queues, worker threads, sticky failure state and fault injection are
// QueuedDevice's (queued_device.h).
//
// Thread safety: as Device. Every DeviceBuffer must be destroyed before the
// device.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kiln/device.h"
#include "runtime/device_lock.h"
#include "runtime/queued_device.h"

namespace kiln {

class SimDevice final : public QueuedDevice {
 public:
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

 protected:
  void release(std::byte* data, uint64_t bytes) noexcept override;
  std::exception_ptr runCopy(const DeviceJob& job) override;
  void onWorkerStart(bool compute) override;
  // Overwrites every buffer with 0xCD.
  void loseMemory() override;

 private:
  const SimDeviceConfig config_;
  const std::unique_ptr<DeviceLock> lock_;

  // Memory space. allocations_ maps each live block to its size, so that
  // reset() can overwrite them all; in_use_ is their sum.
  mutable std::mutex memory_mutex_;
  std::unordered_map<std::byte*, uint64_t> allocations_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace kiln
