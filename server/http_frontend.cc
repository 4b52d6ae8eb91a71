#include "server/http_frontend.h"

#include <charconv>
#include <future>
#include <fmt/format.h>
#include <httplib.h>

#include "kiln/error.h"
#include "server/protocol_json.h"
#include "server/server.h"

namespace kiln::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The record of the call this thread serves: started by the pre-routing
// handler, filled by the inference handler, written by the logger (all on
// the connection's thread).
thread_local RequestRecord current_record;
thread_local Clock::time_point current_start;

void sendJson(httplib::Response& res, const json& document, int status = 200) {
  res.status = status;
  res.set_content(document.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void sendError(httplib::Response& res, const ServerError& error) {
  res.status = httpStatus(error.code());
  res.set_content(errorBody(error.what()), "application/json");
}

// The model (group 1) and optional version (group 2) of a matched path.
std::string version(const httplib::Request& req) { return req.matches.size() > 2 ? req.matches[2].str() : ""; }

int bindPort(httplib::Server& http, const std::string& host, int port, const char* what) {
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets
  // a second server bind the same port and silently take half the traffic.
  // The callback sees the listening socket; it is kept to deepen its
  // backlog below.
  auto listening = std::make_shared<socket_t>(INVALID_SOCKET);
  http.set_socket_options([listening](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    *listening = sock;
  });
  const int bound = port == 0 ? http.bind_to_any_port(host.c_str()) : (http.bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) {
    throw UsageError(fmt::format("cannot listen for {} on {}:{} (in use, or not an address of this machine)", what,
                                 host, port));
  }
  // httplib listens with a backlog of 5: a burst of new connections (a load
  // generator starting 64 clients) overflows it, and the kernel drops their
  // handshakes, which clients see as connections that fail. Listening again
  // on the bound socket deepens the queue.
  if (*listening != INVALID_SOCKET) ::listen(*listening, SOMAXCONN);
  return bound;
}

std::optional<size_t> headerLength(const httplib::Request& req) {
  if (!req.has_header("Inference-Header-Content-Length")) return std::nullopt;
  const std::string text = req.get_header_value("Inference-Header-Content-Length");
  size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw ServerError(StatusCode::kInvalidArgument,
                      fmt::format("Inference-Header-Content-Length '{}' is not a byte count", text));
  }
  return value;
}

}  // namespace

HttpFrontend::HttpFrontend(ServerContext& context) : context_(context), http_(std::make_unique<httplib::Server>()) {
  const ServerOptions& options = context_.options;
  const size_t threads = static_cast<size_t>(std::max(1, options.max_connections));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options.max_body_bytes);
  http_->set_keep_alive_max_count(1u << 30);
  // An idle keep-alive connection holds its thread this long, and stop()
  // waits for it: short, but long enough that a client's pause does not
  // race the close against its next request (clients do not retry POSTs).
  http_->set_keep_alive_timeout(5);
  http_->set_tcp_nodelay(true);
  routes();
  port_ = bindPort(*http_, options.host, options.http_port, "HTTP");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

HttpFrontend::~HttpFrontend() { stop(); }

void HttpFrontend::stop() {
  if (thread_.joinable()) {
    http_->stop();
    thread_.join();
  }
}

void HttpFrontend::routes() {
  httplib::Server& http = *http_;
  ServerContext& ctx = context_;

  http.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    current_start = Clock::now();
    current_record = RequestRecord{};
    current_record.start = std::chrono::system_clock::now();
    const bool health = req.path.rfind("/v2/health/", 0) == 0;
    if (!health && !ctx.authorized(req.get_header_value("Authorization"))) {
      res.set_header("WWW-Authenticate", "Bearer");
      sendError(res, ServerError(StatusCode::kUnauthenticated, "missing or wrong bearer token"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    RequestRecord& r = current_record;
    r.protocol = "http";
    r.method = req.method;
    r.path = req.path;
    r.remote = req.remote_addr;
    r.status = res.status;
    r.duration = Clock::now() - current_start;
    r.bytes_in = req.body.size();
    r.bytes_out = res.body.size();
    ctx.log->record(r);
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) {
      res.set_content(errorBody(res.status == 404 ? fmt::format("{} {}: no such endpoint", req.method, req.path)
                                                  : fmt::format("{} {}: HTTP status {}", req.method, req.path, res.status)),
                      "application/json");
    }
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const ServerError& e) {
      sendError(res, e);
    } catch (const std::bad_alloc&) {
      sendError(res, ServerError(StatusCode::kPayloadTooLarge, "the request needs more memory than the server has"));
    } catch (const std::exception& e) {
      sendError(res, ServerError(StatusCode::kInternal, e.what()));
    }
  });

  // Health.
  http.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  http.Get("/v2/health/ready", [&ctx](const httplib::Request&, httplib::Response& res) {
    bool ready = !ctx.shutting_down.load();
    for (const auto& entry : ctx.repository->index(false)) ready = ready && entry.state == "READY";
    res.status = ready ? 200 : 503;
  });
  http.Get(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/ready)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    try {
      const auto model = ctx.repository->find(req.matches[1], version(req));
      res.status = model->isReady() && !ctx.shutting_down.load() ? 200 : 503;
    } catch (const ServerError& e) {
      sendError(res, e);
    }
  });

  // Statistics.
  http.Get("/v2/models/stats", [&ctx](const httplib::Request&, httplib::Response& res) {
    sendJson(res, modelStatisticsJson(ctx.repository->loadedModels()));
  });
  http.Get(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/stats)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    std::vector<std::shared_ptr<ServedModel>> models;
    if (version(req).empty()) {
      for (const auto& model : ctx.repository->loadedModels()) {
        if (model->name() == req.matches[1]) models.push_back(model);
      }
      if (models.empty()) throw ServerError(StatusCode::kNotFound, fmt::format("model '{}' is not loaded", req.matches[1].str()));
    } else {
      models.push_back(ctx.repository->find(req.matches[1], version(req)));
    }
    sendJson(res, modelStatisticsJson(models));
  });

  // Metadata and configuration.
  http.Get("/v2", [](const httplib::Request&, httplib::Response& res) { sendJson(res, serverMetadataJson()); });
  http.Get(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const auto model = ctx.repository->find(req.matches[1], version(req));
    sendJson(res, modelMetadataJson(*model, loadedVersions(*ctx.repository, model->name())));
  });
  http.Get(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/config)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    sendJson(res, modelConfigJson(*ctx.repository->find(req.matches[1], version(req))));
  });

  // Model repository.
  http.Post("/v2/repository/index", [&ctx](const httplib::Request& req, httplib::Response& res) {
    bool ready_only = false;
    if (!req.body.empty()) {
      const json body = json::parse(req.body, nullptr, false);
      if (!body.is_object()) throw ServerError(StatusCode::kInvalidArgument, "the index request must be a JSON object");
      if (body.contains("ready")) {
        if (!body["ready"].is_boolean()) throw ServerError(StatusCode::kInvalidArgument, "\"ready\" must be true or false");
        ready_only = body["ready"].get<bool>();
      }
    }
    sendJson(res, repositoryIndexJson(ctx.repository->index(ready_only)));
  });
  http.Post(R"(/v2/repository/models/([^/]+)/(load|unload))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!req.body.empty()) {
      const json body = json::parse(req.body, nullptr, false);
      if (!body.is_object()) throw ServerError(StatusCode::kInvalidArgument, "the request must be a JSON object");
      if (req.matches[2] == "load" && body.contains("parameters") && !body["parameters"].empty()) {
        throw ServerError(StatusCode::kInvalidArgument,
                          "load parameters (a configuration or files sent with the request) are not supported: "
                          "put them in the repository");
      }
    }
    if (ctx.shutting_down.load()) throw ServerError(StatusCode::kUnavailable, "the server is shutting down");
    if (req.matches[2] == "load") {
      ctx.repository->load(req.matches[1]);
    } else {
      ctx.repository->unload(req.matches[1]);
    }
    res.status = 200;
  });

  // Inference.
  http.Post(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/infer)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    RequestRecord& record = current_record;
    record.model = req.matches[1];
    record.version = version(req);
    std::string outcome = "SUCCESS";
    try {
      if (ctx.shutting_down.load()) throw ServerError(StatusCode::kUnavailable, "the server is shutting down");
      const auto model = ctx.repository->find(req.matches[1], version(req));
      record.version = model->version();
      InferRequest request =
          parseInferRequest(req.body, headerLength(req), model->name(), model->version(), ctx.httpLimits());
      record.id = request.id;
      // Shared with the callback: the promise must outlive its set_value.
      auto promise = std::make_shared<std::promise<InferResult>>();
      std::future<InferResult> answer = promise->get_future();
      model->infer(std::move(request), [promise](InferResult&& result) { promise->set_value(std::move(result)); });
      InferResult result = answer.get();
      if (auto* error = std::get_if<ServerError>(&result)) throw *error;
      EncodedResponse encoded = encodeInferResponse(std::get<InferResponse>(result));
      if (encoded.header_length) {
        res.set_header("Inference-Header-Content-Length", std::to_string(*encoded.header_length));
      }
      res.set_header("Content-Type", encoded.header_length ? "application/octet-stream" : "application/json");
      res.body = std::move(encoded.body);  // no copy (set_content copies)
      res.status = 200;
    } catch (const ServerError& e) {
      outcome = statusName(e.code());
      sendError(res, e);
    }
    record.outcome = outcome;
    ctx.metrics.observeRequest(record.model, record.version, "http", outcome,
                               std::chrono::duration<double>(Clock::now() - current_start).count());
  });
}

MetricsFrontend::MetricsFrontend(ServerContext& context) : http_(std::make_unique<httplib::Server>()) {
  http_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  http_->Get("/metrics", [&context](const httplib::Request&, httplib::Response& res) {
    res.set_content(context.metrics.render(*context.repository), "text/plain; version=0.0.4");
  });
  port_ = bindPort(*http_, context.options.host, context.options.metrics_port, "metrics");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

MetricsFrontend::~MetricsFrontend() { stop(); }

void MetricsFrontend::stop() {
  if (thread_.joinable()) {
    http_->stop();
    thread_.join();
  }
}

}  // namespace kiln::server
