// How the server fails a call: a code every transport maps to its own
// (HTTP status, gRPC status code) and a message for the client.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace kiln::server {

enum class StatusCode {
  kInvalidArgument,    // 400 / INVALID_ARGUMENT: the request is wrong; nothing ran
  kNotFound,           // 404 / NOT_FOUND: no such model or version
  kUnauthenticated,    // 401 / UNAUTHENTICATED: missing or wrong bearer token
  kPayloadTooLarge,    // 413 / RESOURCE_EXHAUSTED: over a size limit
  kUnavailable,        // 503 / UNAVAILABLE: full queues, draining, device down: retry later
  kDeadlineExceeded,   // 504 / DEADLINE_EXCEEDED: the request's timeout passed before it ran
  kInternal,           // 500 / INTERNAL: the device failed the request
};

class ServerError : public std::runtime_error {
 public:
  ServerError(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

int httpStatus(StatusCode code);
// "INVALID_ARGUMENT" ...: the outcome label of metrics and access logs.
const char* statusName(StatusCode code);

// The ServerError for an exception a ModelRunner request completed with,
// following the runner's error table (docs/serving.md, "Errors").
ServerError errorFromRunner(const std::exception_ptr& error);

}  // namespace kiln::server
