// libFuzzer target for the graph codec (the graph stored in packages with
// run-time shapes): any bytes in, either a verified Graph or a FormatError
// out; never a crash, hang or leak. A graph that decodes must encode and
// decode again to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ir/graph_codec.h"
#include "kiln/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const kiln::Graph graph = kiln::decodeGraph(bytes, "fuzz");
    const auto again = kiln::encodeGraph(graph);
    if (kiln::encodeGraph(kiln::decodeGraph(again, "fuzz")) != again) std::abort();
  } catch (const kiln::FormatError&) {
    // Refusing malformed input is the expected outcome.
  }
  return 0;
}
