// rewritePackage: a package written again with its executable and metadata
// edited and its tensor data copied, the checksums recomputed by the
// writer. What an attacker can make, which whole-file mutations (stopped by
// the checksums) miss: the hostile-package tests make each crafted class
// with it, and the package fuzz target's structural mutations go through
// it. Header-only, so that both the tests and the fuzz target (built with
// clang, without GoogleTest) include it.
#pragma once

#include <filesystem>
#include <functional>

#include "format/executable_spec.h"
#include "kiln/metadata.h"
#include "kiln/package_reader.h"
#include "kiln/package_writer.h"

namespace kiln::testing {

using EditSpec = std::function<void(ExecutableSpec&)>;
using EditMetadata = std::function<void(Metadata&)>;
using AddBlobs = std::function<void(PackageWriter&)>;

// Writes `reader`'s first model to `path`: its executable decoded, passed
// through `edit` and encoded again, its metadata passed through
// `edit_metadata`, every TensorData blob copied, then whatever `add`
// writes. Throws FormatError when the executable does not decode (a graph
// package's, or a malformed one).
inline void rewritePackage(const PackageReader& reader, const std::filesystem::path& path, const EditSpec& edit,
                           const EditMetadata& edit_metadata = [](Metadata&) {}, const AddBlobs& add = {}) {
  if (reader.metadata().empty()) throw FormatError(path.string(), 0, "the package has no model");
  const MetadataBlob* metadata = reader.metadata().front();
  const ExecutableBlob* executable = reader.findExecutable(metadata->metadata().executable);
  if (executable == nullptr) throw FormatError(path.string(), 0, "the model's executable is missing");
  ExecutableSpec spec = decodeExecutable(executable->read(), path.string());
  edit(spec);
  Metadata edited = metadata->metadata();
  edit_metadata(edited);
  PackageWriter writer(path);
  writer.writeExecutable(executable->name(), encodeExecutable(spec));
  writer.writeMetadata(metadata->name(), edited);
  for (const TensorDataBlob* tensor : reader.tensorData()) {
    writer.writeTensorData(tensor->name(), tensor->tensorInfo(), tensor->data());
  }
  if (add) add(writer);
  writer.close();
}

}  // namespace kiln::testing
