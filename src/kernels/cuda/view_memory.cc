// ViewMemory on a cuda device (cuda_steps.h): control flow's copies and
// counters in device memory, in order with the kernels on the queue's
// stream.
//
// A copy is queued (cudaMemcpyAsync, cudaMemcpy2DAsync for slices along an
// axis). A write of a counter or flag puts the value in a slot of pinned
// memory and queues its copy; the slots are reused once a read has waited
// for the stream (a Loop reads its condition after each body), or after a
// wait of their own when all are taken. A read waits for the stream, then
// takes the value from pinned memory.
//
// Errors do not throw here (running must not): a failed call leaves CUDA's
// error for the device, whose wait after each job reports it in the
// reference's error classes (cuda_device.cc), and a read that failed gives
// 0, so a Loop stops rather than spin on a value it never got.
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/cuda_steps.h"

namespace kiln::cuda {
namespace {

class CudaViewMemory final : public ViewMemory {
 public:
  explicit CudaViewMemory(const CudaQueue& queue) : stream_(queue.stream) {
    void* pinned = nullptr;
    check(cudaMallocHost(&pinned, (kWriteSlots + 1) * sizeof(uint64_t)), "cudaMallocHost (control flow)");
    pinned_ = static_cast<uint64_t*>(pinned);
  }
  ~CudaViewMemory() override { cudaFreeHost(pinned_); }
  CudaViewMemory(const CudaViewMemory&) = delete;
  CudaViewMemory& operator=(const CudaViewMemory&) = delete;

  void copy(std::byte* to, const std::byte* from, uint64_t bytes) override {
    if (to != from && bytes > 0) cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream_);
  }

  void copyRows(std::byte* to, uint64_t to_pitch, const std::byte* from, uint64_t from_pitch, uint64_t row_bytes,
                uint64_t rows) override {
    if (rows == 0 || row_bytes == 0) return;
    cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, row_bytes, rows, cudaMemcpyDefault, stream_);
  }

  void read(void* host, const std::byte* from, size_t bytes) override {
    uint64_t* slot = pinned_ + kWriteSlots;
    cudaError_t status = cudaMemcpyAsync(slot, from, bytes, cudaMemcpyDefault, stream_);
    if (status == cudaSuccess) status = cudaStreamSynchronize(stream_);
    if (status == cudaSuccess) std::memcpy(host, slot, bytes);
    else std::memset(host, 0, bytes);
    writes_ = 0;  // every queued write has been done
  }

  void write(std::byte* to, const void* host, size_t bytes) override {
    if (writes_ == kWriteSlots) {
      cudaStreamSynchronize(stream_);
      writes_ = 0;
    }
    uint64_t* slot = pinned_ + writes_++;
    std::memcpy(slot, host, bytes);
    cudaMemcpyAsync(to, slot, bytes, cudaMemcpyDefault, stream_);
  }

 private:
  static constexpr size_t kWriteSlots = 16;
  cudaStream_t stream_;
  uint64_t* pinned_ = nullptr;  // kWriteSlots slots for writes, then one for reads
  size_t writes_ = 0;           // slots taken since the stream was last waited for
};

}  // namespace

std::unique_ptr<ViewMemory> createViewMemory(void* queue) { return std::make_unique<CudaViewMemory>(queueOf(queue)); }

}  // namespace kiln::cuda
