#include "server/server.h"

#include <csignal>
#include <cstdio>
#include <pthread.h>

#include "server/grpc_frontend.h"
#include "server/http_frontend.h"

namespace kiln::server {

bool ServerContext::authorized(std::string_view authorization) const {
  if (options.auth_token.empty()) return true;
  const std::string expected = "Bearer " + options.auth_token;
  if (authorization.size() != expected.size()) return false;
  // Constant time: how much of the token matched must not show in timing.
  unsigned char difference = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference |= static_cast<unsigned char>(authorization[i] ^ expected[i]);
  }
  return difference == 0;
}

Server::Server(ServerOptions options) {
  context_.options = std::move(options);
  const ServerOptions& o = context_.options;
  context_.log = std::make_unique<RequestLog>(o.access_log, o.trace_file);
  context_.repository = std::make_unique<ModelRepository>(o.model_repository);
  const size_t failed = context_.repository->loadAll();
  std::fprintf(stderr, "kiln serve: %zu model version(s) loaded from %s, %zu model(s) failed\n",
               context_.repository->loadedModels().size(), o.model_repository.c_str(), failed);
  if (o.http_port >= 0) http_ = std::make_unique<HttpFrontend>(context_);
  if (o.grpc_port >= 0) grpc_ = std::make_unique<GrpcFrontend>(context_);
  if (o.metrics_port >= 0) metrics_ = std::make_unique<MetricsFrontend>(context_);
  std::fprintf(stderr, "kiln serve: listening on %s: HTTP %d, gRPC %d, metrics %d\n", o.host.c_str(), httpPort(),
               grpcPort(), metricsPort());
}

Server::~Server() { stop(); }

int Server::httpPort() const { return http_ ? http_->port() : -1; }
int Server::grpcPort() const { return grpc_ ? grpc_->port() : -1; }
int Server::metricsPort() const { return metrics_ ? metrics_->port() : -1; }

bool Server::stop() {
  if (stopped_.exchange(true)) return true;
  context_.shutting_down.store(true);
  const bool drained = context_.repository->drainAll(context_.options.drain_timeout);
  std::fprintf(stderr, "kiln serve: %s\n",
               drained ? "every request taken was answered; stopping"
                       : "drain timeout: some requests were still running; stopping");
  if (grpc_) grpc_->stop();
  if (http_) http_->stop();
  if (metrics_) metrics_->stop();
  grpc_.reset();
  http_.reset();
  metrics_.reset();
  context_.repository.reset();
  context_.log.reset();
  return drained;
}

namespace {
sigset_t terminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void Server::blockTerminationSignals() {
  const sigset_t set = terminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int Server::waitForTerminationSignal() {
  const sigset_t set = terminationSignals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

}  // namespace kiln::server
