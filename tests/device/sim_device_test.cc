// What only the sim device does: a memory capacity, transfer costs, its own
// compute thread, fault injection with the sticky failed state, reset, and
// its configuration from the environment.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/sim_device.h"
#include "tests/device/device_test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TEST(SimDevice, ReportsItsConfiguration) {
  SimDeviceConfig config;
  config.memory_bytes = 32ull << 20;
  config.transfer_latency_ns = 5000;
  config.transfer_bytes_per_second = 2e9;
  config.compute_threads = 3;
  SimDevice device(2, config);
  EXPECT_EQ(device.id(), "sim:2");
  EXPECT_EQ(device.info().kind, DeviceKind::kSim);
  EXPECT_EQ(device.info().memory_bytes, 32ull << 20);
  EXPECT_EQ(device.info().compute_threads, 3u);
  EXPECT_EQ(device.info().transfer_latency_ns, 5000u);
  EXPECT_EQ(device.info().transfer_bytes_per_second, 2e9);
  EXPECT_FALSE(device.usesHostMemory());
  EXPECT_EQ(device.memoryInUse(), 0u);
}

TEST(SimDevice, AllocationBeyondCapacityIsRefusedAndChangesNothing) {
  SimDeviceConfig config;
  config.memory_bytes = 64ull << 20;
  SimDevice device(0, config);
  DeviceBuffer big = device.allocate(60ull << 20);
  EXPECT_EQ(device.memoryInUse(), 60ull << 20);
  try {
    device.allocate(12ull << 20);
    FAIL() << "expected RecoverableDeviceError";
  } catch (const RecoverableDeviceError& e) {
    // Out of memory is the device's, with the reference's "rerun" action
    // (as CUDA's cudaErrorMemoryAllocation): freeing memory lets it succeed.
    EXPECT_STREQ(e.what(),
                 "sim:0: out of device memory: asked 12.0 MiB with 60.0 MiB of 64.0 MiB in use (recovery action: rerun)");
    EXPECT_EQ(e.recoveryAction(), RecoveryAction::kRerun);
  }
  EXPECT_EQ(device.memoryInUse(), 60ull << 20);
  DeviceBuffer rest = device.allocate(4ull << 20);  // exactly fills it
  EXPECT_EQ(device.memoryInUse(), 64ull << 20);
  EXPECT_THROW(device.allocate(1), RecoverableDeviceError);
}

TEST(SimDevice, TransfersTakeAtLeastLatencyPlusBytesOverBandwidth) {
  SimDeviceConfig config;
  config.transfer_latency_ns = 2'000'000;     // 2 ms
  config.transfer_bytes_per_second = 100e6;  // 100 MB/s: 1 MB takes 10 ms
  SimDevice device(0, config);
  const size_t bytes = 1'000'000;
  std::vector<std::byte> host(bytes, std::byte{5});
  DeviceBuffer buffer = device.allocate(bytes);

  const auto start = Clock::now();
  ASSERT_EQ(testing::copyToDevice(device, buffer, host.data(), bytes), nullptr);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(12));

  // Queued copies run one after the other on the one transfer thread.
  std::vector<DeviceJob> jobs(3);
  const auto batch_start = Clock::now();
  for (DeviceJob& job : jobs) {
    job.kind = DeviceJob::Kind::kCopyToHost;
    job.destination = host.data();
    job.source = buffer.data();
    job.bytes = bytes;
    job.done = [](DeviceJob&, std::exception_ptr) {};
    device.submit(job);
  }
  device.synchronize();
  EXPECT_GE(Clock::now() - batch_start, std::chrono::milliseconds(36));
}

TEST(SimDevice, ShortTransfersWaitAtLeastTheirLatency) {
  SimDeviceConfig config;
  config.transfer_latency_ns = 20'000;  // below the spin threshold
  SimDevice device(0, config);
  std::byte byte{1};
  DeviceBuffer buffer = device.allocate(1);
  const auto start = Clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(testing::copyToDevice(device, buffer, &byte, 1), nullptr);
  EXPECT_GE(Clock::now() - start, std::chrono::microseconds(200));
}

TEST(SimDevice, ComputeRunsOnTheDeviceThread) {
  SimDevice device(0, SimDeviceConfig{});
  std::thread::id compute_thread;
  auto record = [&compute_thread] { compute_thread = std::this_thread::get_id(); };
  ASSERT_EQ(testing::runCompute(device, record), nullptr);
  EXPECT_NE(compute_thread, std::thread::id());
  EXPECT_NE(compute_thread, std::this_thread::get_id());
}

TEST(SimDevice, SynchronizeAndResetFromDoneAreRefused) {
  SimDevice device(0, SimDeviceConfig{});
  struct State {
    SimDevice* device;
    std::exception_ptr from_synchronize, from_reset;
  } state{&device, nullptr, nullptr};
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCompute;
  job.compute = [](void*) {};
  job.owner = &state;
  job.done = [](DeviceJob& j, std::exception_ptr) {
    auto* s = static_cast<State*>(j.owner);
    try {
      s->device->synchronize();
    } catch (...) {
      s->from_synchronize = std::current_exception();
    }
    try {
      s->device->reset();
    } catch (...) {
      s->from_reset = std::current_exception();
    }
  };
  device.submit(job);
  device.synchronize();
  EXPECT_THAT(testing::messageOf<UsageError>(state.from_synchronize),
              HasSubstr("synchronize() called from a device thread"));
  EXPECT_THAT(testing::messageOf<UsageError>(state.from_reset), HasSubstr("reset() called from a device thread"));
}

// ---- Faults ----------------------------------------------------------------

struct FaultCase {
  FaultKind kind;
  bool sticky;
  bool resettable = true;  // reset() brings the device back
};

class SimFault : public ::testing::TestWithParam<FaultCase> {};

// Checks that `error` is of the class a fault of `kind` raises.
void expectFaultClass(FaultKind kind, const std::exception_ptr& error, const std::string& expected_text) {
  ASSERT_NE(error, nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const ApplicationRuntimeError& e) {
    EXPECT_EQ(kind, FaultKind::kApplicationError) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(expected_text));
    EXPECT_EQ(e.device(), "sim:0");
  } catch (const RecoverableDeviceError& e) {
    const RecoveryAction want = kind == FaultKind::kRecoverableReset     ? RecoveryAction::kDeviceReset
                                : kind == FaultKind::kRecoverableRestart ? RecoveryAction::kRestartProcess
                                                                         : RecoveryAction::kRerun;
    EXPECT_TRUE(kind == FaultKind::kRecoverableReset || kind == FaultKind::kRecoverableRerun ||
                kind == FaultKind::kRecoverableRestart)
        << e.what();
    EXPECT_EQ(e.recoveryAction(), want);
    EXPECT_THAT(e.what(), HasSubstr(expected_text));
    EXPECT_EQ(e.device(), "sim:0");
  } catch (const UnknownDeviceError& e) {
    EXPECT_EQ(kind, FaultKind::kUnknown) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(expected_text));
    EXPECT_EQ(e.device(), "sim:0");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a fault class: " << e.what();
  }
}

TEST_P(SimFault, ScriptedFaultFailsThatJobAndStickyOnesLastUntilReset) {
  const FaultCase fault = GetParam();
  SimDeviceConfig config;
  config.fault_script = {{2, fault.kind}};
  SimDevice device(0, config);
  std::vector<unsigned char> pattern(256, 0x11), back(256, 0);
  DeviceBuffer buffer = device.allocate(pattern.size());
  ASSERT_EQ(testing::copyToDevice(device, buffer, pattern.data(), pattern.size()), nullptr);

  int ran = 0;
  auto count = [&ran] { ++ran; };
  EXPECT_EQ(testing::runCompute(device, count), nullptr);  // job 0
  EXPECT_EQ(testing::runCompute(device, count), nullptr);  // job 1
  const std::exception_ptr failure = testing::runCompute(device, count);  // job 2
  expectFaultClass(fault.kind, failure, fmt::format("sim:0: compute job 2 failed: injected fault '{}'",
                                                     faultKindName(fault.kind)));
  EXPECT_EQ(ran, 2) << "a faulted job must not run its compute";

  const std::exception_ptr after = testing::runCompute(device, count);  // job 3
  const std::exception_ptr copy_after = testing::copyToHost(device, back.data(), buffer, back.size());
  const std::string sticky = fault.resettable ? "needs a reset after" : "unusable in this process after";
  if (fault.sticky) {
    expectFaultClass(fault.kind, after, "sim:0: " + sticky + ": compute job 2 failed: injected fault");
    expectFaultClass(fault.kind, copy_after, "sim:0: " + sticky + ": compute job 2 failed");
    EXPECT_EQ(ran, 2);
  } else {
    EXPECT_EQ(after, nullptr);
    EXPECT_EQ(copy_after, nullptr);
    EXPECT_EQ(back, pattern);
    EXPECT_EQ(ran, 3);
  }
  EXPECT_EQ(device.computeJobs(), 4u);  // failed jobs count too

  if (!fault.resettable) {
    // Reset fails with the fault's class, and the device stays failed.
    std::exception_ptr reset_error;
    try {
      device.reset();
    } catch (...) {
      reset_error = std::current_exception();
    }
    expectFaultClass(fault.kind, reset_error, "sim:0: cannot be reset in this process after: compute job 2 failed");
    EXPECT_EQ(device.resetCount(), 0u);
    expectFaultClass(fault.kind, testing::runCompute(device, count), "sim:0: " + sticky);
    EXPECT_EQ(ran, 2);
    return;
  }
  device.reset();
  EXPECT_EQ(device.resetCount(), 1u);
  EXPECT_EQ(testing::runCompute(device, count), nullptr);  // job 4
  ASSERT_EQ(testing::copyToHost(device, back.data(), buffer, back.size()), nullptr);
  EXPECT_EQ(back, std::vector<unsigned char>(256, 0xCD)) << "reset must overwrite device memory";
}

INSTANTIATE_TEST_SUITE_P(Kinds, SimFault,
                         ::testing::Values(FaultCase{FaultKind::kApplicationError, true},
                                           FaultCase{FaultKind::kRecoverableReset, true},
                                           FaultCase{FaultKind::kRecoverableRerun, false},
                                           FaultCase{FaultKind::kUnknown, true},
                                           FaultCase{FaultKind::kRecoverableRestart, true, false}),
                         [](const ::testing::TestParamInfo<FaultCase>& param) {
                           return std::string(faultKindName(param.param.kind));
                         });

TEST(SimDevice, JobsQueuedBeforeAFaultFailWithIt) {
  SimDeviceConfig config;
  config.fault_script = {{0, FaultKind::kRecoverableReset}};
  SimDevice device(0, config);
  struct Result {
    std::vector<std::exception_ptr> errors;
  } result;
  std::vector<DeviceJob> jobs(5);
  for (DeviceJob& job : jobs) {
    job.kind = DeviceJob::Kind::kCompute;
    job.compute = [](void*) {};
    job.owner = &result;
    job.done = [](DeviceJob& j, std::exception_ptr error) { static_cast<Result*>(j.owner)->errors.push_back(error); };
    device.submit(job);
  }
  device.synchronize();
  ASSERT_EQ(result.errors.size(), 5u);
  for (const std::exception_ptr& error : result.errors) {
    EXPECT_THAT(testing::messageOf<RecoverableDeviceError>(error), HasSubstr("compute job 0 failed"));
  }
}

// Runs `jobs` compute jobs one at a time, resetting after each failure;
// returns the numbers of the jobs that failed.
std::vector<uint64_t> failingJobs(const SimDeviceConfig& config, int jobs) {
  SimDevice device(0, config);
  std::vector<uint64_t> failed;
  for (int i = 0; i < jobs; ++i) {
    const std::exception_ptr error = testing::runNothing(device);
    if (error != nullptr) {
      EXPECT_THAT(testing::messageOf<RecoverableDeviceError>(error), HasSubstr("injected fault 'reset'"));
      failed.push_back(static_cast<uint64_t>(i));
      device.reset();
    }
  }
  EXPECT_EQ(device.resetCount(), failed.size());
  return failed;
}

TEST(SimDevice, RandomFaultsFollowTheRateAndRepeatWithTheSeed) {
  SimDeviceConfig config;
  config.fault_rates[static_cast<size_t>(FaultKind::kRecoverableReset)] = 0.1;
  config.fault_seed = 7;
  const std::vector<uint64_t> first = failingJobs(config, 1000);
  // Binomial(1000, 0.1): mean 100, standard deviation 9.5; 40..180 is far
  // outside anything a correct generator produces.
  EXPECT_GE(first.size(), 40u);
  EXPECT_LE(first.size(), 180u);
  EXPECT_EQ(failingJobs(config, 1000), first);
  config.fault_seed = 8;
  EXPECT_NE(failingJobs(config, 1000), first);
}

TEST(SimDevice, InvalidFaultRateIsRefused) {
  SimDeviceConfig config;
  config.fault_rates[0] = 1.5;
  EXPECT_THROW(SimDevice(0, config), UsageError);
}

// ---- Environment -------------------------------------------------------------

class SimEnvironment : public ::testing::Test {
 protected:
  static constexpr const char* kVariables[] = {
      "KILN_SIM_DEVICES",    "KILN_SIM_MEMORY",     "KILN_SIM_LATENCY_US",  "KILN_SIM_BANDWIDTH_GBPS",
      "KILN_SIM_THREADS",    "KILN_SIM_FAULTS",     "KILN_SIM_FAULT_RATE", "KILN_SIM_FAULT_SEED",
      "KILN_DEVICE_LOCK_DIR", "KILN_CUDA_FAULTS",  "KILN_CUDA_ILLEGAL_ADDRESS"};
  void SetUp() override {
    for (const char* name : kVariables) ::unsetenv(name);
  }
  void TearDown() override { SetUp(); }

  static std::string errorFor(const char* name, const char* value) {
    ::setenv(name, value, 1);
    try {
      DeviceManagerOptions::fromEnvironment();
    } catch (const UsageError& e) {
      ::unsetenv(name);
      return e.what();
    }
    ::unsetenv(name);
    return "<accepted>";
  }
};

TEST_F(SimEnvironment, DefaultsWithoutVariables) {
  const DeviceManagerOptions options = DeviceManagerOptions::fromEnvironment();
  EXPECT_EQ(options.sim_devices, 0u);
  EXPECT_EQ(options.sim.memory_bytes, 256ull << 20);
  EXPECT_EQ(options.lock_dir, fmt::format("/tmp/kiln-devices-{}", ::getuid()));
}

TEST_F(SimEnvironment, ParsesEveryVariable) {
  ::setenv("KILN_SIM_DEVICES", "3", 1);
  ::setenv("KILN_SIM_MEMORY", "512M", 1);
  ::setenv("KILN_SIM_LATENCY_US", "50", 1);
  ::setenv("KILN_SIM_BANDWIDTH_GBPS", "12.5", 1);
  ::setenv("KILN_SIM_THREADS", "4", 1);
  ::setenv("KILN_SIM_FAULTS", "app@3,reset@10, rerun@12,unknown@20,restart@30", 1);
  ::setenv("KILN_SIM_FAULT_RATE", "reset=0.01,app=0.001", 1);
  ::setenv("KILN_SIM_FAULT_SEED", "99", 1);
  ::setenv("KILN_DEVICE_LOCK_DIR", "/var/tmp/kiln-locks", 1);
  const DeviceManagerOptions options = DeviceManagerOptions::fromEnvironment();
  EXPECT_EQ(options.sim_devices, 3u);
  EXPECT_EQ(options.sim.memory_bytes, 512ull << 20);
  EXPECT_EQ(options.sim.transfer_latency_ns, 50'000u);
  EXPECT_EQ(options.sim.transfer_bytes_per_second, 12.5e9);
  EXPECT_EQ(options.sim.compute_threads, 4u);
  ASSERT_EQ(options.sim.fault_script.size(), 5u);
  EXPECT_EQ(options.sim.fault_script[0].kind, FaultKind::kApplicationError);
  EXPECT_EQ(options.sim.fault_script[0].at_job, 3u);
  EXPECT_EQ(options.sim.fault_script[1].kind, FaultKind::kRecoverableReset);
  EXPECT_EQ(options.sim.fault_script[1].at_job, 10u);
  EXPECT_EQ(options.sim.fault_script[2].kind, FaultKind::kRecoverableRerun);
  EXPECT_EQ(options.sim.fault_script[2].at_job, 12u);
  EXPECT_EQ(options.sim.fault_script[3].kind, FaultKind::kUnknown);
  EXPECT_EQ(options.sim.fault_script[3].at_job, 20u);
  EXPECT_EQ(options.sim.fault_script[4].kind, FaultKind::kRecoverableRestart);
  EXPECT_EQ(options.sim.fault_script[4].at_job, 30u);
  EXPECT_EQ(options.sim.fault_rates[static_cast<size_t>(FaultKind::kRecoverableReset)], 0.01);
  EXPECT_EQ(options.sim.fault_rates[static_cast<size_t>(FaultKind::kApplicationError)], 0.001);
  EXPECT_EQ(options.sim.fault_rates[static_cast<size_t>(FaultKind::kRecoverableRerun)], 0);
  EXPECT_EQ(options.sim.fault_seed, 99u);
  EXPECT_EQ(options.lock_dir, "/var/tmp/kiln-locks");

  ::setenv("KILN_SIM_MEMORY", "2G", 1);
  EXPECT_EQ(DeviceManagerOptions::fromEnvironment().sim.memory_bytes, 2ull << 30);
  ::setenv("KILN_SIM_MEMORY", "64k", 1);
  EXPECT_EQ(DeviceManagerOptions::fromEnvironment().sim.memory_bytes, 64ull << 10);
  ::setenv("KILN_SIM_MEMORY", "1000", 1);
  EXPECT_EQ(DeviceManagerOptions::fromEnvironment().sim.memory_bytes, 1000u);
}

TEST_F(SimEnvironment, BadValuesNameTheVariableAndTheValue) {
  EXPECT_EQ(errorFor("KILN_SIM_FAULTS", "reset10"),
            "KILN_SIM_FAULTS: expected kind@job like 'reset@10' (kinds: app, reset, rerun, unknown, restart), "
            "got 'reset10'");
  EXPECT_EQ(errorFor("KILN_SIM_FAULTS", "reset@10,crash@3"),
            "KILN_SIM_FAULTS: expected kind@job like 'reset@10' (kinds: app, reset, rerun, unknown, restart), "
            "got 'crash@3'");
  EXPECT_EQ(errorFor("KILN_SIM_DEVICES", "two"), "KILN_SIM_DEVICES: expected a whole number from 0 to 1024, got 'two'");
  EXPECT_EQ(errorFor("KILN_SIM_DEVICES", "-1"), "KILN_SIM_DEVICES: expected a whole number from 0 to 1024, got '-1'");
  EXPECT_EQ(errorFor("KILN_SIM_MEMORY", "12X"),
            "KILN_SIM_MEMORY: expected a size in bytes with an optional suffix K, M or G, like '256M', got '12X'");
  EXPECT_THAT(errorFor("KILN_SIM_MEMORY", "0"), HasSubstr("KILN_SIM_MEMORY: expected"));
  EXPECT_EQ(errorFor("KILN_SIM_LATENCY_US", "fast"), "KILN_SIM_LATENCY_US: expected a number >= 0, got 'fast'");
  EXPECT_EQ(errorFor("KILN_SIM_BANDWIDTH_GBPS", "-3"), "KILN_SIM_BANDWIDTH_GBPS: expected a number >= 0, got '-3'");
  EXPECT_THAT(errorFor("KILN_SIM_THREADS", "0"), HasSubstr("KILN_SIM_THREADS: expected a whole number from 1"));
  EXPECT_THAT(errorFor("KILN_SIM_FAULT_RATE", "reset=2"),
              HasSubstr("KILN_SIM_FAULT_RATE: expected kind=rate with a rate from 0 to 1"));
  EXPECT_THAT(errorFor("KILN_SIM_FAULT_RATE", "reset"), HasSubstr("got 'reset'"));
  EXPECT_THAT(errorFor("KILN_SIM_FAULT_SEED", "1.5"), HasSubstr("KILN_SIM_FAULT_SEED: expected a whole number"));
  EXPECT_EQ(errorFor("KILN_CUDA_ILLEGAL_ADDRESS", "3,x"),
            "KILN_CUDA_ILLEGAL_ADDRESS: expected compute job numbers like '3,7', got 'x'");
}

// The cuda devices' variables parse without a GPU.
TEST_F(SimEnvironment, ParsesTheCudaFaultVariables) {
  ::setenv("KILN_CUDA_FAULTS", "reset@2", 1);
  ::setenv("KILN_CUDA_ILLEGAL_ADDRESS", "3, 7", 1);
  const DeviceManagerOptions options = DeviceManagerOptions::fromEnvironment();
  ASSERT_EQ(options.cuda.fault_script.size(), 1u);
  EXPECT_EQ(options.cuda.fault_script[0].kind, FaultKind::kRecoverableReset);
  EXPECT_EQ(options.cuda.illegal_address_at_jobs, (std::vector<uint64_t>{3, 7}));
  EXPECT_TRUE(options.sim.fault_script.empty());
}

}  // namespace
}  // namespace kiln
