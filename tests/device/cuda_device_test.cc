// What only the cuda device does: its error mapping (tested everywhere,
// since cuda_errors.h needs no CUDA), and on a machine with a GPU: what it
// reports, out-of-memory as a clear error, injected faults of every class,
// and a real context-corrupting fault (an illegal address), after which
// reset() tells the caller to attach the device again. Tests that need a
// GPU skip with the reason where there is none.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/cuda_errors.h"
#include "tests/device/device_test_util.h"
#if KILN_HAVE_CUDA
#include "core/elementwise_program.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_launch.h"
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
    EXPECT_EQ(ce::classify(code), FaultKind::kRecoverableReset) << code;
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

TEST(CudaDevice, InjectedFaultsHaveTheirClassAndResetClearsThem) {
  REQUIRE_GPU();
  for (FaultKind kind : {FaultKind::kApplicationError, FaultKind::kRecoverableReset, FaultKind::kRecoverableRerun,
                         FaultKind::kUnknown}) {
    SCOPED_TRACE(faultKindName(kind));
    CudaDeviceConfig config;
    config.fault_script = {{1, kind}};
    CudaDevice device(0, config);
    EXPECT_EQ(testing::runNothing(device), nullptr);
    const std::exception_ptr failure = testing::runNothing(device);
    ASSERT_NE(failure, nullptr);
    const std::exception_ptr after = testing::runNothing(device);
    EXPECT_EQ(after == nullptr, kind == FaultKind::kRecoverableRerun);
    device.reset();
    EXPECT_EQ(testing::runNothing(device), nullptr);
  }
}

// A kernel that writes through a wild pointer corrupts the CUDA context:
// the job fails as a device-reset error, later jobs fail with it, and
// reset() says the device must be attached again (CUDA frees all memory
// with the context). In a child process: the lost context would fail every
// later test of this one.
void writeThroughAWildPointer(void* context) {
  auto& device = *static_cast<CudaDevice*>(context);
  cuda::DeviceProgram program;
  program.ops = 1;
  program.inputs = 1;
  program.op[0] = static_cast<uint8_t>(ElementwiseOp::kNeg);
  program.a[0] = 0;
  program.b[0] = -1;
  cuda::Pointers pointers;
  pointers.in[0] = reinterpret_cast<const float*>(16);
  pointers.out = reinterpret_cast<float*>(64);
  cuda::launchElementwise(program, cuda::Indexing{}, pointers, 1024, cuda::queueOf(device.kernelQueue()).stream);
}

int illegalAddressScenario() {
  CudaDevice device(0, CudaDeviceConfig{});
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCompute;
  job.compute = &writeThroughAWildPointer;
  job.context = &device;
  const std::exception_ptr error = testing::runJob(device, job);
  try {
    if (error) std::rethrow_exception(error);
    return 1;  // no error at all
  } catch (const RecoverableDeviceError& e) {
    if (e.recoveryAction() != RecoveryAction::kDeviceReset) return 2;
    if (std::string(e.what()).find("illegal") == std::string::npos) return 3;
  } catch (...) {
    return 4;
  }
  if (testing::runNothing(device) == nullptr) return 5;  // sticky until reset
  try {
    device.reset();
    return 6;
  } catch (const UnknownDeviceError& e) {
    if (std::string(e.what()).find("attach it again") == std::string::npos) return 7;
  }
  return 0;
}

TEST(CudaDevice, AnIllegalAddressIsADeviceResetError) {
  REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(illegalAddressScenario()), ::testing::ExitedWithCode(0), "");
}

#endif  // KILN_HAVE_CUDA

}  // namespace
}  // namespace kiln
