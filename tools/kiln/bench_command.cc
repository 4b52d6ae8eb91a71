// `kiln bench MODEL.kiln [--input NAME=FILE.npy]... [--iterations N]
// [--warmup N] [--json]`: runs the model (fixed shapes or run-time shapes)
// on the given inputs (random ones, fixed seed, for the rest; an input with
// unknown dimensions must be given) and reports latency percentiles,
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

#include "kiln/dynamic_executor.h"
#include "kiln/executor.h"
#include "kiln/plugins.h"
#include "kiln/step_trace.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/device_runner.h"
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

// The model under test on one set of inputs: a package of fixed shapes runs
// on an Executor, one with run-time shapes on a DynamicExecutor (whose first
// call compiles the inputs' specialization: the warm-up pays for it), and
// one for a device (cuda, or --device) on a ModelRunner, host memory in and
// out.
class BenchTarget {
 public:
  BenchTarget(const std::string& package, const std::string& model, int threads, bool flush_denormals,
              const InputArguments& input_files, std::optional<DeviceKind> device) {
    if (device) {
      on_device_ = true;
      device_ = std::make_unique<DeviceRunner>(package, model, *device, flush_denormals);
      inputs_ = loadInputs(device_->inputs(), input_files, /*random_missing=*/true);
      for (const NpyArray& array : inputs_) in_.push_back(array.bytes.data());
      for (const TensorSlot& slot : device_->outputs()) output_data_.emplace_back(slot.info.sizeInBytes());
      for (auto& data : output_data_) out_.push_back(data.data());
      return;
    }
    if (hasRuntimeShapes(package, model)) {
      dynamic_ = std::make_unique<DynamicExecutor>(package, model, DynamicExecutorOptions{.threads = threads, .flush_denormals = flush_denormals});
    } else {
      fixed_ = std::make_unique<Executor>(package, model, ExecutorOptions{.threads = threads, .flush_denormals = flush_denormals});
    }
    inputs_ = loadInputs(fixed_ ? fixed_->inputs() : dynamic_->inputs(), input_files, /*random_missing=*/true);
    for (const NpyArray& array : inputs_) {
      infos_.push_back(array.info);
      in_.push_back(array.bytes.data());
    }
    if (fixed_) {
      for (const TensorSlot& slot : fixed_->outputs()) output_data_.emplace_back(slot.info.sizeInBytes());
      for (auto& data : output_data_) out_.push_back(data.data());
    } else {
      // Output shapes are learned as the model runs (it may run in stages);
      // the buffers grow on the first run and are reused after.
      output_data_.resize(dynamic_->outputs().size());
      allocate_ = [this](size_t index, const TensorInfo& info) {
        if (output_data_[index].size() < info.sizeInBytes()) output_data_[index].resize(info.sizeInBytes());
        return output_data_[index].data();
      };
    }
  }

  bool runtimeShapes() const { return dynamic_ != nullptr; }

  bool onDevice() const { return on_device_; }
  // Detaches the device (another user of it, the profile, may attach it).
  void releaseDevice() { device_.reset(); }
  std::vector<std::span<const std::byte>> inputBytes() const {
    std::vector<std::span<const std::byte>> bytes;
    for (const NpyArray& array : inputs_) bytes.emplace_back(array.bytes.data(), array.bytes.size());
    return bytes;
  }

  void run(StepTrace* trace = nullptr) {
    if (device_) {
      device_->run(in_, out_);
      return;
    }
    if (fixed_) {
      if (trace != nullptr) {
        fixed_->runTraced(in_, out_, *trace);
      } else {
        fixed_->run(in_, out_);
      }
    } else {
      dynamic_->run(infos_, in_, allocate_, trace);
    }
  }

  uint64_t arenaBytes() const {
    if (on_device_) return 0;
    return fixed_ ? fixed_->arenaBytes() : dynamic_->memoryStats().arena_bytes;
  }

 private:
  std::unique_ptr<Executor> fixed_;
  std::unique_ptr<DynamicExecutor> dynamic_;
  std::unique_ptr<DeviceRunner> device_;
  bool on_device_ = false;
  std::vector<NpyArray> inputs_;
  std::vector<TensorInfo> infos_;
  std::vector<const std::byte*> in_;
  std::vector<std::vector<std::byte>> output_data_;
  std::vector<std::byte*> out_;
  OutputAllocator allocate_;
};

// The step events of each traced run, in order (an executor adds a run's
// steps, then its "run" event).
std::vector<std::vector<const TraceEvent*>> stepsPerRun(const StepTrace& trace) {
  std::vector<std::vector<const TraceEvent*>> runs(1);
  for (const TraceEvent& event : trace.events()) {
    if (event.category == "run") {
      runs.emplace_back();
    } else if (event.category == "step") {
      runs.back().push_back(&event);
    }
  }
  runs.pop_back();  // the empty one after the last run
  return runs;
}

// Prints, from a trace of several runs, the time per kernel and the 15
// slowest steps, averaged per run. Returns the steps per run.
size_t printProfile(const StepTrace& trace) {
  const auto runs = stepsPerRun(trace);
  if (runs.empty()) return 0;
  const size_t steps = runs.front().size();
  std::vector<double> step_ms(steps, 0.0);
  for (const auto& run : runs) {
    for (size_t i = 0; i < std::min(steps, run.size()); ++i) step_ms[i] += static_cast<double>(run[i]->duration_ns) / 1e6;
  }
  const double run_count = static_cast<double>(runs.size());
  double total_ms = 0;
  std::map<std::string, std::pair<double, int>> per_kernel;  // ms per run, step count
  for (size_t i = 0; i < steps; ++i) {
    step_ms[i] /= run_count;
    total_ms += step_ms[i];
    auto& entry = per_kernel[runs.front()[i]->name];
    entry.first += step_ms[i];
    entry.second += 1;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> kernels(per_kernel.begin(), per_kernel.end());
  std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("profile: %.3f ms per run in %zu steps (sum of step times)\n", total_ms, steps);
  std::printf("  %-28s %6s %10s %7s\n", "kernel", "steps", "ms/run", "share");
  for (const auto& [name, entry] : kernels) {
    std::printf("  %-28s %6d %10.3f %6.1f%%\n", name.c_str(), entry.second, entry.first, 100.0 * entry.first / total_ms);
  }
  std::vector<size_t> order(steps);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return step_ms[a] > step_ms[b]; });
  std::printf("  slowest steps:\n");
  for (size_t i = 0; i < std::min<size_t>(15, order.size()); ++i) {
    const TraceEvent& event = *runs.front()[order[i]];
    std::printf("  %5zu %10.3f ms  %s {%s}\n", order[i], step_ms[order[i]], event.name.c_str(), event.args_json.c_str());
  }
  return steps;
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
    bool keep_denormals = false;
    InputArguments inputs;
    std::string device;
    std::vector<std::string> plugins;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("bench", "Time a compiled model on random inputs");
  cmd->add_option("package", args->package, "The .kiln package")->required()->check(CLI::ExistingFile);
  cmd->add_option("--iterations", args->iterations, "Timed runs (default 100)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Untimed runs first (default 10)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--model", args->model, "Model to run when the package holds several");
  cmd->add_option("--threads", args->threads, "Threads per kernel (default: OMP_NUM_THREADS, or one per core)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--input", args->inputs.files, "NAME=FILE.npy (repeatable); other inputs get random data");
  cmd->add_option("--shape", args->inputs.shapes,
                  "NAME:DIMS (repeatable, e.g. x:1x3x640x640): the shape of an input's random data, where the "
                  "package leaves dimensions to run time");
  cmd->add_option("--plugin", args->plugins,
                  "Load a plugin library first (repeatable): a package's libraries are otherwise found in "
                  "KILN_PLUGIN_PATH or beside it, and with KILN_PLUGIN_AUTOLOAD=0 only preloaded ones are used")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--keep-denormals", args->keep_denormals,
                "Run with the caller's floating-point mode instead of flushing denormals to zero (slower when "
                "activations underflow)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_option("--device", args->device,
                  "Run on a device through a ModelRunner, host memory in and out: cpu, sim or cuda (default: the "
                  "package's target; cpu packages run on the host executor)")
      ->check(CLI::IsMember({"cpu", "sim", "cuda"}));
  cmd->add_flag("--profile", args->profile, "Also time each step and print the time per kernel and the slowest steps");
  cmd->add_option("--trace", args->trace,
                  "Also write a Chrome trace (chrome://tracing, Perfetto) of up to 20 runs, one event per step, to FILE");

  return [args]() {
    for (const std::string& plugin : args->plugins) loadPlugin(plugin);
    const auto load_start = std::chrono::steady_clock::now();
    const std::optional<DeviceKind> device = deviceFor(args->package, args->model, args->device);
    if (device && !args->trace.empty()) {
      throw UsageError("--trace records the host executor's steps; with a device, use --profile");
    }
    BenchTarget target(args->package, args->model, args->threads, !args->keep_denormals, args->inputs, device);
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();

    for (int i = 0; i < args->warmup; ++i) target.run();
    std::vector<double> times_ms(static_cast<size_t>(args->iterations));
    for (double& t : times_ms) {
      const auto start = std::chrono::steady_clock::now();
      target.run();
      t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    // The step count comes from one traced run (a DynamicExecutor's
    // specialization decides it).
    size_t steps = 0;
    if (!target.onDevice()) {
      StepTrace one_run;
      target.run(&one_run);
      steps = stepsPerRun(one_run).front().size();
    }
    if (args->profile && target.onDevice()) {
      // The steps of an Executable on the device, each waited for.
      StepTrace trace;
      target.releaseDevice();
      traceOnDevice(args->package, args->model, *device, target.inputBytes(), args->iterations, trace);
      steps = printProfile(trace);
    } else if (args->profile) {
      StepTrace trace;
      for (int i = 0; i < args->iterations; ++i) target.run(&trace);
      steps = printProfile(trace);
    }
    if (!args->trace.empty()) {
      StepTrace trace;
      for (int i = 0; i < std::min(args->iterations, 20); ++i) target.run(&trace);
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
                  steps, static_cast<unsigned long long>(target.arenaBytes()));
    } else {
      std::printf("%s: %d runs, p50 %.3f ms, p90 %.3f ms, mean %.3f ms (%.1f runs/s); %zu steps, arena %llu bytes, "
                  "load %.1f ms, peak RSS %.1f MiB\n",
                  args->package.c_str(), args->iterations, percentile(0.5), percentile(0.9), mean, 1000.0 / mean,
                  steps, static_cast<unsigned long long>(target.arenaBytes()), load_ms, peak_rss_mib);
    }
    return 0;
  };
}

}  // namespace kiln::cli
