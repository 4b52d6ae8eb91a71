// Helpers for the device tests: a private lock directory per test, and
// running device jobs synchronously.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/device.h"

namespace kiln::testing {

// A fresh directory under the system's temp dir, removed on destruction.
// ctest runs tests in parallel processes: each must lock its own devices,
// never the machine-wide /tmp/kiln-devices-<uid>.
class TempLockDir {
 public:
  TempLockDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-device-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempLockDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempLockDir(const TempLockDir&) = delete;
  TempLockDir& operator=(const TempLockDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Waits for one job's done; the job's `owner` points at it.
struct JobWaiter {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;

  static void done(DeviceJob& job, std::exception_ptr error) {
    auto* self = static_cast<JobWaiter*>(job.owner);
    std::lock_guard lock(self->mutex);
    self->error = std::move(error);
    self->finished = true;
    self->cv.notify_all();
  }
  std::exception_ptr wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [this] { return finished; });
    return error;
  }
};

// Submits `job` and waits for its done; returns its error.
inline std::exception_ptr runJob(Device& device, DeviceJob job) {
  JobWaiter waiter;
  job.owner = &waiter;
  job.done = &JobWaiter::done;
  device.submit(job);
  return waiter.wait();
}

inline std::exception_ptr copyToDevice(Device& device, const DeviceBuffer& buffer, const void* source, size_t bytes) {
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCopyToDevice;
  job.destination = buffer.data();
  job.source = static_cast<const std::byte*>(source);
  job.bytes = bytes;
  return runJob(device, job);
}

inline std::exception_ptr copyToHost(Device& device, void* destination, const DeviceBuffer& buffer, size_t bytes) {
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCopyToHost;
  job.destination = static_cast<std::byte*>(destination);
  job.source = buffer.data();
  job.bytes = bytes;
  return runJob(device, job);
}

// Runs `fn` (a captureless-compatible callable through a context pointer)
// as a compute job.
template <typename Fn>
std::exception_ptr runCompute(Device& device, Fn& fn) {
  DeviceJob job;
  job.kind = DeviceJob::Kind::kCompute;
  job.compute = [](void* context) { (*static_cast<Fn*>(context))(); };
  job.context = &fn;
  return runJob(device, job);
}

inline std::exception_ptr runNothing(Device& device) {
  auto nothing = [] {};
  return runCompute(device, nothing);
}

// The message of `error`, which must hold an exception of type E.
template <typename E>
inline std::string messageOf(const std::exception_ptr& error) {
  if (error == nullptr) return "<no error>";
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
  }
  return "<wrong type>";
}

}  // namespace kiln::testing
