// A blocking helper over the asynchronous device job API, for work that is
// not on the hot path (loading weights): submit jobs, wait until all have
// called `done`, rethrow the first error.
#pragma once

#include <span>

#include "kiln/device.h"

namespace kiln {

// Submits every job in `jobs` (their kind and addresses filled in; `done`
// and `owner` are overwritten) and waits for all of them.
void runJobsAndWait(Device& device, std::span<DeviceJob> jobs);

}  // namespace kiln
