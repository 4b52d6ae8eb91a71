// DynamicExecutor: runs packages whose shapes are only known at run time.
//
// A graph package (src/format/graph_package.h) holds the model's graph
// rather than a step program. Each call's *signature* is the shape of every
// input plus the values of the package's shape inputs (those a shape is
// read from, such as a Reshape's target). The first call with a signature
// compiles the graph for it in memory (every pass, the memory plan, kernels
// prepared: about a millisecond for small models, up to a second for large
// ones) and keeps the result in a bounded least-recently-used cache; later
// calls with that signature run it straight away, without compiling or
// touching the heap.
//
// Memory follows the "standard resizing" strategy of PyTorch Static
// Runtime's planner: every specialization plans its own offsets, but they
// all share one arena, which grows to the largest plan seen and never
// shrinks by itself. shrink() gives it back, with the cached plans, when a
// burst of large inputs is over. Warm-up advice: before serving, run one
// call with each signature you expect, the largest first, so that no
// request pays for a compile or an arena growth.
//
// Devices: a package compiled with `--target cuda --dynamic` runs on a GPU.
// Each specialization is compiled for cuda, its constants uploaded once, the
// arena is device memory, and a call copies its inputs in and its outputs
// back (the caller's buffers are host memory, as for the host). A device
// error reaches the caller in error.h's classes; one that leaves the device
// failed resets it and forgets the cached plans (the next call compiles
// again).
//
// Thread safety: one call at a time per DynamicExecutor (calls share the
// arena and the cache); memoryStats() may be read from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/executor.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct DynamicExecutorOptions {
  int threads = 0;                  // as ExecutorOptions::threads
  size_t plan_cache_capacity = 16;  // specializations kept; at least 1
  bool channels_last = true;        // as CompileOptions::channels_last (cpu packages)
  bool flush_denormals = true;      // as ExecutorOptions::flush_denormals
  bool check_plugin_hash = true;    // as ExecutorOptions::check_plugin_hash
  // A cuda package's GPU (a cuda Device from DeviceManager, held for this
  // executor alone); null: the executor attaches a free one itself.
  std::shared_ptr<Device> device = nullptr;
};

// Where DynamicExecutor::run writes output `index` once its shape is known:
// at least info.sizeInBytes() bytes, owned by the caller.
using OutputAllocator = std::function<std::byte*(size_t index, const TensorInfo& info)>;

struct DynamicMemoryStats {
  uint64_t arena_bytes = 0;  // the shared arena's current size
  uint64_t plan_cache_hits = 0;    // run() calls whose plan an earlier call compiled
  uint64_t plan_cache_misses = 0;  // signatures compiled
  uint64_t plan_cache_evictions = 0;
  size_t cached_plans = 0;
};

// Whether model `model` (empty: the only one) of `package` has shapes known
// only at run time, and so runs with DynamicExecutor rather than Executor.
bool hasRuntimeShapes(const std::filesystem::path& package, const std::string& model = "");

class DynamicExecutor {
 public:
  // Loads model `model` (empty: the package's only model). UsageError when
  // it is not a graph package (run those with Executor).
  explicit DynamicExecutor(const std::filesystem::path& package, const std::string& model = "",
                           const DynamicExecutorOptions& options = {});
  ~DynamicExecutor();
  DynamicExecutor(const DynamicExecutor&) = delete;
  DynamicExecutor& operator=(const DynamicExecutor&) = delete;

  // The model's inputs and outputs as declared: unknown dimensions are
  // kDynamicDim (an output's rank may be unknown too: empty shape).
  const std::vector<TensorSlot>& inputs() const;
  const std::vector<TensorSlot>& outputs() const;
  // Names of the inputs whose values are part of the signature.
  const std::vector<std::string>& shapeInputs() const;

  // The outputs (static shapes) of a call with these inputs, compiling the
  // specialization on a cache miss. `inputs[i]` holds input_infos[i]'s
  // bytes; only the shape inputs' bytes are read here. UsageError when the
  // output shapes depend on values the model computes (a Loop that stops
  // early; see src/compiler/runtime_shapes.h): run such a model with an
  // OutputAllocator.
  const std::vector<TensorSlot>& outputsFor(std::span<const TensorInfo> input_infos,
                                            std::span<const std::byte* const> inputs);

  // Runs one call: `outputs[i]` has room for outputsFor(...)[i].
  // `trace`, when given, receives the call's step events (Executor::runTraced).
  void run(std::span<const TensorInfo> input_infos, std::span<const std::byte* const> inputs,
           std::span<std::byte* const> outputs, StepTrace* trace = nullptr);

  // Runs one call of any model: each output's memory is asked of `allocate`
  // as soon as its shape is known (for a model whose shapes depend on values
  // it computes, after the part of the model that computes them has run).
  // Such a model runs in stages, each specialized on what the one before
  // gave; the stages' plans are cached like the model's.
  void run(std::span<const TensorInfo> input_infos, std::span<const std::byte* const> inputs,
           const OutputAllocator& allocate, StepTrace* trace = nullptr);

  DynamicMemoryStats memoryStats() const;

  // Frees the arena and forgets every cached specialization; the next call
  // compiles again and allocates what it needs.
  void shrink();

  // The implementation (dynamic_executor.cc); public only so that a staged
  // model's stages, which are Impls of their own, can hold one another.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
