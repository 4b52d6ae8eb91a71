// XXH3-64 checksums (libxxhash), one-shot and streaming.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln {

uint64_t checksum64(std::span<const std::byte> bytes);

// Streaming form: update() any number of times, then digest(). The result
// equals checksum64() of the concatenated bytes.
class Checksum64 {
 public:
  Checksum64();
  ~Checksum64();
  Checksum64(const Checksum64&) = delete;
  Checksum64& operator=(const Checksum64&) = delete;

  void reset();
  void update(std::span<const std::byte> bytes);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

}  // namespace kiln
