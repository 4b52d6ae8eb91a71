// Packages crafted to break the runtime (issue 12): each must be refused
// with a clear error before anything runs, never crash or corrupt memory.
// The packages here are real ones, compiled and then rewritten with one
// field changed, the checksums recomputed by the writer: what an attacker
// can make, which the fuzzers' mutations (stopped by the checksums) miss.
#include <gtest/gtest.h>

#include <cstdint>
#include <fmt/format.h>

#include <functional>
#include <string>

#include "format/executable_spec.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/package_reader.h"
#include "kiln/package_writer.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::TempPackage;

// The affine model's package with its executable spec passed through `edit`
// (and its metadata through `edit_metadata`).
void writeEdited(const std::filesystem::path& path, const std::function<void(ExecutableSpec&)>& edit,
                 const std::function<void(Metadata&)>& edit_metadata = [](Metadata&) {}) {
  TempPackage compiled("hostile_source");
  testing::writeAffineModel(compiled.path(), testing::kBatch, testing::kFeatures);
  PackageReader reader(compiled.path());
  const MetadataBlob* metadata = reader.metadata().front();
  const ExecutableBlob* executable = reader.findExecutable(metadata->metadata().executable);
  ExecutableSpec spec = decodeExecutable(executable->read(), "test");
  edit(spec);
  PackageWriter writer(path);
  writer.writeExecutable(executable->name(), encodeExecutable(spec));
  Metadata edited = metadata->metadata();
  edit_metadata(edited);
  writer.writeMetadata(metadata->name(), edited);
  for (const TensorDataBlob* tensor : reader.tensorData()) writer.writeTensorData(tensor->name(), tensor->tensorInfo(), tensor->data());
  writer.close();
}

std::string loadError(const std::filesystem::path& path) {
  try {
    Executor executor(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "(loaded)";
}

// (arena_bytes + 63) / 64 * 64 wrapped to 0 for a size near 2^64: an empty
// block was allocated and the kernels wrote the model's intermediates into it.
TEST(HostilePackage, ArenaSizeNearTwoToTheSixtyFourIsRefused) {
  for (const uint64_t arena : {UINT64_MAX, UINT64_MAX - 62, uint64_t{1} << 62}) {
    TempPackage package("hostile_arena");
    writeEdited(package.path(), [&](ExecutableSpec& spec) { spec.arena_bytes = arena; });
    EXPECT_NE(loadError(package.path()).find("cannot be allocated on this machine"), std::string::npos)
        << arena << ": " << loadError(package.path());
  }
}

// An anchor shrunk below the executable's value (y as [1, 1] of a [4, 8]
// output) passed `kiln dump --verify`, and the runs wrote the whole output
// into the caller's 4-byte block. Likewise an input anchor larger or smaller
// than the value the steps read.
TEST(HostilePackage, AnchorsThatDisagreeWithTheExecutableAreRefused) {
  for (const char* name : {"y", "x"}) {
    TempPackage package("hostile_anchor");
    writeEdited(
        package.path(), [](ExecutableSpec&) {},
        [&](Metadata& metadata) {
          for (Anchor& anchor : metadata.anchors) {
            if (anchor.name == name) anchor.info.shape = {1, 1};
          }
        });
    const std::string error = loadError(package.path());
    EXPECT_NE(error.find(fmt::format("anchor '{}' is", name)), std::string::npos) << error;
    EXPECT_NE(error.find("but the executable's value is"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace kiln
