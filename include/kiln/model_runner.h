// ModelRunner: the high-level entry point for running a packaged model.
//
// It finds and attaches devices (DeviceManager), loads the model on each
// (Session), creates the queues, and runs one main-loop thread per replica.
// execute() and executeAsync() turn a request (caller memory per anchor)
// into queue entries that point at that memory; results are written in
// place, or into tensors the runner allocates. Requests from any number of
// callers are gathered into device batches, so concurrent small requests
// share the device.
//
// Behaviours (docs/runtime.md gives the details and examples):
//   - I/O validation (validate_io_params): missing or extra anchors, wrong
//     sizes or dtypes are a UsageError naming the anchor and what was
//     expected. Off: a request may give only the anchors of the sub-model
//     it selects (conditional execution); inputs it leaves out read zeros,
//     outputs it leaves out are dropped. Sizes are always checked.
//   - Batch sizing: without batching_dim (kNoBatchDim), a request holds N
//     whole compiled tensors per anchor, stacked on dimension 0 (N >= 1).
//     With batching_dim = d, any number of rows on dimension d: requests
//     are split and padded into the compiled batch and the outputs
//     reassembled.
//   - Flush: a partial device batch waits timeout_ns for rows from other
//     requests, then runs padded (flush_callback may supply the padding).
//   - Errors, as the reference's table: application errors and recoverable
//     errors whose action is a device reset reset the device and reload the
//     model before the next request when auto_reset is on; every request
//     already enqueued when the error happened completes with that error.
//     A recoverable error whose action is a rerun fails the enqueued
//     requests and the device keeps serving. Otherwise (unknown errors,
//     the actions power cycle and restart the process, auto_reset off) the
//     runner stops: enqueued and later requests fail with the error until
//     reset() is called. After a restart-the-process error (a CUDA error
//     that corrupted the context) reset() fails with it too: only a new
//     process can use the device.
//   - Replicas: replication_factor N runs N copies on N devices (sim
//     devices, or the CPU cores split N ways). Anchors marked per-replica
//     in the package get a leading dimension N and each replica runs its
//     slice; otherwise the request stream is spread over the replicas.
//
// Thread safety: with thread_safe, any number of threads may call execute
// and executeAsync at once. Without it, one call at a time: an overlapping
// call throws UsageError. Callers own their input and output memory and
// must keep it valid until their result is ready.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/device.h"
#include "kiln/metadata.h"
#include "kiln/request_future.h"
#include "kiln/runner_statistics.h"
#include "kiln/session.h"

namespace kiln {

class PackageReader;

struct ModelRunnerConfig {
  DeviceWaitConfig device_wait_config;
  bool thread_safe = true;
  std::chrono::nanoseconds timeout_ns{std::chrono::milliseconds(5)};
  bool validate_io_params = true;
  uint32_t batching_dim = kNoBatchDim;  // 0xFFFFFFFF: dynamic batch sizing off
  uint32_t ring_buffer_size_multiplier = 2;
  bool auto_reset = true;
  FlushCallback flush_callback;
  uint32_t replication_factor = 1;

  // kiln's additions.
  std::optional<DeviceKind> device_kind;  // e.g. kSim to run a cpu package on sim devices
  DeviceManager* device_manager = nullptr;  // null: one built from the environment
  uint32_t pipeline_depth = 3;              // batches in flight per device (own-memory devices), 1 to 64
  std::string model;                        // which model of the package; empty: its only one
  int threads = 0;                          // kernel threads per replica; 0: the device's
  bool flush_denormals = true;              // as ExecutorOptions::flush_denormals
  // While requests come concurrently, a partial batch waits up to this
  // fraction of the recent batch run time when that is longer than
  // timeout_ns (SessionOptions::adaptive_timeout); 0: off.
  double adaptive_timeout = 0;
  // Requests timed for statistics(): one in this many (1: every one). Two
  // clock reads and a few atomics are a measurable share of a request that
  // takes microseconds; a server, whose requests cost far more, times all.
  uint32_t statistics_sample_every = 8;
};

// Per-request controls (kiln's additions).
struct RequestOptions {
  // A request not started by then completes with DeadlineExceededError and
  // never runs (one that started runs to the end).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Called once when the request completes (null: success), on a runner
  // thread, before its Future is ready: for event-loop callers. Keep it
  // short; a throw from it is ignored.
  std::function<void(const std::exception_ptr& error)> on_complete;
};

// One anchor as a request sees it.
struct DataDesc {
  std::string name;
  std::vector<int64_t> shape;  // of one compiled batch (with the replica dimension in front when per-replica)
  DType dtype = DType::kUndefined;
  uint64_t size_in_bytes = 0;
};

class ModelRunner {
 public:
  // From package file(s) (a model may be split over several files).
  explicit ModelRunner(const std::filesystem::path& package, ModelRunnerConfig config = {});
  ModelRunner(const std::vector<std::filesystem::path>& packages, ModelRunnerConfig config = {});
  // From an opened package.
  ModelRunner(std::shared_ptr<const PackageReader> package, ModelRunnerConfig config = {});
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  std::vector<DataDesc> getExecuteInputs() const;
  std::vector<DataDesc> getExecuteOutputs() const;

  // Runner-allocated outputs.
  OutputTensors execute(const InputMemoryView& inputs);
  Future<OutputTensors> executeAsync(const InputMemoryView& inputs, const RequestOptions& options = {});
  // Caller-allocated outputs.
  void execute(const InputMemoryView& inputs, const OutputMemoryView& outputs);
  Future<void> executeAsync(const InputMemoryView& inputs, const OutputMemoryView& outputs,
                            const RequestOptions& options = {});

  // Like executeAsync, but never waits for room: nullopt (nothing enqueued,
  // nothing run) when no serving replica can take the request's first
  // device batch at once, so that event loops and servers can shed load or
  // retry. A request of several device batches waits for room for the
  // others once the first is in (the main loop is then consuming).
  std::optional<Future<OutputTensors>> tryExecuteAsync(const InputMemoryView& inputs, const RequestOptions& options = {});
  std::optional<Future<void>> tryExecuteAsync(const InputMemoryView& inputs, const OutputMemoryView& outputs,
                                              const RequestOptions& options = {});

  // Graceful drain: from now on new requests are refused (they complete
  // with UsageError "draining"); waits until every request already taken
  // is answered, flushing partial batches at once, or `bound` passes.
  // True when all were answered. The runner keeps refusing afterwards.
  bool drain(std::chrono::nanoseconds bound);

  // Health: true while the runner takes requests and can run them (not
  // draining or shutting down, and a replica serving; with per-replica
  // anchors, every replica).
  bool isReady() const;

  // What the runner has done so far (include/kiln/runner_statistics.h);
  // cheap, and safe while requests run.
  RunnerStatistics statistics() const;

  // After replicas stopped on an error: resets their devices, reloads the
  // model on them and puts them back in rotation. Replicas still serving
  // are left alone. One call at a time (concurrent calls wait). Throws the
  // first error of a replica that could not be reset; that replica stays
  // out of rotation and the others are reset anyway.
  void reset();

  // Replicas in rotation: serving requests (N when healthy). A replica
  // stops on an error the reference's table says stops (or after a failed
  // reset); requests then go to the others, and fail with its error only
  // when none is left (with per-replica anchors: when any one stopped).
  uint32_t replicasServing() const;

  // Device resets done so far (automatic and manual), device batches run,
  // batches flushed partial.
  uint64_t resets() const;
  uint64_t batchesRun() const;
  uint64_t batchesFlushed() const;
  const ModelRunnerConfig& config() const;
  std::vector<std::string> deviceIds() const;
  // Device memory the replicas' devices hold now, summed (for cpu devices:
  // the host memory they allocated).
  uint64_t deviceMemoryInUse() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
