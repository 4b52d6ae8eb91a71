#include "core/byte_io.h"

#include <fmt/format.h>

namespace kiln {

void ByteWriter::string(std::string_view text) {
  u32(static_cast<uint32_t>(text.size()));
  raw(text.data(), text.size());
}

void ByteCursor::need(size_t size, std::string_view field) const {
  if (remaining() < size) {
    fail(fmt::format("{} needs {} bytes but only {} remain in this section", field, size, remaining()));
  }
}

bool ByteCursor::boolean(std::string_view field) {
  const uint64_t at = offset();
  const uint8_t value = u8(field);
  if (value > 1) failAt(at, fmt::format("{} must be 0 or 1, found {}", field, value));
  return value == 1;
}

std::string ByteCursor::string(std::string_view field) {
  const uint32_t size = u32(field);
  need(size, field);
  std::string text(reinterpret_cast<const char*>(bytes_.data() + position_), size);
  position_ += size;
  return text;
}

uint32_t ByteCursor::count(std::string_view field, size_t min_item_size) {
  const uint64_t at = offset();
  const uint32_t count = u32(field);
  if (min_item_size > 0 && count > remaining() / min_item_size) {
    failAt(at, fmt::format("{} says {} items, but only {} bytes remain", field, count, remaining()));
  }
  return count;
}

void ByteCursor::fail(const std::string& problem) const { failAt(offset(), problem); }

void ByteCursor::failAt(uint64_t absolute_offset, const std::string& problem) const {
  throw FormatError(source_, absolute_offset, problem);
}

}  // namespace kiln
