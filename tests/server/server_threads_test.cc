// kiln serve's threads, exercised in-process so that ThreadSanitizer sees
// them (`make test-tsan`; the Python tests drive the server as a separate
// process, where no sanitizer looks): HTTP and gRPC clients on their own
// threads, each with its own connection, infer while another thread loads
// new versions, unloads and reloads the model, a third scrapes metrics and
// statistics, and the server is stopped with requests in flight.
//
// Every answer must be right or a clean refusal: 200 with the affine
// model's rows, or 503/UNAVAILABLE and 404/NOT_FOUND while the model is
// unloaded or the server stops.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "server/inference.grpc.pb.h"
#include "server/server.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln::server {
namespace {

using kiln::testing::kBatch;
using kiln::testing::kFeatures;
using kiln::testing::matchesAffine;
using kiln::testing::rows;

// A repository folder with the affine model as version 1, removed at the end.
class TempRepository {
 public:
  TempRepository() {
    root_ = std::filesystem::temp_directory_path() / ("kiln_server_threads_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    addVersion("1");
  }
  ~TempRepository() { std::filesystem::remove_all(root_); }
  const std::filesystem::path& root() const { return root_; }

  void addVersion(const std::string& version) {
    const std::filesystem::path model = root_ / "affine";
    std::filesystem::create_directories(model / version);
    kiln::testing::writeAffineModel(model / version / "model.kiln", kBatch, kFeatures);
    // Requests of any number of rows; a short queue delay so that
    // concurrent ones meet in device batches.
    std::ofstream(model / "config.json") << R"({"batching_dim": 0, "max_queue_delay_microseconds": 500})";
  }

 private:
  std::filesystem::path root_;
};

// What the clients saw, counted from every client thread.
struct Tally {
  std::atomic<int> answered{0};  // 200 with the right rows
  std::atomic<int> refused{0};   // 503 or 404: unloaded, stopping
  std::atomic<int> wrong{0};     // anything else: a wrong answer, a bad status, no answer
};

// One HTTP client: a JSON request of `count` rows, checked.
void inferOverHttp(httplib::Client& client, size_t count, float start, Tally& tally) {
  const std::vector<float> x = rows(count, start);
  const nlohmann::json body = {
      {"inputs", {{{"name", "x"}, {"shape", {count, kFeatures}}, {"datatype", "FP32"}, {"data", x}}}}};
  const auto result = client.Post("/v2/models/affine/infer", body.dump(), "application/json");
  if (!result) {
    ++tally.wrong;
    return;
  }
  if (result->status == 503 || result->status == 404) {
    ++tally.refused;
    return;
  }
  if (result->status != 200) {
    ++tally.wrong;
    return;
  }
  const nlohmann::json answer = nlohmann::json::parse(result->body);
  const std::vector<float> y = answer["outputs"][0]["data"].get<std::vector<float>>();
  matchesAffine(y, x) ? ++tally.answered : ++tally.wrong;
}

// One gRPC client: raw input contents, checked.
void inferOverGrpc(inference::GRPCInferenceService::Stub& stub, size_t count, float start, Tally& tally) {
  const std::vector<float> x = rows(count, start);
  inference::ModelInferRequest request;
  request.set_model_name("affine");
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  input->add_shape(static_cast<int64_t>(count));
  input->add_shape(kFeatures);
  request.add_raw_input_contents(x.data(), x.size() * sizeof(float));
  inference::ModelInferResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub.ModelInfer(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE || status.error_code() == grpc::StatusCode::NOT_FOUND) {
    ++tally.refused;
    return;
  }
  if (!status.ok() || response.raw_output_contents_size() != 1) {
    ++tally.wrong;
    return;
  }
  const std::string& bytes = response.raw_output_contents(0);
  std::vector<float> y(bytes.size() / sizeof(float));
  std::memcpy(y.data(), bytes.data(), y.size() * sizeof(float));
  matchesAffine(y, x) ? ++tally.answered : ++tally.wrong;
}

ServerOptions options(const TempRepository& repository) {
  ServerOptions o;
  o.model_repository = repository.root();
  o.http_port = 0;
  o.grpc_port = 0;
  o.metrics_port = 0;
  o.drain_timeout = std::chrono::seconds(20);
  return o;
}

TEST(ServerThreads, ClientsInferWhileTheModelIsReloadedAndScraped) {
  TempRepository repository;
  Server server(options(repository));
  constexpr int kHttpClients = 3, kGrpcClients = 2, kRequestsEach = 40;
  Tally tally;
  std::atomic<int> clients_done{0};

  std::vector<std::thread> threads;
  for (int c = 0; c < kHttpClients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", server.httpPort());
      for (int i = 0; i < kRequestsEach; ++i) inferOverHttp(client, 1 + (c + i) % kBatch, float(c * 100 + i), tally);
      ++clients_done;
    });
  }
  for (int c = 0; c < kGrpcClients; ++c) {
    threads.emplace_back([&, c] {
      auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server.grpcPort()),
                                         grpc::InsecureChannelCredentials());
      auto stub = inference::GRPCInferenceService::NewStub(channel);
      for (int i = 0; i < kRequestsEach; ++i) inferOverGrpc(*stub, 1 + i % kBatch, float(-c * 100 - i), tally);
      ++clients_done;
    });
  }
  const int kClients = kHttpClients + kGrpcClients;
  // The operator: a new version, an unload and a reload, during traffic.
  std::atomic<int> repository_errors{0};
  threads.emplace_back([&] {
    httplib::Client admin("127.0.0.1", server.httpPort());
    auto post = [&](const std::string& path) {
      const auto result = admin.Post(path, "", "application/json");
      if (!result || result->status != 200) ++repository_errors;
    };
    repository.addVersion("2");
    post("/v2/repository/models/affine/load");
    post("/v2/repository/models/affine/unload");
    post("/v2/repository/models/affine/load");
  });
  // The scraper: metrics and statistics until the clients are done.
  std::atomic<int> scrapes{0};
  threads.emplace_back([&] {
    httplib::Client metrics("127.0.0.1", server.metricsPort());
    httplib::Client http("127.0.0.1", server.httpPort());
    while (clients_done.load() < kClients) {
      const auto page = metrics.Get("/metrics");
      const auto stats = http.Get("/v2/models/stats");
      if (page && page->status == 200 && page->body.find("kiln_requests_total") != std::string::npos && stats &&
          stats->status == 200) {
        ++scrapes;
      }
    }
  });
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(repository_errors.load(), 0);
  EXPECT_GT(scrapes.load(), 0);
  EXPECT_EQ(tally.wrong.load(), 0);
  EXPECT_EQ(tally.answered.load() + tally.refused.load(), kClients * kRequestsEach);
  // Only the moments between the unload and the reload refuse.
  EXPECT_GT(tally.answered.load(), kClients * kRequestsEach / 2);
  EXPECT_TRUE(server.stop());
}

TEST(ServerThreads, StopAnswersTheRequestsItTook) {
  TempRepository repository;
  Server server(options(repository));
  constexpr int kClients = 4;
  std::atomic<int> answered{0}, wrong{0};
  std::atomic<bool> stopping{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", server.httpPort());
      // Requests until the server refuses them (503) or has closed its
      // listener; before the stop began, every one must be answered.
      for (int i = 0;; ++i) {
        const std::vector<float> x = rows(1, float(c * 1000 + i));
        const nlohmann::json body = {
            {"inputs", {{{"name", "x"}, {"shape", {1, kFeatures}}, {"datatype", "FP32"}, {"data", x}}}}};
        const auto result = client.Post("/v2/models/affine/infer", body.dump(), "application/json");
        const bool after_stop = stopping.load();
        if (result && result->status == 200) {
          const auto y = nlohmann::json::parse(result->body)["outputs"][0]["data"].get<std::vector<float>>();
          matchesAffine(y, x) ? ++answered : ++wrong;
          continue;
        }
        if (!after_stop || (result && result->status != 503)) ++wrong;
        return;
      }
    });
  }
  while (answered.load() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stopping = true;
  EXPECT_TRUE(server.stop());
  for (auto& client : clients) client.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace kiln::server
