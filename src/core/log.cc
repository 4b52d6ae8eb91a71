#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace kiln {
namespace {

LogLevel levelFromEnvironment() {
  const char* value = std::getenv("KILN_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kWarning;
  const std::string text(value);
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "error") return LogLevel::kError;
  if (text == "off") return LogLevel::kOff;
  return LogLevel::kWarning;
}

std::atomic<LogLevel>& currentLevel() {
  static std::atomic<LogLevel> level{levelFromEnvironment()};
  return level;
}

std::mutex& sinkMutex() {
  static std::mutex mutex;
  return mutex;
}

LogSink& currentSink() {
  static LogSink sink;
  return sink;
}

std::string_view levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: break;
  }
  return "off";
}

}  // namespace

void setLogLevel(LogLevel level) { currentLevel().store(level); }
LogLevel logLevel() { return currentLevel().load(); }

LogSink setLogSink(LogSink sink) {
  std::lock_guard lock(sinkMutex());
  LogSink previous = std::move(currentSink());
  currentSink() = std::move(sink);
  return previous;
}

void log::emit(LogLevel level, std::string_view message) {
  std::lock_guard lock(sinkMutex());
  if (currentSink()) {
    currentSink()(level, message);
    return;
  }
  std::fprintf(stderr, "kiln %.*s: %.*s\n", static_cast<int>(levelName(level).size()), levelName(level).data(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace kiln
