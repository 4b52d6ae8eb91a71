// The device side of cuda steps other than elementwise programs and
// products: each launch queues one kernel on `stream` and returns. Plain
// types only, so that the host code (.cc, which prepares the steps) and the
// kernels (.cu, compiled as C++17: CMake 3.25 cannot ask nvcc for C++20)
// share nothing else. Shapes are collapsed by the host code to the few
// numbers each kernel needs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// Threads per block of the one-element-per-thread kernels, and the blocks
// that cover n elements (a grid-stride loop covers the rest).
inline constexpr int kThreadsPerBlock = 256;
inline unsigned blocksFor(uint64_t n) {
  const uint64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(blocks < 65535ull * 32 ? (blocks == 0 ? 1 : blocks) : 65535ull * 32);
}

// How a tensor stores its floats: f32, or 16 bits (`kiln compile --fp16`
// makes f16 tensors, `--bf16` bf16 ones), which the kernels convert to f32
// as they load and round back as they store.
enum class FloatStorage : uint8_t { kF32, kF16, kBF16 };

// Softmax or LogSoftmax over rows of `axis` elements that lie `inner` apart:
// element (o, a, i) of x at (o * axis + a) * inner + i. x and y are stored
// as `storage` (computed in f32).
void launchSoftmax(const void* x, void* y, FloatStorage storage, int64_t outer, int64_t axis, int64_t inner, bool log,
                   cudaStream_t stream);

// LayerNormalization over rows of `cols` elements; scale and bias have
// `cols` elements or one (broadcast), bias may be null. Every tensor stored
// as `storage` (computed in f32).
void launchLayerNorm(const void* x, const void* scale, bool scale_is_scalar, const void* bias, bool bias_is_scalar,
                     void* y, FloatStorage storage, int64_t rows, int64_t cols, float epsilon, cudaStream_t stream);

enum class Reduction : uint8_t { kSum, kMean, kMax, kMin, kSumSquare, kL2, kL1, kLogSumExp };
// Reduces element (o, r, i) over r: y[o * inner + i].
void launchReduce(const float* x, float* y, int64_t outer, int64_t reduced, int64_t inner, Reduction reduction,
                  cudaStream_t stream);

// y[i] = x[offset + sum_d coordinate_d(i) * strides[d]] over the output's
// dims (row-major), elements of `element_bytes` (1, 2, 4 or 8): Transpose,
// Slice, Expand, broadcasting copies.
inline constexpr int kMaxCopyDims = 8;
struct StridedCopy {
  int rank = 0;
  int64_t dims[kMaxCopyDims] = {};
  int64_t strides[kMaxCopyDims] = {};  // in elements of x, may be 0 or negative
  int64_t offset = 0;                  // in elements of x
};
void launchStridedCopy(const void* x, void* y, const StridedCopy& copy, uint64_t elements, int element_bytes,
                       cudaStream_t stream);

// Concat (gather = false: pieces into the whole) or Split (true: the whole
// into pieces) of up to kMaxPieces pieces in one launch: the whole has
// `outer` rows of whole_units units; in each row piece k is the run of
// piece_units[k] units at offset[k]. A unit is `unit_bytes` (16, 4 or 1:
// what every size, offset and address divides by).
inline constexpr int kMaxPieces = 16;
struct Pieces {
  int count = 0;
  int unit_bytes = 1;
  uint64_t outer = 0, whole_units = 0;
  uint64_t piece_units[kMaxPieces] = {};
  uint64_t offset[kMaxPieces] = {};
  void* piece[kMaxPieces] = {};
};
void launchPieces(void* whole, const Pieces& pieces, bool split, cudaStream_t stream);

// Gather along an axis: y[o, j, i] = x[o, index[j], i] (negative indices
// count from the end; out-of-range ones give zeros), indices i64 or i32.
void launchGather(const void* x, const void* indices, bool indices_are_i64, void* y, int64_t outer, int64_t axis,
                  int64_t count, int64_t inner, int element_bytes, cudaStream_t stream);

// Cast between the dtypes named by their DType values (kiln/dtype.h; the
// same numbers as CastType, which data_movement.cc checks): f32, f16, f64,
// i64, i32, i8, u8, bool. castSupported is false for a pair it lacks.
enum class CastType : uint8_t { kF32 = 1, kU8 = 2, kI8 = 3, kI32 = 6, kI64 = 7, kBool = 9, kF16 = 10, kF64 = 11, kBF16 = 16 };
bool castSupported(uint8_t from, uint8_t to);
void launchCast(const void* x, uint8_t from, void* y, uint8_t to, uint64_t elements, cudaStream_t stream);

// Where(cond, a, b) over f32 with up to 8 dimensions of broadcast strides
// per operand (0 along broadcast dimensions).
struct WhereIndexing {
  int rank = 0;
  int64_t dims[kMaxCopyDims] = {};
  int64_t strides[3][kMaxCopyDims] = {};
};
// Where over f32 (element_bytes 4) or f16 (2) values.
void launchWhere(const bool* condition, const void* a, const void* b, void* y, int element_bytes,
                 const WhereIndexing& indexing, uint64_t elements, cudaStream_t stream);

// Comparisons and logic with a bool result: y[i] = a OP b over broadcast
// operands (strides as WhereIndexing's, operands 0 and 1; Not reads only a).
enum class Compare : uint8_t { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual, kAnd, kOr, kXor, kNot };
// `element` is CastType::kF32, kI64 or kI32 for comparisons, kBool for logic.
void launchCompare(const void* a, const void* b, bool* y, Compare op, CastType element, const WhereIndexing& indexing,
                   uint64_t elements, cudaStream_t stream);

// Resize of `planes` planes of in_h x in_w to out_h x out_w through index
// tables in device memory (kernels/cpu/resize_tables.h): rows[0..out_h) the
// first source row, rows[out_h..2 out_h) the second; cols likewise; weights
// of the second source in row_w and col_w (linear only). Nearest moves
// elements of `element_bytes`; linear is f32.
struct ResizeGeometry {
  int64_t planes = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  bool linear = false;
  int element_bytes = 4;
  FloatStorage storage = FloatStorage::kF32;  // linear: how its floats are stored
};
void launchResize(const void* x, void* y, const ResizeGeometry& geometry, const int64_t* rows, const int64_t* cols,
                  const float* row_w, const float* col_w, cudaStream_t stream);

// Attention (kernels/attention_plan.h) in one kernel, the scores never in
// memory: y = softmax(dot(q, k) * scale, softcapped, + bias) v per query
// row. Strides in elements over (batch, head, sequence); q, k, v and y
// stored as `storage`, a float mask as `mask_storage`. Head sizes up to
// kMaxAttentionHeadSize.
inline constexpr int64_t kMaxAttentionHeadSize = 128;
inline constexpr int kAttentionRowsPerBlock = 16;  // query rows of the smallest blocks (a warp)
enum class AttentionMaskKind : uint8_t { kNone, kBool, kFloat };
struct AttentionShape {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_seq = 0, total = 0, head_size = 0, v_head_size = 0;
  int64_t q_strides[3] = {}, k_strides[3] = {}, v_strides[3] = {}, y_strides[3] = {};
  float scale = 1, softcap = 0;
  bool causal = false;
  int64_t left_window = -1, right_window = -1;  // -1: no window
  AttentionMaskKind mask = AttentionMaskKind::kNone;
  int64_t mask_len = 0;
  int64_t mask_strides[3] = {};  // over batch, q head, query; 0 where broadcast
  FloatStorage storage = FloatStorage::kF32, mask_storage = FloatStorage::kF32;
};
// Sets up the kernel `shape` will launch (its shared memory may pass the
// default 48 KiB); once, before launches, with the device current.
void prepareAttentionKernel(const AttentionShape& shape);
// `nonpad` (i64[batch], the keys of each batch that count) may be null.
void launchAttention(const void* q, const void* k, const void* v, const void* mask, const int64_t* nonpad, void* y,
                     const AttentionShape& shape, cudaStream_t stream);

}  // namespace kiln::cuda
