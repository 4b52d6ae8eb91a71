// Softmax, LogSoftmax, LayerNormalization and reductions on cuda
// (launch.h): one warp per row for rows of up to 2,048 contiguous elements;
// one thread per row for many rows whose elements lie apart (a softmax or
// reduction over a middle axis); else one block per row (per output
// element for reductions), the threads striding over the row and combining
// through a warp or block reduction.
// Rows are read again for each pass rather than held, so any row length
// works; LayerNormalization takes the variance about the mean (two passes),
// as the CPU kernel does, which stays exact for rows with a large mean.
// Softmax and LayerNormalization also take f16 tensors (computing in f32).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>

#include "kernels/cuda/float_storage.cuh"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kBlock = 256;
// From this many rows whose elements lie apart (inner > 1), a thread per
// row keeps the GPU busy and reads coalesced; fewer, longer rows get a
// block each.
constexpr int64_t kColumnRowsMin = 2048;

template <typename Combine>
__device__ float blockReduce(float value, Combine combine, float identity) {
  __shared__ float partial[kBlock / 32];
  __shared__ float result;
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_down_sync(0xffffffffu, value, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < blockDim.x / 32 ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_down_sync(0xffffffffu, value, offset));
    if (lane == 0) result = value;
  }
  __syncthreads();
  const float total = result;
  __syncthreads();  // `result` may be written again by the next reduction
  return total;
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {  // NaN wins, as in the CPU kernels
  __device__ float operator()(float a, float b) const { return (isnan(a) || isnan(b)) ? NAN : fmaxf(a, b); }
};
struct Min {
  __device__ float operator()(float a, float b) const { return (isnan(a) || isnan(b)) ? NAN : fminf(a, b); }
};

template <typename T>
__global__ void softmaxRows(const T* x, T* y, int64_t axis, int64_t inner, bool log) {
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  float max = -INFINITY;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) max = Max()(max, toFloat(x[base + a * inner]));
  max = blockReduce(max, Max(), -INFINITY);
  float sum = 0;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) sum += expf(toFloat(x[base + a * inner]) - max);
  sum = blockReduce(sum, Add(), 0.0f);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) {
      y[base + a * inner] = fromFloat<T>(toFloat(x[base + a * inner]) - max - log_sum);
    }
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) {
      y[base + a * inner] = fromFloat<T>(expf(toFloat(x[base + a * inner]) - max) * scale);
    }
  }
}

// Rows whose elements lie `inner` apart (a softmax over the channels of
// [N, C, H, W], or over YOLOv8's 16 distance bins): one thread per row,
// neighbouring threads on neighbouring rows, so each of its three passes
// over the axis reads memory coalesced.
template <typename T>
__global__ void softmaxColumns(const T* x, T* y, int64_t rows, int64_t axis, int64_t inner, bool log) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  float max = -INFINITY;
  for (int64_t a = 0; a < axis; ++a) max = Max()(max, toFloat(x[base + a * inner]));
  float sum = 0;
  for (int64_t a = 0; a < axis; ++a) sum += expf(toFloat(x[base + a * inner]) - max);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = 0; a < axis; ++a) y[base + a * inner] = fromFloat<T>(toFloat(x[base + a * inner]) - max - log_sum);
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = 0; a < axis; ++a) {
      y[base + a * inner] = fromFloat<T>(expf(toFloat(x[base + a * inner]) - max) * scale);
    }
  }
}

// Short rows (the common case: attention scores, hidden states of a few
// hundred) go one warp per row, eight rows per block: warp shuffles instead
// of block barriers, and every thread busy.
constexpr int kWarpRowsPerBlock = 8;
constexpr int64_t kWarpRowLimit = 2048;

__device__ float warpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ float warpMax(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = Max()(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

template <typename T>
__global__ void softmaxWarpRows(const T* x, T* y, int64_t rows, int64_t axis, bool log) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* in = x + row * axis;
  T* out = y + row * axis;
  float max = -INFINITY;
  for (int64_t a = lane; a < axis; a += 32) max = Max()(max, toFloat(in[a]));
  max = warpMax(max);
  float sum = 0;
  for (int64_t a = lane; a < axis; a += 32) sum += expf(toFloat(in[a]) - max);
  sum = warpSum(sum);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = lane; a < axis; a += 32) out[a] = fromFloat<T>(toFloat(in[a]) - max - log_sum);
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = lane; a < axis; a += 32) out[a] = fromFloat<T>(expf(toFloat(in[a]) - max) * scale);
  }
}

template <typename T>
__global__ void layerNormWarpRows(const T* x, const T* scale, bool scale_is_scalar, const T* bias, bool bias_is_scalar,
                                  T* y, int64_t rows, int64_t cols, float epsilon) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* in = x + row * cols;
  T* out = y + row * cols;
  float sum = 0;
  for (int64_t c = lane; c < cols; c += 32) sum += toFloat(in[c]);
  const float mean = warpSum(sum) / static_cast<float>(cols);
  float squares = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = toFloat(in[c]) - mean;
    squares += d * d;
  }
  const float inv_std = 1.0f / sqrtf(warpSum(squares) / static_cast<float>(cols) + epsilon);
  for (int64_t c = lane; c < cols; c += 32) {
    const float s = toFloat(scale[scale_is_scalar ? 0 : c]);
    const float b = bias == nullptr ? 0.0f : toFloat(bias[bias_is_scalar ? 0 : c]);
    out[c] = fromFloat<T>((toFloat(in[c]) - mean) * inv_std * s + b);
  }
}

template <typename T>
__global__ void layerNormRows(const T* x, const T* scale, bool scale_is_scalar, const T* bias, bool bias_is_scalar,
                              T* y, int64_t cols, float epsilon) {
  const T* row = x + blockIdx.x * cols;
  T* out = y + blockIdx.x * cols;
  float sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += toFloat(row[c]);
  const float mean = blockReduce(sum, Add(), 0.0f) / static_cast<float>(cols);
  float squares = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = toFloat(row[c]) - mean;
    squares += d * d;
  }
  const float variance = blockReduce(squares, Add(), 0.0f) / static_cast<float>(cols);
  const float inv_std = 1.0f / sqrtf(variance + epsilon);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float s = toFloat(scale[scale_is_scalar ? 0 : c]);
    const float b = bias == nullptr ? 0.0f : toFloat(bias[bias_is_scalar ? 0 : c]);
    out[c] = fromFloat<T>((toFloat(row[c]) - mean) * inv_std * s + b);
  }
}

__device__ float prepareValue(float v, Reduction reduction) {
  switch (reduction) {
    case Reduction::kSumSquare:
    case Reduction::kL2: return v * v;
    case Reduction::kL1: return fabsf(v);
    default: return v;
  }
}

__device__ float finishValue(float v, Reduction reduction, int64_t count, float max) {
  switch (reduction) {
    case Reduction::kMean: return v / static_cast<float>(count);
    case Reduction::kL2: return sqrtf(v);
    case Reduction::kLogSumExp: return logf(v) + max;
    default: return v;
  }
}

// reduceRows' reduction, one thread per output element, for reductions
// over an axis whose elements lie `inner` apart.
__global__ void reduceColumns(const float* x, float* y, int64_t outputs, int64_t reduced, int64_t inner,
                              Reduction reduction) {
  const int64_t output = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (output >= outputs) return;
  const int64_t base = (output / inner) * reduced * inner + output % inner;
  float max = 0;
  if (reduction == Reduction::kLogSumExp) {
    max = -INFINITY;
    for (int64_t r = 0; r < reduced; ++r) max = Max()(max, x[base + r * inner]);
  }
  float value;
  if (reduction == Reduction::kMax || reduction == Reduction::kMin) {
    value = reduction == Reduction::kMax ? -INFINITY : INFINITY;
    for (int64_t r = 0; r < reduced; ++r) {
      const float v = x[base + r * inner];
      value = reduction == Reduction::kMax ? Max()(value, v) : Min()(value, v);
    }
  } else {
    value = 0;
    for (int64_t r = 0; r < reduced; ++r) {
      const float v = x[base + r * inner];
      value += reduction == Reduction::kLogSumExp ? expf(v - max) : prepareValue(v, reduction);
    }
  }
  y[output] = finishValue(value, reduction, reduced, max);
}

// One block per output element.
__global__ void reduceRows(const float* x, float* y, int64_t reduced, int64_t inner, Reduction reduction) {
  const int64_t output = blockIdx.x;
  const int64_t base = (output / inner) * reduced * inner + output % inner;
  float max = 0;
  if (reduction == Reduction::kLogSumExp) {
    float m = -INFINITY;
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x) m = Max()(m, x[base + r * inner]);
    max = blockReduce(m, Max(), -INFINITY);
  }
  float value;
  if (reduction == Reduction::kMax || reduction == Reduction::kMin) {
    value = reduction == Reduction::kMax ? -INFINITY : INFINITY;
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x) {
      const float v = x[base + r * inner];
      value = reduction == Reduction::kMax ? Max()(value, v) : Min()(value, v);
    }
    value = reduction == Reduction::kMax ? blockReduce(value, Max(), -INFINITY) : blockReduce(value, Min(), INFINITY);
  } else {
    value = 0;
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x) {
      const float v = x[base + r * inner];
      value += reduction == Reduction::kLogSumExp ? expf(v - max) : prepareValue(v, reduction);
    }
    value = blockReduce(value, Add(), 0.0f);
  }
  if (threadIdx.x == 0) y[output] = finishValue(value, reduction, reduced, max);
}

template <typename T>
void softmaxAs(const void* input, void* output, int64_t outer, int64_t axis, int64_t inner, bool log,
               cudaStream_t stream) {
  const auto* x = static_cast<const T*>(input);
  auto* y = static_cast<T*>(output);
  const int64_t rows = outer * inner;
  if (rows == 0 || axis == 0) return;
  if (inner == 1 && axis <= kWarpRowLimit) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
    softmaxWarpRows<T><<<blocks, kWarpRowsPerBlock * 32, 0, stream>>>(x, y, rows, axis, log);
    return;
  }
  if (inner > 1 && rows >= kColumnRowsMin) {
    const auto blocks = static_cast<unsigned>((rows + kBlock - 1) / kBlock);
    softmaxColumns<T><<<blocks, kBlock, 0, stream>>>(x, y, rows, axis, inner, log);
    return;
  }
  softmaxRows<T><<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(x, y, axis, inner, log);
}

template <typename T>
void layerNormAs(const void* input, const void* scale_data, bool scale_is_scalar, const void* bias_data,
                 bool bias_is_scalar, void* output, int64_t rows, int64_t cols, float epsilon, cudaStream_t stream) {
  const auto* x = static_cast<const T*>(input);
  const auto* scale = static_cast<const T*>(scale_data);
  const auto* bias = static_cast<const T*>(bias_data);
  auto* y = static_cast<T*>(output);
  if (rows == 0 || cols == 0) return;
  if (cols <= kWarpRowLimit) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
    layerNormWarpRows<T><<<blocks, kWarpRowsPerBlock * 32, 0, stream>>>(x, scale, scale_is_scalar, bias,
                                                                         bias_is_scalar, y, rows, cols, epsilon);
    return;
  }
  layerNormRows<T><<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(x, scale, scale_is_scalar, bias, bias_is_scalar,
                                                                        y, cols, epsilon);
}

}  // namespace

void launchSoftmax(const void* x, void* y, FloatStorage storage, int64_t outer, int64_t axis, int64_t inner, bool log,
                   cudaStream_t stream) {
  switch (storage) {
    case FloatStorage::kF16: softmaxAs<__half>(x, y, outer, axis, inner, log, stream); break;
    case FloatStorage::kBF16: softmaxAs<__nv_bfloat16>(x, y, outer, axis, inner, log, stream); break;
    default: softmaxAs<float>(x, y, outer, axis, inner, log, stream);
  }
}

void launchLayerNorm(const void* x, const void* scale, bool scale_is_scalar, const void* bias, bool bias_is_scalar,
                     void* y, FloatStorage storage, int64_t rows, int64_t cols, float epsilon, cudaStream_t stream) {
  switch (storage) {
    case FloatStorage::kF16:
      layerNormAs<__half>(x, scale, scale_is_scalar, bias, bias_is_scalar, y, rows, cols, epsilon, stream);
      break;
    case FloatStorage::kBF16:
      layerNormAs<__nv_bfloat16>(x, scale, scale_is_scalar, bias, bias_is_scalar, y, rows, cols, epsilon, stream);
      break;
    default: layerNormAs<float>(x, scale, scale_is_scalar, bias, bias_is_scalar, y, rows, cols, epsilon, stream);
  }
}

void launchReduce(const float* x, float* y, int64_t outer, int64_t reduced, int64_t inner, Reduction reduction,
                  cudaStream_t stream) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  if (inner > 1 && outputs >= kColumnRowsMin) {
    const auto blocks = static_cast<unsigned>((outputs + kBlock - 1) / kBlock);
    reduceColumns<<<blocks, kBlock, 0, stream>>>(x, y, outputs, reduced, inner, reduction);
    return;
  }
  reduceRows<<<static_cast<unsigned>(outputs), kBlock, 0, stream>>>(x, y, reduced, inner, reduction);
}

}  // namespace kiln::cuda
