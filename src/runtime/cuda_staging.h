// PinnedStaging: copies between pageable host memory (what callers hand a
// ModelRunner: numpy arrays, std::vectors) and GPU memory through a ring
// of pinned (page-locked) host buffers.
//
// Why: the GPU's copy engines read and write only pinned memory. Given
// pageable memory, CUDA stages it itself, one chunk at a time and without
// overlap: on an H200, 6 GB/s to the GPU and 12 GB/s back, where pinned
// memory moves 55 GB/s. Here a chunk is copied into a pinned buffer (by
// several threads for large chunks) while the copy engine moves the chunk
// before it, so a transfer runs at about the speed of the host's memcpy.
//
// The ring (kSlots buffers of kChunkBytes) is allocated on the first large
// copy and kept. A copy moves in chunks of a quarter of its size (1 to 8
// MiB), so that even a copy of a few megabytes overlaps its two halves. Copies below kMinStagedBytes, and copies from or to
// pinned or device memory, go straight to cudaMemcpyAsync.
//
// Thread safety: one copy at a time (the device's copy worker).
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class PinnedStaging {
 public:
  static constexpr size_t kChunkBytes = 8u << 20;
  static constexpr int kSlots = 3;
  static constexpr uint64_t kMinStagedBytes = 1u << 20;

  PinnedStaging();
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Copies `bytes` from `source` to `destination` (cudaMemcpyDefault
  // decides the direction) on `stream`, and waits for it. Returns the
  // first CUDA error, or cudaSuccess.
  cudaError_t copy(void* destination, const void* source, uint64_t bytes, cudaStream_t stream);

 private:
  cudaError_t ensureRing();
  cudaError_t toDevice(std::byte* device, const std::byte* host, uint64_t bytes, size_t chunk, cudaStream_t stream);
  cudaError_t toHost(std::byte* host, const std::byte* device, uint64_t bytes, size_t chunk, cudaStream_t stream);
  // memcpy, split over the helper threads when large.
  void hostCopy(void* destination, const void* source, size_t bytes);
  void helperLoop(int index);

  const int parts_;  // memcpy parts of a large chunk: the helpers and the caller

  std::byte* ring_[kSlots] = {};
  cudaEvent_t moved_[kSlots] = {};  // the last copy-engine transfer of each buffer

  // Helpers for large memcpys: each copies its part of the current job.
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t job_ = 0;  // increments per job
  int pending_ = 0;   // helpers still copying the current job
  bool stop_ = false;
  std::byte* job_destination_ = nullptr;
  const std::byte* job_source_ = nullptr;
  size_t job_bytes_ = 0;
};

}  // namespace kiln
