#include "plugins/replica_all_reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "kiln/error.h"
#include "kiln/plugin.h"
#include "kiln/plugins.h"
#include "kiln/training.h"

namespace kiln {
namespace {

thread_local ReplicaGroup* current_group = nullptr;
thread_local uint32_t current_replica = 0;

int fail(char* error, size_t capacity, const std::string& message) {
  if (capacity > 0) {
    const size_t n = std::min(message.size(), capacity - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

int inferSame(const void*, const KilnTensorType* inputs, int32_t, KilnTensorType* outputs, int32_t, char* error,
              size_t capacity) {
  if (inputs[0].dtype != KILN_DTYPE_FLOAT) return fail(error, capacity, "the replicas' all-reduce takes float32");
  outputs[0] = inputs[0];
  return 0;
}

int computeMean(const void*, const KilnTensor* inputs, int32_t, KilnTensor* outputs, int32_t, void*, uint64_t,
                char* error, size_t capacity) {
  size_t count = 1;
  for (int32_t d = 0; d < inputs[0].rank; ++d) count *= static_cast<size_t>(inputs[0].dims[d]);
  const auto* input = static_cast<const float*>(inputs[0].data);
  auto* output = static_cast<float*>(outputs[0].data);
  if (current_group == nullptr) {  // one replica: its own values
    if (output != input) std::memcpy(output, input, count * sizeof(float));
    return 0;
  }
  try {
    current_group->allReduceMean(current_replica, input, output, count);
  } catch (const Error& e) {
    return fail(error, capacity, e.what());
  }
  return 0;
}

}  // namespace

ReplicaGroup::ReplicaGroup(uint32_t replicas) : inputs_(replicas), outputs_(replicas), counts_(replicas) {}

void ReplicaGroup::arriveAndWait(std::unique_lock<std::mutex>& lock) {
  if (aborted_) throw UsageError("another replica failed: this step's all-reduce was abandoned");
  const uint64_t generation = generation_;
  if (++waiting_ == size()) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) throw UsageError("another replica failed: this step's all-reduce was abandoned");
}

void ReplicaGroup::allReduceMean(uint32_t replica, const float* input, float* output, size_t count) {
  std::unique_lock lock(mutex_);
  inputs_[replica] = input;
  outputs_[replica] = output;
  counts_[replica] = count;
  arriveAndWait(lock);
  for (size_t r = 0; r < size(); ++r) {
    if (counts_[r] != count) {
      throw UsageError(fmt::format("replicas all-reduce {} and {} values", counts_[r], count));
    }
  }
  lock.unlock();
  // Each replica averages its own share of the elements into every
  // replica's output: shares are disjoint, and inputs are only read.
  const size_t begin = count * replica / size(), end = count * (replica + 1) / size();
  const auto scale = 1.0f / static_cast<float>(size());
  for (size_t i = begin; i < end; ++i) {
    float sum = 0;
    for (size_t r = 0; r < size(); ++r) sum += inputs_[r][i];
    const float mean = sum * scale;
    for (size_t r = 0; r < size(); ++r) outputs_[r][i] = mean;
  }
  lock.lock();
  arriveAndWait(lock);  // no replica returns (and reuses its buffers) before all shares are written
}

void ReplicaGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

void ReplicaGroup::reset() {
  std::lock_guard lock(mutex_);
  aborted_ = false;
  waiting_ = 0;
}

ReplicaScope::ReplicaScope(ReplicaGroup* group, uint32_t replica)
    : previous_group_(current_group), previous_replica_(current_replica) {
  current_group = group;
  current_replica = replica;
}

ReplicaScope::~ReplicaScope() {
  current_group = previous_group_;
  current_replica = previous_replica_;
}

void registerReplicaAllReduce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string full = kReplicaAllReduce;
    static const std::string domain = full.substr(0, full.rfind('.'));
    static const std::string name = full.substr(full.rfind('.') + 1);
    KilnOp op{};
    op.struct_size = sizeof(KilnOp);
    op.domain = domain.c_str();
    op.name = name.c_str();
    op.since_version = 1;
    op.min_inputs = op.max_inputs = 1;
    op.min_outputs = op.max_outputs = 1;
    op.infer = &inferSame;
    op.compute = &computeMean;
    registerHostOp(op);
  });
}

}  // namespace kiln
