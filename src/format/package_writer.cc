#include "kiln/package_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <set>

#include "core/checksum.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "format/blob_header.h"
#include "format/info_codec.h"
#include "kiln/error.h"
#include "kiln/version.h"

namespace kiln {
namespace detail {

inline constexpr uint64_t kUnknownSize = std::numeric_limits<uint64_t>::max();
inline constexpr size_t kBufferSize = size_t{1} << 20;

// Everything a PackageWriter and its BlobWriters share. Invariant: the file
// holds `committed_size` bytes of complete blobs, followed (while a blob is
// active) by that blob's header placeholder, name, info and the payload
// written so far, part of which may still sit in `buffer`.
struct WriterState {
  std::filesystem::path path;
  std::filesystem::path temporary;  // kCreate: the file written, renamed to `path` at close
  int fd = -1;
  uint64_t committed_size = 0;
  std::set<std::pair<uint32_t, std::string>> names;  // (namespace, name) in the file
  uint64_t generation = 0;  // of the active blob; 0 = none is active
  uint64_t next_generation = 1;

  // The active blob.
  BlobHeader header;
  std::string name;
  std::vector<std::byte> info;
  uint64_t expected_raw_size = kUnknownSize;
  uint64_t raw_written = 0;
  uint64_t stored_written = 0;
  Checksum64 checksum;
  ZSTD_CCtx* zstd = nullptr;
  std::vector<std::byte> buffer;  // bytes after the file's current end
  std::vector<std::byte> compressed_chunk;  // zstd output, reused across writes

  ~WriterState() {
    ZSTD_freeCCtx(zstd);
    if (fd >= 0) ::close(fd);
    if (!temporary.empty()) ::unlink(temporary.c_str());  // never published
  }

  void writeAll(const std::byte* data, size_t size) {
    while (size > 0) {
      const ssize_t written = ::write(fd, data, size);
      if (written < 0) {
        if (errno == EINTR) continue;
        throw IoError("cannot write " + path.string(), errno);
      }
      data += written;
      size -= static_cast<size_t>(written);
    }
  }

  void flushBuffer() {
    writeAll(buffer.data(), buffer.size());
    buffer.clear();
  }

  // Appends payload bytes as stored (after compression, if any).
  void appendStored(std::span<const std::byte> bytes) {
    checksum.update(bytes);
    stored_written += bytes.size();
    if (buffer.size() + bytes.size() > kBufferSize) flushBuffer();
    if (bytes.size() >= kBufferSize) {
      writeAll(bytes.data(), bytes.size());  // large pieces skip the copy
    } else {
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
    }
  }

  void compress(std::span<const std::byte> input, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{input.data(), input.size(), 0};
    if (compressed_chunk.empty()) compressed_chunk.resize(ZSTD_CStreamOutSize());
    std::span<std::byte> chunk(compressed_chunk);
    for (;;) {
      ZSTD_outBuffer out{chunk.data(), chunk.size(), 0};
      const size_t left = ZSTD_compressStream2(zstd, &out, &in, mode);
      if (ZSTD_isError(left)) throw Error(fmt::format("zstd compression failed: {}", ZSTD_getErrorName(left)));
      appendStored(chunk.first(out.pos));
      const bool done = mode == ZSTD_e_end ? left == 0 : in.pos == in.size;
      if (done) return;
    }
  }

  // Cuts the file back to the last complete blob and forgets the active one.
  void abandonActive() noexcept {
    generation = 0;
    buffer.clear();
    ZSTD_freeCCtx(zstd);
    zstd = nullptr;
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(committed_size)) == 0) {
      ::lseek(fd, static_cast<off_t>(committed_size), SEEK_SET);
    }
  }

  void finishActive() {
    if (generation == 0) return;
    try {
      finishActiveOrThrow();
    } catch (...) {
      abandonActive();
      throw;
    }
  }

  void finishActiveOrThrow() {
    if (zstd != nullptr) compress({}, ZSTD_e_end);
    if (expected_raw_size != kUnknownSize && raw_written != expected_raw_size) {
      throw UsageError(fmt::format("{} '{}' needs exactly {} payload bytes but {} were written; the blob was not "
                                   "written",
                                   blobTypeName(static_cast<BlobType>(header.type)), name, expected_raw_size,
                                   raw_written));
    }
    header.stored_size = stored_written;
    header.raw_size = raw_written;
    header.payload_checksum = checksum.digest();
    header.total_size = alignUp(header.payload_offset + header.stored_size, kPayloadAlignment);
    buffer.resize(buffer.size() + (header.total_size - header.payload_offset - header.stored_size));
    flushBuffer();

    header.header_checksum = 0;
    auto bytes = encodeBlobHeader(header);
    header.header_checksum =
        computeHeaderChecksum(bytes, std::as_bytes(std::span(name.data(), name.size())), info);
    bytes = encodeBlobHeader(header);
    if (::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(committed_size)) !=
        static_cast<ssize_t>(bytes.size())) {
      throw IoError("cannot write header in " + path.string(), errno);
    }
    names.emplace(nameNamespace(header.type), name);
    committed_size += header.total_size;
    generation = 0;
    ZSTD_freeCCtx(zstd);
    zstd = nullptr;
  }

  void requireOpen() const {
    if (fd < 0) throw UsageError("package writer for " + path.string() + " is closed");
  }
};

}  // namespace detail

using detail::kUnknownSize;
using detail::WriterState;

namespace {

void checkName(const std::string& name, std::string_view what) {
  if (name.empty()) throw UsageError(fmt::format("{} name must not be empty", what));
  if (name.size() > kMaxNameSize) {
    throw UsageError(fmt::format("{} name is {} bytes; the limit is {}", what, name.size(), kMaxNameSize));
  }
  if (name.find('\0') != std::string::npos) throw UsageError(fmt::format("{} name contains a NUL byte", what));
}

uint64_t checkedTensorSize(const TensorInfo& info, uint64_t count, const std::string& name) {
  if (!isValidDType(static_cast<uint8_t>(info.dtype))) throw UsageError(fmt::format("'{}': undefined dtype", name));
  if (!info.isStatic()) {
    throw UsageError(fmt::format("'{}': stored tensors need a static shape, got {}", name, info.shapeString()));
  }
  if (info.shape.size() > kMaxRank) throw UsageError(fmt::format("'{}': rank {} exceeds {}", name, info.shape.size(), kMaxRank));
  const std::optional<int64_t> total =
      multiplySizes(static_cast<int64_t>(info.sizeInBytes()), static_cast<int64_t>(count));
  if (!total) throw UsageError(fmt::format("'{}': {} items of {} bytes overflow", name, count, info.sizeInBytes()));
  return static_cast<uint64_t>(*total);
}

// Opens `path` for appending after checking it is a well-formed chain of
// blobs; records the names it holds.
void openForAppend(WriterState& state) {
  {
    MappedFile existing(state.path);
    const std::string source = state.path.string();
    walkBlobChain(existing.bytes(), source, [&](const BlobHeader& header, uint64_t offset) {
      const auto* name = reinterpret_cast<const char*>(existing.bytes().data() + offset + header.header_size);
      state.names.emplace(nameNamespace(header.type), std::string(name, header.name_size));
    });
    state.committed_size = existing.bytes().size();
  }
  state.fd = ::open(state.path.c_str(), O_RDWR | O_CLOEXEC);
  if (state.fd < 0) throw IoError("cannot open " + state.path.string() + " for appending", errno);
  if (::lseek(state.fd, static_cast<off_t>(state.committed_size), SEEK_SET) < 0) {
    throw IoError("cannot seek in " + state.path.string(), errno);
  }
}

}  // namespace

// ---------------------------------------------------------------- BlobWriter

BlobWriter::BlobWriter(std::shared_ptr<WriterState> state, uint64_t generation, std::string name)
    : state_(std::move(state)), generation_(generation), name_(std::move(name)) {}

bool BlobWriter::isActive() const { return state_->fd >= 0 && state_->generation == generation_; }

void BlobWriter::write(const void* data, size_t size) { write({static_cast<const std::byte*>(data), size}); }

void BlobWriter::write(std::span<const std::byte> bytes) {
  if (!isActive()) {
    throw UsageError(fmt::format("blob writer for '{}' is no longer active: a newer blob was started or it was "
                                 "closed",
                                 name_));
  }
  WriterState& s = *state_;
  if (s.expected_raw_size != kUnknownSize && bytes.size() > s.expected_raw_size - s.raw_written) {
    throw UsageError(fmt::format("'{}': writing {} more bytes would exceed the declared {} bytes ({} written)",
                                 name_, bytes.size(), s.expected_raw_size, s.raw_written));
  }
  try {
    if (s.zstd != nullptr) {
      s.compress(bytes, ZSTD_e_continue);
    } else {
      s.appendStored(bytes);
    }
  } catch (...) {
    s.abandonActive();
    throw;
  }
  s.raw_written += bytes.size();
}

void BlobWriter::close() {
  if (isActive()) state_->finishActive();
}

// ------------------------------------------------------------- PackageWriter

PackageWriter::PackageWriter(const std::filesystem::path& path, Mode mode) : state_(std::make_shared<WriterState>()) {
  state_->path = path;
  if (mode == Mode::kAppend) {
    openForAppend(*state_);
  } else {
    // Beside `path` (one file system, so the rename is atomic), named
    // uniquely per process and writer.
    static std::atomic<uint64_t> writers{0};
    state_->temporary = path.parent_path() / fmt::format(".{}.tmp-{}-{}", path.filename().string(), ::getpid(),
                                                        writers.fetch_add(1));
    state_->fd = ::open(state_->temporary.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (state_->fd < 0) {
      const int error = errno;
      state_->temporary.clear();
      throw IoError("cannot create " + path.string() + " (writing it as a new file beside it)", error);
    }
  }
  state_->buffer.reserve(detail::kBufferSize);
}

PackageWriter::~PackageWriter() {
  if (std::uncaught_exceptions() > 0) return;  // ~WriterState abandons the new file
  try {
    close();
  } catch (const std::exception& e) {
    log::write(LogLevel::kError, "closing {}: {}", state_->path.string(), e.what());
  }
}

const std::filesystem::path& PackageWriter::path() const { return state_->path; }

BlobWriter PackageWriter::beginBlob(const BlobStart& start) {
  WriterState& s = *state_;
  s.requireOpen();
  checkName(start.name, blobTypeName(start.type));
  s.finishActive();
  const uint32_t type = static_cast<uint32_t>(start.type);
  if (s.names.contains({nameNamespace(type), start.name})) {
    throw UsageError(fmt::format("{} '{}': a blob of that name is already in {}", blobTypeName(start.type),
                                 start.name, s.path.string()));
  }
  s.header = BlobHeader{};
  s.header.type = type;
  s.header.flags = start.compress ? kBlobFlagCompressed : 0;
  s.header.name_size = static_cast<uint32_t>(start.name.size());
  s.header.info_size = static_cast<uint32_t>(start.info.size());
  s.header.producer = std::string(kProducer);
  s.header.payload_offset = alignUp(kBlobHeaderSize + start.name.size() + start.info.size(), kPayloadAlignment);
  s.name = start.name;
  s.info = start.info;
  s.expected_raw_size = start.expected_raw_size;
  s.raw_written = 0;
  s.stored_written = 0;
  s.checksum.reset();
  if (start.compress) {
    s.zstd = ZSTD_createCCtx();
    if (s.zstd == nullptr) throw std::bad_alloc();
    ZSTD_CCtx_setParameter(s.zstd, ZSTD_c_compressionLevel, start.level);
    ZSTD_CCtx_setParameter(s.zstd, ZSTD_c_checksumFlag, 1);  // decompression detects damage by itself
  }
  // Placeholder header (completed when the blob finishes), name, info, padding.
  s.generation = s.next_generation++;
  const auto placeholder = encodeBlobHeader(s.header);
  s.buffer.insert(s.buffer.end(), placeholder.begin(), placeholder.end());
  const auto* name_bytes = reinterpret_cast<const std::byte*>(s.name.data());
  s.buffer.insert(s.buffer.end(), name_bytes, name_bytes + s.name.size());
  s.buffer.insert(s.buffer.end(), s.info.begin(), s.info.end());
  s.buffer.resize(s.header.payload_offset);
  log::debug("{}: writing {} '{}' at byte {}", s.path.string(), blobTypeName(start.type), s.name, s.committed_size);
  return BlobWriter(state_, s.generation, s.name);
}

BlobWriter PackageWriter::beginExecutable(const std::string& name, bool compress, int level) {
  return beginBlob({BlobType::kExecutable, name, {}, kUnknownSize, compress, level});
}

BlobWriter PackageWriter::beginTensorData(const std::string& name, const TensorInfo& info) {
  const uint64_t size = checkedTensorSize(info, 1, name);
  return beginBlob({BlobType::kTensorData, name, encodeTensorDataInfo(info), size});
}

BlobWriter PackageWriter::beginFeedData(const std::string& name, const TensorInfo& info, uint64_t count) {
  const uint64_t size = checkedTensorSize(info, count, name);
  return beginBlob({BlobType::kFeedData, name, encodeFeedInfo({info, count}), size});
}

BlobWriter PackageWriter::beginOpaque(const std::string& name, const std::string& executable) {
  if (executable.find('\0') != std::string::npos) throw UsageError("opaque executable name contains a NUL byte");
  return beginBlob({BlobType::kOpaque, name, encodeOpaqueInfo(executable), kUnknownSize});
}

void PackageWriter::writeMetadata(const std::string& name, const Metadata& metadata) {
  if (const std::string problem = findMetadataProblem(metadata); !problem.empty()) {
    throw UsageError(fmt::format("metadata '{}': {}", name, problem));
  }
  beginBlob({BlobType::kMetadata, name, encodeMetadata(metadata), 0}).close();
}

void PackageWriter::writeExecutable(const std::string& name, std::span<const std::byte> program, bool compress) {
  BlobWriter blob = beginExecutable(name, compress);
  blob.write(program);
  blob.close();
}

void PackageWriter::writeTensorData(const std::string& name, const TensorInfo& info, std::span<const std::byte> bytes) {
  BlobWriter blob = beginTensorData(name, info);
  blob.write(bytes);
  blob.close();
}

void PackageWriter::writeFeedData(const std::string& name, const TensorInfo& info, uint64_t count,
                                  std::span<const std::byte> bytes) {
  BlobWriter blob = beginFeedData(name, info, count);
  blob.write(bytes);
  blob.close();
}

void PackageWriter::writeOpaque(const std::string& name, const std::string& executable,
                                std::span<const std::byte> bytes) {
  BlobWriter blob = beginOpaque(name, executable);
  blob.write(bytes);
  blob.close();
}

void PackageWriter::close() {
  WriterState& s = *state_;
  if (s.fd < 0) return;
  try {
    s.finishActive();
  } catch (...) {
    ::close(s.fd);
    s.fd = -1;
    throw;
  }
  const int fd = s.fd;
  s.fd = -1;
  if (::close(fd) != 0) throw IoError("cannot close " + s.path.string(), errno);
  if (!s.temporary.empty()) {
    if (::rename(s.temporary.c_str(), s.path.c_str()) != 0) {
      throw IoError("cannot replace " + s.path.string() + " by the package written beside it", errno);
    }
    s.temporary.clear();  // published
  }
}

}  // namespace kiln
