// PackageReader: opens one or several package files as one model view.
//
// The files are memory-mapped; uncompressed payloads (weights, feeds) are
// used in place, so opening a package costs a walk over its headers, not a
// read of its bytes. Everything a header, name or info section says is
// validated when the reader is constructed; a payload's checksum is verified
// on its first access (or all at once with ChecksumPolicy::kEager).
//
// Across all files: names are unique per blob type (TensorData and FeedData
// share one namespace, since anchors bind to either by name); every
// Metadata's executable exists; every Opaque's linked executable exists;
// every anchor provided by a TensorData/FeedData blob has the same dtype and
// shape as the blob's data. Blobs of unknown type are skipped with a warning.
// Any violation throws FormatError naming the file, the byte offset and what
// was wrong.
//
// Ownership: the reader owns the mappings; every span and blob view it hands
// out stays valid until the reader is destroyed (or moved from).
// Thread safety: after construction, all const methods may run concurrently.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/blob.h"

namespace kiln {

enum class ChecksumPolicy {
  kOnFirstAccess,  // verify a payload's checksum when it is first read
  kEager,          // verify every payload while opening
  kSkip,           // never verify payloads (trusted storage; fuzzing)
};

struct ReaderOptions {
  ChecksumPolicy checksums = ChecksumPolicy::kOnFirstAccess;
};

// A package already in memory; the caller keeps `bytes` alive and unchanged
// for the reader's lifetime.
struct MemorySource {
  std::string name;
  std::span<const std::byte> bytes;
};

class PackageReader {
 public:
  explicit PackageReader(const std::filesystem::path& path, ReaderOptions options = {});
  explicit PackageReader(const std::vector<std::filesystem::path>& paths, ReaderOptions options = {});
  static PackageReader fromMemory(const std::vector<MemorySource>& sources, ReaderOptions options = {});

  PackageReader(PackageReader&&) noexcept;
  PackageReader& operator=(PackageReader&&) noexcept;
  ~PackageReader();

  // File paths (or memory-source names), in the order given.
  const std::vector<std::string>& sources() const;

  // Every blob header, unknown types included, in file order.
  const std::vector<BlobInfo>& blobs() const;

  std::vector<const ExecutableBlob*> executables() const;
  std::vector<const MetadataBlob*> metadata() const;
  std::vector<const TensorDataBlob*> tensorData() const;
  std::vector<const FeedDataBlob*> feedData() const;
  std::vector<const OpaqueBlob*> opaques() const;

  // nullptr when there is no blob of that type and name.
  const ExecutableBlob* findExecutable(std::string_view name) const;
  const MetadataBlob* findMetadata(std::string_view name) const;
  const TensorDataBlob* findTensorData(std::string_view name) const;
  const FeedDataBlob* findFeedData(std::string_view name) const;
  const OpaqueBlob* findOpaque(std::string_view name) const;

  // True when a TensorData or FeedData blob of the anchor's name exists: the
  // runtime binds it; otherwise the user provides the data.
  bool isPackageProvided(const Anchor& anchor) const;

  // Verifies every payload checksum now; throws FormatError on the first
  // mismatch.
  void verifyAllChecksums() const;

 private:
  struct Impl;
  explicit PackageReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
