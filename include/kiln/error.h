// kiln errors.
//
// Every failure that a caller can act on is reported as an exception derived
// from kiln::Error. The message always says what was expected and what was
// found, so that it can be shown to a user as is.
//
//   Error        base class; catch this to handle any kiln failure.
//   FormatError  a package file (or memory buffer) is malformed: carries the
//                source name and the byte offset where the problem was found.
//   GraphError   a model or graph is malformed or unsupported (import,
//                verification, shape inference, missing kernels).
//   UsageError   the API was used in a way its contract forbids (writing
//                through a stale blob writer, invalid arguments).
//   IoError      the operating system refused an operation (open, write,
//                mmap); carries errno's text.
//
// Thread safety: exceptions are immutable values and may be shared freely.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class FormatError : public Error {
 public:
  // `source` names the file or buffer; `offset` is the absolute byte offset
  // inside it where the problem was found; `problem` says what was wrong.
  FormatError(std::string source, uint64_t offset, const std::string& problem);

  const std::string& source() const { return source_; }
  uint64_t offset() const { return offset_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string source_;
  uint64_t offset_;
  std::string problem_;
};

class GraphError : public Error {
 public:
  explicit GraphError(const std::string& message) : Error(message) {}
};

class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

class IoError : public Error {
 public:
  // Builds "<what>: <strerror(error_number)>".
  IoError(const std::string& what, int error_number);
  int errorNumber() const { return error_number_; }

 private:
  int error_number_;
};

}  // namespace kiln
