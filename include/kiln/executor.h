// Executor: runs the main program of a compiled CPU package.
//
// Loading decodes the executable, binds constants to their TensorData blobs
// in place (zero copy), prepares every kernel once (weights may be packed
// then) and allocates the arena. After that, run() makes no heap
// allocation: a call binds the caller's input and output buffers and walks
// a flat array of steps, each a function pointer with precomputed tensor
// views into the arena.
//
// Thread safety: one run() at a time per Executor (they share the arena);
// the accessors may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln {

class PackageReader;
class StepTrace;
struct ExecutableSpec;

struct TensorSlot {
  std::string name;
  TensorInfo info;
};

// Gives the bytes of an in-memory executable's constant by name; they must
// outlive the executor.
using ConstantBytes = std::function<std::span<const std::byte>(const std::string& name)>;

struct ExecutorOptions {
  // Threads each kernel may use; 0: the process default (OMP_NUM_THREADS, or
  // one per core). Applies to the threads that load and run this executor.
  int threads = 0;
  // Flush denormal floats to zero while the program runs (FTZ and DAZ on
  // the running thread and its kernel threads; the caller's mode comes back
  // after each run). Several times faster on models whose activations
  // underflow; floats below 1.2e-38 are then zero, as results and when read
  // (Ceil of 1e-40 is 0; kernels/cpu/denormals.h). Off: the run keeps the
  // caller's floating-point mode (IEEE denormals by default).
  bool flush_denormals = true;
  // Refuse a plugin library whose bytes differ from the hash the package
  // recorded (docs/plugins.md).
  bool check_plugin_hash = true;
  // The caller owns the arena and hands it over with setArena() before the
  // first run (several executors that never run at the same time can then
  // share one arena; see DynamicExecutor). Off: the executor allocates its
  // own at load.
  bool external_arena = false;
  // Run the steps as cuda kernels (Executable sets these for a cuda device;
  // builds with KILN_CUDA). Then the constants, inputs, outputs and arena
  // are device addresses, `queue` is the device's Device::kernelQueue(),
  // and `host_constants` gives each constant's bytes on the host, for the
  // kernels' prepare (needed only while the executor is built). A step with
  // no cuda kernel runs its CPU kernel on the host, its tensors copied
  // across (slow: `kiln compile --target cuda` reports such steps).
  // Control flow (If, Loop, Scan) runs on the device too; a program with
  // control flow is not captured as a CUDA graph (it reads its conditions
  // on the host).
  bool cuda = false;
  void* queue = nullptr;
  ConstantBytes host_constants{};
  // cuda: replay the whole program as one CUDA graph per set of call
  // buffers (up to 8 sets cached), captured on its first run.
  bool cuda_graphs = true;
};

class Executor {
 public:
  // Loads model `model` (a Metadata name; empty: the package's only model).
  explicit Executor(const std::filesystem::path& package, const std::string& model = "",
                    const ExecutorOptions& options = {});
  // Loads an executable built in memory (run-time shape specialization).
  Executor(ExecutableSpec spec, const ConstantBytes& constants, const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const std::vector<TensorSlot>& inputs() const;
  const std::vector<TensorSlot>& outputs() const;
  uint64_t arenaBytes() const;
  // With ExecutorOptions::external_arena: the arena to use from now on, at
  // least arenaBytes() long and 64-byte aligned.
  void setArena(std::byte* arena);
  size_t stepCount() const;
  // Steps run by all calls so far, sub-programs' included (an If counts
  // the steps of the branch it took, a Loop its body's every iteration).
  uint64_t stepsRun() const;

  // `inputs[i]` holds inputs()[i].info.sizeInBytes() bytes, `outputs[i]` has
  // room for outputs()[i]; the caller keeps them alive during the call.
  void run(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs);

  // Like run(), and adds each step's wall time in nanoseconds to
  // `step_ns[i]` (which has stepCount() entries). Reads the clock twice per
  // step, so use it to find where time goes, not to time the model.
  void runProfiled(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs,
                   std::span<uint64_t> step_ns);

  // Like run(), and appends one event per step (kernel, output, shapes,
  // start and duration) and one for the whole run to `trace`.
  void runTraced(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs, StepTrace& trace);

  // What step `index` runs: its kernel name and the shape of its first output.
  std::string stepDescription(size_t index) const;
  const std::string& stepKernel(size_t index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
