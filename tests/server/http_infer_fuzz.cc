// Fuzzes kiln serve's HTTP inference body handling (server/http_codec.h):
// the first two bytes choose the Inference-Header-Content-Length (or none),
// the rest is the body. Any input must parse or be refused with a
// ServerError; a request that parses must encode back as a response.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http_codec.h"
#include "server/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint16_t choice = static_cast<uint16_t>(data[0] | (data[1] << 8));
  const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  std::optional<size_t> header_length;
  if (choice != 0xFFFF) header_length = choice;
  try {
    kiln::server::InferRequest request =
        kiln::server::parseInferRequest(body, header_length, "m", "1", kiln::server::HttpLimits{1 << 16});
    kiln::server::InferResponse response;
    for (const auto& input : request.inputs) {
      response.outputs.push_back({input.name, input.datatype, input.shape, std::string(input.data), input.data.size() % 2 == 0});
    }
    (void)kiln::server::encodeInferResponse(response);
  } catch (const kiln::server::ServerError&) {
  }
  return 0;
}
