// kiln.DynamicInt8MatMul's engine: y = x @ (w * w_scale) + bias computed in
// 8-bit integers, the f32 activations x quantized as the call runs.
//
// Models whose weights are stored as int8 (weight-only quantization: a MatMul
// reading Cast(w_int8) * scale, or DequantizeLinear(w_int8)) are computed in
// f32 by onnxruntime, with the weights expanded. `kiln compile
// --quantize-activations` (src/passes/activation_quantization.h) computes
// them in int8 instead, as OpenVINO does: AVX-512 VNNI multiplies 8-bit
// values at four times the f32 rate. That changes the results (the
// activations lose precision), so it is opt-in.
//
// The activations are quantized per row in groups of kGroup consecutive
// elements along k, each group with its own scale s and zero point z
// (asymmetric u8; the range always holds 0, so 0 is exact):
//
//   lo = min(0, min x_g)   hi = max(0, max x_g)   s = (hi - lo) / 255
//   z  = nearbyint(-lo / s)                      (clamped to [0, 255])
//   q  = clamp(nearbyint(x / s) + z, 0, 255)     (x / s as x * (1 / s))
//
// (s = 1 where hi - lo is 0 or not a normal float.) Per group the integer
// sums  acc_g[n] = sum over k in g of q[k] * w[k, n]  are exact in i32, and
//
//   y[n] = w_scale[n] * sum over g of (s_g * acc_g[n] - s_g z_g * colsum_g[n]) + bias[n]
//
// with colsum_g[n] the sum of w[k, n] over the group (precomputed). The sum
// over groups runs in f32 as fma(acc, s, y) then fma(-colsum, s z, y), the
// last step fma(y, w_scale, bias): both paths below make exactly these
// roundings, so they agree bit for bit.
//
// Small groups keep the error low: one outlier only coarsens its own 32
// values. On all-MiniLM-L6-v2 with int8 weights the output differs from
// the f32 computation by about 5e-3 relative (OpenVINO, which quantizes
// activations the same way by default, by 9.5e-3); whole-row scales gave
// 1.5e-2.
//
// Paths: with AVX-512 VNNI (and KILN_CPU_ISA not capping below avx512) a
// tile of 6 rows x 32 columns accumulates in registers with vpdpbusd; the
// weights are packed once, at prepare, so that each 4-byte step of k reads
// 128 contiguous bytes. Without VNNI a portable loop computes the same sums
// (slower than f32 there: the option is for CPUs with VNNI).
//
// A row's k is at most kMaxDepth: each call quantizes a panel of rows into
// a buffer on its own stack, so nothing allocates per call, and calls on
// the same object may run concurrently. Rows split across threads (and
// columns too when there are few rows).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/cpu/vector_kernels.h"

namespace kiln {

inline constexpr int64_t kDynamicInt8Group = 32;     // activations per scale along k
inline constexpr int64_t kDynamicInt8MaxDepth = 8192;  // the largest k

struct DynamicInt8MatMul {
  int64_t k = 0;
  int64_t n = 0;
  int64_t groups = 0;  // ceil(k / kDynamicInt8Group)
  int64_t blocks = 0;  // ceil(n / 32): column blocks of the packed weights
  bool vnni = false;
  // (vnni) w as blocks of 32 columns: [block][k step of 4][column][4 bytes],
  // k padded with zeros to groups * kDynamicInt8Group.
  std::vector<int8_t> packed;
  // (portable path) w as given, [k, n].
  std::vector<int8_t> plain;
  // colsum_g of each column, as f32: [block][group][32] (zeros past n).
  std::vector<float> column_sums;
  std::vector<float> w_scale;  // [blocks * 32], zeros past n
  std::vector<float> bias;     // [blocks * 32]; zeros without one
  // Applied to each finished row piece, in cache (a fused activation).
  std::optional<vec::Unary> activation;
  float alpha = 0;  // the activation's parameters
  float beta = 0;
};

// Whether this CPU runs the VNNI path (and KILN_CPU_ISA allows avx512).
bool dynamicInt8UsesVnni();

// w: int8 [k, n] row-major; w_scale: n values; bias: n values or nullptr.
// `allow_vnni` false forces the portable path (tests compare the two).
// Throws UsageError for k above kDynamicInt8MaxDepth or an empty shape.
std::unique_ptr<DynamicInt8MatMul> prepareDynamicInt8MatMul(int64_t k, int64_t n, const int8_t* w,
                                                            const float* w_scale, const float* bias,
                                                            bool allow_vnni = true);

// y [m, n] = the product for x [m, k] (f32, row-major), then the activation.
void runDynamicInt8MatMul(const DynamicInt8MatMul& matmul, int64_t m, const float* x, float* y);

}  // namespace kiln
