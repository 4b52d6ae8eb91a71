#include "server/request_log.h"

#include <cerrno>
#include <functional>
#include <thread>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::server {
namespace {

FILE* openForAppend(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) throw IoError("cannot open " + path + " for writing", errno);
  return file;
}

std::string isoTime(std::chrono::system_clock::time_point t) {
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(millis / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[96];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(millis % 1000));
  return text;
}

}  // namespace

RequestLog::RequestLog(const std::string& access_log_path, const std::string& trace_path) {
  if (access_log_path == "-") {
    access_ = stderr;
  } else if (!access_log_path.empty()) {
    access_ = openForAppend(access_log_path);
    own_access_ = true;
  }
  if (!trace_path.empty()) {
    trace_ = std::fopen(trace_path.c_str(), "w");
    if (trace_ == nullptr) throw IoError("cannot open " + trace_path + " for writing", errno);
    std::fputs("[\n", trace_);
  }
}

RequestLog::~RequestLog() {
  if (trace_ != nullptr) {
    std::fputs("\n]\n", trace_);
    std::fclose(trace_);
  }
  if (own_access_) std::fclose(access_);
}

void RequestLog::record(const RequestRecord& r) {
  if (access_ == nullptr && (trace_ == nullptr || r.model.empty())) return;
  std::string access_line;
  if (access_ != nullptr) {
    nlohmann::json line = {{"time", isoTime(r.start)},
                           {"protocol", r.protocol},
                           {"method", r.method},
                           {"path", r.path},
                           {"remote", r.remote},
                           {"status", r.status},
                           {"duration_ms", std::chrono::duration<double, std::milli>(r.duration).count()},
                           {"bytes_in", r.bytes_in},
                           {"bytes_out", r.bytes_out}};
    if (!r.model.empty()) {
      line["model"] = r.model;
      line["version"] = r.version;
      line["outcome"] = r.outcome;
      if (!r.id.empty()) line["id"] = r.id;
    }
    access_line = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  std::string event;
  if (trace_ != nullptr && !r.model.empty()) {
    const auto start_us = std::chrono::duration<double, std::micro>(r.start - origin_).count();
    nlohmann::json e = {{"name", r.model + ":" + r.version},
                        {"cat", r.protocol},
                        {"ph", "X"},
                        {"ts", start_us},
                        {"dur", std::chrono::duration<double, std::micro>(r.duration).count()},
                        {"pid", 1},
                        {"tid", std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000},
                        {"args", {{"id", r.id}, {"outcome", r.outcome}, {"status", r.status}, {"path", r.path}}}};
    event = e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::lock_guard lock(mutex_);
  if (!access_line.empty()) {
    std::fputs(access_line.c_str(), access_);
    std::fflush(access_);
  }
  if (!event.empty()) {
    if (!first_event_) std::fputs(",\n", trace_);
    first_event_ = false;
    std::fputs(event.c_str(), trace_);
    std::fflush(trace_);
  }
}

}  // namespace kiln::server
