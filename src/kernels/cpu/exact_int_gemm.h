// MatMulInteger's fast path: exact int8 products on the f32 GEMM.
//
// (a - a_zero) (b - b_zero) for 8-bit a and b is an integer of magnitude at
// most 255 * 255 = 65025, and a sum of up to 256 of them stays below 2^24,
// where every integer is an f32: so a GEMM in f32 over blocks of at most 256
// along K is exact whatever its summation order (FMA included), and the
// blocks add up in i32 as ONNX's reference does. That runs at oneDNN's sgemm
// speed on every x86 CPU, where oneDNN's own u8s8 GEMM may saturate 16-bit
// intermediates on CPUs without VNNI. Where the CPU has VNNI (AVX-512 VNNI or
// AVX-VNNI: 8-bit products summed straight into i32, exact) and B has one
// zero point, oneDNN's integer GEMM runs instead, at four times the f32 rate
// (u8 weights become i8 exactly: b - zero = (b - 128) - (zero - 128)).
//
// B (with its zero points, one or one per column) must be a constant: it is
// converted to f32 once, at prepare. A's zero point is one value, read per
// call (DynamicQuantizeLinear computes it per call). Scratch (A in f32, one
// block of results) belongs to the state: a call claims it with an atomic
// flag, and a concurrent call on the same state gets false and runs the
// loop kernel instead. Nothing allocates per call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/int8_matmul.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct ExactIntGemm {
  int64_t m = 0, n = 0, k = 0;
  std::vector<int64_t> a_offsets, b_offsets;  // per batch, in elements (as MatMulPlan)
  std::vector<float> b;                       // B - b_zero, as f32, B's layout
  bool vnni = false;                          // oneDNN's integer GEMM on b_i8
  std::vector<int8_t> b_i8;                   // B as i8 (vnni)
  int8_t b_zero = 0;                          // (vnni)
  // (vnni, B shared by every batch) oneDNN's int8 matmul primitive, B
  // packed once (int8_matmul.h), for A of a_dtype.
  std::unique_ptr<Int8MatMul> primitive;
  DType a_dtype = DType::kU8;

  mutable std::atomic<bool> busy{false};
  mutable std::vector<float> a;      // one batch of A - a_zero, [m, k]
  mutable std::vector<float> block;  // [m, n]
};

// ONNX's DynamicQuantizeLinear of n floats into u8 (as onnxruntime computes
// it, bit for bit): the range [min(x, 0), max(x, 0)] over 255 steps, x / scale
// rounded half to even plus the zero point, saturated. The activations of
// dynamically quantized layers (MatMulInteger's A, DynamicQuantizeLSTM's
// inputs and states) are quantized so.
struct DynamicQuantization {
  float scale = 1;
  uint8_t zero = 0;
};
DynamicQuantization quantizeDynamic(const float* x, int64_t n, uint8_t* y);

// Whether oneDNN's integer GEMMs sum 8-bit products exactly on this CPU
// (AVX-512 VNNI or AVX-VNNI).
bool cpuHasVnni();

// b: the constant B (`b_elements` of u8 or i8); b_zero: nullptr (0), or
// one value (b_zero_stride 0) or one per column (stride 1) of B's type;
// a_dtype: A's type (u8 or i8).
std::unique_ptr<ExactIntGemm> prepareExactIntGemm(DType a_dtype, int64_t m, int64_t n, int64_t k,
                                                  std::vector<int64_t> a_offsets,
                                                  std::vector<int64_t> b_offsets, DType b_dtype, const std::byte* b,
                                                  uint64_t b_elements, const std::byte* b_zero, int64_t b_zero_stride);

// y = (a - a_zero) x B for every batch; false (nothing done) when another
// call holds the scratch.
bool runExactIntGemm(const ExactIntGemm& gemm, DType a_dtype, const std::byte* a, int32_t a_zero, int32_t* y);

}  // namespace kiln
