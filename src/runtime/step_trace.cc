#include "kiln/step_trace.h"

#include <fmt/format.h>

#include <cerrno>
#include <fstream>

#include "kiln/error.h"

namespace kiln {

std::string StepTrace::toJson() const {
  std::string out = "{\"traceEvents\": [\n";
  out += R"(  {"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "kiln"}})";
  for (const TraceEvent& event : events_) {
    // Microseconds with nanosecond decimals: the format's unit.
    out += fmt::format(",\n  {{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": {:.3f}, "
                       "\"pid\": 1, \"tid\": 1, \"args\": {{{}}}}}",
                       jsonEscape(event.name), jsonEscape(event.category), static_cast<double>(event.start_ns) / 1e3,
                       static_cast<double>(event.duration_ns) / 1e3, event.args_json);
  }
  out += "\n], \"displayTimeUnit\": \"ms\"}\n";
  return out;
}

void StepTrace::write(const std::filesystem::path& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError("cannot write the trace to " + path.string(), errno);
  const std::string json = toJson();
  out.write(json.data(), static_cast<std::streamsize>(json.size()));
  if (!out) throw IoError("cannot write the trace to " + path.string(), errno);
}

}  // namespace kiln
