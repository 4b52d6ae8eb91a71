// Server: `kiln serve`. A model repository served over the KServe v2
// (Open Inference Protocol) on HTTP and gRPC, with Prometheus metrics on a
// third port. docs/serving.md is the user's guide.
//
// Layers: the transports (http_frontend, grpc_frontend) turn calls into
// protocol-neutral requests (infer_request.h) for a ServedModel, which runs
// them on its ModelRunner; the repository owns the ServedModels.
//
// Shutdown (SIGTERM, SIGINT or stop()): readiness turns false at once, new
// inference requests are refused with 503/UNAVAILABLE, requests already
// taken are answered (up to drain_timeout), then the listeners close.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "server/http_codec.h"
#include "server/metrics.h"
#include "server/model_repository.h"
#include "server/request_log.h"

namespace kiln::server {

struct ServerOptions {
  std::filesystem::path model_repository;
  std::string host = "127.0.0.1";      // listen address of every port
  int http_port = 8000;                // 0: a free port; -1: no HTTP
  int grpc_port = 8001;                // 0: a free port; -1: no gRPC
  int metrics_port = 8002;             // 0: a free port; -1: no metrics
  std::string auth_token;              // non-empty: every call but health needs "Bearer <token>"
  uint64_t max_body_bytes = uint64_t{256} << 20;      // HTTP bodies and gRPC messages
  uint64_t max_tensor_elements = uint64_t{1} << 28;   // per input tensor
  int max_connections = 128;           // HTTP connections served at once (more wait)
  std::chrono::milliseconds drain_timeout{30000};
  std::string access_log;              // "": none; "-": stderr; else a file
  std::string trace_file;              // Chrome trace of every inference request
};

// What the transports share.
struct ServerContext {
  ServerOptions options;
  std::unique_ptr<ModelRepository> repository;
  Metrics metrics;
  std::unique_ptr<RequestLog> log;
  std::atomic<bool> shutting_down{false};

  HttpLimits httpLimits() const { return {options.max_tensor_elements}; }
  // True when `authorization` (the header's value, or gRPC's metadata)
  // carries the token, or no token is set.
  bool authorized(std::string_view authorization) const;
};

class HttpFrontend;
class GrpcFrontend;
class MetricsFrontend;

class Server {
 public:
  // Loads every model of the repository (one that fails is logged and
  // left UNAVAILABLE) and starts listening; throws kiln::Error when a port
  // cannot be bound or the repository is not a folder.
  explicit Server(ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The ports listened on (useful with port 0); -1 when off.
  int httpPort() const;
  int grpcPort() const;
  int metricsPort() const;

  // The graceful shutdown described above; returns once listeners closed.
  // Returns whether every request taken was answered within drain_timeout.
  bool stop();

  // SIGTERM and SIGINT: block them in this thread and every thread started
  // after (call first thing in main), so that waitForTerminationSignal()
  // receives them instead of the default handler killing the process.
  static void blockTerminationSignals();
  // Blocks until SIGTERM or SIGINT arrives; returns the signal.
  static int waitForTerminationSignal();

 private:
  ServerContext context_;
  std::unique_ptr<HttpFrontend> http_;
  std::unique_ptr<GrpcFrontend> grpc_;
  std::unique_ptr<MetricsFrontend> metrics_;
  std::atomic<bool> stopped_{false};
};

}  // namespace kiln::server
