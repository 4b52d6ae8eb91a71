// `kiln serve`: the KServe v2 inference server over a model repository
// (server/server.h; docs/serving.md).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kiln/error.h"
#include "server/server.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {
namespace {

std::string readToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read the auth token file " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw UsageError("the auth token file " + path + " is empty");
  return token;
}

}  // namespace

Command addServeCommand(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "Serve a model repository over the KServe v2 protocol (HTTP and gRPC)");
  auto options = std::make_shared<server::ServerOptions>();
  auto repository = std::make_shared<std::string>();
  auto token_file = std::make_shared<std::string>();
  auto max_body_mib = std::make_shared<uint64_t>(options->max_body_bytes >> 20);
  auto drain_seconds = std::make_shared<double>(30.0);
  sub->add_option("--model-repository", *repository, "Folder of models: <model>/<version>/model.kiln, "
                                                     "<model>/config.json (optional)")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("--host", options->host, "Address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: all)");
  sub->add_option("--http-port", options->http_port, "HTTP/REST port (0: any free port, -1: off)")->capture_default_str();
  sub->add_option("--grpc-port", options->grpc_port, "gRPC port (0: any free port, -1: off)")->capture_default_str();
  sub->add_option("--metrics-port", options->metrics_port, "Prometheus /metrics port (0: any free port, -1: off)")
      ->capture_default_str();
  sub->add_option("--auth-token-file", *token_file,
                  "File holding a bearer token that every call except health must carry (Authorization: Bearer ...)");
  sub->add_option("--max-body-mib", *max_body_mib, "Largest request body or gRPC message, MiB")->capture_default_str();
  sub->add_option("--max-tensor-elements", options->max_tensor_elements, "Largest input tensor, in elements")
      ->capture_default_str();
  sub->add_option("--max-connections", options->max_connections,
                  "HTTP connections served at once (one thread each); more wait")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_option("--drain-timeout", *drain_seconds,
                  "Seconds SIGTERM waits for requests already taken before the server stops")
      ->capture_default_str();
  sub->add_option("--access-log", options->access_log, "JSON-lines access log: a file, or - for stderr");
  sub->add_option("--trace-file", options->trace_file,
                  "Write every inference request as a Chrome trace event to this file (chrome://tracing, Perfetto)");
  return [=]() {
    server::ServerOptions o = *options;
    o.model_repository = *repository;
    o.max_body_bytes = *max_body_mib << 20;
    o.drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(*drain_seconds * 1000));
    if (!token_file->empty()) o.auth_token = readToken(*token_file);
    // Before any thread starts, so that every thread inherits the mask.
    server::Server::blockTerminationSignals();
    server::Server server(o);
    const int signal = server::Server::waitForTerminationSignal();
    std::fprintf(stderr, "kiln serve: signal %d: draining\n", signal);
    return server.stop() ? 0 : 1;
  };
}

}  // namespace kiln::cli
