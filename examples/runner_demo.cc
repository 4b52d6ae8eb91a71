// ModelRunner demo: asynchronous requests with dynamic batching.
//
// Compiles a small model (y = Relu(x @ w1) @ w2, compiled for batches of
// 8 rows), then serves it with a ModelRunner on a simulated accelerator
// (its own memory, 100 us transfers): three client threads send requests
// of 1 to 7 rows with executeAsync; the runner gathers their rows into
// device batches of 8, pads the last partial batch after timeout_ns, and
// answers each request with exactly its rows. Every answer is checked
// against a plain C++ computation.
//
// Usage: runner_demo [package.kiln]   (default: a temporary file)
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/model_runner.h"

namespace {

constexpr int64_t kBatch = 8, kIn = 16, kHidden = 32, kOut = 4;

std::vector<float> weight(int64_t rows, int64_t cols, float scale) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = scale * std::sin(static_cast<float>(i));
  return w;
}

kiln::ConstantPtr constant(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return kiln::makeConstant(kiln::TensorInfo{kiln::DType::kF32, {rows, cols}}, std::move(bytes));
}

void writeModel(const std::filesystem::path& path) {
  kiln::Graph graph;
  const auto x = graph.addInput("x", kiln::ValueType::tensor(kiln::DType::kF32, {kBatch, kIn}));
  const auto w1 = graph.addInitializer("w1", constant(weight(kIn, kHidden, 0.3f), kIn, kHidden));
  const auto w2 = graph.addInitializer("w2", constant(weight(kHidden, kOut, 0.2f), kHidden, kOut));
  const auto h = graph.node(graph.addNode("MatMul", {x, w1}, {"h"})).outputs[0];
  const auto r = graph.node(graph.addNode("Relu", {h}, {"r"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("MatMul", {r, w2}, {"y"})).outputs[0]);
  kiln::compile(graph, {{"", 17}}, path);
}

// The model in plain C++, for any number of rows.
std::vector<float> reference(const std::vector<float>& x) {
  const auto w1 = weight(kIn, kHidden, 0.3f), w2 = weight(kHidden, kOut, 0.2f);
  const size_t rows = x.size() / kIn;
  std::vector<float> y(rows * kOut, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    std::vector<float> h(kHidden, 0.0f);
    for (int64_t j = 0; j < kHidden; ++j) {
      for (int64_t i = 0; i < kIn; ++i) h[j] += x[r * kIn + i] * w1[i * kHidden + j];
      h[j] = std::max(h[j], 0.0f);
    }
    for (int64_t k = 0; k < kOut; ++k) {
      for (int64_t j = 0; j < kHidden; ++j) y[r * kOut + k] += h[j] * w2[j * kOut + k];
    }
  }
  return y;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path package =
      argc > 1 ? std::filesystem::path(argv[1])
               : std::filesystem::temp_directory_path() / ("kiln_runner_demo_" + std::to_string(::getpid()) + ".kiln");
  writeModel(package);

  // One simulated accelerator: 64 MiB, 100 us per transfer. Its lock file
  // lives in a private directory so that the demo never waits for another.
  kiln::DeviceManagerOptions devices;
  devices.sim_devices = 1;
  devices.sim.memory_bytes = 64 << 20;
  devices.sim.transfer_latency_ns = 100'000;
  devices.lock_dir = std::filesystem::temp_directory_path() / ("kiln_runner_demo_locks_" + std::to_string(::getpid()));
  kiln::DeviceManager manager(devices);

  kiln::ModelRunnerConfig config;
  config.device_manager = &manager;
  config.device_kind = kiln::DeviceKind::kSim;  // a cpu package runs on sim devices too
  config.batching_dim = 0;                      // any number of rows per request
  config.timeout_ns = std::chrono::milliseconds(2);
  config.ring_buffer_size_multiplier = 4;
  kiln::ModelRunner runner(package, config);

  for (const kiln::DataDesc& input : runner.getExecuteInputs()) {
    std::printf("input  %s: %s, %llu bytes per compiled batch\n", input.name.c_str(),
                kiln::TensorInfo{input.dtype, input.shape}.shapeString().c_str(),
                static_cast<unsigned long long>(input.size_in_bytes));
  }
  std::printf("device %s\n", runner.deviceIds().front().c_str());

  // Three clients, each with 20 requests of 1..7 rows in flight at once.
  std::atomic<int> rows_served{0}, mismatches{0};
  std::vector<std::thread> clients;
  for (int client = 0; client < 3; ++client) {
    clients.emplace_back([&, client] {
      std::vector<std::vector<float>> inputs;
      std::vector<kiln::Future<kiln::OutputTensors>> results;
      for (int i = 0; i < 20; ++i) {
        const size_t rows = 1 + (client * 20 + i) % 7;
        inputs.emplace_back(rows * kIn);
        for (size_t k = 0; k < inputs.back().size(); ++k) inputs.back()[k] = std::cos(static_cast<float>(k + i + client));
      }
      for (const auto& x : inputs) {
        results.push_back(runner.executeAsync({{"x", kiln::ConstTensorMemoryView{x.data(), x.size() * 4}}}));
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        const kiln::OutputTensors out = results[i].get();
        const kiln::HostTensor& y = out.at("y");
        const std::vector<float> want = reference(inputs[i]);
        std::vector<float> got(want.size());
        std::memcpy(got.data(), y.bytes.data(), y.bytes.size());
        for (size_t k = 0; k < got.size(); ++k) {
          if (std::abs(got[k] - want[k]) > 1e-4f * std::max(1.0f, std::abs(want[k]))) {
            ++mismatches;
            break;
          }
        }
        rows_served += static_cast<int>(y.info.shape[0]);
      }
    });
  }
  for (auto& client : clients) client.join();

  // A synchronous request into caller memory.
  std::vector<float> x(3 * kIn, 0.5f), y(3 * kOut);
  runner.execute({{"x", kiln::ConstTensorMemoryView{x.data(), x.size() * 4}}},
                 {{"y", kiln::TensorMemoryView{y.data(), y.size() * 4}}});
  std::printf("sync request of 3 rows: y[0] = [%.4f %.4f %.4f %.4f]\n", y[0], y[1], y[2], y[3]);

  std::printf("served %d rows in 61 requests as %llu device batches of %lld (%llu flushed partial); %d mismatches\n",
              rows_served.load() + 3, static_cast<unsigned long long>(runner.batchesRun()),
              static_cast<long long>(kBatch), static_cast<unsigned long long>(runner.batchesFlushed()),
              mismatches.load());
  if (argc <= 1) std::filesystem::remove(package);
  std::filesystem::remove_all(devices.lock_dir);
  return mismatches.load() == 0 ? 0 : 1;
}
