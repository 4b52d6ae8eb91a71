// ModelRunner error handling, as the reference's table says, with faults
// injected on sim devices: each error class with and without auto_reset,
// requests enqueued before an error complete with it, replicas that stop
// and come back, and runners destroyed while they handle errors (the soak
// with many threads is runner_soak_test.cc).
#include <gtest/gtest.h>

#include <thread>

#include "kiln/error.h"
#include "kiln/model_runner.h"
#include "tests/runtime/runtime_test_models.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using testing::affineReference;
using testing::kBatch;
using testing::kFeatures;
using testing::near;
using testing::rows;
using testing::simOptions;
using testing::TempPackage;

bool matches(const OutputTensors& result, const std::vector<float>& x) {
  const HostTensor& y = result.at("y");
  const std::vector<float> want = affineReference(x, kFeatures);
  if (y.bytes.size() != want.size() * 4) return false;
  std::vector<float> got(want.size());
  std::memcpy(got.data(), y.bytes.data(), y.bytes.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!near(got[i], want[i])) return false;
  }
  return true;
}

InputMemoryView inputOf(const std::vector<float>& x) {
  return {{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}};
}

struct ErrorCase {
  FaultKind kind;
  bool auto_reset;
  bool serves_on;    // the next request succeeds without a manual reset
  bool resets;       // the runner resets the device itself
  bool resettable = true;  // a manual reset() brings the runner back
};

std::string caseName(const ::testing::TestParamInfo<ErrorCase>& info) {
  return std::string(faultKindName(info.param.kind)) + (info.param.auto_reset ? "_auto_reset" : "_no_auto_reset");
}

class RunnerErrorTest : public ::testing::TestWithParam<ErrorCase> {};
// The same table on a GPU, where the build has CUDA and the machine a GPU.
class CudaRunnerErrorTest : public ::testing::TestWithParam<ErrorCase> {};

// Compute job 1 (the second request's batch) fails with the case's class.
void followTheReferenceTable(const ErrorCase& c, DeviceKind kind) {
  TempPackage package("errors");
  testing::writeAffineModel(package.path(), kBatch, kFeatures, kind == DeviceKind::kCuda ? "cuda" : "cpu");
  SimDeviceConfig sim;
  sim.fault_script = {ScriptedFault{1, c.kind}};
  DeviceManagerOptions options = simOptions(1, sim);
  options.cuda.fault_script = sim.fault_script;
  DeviceManager manager(options);
  ModelRunnerConfig config;
  config.device_kind = kind;
  config.device_manager = &manager;
  config.auto_reset = c.auto_reset;
  ModelRunner runner(package.path(), config);

  const std::vector<float> x = rows(kBatch, 1.0f);
  EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
  // The failing request gets the device's error class.
  try {
    runner.execute(inputOf(x));
    FAIL() << "the injected fault must reach the request";
  } catch (const ApplicationRuntimeError&) {
    EXPECT_EQ(c.kind, FaultKind::kApplicationError);
  } catch (const RecoverableDeviceError& e) {
    EXPECT_TRUE(c.kind == FaultKind::kRecoverableReset || c.kind == FaultKind::kRecoverableRerun ||
                c.kind == FaultKind::kRecoverableRestart);
    EXPECT_EQ(e.recoveryAction(), c.kind == FaultKind::kRecoverableReset     ? RecoveryAction::kDeviceReset
                                  : c.kind == FaultKind::kRecoverableRestart ? RecoveryAction::kRestartProcess
                                                                             : RecoveryAction::kRerun);
  } catch (const UnknownDeviceError&) {
    EXPECT_EQ(c.kind, FaultKind::kUnknown);
  }
  if (c.serves_on) {
    // Correct results prove the weights were loaded again after a reset
    // (a reset fills device memory with 0xCD).
    EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
    EXPECT_EQ(runner.resets(), c.resets ? 1u : 0u);
  } else {
    // Stopped: later requests get the error, nothing resets by itself.
    EXPECT_THROW(runner.execute(inputOf(x)), DeviceError);
    EXPECT_THROW(runner.executeAsync(inputOf(x)).get(), DeviceError);
    EXPECT_EQ(runner.resets(), 0u);
    if (!c.resettable) {
      // Only a new process helps: reset() fails with the error's class,
      // and the runner keeps answering every request with it.
      EXPECT_THROW(runner.reset(), RecoverableDeviceError);
      EXPECT_THROW(runner.execute(inputOf(x)), RecoverableDeviceError);
      EXPECT_EQ(runner.replicasServing(), 0u);
      EXPECT_FALSE(runner.isReady());  // a health check sees it
      EXPECT_EQ(runner.resets(), 0u);
      return;
    }
    runner.reset();  // the manual intervention
    EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
    EXPECT_EQ(runner.resets(), 1u);
  }
}

TEST_P(RunnerErrorTest, FollowsTheReferenceTable) { followTheReferenceTable(GetParam(), DeviceKind::kSim); }

TEST_P(CudaRunnerErrorTest, FollowsTheReferenceTable) {
  bool gpu = false;
  for (const DeviceInfo& info : DeviceManager(DeviceManagerOptions{}).devices()) gpu |= info.kind == DeviceKind::kCuda;
  if (!gpu) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
  followTheReferenceTable(GetParam(), DeviceKind::kCuda);
}

INSTANTIATE_TEST_SUITE_P(
    Classes, RunnerErrorTest,
    ::testing::Values(ErrorCase{FaultKind::kApplicationError, true, true, true},
                      ErrorCase{FaultKind::kApplicationError, false, false, false},
                      ErrorCase{FaultKind::kRecoverableReset, true, true, true},
                      ErrorCase{FaultKind::kRecoverableReset, false, false, false},
                      ErrorCase{FaultKind::kRecoverableRerun, true, true, false},
                      ErrorCase{FaultKind::kRecoverableRerun, false, true, false},
                      ErrorCase{FaultKind::kUnknown, true, false, false},
                      ErrorCase{FaultKind::kUnknown, false, false, false},
                      ErrorCase{FaultKind::kRecoverableRestart, true, false, false, false},
                      ErrorCase{FaultKind::kRecoverableRestart, false, false, false, false}),
    caseName);
INSTANTIATE_TEST_SUITE_P(
    Classes, CudaRunnerErrorTest,
    ::testing::Values(ErrorCase{FaultKind::kApplicationError, true, true, true},
                      ErrorCase{FaultKind::kRecoverableReset, true, true, true},
                      ErrorCase{FaultKind::kRecoverableReset, false, false, false},
                      ErrorCase{FaultKind::kRecoverableRerun, true, true, false},
                      ErrorCase{FaultKind::kUnknown, true, false, false},
                      ErrorCase{FaultKind::kRecoverableRestart, true, false, false, false}),
    caseName);

// A real illegal address on the GPU (a kernel writing through a wild
// pointer after the second request's kernels) corrupts the CUDA context,
// which no reset in this process can bring back: that request fails with
// the restart-the-process action, the runner does not try auto_reset, and
// every later request and reset() fail with that class. In a child
// process (CUDA gives it no GPU after the fault); returns the number of
// the check that failed.
int illegalAddressInARunner() {
  TempPackage package("illegal");
  testing::writeAffineModel(package.path(), kBatch, kFeatures, "cuda");
  DeviceManagerOptions options = simOptions(0);
  options.cuda.illegal_address_at_jobs = {1};
  DeviceManager manager(options);
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kCuda;
  config.device_manager = &manager;
  ModelRunner runner(package.path(), config);
  const std::vector<float> x = rows(kBatch, 1.0f);
  if (!matches(runner.execute(inputOf(x)), x)) return 1;
  auto restartClass = [&](auto&& call) {
    try {
      call();
    } catch (const RecoverableDeviceError& e) {
      return e.recoveryAction() == RecoveryAction::kRestartProcess;
    } catch (...) {
    }
    return false;
  };
  if (!restartClass([&] { runner.execute(inputOf(x)); })) return 2;
  if (!restartClass([&] { runner.execute(inputOf(x)); })) return 3;
  if (!restartClass([&] { runner.reset(); })) return 4;
  if (!restartClass([&] { runner.executeAsync(inputOf(x)).get(); })) return 5;
  if (runner.resets() != 0 || runner.replicasServing() != 0) return 6;
  return 0;
}

TEST(CudaRunnerErrors, AnIllegalAddressStopsTheRunnerForGood) {
  bool gpu = false;
  for (const DeviceInfo& info : DeviceManager(DeviceManagerOptions{}).devices()) gpu |= info.kind == DeviceKind::kCuda;
  if (!gpu) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(illegalAddressInARunner()), ::testing::ExitedWithCode(0), "");
}

// One request runs; then ten are queued behind slow transfers and the
// first of their batches fails. All ten were enqueued before the error, so
// all ten get it (those in flight too: their transfers fail on the failed
// device), and the runner serves again after its reset.
TEST(RunnerErrors, RequestsEnqueuedBeforeAnErrorGetIt) {
  TempPackage package("enqueued");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  SimDeviceConfig sim;
  sim.transfer_latency_ns = 20'000'000;
  sim.fault_script = {ScriptedFault{1, FaultKind::kApplicationError}};
  DeviceManager manager(simOptions(1, sim));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.ring_buffer_size_multiplier = 16;
  ModelRunner runner(package.path(), config);
  const std::vector<float> first = rows(kBatch, -3.0f);
  EXPECT_TRUE(matches(runner.execute(inputOf(first)), first));
  std::vector<std::vector<float>> xs;
  std::vector<Future<OutputTensors>> results;
  for (int i = 0; i < 10; ++i) xs.push_back(rows(kBatch, static_cast<float>(i)));
  for (const auto& x : xs) results.push_back(runner.executeAsync(inputOf(x)));
  for (size_t i = 0; i < results.size(); ++i) EXPECT_THROW(results[i].get(), ApplicationRuntimeError) << i;
  EXPECT_TRUE(matches(runner.execute(inputOf(xs[0])), xs[0]));
  EXPECT_EQ(runner.resets(), 1u);
}

// Two replicas on `manager`'s sim devices, stopping on errors until reset().
ModelRunnerConfig twoReplicasNoAutoReset(DeviceManager& manager) {
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.replication_factor = 2;
  config.auto_reset = false;
  return config;
}

// Replicas fail one by one: a replica that stops on an error leaves the
// rotation (the runner does not look healthy while requests to it hang or
// fail), the others keep serving, reset() brings it back, and requests
// fail with its error only when no replica is left.
TEST(RunnerErrors, AStoppedReplicaLeavesTheRotationUntilReset) {
  TempPackage package("replica_stops");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManagerOptions options = simOptions(2);
  options.sim_each.resize(2);
  options.sim_each[0].fault_script = {ScriptedFault{1, FaultKind::kUnknown}};  // its second batch
  DeviceManager manager(options);
  ModelRunner runner(package.path(), twoReplicasNoAutoReset(manager));
  EXPECT_EQ(runner.replicasServing(), 2u);
  const std::vector<float> x = rows(kBatch, 2.0f);
  int failed = 0;
  for (int i = 0; i < 12; ++i) {
    try {
      EXPECT_TRUE(matches(runner.execute(inputOf(x)), x)) << "request " << i;
    } catch (const UnknownDeviceError&) {
      ++failed;
    }
  }
  EXPECT_EQ(failed, 1) << "only the batch that met the fault fails; replica 1 serves the rest";
  EXPECT_EQ(runner.replicasServing(), 1u);
  runner.reset();
  EXPECT_EQ(runner.replicasServing(), 2u);
  const uint64_t before = runner.batchesRun();
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
  EXPECT_EQ(runner.batchesRun() - before, 6u);
}

TEST(RunnerErrors, RequestsFailWithTheErrorOnceNoReplicaIsLeftAndResetRaces) {
  TempPackage package("replicas_all_stop");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  SimDeviceConfig sim;
  sim.fault_script = {ScriptedFault{0, FaultKind::kUnknown}};  // every device's first batch
  DeviceManager manager(simOptions(2, sim));
  ModelRunner runner(package.path(), twoReplicasNoAutoReset(manager));
  const std::vector<float> x = rows(kBatch, 2.0f);
  for (int i = 0; i < 2; ++i) EXPECT_THROW(runner.execute(inputOf(x)), UnknownDeviceError);
  EXPECT_EQ(runner.replicasServing(), 0u);
  EXPECT_THROW(runner.execute(inputOf(x)), UnknownDeviceError);  // none left: answered, not hung
  // Concurrent reset() calls and requests: serialised resets, every request
  // answered, both replicas back.
  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  for (int t = 0; t < 2; ++t) threads.emplace_back([&] { runner.reset(); });
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        try {
          runner.execute(inputOf(x));
        } catch (const Error&) {
        }
        ++answered;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(answered.load(), 40);
  EXPECT_EQ(runner.replicasServing(), 2u);
  EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
}

// Destroying a runner while its replicas handle errors and requests are
// pending: every request is answered (results, the fault, or "destroyed"),
// and the destructor returns (a stop() landing while a replica handled an
// error could be used up by the session, and the replica served on for
// ever). Many short lives, to hit the windows.
TEST(RunnerErrors, DestroyingTheRunnerWhileItHandlesErrorsNeverHangs) {
  TempPackage package("destroy_during_errors");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  SimDeviceConfig sim;
  sim.fault_rates[static_cast<int>(FaultKind::kRecoverableReset)] = 0.3;
  sim.fault_rates[static_cast<int>(FaultKind::kRecoverableRerun)] = 0.2;
  DeviceManager manager(simOptions(2, sim));
  const std::vector<float> x = rows(kBatch, 1.0f);
  uint64_t answered = 0;
  for (int life = 0; life < 150; ++life) {
    std::vector<Future<OutputTensors>> pending;
    {
      ModelRunnerConfig config;
      config.device_kind = DeviceKind::kSim;
      config.device_manager = &manager;
      config.replication_factor = 2;
      config.auto_reset = true;
      ModelRunner runner(package.path(), config);
      for (int i = 0; i < 6; ++i) pending.push_back(runner.executeAsync(inputOf(x)));
      if (life % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (life % 7)));
    }  // destroyed with requests in flight
    for (auto& future : pending) {
      ASSERT_TRUE(future.waitFor(std::chrono::seconds(10))) << "life " << life << ": a request never answered";
      try {
        EXPECT_TRUE(matches(future.get(), x));
      } catch (const Error&) {
      }
      ++answered;
    }
  }
  EXPECT_EQ(answered, 150u * 6u);
}

// The runner allocates a request's outputs when the caller gives none. If
// that fails, the request never was: executeAsync says so as a UsageError,
// and nothing stays in flight (the request's state used to leak, counted in
// flight for ever, so that drain() never finished).
TEST(RunnerErrors, AFailedOutputAllocationLeavesNothingInFlight) {
  TempPackage package("allocation");
  testing::writeAffineModel(package.path(), kBatch, kFeatures, "cpu");
  DeviceManager manager{DeviceManagerOptions{}};
  ModelRunnerConfig config;
  config.device_manager = &manager;
  ModelRunner runner(package.path(), config);
  const std::vector<float> many = rows(static_cast<size_t>(kBatch) * 1000, 1.0f);  // 1,000 whole inputs
  testing::failAllocationsOfAtLeast(many.size() * 4 / 2);  // the outputs' bytes; nothing else is that large
  try {
    (void)runner.executeAsync(inputOf(many));
    testing::failAllocationsOfAtLeast(0);
    FAIL() << "the output allocation must fail";
  } catch (const UsageError& e) {
    testing::failAllocationsOfAtLeast(0);
    EXPECT_NE(std::string(e.what()).find("cannot allocate the 128000 bytes of output 'y'"), std::string::npos)
        << e.what();
  } catch (...) {
    testing::failAllocationsOfAtLeast(0);
    throw;
  }
  EXPECT_EQ(runner.statistics().in_flight, 0u);
  const std::vector<float> x = rows(kBatch, 2.0f);
  EXPECT_TRUE(matches(runner.execute(inputOf(x)), x));
  EXPECT_TRUE(runner.drain(std::chrono::seconds(5)));
}

}  // namespace
}  // namespace kiln
