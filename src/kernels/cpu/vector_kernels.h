// The f32 inner loops of the elementwise, normalisation and reduction kernels,
// compiled once per x86 instruction set and chosen at run time.
//
// kiln itself is built for baseline x86-64 (SSE2), which leaves most of a
// modern CPU's vector width unused and has no vector exp, log or erf at all.
// vector_kernels_isa.cc holds these loops, written once with GCC vector types
// (vector_math.h); CMake compiles it three times: for baseline x86-64, for
// AVX2 + FMA and for AVX-512. Each compilation defines one VectorKernels
// table, and vectorKernels() returns the best table this CPU can run.
//
// Contract of every function here: arrays hold n floats (n >= 0); outputs may
// be the very array an input is (in place) but must not otherwise overlap an
// input; nothing allocates, throws or keeps a pointer. Results are the same
// on every path to within the documented accuracy (the paths differ in FMA
// contraction and summation order, not in formulas).
//
// Thread safety: the tables are immutable; every function may run
// concurrently on different arrays.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/fused_activation.h"

namespace kiln::vec {

enum class Isa : uint8_t {
  kGeneric,  // baseline x86-64: SSE2, 4 lanes
  kAvx2,     // AVX2 + FMA, 8 lanes
  kAvx512,   // AVX-512 F, 16 lanes
};
inline constexpr std::array<Isa, 3> kAllIsas = {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512};
std::string_view isaName(Isa isa);  // "generic", "avx2", "avx512"

// Unary maps y[i] = f(x[i]). Each function takes the op's two attributes:
// LeakyRelu and Elu read alpha, HardSigmoid alpha and beta, Clip its bounds
// (alpha = min, beta = max); the others ignore them.
//
// Accuracy against the exact result over the whole f32 range (dense sweeps
// in tests/kernels/vector_math_test.cc, on every path): Exp and Log within
// 1 ulp; Softplus and Elu within 2; Erf, Tanh, Sigmoid, Gelu and GeluTanh
// within 3; all within 1e-6 relative wherever the result is a normal
// number. Special values as std:: (exp(100) = inf, exp(-100) = 0, log(0) =
// -inf, log(-1) = NaN, erf(±9) = ±1, tanh(±inf) = ±1, NaN in gives NaN out);
// Gelu(-inf) is -0, its limit. The other ops are exact or correctly rounded.
enum class Unary : uint8_t {
  kRelu,
  kLeakyRelu,
  kElu,
  kSigmoid,
  kHardSigmoid,
  kHardSwish,
  kSoftplus,
  kTanh,
  kGelu,      // x Phi(x), Phi the standard normal distribution function
  kGeluTanh,  // Gelu's tanh approximation
  kExp,
  kLog,
  kSqrt,
  kErf,
  kAbs,
  kNeg,
  kReciprocal,
  kFloor,
  kCeil,
  kClip,  // NaN passes through; min above max gives max
  kCount
};
using UnaryFn = void (*)(const float* x, float* y, int64_t n, float alpha, float beta);

// Binary maps y[i] = f(a[i], b[i]), where either operand may instead repeat
// its first element (Operands). kSquare and kSqrt are Pow with a constant
// exponent of 2 and 0.5 (they ignore b); kMax and kMin propagate NaN.
enum class Binary : uint8_t { kAdd, kSub, kMul, kDiv, kMax, kMin, kSquare, kSqrt, kCount };
enum class Operands : uint8_t {
  kBoth,     // a[i] op b[i]
  kScalarB,  // a[i] op b[0]
  kScalarA,  // a[0] op b[i]
  kCount
};
using BinaryFn = void (*)(const float* a, const float* b, float* y, int64_t n);

// The parameters of VectorKernels::binaryQuantized.
struct QuantizedBinaryParams {
  bool multiply = false;  // the product (kiln.QLinearMul), else the sum (kiln.QLinearAdd)
  float a_ratio = 1;      // a_scale / y_scale; for the product a_scale * b_scale / y_scale
  float a_zero = 0;
  float b_ratio = 1;  // b_scale / y_scale (the sum only)
  float b_zero = 0;
  float y_zero = 0;
  bool signed_bytes = false;  // the arrays hold i8 (zero points in [-128, 127]), else u8
};

struct VectorKernels {
  Isa isa = Isa::kGeneric;
  std::array<UnaryFn, static_cast<size_t>(Unary::kCount)> unary{};
  std::array<std::array<BinaryFn, static_cast<size_t>(Operands::kCount)>, static_cast<size_t>(Binary::kCount)> binary{};

  // Row helpers of the normalisation and reduction kernels. The sums keep
  // several vectors of partial sums, so they are more accurate than a
  // running sum (and differ from it in the last bits).
  float (*sum)(const float* x, int64_t n) = nullptr;
  float (*sumSquares)(const float* x, int64_t n, float center) = nullptr;  // sum of (x - center)^2
  float (*max)(const float* x, int64_t n) = nullptr;  // -inf when n = 0; NaN when any x is NaN
  float (*min)(const float* x, int64_t n) = nullptr;  // +inf when n = 0; NaN when any x is NaN
  // y[i] = exp(x[i] - shift) (y may be nullptr: only the sum); returns the sum of them.
  float (*expSum)(const float* x, float* y, int64_t n, float shift) = nullptr;
  // y[i] = a * x[i] + b.
  void (*affine)(const float* x, float* y, int64_t n, float a, float b) = nullptr;
  // y[i] = saturate(x[i] / scale rounded half to even, plus zero) over n
  // bytes: u8 in [0, 255], or i8 in [-128, 127] with signed_bytes (zero an
  // integer of that type; NaN gives the type's lowest value). QuantizeLinear and DynamicQuantizeLinear's
  // rounding, bit for bit on every path (a division, not a product with the
  // reciprocal).
  void (*quantize8)(const float* x, uint8_t* y, int64_t n, float scale, float zero, bool signed_bytes) = nullptr;
  // Over n bytes (u8, or i8 with signed_bytes), in f32, rounding half to
  // even, as onnxruntime's QLinearAdd and QLinearMul compute them:
  //   sum      y[i] = saturate(round(a_ratio * (a[i] - a_zero) + b_ratio * (b[i] - b_zero)) + y_zero)
  //   product  y[i] = saturate(round(a_ratio * ((a[i] - a_zero) * (b[i] - b_zero))) + y_zero)
  // (the product of the differences is exact in f32).
  void (*binaryQuantized)(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n,
                          const QuantizedBinaryParams& p) = nullptr;
  // y[i] = (x[i] - zero) * scale over n bytes (u8, or i8 with signed_bytes):
  // DequantizeLinear per tensor, exactly (one subtraction of integers held
  // exactly, one rounding).
  void (*dequantize8)(const uint8_t* x, float* y, int64_t n, float scale, float zero, bool signed_bytes) = nullptr;
  // y[r * y_stride + i] = table[x[r * x_stride + i]] for r < rows, i < n
  // (table: 256 entries): a function of 8-bit data tabulated
  // (kiln.FusedElementwise between a DequantizeLinear and a QuantizeLinear,
  // kiln.QLinearConcat's requantization). 64 bytes a step with AVX-512 VBMI,
  // else a byte at a time.
  void (*lookup8)(const uint8_t* x, int64_t x_stride, uint8_t* y, int64_t y_stride, int64_t rows, int64_t n,
                  const uint8_t* table) = nullptr;
  // y[j] = the sum (or, with `max`, the maximum, NaN propagating) over
  // i < rows of x[i * stride + j], for j < n: the column folds of a strided
  // matrix (a channels-last global pool over a block of channels).
  void (*foldColumns)(const float* x, int64_t rows, int64_t stride, int64_t n, float* y, bool max) = nullptr;
  // IEEE half precision bits from floats and back, bit for bit as
  // core/float_formats.h's floatToHalf and halfToFloat (round to nearest
  // even, overflow to inf, NaN stays NaN): Cast between f32 and f16.
  void (*floatsToHalves)(const float* x, uint16_t* y, int64_t n) = nullptr;
  void (*halvesToFloats)(const uint16_t* x, float* y, int64_t n) = nullptr;
  // y[i] = (x[i] - mean) * inv_std * scale[i] + bias[i] (bias may be nullptr: 0).
  void (*normalize)(const float* x, const float* scale, const float* bias, float* y, int64_t n, float mean,
                    float inv_std) = nullptr;

  // y[i] = f32(sums[i]) * scale[i] (scale[0] for every i unless
  // `scale_per_element`) + add[i] (add may be nullptr: 0), for n i32 sums.
  // y may be the very bytes of sums (a product turned into f32 in place):
  // the arrays are raw bytes, each vector is read before it is written.
  void (*scaleSums)(const void* sums, void* y, int64_t n, const float* scale, bool scale_per_element,
                    const float* add) = nullptr;

  // c[i][j] += sum over p < k of a[i][p] * b[p][j], for i < m and j < n; the
  // row strides are lda, ldb and ldc (c must not overlap a or b). The small
  // products of a recurrent layer's time step (a few rows of state times the
  // transposed recurrence weights, k and n in the hundreds): a library GEMM's
  // call overhead would cost more than the product.
  void (*matmulAccumulate)(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                           int64_t m, int64_t n, int64_t k) = nullptr;

  UnaryFn unaryFn(Unary op) const { return unary[static_cast<size_t>(op)]; }
  BinaryFn binaryFn(Binary op, Operands operands) const {
    return binary[static_cast<size_t>(op)][static_cast<size_t>(operands)];
  }
};

// The unary loop that computes a fused step's activation
// (core/fused_activation.h), when one does: none for kNone, kLinear and
// kSwish (which is x * Sigmoid(x), two loops).
std::optional<Unary> unaryForActivation(FusedActivation activation);

// The best table for this CPU, chosen on first use. The environment variable
// KILN_CPU_ISA (generic, avx2 or avx512) caps the choice, to measure or test
// a narrower path on a wider CPU; a value this CPU cannot run is ignored.
const VectorKernels& vectorKernels();

// The table of `isa`, or nullptr when this CPU cannot run it (tests use this
// to check every path the machine has).
const VectorKernels* vectorKernelsFor(Isa isa);

namespace detail {
// Defined by the three compilations of vector_kernels_isa.cc.
const VectorKernels& genericKernels();
const VectorKernels& avx2Kernels();
const VectorKernels& avx512Kernels();
}  // namespace detail

}  // namespace kiln::vec
