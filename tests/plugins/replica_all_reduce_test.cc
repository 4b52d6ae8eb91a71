// The replicas' all-reduce (plugins/replica_all_reduce.h) with real threads:
// every replica gets the same mean, bit for bit; a replica that fails
// releases the others instead of leaving them waiting; replicas that
// disagree on the size all fail.
#include "plugins/replica_all_reduce.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "kiln/error.h"

namespace kiln {
namespace {

TEST(ReplicaAllReduce, EveryReplicaGetsTheSameMean) {
  constexpr uint32_t kReplicas = 3;
  constexpr size_t kCount = 1000;  // not a multiple of the replicas: uneven shares
  ReplicaGroup group(kReplicas);
  std::vector<std::vector<float>> inputs(kReplicas, std::vector<float>(kCount));
  std::vector<std::vector<float>> outputs(kReplicas, std::vector<float>(kCount, -1.0f));
  for (uint32_t r = 0; r < kReplicas; ++r) {
    for (size_t i = 0; i < kCount; ++i) inputs[r][i] = 0.1f * static_cast<float>(r + 1) * static_cast<float>(i % 17);
  }
  for (int round = 0; round < 20; ++round) {  // the group is reused round after round
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < kReplicas; ++r) {
      threads.emplace_back([&, r] { group.allReduceMean(r, inputs[r].data(), outputs[r].data(), kCount); });
    }
    for (std::thread& thread : threads) thread.join();
    for (size_t i = 0; i < kCount; ++i) {
      const float want = (inputs[0][i] + inputs[1][i] + inputs[2][i]) * (1.0f / 3);
      EXPECT_FLOAT_EQ(outputs[0][i], want) << i;
      EXPECT_EQ(outputs[1][i], outputs[0][i]) << i;
      EXPECT_EQ(outputs[2][i], outputs[0][i]) << i;
    }
  }
}

TEST(ReplicaAllReduce, AnAbortReleasesTheWaitingReplicas) {
  ReplicaGroup group(3);
  std::vector<float> data(8, 1.0f), out(8);
  std::atomic<int> released{0};
  std::vector<std::thread> waiting;
  for (uint32_t r = 0; r < 2; ++r) {
    waiting.emplace_back([&, r] {
      try {
        group.allReduceMean(r, data.data(), out.data(), data.size());
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("another replica failed"), std::string::npos) << e.what();
        ++released;
      }
    });
  }
  group.abort();  // replica 2 failed before its all-reduce
  for (std::thread& thread : waiting) thread.join();
  EXPECT_EQ(released.load(), 2);
  // After reset, the group works again.
  group.reset();
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> outs(3, std::vector<float>(8));
  for (uint32_t r = 0; r < 3; ++r) threads.emplace_back([&, r] { group.allReduceMean(r, data.data(), outs[r].data(), 8); });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(outs[2], data);
}

TEST(ReplicaAllReduce, ReplicasDisagreeingOnTheSizeAllFail) {
  ReplicaGroup group(2);
  std::vector<float> a(8, 1.0f), b(6, 1.0f), out(8);
  std::atomic<int> failed{0};
  std::thread first([&] {
    try {
      group.allReduceMean(0, a.data(), out.data(), a.size());
    } catch (const UsageError&) {
      ++failed;
    }
  });
  std::thread second([&] {
    try {
      group.allReduceMean(1, b.data(), out.data(), b.size());
    } catch (const UsageError&) {
      ++failed;
    }
  });
  first.join();
  second.join();
  EXPECT_EQ(failed.load(), 2);
}

}  // namespace
}  // namespace kiln
