// runner_throughput PACKAGE [--clients N] [--rows R] [--seconds S]
//                   [--queue-delay-us D] [--adaptive F]
// The in-process ceiling that `kiln serve` is measured against
// (bench/serve/serve_bench.py): N client threads send requests of R rows
// to one ModelRunner configured as the server configures a model by
// default (batching on dimension 0, the same queue delay and depth, outputs
// in caller memory), each waiting for its answer before the next, for S
// seconds. Prints one JSON line: requests per second and latency p50/p99.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/model_runner.h"

namespace {

struct Options {
  std::string package;
  int clients = 4;
  int64_t rows = 1;
  double seconds = 5;
  int64_t queue_delay_us = 0;  // the server's default
  double adaptive = 0.1;       // adaptive_timeout: the server's adaptive_queue_delay default
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--clients") {
      o.clients = std::atoi(value());
    } else if (arg == "--rows") {
      o.rows = std::atoll(value());
    } else if (arg == "--seconds") {
      o.seconds = std::atof(value());
    } else if (arg == "--queue-delay-us") {
      o.queue_delay_us = std::atoll(value());
    } else if (arg == "--adaptive") {
      o.adaptive = std::atof(value());
    } else {
      o.package = arg;
    }
  }
  if (o.package.empty() || o.clients < 1 || o.rows < 1) {
    std::fprintf(stderr,
                 "usage: runner_throughput PACKAGE [--clients N] [--rows R] [--seconds S] [--queue-delay-us D] "
                 "[--adaptive F]\n");
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  kiln::ModelRunnerConfig config;
  config.batching_dim = 0;
  config.timeout_ns = std::chrono::microseconds(o.queue_delay_us);
  config.adaptive_timeout = o.adaptive;
  config.ring_buffer_size_multiplier = 64;
  kiln::ModelRunner runner(o.package, config);

  // Each client's request: R rows of every input (zeros), outputs in its own memory.
  struct Client {
    std::vector<std::vector<char>> input_data, output_data;
    kiln::InputMemoryView inputs;
    kiln::OutputMemoryView outputs;
    std::vector<double> latencies_us;
  };
  std::vector<Client> clients(static_cast<size_t>(o.clients));
  for (Client& client : clients) {
    for (const kiln::DataDesc& desc : runner.getExecuteInputs()) {
      const uint64_t bytes = desc.size_in_bytes / static_cast<uint64_t>(desc.shape[0]) * static_cast<uint64_t>(o.rows);
      client.input_data.emplace_back(bytes);
      client.inputs[desc.name] = {client.input_data.back().data(), bytes, desc.dtype};
    }
    for (const kiln::DataDesc& desc : runner.getExecuteOutputs()) {
      const uint64_t bytes = desc.size_in_bytes / static_cast<uint64_t>(desc.shape[0]) * static_cast<uint64_t>(o.rows);
      client.output_data.emplace_back(bytes);
      client.outputs[desc.name] = {client.output_data.back().data(), bytes, desc.dtype};
    }
  }
  // Warm up, then measure.
  for (int i = 0; i < 20; ++i) runner.execute(clients[0].inputs, clients[0].outputs);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (Client& client : clients) {
    threads.emplace_back([&runner, &client, &stop] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = std::chrono::steady_clock::now();
        runner.executeAsync(client.inputs, client.outputs).get();
        client.latencies_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop.store(true);
  for (auto& thread : threads) thread.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (const Client& client : clients) all.insert(all.end(), client.latencies_us.begin(), client.latencies_us.end());
  std::sort(all.begin(), all.end());
  auto percentile = [&](double p) { return all.empty() ? 0.0 : all[static_cast<size_t>(p * static_cast<double>(all.size() - 1))]; };
  std::printf("{\"clients\": %d, \"rows\": %lld, \"requests\": %zu, \"requests_per_second\": %.1f, "
              "\"p50_us\": %.0f, \"p99_us\": %.0f}\n",
              o.clients, static_cast<long long>(o.rows), all.size(), static_cast<double>(all.size()) / elapsed,
              percentile(0.5), percentile(0.99));
  return 0;
}
