// Times a prepared cuda step on stand-in tensors (zero-filled device
// buffers of the step's shapes), for kernels that choose between two ways
// of running the same step by measuring both, as cuDNN's own algorithm
// search does. For prepare only: it allocates and synchronizes.
#pragma once

#include "kernels/kernel.h"

namespace kiln::cuda {

// Milliseconds per run of `run` over `state` (the mean of a few runs after
// a warm-up); infinity when a CUDA call fails.
double timeStep(RunKernel run, const KernelState& state, const KernelSetup& setup);

}  // namespace kiln::cuda
