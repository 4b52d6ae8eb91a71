// Kernels of the channels-last operators (kiln.NhwcConv, kiln.NhwcMaxPool,
// ...; see src/passes/channels_last.h) validate their attributes with the
// code of the ONNX operator, which reasons in NCHW. NchwSetup is their
// KernelSetup with input 0 and output 0 described in NCHW: the same tensors,
// their dims in ONNX order ([N, H, W, C] becomes [N, C, H, W]).
#pragma once

#include <vector>

#include "kernels/kernel.h"

namespace kiln {

class NchwSetup {
 public:
  // Throws UsageError naming `op` unless input 0 and output 0 are 4-D.
  NchwSetup(const char* op, const KernelSetup& setup);
  NchwSetup(const NchwSetup&) = delete;
  NchwSetup& operator=(const NchwSetup&) = delete;

  const KernelSetup& get() const { return setup_; }

 private:
  std::vector<TensorInfo> inputs_;
  std::vector<TensorInfo> outputs_;
  KernelSetup setup_;
};

}  // namespace kiln
