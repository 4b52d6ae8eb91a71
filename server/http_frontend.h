// HttpFrontend: the KServe v2 protocol's HTTP/REST binding (cpp-httplib),
// and MetricsFrontend, the Prometheus page on its own port.
//
// One thread per connection served at once (ServerOptions::max_connections
// of them; further connections wait to be served). Inference calls wait on
// their thread for the model's answer; the batching across connections
// happens in the model's ModelRunner.
#pragma once

#include <memory>
#include <thread>

namespace httplib {
class Server;
}

namespace kiln::server {

struct ServerContext;

class HttpFrontend {
 public:
  // Binds context.options.host:http_port (throws kiln::Error when it cannot)
  // and starts serving on a thread of its own.
  explicit HttpFrontend(ServerContext& context);
  ~HttpFrontend();  // stop()
  int port() const { return port_; }
  void stop();

 private:
  void routes();
  ServerContext& context_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = -1;
};

class MetricsFrontend {
 public:
  explicit MetricsFrontend(ServerContext& context);
  ~MetricsFrontend();
  int port() const { return port_; }
  void stop();

 private:
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = -1;
};

}  // namespace kiln::server
