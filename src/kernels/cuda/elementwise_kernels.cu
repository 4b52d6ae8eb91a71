// The elementwise kernel (elementwise_launch.h): one thread per output
// element, grid-stride. It loads its element of every input (through
// broadcast strides, or directly when each input is full-size or a single
// element), runs the program in its own slots, and stores the last result.
// Each op computes what the CPU kernels compute (NaN handling included).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/elementwise_program.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

template <typename Index>
__device__ float load(const float* data, Index offset, FloatStorage storage) {
  switch (storage) {
    case FloatStorage::kF16: return __half2float(reinterpret_cast<const __half*>(data)[offset]);
    case FloatStorage::kBF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(data)[offset]);
    default: return data[offset];
  }
}

template <typename Index>
__device__ void store(float* data, Index offset, FloatStorage storage, float value) {
  switch (storage) {
    case FloatStorage::kF16: reinterpret_cast<__half*>(data)[offset] = __float2half_rn(value); break;
    case FloatStorage::kBF16: reinterpret_cast<__nv_bfloat16*>(data)[offset] = __float2bfloat16_rn(value); break;
    default: data[offset] = value;
  }
}

// Index: uint32_t when every element and offset fits (most tensors), which
// makes the broadcast index arithmetic several times cheaper than 64-bit.
template <typename Index>
__global__ void runProgram(DeviceProgram program, Indexing indexing, Pointers pointers, Index n) {
  float slot[kMaxProgramSlots];
  loadImmediates(program, slot);
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (indexing.direct) {
      for (int k = 0; k < program.inputs; ++k) slot[k] = load(pointers.in[k], indexing.scalar[k] ? Index{0} : i, indexing.storage[k]);
    } else {
      Index offset[kMaxElementwiseInputs] = {};
      Index rest = i;
      for (int d = indexing.rank - 1; d >= 0; --d) {
        const Index size = static_cast<Index>(indexing.out_dims[d]);
        const Index coordinate = rest % size;
        rest /= size;
        for (int k = 0; k < program.inputs; ++k) offset[k] += coordinate * static_cast<Index>(indexing.strides[k][d]);
      }
      for (int k = 0; k < program.inputs; ++k) slot[k] = load(pointers.in[k], offset[k], indexing.storage[k]);
    }
    store(pointers.out, i, indexing.storage_out, runInstructions(program, slot));
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
