#include "server/grpc_frontend.h"

#include <deque>
#include <limits>
#include <mutex>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "kiln/error.h"
#include "kiln/version.h"
#include "server/datatype.h"
#include "server/inference.grpc.pb.h"
#include "server/protocol_json.h"
#include "server/server.h"

namespace kiln::server {
namespace {

using Clock = std::chrono::steady_clock;
namespace pb = ::inference;

grpc::Status toStatus(const ServerError& error) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (error.code()) {
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case StatusCode::kPayloadTooLarge: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kInternal: code = grpc::StatusCode::INTERNAL; break;
  }
  return {code, error.what()};
}

ServerError invalid(const std::string& message) { return ServerError(StatusCode::kInvalidArgument, message); }

template <typename To, typename From>
std::vector<char> narrow(const google::protobuf::RepeatedField<From>& values, const std::string& input) {
  std::vector<char> bytes(static_cast<size_t>(values.size()) * sizeof(To));
  for (int i = 0; i < values.size(); ++i) {
    const From v = values.Get(i);
    if constexpr (!std::is_same_v<To, From> && !std::is_floating_point_v<To>) {
      if (v < static_cast<From>(std::numeric_limits<To>::min()) || v > static_cast<From>(std::numeric_limits<To>::max())) {
        throw invalid(fmt::format("input '{}': element {} is out of range for its datatype", input, i));
      }
    }
    const To x = static_cast<To>(v);
    std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(To), &x, sizeof(To));
  }
  return bytes;
}

// An input's typed contents as raw bytes of its datatype.
std::vector<char> typedContents(const pb::InferTensorContents& c, DType dtype, const std::string& input) {
  switch (dtype) {
    case DType::kBool: {
      std::vector<char> bytes(static_cast<size_t>(c.bool_contents_size()));
      for (int i = 0; i < c.bool_contents_size(); ++i) bytes[static_cast<size_t>(i)] = c.bool_contents(i) ? 1 : 0;
      return bytes;
    }
    case DType::kI8: return narrow<int8_t>(c.int_contents(), input);
    case DType::kI16: return narrow<int16_t>(c.int_contents(), input);
    case DType::kI32: return narrow<int32_t>(c.int_contents(), input);
    case DType::kI64: return narrow<int64_t>(c.int64_contents(), input);
    case DType::kU8: return narrow<uint8_t>(c.uint_contents(), input);
    case DType::kU16: return narrow<uint16_t>(c.uint_contents(), input);
    case DType::kU32: return narrow<uint32_t>(c.uint_contents(), input);
    case DType::kU64: return narrow<uint64_t>(c.uint64_contents(), input);
    case DType::kF32: return narrow<float>(c.fp32_contents(), input);
    case DType::kF64: return narrow<double>(c.fp64_contents(), input);
    default: throw invalid(fmt::format("input '{}': FP16 and BF16 data must come in raw_input_contents", input));
  }
}

// The protocol-neutral request of a ModelInferRequest; its inputs point
// into `message`, which must outlive it.
InferRequest fromMessage(const pb::ModelInferRequest& message, const ServedModel& model,
                         std::optional<Clock::time_point> deadline) {
  InferRequest request;
  request.model_name = model.name();
  request.model_version = model.version();
  request.id = message.id();
  request.deadline = deadline;
  if (auto it = message.parameters().find("timeout"); it != message.parameters().end()) {
    if (!it->second.has_int64_param() || it->second.int64_param() < 0) {
      throw invalid("parameter \"timeout\" must be an int64 number of microseconds >= 0");
    }
    const auto bound = Clock::now() + std::chrono::microseconds(it->second.int64_param());
    request.deadline = deadline ? std::min(*deadline, bound) : bound;
  }
  const bool raw = message.raw_input_contents_size() > 0;
  if (raw && message.raw_input_contents_size() != message.inputs_size()) {
    throw invalid(fmt::format("the request has {} inputs but {} raw_input_contents: give one per input or none",
                              message.inputs_size(), message.raw_input_contents_size()));
  }
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& tensor = message.inputs(i);
    InferInput input;
    input.name = tensor.name();
    input.datatype = tensor.datatype();
    input.shape.assign(tensor.shape().begin(), tensor.shape().end());
    if (raw) {
      if (tensor.has_contents()) throw invalid(fmt::format("input '{}' has both contents and raw_input_contents", input.name));
      input.data = message.raw_input_contents(i);
    } else {
      const std::optional<DType> dtype = dtypeFromProtocol(input.datatype);
      if (!dtype) throw invalid(fmt::format("input '{}': datatype '{}' is not one kiln serves", input.name, input.datatype));
      request.storage.push_back(typedContents(tensor.contents(), *dtype, input.name));
      input.data = std::string_view(request.storage.back().data(), request.storage.back().size());
    }
    request.inputs.push_back(std::move(input));
  }
  for (const auto& output : message.outputs()) request.outputs.push_back({output.name(), false});
  return request;
}

void toMessage(InferResponse&& response, pb::ModelInferResponse& message) {
  message.set_model_name(response.model_name);
  message.set_model_version(response.model_version);
  message.set_id(response.id);
  for (InferOutput& output : response.outputs) {
    auto* tensor = message.add_outputs();
    tensor->set_name(output.name);
    tensor->set_datatype(output.datatype);
    for (int64_t d : output.shape) tensor->add_shape(d);
    message.add_raw_output_contents(std::move(output.data));
  }
}

void fillTensors(const std::vector<TensorSpec>& tensors,
                 google::protobuf::RepeatedPtrField<pb::ModelMetadataResponse::TensorMetadata>* out) {
  for (const TensorSpec& t : tensors) {
    auto* item = out->Add();
    item->set_name(t.name);
    item->set_datatype(t.datatype);
    for (int64_t d : t.shape) item->add_shape(d);
  }
}

void fillDuration(pb::StatisticDuration* d, uint64_t count, uint64_t ns) {
  d->set_count(count);
  d->set_ns(ns);
}

std::optional<Clock::time_point> deadlineOf(const grpc::CallbackServerContext* call) {
  const auto deadline = call->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) return std::nullopt;
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

}  // namespace

class GrpcFrontend::Service final : public pb::GRPCInferenceService::CallbackService {
 public:
  explicit Service(ServerContext& context) : ctx_(context) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* call, const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* response) override {
    response->set_live(true);
    return finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* call, const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* response) override {
    bool ready = !ctx_.shutting_down.load();
    for (const auto& entry : ctx_.repository->index(false)) ready = ready && entry.state == "READY";
    response->set_ready(ready);
    return finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* call, const pb::ModelReadyRequest* request,
                                       pb::ModelReadyResponse* response) override {
    return run(call, [&] {
      // An unknown model or version is not ready (not an error), as over HTTP.
      try {
        const auto model = ctx_.repository->find(request->name(), request->version());
        response->set_ready(model->isReady() && !ctx_.shutting_down.load());
      } catch (const ServerError&) {
        response->set_ready(false);
      }
    });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* call, const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* response) override {
    return run(call, [&] {
      response->set_name("kiln");
      response->set_version(std::string(kKilnVersion));
      for (const std::string& extension : serverExtensions()) response->add_extensions(extension);
    });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* call, const pb::ModelMetadataRequest* request,
                                          pb::ModelMetadataResponse* response) override {
    return run(call, [&] {
      const auto model = ctx_.repository->find(request->name(), request->version());
      response->set_name(model->name());
      for (const std::string& v : loadedVersions(*ctx_.repository, model->name())) response->add_versions(v);
      response->set_platform("kiln");
      fillTensors(model->inputs(), response->mutable_inputs());
      fillTensors(model->outputs(), response->mutable_outputs());
    });
  }

  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* call, const pb::ModelConfigRequest* request,
                                        pb::ModelConfigResponse* response) override {
    return run(call, [&] {
      const auto model = ctx_.repository->find(request->name(), request->version());
      pb::ModelConfig& config = *response->mutable_config();
      config.set_name(model->name());
      config.set_platform("kiln");
      config.set_backend("kiln");
      config.set_max_batch_size(static_cast<int32_t>(model->configMaxBatchSize()));
      for (const TensorSpec& t : model->inputs()) {
        auto* input = config.add_input();
        input->set_name(t.name);
        input->set_data_type(static_cast<pb::DataType>(configDatatypeNumber(t.dtype)));
        for (int64_t d : model->configDims(t)) input->add_dims(d);
      }
      for (const TensorSpec& t : model->outputs()) {
        auto* output = config.add_output();
        output->set_name(t.name);
        output->set_data_type(static_cast<pb::DataType>(configDatatypeNumber(t.dtype)));
        for (int64_t d : model->configDims(t)) output->add_dims(d);
      }
      auto* group = config.add_instance_group();
      group->set_name(model->name());
      group->set_count(static_cast<int32_t>(model->config().instances));
      group->set_kind(model->config().device_kind == DeviceKind::kCuda ? pb::ModelInstanceGroup::KIND_GPU
                                                                        : pb::ModelInstanceGroup::KIND_CPU);
      if (model->batching()) {
        config.mutable_dynamic_batching()->set_max_queue_delay_microseconds(
            static_cast<uint64_t>(model->config().max_queue_delay.count()));
      }
    });
  }

  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* call, const pb::ModelStatisticsRequest* request,
                                            pb::ModelStatisticsResponse* response) override {
    return run(call, [&] {
      std::vector<std::shared_ptr<ServedModel>> models;
      if (!request->version().empty()) {
        models.push_back(ctx_.repository->find(request->name(), request->version()));
      } else {
        for (const auto& model : ctx_.repository->loadedModels()) {
          if (request->name().empty() || model->name() == request->name()) models.push_back(model);
        }
        if (!request->name().empty() && models.empty()) {
          throw ServerError(StatusCode::kNotFound, fmt::format("model '{}' is not loaded", request->name()));
        }
      }
      for (const auto& model : models) {
        const ServedModelStatistics s = model->statistics();
        auto* item = response->add_model_stats();
        item->set_name(model->name());
        item->set_version(model->version());
        item->set_last_inference(s.last_inference_ms);
        item->set_inference_count(s.inference_count);
        item->set_execution_count(s.execution_count);
        auto* stats = item->mutable_inference_stats();
        fillDuration(stats->mutable_success(), s.success_count, s.success_ns);
        fillDuration(stats->mutable_fail(), s.fail_count, s.fail_ns);
        fillDuration(stats->mutable_queue(), s.queue_count, s.queue_ns);
        fillDuration(stats->mutable_compute_input(), s.compute_count, 0);
        fillDuration(stats->mutable_compute_infer(), s.compute_count, s.compute_ns);
        fillDuration(stats->mutable_compute_output(), s.compute_count, 0);
        fillDuration(stats->mutable_cache_hit(), 0, 0);
        fillDuration(stats->mutable_cache_miss(), 0, 0);
        for (const auto& [rows, count] : s.batches_by_rows) {
          auto* batch = item->add_batch_stats();
          batch->set_batch_size(rows);
          fillDuration(batch->mutable_compute_input(), 0, 0);
          fillDuration(batch->mutable_compute_infer(), count, 0);
          fillDuration(batch->mutable_compute_output(), 0, 0);
        }
      }
    });
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* call, const pb::RepositoryIndexRequest* request,
                                            pb::RepositoryIndexResponse* response) override {
    return run(call, [&] {
      for (const ModelIndexEntry& entry : ctx_.repository->index(request->ready())) {
        auto* item = response->add_models();
        item->set_name(entry.name);
        item->set_version(entry.version);
        item->set_state(entry.state);
        item->set_reason(entry.reason);
      }
    });
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* call,
                                                const pb::RepositoryModelLoadRequest* request,
                                                pb::RepositoryModelLoadResponse*) override {
    return run(call, [&] {
      if (!request->parameters().empty()) {
        throw invalid("load parameters (a configuration or files sent with the request) are not supported: put "
                      "them in the repository");
      }
      if (ctx_.shutting_down.load()) throw ServerError(StatusCode::kUnavailable, "the server is shutting down");
      ctx_.repository->load(request->model_name());
    });
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* call,
                                                  const pb::RepositoryModelUnloadRequest* request,
                                                  pb::RepositoryModelUnloadResponse*) override {
    return run(call, [&] {
      if (ctx_.shutting_down.load()) throw ServerError(StatusCode::kUnavailable, "the server is shutting down");
      ctx_.repository->unload(request->model_name());
    });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* call, const pb::ModelInferRequest* request,
                                       pb::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    const Clock::time_point start = Clock::now();
    auto record = std::make_shared<RequestRecord>(recordOf(call, "ModelInfer"));
    record->model = request->model_name();
    record->version = request->model_version();
    record->id = request->id();
    record->bytes_in = request->ByteSizeLong();
    auto answer = [this, reactor, response, record, start](InferResult&& result) {
      grpc::Status status = grpc::Status::OK;
      if (auto* error = std::get_if<ServerError>(&result)) {
        status = toStatus(*error);
        record->outcome = statusName(error->code());
        record->status = httpStatus(error->code());
      } else {
        toMessage(std::move(std::get<InferResponse>(result)), *response);
        record->outcome = "SUCCESS";
        record->status = 200;
        record->bytes_out = response->ByteSizeLong();
      }
      observe(*record, start);
      reactor->Finish(status);
    };
    submit(call, *request, answer, *record);
    return reactor;
  }

  grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* ModelStreamInfer(
      grpc::CallbackServerContext* call) override;

  // Checks the bearer token; answers and returns false when it is wrong.
  bool authorized(grpc::CallbackServerContext* call) const {
    const auto& metadata = call->client_metadata();
    auto it = metadata.find("authorization");
    const std::string_view value = it == metadata.end() ? std::string_view{} : std::string_view(it->second.data(), it->second.size());
    return ctx_.authorized(value);
  }

  // Hands one request to its model; `answer` gets the result exactly once.
  void submit(grpc::CallbackServerContext* call, const pb::ModelInferRequest& request, const InferDone& answer,
              RequestRecord& record) {
    try {
      if (!authorized(call)) throw ServerError(StatusCode::kUnauthenticated, "missing or wrong bearer token");
      if (ctx_.shutting_down.load()) throw ServerError(StatusCode::kUnavailable, "the server is shutting down");
      const auto model = ctx_.repository->find(request.model_name(), request.model_version());
      record.version = model->version();
      model->infer(fromMessage(request, *model, deadlineOf(call)), answer);
    } catch (const ServerError& error) {
      answer(error);
    }
  }

  RequestRecord recordOf(grpc::CallbackServerContext* call, const char* method) const {
    RequestRecord record;
    record.protocol = "grpc";
    record.method = method;
    record.path = std::string("/inference.GRPCInferenceService/") + method;
    record.remote = call->peer();
    record.start = std::chrono::system_clock::now();
    return record;
  }

  void observe(RequestRecord& record, Clock::time_point start) {
    record.duration = Clock::now() - start;
    ctx_.metrics.observeRequest(record.model, record.version, "grpc", record.outcome,
                                std::chrono::duration<double>(record.duration).count());
    ctx_.log->record(record);
  }

 private:
  grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* call, const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  // Runs a non-inference call: checks the token, turns a ServerError into
  // its status.
  template <typename Body>
  grpc::ServerUnaryReactor* run(grpc::CallbackServerContext* call, Body body) {
    grpc::Status status = grpc::Status::OK;
    try {
      if (!authorized(call)) throw ServerError(StatusCode::kUnauthenticated, "missing or wrong bearer token");
      body();
    } catch (const ServerError& error) {
      status = toStatus(error);
    } catch (const std::exception& error) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, error.what());
    }
    return finish(call, status);
  }

  ServerContext& ctx_;
};

namespace {

// One ModelStreamInfer call: requests are read one after another and run
// concurrently; each answer is written when it is ready (so possibly out of
// order, each carrying its request's id). The call ends once the client
// has closed its side and every answer is written.
class StreamReactor final : public grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse> {
 public:
  StreamReactor(GrpcFrontend::Service& service, grpc::CallbackServerContext* call) : service_(service), call_(call) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        std::lock_guard lock(mutex_);
        reads_done_ = true;
        finish = readyToFinish();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    auto request = std::make_shared<pb::ModelInferRequest>();
    request->Swap(&incoming_);
    {
      std::lock_guard lock(mutex_);
      ++pending_;
    }
    const Clock::time_point start = Clock::now();
    auto record = std::make_shared<RequestRecord>(service_.recordOf(call_, "ModelStreamInfer"));
    record->model = request->model_name();
    record->version = request->model_version();
    record->id = request->id();
    record->bytes_in = request->ByteSizeLong();
    // The request message must live until its answer: the inputs point into it.
    auto answer = [this, request, record, start](InferResult&& result) {
      auto message = std::make_unique<pb::ModelStreamInferResponse>();
      if (auto* error = std::get_if<ServerError>(&result)) {
        message->set_error_message(error->what());
        message->mutable_infer_response()->set_id(request->id());
        message->mutable_infer_response()->set_model_name(request->model_name());
        record->outcome = statusName(error->code());
        record->status = httpStatus(error->code());
      } else {
        toMessage(std::move(std::get<InferResponse>(result)), *message->mutable_infer_response());
        record->outcome = "SUCCESS";
        record->status = 200;
      }
      service_.observe(*record, start);
      write(std::move(message));
    };
    service_.submit(call_, *request, answer, *record);
    StartRead(&incoming_);
  }

  // gRPC's operations (StartWrite, Finish) are started outside mutex_: a
  // reaction may run inline and take it.
  void OnWriteDone(bool ok) override {
    const pb::ModelStreamInferResponse* next = nullptr;
    bool finish = false;
    {
      std::lock_guard lock(mutex_);
      writes_.pop_front();
      if (!ok) {
        broken_ = true;  // the client went away: drop what is left
        writes_.clear();
      }
      if (!writes_.empty()) {
        next = writes_.front().get();
      } else {
        writing_ = false;
        finish = readyToFinish();
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void write(std::unique_ptr<pb::ModelStreamInferResponse> message) {
    const pb::ModelStreamInferResponse* next = nullptr;
    bool finish = false;
    {
      std::lock_guard lock(mutex_);
      --pending_;
      if (!broken_) {
        writes_.push_back(std::move(message));
        if (!writing_) {
          writing_ = true;
          next = writes_.front().get();
        }
      }
      finish = readyToFinish();
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  // With mutex_ held: true once, when the call may end.
  bool readyToFinish() {
    if (reads_done_ && pending_ == 0 && !writing_ && !finished_) {
      finished_ = true;
      return true;
    }
    return false;
  }

  GrpcFrontend::Service& service_;
  grpc::CallbackServerContext* call_;
  pb::ModelInferRequest incoming_;
  std::mutex mutex_;
  std::deque<std::unique_ptr<pb::ModelStreamInferResponse>> writes_;
  size_t pending_ = 0;  // requests taken, not yet answered
  bool reads_done_ = false;
  bool writing_ = false;
  bool broken_ = false;
  bool finished_ = false;
};

}  // namespace

grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* GrpcFrontend::Service::ModelStreamInfer(
    grpc::CallbackServerContext* call) {
  return new StreamReactor(*this, call);
}

GrpcFrontend::GrpcFrontend(ServerContext& context) : service_(std::make_unique<Service>(context)) {
  const ServerOptions& options = context.options;
  grpc::ServerBuilder builder;
  const std::string address = fmt::format("{}:{}", options.host, options.grpc_port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<uint64_t>(options.max_body_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(INT32_MAX);
  // No SO_REUSEPORT: a second server must fail to bind, not share the port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ <= 0) {
    throw UsageError(fmt::format("cannot listen for gRPC on {} (in use, or not an address of this machine)", address));
  }
}

GrpcFrontend::~GrpcFrontend() { stop(); }

void GrpcFrontend::stop(std::chrono::milliseconds bound) {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + bound);
    server_->Wait();
    server_.reset();
  }
}

}  // namespace kiln::server
