#include "kiln/error.h"

#include <fmt/format.h>

#include <cstring>

namespace kiln {

FormatError::FormatError(std::string source, uint64_t offset, const std::string& problem)
    : Error(fmt::format("{}: byte {}: {}", source, offset, problem)),
      source_(std::move(source)),
      offset_(offset),
      problem_(problem) {}

IoError::IoError(const std::string& what, int error_number)
    : Error(fmt::format("{}: {}", what, std::strerror(error_number))), error_number_(error_number) {}

}  // namespace kiln

namespace kiln {

const char* recoveryActionName(RecoveryAction action) {
  switch (action) {
    case RecoveryAction::kDeviceReset: return "device reset";
    case RecoveryAction::kRerun: return "rerun";
    case RecoveryAction::kPowerCycle: return "power cycle";
    case RecoveryAction::kRestartProcess: return "restart the process";
  }
  return "unknown";
}

}  // namespace kiln
