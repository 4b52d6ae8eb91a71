// libFuzzer target for the ONNX importer: any bytes in, either a verified
// Graph or a GraphError out; never a crash, hang or leak. External data is
// refused (no base directory), so inputs cannot make it read files.
#include <cstddef>
#include <cstdint>

#include "kiln/error.h"
#include "kiln/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  kiln::OnnxImportOptions options;
  options.require_static_inputs = false;
  try {
    const kiln::OnnxModel model = kiln::importOnnxFromMemory(bytes, "fuzz.onnx", {}, options);
    (void)model.graph->toString();
  } catch (const kiln::GraphError&) {
    // Refusing malformed input is the expected outcome.
  } catch (const kiln::UsageError&) {
    // Invalid constants (sizes) are reported as usage errors by makeConstant.
  }
  return 0;
}
