// ViewMemory: how the executor's control flow (If, Loop, Scan) moves bytes
// between tensor views and reads and writes its counters and flags.
//
// On the host these are plain memory operations (hostViewMemory). A device
// whose memory the host cannot touch supplies its own, ordered with the
// kernels on its queue (cuda::createViewMemory): there a copy is queued, not
// done on return, and read() waits for everything queued before it.
//
// Running never allocates: an implementation takes what it needs when it is
// made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln {

class ViewMemory {
 public:
  virtual ~ViewMemory() = default;
  // `bytes` from `from` to `to`; the two do not overlap unless they are
  // the same address (then nothing moves).
  virtual void copy(std::byte* to, const std::byte* from, uint64_t bytes) = 0;
  // `rows` rows of `row_bytes`: row r from from + r * from_pitch to
  // to + r * to_pitch (a slice along an axis, or its way back).
  virtual void copyRows(std::byte* to, uint64_t to_pitch, const std::byte* from, uint64_t from_pitch,
                        uint64_t row_bytes, uint64_t rows) = 0;
  // The `bytes` (at most 8) at `from` into `host`, once the work queued
  // before has written them.
  virtual void read(void* host, const std::byte* from, size_t bytes) = 0;
  // `bytes` (at most 8) of `host` to `to`, in order with the queued work;
  // `host` may be reused as soon as this returns.
  virtual void write(std::byte* to, const void* host, size_t bytes) = 0;
};

// Plain host memory.
class HostViewMemory final : public ViewMemory {
 public:
  void copy(std::byte* to, const std::byte* from, uint64_t bytes) override {
    if (to != from && bytes > 0) std::memmove(to, from, bytes);
  }
  void copyRows(std::byte* to, uint64_t to_pitch, const std::byte* from, uint64_t from_pitch, uint64_t row_bytes,
                uint64_t rows) override {
    for (uint64_t r = 0; r < rows; ++r) std::memcpy(to + r * to_pitch, from + r * from_pitch, row_bytes);
  }
  void read(void* host, const std::byte* from, size_t bytes) override { std::memcpy(host, from, bytes); }
  void write(std::byte* to, const void* host, size_t bytes) override { std::memcpy(to, host, bytes); }
};

inline ViewMemory& hostViewMemory() {
  static HostViewMemory memory;
  return memory;
}

}  // namespace kiln
