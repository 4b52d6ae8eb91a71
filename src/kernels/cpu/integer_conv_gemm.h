// ConvInteger's fast path: the convolution as f32 GEMMs over im2col columns,
// with exact integer results.
//
// y[m, p] = sum over k of (w[m, k] - w_zero[m]) * (col[k, p] - x_zero), where
// col is x unfolded (im2col; padding reads as x_zero and so adds 0). Each
// product of two 8-bit differences is at most 255 * 255 in magnitude, so a
// sum of up to 256 of them is below 2^24 and exact in f32 whatever the
// summation order (see exact_int_gemm.h). The GEMM runs on blocks of at most
// 256 along k, and the blocks add up in i32: the result is the integer ONNX
// specifies, bit for bit, at oneDNN's sgemm speed.
//
// Where the CPU has VNNI and the weights have one zero point, the GEMM is
// oneDNN's s8 x s8 -> s32 instead, exact in one pass over the whole depth,
// writing the output in place: u8 values become s8 by subtracting 128 from
// value and zero point alike, which leaves every difference unchanged.
//
// The weights (and their zero points) must be constants: they become f32
// (or s8) once, at prepare. Scratch (one block of columns and one of sums, over a
// chunk of output positions so that it stays in cache) belongs to the
// object; a call claims it with an atomic flag, and a concurrent call on the
// same object gets false and runs the loop kernel instead. Nothing allocates
// per call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/conv_geometry.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct IntegerConvGemm {
  ConvGeometry geometry;
  int64_t depth = 0;   // k: input channels per group x kernel size
  int64_t chunk = 0;   // output positions per GEMM call
  std::vector<float> weights;  // (w - w_zero[m]) as f32, [M, depth]
  bool vnni = false;           // the s8 route: weights_s8 and w_zero_s8 instead
  std::vector<int8_t> weights_s8;
  int8_t w_zero_s8 = 0;

  mutable std::atomic<bool> busy{false};
  mutable std::vector<float> columns;      // [min(depth, 256), chunk]
  mutable std::vector<float> sums;         // [M / group, chunk]
  mutable std::vector<int8_t> columns_s8;  // (vnni) [depth, chunk]
};

// w: the constant weights [M, C / group, kernel...] of w_dtype (u8 or i8);
// w_zero: nullptr (0), one value (stride 0) or one per output channel
// (stride 1), of w_dtype.
std::unique_ptr<IntegerConvGemm> prepareIntegerConvGemm(const ConvGeometry& geometry, DType w_dtype,
                                                        const std::byte* w, const std::byte* w_zero,
                                                        int64_t w_zero_stride);

// y [N, M, out...] = ConvInteger(x, w); false (nothing done) when another
// call holds the scratch.
bool runIntegerConvGemm(const IntegerConvGemm& conv, DType x_dtype, const std::byte* x, int32_t x_zero, int32_t* y);

}  // namespace kiln
