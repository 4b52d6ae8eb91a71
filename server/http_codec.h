// The HTTP/REST side of the KServe v2 protocol's inference call: a request
// body (JSON, or JSON followed by the binary tensor data extension's raw
// blobs) into an InferRequest, and an InferResponse into a body.
//
// Pure functions over bytes, with no server around them, so that they can
// be fuzzed (tests/fuzz/http_infer_fuzz.cc). Every problem with a body is a
// ServerError(kInvalidArgument) that says what and where.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "server/infer_request.h"

namespace kiln::server {

struct HttpLimits {
  uint64_t max_tensor_elements = uint64_t{1} << 28;  // per input, JSON or binary
};

// `header_length`: the Inference-Header-Content-Length header when given
// (the JSON is the body's first bytes and binary blobs follow). Inputs
// with binary data point into `body`, which must outlive the request.
InferRequest parseInferRequest(std::string_view body, std::optional<size_t> header_length,
                               const std::string& model_name, const std::string& model_version,
                               const HttpLimits& limits = {});

struct EncodedResponse {
  std::string body;
  std::optional<size_t> header_length;  // set when binary blobs follow the JSON
};

EncodedResponse encodeInferResponse(const InferResponse& response);

// {"error": message}, the protocol's error body.
std::string errorBody(std::string_view message);

}  // namespace kiln::server
