// CudaDevice (cuda_device.h).
#include "runtime/cuda_device.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/elementwise_program.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kiln/error.h"
#include "runtime/cuda_errors.h"
#include "runtime/cuda_staging.h"
#include "runtime/device_internal.h"

namespace kiln {
namespace {

namespace di = device_internal;
namespace ce = cuda_errors;

// cuda_errors.h spells the codes without CUDA's headers; they must agree.
static_assert(ce::kMemoryAllocation == cudaErrorMemoryAllocation);
static_assert(ce::kInvalidValue == cudaErrorInvalidValue);
static_assert(ce::kInvalidConfiguration == cudaErrorInvalidConfiguration);
static_assert(ce::kInvalidDeviceFunction == cudaErrorInvalidDeviceFunction);
static_assert(ce::kNoKernelImageForDevice == cudaErrorNoKernelImageForDevice);
static_assert(ce::kEccUncorrectable == cudaErrorECCUncorrectable);
static_assert(ce::kIllegalAddress == cudaErrorIllegalAddress);
static_assert(ce::kLaunchOutOfResources == cudaErrorLaunchOutOfResources);
static_assert(ce::kLaunchTimeout == cudaErrorLaunchTimeout);
static_assert(ce::kAssert == cudaErrorAssert);
static_assert(ce::kHardwareStackError == cudaErrorHardwareStackError);
static_assert(ce::kIllegalInstruction == cudaErrorIllegalInstruction);
static_assert(ce::kMisalignedAddress == cudaErrorMisalignedAddress);
static_assert(ce::kInvalidAddressSpace == cudaErrorInvalidAddressSpace);
static_assert(ce::kInvalidPc == cudaErrorInvalidPc);
static_assert(ce::kLaunchFailure == cudaErrorLaunchFailure);

// A kernel that writes through a wild pointer (an elementwise negation from
// address 16 to 64): the real illegal address of
// CudaDeviceConfig::illegal_address_at_jobs.
void launchWildWrite(cudaStream_t stream) {
  cuda::DeviceProgram program;
  program.ops = 1;
  program.inputs = 1;
  program.op[0] = static_cast<uint8_t>(ElementwiseOp::kNeg);
  program.a[0] = 0;
  program.b[0] = -1;
  cuda::Pointers pointers;
  pointers.in[0] = reinterpret_cast<const float*>(16);
  pointers.out = reinterpret_cast<float*>(64);
  cuda::launchElementwise(program, cuda::Indexing{}, pointers, 1024, stream);
}

DeviceInfo describeGpu(int index, const cudaDeviceProp& properties) {
  DeviceInfo info;
  info.id = fmt::format("cuda:{}", index);
  info.kind = DeviceKind::kCuda;
  info.memory_bytes = properties.totalGlobalMem;
  info.compute_threads = 1;
  info.features = {fmt::format("sm_{}{}", properties.major, properties.minor), properties.name};
  return info;
}

}  // namespace

std::vector<DeviceInfo> CudaDevice::describeAll() {
  int count = 0;
  // No driver, or no GPU: no cuda devices (not an error).
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  std::vector<DeviceInfo> all;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, i) == cudaSuccess) all.push_back(describeGpu(i, properties));
  }
  return all;
}

CudaDevice::CudaDevice(uint32_t index, const CudaDeviceConfig& config, std::unique_ptr<DeviceLock> lock)
    : QueuedDevice(
          [index] {
            cudaDeviceProp properties{};
            cuda::check(cudaGetDeviceProperties(&properties, static_cast<int>(index)),
                        fmt::format("cuda:{}", index).c_str());
            return describeGpu(static_cast<int>(index), properties);
          }(),
          config),
      index_(index),
      config_(config),
      lock_(std::move(lock)) {
  queue_ = cuda::createQueue(static_cast<int>(index));
  cudaStream_t copies = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), "cudaStreamCreate (copies)");
  copy_stream_ = copies;
  const char* staging = std::getenv("KILN_CUDA_STAGING");
  if (staging == nullptr || std::string_view(staging) != "0") staging_ = std::make_unique<PinnedStaging>();
  startWorkers();
}

CudaDevice::~CudaDevice() {
  stopWorkers();
  staging_.reset();
  queue_.reset();
  cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
  // Buffers still alive break the contract (the device must outlive them).
  for (const auto& [data, size] : allocations_) cudaFree(data);
}

void* CudaDevice::kernelQueue() const { return queue_.get(); }

void CudaDevice::onWorkerStart(bool /*compute*/) { cudaSetDevice(static_cast<int>(index_)); }

DeviceBuffer CudaDevice::allocate(uint64_t bytes) {
  if (std::exception_ptr unusable = permanentFailure()) std::rethrow_exception(unusable);
  const uint64_t size = bytes == 0 ? 1 : bytes;
  std::lock_guard lock(memory_mutex_);
  cudaSetDevice(static_cast<int>(index_));
  void* data = nullptr;
  const cudaError_t status = cudaMalloc(&data, size);
  if (status != cudaSuccess && status != cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::rethrow_exception(failure(status, "cudaMalloc"));
  }
  if (status != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw RecoverableDeviceError(id(),
                                 fmt::format("out of device memory: asked {} with {} in use by kiln and {} free of {} ({})",
                                             di::humanBytes(size), di::humanBytes(in_use_.load()),
                                             di::humanBytes(free_bytes), di::humanBytes(total), cudaGetErrorString(status)),
                                 RecoveryAction::kRerun);
  }
  auto* block = static_cast<std::byte*>(data);
  try {
    allocations_.emplace(block, size);
  } catch (...) {
    cudaFree(data);
    throw;
  }
  in_use_.fetch_add(size, std::memory_order_relaxed);
  return DeviceBuffer(this, block, size);
}

uint64_t CudaDevice::memoryInUse() const { return in_use_.load(std::memory_order_relaxed); }

void CudaDevice::release(std::byte* data, uint64_t bytes) noexcept {
  std::lock_guard lock(memory_mutex_);
  allocations_.erase(data);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  cudaSetDevice(static_cast<int>(index_));
  cudaFree(data);
}

std::exception_ptr CudaDevice::failure(int status, const char* during) {
  const FaultKind kind = cuda_errors::classify(status);
  std::string message = fmt::format("{} failed: {} ({})", during, cudaGetErrorString(static_cast<cudaError_t>(status)),
                                    cudaGetErrorName(static_cast<cudaError_t>(status)));
  if (cuda_errors::corruptsContext(status)) {
    message += "; the CUDA context is corrupted and CUDA gives this process no new one on this GPU: only a new "
               "process can use it";
  }
  markFailed(kind, message);
  return failureOf(kind, message);
}

std::exception_ptr CudaDevice::runCopy(const DeviceJob& job) {
  if (job.bytes == 0) return nullptr;
  auto stream = static_cast<cudaStream_t>(copy_stream_);
  cudaError_t status;
  if (staging_ != nullptr) {
    status = staging_->copy(job.destination, job.source, job.bytes, stream);
  } else {
    status = cudaMemcpyAsync(job.destination, job.source, job.bytes, cudaMemcpyDefault, stream);
    if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  }
  return status == cudaSuccess ? nullptr : failure(status, "copy");
}

std::exception_ptr CudaDevice::runCompute(const DeviceJob& job) {
  std::exception_ptr error = QueuedDevice::runCompute(job);
  const auto& wild = config_.illegal_address_at_jobs;
  if (std::find(wild.begin(), wild.end(), runningComputeJob()) != wild.end()) launchWildWrite(queue_->stream);
  // Wait for what the job launched, also when it threw after launching.
  cudaError_t status = cudaStreamSynchronize(queue_->stream);
  if (status == cudaSuccess) status = cudaGetLastError();
  if (status != cudaSuccess) return failure(status, "compute job");
  return error;
}

void CudaDevice::loseMemory() {
  std::lock_guard lock(memory_mutex_);
  cudaSetDevice(static_cast<int>(index_));
  for (const auto& [data, size] : allocations_) cudaMemset(data, 0xCD, size);
  cudaDeviceSynchronize();
}

}  // namespace kiln
