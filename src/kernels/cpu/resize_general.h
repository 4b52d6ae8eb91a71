// The general Resize kernel: every mode (nearest, linear, cubic), antialias,
// every coordinate transformation (tf_crop_and_resize with its roi and
// extrapolation value, half_pixel_symmetric), the axes attribute and the
// aspect-ratio policies, over any number of resized axes, with the
// semantics of ONNX's reference implementation. data_movement.cc's Resize
// keeps its faster 2-D kernel for the common cases and hands the rest here.
#pragma once

#include <memory>

#include "kernels/kernel.h"

namespace kiln {

// True when `setup` (Resize, Upsample's form included) needs this kernel.
bool needsGeneralResize(const KernelSetup& setup);

// `channels_last`: the data are [N, H, W, C] in memory while `setup`
// describes them in NCHW (kiln.NhwcResize). Throws UsageError on what it
// cannot run, such as scales that are not constants.
std::unique_ptr<KernelState> prepareGeneralResize(const KernelSetup& setup, bool channels_last);
void runGeneralResize(const KernelCall& call);

}  // namespace kiln
