// Data movement on cuda (launch.h): strided copies (Transpose, Slice,
// Expand), Concat and Split, Gather, Cast and Where. One thread per output
// element (per 16-, 4- or 1-byte unit for Concat and Split),
// grid-stride; elements move as integers of their width, so every dtype of
// that width moves the same way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/float_storage.cuh"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

// Index: uint32_t when the output has fewer than 2^31 elements (cheaper
// division); offsets stay 64-bit (steps may be negative).
template <typename T, typename Index>
__global__ void stridedCopy(const T* x, T* y, StridedCopy copy, Index n) {
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int64_t offset = copy.offset;
    Index rest = i;
    for (int d = copy.rank - 1; d >= 0; --d) {
      const Index size = static_cast<Index>(copy.dims[d]);
      offset += static_cast<int64_t>(rest % size) * copy.strides[d];
      rest /= size;
    }
    y[i] = x[offset];
  }
}

template <typename T>
void stridedCopyOf(const void* x, void* y, const StridedCopy& copy, uint64_t n, cudaStream_t stream) {
  const unsigned blocks = blocksFor(n);
  if (n < (1ull << 31)) {
    stridedCopy<T, uint32_t><<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), copy,
                                                                      static_cast<uint32_t>(n));
  } else {
    stridedCopy<T, uint64_t><<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), copy,
                                                                      n);
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
template <>
__device__ double toDouble<__nv_bfloat16>(__nv_bfloat16 v) { return static_cast<double>(__bfloat162float(v)); }

template <typename To>
__device__ To fromDouble(double v) { return static_cast<To>(v); }
template <>
__device__ __half fromDouble<__half>(double v) { return __float2half_rn(static_cast<float>(v)); }
template <>
__device__ __nv_bfloat16 fromDouble<__nv_bfloat16>(double v) { return __float2bfloat16_rn(static_cast<float>(v)); }
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

// T: the values' bits (uint32_t for f32, uint16_t for f16): Where selects.
template <typename T>
__global__ void where(const bool* condition, const T* a, const T* b, T* y, WhereIndexing indexing, uint64_t n) {
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
    case CastType::kBF16: cast<<<blocks, kThreadsPerBlock, 0, stream>>>(in, static_cast<__nv_bfloat16*>(y), n); break;
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
    case CastType::kBF16:
    case CastType::kF64:
    case CastType::kI64:
    case CastType::kI32:
    case CastType::kI8:
    case CastType::kU8:
    case CastType::kBool: return true;
    default: return false;
  }
}

template <typename T>
__global__ void resizeNearest(const T* x, T* y, ResizeGeometry g, const int64_t* rows, const int64_t* cols,
                              uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const int64_t ox = static_cast<int64_t>(i % g.out_w);
    const int64_t oy = static_cast<int64_t>((i / g.out_w) % g.out_h);
    const int64_t p = static_cast<int64_t>(i / g.out_w / g.out_h);
    y[i] = x[(p * g.in_h + rows[oy]) * g.in_w + cols[ox]];
  }
}

// T: f32, or f16 or bf16 (`kiln compile --fp16`, `--bf16`) interpolated in
// f32.
template <typename T>
__global__ void resizeLinear(const T* x, T* y, ResizeGeometry g, const int64_t* rows, const int64_t* cols,
                             const float* row_w, const float* col_w, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const int64_t ox = static_cast<int64_t>(i % g.out_w);
    const int64_t oy = static_cast<int64_t>((i / g.out_w) % g.out_h);
    const int64_t p = static_cast<int64_t>(i / g.out_w / g.out_h);
    const T* plane = x + p * g.in_h * g.in_w;
    const T* r0 = plane + rows[oy] * g.in_w;
    const T* r1 = plane + rows[g.out_h + oy] * g.in_w;
    const int64_t x0 = cols[ox], x1 = cols[g.out_w + ox];
    const float wx = col_w[ox], wy = row_w[oy];
    const float a = toFloat(r0[x0]), b = toFloat(r0[x1]), c = toFloat(r1[x0]), d = toFloat(r1[x1]);
    // The CPU kernel's order of operations, so that both round alike.
    const float top = a + wx * (b - a);
    const float bottom = c + wx * (d - c);
    y[i] = fromFloat<T>(top + wy * (bottom - top));
  }
}

template <typename T>
__device__ bool compareValues(Compare op, T a, T b) {
  switch (op) {
    case Compare::kEqual: return a == b;
    case Compare::kLess: return a < b;
    case Compare::kGreater: return a > b;
    case Compare::kLessOrEqual: return a <= b;
    case Compare::kGreaterOrEqual: return a >= b;
    case Compare::kAnd: return a && b;
    case Compare::kOr: return a || b;
    case Compare::kXor: return bool(a) != bool(b);
    case Compare::kNot: return !a;
  }
  return false;
}

template <typename T>
__global__ void compare(const T* a, const T* b, bool* y, Compare op, WhereIndexing indexing, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    int64_t offset[2] = {0, 0};
    uint64_t rest = i;
    for (int d = indexing.rank - 1; d >= 0; --d) {
      const int64_t coordinate = static_cast<int64_t>(rest % indexing.dims[d]);
      rest /= indexing.dims[d];
      offset[0] += coordinate * indexing.strides[0][d];
      offset[1] += coordinate * indexing.strides[1][d];
    }
    y[i] = compareValues(op, a[offset[0]], op == Compare::kNot ? T{} : b[offset[1]]);
  }
}

}  // namespace

void launchCompare(const void* a, const void* b, bool* y, Compare op, CastType element, const WhereIndexing& indexing,
                   uint64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = blocksFor(n);
  switch (element) {
    case CastType::kF32: compare<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const float*>(a), static_cast<const float*>(b), y, op, indexing, n); break;
    case CastType::kI64: compare<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), y, op, indexing, n); break;
    case CastType::kI32: compare<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), y, op, indexing, n); break;
    case CastType::kBool: compare<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const bool*>(a), static_cast<const bool*>(b), y, op, indexing, n); break;
    default: break;
  }
}

void launchResize(const void* x, void* y, const ResizeGeometry& g, const int64_t* rows, const int64_t* cols,
                  const float* row_w, const float* col_w, cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(g.planes * g.out_h * g.out_w);
  if (n == 0) return;
  const unsigned blocks = blocksFor(n);
  if (g.linear && g.storage == FloatStorage::kF16) {
    resizeLinear<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const __half*>(x), static_cast<__half*>(y), g,
                                                          rows, cols, row_w, col_w, n);
    return;
  }
  if (g.linear && g.storage == FloatStorage::kBF16) {
    resizeLinear<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                          static_cast<__nv_bfloat16*>(y), g, rows, cols, row_w, col_w, n);
    return;
  }
  if (g.linear) {
    resizeLinear<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const float*>(x), static_cast<float*>(y), g, rows,
                                                          cols, row_w, col_w, n);
    return;
  }
  switch (g.element_bytes) {
    case 1: resizeNearest<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), g, rows, cols, n); break;
    case 2: resizeNearest<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), g, rows, cols, n); break;
    case 4: resizeNearest<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), g, rows, cols, n); break;
    case 8: resizeNearest<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y), g, rows, cols, n); break;
    default: break;
  }
}

namespace {

// One thread per unit of the whole; the piece found by a scan of the
// (few) offsets. Index: uint32_t below 2^31 units (cheaper division).
template <typename Unit, typename Index>
__global__ void pieces(Unit* whole, Pieces p, bool split, Index n) {
  const auto whole_units = static_cast<Index>(p.whole_units);
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const Index row = i / whole_units, position = i % whole_units;
    int k = 0;
    while (k + 1 < p.count && position >= p.offset[k + 1]) ++k;
    Unit* piece = static_cast<Unit*>(p.piece[k]) + static_cast<uint64_t>(row) * p.piece_units[k] +
                  (position - static_cast<Index>(p.offset[k]));
    if (split) {
      *piece = whole[i];
    } else {
      whole[i] = *piece;
    }
  }
}

template <typename Unit>
void piecesOf(void* whole, const Pieces& p, bool split, cudaStream_t stream) {
  const uint64_t n = p.outer * p.whole_units;
  if (n == 0) return;
  if (n < (1ull << 31)) {
    pieces<Unit, uint32_t><<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(static_cast<Unit*>(whole), p, split,
                                                                         static_cast<uint32_t>(n));
  } else {
    pieces<Unit, uint64_t><<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(static_cast<Unit*>(whole), p, split, n);
  }
}

}  // namespace

void launchPieces(void* whole, const Pieces& p, bool split, cudaStream_t stream) {
  switch (p.unit_bytes) {
    case 16: return piecesOf<uint4>(whole, p, split, stream);
    case 4: return piecesOf<uint32_t>(whole, p, split, stream);
    default: return piecesOf<uint8_t>(whole, p, split, stream);
  }
}

void launchStridedCopy(const void* x, void* y, const StridedCopy& copy, uint64_t n, int element_bytes,
                       cudaStream_t stream) {
  if (n == 0) return;
  switch (element_bytes) {
    case 1: stridedCopyOf<uint8_t>(x, y, copy, n, stream); break;
    case 2: stridedCopyOf<uint16_t>(x, y, copy, n, stream); break;
    case 4: stridedCopyOf<uint32_t>(x, y, copy, n, stream); break;
    case 8: stridedCopyOf<uint64_t>(x, y, copy, n, stream); break;
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
    case CastType::kBF16: castFrom<__nv_bfloat16>(x, y, target, n, stream); break;
    case CastType::kF64: castFrom<double>(x, y, target, n, stream); break;
    case CastType::kI64: castFrom<int64_t>(x, y, target, n, stream); break;
    case CastType::kI32: castFrom<int32_t>(x, y, target, n, stream); break;
    case CastType::kI8: castFrom<int8_t>(x, y, target, n, stream); break;
    case CastType::kU8: castFrom<uint8_t>(x, y, target, n, stream); break;
    case CastType::kBool: castFrom<bool>(x, y, target, n, stream); break;
    default: break;
  }
}

void launchWhere(const bool* condition, const void* a, const void* b, void* y, int element_bytes,
                 const WhereIndexing& indexing, uint64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (element_bytes == 2) {
    where<<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(condition, static_cast<const uint16_t*>(a),
                                                         static_cast<const uint16_t*>(b), static_cast<uint16_t*>(y),
                                                         indexing, n);
  } else {
    where<<<blocksFor(n), kThreadsPerBlock, 0, stream>>>(condition, static_cast<const uint32_t*>(a),
                                                         static_cast<const uint32_t*>(b), static_cast<uint32_t*>(y),
                                                         indexing, n);
  }
}

}  // namespace kiln::cuda
