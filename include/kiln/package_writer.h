// PackageWriter: writes blobs into a package file.
//
// Blobs are written one at a time. begin*() starts a blob and returns a
// BlobWriter through which its payload is streamed in pieces of any size, so
// a 2 GiB tensor never needs a 2 GiB buffer. Starting the next blob, or
// close(), finishes the active one: its header is completed (sizes,
// checksum) in place. Only the newest BlobWriter is active; writing through
// an older one throws UsageError.
//
// Every argument is validated before anything is written. If finishing a
// blob fails (for example a TensorData received fewer bytes than its
// TensorInfo needs), the file is cut back to where that blob began and
// UsageError is thrown: the file never holds a half-written blob.
//
// Mode::kCreate writes a new file beside `path` and renames it over `path`
// when close() succeeds: `path` never shows a half-written package, and a
// process that has the old package loaded (mapped) keeps reading it intact
// (truncating a mapped file in place makes its readers die of SIGBUS). A
// writer whose close() fails, or that is destroyed by an exception, leaves
// `path` as it was.
//
// Mode::kAppend opens an existing package, checks that it is a well-formed
// chain of blobs, and adds blobs after them in place (the file only grows);
// names already present are refused.
//
// Thread safety: a PackageWriter and its BlobWriters must be used from one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/blob.h"
#include "kiln/metadata.h"

namespace kiln {

namespace detail {
struct WriterState;
}

class BlobWriter {
 public:
  // Appends payload bytes. Throws UsageError if this writer is no longer the
  // active one, or if the bytes exceed the size the blob declared.
  void write(std::span<const std::byte> bytes);
  void write(const void* data, size_t size);

  // Finishes this blob now (otherwise the next begin*() or the package's
  // close() does). Throws like PackageWriter::close().
  void close();

  const std::string& name() const { return name_; }
  // True while this is the package's active blob.
  bool isActive() const;

 private:
  friend class PackageWriter;
  BlobWriter(std::shared_ptr<detail::WriterState> state, uint64_t generation, std::string name);
  std::shared_ptr<detail::WriterState> state_;
  uint64_t generation_;
  std::string name_;
};

class PackageWriter {
 public:
  enum class Mode { kCreate, kAppend };

  // kCreate replaces or creates `path` (at close); kAppend requires a valid
  // package.
  explicit PackageWriter(const std::filesystem::path& path, Mode mode = Mode::kCreate);
  // Closes, reporting failure to the log (call close() to see errors);
  // during stack unwinding, abandons the package instead.
  ~PackageWriter();
  PackageWriter(const PackageWriter&) = delete;
  PackageWriter& operator=(const PackageWriter&) = delete;

  // `compress`: the payload is stored as one zstd frame at `level`.
  BlobWriter beginExecutable(const std::string& name, bool compress = false, int level = 3);
  // The blob expects exactly info.sizeInBytes() bytes.
  BlobWriter beginTensorData(const std::string& name, const TensorInfo& info);
  // The blob expects exactly count * info.sizeInBytes() bytes.
  BlobWriter beginFeedData(const std::string& name, const TensorInfo& info, uint64_t count);
  // `executable` may be empty (not linked).
  BlobWriter beginOpaque(const std::string& name, const std::string& executable);

  // Writes a Metadata blob at once; throws UsageError when
  // findMetadataProblem(metadata) reports one.
  void writeMetadata(const std::string& name, const Metadata& metadata);

  // One-call forms of begin*() + write() + close().
  void writeExecutable(const std::string& name, std::span<const std::byte> program, bool compress = false);
  void writeTensorData(const std::string& name, const TensorInfo& info, std::span<const std::byte> bytes);
  void writeFeedData(const std::string& name, const TensorInfo& info, uint64_t count,
                     std::span<const std::byte> bytes);
  void writeOpaque(const std::string& name, const std::string& executable, std::span<const std::byte> bytes);

  // Finishes the active blob, flushes and closes the file. Idempotent.
  void close();

  const std::filesystem::path& path() const;

 private:
  struct BlobStart {
    BlobType type;
    const std::string& name;
    std::vector<std::byte> info;      // encoded info section
    uint64_t expected_raw_size;       // or UINT64_MAX when any size goes
    bool compress = false;
    int level = 0;
  };
  BlobWriter beginBlob(const BlobStart& start);

  std::shared_ptr<detail::WriterState> state_;
};

}  // namespace kiln
