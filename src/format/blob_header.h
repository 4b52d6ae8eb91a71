// The fixed 128-byte blob header: its layout, encoding and the structural
// checks every header must pass before anything it points at is touched.
// docs/format.md is the specification; the offsets below implement it.
//
//   off size field
//     0    8 magic "KILNBLOB"
//     8    2 version_major
//    10    2 version_minor
//    12    4 header_size      (128 in version 1.0; larger in later minors)
//    16    4 blob_type
//    20    4 flags            (bit 0: payload is zstd-compressed)
//    24    8 total_size       (= align64(payload_offset + stored_size))
//    32    8 payload_offset   (from the blob's first byte; multiple of 64)
//    40    8 stored_size
//    48    8 raw_size
//    56    8 payload_checksum (XXH3-64 of the stored payload)
//    64    8 header_checksum  (XXH3-64 of header with this field zeroed,
//                              then name, then info)
//    72    4 name_size
//    76    4 info_size
//    80   32 producer         (UTF-8, NUL-padded)
//   112   16 reserved         (zero)
//   128      name, then info, then zero padding up to payload_offset
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kiln/blob.h"

namespace kiln {

inline constexpr std::array<char, 8> kBlobMagic = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B'};
inline constexpr uint32_t kBlobHeaderSize = 128;
inline constexpr uint64_t kPayloadAlignment = 64;
inline constexpr size_t kProducerFieldSize = 32;
inline constexpr uint32_t kMaxNameSize = 4096;
inline constexpr size_t kHeaderChecksumOffset = 64;

struct BlobHeader {
  uint16_t version_major = kFormatVersionMajor;
  uint16_t version_minor = kFormatVersionMinor;
  uint32_t header_size = kBlobHeaderSize;
  uint32_t type = 0;
  uint32_t flags = 0;
  uint64_t total_size = 0;
  uint64_t payload_offset = 0;
  uint64_t stored_size = 0;
  uint64_t raw_size = 0;
  uint64_t payload_checksum = 0;
  uint64_t header_checksum = 0;
  uint32_t name_size = 0;
  uint32_t info_size = 0;
  std::string producer;
};

inline uint64_t alignUp(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

std::array<std::byte, kBlobHeaderSize> encodeBlobHeader(const BlobHeader& header);

// Decodes the header at `offset` in `file` and checks everything about it
// that does not depend on the blob type: magic, version, sizes and offsets
// (overflow-safe, all inside the file), alignment, flags. Throws FormatError.
BlobHeader decodeBlobHeader(std::span<const std::byte> file, uint64_t offset, const std::string& source);

// The header checksum over the header bytes as stored (header_size bytes;
// the checksum field is treated as zero), the name and the info.
uint64_t computeHeaderChecksum(std::span<const std::byte> header_bytes, std::span<const std::byte> name,
                               std::span<const std::byte> info);

// Walks a whole file from header to header. Calls `visit` for each decoded
// header with its offset; throws FormatError on the first structural
// problem, including a file that does not end exactly at a blob's end.
void walkBlobChain(std::span<const std::byte> file, const std::string& source,
                   const std::function<void(const BlobHeader&, uint64_t offset)>& visit);

// Names are unique within a namespace: TensorData and FeedData share one
// (anchors bind to either by name); every other type has its own.
uint32_t nameNamespace(uint32_t blob_type);

}  // namespace kiln
