// What only the cuda device does: its error mapping (tested everywhere,
// since cuda_errors.h needs no CUDA), and on a machine with a GPU: what it
// reports, out-of-memory as a clear error, injected faults of every class,
// and a real context-corrupting fault (an illegal address), after which
// only another process can use the GPU. Tests that need a
// GPU skip with the reason where there is none.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/cuda_errors.h"
#include "tests/device/device_test_util.h"
#if KILN_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace kiln {
namespace {

using ::testing::HasSubstr;
namespace ce = cuda_errors;

TEST(CudaErrors, MapOntoTheReferenceErrorClasses) {
  EXPECT_EQ(ce::classify(ce::kMemoryAllocation), FaultKind::kRecoverableRerun);
  for (int code : {ce::kIllegalAddress, ce::kLaunchFailure, ce::kAssert, ce::kMisalignedAddress,
                   ce::kIllegalInstruction, ce::kHardwareStackError, ce::kInvalidPc, ce::kLaunchTimeout,
                   ce::kEccUncorrectable, ce::kInvalidAddressSpace}) {
    EXPECT_EQ(ce::classify(code), FaultKind::kRecoverableRestart) << code;
    EXPECT_TRUE(ce::corruptsContext(code)) << code;
  }
  for (int code : {ce::kInvalidValue, ce::kInvalidConfiguration, ce::kInvalidDeviceFunction,
                   ce::kNoKernelImageForDevice, ce::kLaunchOutOfResources}) {
    EXPECT_EQ(ce::classify(code), FaultKind::kApplicationError) << code;
    EXPECT_FALSE(ce::corruptsContext(code)) << code;
  }
  EXPECT_EQ(ce::classify(999), FaultKind::kUnknown);  // cudaErrorUnknown
  EXPECT_EQ(ce::classify(100), FaultKind::kUnknown);  // cudaErrorNoDevice
  EXPECT_FALSE(ce::corruptsContext(ce::kMemoryAllocation));
}

TEST(CudaDevice, AManagerWithoutGpusRefusesCudaPackagesClearly) {
  DeviceManager manager;
  bool gpu = false;
  for (const DeviceInfo& info : manager.devices()) gpu |= info.kind == DeviceKind::kCuda;
  if (gpu) GTEST_SKIP() << "this machine has a GPU";
  Target target;
  target.device_kind = "cuda";
  try {
    manager.getDevice(target);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("no cuda device on this machine"),
                                           HasSubstr("this build of kiln has no CUDA device")));
  }
}

#if KILN_HAVE_CUDA

bool haveGpu() { return !CudaDevice::describeAll().empty(); }

#define REQUIRE_GPU() \
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine"

TEST(CudaDevice, ReportsTheGpu) {
  REQUIRE_GPU();
  CudaDevice device(0, CudaDeviceConfig{});
  EXPECT_EQ(device.id(), "cuda:0");
  EXPECT_EQ(device.info().kind, DeviceKind::kCuda);
  EXPECT_GT(device.info().memory_bytes, 1ull << 30);
  ASSERT_FALSE(device.info().features.empty());
  EXPECT_THAT(device.info().features.front(), ::testing::StartsWith("sm_"));
  EXPECT_FALSE(device.usesHostMemory());
  EXPECT_NE(device.kernelQueue(), nullptr);
}

TEST(CudaDevice, AllocationBeyondTheGpuIsAClearErrorAndChangesNothing) {
  REQUIRE_GPU();
  CudaDevice device(0, CudaDeviceConfig{});
  DeviceBuffer small = device.allocate(1 << 20);
  const uint64_t before = device.memoryInUse();
  try {
    device.allocate(device.info().memory_bytes * 2);
    FAIL() << "expected RecoverableDeviceError";
  } catch (const RecoverableDeviceError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cuda:0: out of device memory"));
    EXPECT_EQ(e.recoveryAction(), RecoveryAction::kRerun);
  }
  EXPECT_EQ(device.memoryInUse(), before);
  // The device still works.
  std::vector<unsigned char> in(1 << 20, 7), out(1 << 20, 0);
  ASSERT_EQ(testing::copyToDevice(device, small, in.data(), in.size()), nullptr);
  ASSERT_EQ(testing::copyToHost(device, out.data(), small, out.size()), nullptr);
  EXPECT_EQ(in, out);
}

TEST(CudaDevice, InjectedFaultsHaveTheirClassAndResetClearsThemButRestart) {
  REQUIRE_GPU();
  for (FaultKind kind : {FaultKind::kApplicationError, FaultKind::kRecoverableReset, FaultKind::kRecoverableRerun,
                         FaultKind::kUnknown, FaultKind::kRecoverableRestart}) {
    SCOPED_TRACE(faultKindName(kind));
    CudaDeviceConfig config;
    config.fault_script = {{1, kind}};
    CudaDevice device(0, config);
    EXPECT_EQ(testing::runNothing(device), nullptr);
    const std::exception_ptr failure = testing::runNothing(device);
    ASSERT_NE(failure, nullptr);
    const std::exception_ptr after = testing::runNothing(device);
    EXPECT_EQ(after == nullptr, kind == FaultKind::kRecoverableRerun);
    if (kind == FaultKind::kRecoverableRestart) {
      EXPECT_THROW(device.reset(), RecoverableDeviceError);
      EXPECT_NE(testing::runNothing(device), nullptr);
      continue;
    }
    device.reset();
    EXPECT_EQ(testing::runNothing(device), nullptr);
  }
}

// A kernel that writes through a wild pointer (after compute job 1, as
// CudaDeviceConfig::illegal_address_at_jobs asks) corrupts the CUDA
// context: the job fails with RecoverableDeviceError, action "restart the
// process"; later jobs and copies fail with it, reset() throws it, and no
// other device on the GPU can be made in this process. Runs in a child
// process; returns the number of the check that failed.
int illegalAddressScenario() {
  CudaDeviceConfig config;
  config.illegal_address_at_jobs = {1};
  CudaDevice device(0, config);
  std::vector<unsigned char> in(1 << 20, 7), out(1 << 20, 0);
  DeviceBuffer buffer = device.allocate(in.size());
  if (testing::copyToDevice(device, buffer, in.data(), in.size()) != nullptr) return 1;
  if (testing::runNothing(device) != nullptr) return 2;
  auto restartClass = [](const std::exception_ptr& error, const char* text) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const RecoverableDeviceError& e) {
      return e.recoveryAction() == RecoveryAction::kRestartProcess &&
             std::string(e.what()).find(text) != std::string::npos;
    } catch (...) {
    }
    return false;
  };
  if (!restartClass(testing::runNothing(device), "illegal memory access")) return 3;
  if (!restartClass(testing::runNothing(device), "unusable in this process after")) return 4;
  if (!restartClass(testing::copyToHost(device, out.data(), buffer, out.size()), "unusable in this process")) return 5;
  std::exception_ptr reset_error;
  try {
    device.reset();
  } catch (...) {
    reset_error = std::current_exception();
  }
  if (!restartClass(reset_error, "cannot be reset in this process")) return 6;
  if (device.resetCount() != 0) return 7;
  if (testing::runNothing(device) == nullptr) return 8;
  try {
    CudaDevice another(0, CudaDeviceConfig{});
    if (testing::runNothing(another) == nullptr) return 9;  // CUDA gave this process the GPU again
  } catch (const Error&) {
    // CUDA refuses the process the GPU: what the error class says.
  }
  return 0;
}

TEST(CudaDevice, AnIllegalAddressLeavesTheGpuToOtherProcessesOnly) {
  REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(illegalAddressScenario()), ::testing::ExitedWithCode(0), "");
  // This process (a new one as far as CUDA is concerned) uses the GPU.
  CudaDevice device(0, CudaDeviceConfig{});
  EXPECT_EQ(testing::runNothing(device), nullptr);
}

#endif  // KILN_HAVE_CUDA

}  // namespace
}  // namespace kiln
