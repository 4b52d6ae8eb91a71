// PinnedStaging (cuda_staging.h).
#include "runtime/cuda_staging.h"

#include <algorithm>
#include <cstring>

namespace kiln {
namespace {

constexpr size_t kParallelCopyMin = 2u << 20;  // below this one thread copies

// What CUDA knows `pointer` to be: pageable host memory
// (cudaMemoryTypeUnregistered), pinned host memory, device memory; or -1
// when it cannot tell.
int memoryType(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attributes.type;
}

int helperCount() {
  const unsigned cores = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cores / 4, 0u, 3u));
}

}  // namespace

PinnedStaging::PinnedStaging() : parts_(helperCount() + 1) {
  for (int i = 0; i + 1 < parts_; ++i) helpers_.emplace_back([this, i] { helperLoop(i); });
}

PinnedStaging::~PinnedStaging() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& helper : helpers_) helper.join();
  for (int slot = 0; slot < kSlots; ++slot) {
    if (moved_[slot] != nullptr) cudaEventDestroy(moved_[slot]);
    if (ring_[slot] != nullptr) cudaFreeHost(ring_[slot]);
  }
}

cudaError_t PinnedStaging::ensureRing() {
  for (int slot = 0; slot < kSlots; ++slot) {
    if (ring_[slot] != nullptr) continue;
    void* buffer = nullptr;
    if (cudaError_t status = cudaHostAlloc(&buffer, kChunkBytes, cudaHostAllocDefault); status != cudaSuccess) {
      return status;
    }
    ring_[slot] = static_cast<std::byte*>(buffer);
    if (cudaError_t status = cudaEventCreateWithFlags(&moved_[slot], cudaEventDisableTiming); status != cudaSuccess) {
      return status;
    }
  }
  return cudaSuccess;
}

cudaError_t PinnedStaging::copy(void* destination, const void* source, uint64_t bytes, cudaStream_t stream) {
  if (bytes >= kMinStagedBytes) {
    const int from = memoryType(source), to = memoryType(destination);
    const bool up = from == cudaMemoryTypeUnregistered && to == cudaMemoryTypeDevice;
    const bool down = from == cudaMemoryTypeDevice && to == cudaMemoryTypeUnregistered;
    if ((up || down) && ensureRing() == cudaSuccess) {
      constexpr size_t kAlign = 64u << 10;
      const size_t chunk = std::clamp<size_t>((bytes / 4 + kAlign - 1) / kAlign * kAlign, 1u << 20, kChunkBytes);
      return up ? toDevice(static_cast<std::byte*>(destination), static_cast<const std::byte*>(source), bytes, chunk,
                           stream)
                : toHost(static_cast<std::byte*>(destination), static_cast<const std::byte*>(source), bytes, chunk,
                         stream);
    }
    cudaGetLastError();  // a failed ring allocation: copy as CUDA would
  }
  cudaError_t status = cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream);
  return status == cudaSuccess ? cudaStreamSynchronize(stream) : status;
}

// Chunk i goes into slot i % kSlots once the engine has moved what the
// slot held before; the engine moves it while the next chunk is copied in.
cudaError_t PinnedStaging::toDevice(std::byte* device, const std::byte* host, uint64_t bytes, size_t chunk,
                                    cudaStream_t stream) {
  int slot = 0;
  for (uint64_t offset = 0; offset < bytes; offset += chunk, slot = (slot + 1) % kSlots) {
    const size_t size = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - offset));
    if (cudaError_t status = cudaEventSynchronize(moved_[slot]); status != cudaSuccess) return status;
    hostCopy(ring_[slot], host + offset, size);
    if (cudaError_t status = cudaMemcpyAsync(device + offset, ring_[slot], size, cudaMemcpyHostToDevice, stream);
        status != cudaSuccess) {
      return status;
    }
    if (cudaError_t status = cudaEventRecord(moved_[slot], stream); status != cudaSuccess) return status;
  }
  return cudaStreamSynchronize(stream);
}

// The engine runs up to kSlots chunks ahead of the memcpy out of the ring.
cudaError_t PinnedStaging::toHost(std::byte* host, const std::byte* device, uint64_t bytes, size_t chunk,
                                  cudaStream_t stream) {
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  auto sizeOf = [&](uint64_t index) { return static_cast<size_t>(std::min<uint64_t>(chunk, bytes - index * chunk)); };
  uint64_t issued = 0;
  for (uint64_t index = 0; index < chunks; ++index) {
    for (; issued < chunks && issued < index + kSlots; ++issued) {
      const int slot = static_cast<int>(issued % kSlots);
      if (cudaError_t status =
              cudaMemcpyAsync(ring_[slot], device + issued * chunk, sizeOf(issued), cudaMemcpyDeviceToHost, stream);
          status != cudaSuccess) {
        return status;
      }
      if (cudaError_t status = cudaEventRecord(moved_[slot], stream); status != cudaSuccess) return status;
    }
    const int slot = static_cast<int>(index % kSlots);
    if (cudaError_t status = cudaEventSynchronize(moved_[slot]); status != cudaSuccess) return status;
    hostCopy(host + index * chunk, ring_[slot], sizeOf(index));
  }
  return cudaSuccess;
}

void PinnedStaging::hostCopy(void* destination, const void* source, size_t bytes) {
  const int parts = parts_;
  if (parts == 1 || bytes < kParallelCopyMin) {
    std::memcpy(destination, source, bytes);
    return;
  }
  const size_t part = (bytes / static_cast<size_t>(parts) + 63) / 64 * 64;
  {
    std::lock_guard lock(mutex_);
    job_destination_ = static_cast<std::byte*>(destination);
    job_source_ = static_cast<const std::byte*>(source);
    job_bytes_ = bytes;
    pending_ = parts - 1;
    ++job_;
  }
  wake_.notify_all();
  const size_t own = std::min(part, bytes);  // this thread copies part 0
  std::memcpy(destination, source, own);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

void PinnedStaging::helperLoop(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || job_ != seen; });
    if (stop_) return;
    seen = job_;
    const size_t part = (job_bytes_ / static_cast<size_t>(parts_) + 63) / 64 * 64;
    const size_t begin = std::min(part * static_cast<size_t>(index + 1), job_bytes_);
    const size_t end = std::min(begin + part, job_bytes_);
    std::byte* destination = job_destination_ + begin;
    const std::byte* source = job_source_ + begin;
    lock.unlock();
    if (end > begin) std::memcpy(destination, source, end - begin);
    lock.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace kiln
