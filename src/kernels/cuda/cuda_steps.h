// What the executor needs from the CUDA side beyond the kernels
// themselves, in a header without CUDA types (the executor is plain C++):
//   - host steps: a step with no cuda kernel runs its CPU kernel on the
//     host, in stream order (cudaLaunchHostFunc), its device inputs copied
//     to pinned host memory before and its outputs copied back after;
//   - program graphs: a whole program captured once as a CUDA graph per set
//     of call buffers, then replayed with one launch;
//   - control flow's memory: If, Loop and Scan move and read device memory
//     through a ViewMemory ordered on the queue's stream.
// Defined in builds with KILN_CUDA only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "kernels/kernel.h"
#include "kernels/view_memory.h"

namespace kiln::cuda {

// Prepares CPU kernel `cpu` to run as a host step. `setup.constants` are
// host bytes; the state copies what it needs of them.
std::unique_ptr<KernelState> prepareOnHost(const KernelDef& cpu, const KernelSetup& setup);
void runOnHost(const KernelCall& call);

// Makes the queue's GPU current on the calling thread (before kernels are
// prepared: some allocate device memory).
void useQueueDevice(void* queue);

// Waits for everything queued on `queue` (a CudaQueue); throws UsageError
// with CUDA's message on an error. For per-step timing, never in run().
void synchronizeQueue(void* queue);

// Control flow's view memory on `queue`'s device (view_memory.cc). A
// program that uses it waits for the stream at each condition it reads, so
// it is never captured as a CUDA graph.
std::unique_ptr<ViewMemory> createViewMemory(void* queue);

// Up to `capacity` captured graphs, keyed by the call's buffer addresses;
// the least recently used one goes when a new key comes.
class ProgramGraphs {
 public:
  ProgramGraphs(void* queue, size_t capacity);
  ~ProgramGraphs();
  ProgramGraphs(const ProgramGraphs&) = delete;
  ProgramGraphs& operator=(const ProgramGraphs&) = delete;

  // Replays the graph captured for `key`; when there is none, captures one
  // by calling launch(context) (which queues the program on the queue's
  // stream), then replays it. Allocates only when it captures. Returns
  // whether it captured (launch ran).
  bool run(std::span<const void* const> key, void (*launch)(void* context), void* context);
  size_t captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
