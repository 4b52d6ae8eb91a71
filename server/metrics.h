// Metrics: what the server counts, in the Prometheus text format that
// `GET /metrics` on the metrics port answers (docs/serving.md lists them).
//
// Request counts and latency histograms are recorded here as requests
// finish; the rest (queue and compute time histograms, device batch sizes,
// requests in flight, refusals) is read from each loaded model's
// ModelRunner's statistics when the page is rendered.
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/runner_statistics.h"

namespace kiln::server {

class ModelRepository;

class Metrics {
 public:
  Metrics();
  // One inference request answered: `outcome` is "SUCCESS" or a status
  // name (INVALID_ARGUMENT, UNAVAILABLE, ...); `seconds` its time in the server.
  void observeRequest(const std::string& model, const std::string& version, std::string_view protocol,
                      std::string_view outcome, double seconds);
  std::string render(const ModelRepository& repository) const;

 private:
  struct Histogram {
    TimeHistogram counts{};  // per bucket of kTimeBucketSeconds, then +Inf
    double sum = 0;
  };
  using RequestKey = std::tuple<std::string, std::string, std::string, std::string>;  // model, version, protocol, outcome
  using ModelKey = std::pair<std::string, std::string>;

  mutable std::mutex mutex_;
  std::map<RequestKey, uint64_t> requests_;
  std::map<ModelKey, Histogram> latency_;
};

// Resident memory of this process, from /proc/self/statm (0 if unknown).
uint64_t residentMemoryBytes();

}  // namespace kiln::server
