// Blobs: the typed records a package file is made of.
//
// A package file is a sequence of blobs. Each starts with a fixed 128-byte
// header (docs/format.md gives its byte layout), followed by the blob's name,
// a small typed "info" section, and a 64-byte aligned payload. A reader walks
// the file from header to header using each header's total size.
//
//   type         name is            info holds                payload holds
//   Executable   unique, non-empty  (nothing)                 the compiled program (may be zstd-compressed)
//   Metadata     unique model name  the Metadata              (nothing)
//   TensorData   unique, = anchor   TensorInfo                one tensor's bytes
//   FeedData     unique, = anchor   TensorInfo, count         count tensors back to back
//   Opaque       unique             linked executable name    anything
//
// Thread safety: blob views returned by a PackageReader are immutable and may
// be read from any number of threads; lazy checksum verification is
// thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/metadata.h"
#include "kiln/tensor_info.h"

namespace kiln {

// The format version this build writes and reads. A file with a newer major
// version is refused; a newer minor version is read, ignoring what it added.
inline constexpr uint16_t kFormatVersionMajor = 1;
inline constexpr uint16_t kFormatVersionMinor = 0;

enum class BlobType : uint32_t {
  kExecutable = 1,
  kMetadata = 2,
  kTensorData = 3,
  kFeedData = 4,
  kOpaque = 5,
};

// "Executable", "Metadata", ...; "Unknown" for other codes.
std::string_view blobTypeName(BlobType type);

// Header flag bits.
inline constexpr uint32_t kBlobFlagCompressed = 1u << 0;  // payload is one zstd frame

// What a blob's header says, and where the blob is.
struct BlobInfo {
  BlobType type = BlobType::kExecutable;  // may hold an unknown code
  std::string name;
  std::string source;          // file path or memory-buffer name
  uint64_t offset = 0;         // of the header, from the start of the source
  uint16_t version_major = 0;
  uint16_t version_minor = 0;
  uint32_t flags = 0;
  uint64_t total_size = 0;     // header + name + info + payload + padding
  uint64_t payload_offset = 0; // from the start of the blob; multiple of 64
  uint64_t stored_size = 0;    // payload bytes in the file
  uint64_t raw_size = 0;       // payload bytes once decompressed
  uint64_t payload_checksum = 0;  // XXH3-64 of the stored payload bytes
  std::string producer;        // "kiln 0.2.0": kProducer (kiln/version.h)

  bool compressed() const { return (flags & kBlobFlagCompressed) != 0; }
};

// Common part of the blobs that have a payload.
class PayloadBlob {
 public:
  PayloadBlob(BlobInfo info, std::span<const std::byte> stored, bool verified);
  PayloadBlob(const PayloadBlob&) = delete;
  PayloadBlob& operator=(const PayloadBlob&) = delete;

  const BlobInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }

  // The payload exactly as stored (compressed if the blob is), pointing into
  // the mapped file: no copy. Verifies the checksum on first access unless
  // the reader was told to skip checksums; throws FormatError on mismatch.
  std::span<const std::byte> storedBytes() const;

  // Verifies the payload checksum now (once; later calls are free).
  void verifyChecksum() const;

 private:
  BlobInfo info_;
  std::span<const std::byte> stored_;
  mutable std::atomic<uint8_t> checksum_state_;  // 0 unchecked, 1 good, 2 bad
};

class ExecutableBlob : public PayloadBlob {
 public:
  using PayloadBlob::PayloadBlob;
  bool compressed() const { return info().compressed(); }
  // Size of the program once decompressed.
  uint64_t size() const { return info().raw_size; }
  // The program bytes, decompressed when needed (a copy).
  std::vector<std::byte> read() const;
};

class TensorDataBlob : public PayloadBlob {
 public:
  TensorDataBlob(BlobInfo info, std::span<const std::byte> stored, bool verified, TensorInfo tensor)
      : PayloadBlob(std::move(info), stored, verified), tensor_(std::move(tensor)) {}
  const TensorInfo& tensorInfo() const { return tensor_; }
  // The tensor's bytes in place (zero copy, 64-byte aligned in a mapped file).
  std::span<const std::byte> data() const { return storedBytes(); }

 private:
  TensorInfo tensor_;
};

class FeedDataBlob : public PayloadBlob {
 public:
  FeedDataBlob(BlobInfo info, std::span<const std::byte> stored, bool verified, TensorInfo tensor,
               uint64_t count)
      : PayloadBlob(std::move(info), stored, verified), tensor_(std::move(tensor)), count_(count) {}
  const TensorInfo& tensorInfo() const { return tensor_; }  // of ONE item
  uint64_t count() const { return count_; }
  std::span<const std::byte> data() const { return storedBytes(); }
  // Item `index` (< count()), in place.
  std::span<const std::byte> item(uint64_t index) const;

 private:
  TensorInfo tensor_;
  uint64_t count_;
};

class OpaqueBlob : public PayloadBlob {
 public:
  OpaqueBlob(BlobInfo info, std::span<const std::byte> stored, bool verified, std::string executable)
      : PayloadBlob(std::move(info), stored, verified), executable_(std::move(executable)) {}
  // Name of the linked executable; empty when not linked to one.
  const std::string& executable() const { return executable_; }
  std::span<const std::byte> data() const { return storedBytes(); }

 private:
  std::string executable_;
};

class MetadataBlob {
 public:
  MetadataBlob(BlobInfo info, Metadata metadata) : info_(std::move(info)), metadata_(std::move(metadata)) {}
  const BlobInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  const Metadata& metadata() const { return metadata_; }

 private:
  BlobInfo info_;
  Metadata metadata_;
};

}  // namespace kiln
