#include "core/checksum.h"

#include <xxhash.h>

#include <new>

namespace kiln {

uint64_t checksum64(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

Checksum64::Checksum64() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  reset();
}

Checksum64::~Checksum64() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Checksum64::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

void Checksum64::update(std::span<const std::byte> bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

uint64_t Checksum64::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

}  // namespace kiln
