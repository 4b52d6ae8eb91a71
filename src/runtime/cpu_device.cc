// CpuDevice (cpu_device.h): jobs run inline, memory is aligned host memory.
//
// Kernels on the cpu device use OpenMP's threads. compute_threads becomes
// the submitting thread's OpenMP thread count before a compute runs: the
// setting is per thread, so replicas that each own a CpuDevice and submit
// from their own threads split the cores without oversubscribing them.
#include "runtime/cpu_device.h"

#include <fmt/format.h>
#include <omp.h>

#include <cstring>

#include "kiln/error.h"
#include "runtime/device_internal.h"

namespace kiln {

namespace di = device_internal;

DeviceInfo CpuDevice::describe(uint32_t threads) {
  DeviceInfo info;
  info.id = "cpu";
  info.kind = DeviceKind::kCpu;
  info.memory_bytes = di::hostMemoryBytes();
  info.compute_threads = threads == 0 ? di::hostCores() : threads;
  info.features = di::hostCpuFeatures();
  return info;
}

CpuDevice::CpuDevice(uint32_t threads) : Device(describe(threads)) {}

DeviceBuffer CpuDevice::allocate(uint64_t bytes) {
  // A zero-byte request (an empty tensor) still gets a distinct block.
  const uint64_t size = bytes == 0 ? 1 : bytes;
  std::byte* data = di::allocateAligned(size);
  if (data == nullptr) {
    throw RecoverableDeviceError(id(),
                                 fmt::format("out of host memory: asked {} with {} in use on this device, {} physical",
                                             di::humanBytes(size), di::humanBytes(memoryInUse()),
                                             di::humanBytes(info_.memory_bytes)),
                                 RecoveryAction::kRerun);
  }
  in_use_.fetch_add(size, std::memory_order_relaxed);
  return DeviceBuffer(this, data, size);
}

void CpuDevice::release(std::byte* data, uint64_t bytes) noexcept {
  di::freeAligned(data);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void CpuDevice::submit(DeviceJob& job) {
  di::checkJob(id(), job);
  std::exception_ptr error;
  switch (job.kind) {
    case DeviceJob::Kind::kCopyToDevice:
    case DeviceJob::Kind::kCopyToHost:
      if (job.bytes != 0) std::memcpy(job.destination, job.source, job.bytes);
      break;
    case DeviceJob::Kind::kCompute: {
      const int threads = static_cast<int>(info_.compute_threads);
      if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
      try {
        job.compute(job.context);
      } catch (...) {
        error = di::asDeviceError(id(), std::current_exception());
      }
      compute_jobs_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  // The job belongs to the submitter again once `done` runs: nothing after
  // this line may touch it.
  job.done(job, std::move(error));
}

}  // namespace kiln
