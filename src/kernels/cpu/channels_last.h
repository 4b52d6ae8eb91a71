// Kernels of the channels-last operators (kiln.NhwcConv, kiln.NhwcMaxPool,
// ...; see src/passes/channels_last.h) and of kiln.Blocked16Conv
// (src/passes/blocked_conv.h) validate their attributes with the code of the
// ONNX operator, which reasons in NCHW. NchwSetup is their KernelSetup with
// input 0 and output 0 described in NCHW: the same tensors, their dims in
// ONNX order ([N, H, W, C] or [N, C/16, H, W, 16] becomes [N, C, H, W]).
#pragma once

#include <vector>

#include "kernels/kernel.h"

namespace kiln {

// How a kiln-domain operator's input 0 and output 0 are laid out.
enum class ActivationLayout {
  kNhwc,       // [N, H, W, C]
  kBlocked16,  // [N, C/16, H, W, 16], oneDNN's nChw16c
};

class NchwSetup {
 public:
  // Throws UsageError naming `op` unless input 0 and output 0 have the
  // layout's rank (and block).
  NchwSetup(const char* op, const KernelSetup& setup, ActivationLayout layout = ActivationLayout::kNhwc);
  NchwSetup(const NchwSetup&) = delete;
  NchwSetup& operator=(const NchwSetup&) = delete;

  const KernelSetup& get() const { return setup_; }

 private:
  std::vector<TensorInfo> inputs_;
  std::vector<TensorInfo> outputs_;
  KernelSetup setup_;
};

}  // namespace kiln
