#include "server/metrics.h"

#include <cstdio>
#include <unistd.h>
#include <fmt/format.h>

#include "server/model_repository.h"

namespace kiln::server {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

std::string labels(const std::string& model, const std::string& version) {
  return fmt::format("model=\"{}\",version=\"{}\"", model, version);
}

// One time histogram's series: `counts` per bucket of kTimeBucketSeconds
// (then +Inf), cumulated as Prometheus wants.
void timeHistogram(std::string& out, const char* name, const std::string& l, const TimeHistogram& counts,
                   double sum) {
  uint64_t cumulative = 0;
  for (size_t b = 0; b < kTimeBucketSeconds.size(); ++b) {
    cumulative += counts[b];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, l, kTimeBucketSeconds[b], cumulative);
  }
  cumulative += counts.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, l, cumulative);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, l, sum, name, l, cumulative);
}

}  // namespace

Metrics::Metrics() = default;

void Metrics::observeRequest(const std::string& model, const std::string& version, std::string_view protocol,
                             std::string_view outcome, double seconds) {
  std::lock_guard lock(mutex_);
  ++requests_[RequestKey{model, version, std::string(protocol), std::string(outcome)}];
  Histogram& histogram = latency_[ModelKey{model, version}];
  ++histogram.counts[timeBucket(seconds)];
  histogram.sum += seconds;
}

std::string Metrics::render(const ModelRepository& repository) const {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    header(out, "kiln_requests_total", "counter", "Inference requests answered, by model, protocol and outcome.");
    for (const auto& [key, count] : requests_) {
      const auto& [model, version, protocol, outcome] = key;
      out += fmt::format("kiln_requests_total{{{},protocol=\"{}\",outcome=\"{}\"}} {}\n", labels(model, version),
                         protocol, outcome, count);
    }
    header(out, "kiln_request_duration_seconds", "histogram",
           "Time from a request's arrival to its answer, in the server.");
    for (const auto& [key, histogram] : latency_) {
      timeHistogram(out, "kiln_request_duration_seconds", labels(key.first, key.second), histogram.counts,
                    histogram.sum);
    }
  }

  const auto models = repository.loadedModels();
  std::vector<std::pair<std::string, RunnerStatistics>> stats;
  for (const auto& model : models) stats.emplace_back(labels(model->name(), model->version()), model->runnerStatistics());

  header(out, "kiln_inflight_requests", "gauge", "Requests taken by a model's runner and not yet answered.");
  for (const auto& [l, s] : stats) out += fmt::format("kiln_inflight_requests{{{}}} {}\n", l, s.in_flight);
  header(out, "kiln_refused_requests_total", "counter", "Requests refused because the model's queues were full.");
  for (const auto& [l, s] : stats) out += fmt::format("kiln_refused_requests_total{{{}}} {}\n", l, s.refused);
  header(out, "kiln_queue_duration_seconds", "histogram",
         "Time from a request's arrival at its model's runner until the device took its first rows.");
  for (const auto& [l, s] : stats) timeHistogram(out, "kiln_queue_duration_seconds", l, s.queue_histogram, s.queue_seconds);
  header(out, "kiln_compute_duration_seconds", "histogram",
         "Time from a request's first rows starting on the device to its last rows' answer.");
  for (const auto& [l, s] : stats) timeHistogram(out, "kiln_compute_duration_seconds", l, s.run_histogram, s.run_seconds);
  header(out, "kiln_batch_rows", "histogram", "Request rows carried by each device batch run (the rest was padding).");
  for (const auto& [l, s] : stats) {
    uint64_t cumulative = 0;
    double sum = 0;
    for (size_t k = 0; k < s.rows_histogram.size(); ++k) {
      cumulative += s.rows_histogram[k];
      sum += static_cast<double>(k) * static_cast<double>(s.rows_histogram[k]);
      out += fmt::format("kiln_batch_rows_bucket{{{},le=\"{}\"}} {}\n", l, k, cumulative);
    }
    out += fmt::format("kiln_batch_rows_bucket{{{},le=\"+Inf\"}} {}\n", l, cumulative);
    out += fmt::format("kiln_batch_rows_sum{{{}}} {}\nkiln_batch_rows_count{{{}}} {}\n", l, sum, l, cumulative);
  }
  header(out, "kiln_device_memory_bytes", "gauge", "Device memory a model's replicas hold.");
  for (const auto& model : models) {
    out += fmt::format("kiln_device_memory_bytes{{{}}} {}\n", labels(model->name(), model->version()),
                       model->deviceMemoryInUse());
  }
  header(out, "process_resident_memory_bytes", "gauge", "Resident memory of the server process.");
  out += fmt::format("process_resident_memory_bytes {}\n", residentMemoryBytes());
  return out;
}

uint64_t residentMemoryBytes() {
  FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return 0;
  unsigned long long pages = 0, resident = 0;
  const int read = std::fscanf(file, "%llu %llu", &pages, &resident);
  std::fclose(file);
  return read == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace kiln::server
