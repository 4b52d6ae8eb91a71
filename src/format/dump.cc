#include "kiln/dump.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

namespace kiln {

DumpOptions DumpOptions::all() {
  DumpOptions options;
  options.metadata = options.anchors = options.executables = options.tensors = options.feeds = options.opaques = true;
  return options;
}

bool DumpOptions::any() const {
  return metadata || anchors || user_anchors || executables || tensors || feeds || opaques;
}

namespace {

// ------------------------------------------------------------------- text

// Names and strings come from files: show control bytes as \xNN so that a
// crafted package cannot send escape sequences to the terminal.
std::string escaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    out += (byte < 0x20 || byte == 0x7f) ? fmt::format("\\x{:02x}", byte) : std::string(1, c);
  }
  return out;
}

class TextOut {
 public:
  explicit TextOut(bool color) : color_(color) {}

  void heading(int indent, std::string_view text) { line(indent, paint("1;36", text)); }
  void named(int indent, std::string_view name) {
    line(indent, fmt::format("Name: \"{}\":", paint("32", escaped(name))));
  }
  void field(int indent, std::string_view key, std::string_view value) {
    line(indent, fmt::format("{}: {}", paint("33", escaped(key)), escaped(value)));
  }
  void field(int indent, std::string_view key, uint64_t value) { field(indent, key, std::to_string(value)); }
  void line(int indent, std::string_view text) { out_ += fmt::format("{:{}}{}\n", "", indent * 2, text); }
  std::string take() { return std::move(out_); }

 private:
  std::string paint(std::string_view code, std::string_view text) const {
    return color_ ? fmt::format("\033[{}m{}\033[0m", code, text) : std::string(text);
  }
  bool color_;
  std::string out_;
};

std::string trueFalse(bool value) { return value ? "True" : "False"; }

std::string versionOf(const BlobInfo& info) { return fmt::format("{}.{}", info.version_major, info.version_minor); }

void blobFields(TextOut& out, int indent, const BlobInfo& info) {
  out.field(indent, "Version", versionOf(info));
  out.field(indent, "Producer", info.producer);
  out.field(indent, "Location", fmt::format("{} byte {}", info.source, info.offset));
  out.field(indent, "Total size", info.total_size);
  out.field(indent, "Payload offset", info.payload_offset);
  out.field(indent, "Stored size", info.stored_size);
  out.field(indent, "Available read size", info.raw_size);
  out.field(indent, "Checksum", fmt::format("xxh3:{:016x}", info.payload_checksum));
}

std::string batchDimText(uint32_t batch_dim) {
  return batch_dim == kNoBatchDim ? std::string("none") : std::to_string(batch_dim);
}

void anchorText(TextOut& out, int indent, const Anchor& anchor, uint32_t replication_factor) {
  out.named(indent, anchor.name);
  out.field(indent + 1, "TensorInfo", anchor.info.toString());
  out.field(indent + 1, "Programs", fmt::format("[{}]", fmt::join(anchor.programs, ", ")));
  out.field(indent + 1, "Handle", anchor.handle);
  out.field(indent + 1, "IsPerReplica", trueFalse(anchor.is_per_replica));
  out.field(indent + 1, "UseRemoteBuffers", trueFalse(anchor.use_remote_buffers));
  out.field(indent + 1, "Repeats", anchor.repeats);
  out.field(indent + 1, "BatchDim", batchDimText(anchor.batch_dim));
  out.field(indent + 1, "EffectiveTensorInfo", effectiveTensorInfo(anchor, replication_factor).toString());
}

void anchorsText(TextOut& out, const PackageReader& reader, const MetadataBlob& blob, bool user_only) {
  const Metadata& m = blob.metadata();
  out.heading(0, fmt::format("Anchors of \"{}\":", escaped(blob.name())));
  for (const AnchorDirection direction : {AnchorDirection::kInput, AnchorDirection::kOutput}) {
    for (const bool package_provided : {false, true}) {
      if (user_only && package_provided) continue;
      out.heading(1, fmt::format("{} ({} provided):", direction == AnchorDirection::kInput ? "Inputs" : "Outputs",
                                 package_provided ? "Package" : "User"));
      for (const Anchor& anchor : m.anchors) {
        if (anchor.direction == direction && reader.isPackageProvided(anchor) == package_provided) {
          anchorText(out, 2, anchor, m.replication_factor);
        }
      }
    }
  }
}

void metadataText(TextOut& out, const MetadataBlob& blob) {
  const Metadata& m = blob.metadata();
  out.named(1, blob.name());
  out.field(2, "Version", versionOf(blob.info()));
  out.field(2, "Producer", blob.info().producer);
  out.field(2, "Location", fmt::format("{} byte {}", blob.info().source, blob.info().offset));
  out.field(2, "Executable", m.executable);
  out.field(2, "Device", m.target.device_kind);
  out.field(2, "NumDevices", m.target.num_devices);
  out.field(2, "Features", fmt::format("[{}]", fmt::join(m.target.features, ", ")));
  out.field(2, "Replication Factor", m.replication_factor);
  out.field(2, "IsInference", trueFalse(m.is_inference));
  out.heading(2, "Options:");
  if (m.options.empty()) out.line(3, "<empty>");
  for (const auto& [key, value] : m.options) out.field(3, key, value);
  out.heading(2, "Program Flow:");
  out.field(3, "load", fmt::format("[{}]", fmt::join(m.program_flow.load, ", ")));
  out.field(3, "main", fmt::format("[{}]", fmt::join(m.program_flow.main, ", ")));
  out.field(3, "save", fmt::format("[{}]", fmt::join(m.program_flow.save, ", ")));
  out.heading(2, "Programs Map:");
  if (m.programs.empty()) out.line(3, "<empty>");
  for (const auto& [index, name] : m.programs) out.field(3, std::to_string(index), name);
  out.field(2, "Anchors", fmt::format("{} inputs, {} outputs (see --anchors)", m.inputs().size(), m.outputs().size()));
}

// ------------------------------------------------------------------- JSON

using nlohmann::json;

json blobJson(const BlobInfo& info) {
  return {{"type", std::string(blobTypeName(info.type))},
          {"type_code", static_cast<uint32_t>(info.type)},
          {"name", info.name},
          {"source", info.source},
          {"offset", info.offset},
          {"version", versionOf(info)},
          {"producer", info.producer},
          {"flags", info.flags},
          {"compressed", info.compressed()},
          {"total_size", info.total_size},
          {"payload_offset", info.payload_offset},
          {"stored_size", info.stored_size},
          {"raw_size", info.raw_size},
          {"payload_checksum", fmt::format("{:016x}", info.payload_checksum)}};
}

json tensorInfoJson(const TensorInfo& info) {
  json j = {{"dtype", std::string(dtypeName(info.dtype))}, {"shape", info.shape}};
  j["size_in_bytes"] = info.isStatic() ? json(info.sizeInBytes()) : json(nullptr);
  return j;
}

json anchorJson(const PackageReader& reader, const std::string& model, const Anchor& anchor, uint32_t replication) {
  return {{"model", model},
          {"name", anchor.name},
          {"handle", anchor.handle},
          {"programs", anchor.programs},
          {"tensor_info", tensorInfoJson(anchor.info)},
          {"effective_tensor_info", tensorInfoJson(effectiveTensorInfo(anchor, replication))},
          {"direction", anchor.direction == AnchorDirection::kInput ? "input" : "output"},
          {"is_per_replica", anchor.is_per_replica},
          {"use_remote_buffers", anchor.use_remote_buffers},
          {"repeats", anchor.repeats},
          {"batch_dim", anchor.batch_dim == kNoBatchDim ? json(nullptr) : json(anchor.batch_dim)},
          {"provided_by", reader.isPackageProvided(anchor) ? "package" : "user"}};
}

json metadataJson(const MetadataBlob& blob) {
  const Metadata& m = blob.metadata();
  json programs = json::object();
  for (const auto& [index, name] : m.programs) programs[std::to_string(index)] = name;
  return {{"blob", blobJson(blob.info())},
          {"name", blob.name()},
          {"executable", m.executable},
          {"target",
           {{"device_kind", m.target.device_kind},
            {"num_devices", m.target.num_devices},
            {"features", m.target.features}}},
          {"replication_factor", m.replication_factor},
          {"is_inference", m.is_inference},
          {"options", m.options},
          {"program_flow", {{"load", m.program_flow.load}, {"main", m.program_flow.main}, {"save", m.program_flow.save}}},
          {"programs", programs}};
}

}  // namespace

std::string dumpText(const PackageReader& reader, const DumpOptions& options) {
  TextOut out(options.color);
  for (const std::string& source : reader.sources()) {
    out.heading(0, fmt::format("kiln package: {}", source));
    out.heading(1, "Blobs:");
    for (const BlobInfo& info : reader.blobs()) {
      if (info.source != source) continue;
      out.line(2, fmt::format("{:>12}  {:<10}  {:>12} bytes  \"{}\"", info.offset, blobTypeName(info.type),
                              info.total_size, escaped(info.name)));
    }
  }
  if (options.metadata) {
    out.heading(0, "Metadata:");
    for (const MetadataBlob* blob : reader.metadata()) metadataText(out, *blob);
  }
  if (options.anchors || options.user_anchors) {
    for (const MetadataBlob* blob : reader.metadata()) anchorsText(out, reader, *blob, !options.anchors);
  }
  if (options.executables) {
    out.heading(0, "Executables:");
    for (const ExecutableBlob* blob : reader.executables()) {
      out.named(1, blob->name());
      out.field(2, "Is compressed", trueFalse(blob->compressed()));
      blobFields(out, 2, blob->info());
    }
  }
  if (options.tensors) {
    out.heading(0, "Tensors:");
    for (const TensorDataBlob* blob : reader.tensorData()) {
      out.named(1, blob->name());
      out.field(2, "TensorInfo", blob->tensorInfo().toString());
      blobFields(out, 2, blob->info());
    }
  }
  if (options.feeds) {
    out.heading(0, "Feeds:");
    for (const FeedDataBlob* blob : reader.feedData()) {
      out.named(1, blob->name());
      out.field(2, "TensorInfo", blob->tensorInfo().toString());
      out.field(2, "Count", blob->count());
      blobFields(out, 2, blob->info());
    }
  }
  if (options.opaques) {
    out.heading(0, "Opaques:");
    for (const OpaqueBlob* blob : reader.opaques()) {
      out.named(1, blob->name());
      out.field(2, "Executable", blob->executable().empty() ? std::string("<none>") : blob->executable());
      blobFields(out, 2, blob->info());
    }
  }
  return out.take();
}

std::string dumpJson(const PackageReader& reader, const DumpOptions& options) {
  json root;
  root["format_version"] = fmt::format("{}.{}", kFormatVersionMajor, kFormatVersionMinor);
  root["sources"] = reader.sources();
  root["blobs"] = json::array();
  for (const BlobInfo& info : reader.blobs()) root["blobs"].push_back(blobJson(info));
  if (options.metadata) {
    root["metadata"] = json::array();
    for (const MetadataBlob* blob : reader.metadata()) root["metadata"].push_back(metadataJson(*blob));
  }
  if (options.anchors || options.user_anchors) {
    root["anchors"] = json::array();
    for (const MetadataBlob* blob : reader.metadata()) {
      for (const Anchor& anchor : blob->metadata().anchors) {
        if (!options.anchors && reader.isPackageProvided(anchor)) continue;
        root["anchors"].push_back(anchorJson(reader, blob->name(), anchor, blob->metadata().replication_factor));
      }
    }
  }
  if (options.executables) {
    root["executables"] = json::array();
    for (const ExecutableBlob* blob : reader.executables()) root["executables"].push_back(blobJson(blob->info()));
  }
  if (options.tensors) {
    root["tensors"] = json::array();
    for (const TensorDataBlob* blob : reader.tensorData()) {
      json j = blobJson(blob->info());
      j["tensor_info"] = tensorInfoJson(blob->tensorInfo());
      root["tensors"].push_back(j);
    }
  }
  if (options.feeds) {
    root["feeds"] = json::array();
    for (const FeedDataBlob* blob : reader.feedData()) {
      json j = blobJson(blob->info());
      j["tensor_info"] = tensorInfoJson(blob->tensorInfo());
      j["count"] = blob->count();
      root["feeds"].push_back(j);
    }
  }
  if (options.opaques) {
    root["opaques"] = json::array();
    for (const OpaqueBlob* blob : reader.opaques()) {
      json j = blobJson(blob->info());
      j["executable"] = blob->executable();
      root["opaques"].push_back(j);
    }
  }
  // Names come from files: replace invalid UTF-8 rather than fail.
  return root.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace kiln
