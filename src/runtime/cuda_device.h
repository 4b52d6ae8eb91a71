// CudaDevice: an NVIDIA GPU as a kiln device (include/kiln/device.h).
// Built only with KILN_CUDA.
//
//   memory    cudaMalloc'd blocks, counted against the GPU's free memory
//             at attach time; usesHostMemory() is false, so callers move
//             data with copy jobs.
//   copies    the copy worker issues cudaMemcpyAsync on a copy stream of
//             its own and waits for it, so transfers overlap compute;
//             large copies from or to pageable host memory go through
//             pinned buffers (cuda_staging.h; KILN_CUDA_STAGING=0: not).
//   compute   the compute worker runs the job (which launches kernels on
//             the device's CudaQueue stream, kernels/cuda/cuda_queue.h),
//             then waits for the stream; a CUDA error is reported in the
//             class cuda_errors.h gives, and leaves the device failed
//             until reset() unless it is out of memory.
//   reset()   clears the failed state and overwrites memory with 0xCD.
//             After an error that corrupts the CUDA context (an illegal
//             address) nothing in the process can use the GPU again, so
//             reset() throws that error's class again (RecoveryAction
//             kRestartProcess): the process must exit.
//   faults    CudaDeviceConfig's injected faults, as sim's, and real
//             illegal addresses (illegal_address_at_jobs).
//
// Thread safety: as Device; the queues are QueuedDevice's.
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

namespace cuda {
struct CudaQueue;
}

class PinnedStaging;

class CudaDevice final : public QueuedDevice {
 public:
  // Device "cuda:<index>". Throws UsageError when CUDA cannot open it.
  CudaDevice(uint32_t index, const CudaDeviceConfig& config, std::unique_ptr<DeviceLock> lock = nullptr);
  ~CudaDevice() override;

  // The GPUs of this machine (none when there is no driver or no GPU).
  static std::vector<DeviceInfo> describeAll();

  bool usesHostMemory() const override { return false; }
  DeviceBuffer allocate(uint64_t bytes) override;
  uint64_t memoryInUse() const override;
  void* kernelQueue() const override;

  const CudaDeviceConfig& config() const { return config_; }

 protected:
  void release(std::byte* data, uint64_t bytes) noexcept override;
  std::exception_ptr runCopy(const DeviceJob& job) override;
  std::exception_ptr runCompute(const DeviceJob& job) override;
  void onWorkerStart(bool compute) override;
  void loseMemory() override;

 private:
  // The error of failed CUDA call `status` (a cudaError_t), in its class,
  // which also marks the device failed (QueuedDevice::markFailed).
  std::exception_ptr failure(int status, const char* during);

  const uint32_t index_;
  const CudaDeviceConfig config_;
  const std::unique_ptr<DeviceLock> lock_;
  std::unique_ptr<cuda::CudaQueue> queue_;
  void* copy_stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<PinnedStaging> staging_;  // null: KILN_CUDA_STAGING=0

  mutable std::mutex memory_mutex_;
  std::unordered_map<std::byte*, uint64_t> allocations_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace kiln
