// Memory planner benchmark: how long does planning take for 100, 1,000 and
// 10,000 tensors, and how close to the lower bound does the arena land?
//
//   BM_PlanGraphLike        one tensor per step, as a compiled program has:
//                           most read by the next one to three steps, one in
//                           ten kept much longer (skip connections); sizes
//                           log-uniform from 256 B to 16 MiB.
//   BM_PlanRandomIntervals  arbitrary lifetimes over n steps: far more tensors
//                           live at once, the planner's quadratic worst side.
//   BM_CheckPlan            planIsValid on the graph-like plan (run by the
//                           compiler in debug builds).
//
// Counters: arena/lower (arena over the lower bound), arena_MiB.
//
// Usage: memory_planner_bench [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "compiler/memory_planner.h"

namespace {

std::vector<kiln::TensorLifetime> graphLike(size_t count, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(16.0 * (1 << 20)));
  std::vector<kiln::TensorLifetime> tensors(count);
  for (size_t i = 0; i < count; ++i) {
    const bool skip_connection = random() % 10 == 0;
    const uint32_t span = static_cast<uint32_t>(skip_connection ? 4 + random() % 60 : 1 + random() % 3);
    tensors[i].size_bytes = static_cast<uint64_t>(std::exp(log_size(random)));
    tensors[i].first_step = static_cast<uint32_t>(i);
    tensors[i].last_step = static_cast<uint32_t>(i) + span;
  }
  return tensors;
}

std::vector<kiln::TensorLifetime> randomIntervals(size_t count, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(16.0 * (1 << 20)));
  std::vector<kiln::TensorLifetime> tensors(count);
  for (auto& tensor : tensors) {
    const auto a = static_cast<uint32_t>(random() % count);
    const auto b = static_cast<uint32_t>(random() % count);
    tensor.size_bytes = static_cast<uint64_t>(std::exp(log_size(random)));
    tensor.first_step = std::min(a, b);
    tensor.last_step = std::max(a, b);
  }
  return tensors;
}

void reportQuality(benchmark::State& state, const kiln::MemoryPlan& plan) {
  state.counters["arena/lower"] =
      static_cast<double>(plan.arena_bytes) / static_cast<double>(std::max<uint64_t>(plan.lower_bound_bytes, 1));
  state.counters["arena_MiB"] = static_cast<double>(plan.arena_bytes) / (1 << 20);
}

void BM_PlanGraphLike(benchmark::State& state) {
  const auto tensors = graphLike(static_cast<size_t>(state.range(0)), 42);
  kiln::MemoryPlan plan;
  for (auto _ : state) {
    plan = kiln::planMemory(tensors);
    benchmark::DoNotOptimize(plan.arena_bytes);
  }
  reportQuality(state, plan);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_PlanRandomIntervals(benchmark::State& state) {
  const auto tensors = randomIntervals(static_cast<size_t>(state.range(0)), 42);
  kiln::MemoryPlan plan;
  for (auto _ : state) {
    plan = kiln::planMemory(tensors);
    benchmark::DoNotOptimize(plan.arena_bytes);
  }
  reportQuality(state, plan);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_CheckPlan(benchmark::State& state) {
  const auto tensors = graphLike(static_cast<size_t>(state.range(0)), 42);
  const kiln::MemoryPlan plan = kiln::planMemory(tensors);
  for (auto _ : state) {
    bool valid = kiln::planIsValid(tensors, plan, 64, nullptr);
    benchmark::DoNotOptimize(valid);
    if (!valid) state.SkipWithError("planIsValid refused the planner's plan");
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_PlanGraphLike)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PlanRandomIntervals)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CheckPlan)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
