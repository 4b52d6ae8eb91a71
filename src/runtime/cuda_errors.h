// How a CUDA runtime error maps onto kiln's device error classes (error.h),
// as the reference runtime maps the accelerator's own errors:
//
//   out of memory (cudaErrorMemoryAllocation)       kRecoverableRerun: only
//       this job failed; running it again (after freeing memory) may work
//   errors that corrupt the CUDA context: an illegal or misaligned address,
//       an illegal instruction, a device-side assert, a launch failure or
//       timeout, an uncorrectable ECC error       kRecoverableRestart: CUDA
//       fails every later call of the process on that GPU, and refuses it
//       a new context even after cudaDeviceReset (measured: still refused
//       after 10 s, "devices unavailable", on an H200 with driver 580);
//       "the process must be terminated and relaunched" (CUDA's own
//       documentation of these errors). Another process can use the GPU.
//   a bad launch (invalid value or configuration, no kernel image for this
//       GPU, too many resources requested)         kApplicationError
//   anything else (no device, devices unavailable, unknown)   kUnknown
//
// Codes are cudaError_t values; this header needs no CUDA headers, so the
// mapping is tested on every machine (cuda_device.cc checks the numbers
// against the CUDA headers when CUDA is built).
#pragma once

#include "kiln/device.h"

namespace kiln::cuda_errors {

inline constexpr int kMemoryAllocation = 2;
inline constexpr int kInvalidValue = 1;
inline constexpr int kInvalidConfiguration = 9;
inline constexpr int kInvalidDeviceFunction = 98;
inline constexpr int kNoKernelImageForDevice = 209;
inline constexpr int kEccUncorrectable = 214;
inline constexpr int kIllegalAddress = 700;
inline constexpr int kLaunchOutOfResources = 701;
inline constexpr int kLaunchTimeout = 702;
inline constexpr int kAssert = 710;
inline constexpr int kHardwareStackError = 714;
inline constexpr int kIllegalInstruction = 715;
inline constexpr int kMisalignedAddress = 716;
inline constexpr int kInvalidAddressSpace = 717;
inline constexpr int kInvalidPc = 718;
inline constexpr int kLaunchFailure = 719;

constexpr FaultKind classify(int code) {
  switch (code) {
    case kMemoryAllocation: return FaultKind::kRecoverableRerun;
    case kEccUncorrectable:
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailure: return FaultKind::kRecoverableRestart;
    case kInvalidValue:
    case kInvalidConfiguration:
    case kInvalidDeviceFunction:
    case kNoKernelImageForDevice:
    case kLaunchOutOfResources: return FaultKind::kApplicationError;
    default: return FaultKind::kUnknown;
  }
}

// Whether the error leaves the CUDA context unusable for the rest of the
// process.
constexpr bool corruptsContext(int code) { return classify(code) == FaultKind::kRecoverableRestart; }

}  // namespace kiln::cuda_errors
