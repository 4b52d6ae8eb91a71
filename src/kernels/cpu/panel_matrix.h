// A constant right-hand matrix of small products, stored for
// vector_kernels.h's matmulAccumulate in panels of columns.
//
// The products of a recurrent layer's time step (h R^T) and of a
// convolution over a few positions (patches W^T) have one to a few rows on
// the left and a [k, n] matrix on the right with n in the hundreds or
// thousands. matmulAccumulate walks the right matrix a tile of columns at a
// time down all k rows; stored plainly, its rows are n floats apart (8 KiB
// for n = 2048), a stride the hardware prefetchers do not follow across
// pages, and every row waited on memory. In panels of kPanel columns each
// tile's rows are consecutive: the walk streams (ddddocr's bidirectional
// LSTM, hidden 512: 4.1 -> 3.0 ms; a 1x1 Conv of 512 -> 1280 channels over
// one pixel: 0.15 -> 0.05 ms).
//
// Panel p holds columns [p * kPanel, (p + 1) * kPanel) as a [k, kPanel]
// row-major block; the last panel is padded with zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/vector_kernels.h"

namespace kiln {

inline constexpr int64_t kPanel = 128;

// Floats the panels of a [k, n] matrix take.
size_t panelsSize(int64_t k, int64_t n);

// Packs the [k, n] matrix B (element (i, j) at b[i * row_stride + j *
// column_stride]) into `panels` (panelsSize(k, n) floats). Transposed
// sources pass their strides swapped.
void packPanels(const float* b, int64_t k, int64_t n, int64_t row_stride, int64_t column_stride, float* panels);

// c[i][j - begin] += sum over p < k of a[i][p] * B[p][j], for i < m and
// begin <= j < end (c's rows ldc apart, a's lda). `backward` walks the
// panels from the last: a caller that reads the same columns over and over
// alternates it, so that each pass starts on what is still in cache.
void panelProduct(const vec::VectorKernels& v, const float* a, int64_t lda, const float* panels, int64_t k,
                  int64_t begin, int64_t end, float* c, int64_t ldc, int64_t m, bool backward = false);

}  // namespace kiln
