#include "kiln/blob.h"

#include <fmt/format.h>
#include <zstd.h>

#include "core/checksum.h"
#include "kiln/error.h"

namespace kiln {

std::string_view blobTypeName(BlobType type) {
  switch (type) {
    case BlobType::kExecutable: return "Executable";
    case BlobType::kMetadata: return "Metadata";
    case BlobType::kTensorData: return "TensorData";
    case BlobType::kFeedData: return "FeedData";
    case BlobType::kOpaque: return "Opaque";
  }
  return "Unknown";
}

namespace {
constexpr uint8_t kUnchecked = 0;
constexpr uint8_t kGood = 1;
constexpr uint8_t kBad = 2;
}  // namespace

PayloadBlob::PayloadBlob(BlobInfo info, std::span<const std::byte> stored, bool verified)
    : info_(std::move(info)), stored_(stored), checksum_state_(verified ? kGood : kUnchecked) {}

std::span<const std::byte> PayloadBlob::storedBytes() const {
  verifyChecksum();
  return stored_;
}

void PayloadBlob::verifyChecksum() const {
  uint8_t state = checksum_state_.load(std::memory_order_acquire);
  if (state == kUnchecked) {
    // Two threads may both compute it; both reach the same verdict.
    state = checksum64(stored_) == info_.payload_checksum ? kGood : kBad;
    checksum_state_.store(state, std::memory_order_release);
  }
  if (state == kBad) {
    throw FormatError(info_.source, info_.offset + info_.payload_offset,
                      fmt::format("payload checksum mismatch in {} '{}': the file is corrupt",
                                  blobTypeName(info_.type), info_.name));
  }
}

std::vector<std::byte> ExecutableBlob::read() const {
  const std::span<const std::byte> stored = storedBytes();
  if (!compressed()) return {stored.begin(), stored.end()};

  const uint64_t at = info().offset + info().payload_offset;
  auto fail = [&](const std::string& problem) {
    throw FormatError(info().source, at, fmt::format("executable '{}': {}", name(), problem));
  };
  if (ZSTD_findFrameCompressedSize(stored.data(), stored.size()) != stored.size()) {
    fail("payload is not exactly one zstd frame");
  }
  // A streamed frame may not record its content size; the header's raw size
  // is then checked against what decompression produces.
  const unsigned long long content_size = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (content_size == ZSTD_CONTENTSIZE_ERROR) fail("payload is not a zstd frame");
  if (content_size != ZSTD_CONTENTSIZE_UNKNOWN && content_size != info().raw_size) {
    fail(fmt::format("zstd frame holds {} bytes, header says {}", content_size, info().raw_size));
  }
  std::vector<std::byte> raw(info().raw_size);
  const size_t result = ZSTD_decompress(raw.data(), raw.size(), stored.data(), stored.size());
  if (ZSTD_isError(result)) fail(fmt::format("zstd: {}", ZSTD_getErrorName(result)));
  if (result != raw.size()) fail(fmt::format("decompressed to {} bytes, expected {}", result, raw.size()));
  return raw;
}

std::span<const std::byte> FeedDataBlob::item(uint64_t index) const {
  if (index >= count_) {
    throw UsageError(fmt::format("feed '{}' has {} items; item {} requested", name(), count_, index));
  }
  const uint64_t size = tensor_.sizeInBytes();
  return data().subspan(index * size, size);
}

}  // namespace kiln
