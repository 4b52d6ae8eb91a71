// `kiln bench MODEL.kiln [--input NAME=FILE.npy]... [--iterations N]
// [--warmup N] [--json]`: runs the model on the given inputs (random ones,
// fixed seed, for the rest) and reports latency percentiles,
// runs per second and peak resident memory. With --profile it also times
// every step over the timed runs and prints where the time goes: per kernel,
// and the slowest steps. With --trace FILE it writes a Chrome trace (for
// chrome://tracing or Perfetto) of up to 20 more runs, one event per step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <memory>
#include <random>

#include "kiln/executor.h"
#include "kiln/step_trace.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/model_inputs.h"

namespace kiln::cli {
namespace {

// VmHWM: this process's peak resident set. (getrusage's ru_maxrss can carry
// a parent's larger peak across exec.)
double peakResidentMib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Runs the model `iterations` more times with per-step timing and prints
// the time per kernel and the 15 slowest steps, averaged per run.
void printProfile(Executor& executor, const std::vector<const std::byte*>& in, const std::vector<std::byte*>& out,
                  int iterations) {
  std::vector<uint64_t> step_ns(executor.stepCount(), 0);
  for (int i = 0; i < iterations; ++i) executor.runProfiled(in, out, step_ns);
  const double runs = iterations;
  double total_ms = 0;
  std::map<std::string, std::pair<double, int>> per_kernel;  // ms per run, step count
  for (size_t i = 0; i < step_ns.size(); ++i) {
    const double ms = static_cast<double>(step_ns[i]) / 1e6 / runs;
    total_ms += ms;
    auto& entry = per_kernel[executor.stepKernel(i)];
    entry.first += ms;
    entry.second += 1;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> kernels(per_kernel.begin(), per_kernel.end());
  std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("profile: %.3f ms per run in %zu steps (sum of step times)\n", total_ms, step_ns.size());
  std::printf("  %-28s %6s %10s %7s\n", "kernel", "steps", "ms/run", "share");
  for (const auto& [name, entry] : kernels) {
    std::printf("  %-28s %6d %10.3f %6.1f%%\n", name.c_str(), entry.second, entry.first, 100.0 * entry.first / total_ms);
  }
  std::vector<size_t> order(step_ns.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return step_ns[a] > step_ns[b]; });
  std::printf("  slowest steps:\n");
  for (size_t i = 0; i < std::min<size_t>(15, order.size()); ++i) {
    std::printf("  %5zu %10.3f ms  %s\n", order[i], static_cast<double>(step_ns[order[i]]) / 1e6 / runs,
                executor.stepDescription(order[i]).c_str());
  }
}

}  // namespace

Command addBenchCommand(CLI::App& app) {
  struct Args {
    std::string package;
    int iterations = 100;
    int warmup = 10;
    bool json = false;
    bool profile = false;
    std::string model;
    std::string trace;
    int threads = 0;
    std::vector<std::string> inputs;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("bench", "Time a compiled model on random inputs");
  cmd->add_option("package", args->package, "The .kiln package")->required()->check(CLI::ExistingFile);
  cmd->add_option("--iterations", args->iterations, "Timed runs (default 100)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Untimed runs first (default 10)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--model", args->model, "Model to run when the package holds several");
  cmd->add_option("--threads", args->threads, "Threads per kernel (default: OMP_NUM_THREADS, or one per core)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--input", args->inputs, "NAME=FILE.npy (repeatable); other inputs get random data");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--profile", args->profile, "Also time each step and print the time per kernel and the slowest steps");
  cmd->add_option("--trace", args->trace,
                  "Also write a Chrome trace (chrome://tracing, Perfetto) of up to 20 runs, one event per step, to FILE");

  return [args]() {
    const auto load_start = std::chrono::steady_clock::now();
    Executor executor(args->package, args->model, ExecutorOptions{.threads = args->threads});
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
    const std::vector<NpyArray> input_data = loadInputs(executor.inputs(), args->inputs, /*random_missing=*/true);
    std::vector<std::vector<std::byte>> output_data;
    for (const TensorSlot& slot : executor.outputs()) output_data.emplace_back(slot.info.sizeInBytes());
    std::vector<const std::byte*> in;
    for (const auto& data : input_data) in.push_back(data.bytes.data());
    std::vector<std::byte*> out;
    for (auto& data : output_data) out.push_back(data.data());

    for (int i = 0; i < args->warmup; ++i) executor.run(in, out);
    std::vector<double> times_ms(static_cast<size_t>(args->iterations));
    for (double& t : times_ms) {
      const auto start = std::chrono::steady_clock::now();
      executor.run(in, out);
      t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    if (args->profile) printProfile(executor, in, out, args->iterations);
    if (!args->trace.empty()) {
      StepTrace trace;
      for (int i = 0; i < std::min(args->iterations, 20); ++i) executor.runTraced(in, out, trace);
      trace.write(args->trace);
      std::fprintf(stderr, "trace of %d runs (%zu events) written to %s\n", std::min(args->iterations, 20),
                   trace.events().size(), args->trace.c_str());
    }
    double total = 0;
    for (double t : times_ms) total += t;
    std::sort(times_ms.begin(), times_ms.end());
    auto percentile = [&](double p) { return times_ms[static_cast<size_t>(p * static_cast<double>(times_ms.size() - 1))]; };
    const double mean = total / static_cast<double>(times_ms.size());
    const double peak_rss_mib = peakResidentMib();
    if (args->json) {
      std::printf("{\"iterations\": %d, \"p50_ms\": %.6f, \"p90_ms\": %.6f, \"mean_ms\": %.6f, "
                  "\"throughput_per_s\": %.3f, \"peak_rss_mib\": %.2f, \"load_ms\": %.3f, \"steps\": %zu, "
                  "\"arena_bytes\": %llu}\n",
                  args->iterations, percentile(0.5), percentile(0.9), mean, 1000.0 / mean, peak_rss_mib, load_ms,
                  executor.stepCount(), static_cast<unsigned long long>(executor.arenaBytes()));
    } else {
      std::printf("%s: %d runs, p50 %.3f ms, p90 %.3f ms, mean %.3f ms (%.1f runs/s); %zu steps, arena %llu bytes, "
                  "load %.1f ms, peak RSS %.1f MiB\n",
                  args->package.c_str(), args->iterations, percentile(0.5), percentile(0.9), mean, 1000.0 / mean,
                  executor.stepCount(), static_cast<unsigned long long>(executor.arenaBytes()), load_ms, peak_rss_mib);
    }
    return 0;
  };
}

}  // namespace kiln::cli
