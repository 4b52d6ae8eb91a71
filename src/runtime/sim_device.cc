// SimDevice (sim_device.h): a counted memory space of host memory and
// transfers that take simulated time; the queues are QueuedDevice's.
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
    : QueuedDevice(describe(index, config), config), config_(config), lock_(std::move(lock)) {
  startWorkers();
}

SimDevice::~SimDevice() {
  stopWorkers();
  // Buffers still alive break the contract (the device must outlive them);
  // free their memory anyway rather than leak it.
  for (const auto& [data, size] : allocations_) di::freeAligned(data);
}

void SimDevice::onWorkerStart(bool compute) {
  // Kernels parallelise with OpenMP; its thread count is per calling
  // thread, so setting it here once covers every compute job.
  if (compute) omp_set_num_threads(static_cast<int>(info_.compute_threads));
}

void SimDevice::loseMemory() {
  std::lock_guard lock(memory_mutex_);
  for (const auto& [data, size] : allocations_) std::memset(data, 0xCD, size);
}

DeviceBuffer SimDevice::allocate(uint64_t bytes) {
  const uint64_t size = bytes == 0 ? 1 : bytes;  // an empty tensor still gets a block
  std::lock_guard lock(memory_mutex_);
  const uint64_t in_use = in_use_.load(std::memory_order_relaxed);
  if (size > info_.memory_bytes - in_use) {
    throw RecoverableDeviceError(id(), fmt::format("out of device memory: asked {} with {} of {} in use", di::humanBytes(size),
                                                   di::humanBytes(in_use), di::humanBytes(info_.memory_bytes)),
                                 RecoveryAction::kRerun);
  }
  std::byte* data = di::allocateAligned(size);
  if (data == nullptr) {
    throw RecoverableDeviceError(id(),
                                 fmt::format("out of host memory for device memory: asked {} with {} of {} in use",
                                             di::humanBytes(size), di::humanBytes(in_use), di::humanBytes(info_.memory_bytes)),
                                 RecoveryAction::kRerun);
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

std::exception_ptr SimDevice::runCopy(const DeviceJob& job) {
  waitUntil(Clock::now() + transferTime(config_, job.bytes));
  if (job.bytes != 0) std::memcpy(job.destination, job.source, job.bytes);
  return nullptr;
}

}  // namespace kiln
