// DeviceLock (device_lock.h): flock on one lock file per device.
#include "runtime/device_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <system_error>

#include "kiln/error.h"

namespace kiln {
namespace {

// Opens (creating if needed) the lock file. Read-write when we may, so the
// holder can write its name; read-only is enough to flock a file that
// another user created with a restrictive mode.
int openLockFile(const std::filesystem::path& lock_dir, const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::create_directories(lock_dir, error);
  if (error) {
    throw IoError(fmt::format("cannot create the device lock directory '{}'", lock_dir.string()), error.value());
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0) {
    // The umask narrows open()'s mode; every user of this machine must be
    // able to open the file, so set the mode explicitly. Only the file's
    // owner may, which is the one that matters.
    (void)::fchmod(fd, 0666);
    return fd;
  }
  if (errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("cannot open the device lock file '{}'", path.string()), errno);
  return fd;
}

// flock with LOCK_NB, retried on EINTR. True when we hold the lock.
bool tryLock(int fd, const std::filesystem::path& path) {
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno == EWOULDBLOCK) return false;
    if (errno != EINTR) throw IoError(fmt::format("cannot lock the device lock file '{}'", path.string()), errno);
  }
}

void writeHolder(int fd) {
  const std::string line = fmt::format("pid {} {}\n", ::getpid(), program_invocation_short_name);
  // Best effort: a read-only descriptor or a full disk only costs the name
  // in a waiter's message.
  if (::ftruncate(fd, 0) != 0) return;
  (void)::pwrite(fd, line.data(), line.size(), 0);
}

}  // namespace

std::filesystem::path DeviceLock::lockPath(const std::filesystem::path& lock_dir, const std::string& device_id) {
  std::string name = device_id;
  std::replace(name.begin(), name.end(), ':', '-');
  return lock_dir / (name + ".lock");
}

std::filesystem::path DeviceLock::defaultDirectory() {
  const char* dir = std::getenv("KILN_DEVICE_LOCK_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return fmt::format("/tmp/kiln-devices-{}", ::getuid());
}

std::unique_ptr<DeviceLock> DeviceLock::tryAcquire(const std::filesystem::path& lock_dir,
                                                   const std::string& device_id) {
  const std::filesystem::path path = lockPath(lock_dir, device_id);
  const int fd = openLockFile(lock_dir, path);
  bool locked = false;
  try {
    locked = tryLock(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (!locked) {
    ::close(fd);
    return nullptr;
  }
  writeHolder(fd);
  return std::unique_ptr<DeviceLock>(new DeviceLock(fd, device_id));
}

std::string DeviceLock::describeHolder(const std::filesystem::path& lock_dir, const std::string& device_id) {
  const std::filesystem::path path = lockPath(lock_dir, device_id);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "an unknown holder";
  char buffer[256];
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  ::close(fd);
  if (n <= 0) return "an unknown holder";
  std::string text(buffer, static_cast<size_t>(n));
  // "pid <pid> <name>\n" -> "pid <pid> (<name>)"
  if (const size_t end = text.find('\n'); end != std::string::npos) text.resize(end);
  if (text.rfind("pid ", 0) != 0) return "an unknown holder";
  const size_t space = text.find(' ', 4);
  if (space == std::string::npos) return text;
  return fmt::format("{} ({})", text.substr(0, space), text.substr(space + 1));
}

bool DeviceLock::isHeld(const std::filesystem::path& lock_dir, const std::string& device_id) {
  const std::filesystem::path path = lockPath(lock_dir, device_id);
  // A device whose lock file does not exist yet has never been attached.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool held = false;
  try {
    held = !tryLock(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // drops the probe's lock, if it got one
  return held;
}

DeviceLock::~DeviceLock() {
  // Leave the file in place: deleting it would race with a process that
  // has just opened it and is about to lock the old inode.
  ::close(fd_);
}

}  // namespace kiln
