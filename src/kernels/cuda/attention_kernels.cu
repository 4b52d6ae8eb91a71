// Fused attention on cuda (launch.h; the semantics are those of
// kernels/attention_plan.h and the CPU kernel, cpu/transformer.cc): the
// scores of a block of queries are made, softmaxed and multiplied by V
// without leaving the chip, where the unfused form writes and reads
// [batch, heads, queries, keys] scores three times.
//
// A block takes kRows queries of one (batch, head) and walks the keys in
// tiles of kTileKeys, as FlashAttention does: per tile it stages K and V in
// shared memory (as f32), computes the kRows x kTileKeys scores (each thread
// a 4 x 4 patch, register-blocked: two 16-byte shared loads per 16 FMAs),
// folds them into each row's running maximum and sum (the accumulator
// rescaled when the maximum grows), and adds P V to its 4 rows x
// (4 * kValueChunks) accumulators. Eight consecutive lanes share a row
// group, so a row's reductions are three shuffles. Q and K are staged
// transposed ([element][row]) so that the patches read 16-byte runs; pitches
// of 4 floats past the rows keep the transposing stores off a shared bank.
// Tiles that no row of the block may see (past the causal frontier or the
// right window) are never loaded.
//
// Few queries (a batch of one) make too few blocks to fill the GPU, and
// each would walk every key alone. Then a block of 16 queries is kSplits
// warps that take every kSplits-th tile each, with tiles of their own,
// and combine their partial rows at the end (each partial sum and output
// weighted by exp(its maximum - the overall maximum)).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/float_storage.cuh"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kTileKeys = 32;
constexpr int kGroupLanes = 8;          // threads per row group: 8 x 4 = 32 keys
constexpr int kSmallRowGroups = kAttentionRowsPerBlock / 4;  // 16 queries a block, one warp a split
constexpr int kLargeRowGroups = 16;                          // 64 queries a block
constexpr int kSplits = 4;
// From this many blocks the GPU is full enough (two per SM of an H100):
// blocks of 64 queries when they are that many, else blocks of 16, split
// over the keys when even those are fewer.
constexpr int64_t kEnoughBlocks = 256;
// Shared memory a block may have on every GPU from sm_80 on (sm_86 and
// sm_89 give 99 KiB): split blocks of large heads need more, and do not split.
constexpr size_t kSharedMax = 96 * 1024;

// Over the 8 lanes of a row group (consecutive lanes).
__device__ inline float groupMax(float value) {  // NaN is tracked apart (`poisoned`)
  for (int offset = 1; offset < kGroupLanes; offset *= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}
__device__ inline float groupSum(float value) {
  for (int offset = 1; offset < kGroupLanes; offset *= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The additive bias of key j for query i of (batch b, q head h): -inf for
// a key the query may not see, else 0 or the float mask's value.
__device__ float biasOf(const AttentionShape& s, const void* mask, const int64_t* nonpad, int64_t b, int64_t h,
                        int64_t i, int64_t j, int64_t offset) {
  float bias = 0;
  if (s.mask != AttentionMaskKind::kNone) {
    if (j >= s.mask_len) return -INFINITY;
    const int64_t at = b * s.mask_strides[0] + h * s.mask_strides[1] + i * s.mask_strides[2] + j;
    if (s.mask == AttentionMaskKind::kBool) {
      if (static_cast<const uint8_t*>(mask)[at] == 0) return -INFINITY;
    } else {
      bias = loadFloat(mask, s.mask_storage, at);
    }
  }
  const int64_t frontier = i + offset;  // the query's absolute position
  if (s.causal && j > frontier) return -INFINITY;
  if (s.left_window >= 0 && frontier - j > s.left_window) return -INFINITY;
  if (s.right_window >= 0 && j - frontier > s.right_window) return -INFINITY;
  if (nonpad != nullptr && j >= nonpad[b]) return -INFINITY;
  return bias;
}

// Shared memory of one block, in floats: Q, then each split's tiles; every
// region starts 16-byte aligned.
template <int kRowGroups, int kSplitCount, int kValueChunks>
struct Layout {
  static constexpr int kRows = kRowGroups * 4;
  static constexpr int kRowPitch = kRows + 4;            // Qt [head_size][.], P^T [kTileKeys][.]
  static constexpr int kKeyPitch = kTileKeys + 4;        // Kt [head_size][.]
  static constexpr int kValuePitch = kValueChunks * 32;  // V [kTileKeys][.]
  __host__ __device__ static int64_t splitFloats(int64_t head_size) {
    return head_size * kKeyPitch + kTileKeys * (kValuePitch + kRowPitch);
  }
  static size_t floats(int64_t head_size) {
    return static_cast<size_t>(head_size * kRowPitch + kSplitCount * splitFloats(head_size));
  }
};

// The tiles of one split are synchronized by its threads only: the whole
// block, or (split blocks) its warp.
template <int kSplitCount>
__device__ inline void syncSplit() {
  if constexpr (kSplitCount == 1) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

template <typename T, int kRowGroups, int kSplitCount, int kValueChunks>
__global__ void __launch_bounds__(kRowGroups * kGroupLanes * kSplitCount)
    attentionTiles(const T* q, const T* k, const T* v, const void* mask, const int64_t* nonpad, T* y,
                   AttentionShape s, int64_t row_blocks) {
  static_assert(kSplitCount == 1 || kRowGroups * kGroupLanes == 32, "a split is one warp");
  using L = Layout<kRowGroups, kSplitCount, kValueChunks>;
  constexpr int kRows = L::kRows;
  constexpr int kCols = kValueChunks * 4;  // accumulators per row
  constexpr int kSplitThreads = kRowGroups * kGroupLanes;
  extern __shared__ float4 shared4[];
  const int head_size = static_cast<int>(s.head_size);
  const int v_head_size = static_cast<int>(s.v_head_size);
  const int split = static_cast<int>(threadIdx.x) / kSplitThreads;
  const int local = static_cast<int>(threadIdx.x) % kSplitThreads;
  float* qt = reinterpret_cast<float*>(shared4);  // Q transposed, shared by the splits
  float* kt = qt + head_size * L::kRowPitch + split * L::splitFloats(head_size);  // K tile transposed
  float* vs = kt + head_size * L::kKeyPitch;       // V tile
  float* pt = vs + kTileKeys * L::kValuePitch;     // probabilities, transposed

  int64_t block = blockIdx.x;
  const int64_t first_row = (block % row_blocks) * kRows;
  block /= row_blocks;
  const int64_t h = block % s.q_heads;
  const int64_t b = block / s.q_heads;
  const int64_t kv_h = h / (s.q_heads / s.kv_heads);
  const int tx = local % kGroupLanes;  // keys tx*4.., value columns tx*4 + 32c..
  const int ty = local / kGroupLanes;  // rows ty*4..
  const int64_t offset = nonpad != nullptr ? nonpad[b] - s.q_seq : 0;
  const bool general = s.mask != AttentionMaskKind::kNone || s.causal || s.left_window >= 0 ||
                       s.right_window >= 0 || nonpad != nullptr;

  const T* q_head = q + b * s.q_strides[0] + h * s.q_strides[1];
  for (int r = static_cast<int>(threadIdx.x) / kGroupLanes; r < kRows; r += kRowGroups * kSplitCount) {
    const bool row = first_row + r < s.q_seq;
    for (int d = tx; d < head_size; d += kGroupLanes) {
      qt[d * L::kRowPitch + r] = row ? toFloat(q_head[(first_row + r) * s.q_strides[2] + d]) : 0.0f;
    }
  }
  __syncthreads();
  // Keys from `end` on are hidden from every row of the block.
  const int64_t last_row = (first_row + kRows < s.q_seq ? first_row + kRows : s.q_seq) - 1;
  int64_t end = s.total;
  if (s.causal) end = min(end, last_row + offset + 1);
  if (s.right_window >= 0) end = min(end, last_row + offset + s.right_window + 1);

  const T* k_head = k + b * s.k_strides[0] + kv_h * s.k_strides[1];
  const T* v_head = v + b * s.v_strides[0] + kv_h * s.v_strides[1];
  float row_max[4], row_sum[4], acc[4][kCols];
  bool poisoned[4];  // a NaN score makes the row NaN, as in the reference
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0;
    poisoned[i] = false;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0;
  }

  for (int64_t tile = split * kTileKeys; tile < end; tile += kTileKeys * kSplitCount) {
    syncSplit<kSplitCount>();  // the previous tile is done with kt, vs and pt
    for (int r = ty; r < kTileKeys; r += kRowGroups) {
      const bool key = tile + r < end;
      for (int d = tx; d < head_size; d += kGroupLanes) {
        kt[d * L::kKeyPitch + r] = key ? toFloat(k_head[(tile + r) * s.k_strides[2] + d]) : 0.0f;
      }
      // Zeros past the last key and past V's head: P V reads them.
      for (int d = tx; d < L::kValuePitch; d += kGroupLanes) {
        vs[r * L::kValuePitch + d] = key && d < v_head_size ? toFloat(v_head[(tile + r) * s.v_strides[2] + d]) : 0.0f;
      }
    }
    syncSplit<kSplitCount>();

    // Scores of rows ty*4.. against keys tx*4..
    float score[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < head_size; ++d) {
      const float4 qv = *reinterpret_cast<const float4*>(qt + d * L::kRowPitch + ty * 4);
      const float4 kv = *reinterpret_cast<const float4*>(kt + d * L::kKeyPitch + tx * 4);
      const float qa[4] = {qv.x, qv.y, qv.z, qv.w};
      const float ka[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) score[i][j] = fmaf(qa[i], ka[j], score[i][j]);
      }
    }
    float p[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t query = first_row + ty * 4 + i;
      float tile_max = -INFINITY;
      bool nan = false;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = tile + tx * 4 + j;
        float z = -INFINITY;
        if (key < end && query < s.q_seq) {
          const float bias = general ? biasOf(s, mask, nonpad, b, h, query, key, offset) : 0.0f;
          if (bias != -INFINITY) {
            float logit = score[i][j] * s.scale;
            if (s.softcap > 0) logit = s.softcap * tanhf(logit / s.softcap);
            z = logit + bias;
          }
        }
        nan = nan || isnan(z);
        tile_max = fmaxf(tile_max, z);
        p[i][j] = z;
      }
      poisoned[i] = poisoned[i] || nan;
      const float new_max = fmaxf(row_max[i], groupMax(tile_max));
      float sum = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[i][j] = (new_max == -INFINITY || p[i][j] == -INFINITY || isnan(p[i][j])) ? 0.0f : expf(p[i][j] - new_max);
        sum += p[i][j];
      }
      // 0 while no key was seen (row_max -inf); 1 when nothing is seen yet.
      const float correction = new_max == -INFINITY ? 1.0f : expf(row_max[i] - new_max);
      row_sum[i] = row_sum[i] * correction + groupSum(sum);
      row_max[i] = new_max;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= correction;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<float4*>(pt + (tx * 4 + j) * L::kRowPitch + ty * 4) =
          make_float4(p[0][j], p[1][j], p[2][j], p[3][j]);
    }
    syncSplit<kSplitCount>();

    // acc += P V over the tile's keys.
#pragma unroll 4
    for (int key = 0; key < kTileKeys; ++key) {
      const float4 pv = *reinterpret_cast<const float4*>(pt + key * L::kRowPitch + ty * 4);
      const float pa[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int c = 0; c < kValueChunks; ++c) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + key * L::kValuePitch + c * 32 + tx * 4);
        const float va[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][c * 4 + e] = fmaf(pa[i], va[e], acc[i][c * 4 + e]);
        }
      }
    }
  }

  // The row is NaN when any lane of its group saw a NaN.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    for (int offset_lanes = 1; offset_lanes < kGroupLanes; offset_lanes *= 2) {
      poisoned[i] = __shfl_xor_sync(0xffffffffu, static_cast<int>(poisoned[i]), offset_lanes) != 0 || poisoned[i];
    }
  }
  if constexpr (kSplitCount > 1) {
    // Each split leaves its rows' maximum, sum, NaN flag and accumulators in
    // its own tiles (pt: 3 x kRows floats, vs: kRows x kValuePitch); the
    // first split combines them.
    __syncwarp();  // this split is done reading its tiles
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = ty * 4 + i;
      if (tx == 0) {
        pt[row] = row_max[i];
        pt[kRows + row] = row_sum[i];
        pt[2 * kRows + row] = poisoned[i] ? 1.0f : 0.0f;
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) vs[row * L::kValuePitch + (c / 4) * 32 + tx * 4 + c % 4] = acc[i][c];
    }
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = ty * 4 + i;
      float overall = -INFINITY;
      for (int other = 0; other < kSplitCount; ++other) {
        overall = fmaxf(overall, pt[other * L::splitFloats(head_size) + row]);
      }
      row_sum[i] = 0;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] = 0;
      for (int other = 0; other < kSplitCount; ++other) {
        const float* their_pt = pt + other * L::splitFloats(head_size);
        const float* their_vs = vs + other * L::splitFloats(head_size);
        const float their_max = their_pt[row];
        const float weight = their_max == -INFINITY ? 0.0f : expf(their_max - overall);
        row_sum[i] += their_pt[kRows + row] * weight;
        poisoned[i] = poisoned[i] || their_pt[2 * kRows + row] != 0;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          acc[i][c] += their_vs[row * L::kValuePitch + (c / 4) * 32 + tx * 4 + c % 4] * weight;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool nan = poisoned[i];
    const int64_t query = first_row + ty * 4 + i;
    if (query >= s.q_seq) continue;
    // A row that saw no key gives zeros, as the reference.
    const float inv = row_sum[i] > 0 ? 1.0f / row_sum[i] : 0.0f;
    T* out = y + b * s.y_strides[0] + h * s.y_strides[1] + query * s.y_strides[2];
#pragma unroll
    for (int c = 0; c < kValueChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = c * 32 + tx * 4 + e;
        if (d < v_head_size) out[d] = fromFloat<T>(nan ? NAN : acc[i][c * 4 + e] * inv);
      }
    }
  }
}

// The element type T of an attentionTiles<T, ...> pointer.
template <typename Kernel>
struct ElementOf;
template <typename T, typename... Rest>
struct ElementOf<void (*)(const T*, Rest...)> {
  using type = T;
};

// Calls f with the kernel the shape takes, its block count, threads and
// shared bytes.
template <typename T, int kRowGroups, int kSplitCount, typename F>
void withRows(const AttentionShape& s, F&& f) {
  const int64_t rows = kRowGroups * 4;
  const int64_t row_blocks = (s.q_seq + rows - 1) / rows;
  const auto blocks = static_cast<unsigned>(row_blocks * s.q_heads * s.batch);
  const unsigned threads = kRowGroups * kGroupLanes * kSplitCount;
  auto go = [&](auto kernel, size_t floats) { f(kernel, row_blocks, blocks, threads, floats * sizeof(float)); };
  switch ((s.v_head_size + 31) / 32) {
    case 1: go(attentionTiles<T, kRowGroups, kSplitCount, 1>, Layout<kRowGroups, kSplitCount, 1>::floats(s.head_size)); break;
    case 2: go(attentionTiles<T, kRowGroups, kSplitCount, 2>, Layout<kRowGroups, kSplitCount, 2>::floats(s.head_size)); break;
    case 3: go(attentionTiles<T, kRowGroups, kSplitCount, 3>, Layout<kRowGroups, kSplitCount, 3>::floats(s.head_size)); break;
    default: go(attentionTiles<T, kRowGroups, kSplitCount, 4>, Layout<kRowGroups, kSplitCount, 4>::floats(s.head_size));
  }
}

template <typename T, typename F>
void withKernel(const AttentionShape& s, F&& f) {
  auto blocks = [&](int64_t rows) { return (s.q_seq + rows - 1) / rows * s.q_heads * s.batch; };
  if (blocks(kLargeRowGroups * 4) >= kEnoughBlocks) {
    withRows<T, kLargeRowGroups, 1>(s, f);
    return;
  }
  size_t split_shared = 0;
  withRows<T, kSmallRowGroups, kSplits>(s, [&](auto, int64_t, unsigned, unsigned, size_t shared) { split_shared = shared; });
  if (blocks(kSmallRowGroups * 4) >= kEnoughBlocks || s.total <= kTileKeys || split_shared > kSharedMax) {
    withRows<T, kSmallRowGroups, 1>(s, f);
  } else {
    withRows<T, kSmallRowGroups, kSplits>(s, f);
  }
}

template <typename F>
void withStorage(const AttentionShape& s, F&& f) {
  switch (s.storage) {
    case FloatStorage::kF16: withKernel<__half>(s, f); break;
    case FloatStorage::kBF16: withKernel<__nv_bfloat16>(s, f); break;
    default: withKernel<float>(s, f);
  }
}

}  // namespace

void prepareAttentionKernel(const AttentionShape& shape) {
  withStorage(shape, [](auto kernel, int64_t, unsigned, unsigned, size_t shared) {
    // Above 48 KiB (head sizes past 64 in blocks of 64 queries) a kernel
    // must ask for its shared memory.
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  });
}

void launchAttention(const void* q, const void* k, const void* v, const void* mask, const int64_t* nonpad, void* y,
                     const AttentionShape& shape, cudaStream_t stream) {
  if (shape.q_seq * shape.q_heads * shape.batch == 0 || shape.v_head_size == 0) return;  // Y has no elements
  withStorage(shape, [&](auto kernel, int64_t row_blocks, unsigned blocks, unsigned threads, size_t shared) {
    using Element = typename ElementOf<decltype(kernel)>::type;
    kernel<<<blocks, threads, shared, stream>>>(static_cast<const Element*>(q), static_cast<const Element*>(k),
                                                static_cast<const Element*>(v), mask, nonpad,
                                                static_cast<Element*>(y), shape, row_blocks);
  });
}

}  // namespace kiln::cuda
