// Device: where an executable runs, and DeviceManager, which finds one.
//
// Three kinds of device:
//   cpu   the host's cores. Its memory is host memory, so user buffers are
//         used in place and jobs run on the thread that submits them. Not
//         locked: any number of processes share the CPU, as the OS does.
//   sim   a simulated accelerator on the host, for testing every device code
//         path: its own memory space with a capacity limit, explicit
//         host<->device transfers done by a transfer thread with configured
//         latency and bandwidth, kernels run on its own worker thread, and
//         injectable faults of every error class (error.h). Attached
//         exclusively, also across processes (a lock file per device).
//   cuda  an NVIDIA GPU (builds with KILN_CUDA): device memory from
//         cudaMalloc, copies on a copy stream, kernels on a compute stream
//         (replayed as CUDA graphs), CUDA errors mapped onto the error
//         classes of error.h (runtime/cuda_device.h). Attached exclusively
//         like sim.
//
// Work is submitted as DeviceJobs: copies run in submission order on the
// transfer thread, computes in submission order on the compute worker, and
// each job's `done` is called exactly once on a device thread. Ordering
// between a copy and a compute is the submitter's business (submit the
// compute from the copy's `done`). Jobs are plain structs the caller owns
// and reuses, so that steady-state execution allocates nothing.
//
// Thread safety: Device::submit, allocate, memoryInUse and the accessors
// may be called from any thread. reset() and synchronize() wait for queued
// work and must not be called from a device thread (inside `done`).
// DeviceManager is safe to use from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/metadata.h"

namespace kiln {

enum class DeviceKind : uint8_t { kCpu, kSim, kCuda };

const char* deviceKindName(DeviceKind kind);  // "cpu", "sim", "cuda"
// Throws UsageError for an unknown name.
DeviceKind parseDeviceKind(const std::string& name);

struct DeviceInfo {
  std::string id;  // "cpu", "sim:0", "sim:1", ...
  DeviceKind kind = DeviceKind::kCpu;
  uint64_t memory_bytes = 0;     // capacity of the device's memory
  uint32_t compute_threads = 1;  // threads a kernel may use on it
  std::vector<std::string> features;
  // Transfers (sim): each copy takes latency + bytes / bandwidth.
  uint64_t transfer_latency_ns = 0;
  double transfer_bytes_per_second = 0;  // 0: unlimited
};

// One unit of device work. The submitter owns the job, fills it, and neither
// touches nor frees it until `done` has been called.
struct DeviceJob {
  enum class Kind : uint8_t { kCopyToDevice, kCopyToHost, kCompute };
  Kind kind = Kind::kCompute;
  // Copies: `bytes` bytes from `source` to `destination`. For
  // kCopyToDevice the destination is device memory (DeviceBuffer::data()),
  // for kCopyToHost the source is.
  std::byte* destination = nullptr;
  const std::byte* source = nullptr;
  uint64_t bytes = 0;
  // Compute: runs compute(context) on the device's worker; it may throw.
  void (*compute)(void* context) = nullptr;
  void* context = nullptr;
  // Called once when the job has finished, on a device thread (on the
  // submitting thread for cpu). `error` is null on success; otherwise a
  // DeviceError: the one compute threw, an ApplicationRuntimeError carrying
  // the message of any other exception it threw, or the DeviceError of an
  // injected fault or of a device that needs a reset.
  void (*done)(DeviceJob& job, std::exception_ptr error) = nullptr;
  void* owner = nullptr;  // free for the submitter (to find its state in `done`)
};

class Device;

// A block of one device's memory, 64-byte aligned. Move-only; gives the
// memory back to its device when destroyed (the device must outlive it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, std::byte* data, uint64_t size) : device_(device), data_(data), size_(size) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  // A device address: only kernels on the device and copy jobs may use it
  // (for sim it is host memory that the host must not touch directly).
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  Device* device_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  const std::string& id() const { return info_.id; }

  // True when the device works on host memory directly (cpu): callers may
  // bind user buffers to programs in place and skip transfers.
  virtual bool usesHostMemory() const = 0;

  // Allocates `bytes` (at least 1) of device memory, contents unspecified.
  // Throws RecoverableDeviceError (action kRerun: it may succeed once memory
  // is freed) naming the device, the request, what is in use and the
  // capacity when the memory space is full.
  virtual DeviceBuffer allocate(uint64_t bytes) = 0;
  virtual uint64_t memoryInUse() const = 0;

  // What the device's kernels launch on, handed to them with each step
  // (cuda: its kernels/cuda/cuda_queue.h CudaQueue); null for cpu and sim.
  virtual void* kernelQueue() const { return nullptr; }

  // Queues `job` (see DeviceJob). Never blocks for long: the queues hold
  // at least kMinQueuedJobs jobs before a submit waits for room.
  static constexpr size_t kMinQueuedJobs = 256;
  virtual void submit(DeviceJob& job) = 0;

  // Waits until every job submitted so far has called `done`.
  virtual void synchronize() = 0;

  // Waits for queued work, then brings a failed device back: clears the
  // failed state and any pending fault of the reset classes. The contents
  // of device memory are lost (sim overwrites every buffer with the byte
  // 0xCD, so that a caller that forgets to reload its weights sees garbage);
  // buffers stay allocated.
  virtual void reset() = 0;

  // Resets so far; compute jobs finished so far (failed ones included).
  uint64_t resetCount() const { return resets_.load(std::memory_order_relaxed); }
  uint64_t computeJobs() const { return compute_jobs_.load(std::memory_order_relaxed); }

 protected:
  explicit Device(DeviceInfo info) : info_(std::move(info)) {}
  friend class DeviceBuffer;
  // Gives back memory that allocate() returned.
  virtual void release(std::byte* data, uint64_t bytes) noexcept = 0;

  DeviceInfo info_;
  std::atomic<uint64_t> resets_{0};
  std::atomic<uint64_t> compute_jobs_{0};
};

// The error classes a sim device can inject into compute jobs.
enum class FaultKind : uint8_t {
  kApplicationError,  // ApplicationRuntimeError; the device needs a reset
  kRecoverableReset,  // RecoverableDeviceError, kDeviceReset; needs a reset
  kRecoverableRerun,  // RecoverableDeviceError, kRerun; only this job fails
  kUnknown,           // UnknownDeviceError; the device needs a reset
  kRecoverableRestart,  // RecoverableDeviceError, kRestartProcess: the device
                        // fails every later job, and reset() fails too
};
inline constexpr size_t kFaultKinds = 5;
const char* faultKindName(FaultKind kind);  // "app", "reset", "rerun", "unknown", "restart"

// Makes compute job number `at_job` (0-based, counting every compute job
// the device has run since it was created) fail with `kind`.
struct ScriptedFault {
  uint64_t at_job = 0;
  FaultKind kind = FaultKind::kApplicationError;
};

// Faults injected into a device's compute jobs (sim always; cuda when the
// test configuration asks). Until reset(), a device that failed with
// kApplicationError, kRecoverableReset or kUnknown fails every later compute
// job with the same error class ("sim:0 needs a reset after: ..."); after
// kRecoverableRestart, reset() throws it again and the device stays failed
// (as a GPU whose CUDA context an illegal address corrupted).
struct FaultConfig {
  // Probability that a compute job fails, per fault kind, drawn from a
  // generator seeded with fault_seed (so runs repeat).
  double fault_rates[kFaultKinds] = {};
  uint64_t fault_seed = 1;
  std::vector<ScriptedFault> fault_script;
};

struct SimDeviceConfig : FaultConfig {
  uint64_t memory_bytes = 256ull << 20;
  uint64_t transfer_latency_ns = 0;
  double transfer_bytes_per_second = 0;  // 0: unlimited
  uint32_t compute_threads = 1;
};

// cuda devices (built with CUDA, on a machine with an NVIDIA GPU).
struct CudaDeviceConfig : FaultConfig {
  // Replay the main program as one CUDA graph (captured on the first run
  // with a given set of buffers) instead of launching its kernels one by one.
  bool graphs = true;
  // Compute jobs (numbered as ScriptedFault::at_job) after whose kernels
  // the device launches one that writes through a wild pointer: a real
  // illegal address, which corrupts the CUDA context, to test what follows.
  std::vector<uint64_t> illegal_address_at_jobs;
};

struct DeviceManagerOptions {
  uint32_t sim_devices = 0;
  SimDeviceConfig sim;  // for every sim device
  // When not empty, sim device i's configuration (devices past its end use
  // `sim`): a fault on one replica's device only, say.
  std::vector<SimDeviceConfig> sim_each;
  CudaDeviceConfig cuda;  // for every cuda device
  // Where the per-device lock files live.
  std::filesystem::path lock_dir;

  // From the environment:
  //   KILN_SIM_DEVICES=N            number of sim devices (default 0)
  //   KILN_SIM_MEMORY=256M          capacity (suffixes K, M, G)
  //   KILN_SIM_LATENCY_US=50        per-transfer latency
  //   KILN_SIM_BANDWIDTH_GBPS=10    transfer bandwidth, GB/s (0: unlimited)
  //   KILN_SIM_THREADS=1            kernel threads
  //   KILN_SIM_FAULTS=app@3,reset@10,rerun@12,unknown@20,restart@30   scripted faults
  //   KILN_SIM_FAULT_RATE=reset=0.01,app=0.001             fault rates
  //   KILN_SIM_FAULT_SEED=1
  //   KILN_DEVICE_LOCK_DIR=/path    (default /tmp/kiln-devices-<uid>)
  //   KILN_CUDA_GRAPHS=0            launch kernels one by one (default 1)
  //   KILN_CUDA_FAULTS=...          scripted faults on cuda devices, as KILN_SIM_FAULTS
  //   KILN_CUDA_ILLEGAL_ADDRESS=3,7 real illegal addresses after those compute jobs
  // Throws UsageError naming the variable on a malformed value.
  static DeviceManagerOptions fromEnvironment();
};

enum class WaitStrategy : uint8_t { kNoWait, kWaitWithTimeout, kWaitForever };

// What getDevice does when every suitable device is attached elsewhere:
// fail at once, retry every `sleep` until `timeout`, or retry forever.
struct DeviceWaitConfig {
  WaitStrategy strategy = WaitStrategy::kNoWait;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds sleep{50};
};

// Narrows the choice beyond what the package's Target asks for.
struct DeviceConstraints {
  // Run on this kind instead of the target's ("cpu" packages run on sim).
  std::optional<DeviceKind> kind;
  uint64_t min_memory_bytes = 0;
  // cpu: the kernel threads of the device (0: all cores); replicas use it
  // to split the cores between them.
  uint32_t cpu_threads = 0;
};

class DeviceManager {
 public:
  explicit DeviceManager(DeviceManagerOptions options = DeviceManagerOptions::fromEnvironment());
  ~DeviceManager();

  // Every device of this machine, attached or not: "cpu", then the sim
  // devices (and cuda ones when built with CUDA).
  std::vector<DeviceInfo> devices() const;

  // Attaches a free device that can run `target` (kind, features) and meets
  // `constraints`. When every suitable device is busy, waits as `wait`
  // says, then throws DeviceBusyError naming the devices and who holds them
  // (pid). Throws UsageError when no device of this machine could ever
  // serve (none of that kind, not enough memory, missing features). The
  // device stays attached while the returned pointer lives.
  std::shared_ptr<Device> getDevice(const Target& target, const DeviceConstraints& constraints = {},
                                    const DeviceWaitConfig& wait = {});

  // Attaches the device with this id ("cpu", "sim:1"), waiting as above.
  std::shared_ptr<Device> getSpecificDevice(const std::string& id, const DeviceWaitConfig& wait = {});

  const DeviceManagerOptions& options() const { return options_; }

 private:
  DeviceManagerOptions options_;
};

}  // namespace kiln
