// StepTrace: a timeline of the steps an executor ran, written in the Chrome
// trace event format (the JSON that chrome://tracing and Perfetto open).
//
// Each step of each traced run becomes one complete event ("ph": "X") whose
// name is the step's kernel, with its output value and the shapes of its
// inputs and outputs in "args". Each traced run is one more event around its
// steps ("run N"), so a trace of several runs shows them side by side.
//
//   kiln::StepTrace trace;
//   executor.runTraced(inputs, outputs, trace);   // as many runs as wanted
//   trace.write("trace.json");
//
// Tracing reads the clock twice per step and appends to a vector: it is for
// finding where time goes, not for timing the model (use run()).
//
// Thread safety: one thread at a time per StepTrace.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln {

struct TraceEvent {
  std::string name;      // what ran: a kernel name, or "run N"
  std::string category;  // "step" or "run"
  uint64_t start_ns = 0;     // since the trace's epoch
  uint64_t duration_ns = 0;
  std::string args_json;  // a JSON object's members ("\"op\": \"Conv\", ..."), or empty
};

class StepTrace {
 public:
  StepTrace() : epoch_(std::chrono::steady_clock::now()) {}

  // Nanoseconds since the trace was made (the events' clock).
  uint64_t now() const {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - epoch_).count());
  }
  void add(TraceEvent event) { events_.push_back(std::move(event)); }
  // Numbers the runs: each call gives the next run's index.
  uint64_t nextRun() { return runs_++; }

  const std::vector<TraceEvent>& events() const { return events_; }
  void clear() {
    events_.clear();
    runs_ = 0;
  }

  // {"traceEvents": [...], "displayTimeUnit": "ms"}: timestamps and
  // durations in microseconds, as the format wants.
  std::string toJson() const;
  // Writes toJson() to `path`; IoError when it cannot.
  void write(const std::filesystem::path& path) const;

 private:
  std::chrono::steady_clock::time_point epoch_;
  std::vector<TraceEvent> events_;
  uint64_t runs_ = 0;
};

// `text` as the contents of a JSON string (quotes, backslashes and control
// characters escaped).
std::string jsonEscape(const std::string& text);

}  // namespace kiln
