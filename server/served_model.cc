#include "server/served_model.h"

#include <algorithm>
#include <fmt/format.h>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "server/datatype.h"

namespace kiln::server {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanosSince(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

uint64_t epochMillis() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string shapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Dimension 0 when every user anchor of the package has the same leading
// size (what `kiln compile --batch N` gives), else -1.
int64_t defaultBatchingDim(const PackageReader& package) {
  std::optional<int64_t> leading;
  size_t anchors = 0;
  for (const MetadataBlob* blob : package.metadata()) {
    for (const Anchor& anchor : blob->metadata().anchors) {
      if (package.isPackageProvided(anchor)) continue;
      if (anchor.info.shape.empty()) return -1;
      if (leading && *leading != anchor.info.shape[0]) return -1;
      leading = anchor.info.shape[0];
      ++anchors;
    }
  }
  return anchors > 0 ? 0 : -1;
}

// The compiled batch's rows on `dim` (the largest over the user inputs).
int64_t compiledRows(const PackageReader& package, int64_t dim) {
  int64_t rows = 1;
  for (const MetadataBlob* blob : package.metadata()) {
    for (const Anchor& anchor : blob->metadata().anchors) {
      if (package.isPackageProvided(anchor) || anchor.direction != AnchorDirection::kInput) continue;
      if (dim >= 0 && static_cast<size_t>(dim) < anchor.info.shape.size()) {
        rows = std::max(rows, anchor.info.shape[static_cast<size_t>(dim)]);
      }
    }
  }
  return rows;
}

TensorSpec specOf(const DataDesc& desc, int64_t batching_dim, const char* what) {
  TensorSpec spec{desc.name, desc.dtype, std::string(protocolDatatype(desc.dtype)), desc.shape};
  if (spec.datatype.empty()) {
    throw UsageError(fmt::format("{} '{}' is {}, which the inference protocol cannot carry", what, desc.name,
                                 dtypeName(desc.dtype)));
  }
  if (batching_dim >= 0) spec.shape[static_cast<size_t>(batching_dim)] = -1;
  return spec;
}

}  // namespace

// A request between infer() and its completion: owns what the runner reads
// and writes, and keeps the model alive.
struct ServedModel::InFlight {
  std::shared_ptr<ServedModel> model;
  InferRequest request;
  InferResponse response;
  InferDone done;
  Clock::time_point start;
  int64_t rows = 0;
  InputMemoryView input_views;
  OutputMemoryView output_views;
  std::vector<bool> returned;  // per model output: does the response carry it
};

ServedModel::ServedModel(std::string name, std::string version, const std::filesystem::path& package,
                         const ModelConfig& config)
    : name_(std::move(name)), version_(std::move(version)), config_(config) {
  auto reader = std::make_shared<const PackageReader>(package);
  batching_dim_ = config.batching_dim ? *config.batching_dim : defaultBatchingDim(*reader);

  ModelRunnerConfig runner_config;
  runner_config.timeout_ns = config.max_queue_delay;
  runner_config.adaptive_timeout = config.adaptive_queue_delay;
  runner_config.batching_dim = batching_dim_ >= 0 ? static_cast<uint32_t>(batching_dim_) : kNoBatchDim;
  runner_config.replication_factor = config.instances;
  runner_config.device_kind = config.device_kind;
  runner_config.threads = config.threads;
  runner_config.statistics_sample_every = 1;  // the metrics' queue and compute histograms count every request
  // Ring buffers hold pointers into the requests, so deep queues are
  // cheap; their depth is the back-pressure bound.
  const int64_t rows_per_batch = compiledRows(*reader, batching_dim_);
  const int64_t queue_rows = config.max_queue_rows > 0 ? config.max_queue_rows : 64 * rows_per_batch;
  runner_config.ring_buffer_size_multiplier =
      static_cast<uint32_t>(std::max<int64_t>(2, (queue_rows + rows_per_batch - 1) / rows_per_batch));
  runner_ = std::make_unique<ModelRunner>(reader, runner_config);

  int64_t compiled_rows = 1;
  for (const DataDesc& desc : runner_->getExecuteInputs()) {
    if (batching_dim_ >= 0) {
      if (static_cast<size_t>(batching_dim_) >= desc.shape.size()) {
        throw UsageError(fmt::format("batching_dim {} is outside input '{}' of shape {}", batching_dim_, desc.name,
                                     shapeText(desc.shape)));
      }
      compiled_rows = desc.shape[static_cast<size_t>(batching_dim_)];
    }
    inputs_.push_back(specOf(desc, batching_dim_, "input"));
  }
  for (const DataDesc& desc : runner_->getExecuteOutputs()) {
    compiled_output_shapes_.push_back(desc.shape);
    outputs_.push_back(specOf(desc, batching_dim_, "output"));
  }
  if (batching_dim_ >= 0) {
    max_batch_size_ = config.max_batch_size > 0 ? config.max_batch_size : compiled_rows;
  }
}

ServedModel::~ServedModel() = default;

bool ServedModel::isReady() const { return runner_->isReady(); }

bool ServedModel::drain(std::chrono::nanoseconds bound) { return runner_->drain(bound); }

int64_t ServedModel::validate(const InferRequest& request) const {
  auto refuse = [](const std::string& message) { return ServerError(StatusCode::kInvalidArgument, message); };
  std::vector<bool> seen(inputs_.size(), false);
  std::optional<int64_t> rows;
  for (const InferInput& input : request.inputs) {
    auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const TensorSpec& s) { return s.name == input.name; });
    if (it == inputs_.end()) {
      std::vector<std::string> names;
      for (const TensorSpec& spec : inputs_) names.push_back(spec.name);
      throw refuse(fmt::format("model '{}' has no input '{}' (its inputs: {})", name_, input.name,
                               fmt::join(names, ", ")));
    }
    const size_t i = static_cast<size_t>(it - inputs_.begin());
    if (seen[i]) throw refuse(fmt::format("input '{}' is given twice", input.name));
    seen[i] = true;
    if (input.datatype != it->datatype) {
      throw refuse(fmt::format("input '{}' is {}, the request gives {}", input.name, it->datatype, input.datatype));
    }
    if (input.shape.size() != it->shape.size()) {
      throw refuse(fmt::format("input '{}' has shape {}, the request gives {}", input.name, shapeText(it->shape),
                               shapeText(input.shape)));
    }
    uint64_t elements = 1;
    for (size_t d = 0; d < input.shape.size(); ++d) {
      const int64_t want = it->shape[d];
      const int64_t got = input.shape[d];
      if (want == -1) {
        if (got < 1 || got > max_batch_size_) {
          throw refuse(fmt::format("input '{}' has {} rows on its batch dimension {}; this model takes 1 to {}",
                                   input.name, got, d, max_batch_size_));
        }
        if (rows && *rows != got) {
          throw refuse(fmt::format("input '{}' has {} rows, another input {}: every input needs the same rows",
                                   input.name, got, *rows));
        }
        rows = got;
      } else if (got != want) {
        throw refuse(fmt::format("input '{}' has shape {}, the request gives {}", input.name, shapeText(it->shape),
                                 shapeText(input.shape)));
      }
      elements *= static_cast<uint64_t>(got);
    }
    const uint64_t bytes = elements * dtypeSize(it->dtype);
    if (input.data.size() != bytes) {
      throw refuse(fmt::format("input '{}' of shape {} ({}) needs {} bytes of data, the request gives {}", input.name,
                               shapeText(input.shape), input.datatype, bytes, input.data.size()));
    }
  }
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (!seen[i]) throw refuse(fmt::format("the request gives no input '{}'", inputs_[i].name));
  }
  for (const RequestedOutput& output : request.outputs) {
    if (std::none_of(outputs_.begin(), outputs_.end(), [&](const TensorSpec& s) { return s.name == output.name; })) {
      throw refuse(fmt::format("model '{}' has no output '{}'", name_, output.name));
    }
  }
  return rows.value_or(1);
}

void ServedModel::infer(InferRequest&& request, InferDone done) {
  const Clock::time_point start = Clock::now();
  auto flight = std::make_unique<InFlight>();
  flight->model = shared_from_this();
  flight->start = start;
  flight->done = std::move(done);
  try {
    flight->rows = validate(request);
  } catch (const ServerError& error) {
    countFailure(nanosSince(start));
    flight->done(error);
    return;
  }
  flight->request = std::move(request);
  InferRequest& req = flight->request;
  InferResponse& response = flight->response;
  response.model_name = name_;
  response.model_version = version_;
  response.id = req.id;
  for (const InferInput& input : req.inputs) {
    const TensorSpec& spec = *std::find_if(inputs_.begin(), inputs_.end(),
                                           [&](const TensorSpec& s) { return s.name == input.name; });
    flight->input_views[input.name] = ConstTensorMemoryView{input.data.data(), input.data.size(), spec.dtype};
  }
  // The runner writes every output (it validates that all are given);
  // the response carries the requested ones.
  response.outputs.resize(outputs_.size());
  flight->returned.assign(outputs_.size(), req.outputs.empty());
  for (size_t j = 0; j < outputs_.size(); ++j) {
    InferOutput& out = response.outputs[j];
    out.name = outputs_[j].name;
    out.datatype = outputs_[j].datatype;
    out.shape = compiled_output_shapes_[j];
    if (batching_dim_ >= 0) out.shape[static_cast<size_t>(batching_dim_)] = flight->rows;
    out.binary = req.binary_outputs;
    for (const RequestedOutput& wanted : req.outputs) {
      if (wanted.name == out.name) {
        flight->returned[j] = true;
        out.binary = wanted.binary;
      }
    }
    uint64_t elements = 1;
    for (int64_t d : out.shape) elements *= static_cast<uint64_t>(d);
    out.data.resize(elements * dtypeSize(outputs_[j].dtype));
    flight->output_views[out.name] = TensorMemoryView{out.data.data(), out.data.size(), outputs_[j].dtype};
  }

  RequestOptions options;
  if (req.deadline) options.deadline = *req.deadline;
  InFlight* raw = flight.get();
  options.on_complete = [raw](const std::exception_ptr& error) {
    std::unique_ptr<InFlight> owned(raw);
    owned->model->finish(*owned, error);
  };
  std::optional<Future<void>> future;
  try {
    future = runner_->tryExecuteAsync(raw->input_views, raw->output_views, options);
  } catch (...) {
    // Refused before it was enqueued (on_complete never runs).
    ServerError error = errorFromRunner(std::current_exception());
    countFailure(nanosSince(start));
    flight->done(std::move(error));
    return;
  }
  if (!future) {
    countFailure(nanosSince(start));
    flight->done(ServerError(
        StatusCode::kUnavailable,
        runner_->isReady()
            ? fmt::format("model '{}' version {}: its request queues are full; retry later", name_, version_)
            : fmt::format("model '{}' version {} is not serving now (its device is resetting after an error, or "
                          "stopped); retry later",
                          name_, version_)));
    return;
  }
  // on_complete owns the request from now on; the Future is not needed.
  flight.release();
}

void ServedModel::finish(InFlight& flight, const std::exception_ptr& error) {
  const uint64_t elapsed = nanosSince(flight.start);
  if (error) {
    countFailure(elapsed);
    flight.done(errorFromRunner(error));
    return;
  }
  success_.fetch_add(1, std::memory_order_relaxed);
  success_ns_.fetch_add(elapsed, std::memory_order_relaxed);
  inference_count_.fetch_add(static_cast<uint64_t>(flight.rows), std::memory_order_relaxed);
  last_inference_ms_.store(epochMillis(), std::memory_order_relaxed);
  InferResponse& response = flight.response;
  size_t kept = 0;
  for (size_t j = 0; j < response.outputs.size(); ++j) {
    if (!flight.returned[j]) continue;
    if (kept != j) response.outputs[kept] = std::move(response.outputs[j]);
    ++kept;
  }
  response.outputs.resize(kept);
  flight.done(std::move(response));
}

void ServedModel::countFailure(uint64_t nanoseconds) {
  fail_.fetch_add(1, std::memory_order_relaxed);
  fail_ns_.fetch_add(nanoseconds, std::memory_order_relaxed);
}

std::vector<int64_t> ServedModel::configDims(const TensorSpec& tensor) const {
  if (batching_dim_ != 0) return tensor.shape;
  return std::vector<int64_t>(tensor.shape.begin() + 1, tensor.shape.end());
}

ServedModelStatistics ServedModel::statistics() const {
  const RunnerStatistics runner = runner_->statistics();
  ServedModelStatistics s;
  s.last_inference_ms = last_inference_ms_.load(std::memory_order_relaxed);
  s.inference_count = inference_count_.load(std::memory_order_relaxed);
  s.execution_count = runner.batches_run;
  s.success_count = success_.load(std::memory_order_relaxed);
  s.success_ns = success_ns_.load(std::memory_order_relaxed);
  s.fail_count = fail_.load(std::memory_order_relaxed);
  s.fail_ns = fail_ns_.load(std::memory_order_relaxed);
  s.queue_count = runner.timed;
  s.queue_ns = static_cast<uint64_t>(runner.queue_seconds * 1e9);
  s.compute_count = runner.timed;
  s.compute_ns = static_cast<uint64_t>(runner.run_seconds * 1e9);
  for (size_t rows = 1; rows < runner.rows_histogram.size(); ++rows) {
    if (runner.rows_histogram[rows] > 0) s.batches_by_rows.emplace_back(rows, runner.rows_histogram[rows]);
  }
  return s;
}

}  // namespace kiln::server
