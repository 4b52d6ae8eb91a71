// Integer matrix products on oneDNN's int8 matmul primitive (VNNI's
// vpdpbusd where the CPU has it), in two forms:
//
// - exact sums, for MatMulInteger and DynamicQuantizeLSTM:
//     y [m, n] (i32) = (a - a_zero) x (b - b_zero)
//   for a of u8 or i8 (its zero point read per call: DynamicQuantizeLinear
//   computes one per call) and a constant b of i8 with one zero point (u8
//   weights arrive shifted into i8, see exact_int_gemm.h). oneDNN applies the
//   zero points as exact i32 compensations, so the result is ONNX's bit for
//   bit.
// - requantized, for QLinearMatMul with constant parameters (and
//   kiln.QLinearMatMul, which adds an i32 bias, as QLinearConv's):
//     y [m, n] (u8/i8) = saturate(round((sum of (a - a_zero) * b + bias[j]) * scale[j]) + y_zero)
//   with b of i8 with zero points 0 and scale[j] = a_scale * b_scale[j] /
//   y_scale formed in f32 as onnxruntime forms it; oneDNN requantizes in its
//   epilogue (oneDNN 2.x adds an integer bias before the scale).
//
// Unlike oneDNN's gemm API, which packs B on every call (8 MiB for ddddocr's
// output projection), the primitive's B is reordered into its blocked layout
// once, at prepare.
//
// Thread safety: runs on one object may overlap; each claims an execution
// slot (onednn_support.h). Nothing allocates per call but what oneDNN's
// primitive execution does inside.
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <vector>

#include "kernels/cpu/onednn_support.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct Int8MatMul {
  dnnl::matmul primitive;
  dnnl::memory packed_b;
  // Requantized form: a_zero and y_zero, and the memories that point at them.
  int32_t zeros[2] = {0, 0};
  dnnl::memory src_zero;
  dnnl::memory dst_zero;
  std::vector<int32_t> bias_values;  // the requantized form's bias, when it has one
  dnnl::memory bias;                 // points at bias_values
  onednn::ExecutionSlots slots;
};

// Exact sums. nullptr when oneDNN has no int8 matmul for this case on this CPU.
std::unique_ptr<Int8MatMul> prepareInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype, const int8_t* b,
                                              int8_t b_zero);

void runInt8MatMul(const Int8MatMul& matmul, const std::byte* a, int32_t a_zero, int32_t* y);

// Requantized into `y_dtype` (u8 or i8); `scales`: one value or n; `bias`:
// n values (copied), or nullptr. nullptr where oneDNN refuses the case (the
// caller keeps its loop kernel).
std::unique_ptr<Int8MatMul> prepareRequantizedInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype,
                                                         DType y_dtype, const int8_t* b,
                                                         const std::vector<float>& scales, int32_t a_zero,
                                                         int32_t y_zero, const int32_t* bias = nullptr);

void runRequantizedInt8MatMul(const Int8MatMul& matmul, const std::byte* a, std::byte* y);

}  // namespace kiln
