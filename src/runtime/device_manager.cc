// DeviceManager (include/kiln/device.h): lists the devices of this machine,
// reads their configuration from the environment, and attaches one.
//
// Attaching a sim device means taking its DeviceLock (device_lock.h) and
// only then creating the SimDevice, which owns the lock: the device stays
// attached for exactly as long as the returned shared_ptr lives. cpu is
// never locked. Busy devices are retried as DeviceWaitConfig says.
//
// Thread safety: the manager holds only its options, which never change
// after construction; the locks do the mutual exclusion, so several threads
// (and processes) may attach devices at once.
#include <errno.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/cpu_device.h"
#include "runtime/device_internal.h"
#include "runtime/device_lock.h"
#include "runtime/sim_device.h"
#if KILN_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace kiln {
namespace {

namespace di = device_internal;

// ---- Environment parsing: each parser names the variable and the value. --

std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

[[noreturn]] void badValue(const char* variable, const std::string& expected, std::string_view value) {
  throw UsageError(fmt::format("{}: expected {}, got '{}'", variable, expected, value));
}

bool parseUnsigned(std::string_view text, uint64_t* value) {
  text = trim(text);
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

bool parseDouble(std::string_view text, double* value) {
  text = trim(text);
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size() && std::isfinite(*value);
}

uint64_t unsignedVariable(const char* variable, std::string_view value, uint64_t max) {
  uint64_t number = 0;
  if (!parseUnsigned(value, &number) || number > max) {
    badValue(variable, fmt::format("a whole number from 0 to {}", max), value);
  }
  return number;
}

double nonNegativeVariable(const char* variable, std::string_view value) {
  double number = 0;
  if (!parseDouble(value, &number) || number < 0) badValue(variable, "a number >= 0", value);
  return number;
}

// "256M", "1G", "65536", "512K": binary multiples.
uint64_t memoryVariable(const char* variable, std::string_view value) {
  const char* expected = "a size in bytes with an optional suffix K, M or G, like '256M'";
  std::string_view digits = trim(value);
  uint64_t scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K': case 'k': scale = 1ull << 10; break;
      case 'M': case 'm': scale = 1ull << 20; break;
      case 'G': case 'g': scale = 1ull << 30; break;
      default: break;
    }
    if (scale != 1) digits.remove_suffix(1);
  }
  uint64_t number = 0;
  if (!parseUnsigned(digits, &number) || number == 0 || number > UINT64_MAX / scale) {
    badValue(variable, expected, value);
  }
  return number * scale;
}

bool parseFaultKind(std::string_view name, FaultKind* kind) {
  for (size_t k = 0; k < kFaultKinds; ++k) {
    if (name == faultKindName(static_cast<FaultKind>(k))) {
      *kind = static_cast<FaultKind>(k);
      return true;
    }
  }
  return false;
}

std::vector<std::string_view> splitList(std::string_view text) {
  std::vector<std::string_view> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, comma - start));
    if (!item.empty()) items.push_back(item);
    start = comma + 1;
  }
  return items;
}

// "app@3,reset@10"
// What a fault variable's error message lists; faultKindName's names.
constexpr const char* kFaultKindList = "(kinds: app, reset, rerun, unknown, restart)";

std::vector<ScriptedFault> faultScriptVariable(const char* variable, std::string_view value) {
  std::vector<ScriptedFault> script;
  for (std::string_view item : splitList(value)) {
    const size_t at = item.find('@');
    ScriptedFault fault;
    if (at == std::string_view::npos || !parseFaultKind(trim(item.substr(0, at)), &fault.kind) ||
        !parseUnsigned(item.substr(at + 1), &fault.at_job)) {
      badValue(variable, fmt::format("kind@job like 'reset@10' {}", kFaultKindList), item);
    }
    script.push_back(fault);
  }
  return script;
}

// "reset=0.01,app=0.001"
void faultRateVariable(const char* variable, std::string_view value, double* rates) {
  for (std::string_view item : splitList(value)) {
    const size_t equals = item.find('=');
    FaultKind kind{};
    double rate = 0;
    if (equals == std::string_view::npos || !parseFaultKind(trim(item.substr(0, equals)), &kind) ||
        !parseDouble(item.substr(equals + 1), &rate) || rate < 0 || rate > 1) {
      badValue(variable, fmt::format("kind=rate with a rate from 0 to 1, like 'reset=0.01' {}", kFaultKindList), item);
    }
    rates[static_cast<size_t>(kind)] = rate;
  }
}

// ---- Attaching. ----------------------------------------------------------

// What can run `target`, or UsageError when nothing of this build can.
std::vector<DeviceKind> kindsFor(const std::string& device_kind) {
  switch (parseDeviceKind(device_kind)) {
    case DeviceKind::kCpu: return {DeviceKind::kCpu, DeviceKind::kSim};  // sim runs the CPU kernels
    case DeviceKind::kSim: return {DeviceKind::kSim};
    case DeviceKind::kCuda: break;
  }
#if KILN_HAVE_CUDA
  return {DeviceKind::kCuda};
#else
  throw UsageError("this build of kiln has no CUDA device (build it where the CUDA toolkit is installed)");
#endif
}

// The GPUs of this machine (none without CUDA).
// Sim device `index`'s configuration.
const SimDeviceConfig& simConfig(const DeviceManagerOptions& options, uint32_t index) {
  return index < options.sim_each.size() ? options.sim_each[index] : options.sim;
}

std::vector<DeviceInfo> cudaDevices() {
#if KILN_HAVE_CUDA
  return CudaDevice::describeAll();
#else
  return {};
#endif
}

const char* strategyName(WaitStrategy strategy) {
  switch (strategy) {
    case WaitStrategy::kNoWait: return "NO_WAIT";
    case WaitStrategy::kWaitWithTimeout: return "WAIT_WITH_TIMEOUT";
    case WaitStrategy::kWaitForever: return "WAIT_FOREVER";
  }
  return "unknown";
}

}  // namespace

DeviceManagerOptions DeviceManagerOptions::fromEnvironment() {
  DeviceManagerOptions options;
  auto get = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  if (const char* v = get("KILN_SIM_DEVICES")) {
    options.sim_devices = static_cast<uint32_t>(unsignedVariable("KILN_SIM_DEVICES", v, 1024));
  }
  if (const char* v = get("KILN_SIM_MEMORY")) options.sim.memory_bytes = memoryVariable("KILN_SIM_MEMORY", v);
  if (const char* v = get("KILN_SIM_LATENCY_US")) {
    const double microseconds = nonNegativeVariable("KILN_SIM_LATENCY_US", v);
    options.sim.transfer_latency_ns = static_cast<uint64_t>(std::llround(microseconds * 1e3));
  }
  if (const char* v = get("KILN_SIM_BANDWIDTH_GBPS")) {
    options.sim.transfer_bytes_per_second = nonNegativeVariable("KILN_SIM_BANDWIDTH_GBPS", v) * 1e9;
  }
  if (const char* v = get("KILN_SIM_THREADS")) {
    const uint64_t threads = unsignedVariable("KILN_SIM_THREADS", v, 4096);
    if (threads == 0) badValue("KILN_SIM_THREADS", "a whole number from 1 to 4096", v);
    options.sim.compute_threads = static_cast<uint32_t>(threads);
  }
  if (const char* v = get("KILN_SIM_FAULTS")) options.sim.fault_script = faultScriptVariable("KILN_SIM_FAULTS", v);
  if (const char* v = get("KILN_SIM_FAULT_RATE")) faultRateVariable("KILN_SIM_FAULT_RATE", v, options.sim.fault_rates);
  if (const char* v = get("KILN_SIM_FAULT_SEED")) {
    options.sim.fault_seed = unsignedVariable("KILN_SIM_FAULT_SEED", v, UINT64_MAX);
  }
  if (const char* v = get("KILN_CUDA_GRAPHS")) options.cuda.graphs = unsignedVariable("KILN_CUDA_GRAPHS", v, 1) == 1;
  if (const char* v = get("KILN_CUDA_FAULTS")) options.cuda.fault_script = faultScriptVariable("KILN_CUDA_FAULTS", v);
  if (const char* v = get("KILN_CUDA_ILLEGAL_ADDRESS")) {
    for (std::string_view item : splitList(v)) {
      uint64_t job = 0;
      if (!parseUnsigned(item, &job)) badValue("KILN_CUDA_ILLEGAL_ADDRESS", "compute job numbers like '3,7'", item);
      options.cuda.illegal_address_at_jobs.push_back(job);
    }
  }
  options.lock_dir = DeviceLock::defaultDirectory();  // reads KILN_DEVICE_LOCK_DIR
  return options;
}

DeviceManager::DeviceManager(DeviceManagerOptions options) : options_(std::move(options)) {
  if (options_.lock_dir.empty()) options_.lock_dir = DeviceLock::defaultDirectory();
}

DeviceManager::~DeviceManager() = default;

std::vector<DeviceInfo> DeviceManager::devices() const {
  std::vector<DeviceInfo> all;
  all.push_back(CpuDevice::describe());
  for (uint32_t i = 0; i < options_.sim_devices; ++i) all.push_back(SimDevice::describe(i, simConfig(options_, i)));
  for (DeviceInfo& gpu : cudaDevices()) all.push_back(std::move(gpu));
  return all;
}

namespace {

// Makes device `index` of `kind` (sim or cuda), owning `lock`.
std::shared_ptr<Device> makeLockedDevice(const DeviceManagerOptions& options, DeviceKind kind, uint32_t index,
                                         std::unique_ptr<DeviceLock> lock) {
#if KILN_HAVE_CUDA
  if (kind == DeviceKind::kCuda) return std::make_shared<CudaDevice>(index, options.cuda, std::move(lock));
#endif
  (void)kind;
  return std::make_shared<SimDevice>(index, simConfig(options, index), std::move(lock));
}

// Tries each device of `kind` (sim or cuda) in `indices` in order, waiting
// as `wait` says. `what` names the request in the busy message ("sim
// device", "sim:1").
std::shared_ptr<Device> attachLocked(const DeviceManagerOptions& options, DeviceKind kind,
                                     const std::vector<uint32_t>& indices, const std::string& what,
                                     const DeviceWaitConfig& wait) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (uint32_t index : indices) {
      const std::string id = fmt::format("{}:{}", deviceKindName(kind), index);
      if (std::unique_ptr<DeviceLock> lock = DeviceLock::tryAcquire(options.lock_dir, id)) {
        return makeLockedDevice(options, kind, index, std::move(lock));
      }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::chrono::milliseconds pause = std::max(wait.sleep, std::chrono::milliseconds(1));
    bool give_up = wait.strategy == WaitStrategy::kNoWait;
    if (wait.strategy == WaitStrategy::kWaitWithTimeout) {
      if (waited >= wait.timeout) {
        give_up = true;
      } else {
        pause = std::min(pause, wait.timeout - waited);  // the last try falls on the timeout
      }
    }
    if (give_up) {
      std::vector<std::string> holders;
      for (uint32_t index : indices) {
        const std::string id = fmt::format("{}:{}", deviceKindName(kind), index);
        holders.push_back(fmt::format("{} is attached by {}", id, DeviceLock::describeHolder(options.lock_dir, id)));
      }
      const std::string waiting = wait.strategy == WaitStrategy::kNoWait
                                      ? fmt::format("did not wait ({})", strategyName(wait.strategy))
                                      : fmt::format("waited {} ms ({})", waited.count(), strategyName(wait.strategy));
      throw DeviceBusyError(fmt::format("no free {}: {}; {}", what, fmt::join(holders, ", "), waiting));
    }
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace

std::shared_ptr<Device> DeviceManager::getDevice(const Target& target, const DeviceConstraints& constraints,
                                                 const DeviceWaitConfig& wait) {
  const std::vector<DeviceKind> runnable = kindsFor(target.device_kind);
  const DeviceKind kind = constraints.kind.value_or(runnable.front());
  if (std::find(runnable.begin(), runnable.end(), kind) == runnable.end()) {
    throw UsageError(fmt::format("a '{}' package cannot run on a {} device", target.device_kind, deviceKindName(kind)));
  }
  if (target.num_devices != 1) {
    throw UsageError(fmt::format("the package asks for {} devices per replica; kiln runs a replica on one device",
                                 target.num_devices));
  }

  const std::vector<DeviceInfo> gpus = kind == DeviceKind::kCuda ? cudaDevices() : std::vector<DeviceInfo>{};
  if (kind == DeviceKind::kCuda && gpus.empty()) {
    throw UsageError("no cuda device on this machine: CUDA sees no GPU (is the NVIDIA driver loaded?)");
  }
  const DeviceInfo info = kind == DeviceKind::kCpu   ? CpuDevice::describe(constraints.cpu_threads)
                          : kind == DeviceKind::kSim ? SimDevice::describe(0, options_.sim)
                                                     : gpus.front();
  if (kind == DeviceKind::kSim && options_.sim_devices == 0) {
    throw UsageError("no sim device on this machine: set KILN_SIM_DEVICES or DeviceManagerOptions::sim_devices");
  }
  std::vector<std::string> missing;
  for (const std::string& feature : target.features) {
    if (std::find(info.features.begin(), info.features.end(), feature) == info.features.end()) {
      missing.push_back(feature);
    }
  }
  if (!missing.empty()) {
    throw UsageError(fmt::format("the package needs the features [{}], which the {} devices of this machine lack (they "
                                 "have [{}])",
                                 fmt::join(missing, ", "), deviceKindName(kind), fmt::join(info.features, ", ")));
  }
  if (constraints.min_memory_bytes > info.memory_bytes) {
    throw UsageError(fmt::format("asked for a {} device with at least {} of memory; the {} devices have {}",
                                 deviceKindName(kind), di::humanBytes(constraints.min_memory_bytes),
                                 deviceKindName(kind), di::humanBytes(info.memory_bytes)));
  }

  if (kind == DeviceKind::kCpu) return std::make_shared<CpuDevice>(constraints.cpu_threads);
  const size_t count = kind == DeviceKind::kSim ? options_.sim_devices : gpus.size();
  std::vector<uint32_t> indices(count);
  for (uint32_t i = 0; i < count; ++i) indices[i] = i;
  return attachLocked(options_, kind, indices, fmt::format("{} device", deviceKindName(kind)), wait);
}

std::shared_ptr<Device> DeviceManager::getSpecificDevice(const std::string& id, const DeviceWaitConfig& wait) {
  if (id == "cpu") return std::make_shared<CpuDevice>();
  uint64_t index = 0;
  if (id.rfind("sim:", 0) == 0 && parseUnsigned(std::string_view(id).substr(4), &index) &&
      index < options_.sim_devices && id == fmt::format("sim:{}", index)) {
    return attachLocked(options_, DeviceKind::kSim, {static_cast<uint32_t>(index)}, id, wait);
  }
  if (id.rfind("cuda:", 0) == 0 && parseUnsigned(std::string_view(id).substr(5), &index) &&
      index < cudaDevices().size() && id == fmt::format("cuda:{}", index)) {
    return attachLocked(options_, DeviceKind::kCuda, {static_cast<uint32_t>(index)}, id, wait);
  }
  std::vector<std::string> ids;
  for (const DeviceInfo& info : devices()) ids.push_back(info.id);
  throw UsageError(fmt::format("unknown device '{}': this machine has {}", id, fmt::join(ids, ", ")));
}

}  // namespace kiln
