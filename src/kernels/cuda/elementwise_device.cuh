// Device code shared by the kernels that interpret elementwise programs
// (elementwise_kernels.cu, and the convolutions that apply their post-ops
// in the same pass): what each ElementwiseOp computes (elementwise_ops.inc)
// and the interpreter over a thread's slots. Included by .cu files only.
#pragma once

#include <cmath>

#include "core/elementwise_program.h"
#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

inline constexpr int kMaxProgramSlots = kMaxElementwiseInputs + kMaxElementwiseImmediates + kMaxElementwiseOps;

using E = ElementwiseOp;

// Every op of elementwise_ops.inc; `op` is an ElementwiseOp.
__device__ inline float apply(E op, float x, float y, float alpha, float beta) {
  switch (op) {
#define KILN_ELEMENTWISE_OP(name, expression) \
  case E::k##name:                            \
    return expression;
#include "kernels/cuda/elementwise_ops.inc"
#undef KILN_ELEMENTWISE_OP
    case E::kCount: break;
  }
  return NAN;
}

// Fills the immediates' slots (once per thread).
__device__ inline void loadImmediates(const DeviceProgram& program, float* slot) {
  for (int k = 0; k < program.immediates; ++k) slot[program.inputs + k] = program.immediate[k];
}

// Runs the program over slots whose inputs (and immediates) are loaded;
// returns the last instruction's result.
__device__ inline float runInstructions(const DeviceProgram& program, float* slot) {
  const int results = program.inputs + program.immediates;
  for (int j = 0; j < program.ops; ++j) {
    const float y = program.b[j] >= 0 ? slot[program.b[j]] : 0.0f;
    slot[results + j] = apply(static_cast<ElementwiseOp>(program.op[j]), slot[program.a[j]], y, program.alpha[j],
                              program.beta[j]);
  }
  return slot[results + program.ops - 1];
}

}  // namespace kiln::cuda
