// The post-ops of a fused convolution (src/passes/conv_fusion.h): the
// attributes `post_ops` ("Add,Relu"), `post_op_alpha` and `post_op_beta`
// read as one list, in the order they apply. One reader for every kernel
// that runs them (oneDNN's post-ops on the CPU, cuDNN and kiln's programs
// on cuda).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/fused_activation.h"
#include "core/param_map.h"

namespace kiln {

struct PostOp {
  bool add = false;  // add the residual (input 3); otherwise `activation`
  FusedActivation activation = FusedActivation::kNone;
  float alpha = 0;
  float beta = 0;
};

// The post-ops of `params` (empty when there are none). Throws UsageError
// naming `op` and the list for a kind that is neither "Add" nor an
// activation of fused_activation.h.
std::vector<PostOp> readPostOps(const std::string& op, const ParamMap& params);

}  // namespace kiln
