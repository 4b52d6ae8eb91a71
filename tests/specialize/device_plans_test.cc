// DynamicExecutor on a GPU: a graph package compiled for cuda runs each
// signature there, matching the host's results; device errors reach the
// caller in their classes, and one that needs a reset leaves the executor
// working on the next call. Without a GPU the package is refused clearly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "kiln/compiler.h"
#include "kiln/dynamic_executor.h"
#include "kiln/error.h"

namespace kiln {
namespace {

bool gpuPresent() {
  for (const DeviceInfo& info : DeviceManager(DeviceManagerOptions{}).devices()) {
    if (info.kind == DeviceKind::kCuda) return true;
  }
  return false;
}

ConstantPtr floats(std::vector<int64_t> shape, float scale) {
  TensorInfo info{DType::kF32, shape};
  std::vector<float> values(static_cast<size_t>(info.numElements()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = scale * static_cast<float>(static_cast<int>(i % 13) - 6);
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(info, std::move(bytes));
}

// y = Relu(x[batch, 8] @ W[8, 16] + b) * 0.5: a product (cuBLASLt), an
// elementwise program, a weight large enough to be a package constant.
std::filesystem::path writeModel(const std::string& target, const std::string& tag) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType{DType::kF32, std::vector<Dim>{Dim::symbolic("batch"), Dim::known(8)}});
  const ValueId w = graph.addInitializer("W", floats({8, 16}, 0.125f));
  const ValueId b = graph.addInitializer("b", floats({16}, 0.25f));
  const ValueId half = graph.addInitializer("half", floats({}, -1.0f / 12));  // element 0: 6/12
  const ValueId product = graph.node(graph.addNode("MatMul", {x, w}, {"p"})).outputs[0];
  const ValueId biased = graph.node(graph.addNode("Add", {product, b}, {"s"})).outputs[0];
  const ValueId relu = graph.node(graph.addNode("Relu", {biased}, {"r"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Mul", {relu, half}, {"y"})).outputs[0]);
  const auto path = std::filesystem::temp_directory_path() /
                    ("kiln_device_plans_" + std::to_string(::getpid()) + "_" + tag + ".kiln");
  CompileOptions options;
  options.target = target;
  const CompileReport report = compile(graph, {{"", 17}}, path, options);
  EXPECT_TRUE(report.runtime_shapes);
  return path;
}

std::vector<float> runOnce(DynamicExecutor& executor, int64_t batch) {
  const TensorInfo info{DType::kF32, {batch, 8}};
  std::vector<float> x(static_cast<size_t>(batch * 8)), y(static_cast<size_t>(batch * 16));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
  std::byte* out[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run({&info, 1}, in, out);
  return y;
}

// cuBLASLt and the host's product sum in different orders.
void expectNear(const std::vector<float>& got, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-5f) << what << " at " << i;
}

TEST(DevicePlans, CudaPackageWithoutAGpuIsRefusedClearly) {
  if (gpuPresent()) GTEST_SKIP() << "this machine has a GPU";
  const auto path = writeModel("cuda", "no_gpu");
  try {
    DynamicExecutor executor(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    // A CUDA build says the machine has no GPU, a build without CUDA that it has none.
    const std::string message = e.what();
    EXPECT_TRUE(message.find("no cuda device on this machine") != std::string::npos ||
                message.find("no CUDA device") != std::string::npos)
        << message;
  }
  std::filesystem::remove(path);
}

TEST(DevicePlans, EachSignatureRunsOnTheGpuAsOnTheHost) {
  if (!gpuPresent()) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
  const auto cpu_path = writeModel("cpu", "host");
  const auto cuda_path = writeModel("cuda", "gpu");
  DynamicExecutor host(cpu_path);
  DynamicExecutor gpu(cuda_path, "", DynamicExecutorOptions{.plan_cache_capacity = 2});
  for (int64_t batch : {1, 5, 64, 64, 1}) {
    expectNear(runOnce(gpu, batch), runOnce(host, batch), "batch " + std::to_string(batch));
  }
  // 1, 5, 64 compiled; 64 again from the cache; 1 again after the capacity
  // of 2 evicted it.
  EXPECT_EQ(gpu.memoryStats().plan_cache_misses, 4u);
  EXPECT_EQ(gpu.memoryStats().plan_cache_hits, 1u);
  EXPECT_GT(gpu.memoryStats().arena_bytes, 0u);
  gpu.shrink();
  EXPECT_EQ(gpu.memoryStats().arena_bytes, 0u);
  expectNear(runOnce(gpu, 3), runOnce(host, 3), "after shrink");
  std::filesystem::remove(cpu_path);
  std::filesystem::remove(cuda_path);
}

// Options that run a DynamicExecutor on a GPU the manager attaches.
DynamicExecutorOptions onTheGpu(DeviceManager& manager) {
  DynamicExecutorOptions options;
  Target target;
  target.device_kind = "cuda";
  options.device = manager.getDevice(target);
  return options;
}

TEST(DevicePlans, AResetErrorReachesTheCallerAndTheNextCallWorks) {
  if (!gpuPresent()) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
  const auto cpu_path = writeModel("cpu", "host_reset");
  const auto cuda_path = writeModel("cuda", "gpu_reset");
  DeviceManagerOptions options;
  options.cuda.fault_script = {ScriptedFault{1, FaultKind::kRecoverableReset}};  // the second compute job
  DeviceManager manager(options);
  DynamicExecutorOptions executor_options = onTheGpu(manager);
  DynamicExecutor gpu(cuda_path, "", executor_options);
  DynamicExecutor host(cpu_path);
  expectNear(runOnce(gpu, 4), runOnce(host, 4), "before the fault");
  try {
    runOnce(gpu, 4);
    FAIL() << "expected the injected fault";
  } catch (const RecoverableDeviceError& e) {
    EXPECT_EQ(e.recoveryAction(), RecoveryAction::kDeviceReset);
  }
  EXPECT_EQ(gpu.memoryStats().cached_plans, 0u);  // the device's memory was lost with the reset
  expectNear(runOnce(gpu, 4), runOnce(host, 4), "after the reset");
  EXPECT_EQ(executor_options.device->resetCount(), 1u);
  std::filesystem::remove(cpu_path);
  std::filesystem::remove(cuda_path);
}

// A real illegal address corrupts the CUDA context: the call gets the
// restart-the-process error, and so does every later one (no reset can
// help in this process). In a child process; returns the failed check.
int illegalAddressInADynamicExecutor() {
  const auto cuda_path = writeModel("cuda", "gpu_illegal");
  DeviceManagerOptions options;
  options.cuda.illegal_address_at_jobs = {1};  // after the second compute job
  DeviceManager manager(options);
  DynamicExecutorOptions executor_options = onTheGpu(manager);
  DynamicExecutor gpu(cuda_path, "", executor_options);
  runOnce(gpu, 4);
  for (int call = 0; call < 2; ++call) {
    try {
      runOnce(gpu, 4);
      return 1 + call;
    } catch (const RecoverableDeviceError& e) {
      if (e.recoveryAction() != RecoveryAction::kRestartProcess) return 3;
    }
  }
  std::filesystem::remove(cuda_path);
  return 0;
}

TEST(DevicePlans, AnIllegalAddressFailsEveryLaterCall) {
  if (!gpuPresent()) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(illegalAddressInADynamicExecutor()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kiln
