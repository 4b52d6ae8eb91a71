// RunnerStatistics: what a ModelRunner has done so far, readable at any
// time while it runs (ModelRunner::statistics()).
//
// Requests are counted once, when they complete: succeeded, or failed by
// class. A request refused by tryExecuteAsync is counted as refused and
// not submitted. Times are per request, on a sample of requests
// (ModelRunnerConfig::statistics_sample_every; every request when 1):
// queue time from the call until the main loop took its first rows, run
// time from then until its last rows were answered (requests that never
// started count in neither).
//
// Thread safety: the counters are atomics; a snapshot is consistent per
// counter, not across counters (a request may show as submitted before it
// shows as completed).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kiln {

// Upper bounds, in seconds, of the buckets of RunnerStatistics' time
// histograms (a last bucket holds everything slower): the Prometheus
// convention of 1, 2.5, 5 per decade, from 100 us to 10 s.
inline constexpr std::array<double, 16> kTimeBucketSeconds{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                           0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                           1.0,    2.5,     5.0,    10.0};
using TimeHistogram = std::array<uint64_t, kTimeBucketSeconds.size() + 1>;

// The bucket of kTimeBucketSeconds that `seconds` falls in.
inline size_t timeBucket(double seconds) {
  size_t bucket = 0;
  while (bucket < kTimeBucketSeconds.size() && seconds > kTimeBucketSeconds[bucket]) ++bucket;
  return bucket;
}

struct RunnerStatistics {
  uint64_t submitted = 0;    // requests accepted (enqueued or answered at once)
  uint64_t refused = 0;      // tryExecuteAsync calls that found no room
  uint64_t in_flight = 0;    // submitted and not yet completed
  uint64_t succeeded = 0;
  // Failed requests by the class of their error.
  uint64_t cancelled = 0;          // RequestCancelledError
  uint64_t deadline_exceeded = 0;  // DeadlineExceededError
  uint64_t usage_errors = 0;       // UsageError (bad requests, a shut-down runner, a flush_callback's fault)
  uint64_t application_errors = 0;  // ApplicationRuntimeError
  uint64_t recoverable_errors = 0;  // RecoverableDeviceError
  uint64_t unknown_errors = 0;      // UnknownDeviceError and anything else

  uint64_t batches_run = 0;
  uint64_t batches_flushed = 0;  // run partial after the timeout (or a flush)
  // rows_histogram[k]: device batches that carried k rows of requests
  // (k = 0 .. the compiled batch's rows; the rest was padding), over every
  // replica.
  std::vector<uint64_t> rows_histogram;

  // Queue and run times, measured on one request in
  // ModelRunnerConfig::statistics_sample_every: `timed` such requests
  // completed after they started, with these sums, maxima and histograms
  // (per bucket of kTimeBucketSeconds, not cumulative).
  uint64_t timed = 0;
  double queue_seconds = 0;
  double run_seconds = 0;
  double max_queue_seconds = 0;
  double max_run_seconds = 0;
  TimeHistogram queue_histogram{};
  TimeHistogram run_histogram{};
};

}  // namespace kiln
