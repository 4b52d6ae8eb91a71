// RequestLog: the server's record of each call it answers, two ways, each
// optional:
//   - the access log: one JSON object per line (structured, for log
//     shippers), on stderr or a file;
//   - a Chrome trace: one complete event per inference request (model,
//     id, outcome, rows) in a JSON array that chrome://tracing and
//     Perfetto open.
//
// Thread safety: record() may be called from any number of threads.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

namespace kiln::server {

struct RequestRecord {
  std::string protocol;  // "http" or "grpc"
  std::string method;    // GET, POST, or the gRPC method
  std::string path;      // HTTP path or gRPC service path
  std::string remote;    // the peer
  std::string model;     // inference calls: the model, version and request id
  std::string version;
  std::string id;
  int status = 0;            // HTTP status (gRPC: the HTTP equivalent)
  std::string outcome;       // SUCCESS or a status name
  std::chrono::system_clock::time_point start;
  std::chrono::nanoseconds duration{0};
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

class RequestLog {
 public:
  // Empty access_log_path: no access log; "-": stderr. Empty trace_path: no trace.
  RequestLog(const std::string& access_log_path, const std::string& trace_path);
  ~RequestLog();  // closes the trace's JSON array
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  void record(const RequestRecord& record);

 private:
  std::mutex mutex_;
  FILE* access_ = nullptr;
  bool own_access_ = false;
  FILE* trace_ = nullptr;
  bool first_event_ = true;
  std::chrono::system_clock::time_point origin_ = std::chrono::system_clock::now();
};

}  // namespace kiln::server
