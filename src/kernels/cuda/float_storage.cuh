// Device helpers for tensors stored as FloatStorage (launch.h): f32, or
// f16 or bf16 under `kiln compile --fp16` / `--bf16`. Kernels load elements
// as f32, compute in f32 and round as they store. For .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace kiln::cuda {

__device__ inline float toFloat(float v) { return v; }
__device__ inline float toFloat(__half v) { return __half2float(v); }
__device__ inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T fromFloat(float v);
template <>
__device__ inline float fromFloat<float>(float v) { return v; }
template <>
__device__ inline __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Element i of `data`, whose storage is known only at run time.
__device__ inline float loadFloat(const void* data, FloatStorage storage, int64_t i) {
  switch (storage) {
    case FloatStorage::kF16: return __half2float(static_cast<const __half*>(data)[i]);
    case FloatStorage::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

}  // namespace kiln::cuda
