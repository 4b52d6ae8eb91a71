#include "format/info_codec.h"

#include <fmt/format.h>

namespace kiln {
namespace {

// Smallest encodings, used to bound list counts before reserving memory.
constexpr size_t kMinStringSize = 4;
constexpr size_t kMinAnchorSize = 4 + 4 + 4 + (1 + 4) + 1 + 1 + 1 + 4 + 4;

void encodeIndexList(ByteWriter& out, const std::vector<uint32_t>& list) {
  out.u32(static_cast<uint32_t>(list.size()));
  for (uint32_t value : list) out.u32(value);
}

std::vector<uint32_t> decodeIndexList(ByteCursor& in, std::string_view field) {
  const uint32_t count = in.count(field, 4);
  std::vector<uint32_t> list;
  list.reserve(count);
  for (uint32_t i = 0; i < count; ++i) list.push_back(in.u32(field));
  return list;
}

void encodeAnchor(ByteWriter& out, const Anchor& anchor) {
  out.string(anchor.name);
  out.string(anchor.handle);
  encodeIndexList(out, anchor.programs);
  encodeTensorInfo(out, anchor.info);
  out.u8(static_cast<uint8_t>(anchor.direction));
  out.u8(anchor.is_per_replica ? 1 : 0);
  out.u8(anchor.use_remote_buffers ? 1 : 0);
  out.u32(anchor.repeats);
  out.u32(anchor.batch_dim);
}

Anchor decodeAnchor(ByteCursor& in) {
  Anchor anchor;
  anchor.name = in.string("anchor.name");
  anchor.handle = in.string("anchor.handle");
  anchor.programs = decodeIndexList(in, "anchor.programs");
  anchor.info = decodeTensorInfo(in);
  const uint64_t direction_at = in.offset();
  const uint8_t direction = in.u8("anchor.direction");
  if (direction > 1) in.failAt(direction_at, fmt::format("anchor direction must be 0 or 1, found {}", direction));
  anchor.direction = static_cast<AnchorDirection>(direction);
  anchor.is_per_replica = in.boolean("anchor.is_per_replica");
  anchor.use_remote_buffers = in.boolean("anchor.use_remote_buffers");
  anchor.repeats = in.u32("anchor.repeats");
  anchor.batch_dim = in.u32("anchor.batch_dim");
  return anchor;
}

}  // namespace

void encodeTensorInfo(ByteWriter& out, const TensorInfo& info) {
  out.u8(static_cast<uint8_t>(info.dtype));
  out.u32(static_cast<uint32_t>(info.shape.size()));
  for (int64_t dim : info.shape) out.i64(dim);
}

TensorInfo decodeTensorInfo(ByteCursor& in) {
  TensorInfo info;
  const uint64_t dtype_at = in.offset();
  const uint8_t dtype = in.u8("dtype");
  if (!isValidDType(dtype)) in.failAt(dtype_at, fmt::format("unknown dtype code {}", dtype));
  info.dtype = static_cast<DType>(dtype);
  const uint64_t rank_at = in.offset();
  const uint32_t rank = in.u32("rank");
  if (rank > kMaxRank) in.failAt(rank_at, fmt::format("rank {} exceeds the limit of {}", rank, kMaxRank));
  info.shape.reserve(rank);
  for (uint32_t i = 0; i < rank; ++i) {
    const uint64_t dim_at = in.offset();
    const int64_t dim = in.i64("dimension");
    if (dim < 0 && dim != kDynamicDim) {
      in.failAt(dim_at, fmt::format("dimension {} is {}: must be >= 0, or -1 for dynamic", i, dim));
    }
    info.shape.push_back(dim);
  }
  return info;
}

std::vector<std::byte> encodeMetadata(const Metadata& m) {
  ByteWriter out;
  out.string(m.executable);
  out.string(m.target.device_kind);
  out.u32(m.target.num_devices);
  out.u32(static_cast<uint32_t>(m.target.features.size()));
  for (const std::string& feature : m.target.features) out.string(feature);
  out.u32(m.replication_factor);
  out.u8(m.is_inference ? 1 : 0);
  out.u32(static_cast<uint32_t>(m.options.size()));
  for (const auto& [key, value] : m.options) {
    out.string(key);
    out.string(value);
  }
  encodeIndexList(out, m.program_flow.load);
  encodeIndexList(out, m.program_flow.main);
  encodeIndexList(out, m.program_flow.save);
  out.u32(static_cast<uint32_t>(m.programs.size()));
  for (const auto& [index, name] : m.programs) {
    out.u32(index);
    out.string(name);
  }
  out.u32(static_cast<uint32_t>(m.anchors.size()));
  for (const Anchor& anchor : m.anchors) encodeAnchor(out, anchor);
  return out.take();
}

Metadata decodeMetadata(ByteCursor& in) {
  Metadata m;
  m.executable = in.string("executable");
  m.target.device_kind = in.string("target.device_kind");
  m.target.num_devices = in.u32("target.num_devices");
  const uint32_t features = in.count("target.features", kMinStringSize);
  for (uint32_t i = 0; i < features; ++i) m.target.features.push_back(in.string("target.feature"));
  m.replication_factor = in.u32("replication_factor");
  m.is_inference = in.boolean("is_inference");

  const uint32_t options = in.count("options", 2 * kMinStringSize);
  for (uint32_t i = 0; i < options; ++i) {
    const uint64_t at = in.offset();
    std::string key = in.string("option key");
    std::string value = in.string("option value");
    if (!m.options.emplace(std::move(key), std::move(value)).second) {
      in.failAt(at, "duplicate option key");
    }
  }
  m.program_flow.load = decodeIndexList(in, "program_flow.load");
  m.program_flow.main = decodeIndexList(in, "program_flow.main");
  m.program_flow.save = decodeIndexList(in, "program_flow.save");

  const uint32_t programs = in.count("programs", 4 + kMinStringSize);
  for (uint32_t i = 0; i < programs; ++i) {
    const uint64_t at = in.offset();
    const uint32_t index = in.u32("program index");
    std::string name = in.string("program name");
    if (!m.programs.emplace(index, std::move(name)).second) {
      in.failAt(at, fmt::format("duplicate program index {}", index));
    }
  }
  const uint32_t anchors = in.count("anchors", kMinAnchorSize);
  m.anchors.reserve(anchors);
  for (uint32_t i = 0; i < anchors; ++i) m.anchors.push_back(decodeAnchor(in));
  return m;
}

std::vector<std::byte> encodeFeedInfo(const FeedInfo& feed) {
  ByteWriter out;
  encodeTensorInfo(out, feed.tensor);
  out.u64(feed.count);
  return out.take();
}

FeedInfo decodeFeedInfo(ByteCursor& in) {
  FeedInfo feed;
  feed.tensor = decodeTensorInfo(in);
  feed.count = in.u64("count");
  return feed;
}

std::vector<std::byte> encodeTensorDataInfo(const TensorInfo& info) {
  ByteWriter out;
  encodeTensorInfo(out, info);
  return out.take();
}

std::vector<std::byte> encodeOpaqueInfo(const std::string& executable) {
  ByteWriter out;
  out.string(executable);
  return out.take();
}

}  // namespace kiln
