// DeviceManager: listing devices, choosing one for a target, exclusive
// attachment (within one process and across processes), and waiting for a
// busy device as DeviceWaitConfig says.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/device_lock.h"
#include "tests/device/device_test_util.h"

extern char** environ;

namespace kiln {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class DeviceManagerTest : public ::testing::Test {
 protected:
  DeviceManagerOptions options(uint32_t sim_devices = 2) const {
    DeviceManagerOptions result;
    result.sim_devices = sim_devices;
    result.sim.memory_bytes = 16ull << 20;
    result.lock_dir = lock_dir_.path();
    return result;
  }
  static DeviceConstraints onSim() {
    DeviceConstraints constraints;
    constraints.kind = DeviceKind::kSim;
    return constraints;
  }
  static DeviceWaitConfig waitFor(std::chrono::milliseconds timeout) {
    DeviceWaitConfig wait;
    wait.strategy = WaitStrategy::kWaitWithTimeout;
    wait.timeout = timeout;
    wait.sleep = 10ms;
    return wait;
  }

  testing::TempLockDir lock_dir_;
};

TEST_F(DeviceManagerTest, ListsCpuThenTheSimDevices) {
  DeviceManager manager(options(3));
  std::vector<DeviceInfo> devices = manager.devices();
  // Then the GPUs, on a machine that has any (their own test is cuda_device_test).
  std::erase_if(devices, [](const DeviceInfo& info) { return info.kind == DeviceKind::kCuda; });
  ASSERT_EQ(devices.size(), 4u);
  EXPECT_EQ(devices[0].id, "cpu");
  EXPECT_EQ(devices[0].kind, DeviceKind::kCpu);
  EXPECT_GT(devices[0].memory_bytes, 0u);
  EXPECT_GE(devices[0].compute_threads, 1u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(devices[i + 1].id, fmt::format("sim:{}", i));
    EXPECT_EQ(devices[i + 1].kind, DeviceKind::kSim);
    EXPECT_EQ(devices[i + 1].memory_bytes, 16ull << 20);
  }
}

TEST_F(DeviceManagerTest, AttachesFreeSimDevicesInOrderThenReportsBusy) {
  DeviceManager manager(options(2));
  const Target cpu_target;  // "cpu" packages may run on sim
  std::shared_ptr<Device> first = manager.getDevice(cpu_target, onSim());
  std::shared_ptr<Device> second = manager.getDevice(cpu_target, onSim());
  EXPECT_EQ(first->id(), "sim:0");
  EXPECT_EQ(second->id(), "sim:1");
  try {
    manager.getDevice(cpu_target, onSim());
    FAIL() << "expected DeviceBusyError";
  } catch (const DeviceBusyError& e) {
    const std::string pid = fmt::format("pid {} (kiln_device_tests)", ::getpid());
    EXPECT_THAT(e.what(), HasSubstr("no free sim device: sim:0 is attached by " + pid));
    EXPECT_THAT(e.what(), HasSubstr("sim:1 is attached by " + pid));
    EXPECT_THAT(e.what(), HasSubstr("did not wait (NO_WAIT)"));
  }

  second.reset();  // detaches sim:1
  std::shared_ptr<Device> again = manager.getDevice(cpu_target, onSim());
  EXPECT_EQ(again->id(), "sim:1");
}

TEST_F(DeviceManagerTest, TheLockFileNamesTheHolder) {
  DeviceManager manager(options(1));
  std::shared_ptr<Device> device = manager.getSpecificDevice("sim:0");
  std::ifstream file(lock_dir_.path() / "sim-0.lock");
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), fmt::format("pid {} kiln_device_tests\n", ::getpid()));
  EXPECT_TRUE(DeviceLock::isHeld(lock_dir_.path(), "sim:0"));
  device.reset();
  EXPECT_FALSE(DeviceLock::isHeld(lock_dir_.path(), "sim:0"));
}

TEST_F(DeviceManagerTest, TwoManagersInOneProcessExcludeEachOther) {
  DeviceManager a(options(1)), b(options(1));
  std::shared_ptr<Device> held = a.getSpecificDevice("sim:0");
  EXPECT_THROW(b.getSpecificDevice("sim:0"), DeviceBusyError);
  held.reset();
  EXPECT_EQ(b.getSpecificDevice("sim:0")->id(), "sim:0");
}

TEST_F(DeviceManagerTest, CpuIsNeverLocked) {
  DeviceManager manager(options(0));
  std::shared_ptr<Device> a = manager.getDevice(Target{});
  std::shared_ptr<Device> b = manager.getDevice(Target{});
  std::shared_ptr<Device> c = manager.getSpecificDevice("cpu");
  EXPECT_EQ(a->id(), "cpu");
  EXPECT_EQ(b->id(), "cpu");
  EXPECT_EQ(c->id(), "cpu");
  EXPECT_TRUE(a->usesHostMemory());
  DeviceConstraints two_threads;
  two_threads.cpu_threads = 2;
  EXPECT_EQ(manager.getDevice(Target{}, two_threads)->info().compute_threads, 2u);
}

TEST_F(DeviceManagerTest, WaitWithTimeoutWaitsThenThrows) {
  DeviceManager manager(options(1));
  std::shared_ptr<Device> held = manager.getSpecificDevice("sim:0");
  const auto start = Clock::now();
  try {
    manager.getDevice(Target{}, onSim(), waitFor(200ms));
    FAIL() << "expected DeviceBusyError";
  } catch (const DeviceBusyError& e) {
    EXPECT_GE(Clock::now() - start, 200ms);
    EXPECT_THAT(e.what(), HasSubstr("sim:0 is attached by pid"));
    EXPECT_THAT(e.what(), HasSubstr("ms (WAIT_WITH_TIMEOUT)"));
  }
}

TEST_F(DeviceManagerTest, WaitForeverGetsTheDeviceOnceReleased) {
  DeviceManager manager(options(1));
  std::shared_ptr<Device> held = manager.getSpecificDevice("sim:0");
  std::thread releaser([&held] {
    std::this_thread::sleep_for(100ms);  // the test is about waiting
    held.reset();
  });
  DeviceWaitConfig forever;
  forever.strategy = WaitStrategy::kWaitForever;
  forever.sleep = 10ms;
  const auto start = Clock::now();
  std::shared_ptr<Device> device = manager.getDevice(Target{}, onSim(), forever);
  EXPECT_GE(Clock::now() - start, 50ms);
  EXPECT_EQ(device->id(), "sim:0");
  releaser.join();
}

TEST_F(DeviceManagerTest, RequestsNoDeviceCanServeAreUsageErrors) {
  DeviceManager manager(options(2));
  auto messageOf = [](auto&& attach) -> std::string {
    try {
      attach();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "<no UsageError>";
  };
  EXPECT_THAT(messageOf([&] { manager.getSpecificDevice("sim:7"); }),
              HasSubstr("unknown device 'sim:7': this machine has cpu, sim:0, sim:1"));
  EXPECT_THAT(messageOf([&] { manager.getSpecificDevice("gpu"); }), HasSubstr("unknown device 'gpu'"));

  Target cuda;
  cuda.device_kind = "cuda";
  // Without CUDA in the build, or without a GPU on the machine (a GPU
  // machine serves the request instead).
  bool gpu = false;
  for (const DeviceInfo& info : manager.devices()) gpu |= info.kind == DeviceKind::kCuda;
  if (!gpu) {
    EXPECT_THAT(messageOf([&] { manager.getDevice(cuda); }),
                ::testing::AnyOf("this build of kiln has no CUDA device (build it where the CUDA toolkit is installed)",
                                 "no cuda device on this machine: CUDA sees no GPU (is the NVIDIA driver loaded?)"));
  }

  Target tpu;
  tpu.device_kind = "tpu";
  EXPECT_THAT(messageOf([&] { manager.getDevice(tpu); }), HasSubstr("unknown device kind 'tpu'"));

  Target featured;
  featured.features = {"no-such-feature", "neither-this"};
  EXPECT_THAT(messageOf([&] { manager.getDevice(featured); }),
              HasSubstr("needs the features [no-such-feature, neither-this]"));

  Target sim_target;
  sim_target.device_kind = "sim";
  DeviceConstraints on_cpu;
  on_cpu.kind = DeviceKind::kCpu;
  EXPECT_EQ(messageOf([&] { manager.getDevice(sim_target, on_cpu); }), "a 'sim' package cannot run on a cpu device");

  Target two;
  two.num_devices = 2;
  EXPECT_THAT(messageOf([&] { manager.getDevice(two); }), HasSubstr("asks for 2 devices per replica"));

  DeviceConstraints huge = onSim();
  huge.min_memory_bytes = 1ull << 40;
  EXPECT_EQ(messageOf([&] { manager.getDevice(Target{}, huge); }),
            "asked for a sim device with at least 1.0 TiB of memory; the sim devices have 16.0 MiB");

  DeviceManager no_sims(options(0));
  EXPECT_EQ(messageOf([&] { no_sims.getDevice(sim_target); }),
            "no sim device on this machine: set KILN_SIM_DEVICES or DeviceManagerOptions::sim_devices");
  // None of these attached anything.
  EXPECT_EQ(manager.getDevice(sim_target)->id(), "sim:0");
}

TEST_F(DeviceManagerTest, HostFeaturesAreAccepted) {
  DeviceManager manager(options(1));
  Target target;
  target.features = manager.devices()[0].features;  // everything the host has
  EXPECT_EQ(manager.getDevice(target)->id(), "cpu");
  EXPECT_EQ(manager.getDevice(target, onSim())->id(), "sim:0");
}

// ---- Across processes --------------------------------------------------------

// A kiln_device_lock_holder process; its stdout is a pipe we read from.
class Holder {
 public:
  Holder(const std::filesystem::path& lock_dir, const std::string& id, int hold_ms) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    const std::string dir = lock_dir.string(), hold = std::to_string(hold_ms);
    // The build's helper, or the one the environment names (a test binary
    // moved to another machine: scripts/cuda-bundle).
    const char* helper = std::getenv("KILN_DEVICE_LOCK_HOLDER");
    if (helper == nullptr) helper = KILN_DEVICE_LOCK_HOLDER;
    const char* argv[] = {helper, dir.c_str(), "2", id.c_str(), hold.c_str(), nullptr};
    const int error = ::posix_spawn(&pid_, helper, &actions, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (error != 0) {
      ::close(fds[0]);
      throw std::runtime_error("posix_spawn failed");
    }
    out_ = fds[0];
  }
  ~Holder() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    ::close(out_);
  }

  // Blocks until the helper printed its line (it holds the device then).
  std::string readLine() {
    std::string line;
    char c;
    while (::read(out_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }
  void kill() { ::kill(pid_, SIGKILL); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

TEST_F(DeviceManagerTest, AnotherProcessHoldsTheDeviceUntilItExits) {
  Holder holder(lock_dir_.path(), "sim:0", 300);
  ASSERT_EQ(holder.readLine(), "attached sim:0");
  const pid_t child = holder.pid();

  DeviceManager manager(options(1));
  try {
    manager.getSpecificDevice("sim:0");
    FAIL() << "expected DeviceBusyError";
  } catch (const DeviceBusyError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("sim:0 is attached by pid {} (kiln_device_lock_holder)", child)));
  }

  std::shared_ptr<Device> device = manager.getSpecificDevice("sim:0", waitFor(2000ms));
  EXPECT_EQ(device->id(), "sim:0");
  const int status = holder.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(DeviceManagerTest, AKilledHolderReleasesTheDevice) {
  Holder holder(lock_dir_.path(), "sim:1", 60'000);
  ASSERT_EQ(holder.readLine(), "attached sim:1");
  DeviceManager manager(options(2));
  EXPECT_THROW(manager.getSpecificDevice("sim:1"), DeviceBusyError);
  // getDevice skips the busy sim:1 only when sim:0 is free: take sim:0 first.
  std::shared_ptr<Device> zero = manager.getDevice(Target{}, onSim());
  EXPECT_EQ(zero->id(), "sim:0");

  holder.kill();
  holder.wait();
  std::shared_ptr<Device> one = manager.getDevice(Target{}, onSim(), waitFor(2000ms));
  EXPECT_EQ(one->id(), "sim:1");
}

TEST_F(DeviceManagerTest, AChildDoesNotInheritTheLock) {
  // A process that spawns another while attached (the helper here) must
  // not pass its lock on: the descriptor is close-on-exec.
  DeviceManager manager(options(2));
  std::shared_ptr<Device> zero = manager.getSpecificDevice("sim:0");
  Holder holder(lock_dir_.path(), "sim:1", 60'000);
  ASSERT_EQ(holder.readLine(), "attached sim:1");
  zero.reset();  // the child lives on: it must not be holding sim:0
  EXPECT_FALSE(DeviceLock::isHeld(lock_dir_.path(), "sim:0"));
  EXPECT_TRUE(DeviceLock::isHeld(lock_dir_.path(), "sim:1"));
}

}  // namespace
}  // namespace kiln
