// ServedModel: one version of one model of the repository, running on its
// own ModelRunner, and everything the protocol says about it (metadata,
// configuration, statistics).
//
// infer() validates a request against the model's tensors (names,
// datatypes, shapes, byte sizes) before anything runs, so that a bad
// request is answered 400 and changes nothing; then it hands the request
// to the runner without waiting for room (back-pressure: full queues answer
// 503) and returns at once. `done` is called exactly once, on a runner
// thread or the caller's, with the response or the error.
//
// Lifetime: callers hold a ServedModel by shared_ptr; a request in flight
// holds one too, so unloading a model (the repository drops its pointer)
// lets every request already taken finish on it.
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "kiln/model_runner.h"
#include "server/infer_request.h"
#include "server/model_config.h"
#include "server/status.h"

namespace kiln::server {

// A model tensor as the protocol describes it.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUndefined;
  std::string datatype;         // protocol name ("FP32")
  std::vector<int64_t> shape;   // -1 on the batching dimension
};

using InferResult = std::variant<InferResponse, ServerError>;
using InferDone = std::function<void(InferResult&&)>;

// The statistics extension's view of a model version.
struct ServedModelStatistics {
  uint64_t last_inference_ms = 0;
  uint64_t inference_count = 0;   // rows answered successfully
  uint64_t execution_count = 0;   // device batches run
  uint64_t success_count = 0, success_ns = 0;
  uint64_t fail_count = 0, fail_ns = 0;
  uint64_t queue_count = 0, queue_ns = 0;      // sampled requests (one in 8)
  uint64_t compute_count = 0, compute_ns = 0;
  // Device batches run, by the request rows they carried (1 ..).
  std::vector<std::pair<uint64_t, uint64_t>> batches_by_rows;
};

class ServedModel : public std::enable_shared_from_this<ServedModel> {
 public:
  // Loads `package` on the devices `config` asks for; throws kiln::Error
  // (a malformed package, no device) with the reason.
  ServedModel(std::string name, std::string version, const std::filesystem::path& package, const ModelConfig& config);
  ~ServedModel();

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  // Rows a request may carry on the batching dimension; 0: no batching
  // (requests carry the compiled shapes exactly).
  int64_t maxBatchSize() const { return max_batch_size_; }
  bool batching() const { return batching_dim_ >= 0; }
  // The model configuration's view (Triton's convention): with batching on
  // dimension 0, max_batch_size > 0 and dims without that dimension; else
  // max_batch_size 0 and the whole shape (-1 on a batching dimension).
  int64_t configMaxBatchSize() const { return batching_dim_ == 0 ? max_batch_size_ : 0; }
  std::vector<int64_t> configDims(const TensorSpec& tensor) const;

  bool isReady() const;
  void infer(InferRequest&& request, InferDone done);
  // Stops taking requests and waits up to `bound` for those taken.
  bool drain(std::chrono::nanoseconds bound);

  ServedModelStatistics statistics() const;
  RunnerStatistics runnerStatistics() const { return runner_->statistics(); }
  std::vector<std::string> deviceIds() const { return runner_->deviceIds(); }
  uint64_t deviceMemoryInUse() const { return runner_->deviceMemoryInUse(); }

 private:
  struct InFlight;
  // Checks the request and returns its rows on the batching dimension (1
  // without batching); throws ServerError(kInvalidArgument).
  int64_t validate(const InferRequest& request) const;
  void finish(InFlight& flight, const std::exception_ptr& error);
  void countFailure(uint64_t nanoseconds);

  std::string name_;
  std::string version_;
  ModelConfig config_;
  int64_t batching_dim_ = -1;
  int64_t max_batch_size_ = 0;
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
  std::vector<std::vector<int64_t>> compiled_output_shapes_;
  std::unique_ptr<ModelRunner> runner_;

  std::atomic<uint64_t> success_{0}, success_ns_{0}, fail_{0}, fail_ns_{0}, inference_count_{0},
      last_inference_ms_{0};
};

}  // namespace kiln::server
