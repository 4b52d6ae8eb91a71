// Exact integer matrix products on oneDNN's int8 matmul primitive: the
// route MatMulInteger and DynamicQuantizeLSTM take on CPUs with VNNI.
//
// y [m, n] (i32) = (a - a_zero) x (b - b_zero) for a of u8 or i8 (its zero
// point read per call: DynamicQuantizeLinear computes one per call) and a
// constant b of i8 with one zero point (u8 weights arrive shifted into i8,
// see exact_int_gemm.h). VNNI sums 8-bit products straight into i32, and
// oneDNN applies the zero points as exact i32 compensations, so the result
// is ONNX's bit for bit. Unlike oneDNN's gemm API, which packs B on every
// call (8 MiB for ddddocr's output projection), the primitive's B is
// reordered into its blocked layout once, at prepare.
//
// Thread safety: runs on one object may overlap; each claims an execution
// slot (onednn_support.h). Nothing allocates per call but what oneDNN's
// primitive execution does inside.
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <memory>

#include "kernels/cpu/onednn_support.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct Int8MatMul {
  dnnl::matmul primitive;
  dnnl::memory packed_b;
  onednn::ExecutionSlots slots;
};

// nullptr when oneDNN has no int8 matmul for this case on this CPU.
std::unique_ptr<Int8MatMul> prepareInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype, const int8_t* b,
                                              int8_t b_zero);

void runInt8MatMul(const Int8MatMul& matmul, const std::byte* a, int32_t a_zero, int32_t* y);

}  // namespace kiln
