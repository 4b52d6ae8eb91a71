#include "format/blob_header.h"

#include <fmt/format.h>

#include <cstring>

#include "core/byte_io.h"
#include "core/checksum.h"

namespace kiln {
namespace {

std::string printable(std::span<const std::byte> bytes) {
  std::string out;
  for (std::byte b : bytes) {
    const auto c = static_cast<unsigned char>(b);
    out += (c >= 0x20 && c < 0x7f) ? fmt::format("{}", static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

std::array<std::byte, kBlobHeaderSize> encodeBlobHeader(const BlobHeader& header) {
  ByteWriter out;
  out.raw(kBlobMagic.data(), kBlobMagic.size());
  out.u16(header.version_major);
  out.u16(header.version_minor);
  out.u32(kBlobHeaderSize);
  out.u32(header.type);
  out.u32(header.flags);
  out.u64(header.total_size);
  out.u64(header.payload_offset);
  out.u64(header.stored_size);
  out.u64(header.raw_size);
  out.u64(header.payload_checksum);
  out.u64(header.header_checksum);
  out.u32(header.name_size);
  out.u32(header.info_size);
  std::array<char, kProducerFieldSize> producer{};
  std::memcpy(producer.data(), header.producer.data(), std::min(header.producer.size(), producer.size()));
  out.raw(producer.data(), producer.size());
  const std::array<std::byte, 16> reserved{};
  out.raw(reserved.data(), reserved.size());

  std::array<std::byte, kBlobHeaderSize> bytes{};
  std::memcpy(bytes.data(), out.bytes().data(), bytes.size());
  return bytes;
}

BlobHeader decodeBlobHeader(std::span<const std::byte> file, uint64_t offset, const std::string& source) {
  auto fail = [&](uint64_t at, const std::string& problem) { throw FormatError(source, at, problem); };
  const uint64_t left = file.size() - offset;  // caller guarantees offset <= size
  if (left < kBlobHeaderSize) {
    fail(offset, fmt::format("truncated blob header: a header needs {} bytes, only {} remain in the file",
                             kBlobHeaderSize, left));
  }
  const std::span<const std::byte> bytes = file.subspan(offset, kBlobHeaderSize);
  if (std::memcmp(bytes.data(), kBlobMagic.data(), kBlobMagic.size()) != 0) {
    fail(offset, fmt::format("bad magic: expected 'KILNBLOB', found '{}' (not a kiln package, or a corrupt one)",
                             printable(bytes.first(8))));
  }

  ByteCursor cursor(bytes.subspan(8), source, offset + 8);
  BlobHeader h;
  h.version_major = cursor.u16("version_major");
  h.version_minor = cursor.u16("version_minor");
  h.header_size = cursor.u32("header_size");
  h.type = cursor.u32("blob_type");
  h.flags = cursor.u32("flags");
  h.total_size = cursor.u64("total_size");
  h.payload_offset = cursor.u64("payload_offset");
  h.stored_size = cursor.u64("stored_size");
  h.raw_size = cursor.u64("raw_size");
  h.payload_checksum = cursor.u64("payload_checksum");
  h.header_checksum = cursor.u64("header_checksum");
  h.name_size = cursor.u32("name_size");
  h.info_size = cursor.u32("info_size");
  const auto* producer = reinterpret_cast<const char*>(bytes.data() + 80);
  h.producer.assign(producer, strnlen(producer, kProducerFieldSize));

  if (h.version_major == 0) fail(offset + 8, "invalid format version 0.x");
  if (h.version_major > kFormatVersionMajor) {
    fail(offset + 8, fmt::format("format version {}.{} is newer than this build supports ({}.{}): upgrade kiln "
                                 "to read this package",
                                 h.version_major, h.version_minor, kFormatVersionMajor, kFormatVersionMinor));
  }
  if (h.header_size < kBlobHeaderSize || h.header_size % 8 != 0) {
    fail(offset + 12, fmt::format("header size {} is invalid: must be a multiple of 8 and at least {}",
                                  h.header_size, kBlobHeaderSize));
  }
  if (h.total_size == 0) {
    // What a writer leaves behind when it was stopped before finishing a blob.
    fail(offset + 24, "incomplete blob (total size 0): its writer did not finish it");
  }
  if (h.total_size % kPayloadAlignment != 0) {
    fail(offset + 24, fmt::format("total size {} is not a multiple of {}", h.total_size, kPayloadAlignment));
  }
  if (h.total_size > left) {
    fail(offset + 24, fmt::format("blob claims {} bytes but only {} remain in the file (truncated file?)",
                                  h.total_size, left));
  }
  if (h.payload_offset % kPayloadAlignment != 0) {
    fail(offset + 32, fmt::format("payload offset {} is not {}-byte aligned", h.payload_offset, kPayloadAlignment));
  }
  if (h.name_size == 0) fail(offset + 72, "blob name is empty");
  if (h.name_size > kMaxNameSize) {
    fail(offset + 72, fmt::format("name size {} exceeds the limit of {} bytes", h.name_size, kMaxNameSize));
  }
  // u32 + u32 + u32 cannot overflow u64.
  const uint64_t sections_end = uint64_t{h.header_size} + h.name_size + h.info_size;
  if (sections_end > h.payload_offset) {
    fail(offset + 72, fmt::format("header ({}), name ({}) and info ({}) run past the payload offset {}",
                                  h.header_size, h.name_size, h.info_size, h.payload_offset));
  }
  if (h.payload_offset > h.total_size || h.stored_size > h.total_size - h.payload_offset) {
    fail(offset + 40, fmt::format("payload ({} bytes at offset {}) runs past the end of the blob ({} bytes)",
                                  h.stored_size, h.payload_offset, h.total_size));
  }
  if (h.total_size != alignUp(h.payload_offset + h.stored_size, kPayloadAlignment)) {
    fail(offset + 24, fmt::format("total size {} disagrees with payload offset {} + stored size {} (expected {})",
                                  h.total_size, h.payload_offset, h.stored_size,
                                  alignUp(h.payload_offset + h.stored_size, kPayloadAlignment)));
  }
  if ((h.flags & ~kBlobFlagCompressed) != 0) {
    fail(offset + 20, fmt::format("unknown flags 0x{:x}", h.flags & ~kBlobFlagCompressed));
  }
  // A zstd frame expands at most 32768 times (an RLE block: 4 bytes for 128
  // KiB). A raw size beyond that is a lie that would size an allocation
  // before decompression could refute it (a 704-byte frame declaring 3 GB).
  constexpr uint64_t kZstdMaxRatio = 32768;
  if ((h.flags & kBlobFlagCompressed) && h.raw_size / kZstdMaxRatio > h.stored_size) {
    fail(offset + 48, fmt::format("compressed payload of {} bytes cannot hold the raw size {} (zstd expands at most "
                                  "{} times)",
                                  h.stored_size, h.raw_size, kZstdMaxRatio));
  }
  if (!(h.flags & kBlobFlagCompressed) && h.raw_size != h.stored_size) {
    fail(offset + 48, fmt::format("uncompressed payload: raw size {} differs from stored size {}", h.raw_size,
                                  h.stored_size));
  }
  const auto name = file.subspan(offset + h.header_size, h.name_size);
  if (std::memchr(name.data(), 0, name.size()) != nullptr) fail(offset + h.header_size, "blob name contains a NUL byte");
  return h;
}

uint64_t computeHeaderChecksum(std::span<const std::byte> header_bytes, std::span<const std::byte> name,
                               std::span<const std::byte> info) {
  Checksum64 checksum;
  checksum.update(header_bytes.first(kHeaderChecksumOffset));
  const std::array<std::byte, 8> zero{};
  checksum.update(zero);
  checksum.update(header_bytes.subspan(kHeaderChecksumOffset + 8));
  checksum.update(name);
  checksum.update(info);
  return checksum.digest();
}

void walkBlobChain(std::span<const std::byte> file, const std::string& source,
                   const std::function<void(const BlobHeader&, uint64_t offset)>& visit) {
  if (file.empty()) throw FormatError(source, 0, "empty file: not a kiln package");
  uint64_t offset = 0;
  while (offset < file.size()) {
    const BlobHeader header = decodeBlobHeader(file, offset, source);
    visit(header, offset);
    offset += header.total_size;
  }
}

uint32_t nameNamespace(uint32_t blob_type) {
  return blob_type == static_cast<uint32_t>(BlobType::kFeedData) ? static_cast<uint32_t>(BlobType::kTensorData)
                                                                 : blob_type;
}

}  // namespace kiln
