// An inference request and its response as the transports hand them to a
// ServedModel, whatever the wire format (JSON, the binary extension,
// protobuf). Inputs point at memory the transport owns (the HTTP body, the
// gRPC message) until the request completes: no copy on the way in.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

struct InferInput {
  std::string name;
  std::string datatype;          // the protocol's name: "FP32", ...
  std::vector<int64_t> shape;
  std::string_view data;         // raw little-endian elements, row-major
};

struct RequestedOutput {
  std::string name;
  bool binary = false;           // HTTP: answer in the binary extension
};

struct InferRequest {
  std::string model_name;
  std::string model_version;     // empty: the newest loaded version
  std::string id;
  std::vector<InferInput> inputs;
  std::vector<RequestedOutput> outputs;  // empty: every output
  bool binary_outputs = false;   // HTTP: the default of outputs not listed
  // The request's "timeout" parameter or the gRPC deadline: a request not
  // started by then fails with DEADLINE_EXCEEDED and never runs.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Input data the transport had to convert (JSON numbers, typed protobuf
  // contents): `inputs[i].data` may point into it. Vectors keep their
  // buffers when the request moves.
  std::vector<std::vector<char>> storage;
};

struct InferOutput {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string data;              // raw elements
  bool binary = false;
};

struct InferResponse {
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<InferOutput> outputs;
};

}  // namespace kiln::server
