// The kernel interface: how the executor calls an operator implementation.
//
// Kernels are destination-passing: the executor hands them views of their
// inputs and of pre-planned output memory, and they write their results
// there. A kernel never allocates while it runs.
//
// Each kernel has two functions:
//   prepare  once, when an executable is loaded: sees the step's parameters
//            (the node's attributes), the static TensorInfos of its inputs
//            and outputs, and the bytes of inputs that are constants (so that
//            weights can be reordered or packed once). It validates all of
//            it, throwing UsageError with a clear message on anything it
//            cannot run ("Conv: no kernel for i8 inputs"), picks the variant
//            (dtype, fast path) and returns the state `run` needs.
//   run      per call: reads `inputs`, writes `outputs`. Must not throw,
//            allocate or keep pointers past the call.
//
// Thread safety: prepare is called from one thread; run may be called
// concurrently on different calls' memory with the same (const) state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/param_map.h"
#include "kiln/error.h"
#include "kiln/tensor_info.h"

namespace kiln {

// A dense, row-major tensor in memory.
struct TensorView {
  std::byte* data = nullptr;
  DType dtype = DType::kUndefined;
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  uint64_t numElements() const {
    uint64_t n = 1;
    for (uint32_t i = 0; i < rank; ++i) n *= static_cast<uint64_t>(dims[i]);
    return n;
  }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
};

// Makes a view of `info` (static shape) at `data`.
TensorView viewOf(const TensorInfo& info, std::byte* data);

// Per-step state built by prepare and read by run.
class KernelState {
 public:
  virtual ~KernelState() = default;
};

struct KernelSetup {
  const ParamMap& params;
  std::span<const TensorInfo> inputs;   // an omitted optional input has dtype kUndefined
  std::span<const TensorInfo> outputs;
  // For each input, its bytes when it is a constant of the executable, else
  // nullptr. Always host memory the kernel may read, also on a device
  // whose views point at device memory.
  std::span<const std::byte* const> constants;
  // What the kernel will launch on: null for cpu kernels; for cuda ones the
  // device's cuda::CudaQueue (kernels/cuda/cuda_queue.h).
  void* queue = nullptr;
};

struct KernelCall {
  const TensorView* inputs;  // an omitted optional input has data == nullptr
  uint32_t input_count;
  TensorView* outputs;
  uint32_t output_count;
  const KernelState* state;
  void* queue = nullptr;  // as KernelSetup::queue
};

// Thrown by a device kernel's prepare for a variant it does not run (a
// dtype, an attribute): the executor then runs the CPU kernel on the host
// for that step instead.
class KernelUnsupported : public UsageError {
 public:
  using UsageError::UsageError;
};

using PrepareKernel = std::unique_ptr<KernelState> (*)(const KernelSetup& setup);
using RunKernel = void (*)(const KernelCall& call);

struct KernelDef {
  std::string name;  // the operator: "Relu", "com.example.MyOp"
  PrepareKernel prepare;
  RunKernel run;
};

// Kernels by name. The CPU kernels register in KernelRegistry::cpu(), the
// CUDA ones (builds with KILN_CUDA) in KernelRegistry::cuda(), which is
// empty in other builds. A cuda kernel's run only queues work on its
// queue's stream (it may be captured into a CUDA graph): no synchronous
// CUDA call, no allocation.
class KernelRegistry {
 public:
  static const KernelRegistry& cpu();
  static const KernelRegistry& cuda();

  void add(KernelDef def);
  const KernelDef* find(std::string_view name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, KernelDef, std::less<>> kernels_;
};

}  // namespace kiln
