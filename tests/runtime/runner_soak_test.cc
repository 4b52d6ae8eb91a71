// The ModelRunner soak: many requests from 8 threads through 2 sim
// replicas with random faults of every class, random sizes with batching
// on, bad requests, deadlines and cancellations mixed in, and a supervisor
// that resets the runner whenever it stops being ready (the unknown faults
// stop replicas). It checks what a serving runtime promises:
//
//   - every accepted request is answered exactly once (its completion
//     callback runs once, also counted again after the runner is gone),
//     within a bounded wait (a request not answered in 60 s is a hang);
//   - a success carries the right result; a failure has a class the
//     request allows (a device error, or cancelled / deadline exceeded for
//     requests that asked for those);
//   - a bad request is refused at the call with UsageError and runs nothing;
//   - resident memory stays flat after warm-up.
//
// KILN_SOAK_REQUESTS sets the count (default 10,000, in `make test`);
// `make soak` runs 100,000. The counts are printed at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "kiln/error.h"
#include "kiln/model_runner.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::affineReference;
using testing::kFeatures;
using testing::near;
using testing::rows;
using testing::simOptions;
using testing::TempPackage;

double residentMiB() {
  std::ifstream status("/proc/self/statm");
  uint64_t pages = 0, resident = 0;
  status >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

struct Tally {
  std::atomic<uint64_t> succeeded{0}, device_errors{0}, cancelled{0}, expired{0}, refused_bad{0};
  std::atomic<uint64_t> wrong{0}, bad_class{0}, hangs{0}, bad_ran{0};
};

// One accepted request: its data, what it asked for, and how many times
// its completion callback ran.
struct Pending {
  std::vector<float> x;
  bool may_cancel = false, may_expire = false;
  std::shared_ptr<std::atomic<int>> answers = std::make_shared<std::atomic<int>>(0);
  Future<OutputTensors> result;
};

void settle(Pending& request, Tally& tally) {
  if (!request.result.waitFor(std::chrono::seconds(60))) {
    ++tally.hangs;
    return;
  }
  try {
    OutputTensors out = request.result.get();
    std::vector<float> y(out.at("y").bytes.size() / 4);
    std::memcpy(y.data(), out.at("y").bytes.data(), y.size() * 4);
    const std::vector<float> want = affineReference(request.x, kFeatures);
    bool right = y.size() == want.size();
    for (size_t i = 0; right && i < y.size(); ++i) right = near(y[i], want[i]);
    ++(right ? tally.succeeded : tally.wrong);
  } catch (const DeviceError&) {
    ++tally.device_errors;
  } catch (const RequestCancelledError&) {
    ++(request.may_cancel ? tally.cancelled : tally.bad_class);
  } catch (const DeadlineExceededError&) {
    ++(request.may_expire ? tally.expired : tally.bad_class);
  } catch (const std::exception& e) {
    if (tally.bad_class++ < 3) ADD_FAILURE() << "unexpected error: " << e.what();
  }
}

TEST(RunnerSoak, EveryRequestIsAnsweredOnceRightOrWithItsErrorClass) {
  const char* env = std::getenv("KILN_SOAK_REQUESTS");
  const uint64_t total = env != nullptr ? std::strtoull(env, nullptr, 10) : 10'000;
  constexpr int kThreads = 8;
  TempPackage package("soak");
  testing::writeAffineModel(package.path(), testing::kBatch, kFeatures);
  SimDeviceConfig sim;
  sim.fault_rates[static_cast<size_t>(FaultKind::kApplicationError)] = 0.002;
  sim.fault_rates[static_cast<size_t>(FaultKind::kRecoverableReset)] = 0.002;
  sim.fault_rates[static_cast<size_t>(FaultKind::kRecoverableRerun)] = 0.005;
  sim.fault_rates[static_cast<size_t>(FaultKind::kUnknown)] = 0.0001;
  sim.fault_seed = 11;
  DeviceManager manager(simOptions(2, sim));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.batching_dim = 0;
  config.timeout_ns = std::chrono::microseconds(200);
  config.replication_factor = 2;
  config.ring_buffer_size_multiplier = 4;
  Tally tally;
  std::vector<std::shared_ptr<std::atomic<int>>> all_answers;
  std::mutex answers_mutex;
  double rss_warm = 0, rss_end = 0;
  uint64_t resets = 0, batches = 0, manual_resets = 0;
  const auto started = std::chrono::steady_clock::now();
  {
    ModelRunner runner(package.path(), config);
    std::atomic<bool> running{true};
    std::atomic<uint64_t> issued{0};
    std::thread supervisor([&] {
      while (running.load()) {
        if (!runner.isReady()) {
          try {
            runner.reset();
            ++manual_resets;
          } catch (const Error&) {
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 random(static_cast<unsigned>(1000 + t));
        std::vector<Pending> window;
        for (;;) {
          const uint64_t n = issued.fetch_add(1);
          if (n >= total) break;
          if (n == total / 10) rss_warm = residentMiB();  // one thread draws it; read after the joins
          const unsigned kind = random() % 100;
          if (kind < 3) {
            // A bad request: a size that is no whole number of rows, or an unknown anchor.
            std::vector<float> bad(kFeatures + 3);
            InputMemoryView view{{kind == 0 ? "nope" : "x", ConstTensorMemoryView{bad.data(), bad.size() * 4}}};
            try {
              (void)runner.executeAsync(view);
              ++tally.bad_ran;
            } catch (const UsageError&) {
              ++tally.refused_bad;
            }
            continue;
          }
          Pending request;
          request.x = rows(1 + random() % 9, static_cast<float>(n % 997));
          RequestOptions options;
          if (kind < 8) {
            request.may_expire = true;
            options.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(random() % 400);
          }
          auto answers = request.answers;
          options.on_complete = [answers](const std::exception_ptr&) { answers->fetch_add(1); };
          request.result = runner.executeAsync(
              {{"x", ConstTensorMemoryView{request.x.data(), request.x.size() * 4, DType::kF32}}}, options);
          if (kind >= 8 && kind < 12) {
            request.may_cancel = true;
            request.result.cancel();  // whether it still can or not: both outcomes are allowed
          }
          {
            std::lock_guard lock(answers_mutex);
            all_answers.push_back(answers);
          }
          window.push_back(std::move(request));
          if (window.size() == 16) {
            for (auto& pending : window) settle(pending, tally);
            window.clear();
          }
        }
        for (auto& pending : window) settle(pending, tally);
      });
    }
    for (auto& thread : threads) thread.join();
    running = false;
    supervisor.join();
    rss_end = residentMiB();
    resets = runner.resets();
    const RunnerStatistics stats = runner.statistics();
    batches = stats.batches_run;
    EXPECT_EQ(stats.in_flight, 0u);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Answered exactly once, also now that the runner is gone.
  uint64_t not_once = 0;
  for (const auto& answers : all_answers) not_once += answers->load() != 1 ? 1 : 0;
  const uint64_t accepted = all_answers.size();
  const uint64_t settled = tally.succeeded + tally.device_errors + tally.cancelled + tally.expired + tally.wrong +
                           tally.bad_class + tally.hangs;
  std::printf("soak: %llu requests from %d threads in %.1f s: %llu accepted (%llu right, %llu device errors, "
              "%llu cancelled, %llu past their deadline), %llu bad ones refused; %llu resets by the runner, "
              "%llu by the supervisor, %llu batches; RSS %.1f MiB after warm-up, %.1f MiB at the end\n",
              static_cast<unsigned long long>(total), kThreads, seconds, static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(tally.succeeded.load()),
              static_cast<unsigned long long>(tally.device_errors.load()),
              static_cast<unsigned long long>(tally.cancelled.load()),
              static_cast<unsigned long long>(tally.expired.load()),
              static_cast<unsigned long long>(tally.refused_bad.load()), static_cast<unsigned long long>(resets),
              static_cast<unsigned long long>(manual_resets), static_cast<unsigned long long>(batches), rss_warm,
              rss_end);
  EXPECT_EQ(settled, accepted);
  EXPECT_EQ(accepted + tally.refused_bad + tally.bad_ran, total);
  EXPECT_EQ(not_once, 0u) << "requests answered other than exactly once";
  EXPECT_EQ(tally.hangs.load(), 0u);
  EXPECT_EQ(tally.wrong.load(), 0u);
  EXPECT_EQ(tally.bad_class.load(), 0u);
  EXPECT_EQ(tally.bad_ran.load(), 0u);
  EXPECT_GT(tally.device_errors.load(), 0u);  // the faults did happen
  EXPECT_GT(tally.succeeded.load(), tally.device_errors.load());
#ifndef __SANITIZE_THREAD__
  EXPECT_LT(rss_end - rss_warm, 64.0) << "resident memory grew after warm-up";
#else
  // ThreadSanitizer's allocator holds freed memory back and its shadow
  // grows with every address touched: RSS says nothing about kiln there.
#endif
}

}  // namespace
}  // namespace kiln
