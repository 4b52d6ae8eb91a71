// Logging.
//
// kiln logs warnings (for example an unknown blob type that was skipped) and,
// at debug level, what the reader and writer do. Messages go to stderr unless
// a sink is installed.
//
// Thread safety: all functions may be called from any thread; the sink is
// called under a lock, one message at a time.
#pragma once

#include <functional>
#include <string_view>

namespace kiln {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// Messages below `level` are dropped. Default: kWarning, or the value of the
// environment variable KILN_LOG_LEVEL (debug|info|warning|error|off).
void setLogLevel(LogLevel level);
LogLevel logLevel();

// Replaces the destination of log messages; an empty function restores
// stderr. Returns the previous sink.
using LogSink = std::function<void(LogLevel, std::string_view message)>;
LogSink setLogSink(LogSink sink);

}  // namespace kiln
