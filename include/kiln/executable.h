// Executable: one model of a package, deserialised for one device.
//
// It decodes the model's executable and places it on the device: the
// intermediate arena in device memory, and (when the load programs run)
// the load anchors (the weights) copied into device memory, or bound in
// place on a device that works on host memory (cpu). Then runMain() runs
// the main program over device buffers.
//
// Programs: kiln's compiler writes a "load" program (its anchors are the
// weights) and a "main" program (the model's inputs and outputs), and a
// "save" program when the package has variables (kiln compile
// --variables): its anchors read those weights back from the device. A
// device reset loses device memory: run the load programs again before the
// next main.
//
// Thread safety: runLoad/runMain/runSave must not run concurrently with one
// another (the Session serialises them); accessors may run from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/metadata.h"

namespace kiln {

class PackageReader;
class StepTrace;

struct ExecutableOptions {
  // Kernel threads; 0: the device's compute_threads.
  int threads = 0;
  // As ExecutorOptions::flush_denormals.
  bool flush_denormals = true;
  // cuda: replay the main program as CUDA graphs (ExecutorOptions).
  bool cuda_graphs = true;
  // Refuse a plugin library whose bytes differ from the hash the package
  // recorded (docs/plugins.md); the reference runtime's check_package_hash.
  bool check_plugin_hash = true;
};

// The host bytes a load anchor takes its value from; they must outlive the
// load (on cpu, they are used in place and must outlive the Executable).
using LoadSource = std::function<std::span<const std::byte>(const Anchor& anchor)>;
// The host bytes a save anchor's value is copied into (its full size).
using SaveSink = std::function<std::span<std::byte>(const Anchor& anchor)>;

class Executable {
 public:
  // Decodes model `model` of `package` (empty: its only model) for `device`
  // and allocates the arena there. Throws UsageError when the model cannot
  // run on the device (wrong kind, run-time shapes, device memory too small:
  // the message gives what the model needs and what the device has) and
  // FormatError when the executable is malformed.
  Executable(std::shared_ptr<const PackageReader> package, const std::string& model, std::shared_ptr<Device> device,
             const ExecutableOptions& options = {});
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  const std::string& name() const;
  const Metadata& metadata() const;
  const PackageReader& package() const;
  Device& device() const;

  // Anchors of the load programs (weights) and of the main program (the
  // model's inputs and outputs, in the order runMain takes them).
  const std::vector<Anchor>& loadAnchors() const;
  const std::vector<Anchor>& mainInputs() const;
  const std::vector<Anchor>& mainOutputs() const;
  // Anchors of the save programs: the variables, each named as its load
  // anchor. Empty for a package without variables.
  const std::vector<Anchor>& saveAnchors() const;

  // Device memory the executable holds: arena plus weights once loaded.
  uint64_t deviceBytes() const;

  // Runs the load programs: every load anchor's bytes, from `source`, go to
  // the device, then the kernels are prepared (weights packed). Throws
  // UsageError when a source has the wrong size.
  void runLoad(const LoadSource& source);
  bool loaded() const;
  // After Device::reset(): the weights on the device are gone.
  void invalidate();

  // Runs the main program on the calling thread (a device compute job, or
  // any thread for cpu). `inputs` and `outputs` are device addresses in
  // mainInputs()/mainOutputs() order, each holding the anchor's full size.
  // Makes no heap allocation.
  void runMain(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs);
  // Like runMain, and adds one event per step to `trace` (Executor::runTraced;
  // on cuda each step is waited for, so the events time the GPU's work).
  void runMainTraced(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs,
                     StepTrace& trace);
  // Runs the save programs: copies each variable's bytes as they are on the
  // device into `sink` (where the sink's bytes are the device's, on cpu
  // where the weights are used in place, nothing is copied). Throws
  // UsageError before the load programs have run, or when a sink has the
  // wrong size.
  void runSave(const SaveSink& sink);

  // Steps run by the main program so far (control flow counted as run).
  uint64_t stepsRun() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
