// Device code shared by the kernels that run elementwise programs
// (elementwise_kernels.cu, and the convolutions that apply their post-ops
// in the same pass): what each ElementwiseOp computes -- the same as the CPU
// kernels, NaN handling included -- and the interpreter over a thread's
// slots. Included by .cu files only.
#pragma once

#include <cmath>

#include "core/elementwise_program.h"
#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

inline constexpr int kMaxProgramSlots = kMaxElementwiseInputs + kMaxElementwiseImmediates + kMaxElementwiseOps;

using E = ElementwiseOp;

__device__ inline float apply(E op, float x, float y, float alpha, float beta) {
  switch (op) {
    case E::kRelu: return x < 0.0f ? 0.0f : x;
    case E::kLeakyRelu: return x < 0.0f ? alpha * x : x;
    case E::kElu: return x < 0.0f ? alpha * (expf(x) - 1.0f) : x;
    case E::kSigmoid: return 1.0f / (1.0f + expf(-x));
    case E::kHardSigmoid: return fmaxf(0.0f, fminf(1.0f, alpha * x + beta));
    case E::kHardSwish: return x * fmaxf(0.0f, fminf(1.0f, x / 6.0f + 0.5f));
    case E::kSoftplus: return x > 20.0f ? x : log1pf(expf(x));
    case E::kTanh: return tanhf(x);
    case E::kGelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case E::kGeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case E::kExp: return expf(x);
    case E::kLog: return logf(x);
    case E::kSqrt: return sqrtf(x);
    case E::kErf: return erff(x);
    case E::kAbs: return fabsf(x);
    case E::kNeg: return -x;
    case E::kReciprocal: return 1.0f / x;
    case E::kFloor: return floorf(x);
    case E::kCeil: return ceilf(x);
    case E::kClip: return x < alpha ? alpha : (x > beta ? beta : x);  // NaN passes through
    case E::kSquare: return x * x;
    case E::kPowHalf: return isinf(x) ? fabsf(x) : sqrtf(x) + 0.0f;  // -0 -> +0, -inf -> +inf
    case E::kAdd: return x + y;
    case E::kSub: return x - y;
    case E::kMul: return x * y;
    case E::kDiv: return x / y;
    case E::kMax: return (isnan(x) || isnan(y)) ? NAN : fmaxf(x, y);
    case E::kMin: return (isnan(x) || isnan(y)) ? NAN : fminf(x, y);
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
