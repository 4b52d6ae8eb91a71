// Data movement on cuda (launch.h): strided copies (Transpose, Slice,
// Expand), Gather, Cast and Where. One thread per output element,
// grid-stride; elements move as integers of their width, so every dtype of
// that width moves the same way.
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void stridedCopy(const T* x, T* y, StridedCopy copy, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    int64_t offset = copy.offset;
    uint64_t rest = i;
    for (int d = copy.rank - 1; d >= 0; --d) {
      offset += static_cast<int64_t>(rest % copy.dims[d]) * copy.strides[d];
      rest /= copy.dims[d];
    }
    y[i] = x[offset];
  }
}

template <typename T, typename Index>
__global__ void gather(const T* x, const Index* indices, T* y, int64_t axis, int64_t count, int64_t inner, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const int64_t within = static_cast<int64_t>(i % inner);
    const int64_t j = static_cast<int64_t>((i / inner) % count);
    const int64_t o = static_cast<int64_t>(i / inner / count);
    int64_t index = static_cast<int64_t>(indices[j]);
    if (index < 0) index += axis;
    y[i] = (index >= 0 && index < axis) ? x[(o * axis + index) * inner + within] : T{};
  }
}

// Conversions through double (exact for every pair here but i64 beyond
// 2^53, which goes through int64 directly).
template <typename From>
__device__ double toDouble(From v) { return static_cast<double>(v); }
template <>
__device__ double toDouble<__half>(__half v) { return static_cast<double>(__half2float(v)); }

template <typename To>
__device__ To fromDouble(double v) { return static_cast<To>(v); }
template <>
__device__ __half fromDouble<__half>(double v) { return __float2half_rn(static_cast<float>(v)); }
template <>
__device__ bool fromDouble<bool>(double v) { return v != 0.0; }

template <typename From, typename To>
__global__ void cast(const From* x, To* y, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral_v<From> && std::is_integral_v<To> && !std::is_same_v<To, bool>) {
      y[i] = static_cast<To>(x[i]);
    } else {
      y[i] = fromDouble<To>(toDouble<From>(x[i]));
    }
  }
}

__global__ void where(const bool* condition, const float* a, const float* b, float* y, WhereIndexing indexing,
                      uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    int64_t offset[3] = {0, 0, 0};
    uint64_t rest = i;
    for (int d = indexing.rank - 1; d >= 0; --d) {
      const int64_t coordinate = static_cast<int64_t>(rest % indexing.dims[d]);
      rest /= indexing.dims[d];
      for (int k = 0; k < 3; ++k) offset[k] += coordinate * indexing.strides[k][d];
    }
    y[i] = condition[offset[0]] ? a[offset[1]] : b[offset[2]];
  }
}

template <typename From>
void castFrom(const void* x, void* y, CastType to, uint64_t n, cudaStream_t stream) {
  const auto* in = static_cast<const From*>(x);
  const unsigned blocks = blocksFor(n);
  switch (to) {
    case CastType::kF32: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<float*>(y), n); break;
    case CastType::kF16: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<__half*>(y), n); break;
    case CastType::kF64: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<double*>(y), n); break;
    case CastType::kI64: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<int64_t*>(y), n); break;
    case CastType::kI32: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<int32_t*>(y), n); break;
    case CastType::kI8: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<int8_t*>(y), n); break;
    case CastType::kU8: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<uint8_t*>(y), n); break;
    case CastType::kBool: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<bool*>(y), n); break;
    default: break;
  }
}

bool castable(CastType type) {
  switch (type) {
    case CastType::kF32:
    case CastType::kF16:
    case CastType::kF64:
    case CastType::kI64:
    case CastType::kI32:
    case CastType::kI8:
    case CastType::kU8:
    case CastType::kBool: return true;
    default: return false;
  }
}

}  // namespace

void launchStridedCopy(const void* x, void* y, const StridedCopy& copy, uint64_t n, int element_bytes,
                       cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = blocksFor(n);
  switch (element_bytes) {
    case 1: stridedCopy<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), copy, n); break;
    case 2: stridedCopy<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), copy, n); break;
    case 4: stridedCopy<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), copy, n); break;
    case 8: stridedCopy<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y), copy, n); break;
    default: break;
  }
}

template <typename Index>
void gatherAs(const void* x, const Index* indices, void* y, int64_t outer, int64_t axis, int64_t count, int64_t inner,
              int element_bytes, cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(outer * count * inner);
  if (n == 0) return;
  const unsigned blocks = blocksFor(n);
  switch (element_bytes) {
    case 1: gather<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint8_t*>(x), indices, static_cast<uint8_t*>(y), axis, count, inner, n); break;
    case 2: gather<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint16_t*>(x), indices, static_cast<uint16_t*>(y), axis, count, inner, n); break;
    case 4: gather<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint32_t*>(x), indices, static_cast<uint32_t*>(y), axis, count, inner, n); break;
    case 8: gather<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint64_t*>(x), indices, static_cast<uint64_t*>(y), axis, count, inner, n); break;
    default: break;
  }
}

void launchGather(const void* x, const void* indices, bool indices_are_i64, void* y, int64_t outer, int64_t axis,
                  int64_t count, int64_t inner, int element_bytes, cudaStream_t stream) {
  if (indices_are_i64) {
    gatherAs(x, static_cast<const int64_t*>(indices), y, outer, axis, count, inner, element_bytes, stream);
  } else {
    gatherAs(x, static_cast<const int32_t*>(indices), y, outer, axis, count, inner, element_bytes, stream);
  }
}

bool castSupported(uint8_t from, uint8_t to) { return castable(CastType(from)) && castable(CastType(to)); }

void launchCast(const void* x, uint8_t from, void* y, uint8_t to, uint64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const CastType target = CastType(to);
  switch (CastType(from)) {
    case CastType::kF32: castFrom<float>(x, y, target, n, stream); break;
    case CastType::kF16: castFrom<__half>(x, y, target, n, stream); break;
    case CastType::kF64: castFrom<double>(x, y, target, n, stream); break;
    case CastType::kI64: castFrom<int64_t>(x, y, target, n, stream); break;
    case CastType::kI32: castFrom<int32_t>(x, y, target, n, stream); break;
    case CastType::kI8: castFrom<int8_t>(x, y, target, n, stream); break;
    case CastType::kU8: castFrom<uint8_t>(x, y, target, n, stream); break;
    case CastType::kBool: castFrom<bool>(x, y, target, n, stream); break;
    default: break;
  }
}

void launchWhere(const bool* condition, const float* a, const float* b, float* y, const WhereIndexing& indexing,
                 uint64_t n, cudaStream_t stream) {
  if (n == 0) return;
  where<<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(condition, a, b, y, indexing, n);
}

}  // namespace kiln::cuda
