// Data-parallel training across the replicas of one HostSession: the op
// kReplicaAllReduce (kiln/training.h), a host op of kiln's own, replaces a
// replica's flat gradient buffer by the mean of every replica's, so that
// the replicas apply the same update and their variables stay in step.
//
// A ReplicaGroup joins the replicas of one session; the session runs each
// replica's main program on a thread of its own with that replica's
// ReplicaScope active, and the op finds its group and index through it.
// Without an active scope (one replica, kiln run, a ModelRunner) the op
// copies its input: the mean over one replica.
//
// The mean is summed in replica order 0, 1, ..., so that every replica
// gets the same bits, run after run. The group allocates nothing per call.
//
// Thread safety: allReduceMean is called by the group's replicas at once,
// each from its own thread; abort() from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace kiln {

class ReplicaGroup {
 public:
  explicit ReplicaGroup(uint32_t replicas);

  uint32_t size() const { return static_cast<uint32_t>(inputs_.size()); }

  // Replica `replica`'s call: waits for the others, then writes into each
  // replica's `output` the mean of the replicas' `input` (`count` floats,
  // the same in every replica; UsageError otherwise), and returns once all
  // are written. Throws UsageError after abort().
  void allReduceMean(uint32_t replica, const float* input, float* output, size_t count);

  // A replica failed before reaching the collective: the others stop
  // waiting (and throw) instead of waiting forever. Until reset().
  void abort();
  void reset();

 private:
  // Waits until every replica has arrived at this barrier.
  void arriveAndWait(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable arrived_;
  uint32_t waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const float*> inputs_;
  std::vector<float*> outputs_;
  std::vector<size_t> counts_;
};

// While alive, the op kReplicaAllReduce called on this thread is replica
// `replica` of `group`.
class ReplicaScope {
 public:
  ReplicaScope(ReplicaGroup* group, uint32_t replica);
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

 private:
  ReplicaGroup* previous_group_;
  uint32_t previous_replica_;
};

// Registers kReplicaAllReduce as a host op of this process, once; the
// compiler (for a package that uses it) and HostSession (to run one) call it.
void registerReplicaAllReduce();

}  // namespace kiln
