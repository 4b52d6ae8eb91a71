// Helpers shared by the device implementations (cpu_device.cc,
// sim_device.cc, device_manager.cc); not part of the public API.
//
// Thread safety: every function here is a pure function or touches only
// what it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/device.h"

namespace kiln::device_internal {

// Device memory alignment: at least the same 64 bytes as package payloads,
// so that a kernel sees the same alignment on every device.
inline constexpr uint64_t kAlignment = 64;
// A block of n bytes is aligned to n's largest power of two up to this (a
// page), so that an arena is aligned for every tensor the planner placed at
// a larger alignment of its own (plugin allocator hooks; the planner makes
// such an arena at least that large: compiler/memory_planner.h).
inline constexpr uint64_t kMaxBlockAlignment = 4096;

// The alignment allocateAligned gives a block of `bytes`.
uint64_t blockAlignment(uint64_t bytes) noexcept;

// Memory of at least `bytes` bytes (rounded up to its alignment), aligned to
// blockAlignment(bytes); null when the system has none to give.
std::byte* allocateAligned(uint64_t bytes) noexcept;
void freeAligned(std::byte* data) noexcept;

// allocateAligned for a program's arena of `bytes`: UsageError naming
// `what` when it exceeds the machine's memory (refused before asking the
// allocator, which may abort on such a request under sanitizers, or
// overcommit) or when the allocation fails. Never null.
std::byte* allocateArena(uint64_t bytes, const std::string& what);

// "512 B", "12.0 KiB", "60.0 MiB", "1.5 GiB": sizes for error messages.
std::string humanBytes(uint64_t bytes);

// Memory of the host in bytes (sysconf), and its online cores (at least 1).
uint64_t hostMemoryBytes();
uint32_t hostCores();

// Instruction set extensions of the host CPU that kernels may rely on, in
// GCC's spelling ("avx2", "avx512f", ...). Targets name them in
// Target::features.
const std::vector<std::string>& hostCpuFeatures();

// Throws UsageError when `job` cannot run (no `done`, a compute job without
// `compute`, a copy with a null pointer), before anything is queued.
void checkJob(const std::string& device, const DeviceJob& job);

// What a compute job's exception reaches the job's `done` as: a
// DeviceError as it is; anything else a kernel or the host code threw
// (a failed check, std::bad_alloc) as an ApplicationRuntimeError of
// `device` with the original message, so that callers and the runner's
// error table see one family of device errors.
std::exception_ptr asDeviceError(const std::string& device, std::exception_ptr error);

}  // namespace kiln::device_internal
