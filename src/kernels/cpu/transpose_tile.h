// The 2-D transpose at the heart of a layout change (NCHW <-> NHWC, a
// Transpose that moves the innermost axis): y[i * ys + j] = x[i + j * xs]
// for i < rows, j < cols, elements of 1, 2, 4 or 8 bytes (any trivially
// copyable type of those sizes; the Attention kernel transposes its keys).
//
// An element at a time this ran at about a byte per cycle: 121 us for a
// 56x56x144 u8 map, 74 us for a 224x224 RGB u8 image, more than the int8
// convolution after it (now 50 and 26 us). Here:
//   - square blocks of one 16-byte vector per row (16x16 bytes, 8x8 halves,
//     4x4 words, 2x2 doubles) go through log2(n) rounds of zips, each
//     output vector interleaving two input vectors (the Eklundh transpose:
//     after the rounds, vector k holds column k);
//   - few columns (2, 3 or 4: image planes into pixels) with contiguous
//     output rows are interleaved by the same zips (interleave below);
//   - what is left at the edges goes element by element.
// The vectors are SSE2's (every x86-64 CPU); elsewhere everything goes
// element by element.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kiln {

namespace transpose_detail {

#if defined(__SSE2__)
// Lanes 0..n/2-1 of a and b interleaved, and lanes n/2..n-1 (SSE2's unpacks
// at the element's width).
template <typename T>
[[gnu::always_inline]] inline void zip(__m128i a, __m128i b, __m128i& low, __m128i& high) {
  if constexpr (sizeof(T) == 1) {
    low = _mm_unpacklo_epi8(a, b), high = _mm_unpackhi_epi8(a, b);
  } else if constexpr (sizeof(T) == 2) {
    low = _mm_unpacklo_epi16(a, b), high = _mm_unpackhi_epi16(a, b);
  } else if constexpr (sizeof(T) == 4) {
    low = _mm_unpacklo_epi32(a, b), high = _mm_unpackhi_epi32(a, b);
  } else {
    low = _mm_unpacklo_epi64(a, b), high = _mm_unpackhi_epi64(a, b);
  }
}

// One n x n block, n = 16 / sizeof(T): x rows at x + k * xs in, y rows at
// y + k * ys out, the first `stored` of them (a block with fewer rows of y
// than n). log2(n) rounds of zips, unrolled so that the vectors stay in
// registers.
template <typename T>
[[gnu::always_inline]] inline void transposeBlock(T* y, int64_t ys, const T* x, int64_t xs,
                                                  int stored = 16 / static_cast<int>(sizeof(T))) {
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  __m128i v[n];
#pragma GCC unroll 16
  for (int k = 0; k < n; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k * xs));
#pragma GCC unroll 4
  for (int width = n; width > 1; width /= 2) {
    __m128i out[n];
#pragma GCC unroll 8
    for (int k = 0; k < n / 2; ++k) zip<T>(v[k], v[k + n / 2], out[2 * k], out[2 * k + 1]);
#pragma GCC unroll 16
    for (int k = 0; k < n; ++k) v[k] = out[k];
  }
#pragma GCC unroll 16
  for (int k = 0; k < n; ++k) {
    if (k < stored) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + k * ys), v[k]);
  }
}
#endif

// kCols (2, 3 or 4) planes of x interleaved into y's contiguous rows:
// y[i * kCols + j] = x[i + j * xs]. The zips of an n x 4 transpose (the
// third plane standing in for a missing fourth) give each row's kCols
// elements in a group of four; three columns store those groups overlapping,
// each over the previous one's spare element, so the last group of the
// range goes element by element (a store past it would leave y). 8-byte
// elements (two per vector) interleave 3 or 4 columns element by element.
template <int kCols, typename T>
inline void interleave(T* __restrict y, const T* __restrict x, int64_t xs, int64_t rows) {
  int64_t i = 0;
#if defined(__SSE2__)
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  // Rows the vectors may write; 3 and 4 columns need four lanes or more.
  const int64_t vector_rows = kCols > 2 && n < 4 ? 0 : (kCols == 3 ? rows - n : rows);
  for (; i + n <= vector_rows; i += n) {
    const auto plane = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + j * xs)); };
    if constexpr (kCols == 2) {
      __m128i low, high;
      zip<T>(plane(0), plane(1), low, high);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i), low);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i + n), high);
    } else {
      const __m128i p0 = plane(0), p1 = plane(1), p2 = plane(2), p3 = kCols == 4 ? plane(3) : p2;
      __m128i a0, a1, a2, a3, b[4];
      zip<T>(p0, p2, a0, a1);
      zip<T>(p1, p3, a2, a3);
      zip<T>(a0, a2, b[0], b[1]);
      zip<T>(a1, a3, b[2], b[3]);
      if constexpr (kCols == 4) {
        for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 4 * i + k * n), b[k]);
      } else if constexpr (sizeof(T) == 4) {
        // One row per vector.
        for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 3 * (i + k)), b[k]);
      } else {
        // 16 / (4 * sizeof(T)) rows per vector, a 4 * sizeof(T)-byte group each.
        constexpr int groups = n / 4;
        for (int k = 0; k < 4; ++k) {
          __m128i v = b[k];
          for (int g = 0; g < groups; ++g) {
            T* to = y + 3 * (i + k * groups + g);
            if constexpr (sizeof(T) == 1) {
              const int32_t bits = _mm_cvtsi128_si32(v);
              std::memcpy(to, &bits, sizeof bits);
              v = _mm_srli_si128(v, 4);
            } else {
              const int64_t bits = _mm_cvtsi128_si64(v);
              std::memcpy(to, &bits, sizeof bits);
              v = _mm_srli_si128(v, 8);
            }
          }
        }
      }
    }
  }
#endif
  for (; i < rows; ++i) {
    for (int j = 0; j < kCols; ++j) y[i * kCols + j] = x[i + j * xs];
  }
}

}  // namespace transpose_detail

template <typename T>
inline void transposeTile(T* __restrict y, int64_t ys, const T* __restrict x, int64_t xs, int64_t rows, int64_t cols) {
  if (ys == cols && cols >= 2 && cols <= 4) {
    using transpose_detail::interleave;
    if (cols == 2) return interleave<2, T>(y, x, xs, rows);
    if (cols == 3) return interleave<3, T>(y, x, xs, rows);
    return interleave<4, T>(y, x, xs, rows);
  }
#if defined(__SSE2__)
  constexpr int n = 16 / static_cast<int>(sizeof(T));
#else
  constexpr int n = 1;  // no vectors: every element goes through the edge loops
#endif
  const int64_t block_rows = rows / n * n, block_cols = cols / n * n;
#if defined(__SSE2__)
  // Cache blocking: 64 x 64 elements at a time, in strips of 8 rows of y
  // (or one block's n, when larger) across the 64 columns. A strip keeps
  // few lines of y in flight, and a 64-column block few lines of x between
  // strips; both matter when a row stride is a multiple of 1 KiB or so, as
  // in feature maps, whose rows then share a handful of the L1 cache's
  // sets. Measured on one core, before -> after (f32, y rows x columns,
  // us): [144 x 6400] 681 -> 355 (a detection head back to NCHW),
  // [6400 x 144] 481 -> 348, [256 x 4096] 1096 -> 511, [64 x 1024] 56 -> 18,
  // [16 x 25600] 373 -> 132, [3136 x 144] 230 -> 161; [128 x 7600] loses,
  // 352 -> 402. Bytes and halves move about as before.
  constexpr int64_t kBlock = 64;
  constexpr int64_t kStrip = n > 8 ? n : 8;
  for (int64_t ib = 0; ib < block_rows; ib += kBlock) {
    const int64_t ie = std::min(block_rows, ib + kBlock);
    for (int64_t jb = 0; jb < block_cols; jb += kBlock) {
      const int64_t je = std::min(block_cols, jb + kBlock);
      for (int64_t is = ib; is < ie; is += kStrip) {
        const int64_t strip_end = std::min(ie, is + kStrip);
        for (int64_t j0 = jb; j0 < je; j0 += n) {
          for (int64_t i0 = is; i0 < strip_end; i0 += n) {
            transpose_detail::transposeBlock(y + i0 * ys + j0, ys, x + i0 + j0 * xs, xs);
          }
        }
      }
    }
  }
#endif
  // Fewer rows than a block has (2 or 3 planes of f32 out of pixels: an
  // image back to NCHW): whole blocks all the same, keeping the first
  // `rows` vectors of each. Their loads read on past the rows into the
  // next elements of x, up to (j0 + n - 1) * xs + n - 1, which must not
  // pass x's last element, (cols - 1) * xs + rows - 1 (so j0 + n < cols).
  // One core, 3 x 409600 f32: 690 -> 349 us; 3 x 409600 u8: 434 -> 109 us.
  int64_t few_rows_done = 0;  // columns of every row done that way
#if defined(__SSE2__)
  if (block_rows == 0 && rows >= 2) {
    for (; (few_rows_done + n - 1) * xs + n <= (cols - 1) * xs + rows; few_rows_done += n) {
      transpose_detail::transposeBlock(y + few_rows_done, ys, x + few_rows_done * xs, xs, static_cast<int>(rows));
    }
  }
#endif
  // The edges: rows past the last whole block, then columns past it.
  for (int64_t i = block_rows; i < rows; ++i) {
    for (int64_t j = few_rows_done; j < cols; ++j) y[i * ys + j] = x[i + j * xs];
  }
  for (int64_t i = 0; i < block_rows; ++i) {
    for (int64_t j = block_cols; j < cols; ++j) y[i * ys + j] = x[i + j * xs];
  }
}

}  // namespace kiln
