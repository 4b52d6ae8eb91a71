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
//   DeviceError  a program failed on a device. Its subclasses are the error
//                classes of the reference runtime, which decide what the
//                model runner does next (docs/runtime.md, "Errors"):
//     ApplicationRuntimeError  the program itself failed (an exception on
//                the device); a device reset clears it.
//     RecoverableDeviceError   a transient failure; recoveryAction() says
//                what clears it (only kDeviceReset lets the runner reset by
//                itself).
//     UnknownDeviceError       the device is in an unknown state: nothing
//                is reset, manual intervention is needed.
//   DeviceBusyError  the device asked for is attached elsewhere (another
//                process or object) and the wait configuration gave up.
//
// Thread safety: exceptions are immutable values and may be shared freely.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

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

class DeviceError : public Error {
 public:
  DeviceError(std::string device, const std::string& message)
      : Error(device + ": " + message), device_(std::move(device)) {}
  const std::string& device() const { return device_; }

 private:
  std::string device_;
};

class ApplicationRuntimeError : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

// What clears a recoverable error, as the reference's poplar::RecoveryAction.
enum class RecoveryAction : uint8_t {
  kDeviceReset,  // reset the device and reload the executable (IPU_RESET)
  kRerun,        // nothing to reset: running the program again may succeed
  kPowerCycle,   // the device needs a power cycle: an operator must act
  // This process cannot use the device again: it must exit, and a new one
  // can (CUDA's errors that corrupt a context; see docs/cuda.md, "Errors").
  kRestartProcess,
};

const char* recoveryActionName(RecoveryAction action);

class RecoverableDeviceError : public DeviceError {
 public:
  RecoverableDeviceError(std::string device, const std::string& message, RecoveryAction action)
      : DeviceError(std::move(device), message + " (recovery action: " + recoveryActionName(action) + ")"),
        action_(action) {}
  RecoveryAction recoveryAction() const { return action_; }

 private:
  RecoveryAction action_;
};

class UnknownDeviceError : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

// A ModelRunner request cancelled (Future::cancel) before it started.
class RequestCancelledError : public Error {
 public:
  explicit RequestCancelledError(const std::string& message) : Error(message) {}
};

// A ModelRunner request whose deadline passed before it started.
class DeadlineExceededError : public Error {
 public:
  explicit DeadlineExceededError(const std::string& message) : Error(message) {}
};

class DeviceBusyError : public Error {
 public:
  explicit DeviceBusyError(const std::string& message) : Error(message) {}
};

}  // namespace kiln
