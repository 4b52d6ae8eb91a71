// QLinearMatMul's fast path: oneDNN's int8 matmul (VNNI), requantizing in its
// epilogue.
//
// Applies where B is a constant 2-D i8 matrix with zero points 0 (one scale,
// or one per column) and the other scales and zero points are constants of
// one value: what onnxruntime's quantizer writes and the QDQ fusion makes
// (src/passes/qdq_fusion.h). A [..., M, K] is dense, so its rows are one
// [rows, K] matrix against the shared B.
//
//   y[i, j] = saturate(round(sum over k of (a[i, k] - a_zero) * b[k, j] * (a_scale * b_scale[j] / y_scale)) + y_zero)
//
// The multiplier is formed in f32 as onnxruntime's kernel forms it; the
// sums are exact in i32 (oneDNN applies a_zero as an i32 compensation).
// B is reordered once, at prepare. Concurrency and allocation as every
// oneDNN kernel (execution slots, onednn_support.h).
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <vector>

#include "kernels/cpu/onednn_support.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct QuantizedMatMul {
  dnnl::matmul primitive;
  dnnl::memory packed_b;
  int32_t zeros[2] = {0, 0};  // a_zero, y_zero: what the two memories below point at
  dnnl::memory src_zero;
  dnnl::memory dst_zero;
  onednn::ExecutionSlots slots;
};

// `scales`: a_scale * b_scale[j] / y_scale, one value or n. nullptr where
// oneDNN refuses the case (the caller keeps its loop kernel).
std::unique_ptr<QuantizedMatMul> prepareQuantizedMatMul(int64_t rows, int64_t k, int64_t n, DType a_type, DType y_type,
                                                        const int8_t* b, const std::vector<float>& scales,
                                                        int32_t a_zero, int32_t y_zero);

void runQuantizedMatMul(const QuantizedMatMul& matmul, const std::byte* a, std::byte* y);

}  // namespace kiln
