// Model runner benchmarks, each a ratio of two ways of running the same
// model in the same process:
//
//   overhead    tiny models (about 2 and 20 us per call) on the cpu device: executeAsync throughput (a
//               window of requests in flight, outputs in caller memory)
//               against calling the executable directly in a loop. The
//               runner's cost per request is the difference.
//   pipelining  a sim device whose transfers take about as long as the
//               compute (latency set from a measured compute time):
//               executeAsync with requests in flight, where transfers
//               overlap compute, against serial execute(). 2.0 is the
//               ideal for two equal stages.
//
// Usage: runner_bench [--requests N] [--repetitions R]
// Prints one line per benchmark:
//   runner overhead (mlp 64x256x64, batch 1, cpu, 2.0 us per call): direct 495.9 k/s, executeAsync 450.5 k/s, ratio 0.91
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/device.h"
#include "kiln/executable.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"

namespace {

using Clock = std::chrono::steady_clock;
using kiln::DType;
using kiln::ValueId;
using kiln::ValueType;

double seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

kiln::ConstantPtr weights(int64_t rows, int64_t cols, float scale) {
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = scale * static_cast<float>(static_cast<int>(i % 17) - 8);
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return kiln::makeConstant(kiln::TensorInfo{DType::kF32, {rows, cols}}, std::move(bytes));
}

// x[batch, in] -> Relu(x @ w1) @ w2.
std::filesystem::path writeMlp(const std::string& name, int64_t batch, int64_t in, int64_t hidden, int64_t out) {
  kiln::Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {batch, in}));
  const ValueId w1 = graph.addInitializer("w1", weights(in, hidden, 0.01f));
  const ValueId w2 = graph.addInitializer("w2", weights(hidden, out, 0.01f));
  const ValueId h = graph.node(graph.addNode("MatMul", {x, w1}, {"h"})).outputs[0];
  const ValueId r = graph.node(graph.addNode("Relu", {h}, {"r"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("MatMul", {r, w2}, {"y"})).outputs[0]);
  const auto path = std::filesystem::temp_directory_path() / ("kiln_runner_bench_" + std::to_string(::getpid()) + "_" + name + ".kiln");
  kiln::compile(graph, {{"", 17}}, path);
  return path;
}

struct Buffers {
  std::vector<std::vector<float>> inputs, outputs;
  Buffers(size_t count, size_t in, size_t out) {
    for (size_t i = 0; i < count; ++i) {
      inputs.emplace_back(in, 0.5f + static_cast<float>(i % 7));
      outputs.emplace_back(out, 0.0f);
    }
  }
};

// Requests per second through executeAsync with up to `window` requests in
// flight, the way a client that streams requests keeps a runner busy: it
// fills the window, then collects the older half before refilling, so
// that it sleeps once per half window rather than once per request.
double runnerThroughput(kiln::ModelRunner& runner, Buffers& buffers, size_t requests) {
  const size_t window = buffers.inputs.size();
  std::vector<kiln::Future<void>> in_flight(window);
  auto submit = [&](size_t i) {
    const size_t slot = i % window;
    return runner.executeAsync(
        {{"x", kiln::ConstTensorMemoryView{buffers.inputs[slot].data(), buffers.inputs[slot].size() * 4}}},
        {{"y", kiln::TensorMemoryView{buffers.outputs[slot].data(), buffers.outputs[slot].size() * 4}}});
  };
  const auto start = Clock::now();
  size_t collected = 0;
  for (size_t i = 0; i < requests; ++i) {
    if (i - collected == window) {
      // Requests finish in order here: one wait covers the half window.
      const size_t stop = collected + window / 2;
      in_flight[(stop - 1) % window].wait();
      for (; collected < stop; ++collected) in_flight[collected % window].get();
    }
    in_flight[i % window] = submit(i);
  }
  for (; collected < requests; ++collected) in_flight[collected % window].get();
  return static_cast<double>(requests) / seconds(start);
}

// Runs `body` `repetitions` times and keeps the best rate.
template <typename Body>
double best(int repetitions, Body body) {
  double rate = 0;
  for (int r = 0; r < repetitions; ++r) rate = std::max(rate, body());
  return rate;
}

void overhead(size_t requests, int repetitions, int64_t in, int64_t hidden, int64_t out) {
  const auto path = writeMlp("tiny_" + std::to_string(hidden), 1, in, hidden, out);
  kiln::DeviceManagerOptions options;
  kiln::DeviceManager manager(options);
  Buffers buffers(64, static_cast<size_t>(in), static_cast<size_t>(out));

  // Direct: the same executable, on this thread, one kernel thread.
  auto package = std::make_shared<const kiln::PackageReader>(path);
  kiln::Executable executable(package, "", manager.getSpecificDevice("cpu"), kiln::ExecutableOptions{.threads = 1});
  executable.runLoad([&](const kiln::Anchor& anchor) { return package->findTensorData(anchor.name)->data(); });
  const double direct = best(repetitions, [&] {
    const auto start = Clock::now();
    for (size_t i = 0; i < requests; ++i) {
      const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(buffers.inputs[i % 64].data())};
      std::byte* outputs[] = {reinterpret_cast<std::byte*>(buffers.outputs[i % 64].data())};
      executable.runMain(inputs, outputs);
    }
    return static_cast<double>(requests) / seconds(start);
  });

  kiln::ModelRunnerConfig config;
  config.device_manager = &manager;
  config.threads = 1;
  config.ring_buffer_size_multiplier = 64;
  kiln::ModelRunner runner(path, config);
  const double queued = best(repetitions, [&] { return runnerThroughput(runner, buffers, requests); });
  std::printf("runner overhead (mlp %ldx%ldx%ld, batch 1, cpu, %.1f us per call): direct %.1f k/s, executeAsync %.1f "
              "k/s, ratio %.2f\n",
              static_cast<long>(in), static_cast<long>(hidden), static_cast<long>(out), 1e6 / direct, direct / 1e3,
              queued / 1e3, queued / direct);
  std::filesystem::remove(path);
}

void pipelining(size_t requests, int repetitions) {
  const int64_t batch = 128, in = 512, hidden = 512, out = 512;
  const auto path = writeMlp("pipeline", batch, in, hidden, out);
  auto package = std::make_shared<const kiln::PackageReader>(path);

  // The compute time on one kernel thread sets the transfer latency: each
  // request has one copy in and one out, together as long as the compute.
  double compute_seconds = 0;
  {
    kiln::DeviceManager manager{kiln::DeviceManagerOptions{}};
    kiln::Executable executable(package, "", manager.getSpecificDevice("cpu"), kiln::ExecutableOptions{.threads = 1});
    executable.runLoad([&](const kiln::Anchor& anchor) { return package->findTensorData(anchor.name)->data(); });
    std::vector<float> x(static_cast<size_t>(batch * in), 1.0f), y(static_cast<size_t>(batch * out));
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
    for (int i = 0; i < 3; ++i) executable.runMain(inputs, outputs);
    const auto start = Clock::now();
    constexpr int kRuns = 20;
    for (int i = 0; i < kRuns; ++i) executable.runMain(inputs, outputs);
    compute_seconds = seconds(start) / kRuns;
  }
  kiln::DeviceManagerOptions options;
  options.sim_devices = 1;
  options.sim.compute_threads = 1;
  options.sim.transfer_latency_ns = static_cast<uint64_t>(compute_seconds * 1e9 / 2);
  options.lock_dir = std::filesystem::temp_directory_path() / ("kiln_runner_bench_locks_" + std::to_string(::getpid()));
  kiln::DeviceManager manager(options);
  kiln::ModelRunnerConfig config;
  config.device_manager = &manager;
  config.device_kind = kiln::DeviceKind::kSim;
  config.ring_buffer_size_multiplier = 8;
  kiln::ModelRunner runner(path, config);
  Buffers buffers(8, static_cast<size_t>(batch * in), static_cast<size_t>(batch * out));
  const double serial = best(repetitions, [&] {
    const auto start = Clock::now();
    for (size_t i = 0; i < requests; ++i) {
      runner.execute({{"x", kiln::ConstTensorMemoryView{buffers.inputs[0].data(), buffers.inputs[0].size() * 4}}},
                     {{"y", kiln::TensorMemoryView{buffers.outputs[0].data(), buffers.outputs[0].size() * 4}}});
    }
    return static_cast<double>(requests) / seconds(start);
  });
  const double pipelined = best(repetitions, [&] { return runnerThroughput(runner, buffers, requests); });
  std::printf("runner pipelining (sim, compute %.2f ms, transfer latency %.2f ms each way): serial execute %.1f/s, "
              "executeAsync %.1f/s, ratio %.2f\n",
              compute_seconds * 1e3, compute_seconds * 1e3 / 2, serial, pipelined, pipelined / serial);
  std::filesystem::remove(path);
  std::filesystem::remove_all(options.lock_dir);
}

}  // namespace

int main(int argc, char** argv) {
  size_t requests = 20000;
  int repetitions = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--requests") {
      requests = std::stoul(argv[i + 1]);
    } else if (flag == "--repetitions") {
      repetitions = std::stoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: runner_bench [--requests N] [--repetitions R]\n");
      return 2;
    }
  }
  overhead(requests, repetitions, 64, 256, 64);    // about 2 us per call
  overhead(requests / 4, repetitions, 256, 1024, 256);  // about 20 us per call
  pipelining(std::max<size_t>(requests / 200, 20), std::max(repetitions / 2, 1));
  return 0;
}
