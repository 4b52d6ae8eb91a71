// The device conformance suite: every device kind (cpu, sim with and without
// transfer costs, cuda where the build has CUDA and the machine a GPU) must
// pass these tests unchanged. Devices are attached through DeviceManager, as
// a runtime would. The one kernel the tests run (doubling floats) runs as
// host code on cpu and sim and as a CUDA kernel on cuda.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include "core/elementwise_program.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "tests/device/device_test_util.h"
#include "tests/support/allocation_counter.h"
#if KILN_HAVE_CUDA
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_launch.h"
#endif

namespace kiln {
namespace {

using testing::JobWaiter;
using testing::TempLockDir;

struct DeviceParam {
  const char* name;
  const char* id;  // for getSpecificDevice
  uint64_t latency_ns;
  double bytes_per_second;
};

class DeviceConformance : public ::testing::TestWithParam<DeviceParam> {
 protected:
  void SetUp() override {
    DeviceManagerOptions options;
    options.sim_devices = 1;
    options.sim.memory_bytes = 64ull << 20;
    options.sim.transfer_latency_ns = GetParam().latency_ns;
    options.sim.transfer_bytes_per_second = GetParam().bytes_per_second;
    options.lock_dir = lock_dir_.path();
    manager_ = std::make_unique<DeviceManager>(options);
    if (std::string_view(GetParam().id).starts_with("cuda")) {
      bool present = false;
      for (const DeviceInfo& info : manager_->devices()) present |= info.id == GetParam().id;
      if (!present) GTEST_SKIP() << "no GPU on this machine (or kiln built without CUDA)";
    }
    device_ = manager_->getSpecificDevice(GetParam().id);
    ASSERT_EQ(device_->id(), GetParam().id);
  }

  TempLockDir lock_dir_;
  std::unique_ptr<DeviceManager> manager_;
  std::shared_ptr<Device> device_;
};

TEST_P(DeviceConformance, RoundTripOfRandomBytes) {
  std::mt19937 random(42);
  // The last size spans several of cuda's pinned staging chunks (8 MiB) and
  // ends inside one.
  for (size_t size : {size_t{1}, size_t{3}, size_t{64}, size_t{1000}, size_t{65543}, size_t{4} << 20,
                      (size_t{25} << 20) + 12345}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> input(size), output(size, 0);
    for (auto& byte : input) byte = static_cast<unsigned char>(random());
    DeviceBuffer buffer = device_->allocate(size);
    ASSERT_TRUE(buffer);
    EXPECT_EQ(buffer.size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 64, 0u);
    ASSERT_EQ(testing::copyToDevice(*device_, buffer, input.data(), size), nullptr);
    ASSERT_EQ(testing::copyToHost(*device_, output.data(), buffer, size), nullptr);
    EXPECT_EQ(input, output);
  }
}

// Copy in, double in device memory, copy out: each step submitted from the
// previous one's done, as the model runner chains them.
struct Chain {
  Device* device;
  float* device_floats;
  size_t count;
  DeviceJob up, compute, down;
  JobWaiter finished;

  // Points the three jobs at `buffer` and the host arrays.
  void wire(Device& target, const DeviceBuffer& buffer, const float* input, float* output, size_t floats) {
    device = &target;
    device_floats = reinterpret_cast<float*>(buffer.data());
    count = floats;
    for (DeviceJob* job : {&up, &compute, &down}) {
      job->owner = this;
      job->done = &Chain::next;
    }
    up.kind = DeviceJob::Kind::kCopyToDevice;
    up.destination = buffer.data();
    up.source = reinterpret_cast<const std::byte*>(input);
    up.bytes = floats * sizeof(float);
    compute.kind = DeviceJob::Kind::kCompute;
    compute.compute = &Chain::doubleAll;
    compute.context = this;
    down.kind = DeviceJob::Kind::kCopyToHost;
    down.destination = reinterpret_cast<std::byte*>(output);
    down.source = buffer.data();
    down.bytes = floats * sizeof(float);
  }

  // Submits the first job and waits for the last; returns the first error.
  std::exception_ptr run() {
    {
      std::lock_guard lock(finished.mutex);
      finished.finished = false;
      finished.error = nullptr;
    }
    device->submit(up);
    return finished.wait();
  }

  static void doubleAll(void* context) {
    auto* chain = static_cast<Chain*>(context);
#if KILN_HAVE_CUDA
    if (chain->device->info().kind == DeviceKind::kCuda) {
      // Device memory: a kernel does it (x * 2 as a one-instruction program).
      cuda::DeviceProgram program;
      program.ops = 1;
      program.inputs = 1;
      program.immediates = 1;
      program.op[0] = static_cast<uint8_t>(ElementwiseOp::kMul);
      program.a[0] = 0;
      program.b[0] = 1;
      program.immediate[0] = 2.0f;
      cuda::Pointers pointers;
      pointers.in[0] = chain->device_floats;
      pointers.out = chain->device_floats;
      cuda::launchElementwise(program, cuda::Indexing{}, pointers, chain->count,
                              cuda::queueOf(chain->device->kernelQueue()).stream);
      return;
    }
#endif
    for (size_t i = 0; i < chain->count; ++i) chain->device_floats[i] *= 2;
  }
  static void next(DeviceJob& job, std::exception_ptr error) {
    auto* chain = static_cast<Chain*>(job.owner);
    if (error == nullptr && &job != &chain->down) {
      chain->device->submit(&job == &chain->up ? chain->compute : chain->down);
      return;
    }
    std::lock_guard lock(chain->finished.mutex);
    chain->finished.error = std::move(error);
    chain->finished.finished = true;
    chain->finished.cv.notify_all();
  }
};

TEST_P(DeviceConformance, CopyComputeCopyChainedFromDone) {
  const size_t count = 100000;
  std::vector<float> input(count), output(count, 0);
  for (size_t i = 0; i < count; ++i) input[i] = static_cast<float>(i) - 7.5f;
  DeviceBuffer buffer = device_->allocate(count * sizeof(float));
  Chain chain;
  chain.wire(*device_, buffer, input.data(), output.data(), count);

  // Twice, reusing the same jobs: they are the caller's to reuse.
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(chain.run(), nullptr);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(output[i], input[i] * 2) << i;
    input.swap(output);
    chain.wire(*device_, buffer, input.data(), output.data(), count);
  }
}

// DESIGN.md: no allocation in the steady state. Once jobs and buffers
// exist, submitting and completing them touches no heap on any thread.
TEST_P(DeviceConformance, SteadyStateSubmissionAllocatesNothing) {
  const size_t count = 1024;
  std::vector<float> input(count, 1.0f), output(count, 0);
  DeviceBuffer buffer = device_->allocate(count * sizeof(float));
  Chain chain;
  chain.wire(*device_, buffer, input.data(), output.data(), count);
  ASSERT_EQ(chain.run(), nullptr);  // warm-up

  bool all_succeeded = true;
  testing::startCountingAllocations();
  for (int round = 0; round < 100; ++round) all_succeeded &= chain.run() == nullptr;
  device_->synchronize();
  const testing::AllocationCount allocations = testing::stopCountingAllocations();
  EXPECT_TRUE(all_succeeded);
  EXPECT_EQ(allocations.news, 0u);
  EXPECT_EQ(allocations.mallocs, 0u);
  EXPECT_EQ(output, std::vector<float>(count, 2.0f));
}

TEST_P(DeviceConformance, JobsCompleteInSubmissionOrderPerQueue) {
  const int kJobs = 1000;
  struct Record {
    std::vector<int> copies, computes;  // each written by one device thread
  } record;
  std::vector<DeviceJob> jobs(2 * kJobs);
  std::vector<int> indices(2 * kJobs);
  std::vector<std::byte> source(16, std::byte{1}), sink(16);
  DeviceBuffer buffer = device_->allocate(16);
  for (int i = 0; i < 2 * kJobs; ++i) {
    DeviceJob& job = jobs[i];
    indices[i] = i;
    job.owner = &record;
    job.context = &indices[i];
    if (i % 2 == 0) {
      job.kind = DeviceJob::Kind::kCopyToDevice;
      job.destination = buffer.data();
      job.source = source.data();
      job.bytes = source.size();
      job.done = [](DeviceJob& j, std::exception_ptr) {
        static_cast<Record*>(j.owner)->copies.push_back(*static_cast<int*>(j.context));
      };
    } else {
      job.kind = DeviceJob::Kind::kCompute;
      job.compute = [](void*) {};
      job.done = [](DeviceJob& j, std::exception_ptr) {
        static_cast<Record*>(j.owner)->computes.push_back(*static_cast<int*>(j.context));
      };
    }
    device_->submit(job);
  }
  device_->synchronize();
  ASSERT_EQ(record.copies.size(), size_t{kJobs});
  ASSERT_EQ(record.computes.size(), size_t{kJobs});
  for (int i = 0; i < kJobs; ++i) {
    EXPECT_EQ(record.copies[i], 2 * i);
    EXPECT_EQ(record.computes[i], 2 * i + 1);
  }
}

TEST_P(DeviceConformance, SynchronizeWaitsForEveryJob) {
  const int kJobs = 50;
  std::atomic<int> finished{0};
  std::vector<DeviceJob> jobs(kJobs);
  for (DeviceJob& job : jobs) {
    job.kind = DeviceJob::Kind::kCompute;
    // Some work that takes a while, so that synchronize has something to wait for.
    job.compute = [](void*) { std::this_thread::sleep_for(std::chrono::microseconds(500)); };
    job.owner = &finished;
    job.done = [](DeviceJob& j, std::exception_ptr) { static_cast<std::atomic<int>*>(j.owner)->fetch_add(1); };
    device_->submit(job);
  }
  device_->synchronize();
  EXPECT_EQ(finished.load(), kJobs);
  device_->synchronize();  // nothing queued: returns at once
}

TEST_P(DeviceConformance, ComputeExceptionArrivesAsTheJobErrorAndTheDeviceKeepsWorking) {
  const uint64_t before = device_->computeJobs();
  // Whatever a kernel throws arrives as a DeviceError of the device: an
  // ApplicationRuntimeError with the kernel's message; a DeviceError as it is.
  auto thrower = [] { throw std::runtime_error("kernel refused its input"); };
  std::exception_ptr error = testing::runCompute(*device_, thrower);
  EXPECT_EQ(testing::messageOf<ApplicationRuntimeError>(error),
            device_->id() + ": the program failed: kernel refused its input");
  auto device_thrower = [this] { throw RecoverableDeviceError(device_->id(), "lost a lane", RecoveryAction::kRerun); };
  error = testing::runCompute(*device_, device_thrower);
  EXPECT_EQ(testing::messageOf<RecoverableDeviceError>(error),
            device_->id() + ": lost a lane (recovery action: rerun)");

  int ran = 0;
  auto counter = [&ran] { ++ran; };
  EXPECT_EQ(testing::runCompute(*device_, counter), nullptr);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(device_->computeJobs(), before + 3);

  std::vector<unsigned char> input(100, 7), output(100, 0);
  DeviceBuffer buffer = device_->allocate(100);
  EXPECT_EQ(testing::copyToDevice(*device_, buffer, input.data(), 100), nullptr);
  EXPECT_EQ(testing::copyToHost(*device_, output.data(), buffer, 100), nullptr);
  EXPECT_EQ(input, output);
}

TEST_P(DeviceConformance, MemoryInUseGoesUpAndBackDown) {
  const uint64_t before = device_->memoryInUse();
  {
    DeviceBuffer a = device_->allocate(1000);
    DeviceBuffer b = device_->allocate(1 << 20);
    EXPECT_GE(device_->memoryInUse(), before + 1000 + (1 << 20));
    DeviceBuffer moved = std::move(a);
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    EXPECT_GE(device_->memoryInUse(), before + 1000 + (1 << 20));
    b = DeviceBuffer();  // move-assigning releases what b held
    EXPECT_LT(device_->memoryInUse(), before + (1 << 20));
  }
  EXPECT_EQ(device_->memoryInUse(), before);
}

TEST_P(DeviceConformance, MalformedJobIsRefusedBeforeQueueing) {
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCompute;
  job.done = [](DeviceJob&, std::exception_ptr) {};
  EXPECT_THROW(device_->submit(job), UsageError);  // no compute function
  device_->synchronize();
}

TEST_P(DeviceConformance, ResetCounts) {
  const uint64_t before = device_->resetCount();
  device_->reset();
  EXPECT_EQ(device_->resetCount(), before + 1);
  EXPECT_EQ(testing::runNothing(*device_), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceConformance,
                         ::testing::Values(DeviceParam{"cpu", "cpu", 0, 0}, DeviceParam{"sim", "sim:0", 0, 0},
                                           DeviceParam{"sim_200us_1GBps", "sim:0", 200'000, 1e9},
                                           DeviceParam{"cuda", "cuda:0", 0, 0}),
                         [](const ::testing::TestParamInfo<DeviceParam>& param) { return param.param.name; });

}  // namespace
}  // namespace kiln
