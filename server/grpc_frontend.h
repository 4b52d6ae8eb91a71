// GrpcFrontend: the KServe v2 protocol's gRPC binding
// (proto/inference.proto), on gRPC's callback API: an inference call holds
// no thread while its request waits in the model's queues; the model's
// runner completes the call.
#pragma once

#include <chrono>
#include <memory>

namespace grpc {
class Server;
}

namespace kiln::server {

struct ServerContext;

class GrpcFrontend {
 public:
  // Listens on context.options.host:grpc_port; throws kiln::Error when it cannot.
  explicit GrpcFrontend(ServerContext& context);
  ~GrpcFrontend();  // stop()
  int port() const { return port_; }
  // Waits for calls in progress (streams included) up to `bound`, then
  // cancels what is left.
  void stop(std::chrono::milliseconds bound = std::chrono::milliseconds(5000));

  class Service;  // the service's calls (grpc_frontend.cc)

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = -1;
};

}  // namespace kiln::server
