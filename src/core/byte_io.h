// Little-endian encoding and bounds-checked decoding of the primitives the
// package format is built from (docs/format.md, "Encoding").
//
//   u8 u16 u32 u64 i64   fixed width, little-endian
//   string               u32 byte length, then UTF-8 bytes (no terminator)
//   list<T>              u32 count, then count items
//
// ByteCursor never reads outside its span: every read checks the remaining
// length first and throws FormatError with the absolute offset of the field.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little, "kiln's format code assumes a little-endian host");

class ByteWriter {
 public:
  void u8(uint8_t value) { raw(&value, 1); }
  void u16(uint16_t value) { raw(&value, 2); }
  void u32(uint32_t value) { raw(&value, 4); }
  void u64(uint64_t value) { raw(&value, 8); }
  void i64(int64_t value) { raw(&value, 8); }
  void string(std::string_view text);
  void raw(const void* data, size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    bytes_.insert(bytes_.end(), bytes, bytes + size);
  }

  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class ByteCursor {
 public:
  // `base_offset` is the absolute offset of bytes[0] inside `source`, used
  // in error messages.
  ByteCursor(std::span<const std::byte> bytes, std::string source, uint64_t base_offset)
      : bytes_(bytes), source_(std::move(source)), base_offset_(base_offset) {}

  uint8_t u8(std::string_view field) { return fixed<uint8_t>(field); }
  uint16_t u16(std::string_view field) { return fixed<uint16_t>(field); }
  uint32_t u32(std::string_view field) { return fixed<uint32_t>(field); }
  uint64_t u64(std::string_view field) { return fixed<uint64_t>(field); }
  int64_t i64(std::string_view field) { return fixed<int64_t>(field); }
  bool boolean(std::string_view field);
  std::string string(std::string_view field);
  // The next `size` bytes, in place (valid while the underlying bytes are).
  std::span<const std::byte> bytes(size_t size, std::string_view field) {
    need(size, field);
    const auto result = bytes_.subspan(position_, size);
    position_ += size;
    return result;
  }

  // Reads a list count and checks that `count` items of at least
  // `min_item_size` bytes can still fit, so that a corrupt count cannot make
  // the caller reserve huge amounts of memory.
  uint32_t count(std::string_view field, size_t min_item_size);

  size_t remaining() const { return bytes_.size() - position_; }
  uint64_t offset() const { return base_offset_ + position_; }
  [[noreturn]] void fail(const std::string& problem) const;
  [[noreturn]] void failAt(uint64_t absolute_offset, const std::string& problem) const;

 private:
  template <typename T>
  T fixed(std::string_view field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  void need(size_t size, std::string_view field) const;

  std::span<const std::byte> bytes_;
  size_t position_ = 0;
  std::string source_;
  uint64_t base_offset_;
};

}  // namespace kiln
