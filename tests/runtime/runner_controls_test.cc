// The ModelRunner's production controls, on cpu and sim: per-request
// deadlines, cancellation of queued requests, completion callbacks,
// graceful drain, statistics and health. A slow sim device (20 ms per
// copy) keeps requests queued behind one another where a test needs that.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "kiln/error.h"
#include "kiln/model_runner.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::kBatch;
using testing::kFeatures;
using testing::matchesAffine;
using testing::rows;
using testing::simOptions;
using testing::TempPackage;
using Clock = std::chrono::steady_clock;

constexpr float kSentinel = -12345.0f;

InputMemoryView inputOf(const std::vector<float>& x) {
  return {{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}};
}
OutputMemoryView outputOf(std::vector<float>& y) { return {{"y", TensorMemoryView{y.data(), y.size() * 4, DType::kF32}}}; }

bool untouched(const std::vector<float>& y) {
  return std::all_of(y.begin(), y.end(), [](float v) { return v == kSentinel; });
}

class RunnerControls : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override { testing::writeAffineModel(package_.path(), kBatch, kFeatures); }
  // A runner on this test's device kind. `slow`: sim copies take 20 ms,
  // and the queues hold 16 requests (beyond the 3 batches in flight).
  // `batching`: requests of any number of rows, partial batches flushed
  // after 50 ms.
  std::unique_ptr<ModelRunner> runner(bool slow = false, bool batching = false, ModelRunnerConfig config = {}) {
    SimDeviceConfig sim;
    if (slow) sim.transfer_latency_ns = 20'000'000;
    manager_ = std::make_unique<DeviceManager>(simOptions(1, sim));
    config.device_kind = GetParam();
    config.device_manager = manager_.get();
    if (slow) config.ring_buffer_size_multiplier = 16;
    if (batching) {
      config.batching_dim = 0;
      config.timeout_ns = std::chrono::milliseconds(50);
    }
    return std::make_unique<ModelRunner>(package_.path(), config);
  }
  TempPackage package_{"controls"};
  std::unique_ptr<DeviceManager> manager_;
};

TEST_P(RunnerControls, ARequestPastItsDeadlineNeverRuns) {
  auto r = runner();
  const std::vector<float> x = rows(kBatch, 1.0f);
  std::vector<float> y(kBatch * kFeatures, kSentinel);
  RequestOptions late;
  late.deadline = Clock::now() - std::chrono::milliseconds(1);
  EXPECT_THROW(r->executeAsync(inputOf(x), outputOf(y), late).get(), DeadlineExceededError);
  EXPECT_TRUE(untouched(y)) << "an expired request's output was written";
  EXPECT_EQ(r->statistics().batches_run, 0u);
  RequestOptions in_time;
  in_time.deadline = Clock::now() + std::chrono::seconds(30);
  r->executeAsync(inputOf(x), outputOf(y), in_time).get();
  EXPECT_TRUE(matchesAffine(y, x));
}

TEST_P(RunnerControls, ADeadlinePassingWhileQueuedBehindOthersExpiresIt) {
  if (GetParam() != DeviceKind::kSim) GTEST_SKIP() << "needs the slow sim device to queue requests";
  auto r = runner(/*slow=*/true);
  const std::vector<float> x = rows(kBatch, 2.0f);
  std::vector<float> first(kBatch * kFeatures, kSentinel), second(kBatch * kFeatures, kSentinel),
      third(kBatch * kFeatures, kSentinel);
  // Three batches fill the device's pipeline (>= 40 ms each on it); the
  // next waits in the queue.
  std::vector<std::vector<float>> ahead(2, std::vector<float>(kBatch * kFeatures));
  Future<void> a = r->executeAsync(inputOf(x), outputOf(first));
  Future<void> a1 = r->executeAsync(inputOf(x), outputOf(ahead[0]));
  Future<void> a2 = r->executeAsync(inputOf(x), outputOf(ahead[1]));
  Future<void> b = r->executeAsync(inputOf(x), outputOf(second));
  RequestOptions soon;
  soon.deadline = Clock::now() + std::chrono::milliseconds(5);
  Future<void> c = r->executeAsync(inputOf(x), outputOf(third), soon);
  a.get();
  a1.get();
  a2.get();
  b.get();
  EXPECT_THROW(c.get(), DeadlineExceededError);
  EXPECT_TRUE(matchesAffine(first, x));
  EXPECT_TRUE(matchesAffine(second, x));
  EXPECT_TRUE(untouched(third));
  EXPECT_EQ(r->statistics().deadline_exceeded, 1u);
}

TEST_P(RunnerControls, CancelledRequestsNeverTouchTheirMemory) {
  auto r = runner(/*slow=*/GetParam() == DeviceKind::kSim);
  const std::vector<float> x = rows(kBatch, 3.0f);
  std::vector<float> first(kBatch * kFeatures, kSentinel);
  Future<void> a = r->executeAsync(inputOf(x), outputOf(first));
  std::vector<std::vector<float>> outputs(8, std::vector<float>(kBatch * kFeatures, kSentinel));
  std::vector<Future<void>> futures;
  for (auto& y : outputs) futures.push_back(r->executeAsync(inputOf(x), outputOf(y)));
  std::vector<bool> cancelled_at(futures.size());
  for (size_t i = futures.size(); i-- > 0;) {
    cancelled_at[i] = futures[i].cancel();
    // From here the device never writes a cancelled request's output: the
    // caller may reuse it (here: write it again, and check it stays so).
    if (cancelled_at[i]) std::fill(outputs[i].begin(), outputs[i].end(), kSentinel);
  }
  int cancelled = 0;
  for (size_t i = 0; i < futures.size(); ++i) {
    if (cancelled_at[i]) {
      ++cancelled;
      EXPECT_THROW(futures[i].get(), RequestCancelledError);
      EXPECT_TRUE(untouched(outputs[i])) << i;
    } else {
      futures[i].get();
      EXPECT_TRUE(matchesAffine(outputs[i], x)) << i;
    }
  }
  a.get();
  EXPECT_TRUE(matchesAffine(first, x));
  EXPECT_FALSE(a.valid());
  if (GetParam() == DeviceKind::kSim) {
    EXPECT_GE(cancelled, 5) << "the slow device leaves most requests queued";
  }
  EXPECT_EQ(r->statistics().cancelled, static_cast<uint64_t>(cancelled));
  // A finished request cannot be cancelled.
  std::vector<float> y(kBatch * kFeatures);
  Future<void> done = r->executeAsync(inputOf(x), outputOf(y));
  done.wait();
  EXPECT_FALSE(done.cancel());
  done.get();
}

TEST_P(RunnerControls, CompletionCallbacksRunOnceBeforeTheFutureIsReady) {
  auto r = runner();
  const std::vector<float> x = rows(kBatch, 4.0f);
  std::atomic<int> calls{0};
  std::atomic<bool> failed{false};
  RequestOptions options;
  options.on_complete = [&](const std::exception_ptr& error) {
    ++calls;
    failed = error != nullptr;
  };
  OutputTensors result = r->executeAsync(inputOf(x), options).get();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(failed.load());
  options.deadline = Clock::now() - std::chrono::seconds(1);
  EXPECT_THROW(r->executeAsync(inputOf(x), options).get(), DeadlineExceededError);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(failed.load());
  // A throwing callback is ignored.
  RequestOptions throwing;
  throwing.on_complete = [](const std::exception_ptr&) { throw std::runtime_error("caller bug"); };
  EXPECT_NO_THROW(r->executeAsync(inputOf(x), throwing).get());
}

TEST_P(RunnerControls, DrainAnswersWhatWasTakenAndRefusesTheRest) {
  auto r = runner(/*slow=*/GetParam() == DeviceKind::kSim, /*batching=*/true);
  EXPECT_TRUE(r->isReady());
  const std::vector<float> x = rows(1, 5.0f);  // partial batches: drain flushes them at once
  std::vector<Future<OutputTensors>> futures;
  for (int i = 0; i < 5; ++i) futures.push_back(r->executeAsync(inputOf(x)));
  EXPECT_TRUE(r->drain(std::chrono::seconds(30)));
  for (auto& future : futures) {
    ASSERT_TRUE(future.ready());
    const HostTensor y = future.get().at("y");
    std::vector<float> values(y.bytes.size() / 4);
    std::memcpy(values.data(), y.bytes.data(), y.bytes.size());
    EXPECT_TRUE(matchesAffine(values, x));
  }
  EXPECT_FALSE(r->isReady());
  try {
    r->executeAsync(inputOf(x)).get();
    FAIL() << "a drained runner took a request";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("draining"));
  }
  EXPECT_EQ(r->statistics().in_flight, 0u);
}

TEST_P(RunnerControls, DrainGivesUpAtItsBound) {
  if (GetParam() != DeviceKind::kSim) GTEST_SKIP() << "needs the slow sim device";
  auto r = runner(/*slow=*/true);
  const std::vector<float> x = rows(kBatch, 6.0f);
  std::vector<Future<OutputTensors>> futures;
  for (int i = 0; i < 4; ++i) futures.push_back(r->executeAsync(inputOf(x)));  // >= 160 ms of copies
  EXPECT_FALSE(r->drain(std::chrono::milliseconds(1)));
  for (auto& future : futures) future.get();  // still answered
}

TEST_P(RunnerControls, StatisticsCountWhatHappened) {
  auto r = runner();
  const std::vector<float> full = rows(kBatch, 7.0f), one = rows(1, 7.0f);
  for (int i = 0; i < 5; ++i) r->execute(inputOf(full));
  RequestOptions late;
  late.deadline = Clock::now() - std::chrono::seconds(1);
  EXPECT_THROW(r->executeAsync(inputOf(full), late).get(), DeadlineExceededError);
  std::vector<float> wrong(3);
  EXPECT_THROW(r->execute(inputOf(wrong)), UsageError);  // refused by validation: never counted
  const RunnerStatistics stats = r->statistics();
  EXPECT_EQ(stats.submitted, 6u);
  EXPECT_EQ(stats.succeeded, 5u);
  EXPECT_EQ(stats.deadline_exceeded, 1u);
  EXPECT_EQ(stats.in_flight, 0u);
  EXPECT_EQ(stats.batches_run, 5u);
  EXPECT_EQ(stats.timed, 1u);  // one in 8 of the 6 requests: the first (the expired one never started)
  EXPECT_GT(stats.run_seconds, 0.0);
  EXPECT_GE(stats.max_run_seconds, stats.run_seconds - 1e-12);
  ASSERT_EQ(stats.rows_histogram.size(), 2u);  // no batching_dim: a batch is one whole tensor
  EXPECT_EQ(stats.rows_histogram[1], 5u);
  uint64_t in_buckets = 0;
  for (uint64_t count : stats.run_histogram) in_buckets += count;
  EXPECT_EQ(in_buckets, 1u);
}

TEST_P(RunnerControls, StatisticsCanTimeEveryRequest) {
  ModelRunnerConfig config;
  config.statistics_sample_every = 1;
  auto r = runner(/*slow=*/false, /*batching=*/false, config);
  const std::vector<float> x = rows(kBatch, 7.0f);
  for (int i = 0; i < 5; ++i) r->execute(inputOf(x));
  const RunnerStatistics stats = r->statistics();
  EXPECT_EQ(stats.timed, 5u);
  uint64_t queued = 0, ran = 0;
  for (size_t b = 0; b < stats.queue_histogram.size(); ++b) {
    queued += stats.queue_histogram[b];
    ran += stats.run_histogram[b];
  }
  EXPECT_EQ(queued, 5u);
  EXPECT_EQ(ran, 5u);
  config.statistics_sample_every = 0;
  EXPECT_THROW(runner(/*slow=*/false, /*batching=*/false, config), UsageError);
}

TEST_P(RunnerControls, StatisticsAreReadableWhileRequestsRun) {
  auto r = runner();
  const std::vector<float> x = rows(kBatch, 8.0f);
  std::atomic<bool> running{true};
  std::thread reader([&] {
    uint64_t last = 0;
    while (running.load()) {
      const RunnerStatistics stats = r->statistics();
      EXPECT_GE(stats.succeeded, last);
      last = stats.succeeded;
    }
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) r->execute(inputOf(x));
    });
  }
  for (auto& caller : callers) caller.join();
  running = false;
  reader.join();
  EXPECT_EQ(r->statistics().succeeded, 150u);
}

// The adaptive timeout: two callers in a closed loop (each sends its next
// request when the last is answered) meet in full batches, where with no
// timeout their requests would go out one per batch; a lone caller's
// requests do not wait for it.
TEST_P(RunnerControls, AdaptiveTimeoutMergesConcurrentCallers) {
  if (GetParam() != DeviceKind::kSim) GTEST_SKIP() << "needs the slow sim device";
  ModelRunnerConfig config;
  config.batching_dim = 0;
  config.timeout_ns = std::chrono::nanoseconds(0);
  config.adaptive_timeout = 0.5;
  auto r = runner(/*slow=*/true, /*batching=*/false, config);
  auto caller = [&](float start) {
    for (int i = 0; i < 6; ++i) {
      const std::vector<float> x = rows(2, start + static_cast<float>(i));
      std::vector<float> y(x.size());
      r->execute(inputOf(x), outputOf(y));
      EXPECT_TRUE(matchesAffine(y, x));
    }
  };
  std::thread first(caller, 1.0f), second(caller, 100.0f);
  first.join();
  second.join();
  const RunnerStatistics stats = r->statistics();
  ASSERT_EQ(stats.rows_histogram.size(), static_cast<size_t>(kBatch + 1));
  // 12 requests of 2 rows: after the first batch or two (the run time is
  // not known yet), in batches of both callers' rows. Without the adaptive
  // timeout the callers take turns: 9 batches, 3 of them full.
  EXPECT_GE(stats.rows_histogram[kBatch], 5u) << "full batches of " << stats.batches_run;
  EXPECT_LE(stats.batches_run, 7u);
}

TEST_P(RunnerControls, AdaptiveTimeoutLeavesALoneCallerAlone) {
  if (GetParam() != DeviceKind::kSim) GTEST_SKIP() << "needs the slow sim device";
  // Mean time from a request's start to its answer, for one caller.
  auto meanRunSeconds = [&](double adaptive) {
    ModelRunnerConfig config;
    config.batching_dim = 0;
    config.timeout_ns = std::chrono::nanoseconds(0);
    config.adaptive_timeout = adaptive;
    config.statistics_sample_every = 1;
    auto r = runner(/*slow=*/true, /*batching=*/false, config);
    for (int i = 0; i < 5; ++i) r->execute(inputOf(rows(1, static_cast<float>(i))));
    const RunnerStatistics stats = r->statistics();
    return stats.run_seconds / static_cast<double>(stats.timed);
  };
  const double without = meanRunSeconds(0);
  const double with = meanRunSeconds(1.0);  // a wait would double each request's time
  EXPECT_LT(with, 1.5 * without) << with << " s against " << without << " s";
}

INSTANTIATE_TEST_SUITE_P(Devices, RunnerControls, ::testing::Values(DeviceKind::kCpu, DeviceKind::kSim),
                         [](const auto& param_info) { return std::string(deviceKindName(param_info.param)); });

}  // namespace
}  // namespace kiln
