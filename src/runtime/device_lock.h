// DeviceLock: exclusive attachment of one device, across processes and
// within one process.
//
// Each lockable device has a lock file `<lock_dir>/<id with ':' as '-'>.lock`
// (sim:0 -> sim-0.lock). Attaching takes flock(LOCK_EX | LOCK_NB) on a fresh
// open() of it. flock locks belong to the open file description, so two
// open() calls conflict even inside one process: a second DeviceManager (or
// a second getDevice) in the same process sees the device as busy exactly
// as another process would. The kernel drops the lock when the holder dies,
// so a crashed process never leaves a device attached. The descriptor is
// close-on-exec, so a child the holder spawns does not inherit the lock.
//
// The holder writes "pid <pid> <program name>\n" into the file, so that a
// process that finds the device busy can say who holds it.
//
// Thread safety: a DeviceLock is owned by one object (the attached device);
// the static functions may be called from any thread.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

class DeviceLock {
 public:
  // Takes the lock of `device_id`, creating lock_dir and the lock file if
  // they are missing. Returns null when someone else holds it; throws
  // IoError when the directory or file cannot be created or opened.
  static std::unique_ptr<DeviceLock> tryAcquire(const std::filesystem::path& lock_dir, const std::string& device_id);

  // Who holds the lock, from the lock file: "pid 1234 (kiln)", or
  // "an unknown holder" while the file is being written or is unreadable.
  static std::string describeHolder(const std::filesystem::path& lock_dir, const std::string& device_id);

  // True when someone holds the lock now (a probe that takes and drops it).
  static bool isHeld(const std::filesystem::path& lock_dir, const std::string& device_id);

  static std::filesystem::path lockPath(const std::filesystem::path& lock_dir, const std::string& device_id);

  // $KILN_DEVICE_LOCK_DIR, else /tmp/kiln-devices-<uid>.
  static std::filesystem::path defaultDirectory();

  ~DeviceLock();  // releases the lock (closes the descriptor)
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;

  const std::string& deviceId() const { return device_id_; }

 private:
  DeviceLock(int fd, std::string device_id) : fd_(fd), device_id_(std::move(device_id)) {}

  int fd_;  // open, holding LOCK_EX, until destruction
  std::string device_id_;
};

}  // namespace kiln
