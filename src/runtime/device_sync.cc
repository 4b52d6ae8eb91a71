#include "runtime/device_sync.h"

#include <condition_variable>
#include <mutex>

namespace kiln {
namespace {

struct Waiter {
  std::mutex mutex;
  std::condition_variable finished;
  size_t remaining = 0;
  std::exception_ptr first_error;

  static void done(DeviceJob& job, std::exception_ptr error) {
    auto* waiter = static_cast<Waiter*>(job.owner);
    std::lock_guard lock(waiter->mutex);
    if (error && !waiter->first_error) waiter->first_error = error;
    if (--waiter->remaining == 0) waiter->finished.notify_all();
  }
};

}  // namespace

void runJobsAndWait(Device& device, std::span<DeviceJob> jobs) {
  Waiter waiter;
  waiter.remaining = jobs.size();
  for (DeviceJob& job : jobs) {
    job.done = &Waiter::done;
    job.owner = &waiter;
  }
  // The waiter lives on this stack frame: wait for every submitted job even
  // if a submit throws.
  size_t submitted = 0;
  std::exception_ptr submit_error;
  try {
    for (DeviceJob& job : jobs) {
      device.submit(job);
      ++submitted;
    }
  } catch (...) {
    submit_error = std::current_exception();
  }
  std::unique_lock lock(waiter.mutex);
  waiter.remaining -= jobs.size() - submitted;
  waiter.finished.wait(lock, [&] { return waiter.remaining == 0; });
  if (submit_error) std::rethrow_exception(submit_error);
  if (waiter.first_error) std::rethrow_exception(waiter.first_error);
}

}  // namespace kiln
