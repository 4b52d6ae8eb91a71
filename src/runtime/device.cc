// The parts of include/kiln/device.h that every device shares: DeviceBuffer
// ownership, the names of device and fault kinds, and the helpers of
// device_internal.h (aligned memory, sizes for messages, host facts).
//
// Thread safety: DeviceBuffer is a move-only value owned by one thread at a
// time; the name functions and helpers are pure or initialise once.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <thread>
#include <utility>

#include "kiln/device.h"
#include "kiln/error.h"
#include "runtime/device_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    // Give back what this buffer held before taking the other's memory.
    if (data_ != nullptr) device_->release(data_, size_);
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) device_->release(data_, size_);
}

const char* deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kSim: return "sim";
    case DeviceKind::kCuda: return "cuda";
  }
  return "unknown";
}

DeviceKind parseDeviceKind(const std::string& name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "sim") return DeviceKind::kSim;
  if (name == "cuda") return DeviceKind::kCuda;
  throw UsageError(fmt::format("unknown device kind '{}': expected cpu, sim or cuda", name));
}

const char* faultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kApplicationError: return "app";
    case FaultKind::kRecoverableReset: return "reset";
    case FaultKind::kRecoverableRerun: return "rerun";
    case FaultKind::kUnknown: return "unknown";
    case FaultKind::kRecoverableRestart: return "restart";
  }
  return "invalid";
}

namespace device_internal {

uint64_t blockAlignment(uint64_t bytes) noexcept {
  return std::clamp(std::bit_floor(bytes), kAlignment, kMaxBlockAlignment);
}

std::byte* allocateAligned(uint64_t bytes) noexcept {
  // Whole 64-byte lines; a zero-byte request still gets a distinct pointer.
  // posix_memalign, unlike aligned_alloc, needs no size that is a multiple
  // of the (up to a page) alignment.
  const uint64_t rounded = bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes || rounded > SIZE_MAX) return nullptr;  // overflow: no system has that much
  void* data = nullptr;
  if (posix_memalign(&data, static_cast<size_t>(blockAlignment(rounded)), static_cast<size_t>(rounded)) != 0) {
    return nullptr;
  }
  return static_cast<std::byte*>(data);
}

void freeAligned(std::byte* data) noexcept { std::free(data); }

std::byte* allocateArena(uint64_t bytes, const std::string& what) {
  const uint64_t memory = hostMemoryBytes();
  if (memory > 0 && bytes > memory) {
    throw UsageError(fmt::format("{}: the program's arena of {} bytes ({}) cannot be allocated on this machine ({} of "
                                 "memory)",
                                 what, bytes, humanBytes(bytes), humanBytes(memory)));
  }
  std::byte* arena = allocateAligned(bytes);
  if (arena == nullptr) {
    throw UsageError(fmt::format("{}: the program's arena of {} bytes ({}) cannot be allocated on this machine", what,
                                 bytes, humanBytes(bytes)));
  }
  return arena;
}

std::string humanBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

uint64_t hostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint32_t hostCores() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : cores;
}

const std::vector<std::string>& hostCpuFeatures() {
  static const std::vector<std::string> features = [] {
    std::vector<std::string> found;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // The extensions that change which kernels can run; listed explicitly
    // because __builtin_cpu_supports needs string literals.
#define KILN_FEATURE(name) \
  if (__builtin_cpu_supports(name)) found.emplace_back(name)
    KILN_FEATURE("sse4.2");
    KILN_FEATURE("avx");
    KILN_FEATURE("avx2");
    KILN_FEATURE("fma");
    // CPUID leaf 1, ECX bit 29 (clang before 15 has no "f16c" for the builtin).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0) found.emplace_back("f16c");
    KILN_FEATURE("avx512f");
    KILN_FEATURE("avx512bw");
    KILN_FEATURE("avx512vl");
    KILN_FEATURE("avx512vnni");
    KILN_FEATURE("avx512bf16");
#undef KILN_FEATURE
#endif
    return found;
  }();
  return features;
}

std::exception_ptr asDeviceError(const std::string& device, std::exception_ptr error) {
  if (error == nullptr) return nullptr;
  try {
    std::rethrow_exception(error);
  } catch (const DeviceError&) {
    return error;
  } catch (const std::exception& e) {
    return std::make_exception_ptr(ApplicationRuntimeError(device, std::string("the program failed: ") + e.what()));
  } catch (...) {
    return std::make_exception_ptr(ApplicationRuntimeError(device, "the program failed with a non-standard exception"));
  }
}

void checkJob(const std::string& device, const DeviceJob& job) {
  if (job.done == nullptr) throw UsageError(device + ": submitted a job without a done callback");
  if (job.kind == DeviceJob::Kind::kCompute) {
    if (job.compute == nullptr) throw UsageError(device + ": submitted a compute job without a compute function");
  } else if (job.bytes != 0 && (job.destination == nullptr || job.source == nullptr)) {
    throw UsageError(fmt::format("{}: submitted a copy of {} bytes with a null {}", device, job.bytes,
                                 job.source == nullptr ? "source" : "destination"));
  }
}

}  // namespace device_internal
}  // namespace kiln
