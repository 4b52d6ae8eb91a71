#include "kiln/package_reader.h"

#include <fmt/format.h>

#include <deque>
#include <map>

#include "core/log.h"
#include "core/mapped_file.h"
#include "format/blob_header.h"
#include "format/info_codec.h"

namespace kiln {

template <typename T>
using NameIndex = std::map<std::string, const T*, std::less<>>;

struct PackageReader::Impl {
  ReaderOptions options;
  std::vector<std::string> sources;
  std::vector<MappedFile> files;  // empty for memory sources
  std::vector<BlobInfo> blobs;

  std::deque<ExecutableBlob> executables;
  std::deque<MetadataBlob> metadata;
  std::deque<TensorDataBlob> tensors;
  std::deque<FeedDataBlob> feeds;
  std::deque<OpaqueBlob> opaques;

  NameIndex<ExecutableBlob> executable_index;
  NameIndex<MetadataBlob> metadata_index;
  NameIndex<TensorDataBlob> tensor_index;
  NameIndex<FeedDataBlob> feed_index;
  NameIndex<OpaqueBlob> opaque_index;
  // (name namespace, name) -> where the first blob of that name is.
  std::map<std::pair<uint32_t, std::string>, std::pair<std::string, uint64_t>> first_seen;

  void parse(std::span<const std::byte> file, const std::string& source);
  void parseBlob(std::span<const std::byte> file, const std::string& source, const BlobHeader& header,
                 uint64_t offset);
  void crossCheck() const;
};

namespace {

template <typename T>
const T* lookUp(const NameIndex<T>& index, std::string_view name) {
  const auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

template <typename T>
std::vector<const T*> pointersTo(const std::deque<T>& blobs) {
  std::vector<const T*> result;
  result.reserve(blobs.size());
  for (const T& blob : blobs) result.push_back(&blob);
  return result;
}

// info.sizeInBytes() * count as a FormatError-reporting computation.
uint64_t payloadSizeFor(const TensorInfo& tensor, uint64_t count, ByteCursor& cursor, uint64_t at) {
  if (!tensor.isStatic()) cursor.failAt(at, "stored tensor data must have a static shape, found " + tensor.shapeString());
  uint64_t size = 0;
  try {
    size = tensor.sizeInBytes();
  } catch (const UsageError&) {
    cursor.failAt(at, "tensor size overflows: shape " + tensor.shapeString());
  }
  const std::optional<int64_t> total = multiplySizes(static_cast<int64_t>(size), static_cast<int64_t>(count));
  if (!total) cursor.failAt(at, fmt::format("feed size overflows: {} items of {} bytes", count, size));
  return static_cast<uint64_t>(*total);
}

}  // namespace

void PackageReader::Impl::parse(std::span<const std::byte> file, const std::string& source) {
  walkBlobChain(file, source, [&](const BlobHeader& header, uint64_t offset) {
    parseBlob(file, source, header, offset);
  });
}

void PackageReader::Impl::parseBlob(std::span<const std::byte> file, const std::string& source,
                                    const BlobHeader& header, uint64_t offset) {
  const auto name_bytes = file.subspan(offset + header.header_size, header.name_size);
  const uint64_t info_offset = offset + header.header_size + header.name_size;
  const auto info_bytes = file.subspan(info_offset, header.info_size);
  const bool skip_checksums = options.checksums == ChecksumPolicy::kSkip;
  if (!skip_checksums &&
      computeHeaderChecksum(file.subspan(offset, header.header_size), name_bytes, info_bytes) != header.header_checksum) {
    throw FormatError(source, offset + kHeaderChecksumOffset, "header checksum mismatch: the header, name or info is corrupt");
  }

  BlobInfo info;
  info.type = static_cast<BlobType>(header.type);
  info.name.assign(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
  info.source = source;
  info.offset = offset;
  info.version_major = header.version_major;
  info.version_minor = header.version_minor;
  info.flags = header.flags;
  info.total_size = header.total_size;
  info.payload_offset = header.payload_offset;
  info.stored_size = header.stored_size;
  info.raw_size = header.raw_size;
  info.payload_checksum = header.payload_checksum;
  info.producer = header.producer;
  blobs.push_back(info);

  const std::string_view type_name = blobTypeName(info.type);
  if (type_name == "Unknown") {
    log::warning("{}: byte {}: skipping blob '{}' of unknown type {} (written by '{}'; a newer kiln may read it)",
                 source, offset, info.name, header.type, header.producer);
    return;
  }
  log::debug("{}: byte {}: {} '{}', payload {} bytes stored, {} raw", source, offset, type_name, info.name,
             info.stored_size, info.raw_size);

  if (const auto [it, inserted] = first_seen.try_emplace({nameNamespace(header.type), info.name}, source, offset);
      !inserted) {
    throw FormatError(source, offset, fmt::format("duplicate {} name '{}' (first at {} byte {})", type_name, info.name,
                                                  it->second.first, it->second.second));
  }
  if (info.compressed() && info.type != BlobType::kExecutable) {
    throw FormatError(source, offset + 20, fmt::format("{} '{}' is marked compressed; only Executable payloads may be "
                                                       "compressed (others are used in place)", type_name, info.name));
  }

  ByteCursor cursor(info_bytes, source, info_offset);
  const auto payload = file.subspan(offset + header.payload_offset, header.stored_size);
  switch (info.type) {
    case BlobType::kExecutable:
      executables.emplace_back(info, payload, skip_checksums);
      executable_index.emplace(info.name, &executables.back());
      break;
    case BlobType::kMetadata: {
      Metadata decoded = decodeMetadata(cursor);
      if (const std::string problem = findMetadataProblem(decoded); !problem.empty()) {
        throw FormatError(source, info_offset, fmt::format("metadata '{}': {}", info.name, problem));
      }
      if (header.stored_size != 0) {
        throw FormatError(source, offset + 40, fmt::format("metadata '{}' has a {}-byte payload; it must have none",
                                                           info.name, header.stored_size));
      }
      metadata_index.emplace(info.name, &metadata.emplace_back(info, std::move(decoded)));
      break;
    }
    case BlobType::kTensorData: {
      TensorInfo tensor = decodeTensorInfo(cursor);
      const uint64_t expected = payloadSizeFor(tensor, 1, cursor, info_offset);
      if (expected != header.stored_size) {
        cursor.failAt(offset + 40, fmt::format("TensorData '{}' is {} but its payload is {} bytes, not {}", info.name,
                                               tensor.toString(), header.stored_size, expected));
      }
      tensor_index.emplace(info.name, &tensors.emplace_back(info, payload, skip_checksums, std::move(tensor)));
      break;
    }
    case BlobType::kFeedData: {
      FeedInfo feed = decodeFeedInfo(cursor);
      const uint64_t expected = payloadSizeFor(feed.tensor, feed.count, cursor, info_offset);
      if (expected != header.stored_size) {
        cursor.failAt(offset + 40, fmt::format("FeedData '{}' holds {} x {} but its payload is {} bytes, not {}",
                                               info.name, feed.count, feed.tensor.toString(), header.stored_size,
                                               expected));
      }
      feed_index.emplace(info.name,
                         &feeds.emplace_back(info, payload, skip_checksums, std::move(feed.tensor), feed.count));
      break;
    }
    case BlobType::kOpaque: {
      std::string executable = cursor.string("opaque executable");
      opaque_index.emplace(info.name, &opaques.emplace_back(info, payload, skip_checksums, std::move(executable)));
      break;
    }
  }
  // A newer minor version may append fields to an info section; ours must
  // use every byte.
  if (cursor.remaining() != 0 && header.version_minor <= kFormatVersionMinor) {
    cursor.fail(fmt::format("info section of {} '{}' has {} unexpected trailing bytes", type_name, info.name,
                            cursor.remaining()));
  }
}

void PackageReader::Impl::crossCheck() const {
  const std::string read_files = fmt::format("{}", fmt::join(sources, ", "));
  for (const MetadataBlob& blob : metadata) {
    const Metadata& m = blob.metadata();
    if (lookUp(executable_index, m.executable) == nullptr) {
      throw FormatError(blob.info().source, blob.info().offset,
                        fmt::format("metadata '{}' names executable '{}', which is in none of the files read ({})",
                                    blob.name(), m.executable, read_files));
    }
    for (const Anchor& anchor : m.anchors) {
      const TensorInfo expected = effectiveTensorInfo(anchor, m.replication_factor);
      const PayloadBlob* data = nullptr;
      const TensorInfo* found = nullptr;
      if (const TensorDataBlob* tensor = lookUp(tensor_index, anchor.name)) {
        data = tensor;
        found = &tensor->tensorInfo();
      } else if (const FeedDataBlob* feed = lookUp(feed_index, anchor.name)) {
        data = feed;
        found = &feed->tensorInfo();
      }
      if (found != nullptr && *found != expected) {
        throw FormatError(blob.info().source, blob.info().offset,
                          fmt::format("anchor '{}' of metadata '{}' expects {} but {} '{}' ({} byte {}) holds {}",
                                      anchor.name, blob.name(), expected.toString(), blobTypeName(data->info().type),
                                      anchor.name, data->info().source, data->info().offset, found->toString()));
      }
    }
  }
  for (const OpaqueBlob& blob : opaques) {
    if (!blob.executable().empty() && lookUp(executable_index, blob.executable()) == nullptr) {
      throw FormatError(blob.info().source, blob.info().offset,
                        fmt::format("opaque '{}' is linked to executable '{}', which is in none of the files read ({})",
                                    blob.name(), blob.executable(), read_files));
    }
  }
}

PackageReader::PackageReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PackageReader::PackageReader(const std::filesystem::path& path, ReaderOptions options)
    : PackageReader(std::vector<std::filesystem::path>{path}, options) {}

PackageReader::PackageReader(const std::vector<std::filesystem::path>& paths, ReaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (paths.empty()) throw UsageError("PackageReader needs at least one file");
  impl_->options = options;
  for (const auto& path : paths) {
    impl_->sources.push_back(path.string());
    impl_->files.emplace_back(path);
    impl_->parse(impl_->files.back().bytes(), impl_->sources.back());
  }
  impl_->crossCheck();
  if (options.checksums == ChecksumPolicy::kEager) verifyAllChecksums();
}

PackageReader PackageReader::fromMemory(const std::vector<MemorySource>& sources, ReaderOptions options) {
  if (sources.empty()) throw UsageError("PackageReader needs at least one source");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const MemorySource& source : sources) {
    impl->sources.push_back(source.name);
    impl->parse(source.bytes, source.name);
  }
  impl->crossCheck();
  PackageReader reader(std::move(impl));
  if (options.checksums == ChecksumPolicy::kEager) reader.verifyAllChecksums();
  return reader;
}

PackageReader::PackageReader(PackageReader&&) noexcept = default;
PackageReader& PackageReader::operator=(PackageReader&&) noexcept = default;
PackageReader::~PackageReader() = default;

const std::vector<std::string>& PackageReader::sources() const { return impl_->sources; }
const std::vector<BlobInfo>& PackageReader::blobs() const { return impl_->blobs; }

std::vector<const ExecutableBlob*> PackageReader::executables() const { return pointersTo(impl_->executables); }
std::vector<const MetadataBlob*> PackageReader::metadata() const { return pointersTo(impl_->metadata); }
std::vector<const TensorDataBlob*> PackageReader::tensorData() const { return pointersTo(impl_->tensors); }
std::vector<const FeedDataBlob*> PackageReader::feedData() const { return pointersTo(impl_->feeds); }
std::vector<const OpaqueBlob*> PackageReader::opaques() const { return pointersTo(impl_->opaques); }

const ExecutableBlob* PackageReader::findExecutable(std::string_view name) const {
  return lookUp(impl_->executable_index, name);
}
const MetadataBlob* PackageReader::findMetadata(std::string_view name) const {
  return lookUp(impl_->metadata_index, name);
}
const TensorDataBlob* PackageReader::findTensorData(std::string_view name) const {
  return lookUp(impl_->tensor_index, name);
}
const FeedDataBlob* PackageReader::findFeedData(std::string_view name) const { return lookUp(impl_->feed_index, name); }
const OpaqueBlob* PackageReader::findOpaque(std::string_view name) const { return lookUp(impl_->opaque_index, name); }

bool PackageReader::isPackageProvided(const Anchor& anchor) const {
  return findTensorData(anchor.name) != nullptr || findFeedData(anchor.name) != nullptr;
}

void PackageReader::verifyAllChecksums() const {
  for (const auto& blob : impl_->executables) blob.verifyChecksum();
  for (const auto& blob : impl_->tensors) blob.verifyChecksum();
  for (const auto& blob : impl_->feeds) blob.verifyChecksum();
  for (const auto& blob : impl_->opaques) blob.verifyChecksum();
}

}  // namespace kiln
