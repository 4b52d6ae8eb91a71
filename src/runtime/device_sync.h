// Blocking helpers over the asynchronous device job API, for work that is
// not on the hot path (loading weights, tests): submit jobs, wait until all
// have called `done`, rethrow the first error.
#pragma once

#include <span>

#include "kiln/device.h"

namespace kiln {

// Submits every job in `jobs` (their kind and addresses filled in; `done`
// and `owner` are overwritten) and waits for all of them.
void runJobsAndWait(Device& device, std::span<DeviceJob> jobs);

// One copy, waited for.
void copyToDevice(Device& device, std::byte* device_destination, const std::byte* host_source, uint64_t bytes);
void copyToHost(Device& device, std::byte* host_destination, const std::byte* device_source, uint64_t bytes);

}  // namespace kiln
