// libFuzzer target for the package reader: any bytes in, either a valid
// model view or a FormatError out; never a crash, a hang, a leak or a read
// outside the input.
//
// Each input is read twice: with checksums skipped, so that the fuzzer's
// mutations reach the info decoders and cross-checks behind the header
// checksum, and with eager checksums, the production path. Everything the
// reader exposes is then touched, and the dump is rendered.
#include <cstddef>
#include <cstdint>

#include "kiln/format.h"
#include "kiln/log.h"

namespace {

void exercise(const kiln::PackageReader& reader) {
  for (const auto* blob : reader.executables()) {
    if (blob->size() <= (16u << 20)) (void)blob->read();  // bound the allocation a header can ask for
  }
  for (const auto* blob : reader.tensorData()) (void)blob->data();
  for (const auto* blob : reader.feedData()) {
    if (blob->count() > 0) (void)blob->item(blob->count() - 1);
  }
  for (const auto* blob : reader.opaques()) (void)blob->data();
  (void)kiln::dumpText(reader, kiln::DumpOptions::all());
  (void)kiln::dumpJson(reader, kiln::DumpOptions::all());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    kiln::setLogLevel(kiln::LogLevel::kOff);
    return true;
  }();
  (void)quiet;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  for (const auto policy : {kiln::ChecksumPolicy::kSkip, kiln::ChecksumPolicy::kEager}) {
    try {
      const kiln::PackageReader reader = kiln::PackageReader::fromMemory({{"fuzz.kiln", bytes}}, {.checksums = policy});
      exercise(reader);
    } catch (const kiln::FormatError&) {
      // Refusing malformed input is the expected outcome.
    }
  }
  return 0;
}
