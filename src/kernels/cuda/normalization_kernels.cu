// Softmax, LogSoftmax, LayerNormalization and reductions on cuda
// (launch.h): one warp per row for rows of up to 2,048 contiguous elements;
// one thread per row for many rows whose elements lie apart (a softmax or
// reduction over a middle axis); else one block per row (per output
// element for reductions), the threads striding over the row and combining
// through a warp or block reduction.
// Rows are read again for each pass rather than held, so any row length
// works; LayerNormalization takes the variance about the mean (two passes),
// as the CPU kernel does, which stays exact for rows with a large mean.
#include <cfloat>
#include <cmath>

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

__global__ void softmaxRows(const float* x, float* y, int64_t axis, int64_t inner, bool log) {
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  float max = -INFINITY;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) max = Max()(max, x[base + a * inner]);
  max = blockReduce(max, Max(), -INFINITY);
  float sum = 0;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) sum += expf(x[base + a * inner] - max);
  sum = blockReduce(sum, Add(), 0.0f);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) y[base + a * inner] = x[base + a * inner] - max - log_sum;
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) y[base + a * inner] = expf(x[base + a * inner] - max) * scale;
  }
}

// Rows whose elements lie `inner` apart (a softmax over the channels of
// [N, C, H, W], or over YOLOv8's 16 distance bins): one thread per row,
// neighbouring threads on neighbouring rows, so each of its three passes
// over the axis reads memory coalesced.
__global__ void softmaxColumns(const float* x, float* y, int64_t rows, int64_t axis, int64_t inner, bool log) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  float max = -INFINITY;
  for (int64_t a = 0; a < axis; ++a) max = Max()(max, x[base + a * inner]);
  float sum = 0;
  for (int64_t a = 0; a < axis; ++a) sum += expf(x[base + a * inner] - max);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = 0; a < axis; ++a) y[base + a * inner] = x[base + a * inner] - max - log_sum;
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = 0; a < axis; ++a) y[base + a * inner] = expf(x[base + a * inner] - max) * scale;
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

__global__ void softmaxWarpRows(const float* x, float* y, int64_t rows, int64_t axis, bool log) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float* in = x + row * axis;
  float* out = y + row * axis;
  float max = -INFINITY;
  for (int64_t a = lane; a < axis; a += 32) max = Max()(max, in[a]);
  max = warpMax(max);
  float sum = 0;
  for (int64_t a = lane; a < axis; a += 32) sum += expf(in[a] - max);
  sum = warpSum(sum);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t a = lane; a < axis; a += 32) out[a] = in[a] - max - log_sum;
  } else {
    const float scale = 1.0f / sum;
    for (int64_t a = lane; a < axis; a += 32) out[a] = expf(in[a] - max) * scale;
  }
}

__global__ void layerNormWarpRows(const float* x, const float* scale, bool scale_is_scalar, const float* bias,
                                  bool bias_is_scalar, float* y, int64_t rows, int64_t cols, float epsilon) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float* in = x + row * cols;
  float* out = y + row * cols;
  float sum = 0;
  for (int64_t c = lane; c < cols; c += 32) sum += in[c];
  const float mean = warpSum(sum) / static_cast<float>(cols);
  float squares = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = in[c] - mean;
    squares += d * d;
  }
  const float inv_std = 1.0f / sqrtf(warpSum(squares) / static_cast<float>(cols) + epsilon);
  for (int64_t c = lane; c < cols; c += 32) {
    const float s = scale[scale_is_scalar ? 0 : c];
    const float b = bias == nullptr ? 0.0f : bias[bias_is_scalar ? 0 : c];
    out[c] = (in[c] - mean) * inv_std * s + b;
  }
}

__global__ void layerNormRows(const float* x, const float* scale, bool scale_is_scalar, const float* bias,
                              bool bias_is_scalar, float* y, int64_t cols, float epsilon) {
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  float sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += row[c];
  const float mean = blockReduce(sum, Add(), 0.0f) / static_cast<float>(cols);
  float squares = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = row[c] - mean;
    squares += d * d;
  }
  const float variance = blockReduce(squares, Add(), 0.0f) / static_cast<float>(cols);
  const float inv_std = 1.0f / sqrtf(variance + epsilon);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float s = scale[scale_is_scalar ? 0 : c];
    const float b = bias == nullptr ? 0.0f : bias[bias_is_scalar ? 0 : c];
    out[c] = (row[c] - mean) * inv_std * s + b;
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

}  // namespace

void launchSoftmax(const float* x, float* y, int64_t outer, int64_t axis, int64_t inner, bool log,
                   cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || axis == 0) return;
  if (inner == 1 && axis <= kWarpRowLimit) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
    softmaxWarpRows<<<blocks, kWarpRowsPerBlock * 32, 0, stream>>>(x, y, rows, axis, log);
    return;
  }
  if (inner > 1 && rows >= kColumnRowsMin) {
    const auto blocks = static_cast<unsigned>((rows + kBlock - 1) / kBlock);
    softmaxColumns<<<blocks, kBlock, 0, stream>>>(x, y, rows, axis, inner, log);
    return;
  }
  softmaxRows<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(x, y, axis, inner, log);
}

void launchLayerNorm(const float* x, const float* scale, bool scale_is_scalar, const float* bias, bool bias_is_scalar,
                     float* y, int64_t rows, int64_t cols, float epsilon, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (cols <= kWarpRowLimit) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
    layerNormWarpRows<<<blocks, kWarpRowsPerBlock * 32, 0, stream>>>(x, scale, scale_is_scalar, bias, bias_is_scalar,
                                                                      y, rows, cols, epsilon);
    return;
  }
  layerNormRows<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(x, scale, scale_is_scalar, bias, bias_is_scalar,
                                                                     y, cols, epsilon);
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
