// The activations that a fused operator (kiln.FusedMatMul, kiln.FusedGemm)
// applies to its result, and their names in the `activation` attribute. One
// list shared by the op schemas (src/ops), the fusion pass (src/passes) and
// the kernels (src/kernels), which may not include each other.
//
// Parameters travel in `activation_alpha` and `activation_beta` (floats):
//   LeakyRelu  alpha: the slope for x < 0 (ONNX's alpha)
//   Clip       alpha: min, beta: max (min <= max)
//   Linear     alpha * x + beta (scalar Mul, Add, Sub, Div after a Conv;
//              only the Conv fusion makes it)
// The others take none. Swish is x * Sigmoid(x); Gelu is the exact
// (erf) form and GeluTanh the tanh approximation; HardSwish is ONNX's
// x * max(0, min(1, x / 6 + 1 / 2)).
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace kiln {

enum class FusedActivation {
  kNone, kRelu, kLeakyRelu, kSigmoid, kTanh, kClip, kGelu, kGeluTanh, kHardSwish, kSwish, kLinear
};

inline constexpr std::string_view kActivationAttribute = "activation";
inline constexpr std::string_view kActivationAlphaAttribute = "activation_alpha";
inline constexpr std::string_view kActivationBetaAttribute = "activation_beta";

// Indexed by the enum; "" is kNone (also what an absent attribute means).
inline constexpr std::array<std::string_view, 11> kFusedActivationNames = {
    "", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Gelu", "GeluTanh", "HardSwish", "Swish", "Linear"};

constexpr std::string_view fusedActivationName(FusedActivation activation) {
  return kFusedActivationNames[static_cast<size_t>(activation)];
}

// The activation named `name`, or nullopt for a name not in the list.
constexpr std::optional<FusedActivation> parseFusedActivation(std::string_view name) {
  for (size_t i = 0; i < kFusedActivationNames.size(); ++i) {
    if (kFusedActivationNames[i] == name) return static_cast<FusedActivation>(i);
  }
  return std::nullopt;
}

}  // namespace kiln
