// ProgramGraphs (cuda_steps.h): a program captured once as a CUDA graph,
// then replayed with a single cudaGraphLaunch, per set of call buffers.
//
// Why: a model of a few hundred small kernels spends more time launching
// them one by one than running them at batch 1; a graph launches them all
// at once and lets the GPU run them back to back. The graph records the
// buffer addresses of the call it was captured with, so a call with other
// buffers needs a graph of its own; a ModelRunner cycles through a few
// (its pipeline depth), so a small cache holds them all.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/cuda_steps.h"

namespace kiln::cuda {

struct ProgramGraphs::Impl {
  struct Entry {
    std::vector<const void*> key;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_used = 0;
  };
  const CudaQueue* queue = nullptr;
  size_t capacity = 0;
  std::vector<Entry> entries;
  uint64_t clock = 0;

  ~Impl() {
    for (Entry& entry : entries) cudaGraphExecDestroy(entry.exec);
  }

  Entry* find(std::span<const void* const> key) {
    for (Entry& entry : entries) {
      if (std::equal(entry.key.begin(), entry.key.end(), key.begin(), key.end())) return &entry;
    }
    return nullptr;
  }

  Entry& capture(std::span<const void* const> key, void (*launch)(void*), void* context) {
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(queue->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      launch(context);
    } catch (...) {
      cudaStreamEndCapture(queue->stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(queue->stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(status, "cudaGraphInstantiate");
    if (entries.size() == capacity) {
      auto oldest = std::min_element(entries.begin(), entries.end(),
                                     [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
      cudaGraphExecDestroy(oldest->exec);
      entries.erase(oldest);
    }
    entries.push_back(Entry{std::vector<const void*>(key.begin(), key.end()), exec, 0});
    return entries.back();
  }
};

ProgramGraphs::ProgramGraphs(void* queue, size_t capacity) : impl_(std::make_unique<Impl>()) {
  impl_->queue = &queueOf(queue);
  impl_->capacity = std::max<size_t>(capacity, 1);
  impl_->entries.reserve(impl_->capacity);
}

ProgramGraphs::~ProgramGraphs() = default;

bool ProgramGraphs::run(std::span<const void* const> key, void (*launch)(void* context), void* context) {
  Impl& m = *impl_;
  Impl::Entry* entry = m.find(key);
  const bool captured = entry == nullptr;
  if (captured) entry = &m.capture(key, launch, context);
  entry->last_used = ++m.clock;
  check(cudaGraphLaunch(entry->exec, m.queue->stream), "cudaGraphLaunch");
  return captured;
}

size_t ProgramGraphs::captured() const { return impl_->entries.size(); }

}  // namespace kiln::cuda
