// The "math" attribute of a step: how a device kernel may compute an f32
// product or convolution. Absent, the kernel computes in f32 (as the CPU
// kernels do). "tf32" lets it use TF32 tensor cores, which round each
// operand to 10 bits of mantissa (about 1e-3 relative error) for several
// times the speed on NVIDIA GPUs since Ampere. Set by the compiler for
// `--tf32` (cuda target) on the ops kTf32Ops lists; read by the cuda
// kernels of those ops (src/kernels/cuda/). The CPU kernels ignore it.
// "bf16" (cpu target, `--bf16`) lets a CPU product with constant weights
// multiply in bf16, summing in f32 (kernels/cpu/matmul.cc), on CPUs with
// AVX-512 BF16; elsewhere it computes in f32.
#pragma once

#include <array>
#include <string_view>

#include "core/param_map.h"

namespace kiln {

inline constexpr std::string_view kMathAttribute = "math";
inline constexpr std::string_view kMathTf32 = "tf32";
inline constexpr std::string_view kMathBf16 = "bf16";

// The CPU products `--bf16` applies to.
inline constexpr std::array<std::string_view, 4> kBf16ProductOps = {"MatMul", "Gemm", "kiln.FusedMatMul",
                                                                    "kiln.FusedGemm"};

inline constexpr std::array<std::string_view, 7> kTf32Ops = {
    "MatMul", "Gemm", "kiln.FusedMatMul", "kiln.FusedGemm", "Conv", "ConvTranspose", "kiln.FusedConv"};

inline bool allowsTf32(const ParamMap& params) {
  return params.getString(std::string(kMathAttribute), "") == kMathTf32;
}

inline bool allowsBf16(const ParamMap& params) {
  return params.getString(std::string(kMathAttribute), "") == kMathBf16;
}

}  // namespace kiln
