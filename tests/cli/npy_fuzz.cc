// libFuzzer target for the .npy reader (tools/kiln/npy.h): any bytes in,
// either an array whose byte count matches its TensorInfo or a UsageError
// out; never a crash, a hang, a leak, a read outside the input or an
// allocation the file's length does not back (issue 12: the reader used
// std::regex, which overflowed the stack on long headers, and allocated
// what a 77-byte header declared).
//
// readNpy reads a file: each input is written to one file per process
// (a tmpfs in practice) and read back.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/error.h"
#include "tools/kiln/npy.h"

namespace {

const std::filesystem::path& inputPath() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_npy_fuzz_" + std::to_string(::getpid()) + ".npy");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FILE* file = std::fopen(inputPath().c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  try {
    const kiln::cli::NpyArray array = kiln::cli::readNpy(inputPath());
    // What a reader returns is backed by the file: never more bytes than it holds.
    if (array.bytes.size() != array.info.sizeInBytes() || array.bytes.size() > size) std::abort();
  } catch (const kiln::UsageError&) {
  }
  return 0;
}
