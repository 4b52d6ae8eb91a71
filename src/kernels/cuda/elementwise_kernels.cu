// The elementwise kernel (elementwise_launch.h): one thread per output
// element, grid-stride. It loads its element of every input (through
// broadcast strides, or directly when each input is full-size or a single
// element), runs the program in its own slots, and stores the last result.
// Each op computes what the CPU kernels compute (NaN handling included).
#include <cmath>

#include "core/elementwise_program.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxSlots = kMaxElementwiseInputs + kMaxElementwiseImmediates + kMaxElementwiseOps;

using E = ElementwiseOp;

__device__ float apply(E op, float x, float y, float alpha, float beta) {
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

// Index: uint32_t when every element and offset fits (most tensors), which
// makes the broadcast index arithmetic several times cheaper than 64-bit.
template <typename Index>
__global__ void runProgram(DeviceProgram program, Indexing indexing, Pointers pointers, Index n) {
  float slot[kMaxSlots];
  for (int k = 0; k < program.immediates; ++k) slot[program.inputs + k] = program.immediate[k];
  const int results = program.inputs + program.immediates;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (indexing.direct) {
      for (int k = 0; k < program.inputs; ++k) slot[k] = pointers.in[k][indexing.scalar[k] ? 0 : i];
    } else {
      Index offset[kMaxElementwiseInputs] = {};
      Index rest = i;
      for (int d = indexing.rank - 1; d >= 0; --d) {
        const Index size = static_cast<Index>(indexing.out_dims[d]);
        const Index coordinate = rest % size;
        rest /= size;
        for (int k = 0; k < program.inputs; ++k) offset[k] += coordinate * static_cast<Index>(indexing.strides[k][d]);
      }
      for (int k = 0; k < program.inputs; ++k) slot[k] = pointers.in[k][offset[k]];
    }
    for (int j = 0; j < program.ops; ++j) {
      const float y = program.b[j] >= 0 ? slot[program.b[j]] : 0.0f;
      slot[results + j] = apply(static_cast<E>(program.op[j]), slot[program.a[j]], y, program.alpha[j], program.beta[j]);
    }
    pointers.out[i] = slot[results + program.ops - 1];
  }
}

}  // namespace

void launchElementwise(const DeviceProgram& program, const Indexing& indexing, const Pointers& pointers, uint64_t n,
                       cudaStream_t stream) {
  // Offsets never exceed the element count (inputs broadcast to the output).
  if (n < (1ull << 31)) {
    runProgram<uint32_t><<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(program, indexing, pointers,
                                                                        static_cast<uint32_t>(n));
  } else {
    runProgram<uint64_t><<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(program, indexing, pointers, n);
  }
}

}  // namespace kiln::cuda
