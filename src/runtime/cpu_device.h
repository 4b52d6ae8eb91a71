// CpuDevice: the host's cores as a Device (include/kiln/device.h).
//
// Its memory is host memory, so usesHostMemory() is true and callers skip
// transfers; jobs run inline on the thread that submits them, which is
// also where `done` is called. Nothing is queued, so synchronize() has
// nothing to wait for and a device never fails: reset() only counts.
//
// The device is not locked: every process (and every replica) may attach
// its own CpuDevice, with compute_threads splitting the cores between them.
//
// Thread safety: every member may be called from any thread; memoryInUse
// is an atomic counter and jobs touch only the memory they name.
#pragma once

#include <atomic>
#include <cstdint>

#include "kiln/device.h"

namespace kiln {

class CpuDevice final : public Device {
 public:
  // `threads`: the kernel threads of this device; 0 means every core.
  explicit CpuDevice(uint32_t threads = 0);

  // What a CpuDevice with `threads` would report, without creating one.
  static DeviceInfo describe(uint32_t threads = 0);

  bool usesHostMemory() const override { return true; }
  DeviceBuffer allocate(uint64_t bytes) override;
  uint64_t memoryInUse() const override { return in_use_.load(std::memory_order_relaxed); }
  // Runs the job now on the calling thread, then calls its `done`.
  void submit(DeviceJob& job) override;
  void synchronize() override {}
  void reset() override { resets_.fetch_add(1, std::memory_order_relaxed); }

 protected:
  void release(std::byte* data, uint64_t bytes) noexcept override;

 private:
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace kiln
