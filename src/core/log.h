// Internal logging helpers: format with fmt, drop below the current level.
// The public controls (level, sink) are in include/kiln/log.h.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "kiln/log.h"

namespace kiln::log {

void emit(LogLevel level, std::string_view message);

template <typename... Args>
void write(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < logLevel()) return;
  emit(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  write(LogLevel::kDebug, format, std::forward<Args>(args)...);
}

template <typename... Args>
void warning(fmt::format_string<Args...> format, Args&&... args) {
  write(LogLevel::kWarning, format, std::forward<Args>(args)...);
}

}  // namespace kiln::log
