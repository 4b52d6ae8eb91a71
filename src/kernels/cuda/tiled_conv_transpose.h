// ConvTranspose whose kernel equals its stride on cuda (2-D, no padding,
// no dilation, one group): each input pixel spreads into its own
// kernel-sized tile of the output, so the tiles never overlap and every
// output element is one dot product over the input channels plus the bias.
// This is the upsampling of U-Nets and of text-detection heads (PP-OCR's
// DB head: [N, 24, 320, 320] to [N, 1, 640, 640] with a 2x2 kernel), where
// cuDNN's backward-data algorithms run many times slower than memory allows.
// kiln's kernel: one thread per output element. conv.cc times it against
// cuDNN at prepare and keeps the faster.
#pragma once

#include <memory>

#include "kernels/kernel.h"

namespace kiln::cuda {

// The step's state when this kernel can run it (NCHW f32, the shape above),
// else null.
std::unique_ptr<KernelState> prepareTiledConvTranspose(const KernelSetup& setup);
bool isTiledConvTranspose(const KernelState* state);
void runTiledConvTranspose(const KernelCall& call);

}  // namespace kiln::cuda
