// kiln.FusedMatMul and kiln.FusedGemm against double-precision references and
// against the unfused kernels they replace (MatMul or Gemm, Add, activation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/fused_activation.h"
#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/matmul_reference.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
using ::kiln::testing::GemmCase;
using ::kiln::testing::gemmReference;
using ::kiln::testing::matches;
using ::kiln::testing::matmulReference;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::Reference;

// An activation with the parameters the tests give it.
struct Activation {
  FusedActivation kind;
  float alpha = 0;
  float beta = 0;
};

const std::vector<Activation> kActivations = {
    {FusedActivation::kNone},    {FusedActivation::kRelu},          {FusedActivation::kLeakyRelu, 0.1f},
    {FusedActivation::kSigmoid}, {FusedActivation::kTanh},          {FusedActivation::kClip, -0.5f, 1.5f},
    {FusedActivation::kGelu},    {FusedActivation::kGeluTanh},      {FusedActivation::kHardSwish},
    {FusedActivation::kSwish},   {FusedActivation::kLinear, 0.75f, -0.25f}};

std::string nameOf(const Activation& a) {
  return a.kind == FusedActivation::kNone ? "none" : std::string(fusedActivationName(a.kind));
}

ParamMap activationParams(const Activation& a) {
  ParamMap map;
  map.set(std::string(kActivationAttribute), std::string(fusedActivationName(a.kind)));
  map.set(std::string(kActivationAlphaAttribute), double{a.alpha});
  map.set(std::string(kActivationBetaAttribute), double{a.beta});
  return map;
}

double activate(const Activation& a, double x) {
  switch (a.kind) {
    case FusedActivation::kNone: return x;
    case FusedActivation::kRelu: return std::max(x, 0.0);
    case FusedActivation::kLeakyRelu: return x < 0 ? a.alpha * x : x;
    case FusedActivation::kSigmoid: return 1 / (1 + std::exp(-x));
    case FusedActivation::kTanh: return std::tanh(x);
    case FusedActivation::kClip: return std::min(std::max(x, double{a.alpha}), double{a.beta});
    case FusedActivation::kGelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case FusedActivation::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case FusedActivation::kHardSwish: return x * std::clamp(x / 6 + 0.5, 0.0, 1.0);
    case FusedActivation::kSwish: return x / (1 + std::exp(-x));
    case FusedActivation::kLinear: return a.alpha * x + a.beta;
  }
  return 0;
}

// `ref` plus bias (along the last axis) and residual, through the activation.
// The activations' slopes are at most 1.5, and oneDNN's approximations of
// exp, tanh and erf add an absolute error of about 1e-6: the magnitudes grow
// to allow for both.
Reference fusedReference(Reference ref, const std::vector<float>& bias, const std::vector<float>& residual,
                         const Activation& activation) {
  for (size_t i = 0; i < ref.values.size(); ++i) {
    double& v = ref.values[i];
    if (!bias.empty()) v += bias[i % bias.size()];
    if (!residual.empty()) v += residual[i];
    ref.magnitudes[i] = 1.5 * (ref.magnitudes[i] + std::abs(v)) + 0.2;
    v = activate(activation, v);
  }
  return ref;
}

// FusedMatMul of A [2, 5, 24] and B [24, 40] with every activation, with and
// without bias and residual, constant B and bias or not.
TEST(FusedMatMulKernel, EveryActivationBiasAndResidual) {
  const std::vector<int64_t> a_shape = {2, 5, 24}, b_shape = {24, 40}, y_shape = {2, 5, 40};
  const std::vector<float> a = randomValues<float>(elementCount(a_shape), 1, -1, 1);
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), 2, -1, 1);
  const std::vector<float> bias = randomValues<float>(40, 3, -1, 1);
  const std::vector<float> residual = randomValues<float>(elementCount(y_shape), 4, -2, 2);
  const Reference product = matmulReference(a_shape, a, b_shape, b);
  for (const Activation& activation : kActivations) {
    for (int variant = 0; variant < 8; ++variant) {
      const bool with_bias = (variant & 1) != 0, with_residual = (variant & 2) != 0, constants = (variant & 4) != 0;
      std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b, constants),
                                     with_bias ? operand<float>({40}, bias, constants) : omitted()};
      if (with_residual) inputs.push_back(operand(y_shape, residual));
      std::vector<Operand> outputs = {output(DType::kF32, y_shape)};
      PreparedKernel kernel("kiln.FusedMatMul", inputs, outputs, activationParams(activation));
      kernel.run(inputs, outputs);
      const Reference want =
          fusedReference(product, with_bias ? bias : std::vector<float>{}, with_residual ? residual : std::vector<float>{},
                         activation);
      EXPECT_TRUE(matches(outputs[0].values<float>(), want))
          << nameOf(activation) << (with_bias ? " bias" : "") << (with_residual ? " residual" : "")
          << (constants ? " constant B and bias" : "");
    }
  }
}

TEST(FusedMatMulKernel, BatchedOperandsAndABiasWithLeadingOnes) {
  // B varies along the batch (no folding into M); bias [1, 1, N] from the call.
  const std::vector<int64_t> a_shape = {3, 4, 8}, b_shape = {3, 8, 6}, y_shape = {3, 4, 6};
  const std::vector<float> a = randomValues<float>(elementCount(a_shape), 10, -1, 1);
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), 11, -1, 1);
  const std::vector<float> bias = randomValues<float>(6, 12, -1, 1);
  const std::vector<float> residual = randomValues<float>(elementCount(y_shape), 13, -1, 1);
  std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b), operand<float>({1, 1, 6}, bias),
                                 operand(y_shape, residual)};
  std::vector<Operand> outputs = {output(DType::kF32, y_shape)};
  const Activation gelu{FusedActivation::kGelu};
  PreparedKernel("kiln.FusedMatMul", inputs, outputs, activationParams(gelu)).run(inputs, outputs);
  EXPECT_TRUE(matches(outputs[0].values<float>(),
                      fusedReference(matmulReference(a_shape, a, b_shape, b), bias, residual, gelu)));
}

// The unfused steps: MatMul, Add bias, Add residual, then the activation as
// the elementwise kernels compute it.
std::vector<float> unfused(std::vector<Operand> inputs, const std::vector<int64_t>& y_shape,
                           const Activation& activation) {
  auto step = [&](const std::string& op, std::vector<Operand> in, const ParamMap& p = {}) {
    std::vector<Operand> out = {output(DType::kF32, y_shape)};
    PreparedKernel(op, in, out, p).run(in, out);
    return out[0];
  };
  Operand y = step("MatMul", {inputs[0], inputs[1]});
  y = step("Add", {y, inputs[2]});
  y = step("Add", {y, inputs[3]});
  const auto scalar = [](float v) { return operand<float>({}, {v}); };
  switch (activation.kind) {
    case FusedActivation::kNone: return y.values<float>();
    case FusedActivation::kRelu: return step("Relu", {y}).values<float>();
    case FusedActivation::kLeakyRelu:
      return step("LeakyRelu", {y}, params({{"alpha", double{activation.alpha}}})).values<float>();
    case FusedActivation::kSigmoid: return step("Sigmoid", {y}).values<float>();
    case FusedActivation::kTanh: return step("Tanh", {y}).values<float>();
    case FusedActivation::kClip:
      return step("Clip", {y, scalar(activation.alpha), scalar(activation.beta)}).values<float>();
    case FusedActivation::kGelu: return step("Gelu", {y}).values<float>();
    case FusedActivation::kGeluTanh:
      return step("Gelu", {y}, params({{"approximate", std::string("tanh")}})).values<float>();
    case FusedActivation::kHardSwish: return step("HardSwish", {y}).values<float>();
    case FusedActivation::kSwish: return step("Mul", {y, step("Sigmoid", {y})}).values<float>();
    case FusedActivation::kLinear:
      return step("Add", {step("Mul", {y, scalar(activation.alpha)}), scalar(activation.beta)}).values<float>();
  }
  return {};
}

TEST(FusedMatMulKernel, MatchesTheUnfusedKernels) {
  const std::vector<int64_t> a_shape = {1, 16, 96}, b_shape = {96, 64}, y_shape = {1, 16, 64};
  const std::vector<Operand> inputs = {
      operand(a_shape, randomValues<float>(elementCount(a_shape), 20, -1, 1)),
      operand(b_shape, randomValues<float>(elementCount(b_shape), 21, -0.3, 0.3), true),
      operand<float>({64}, randomValues<float>(64, 22, -1, 1), true),
      operand(y_shape, randomValues<float>(elementCount(y_shape), 23, -2, 2))};
  for (const Activation& activation : kActivations) {
    std::vector<Operand> fused_inputs = inputs;
    std::vector<Operand> outputs = {output(DType::kF32, y_shape)};
    PreparedKernel("kiln.FusedMatMul", fused_inputs, outputs, activationParams(activation)).run(fused_inputs, outputs);
    const std::vector<float> got = outputs[0].values<float>();
    const std::vector<float> want = unfused(inputs, y_shape, activation);
    double max_error = 0, max_value = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_error = std::max(max_error, double{std::abs(got[i] - want[i])});
      max_value = std::max(max_value, double{std::abs(want[i])});
    }
    EXPECT_LE(max_error, 1e-5 * max_value) << nameOf(activation);
  }
}

TEST(FusedMatMulKernel, ConcurrentRunsOnOneStateKeepTheirOwnResidual) {
  // More threads than execution slots; each slot points its residual memory
  // at its own run's input.
  const std::vector<int64_t> a_shape = {32, 64}, b_shape = {64, 48}, y_shape = {32, 48};
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), 40, -1, 1);
  const std::vector<float> bias = randomValues<float>(48, 41, -1, 1);
  const Activation relu{FusedActivation::kRelu};
  std::vector<Operand> inputs = {operand(a_shape, std::vector<float>(elementCount(a_shape))),
                                 operand(b_shape, b, true), operand<float>({48}, bias, true),
                                 operand(y_shape, std::vector<float>(elementCount(y_shape)))};
  std::vector<Operand> outputs = {output(DType::kF32, y_shape)};
  const PreparedKernel kernel("kiln.FusedMatMul", inputs, outputs, activationParams(relu));
  constexpr int kThreads = 6;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<float> a = randomValues<float>(elementCount(a_shape), 100 + t, -1, 1);
      const std::vector<float> residual = randomValues<float>(elementCount(y_shape), 200 + t, -1, 1);
      std::vector<Operand> my_inputs = {operand(a_shape, a), inputs[1], inputs[2], operand(y_shape, residual)};
      std::vector<Operand> my_outputs = {output(DType::kF32, y_shape)};
      const Reference want = fusedReference(matmulReference(a_shape, a, b_shape, b), bias, residual, relu);
      for (int i = 0; i < 20; ++i) {
        kernel.run(my_inputs, my_outputs);
        if (!matches(my_outputs[0].values<float>(), want)) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST(FusedGemmKernel, ActivationAfterEveryCMode) {
  // C one constant row (oneDNN's bias), C [M, N] (a sum post-op), alpha != 1.
  const int64_t m = 7, k = 20, n = 33;
  const std::vector<GemmCase> cases = {{false, true, {n}, true, 1, 1, true, true},
                                       {false, false, {m, n}, true, 1, 0.5f, true, false},
                                       {true, true, {1, n}, true, 0.5f, 1, false, true},
                                       {false, false, {}, false, 1, 1, false, false}};
  uint32_t seed = 30;
  for (const GemmCase& g : cases) {
    for (const Activation& activation : kActivations) {
      const std::vector<int64_t> a_shape = g.trans_a ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
      const std::vector<int64_t> b_shape = g.trans_b ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
      const std::vector<float> a = randomValues<float>(elementCount(a_shape), ++seed, -1, 1);
      const std::vector<float> b = randomValues<float>(elementCount(b_shape), ++seed, -1, 1);
      const std::vector<float> c = randomValues<float>(elementCount(g.c_shape), ++seed, -1, 1);
      std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b, g.constant_b)};
      if (g.has_c) inputs.push_back(operand(g.c_shape, c, g.constant_c));
      std::vector<Operand> outputs = {output(DType::kF32, {m, n})};
      ParamMap p = activationParams(activation);
      p.set("transA", int64_t{g.trans_a});
      p.set("transB", int64_t{g.trans_b});
      p.set("alpha", double{g.alpha});
      p.set("beta", double{g.beta});
      PreparedKernel("kiln.FusedGemm", inputs, outputs, p).run(inputs, outputs);
      const Reference want = fusedReference(gemmReference(g, m, k, n, a, b, c), {}, {}, activation);
      EXPECT_TRUE(matches(outputs[0].values<float>(), want))
          << nameOf(activation) << " C " << ::kiln::testing::shapeText(g.c_shape) << " alpha " << g.alpha;
    }
  }
}

TEST(FusedMatMulKernel, PrepareErrors) {
  const Operand a = operand<float>({2, 3}, std::vector<float>(6, 1));
  const Operand b = operand<float>({3, 4}, std::vector<float>(12, 1));
  const Operand bias = operand<float>({4}, std::vector<float>(4, 1));
  const std::vector<Operand> y = {output(DType::kF32, {2, 4})};
  const ParamMap none;
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {a, b}, y, params({{"activation", std::string("Softplus")}})),
            "kiln.FusedMatMul: activation 'Softplus' is not one kiln fuses");
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {a, b}, y, activationParams({FusedActivation::kClip, 1.0f, 0.0f})),
            "kiln.FusedMatMul: Clip's min 1 is not at most its max 0");
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {a, b, operand<float>({2, 4}, std::vector<float>(8))}, y, none),
            "kiln.FusedMatMul: the bias f32[2, 4] must be [N] or [1, ..., N] with N = 4 (the output is [2, 4])");
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {a, b, bias, operand<float>({1, 4}, std::vector<float>(4))}, y, none),
            "kiln.FusedMatMul: the residual f32[1, 4] must have the output's shape [2, 4]");
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {a, operand<float>({3}, {1, 2, 3})}, {output(DType::kF32, {2})}, none),
            "kiln.FusedMatMul: input 1 must have rank 2 or more, got f32[3]");
  EXPECT_EQ(prepareError("kiln.FusedGemm", {a, b}, y, params({{"activation", std::string("Elu")}})),
            "kiln.FusedGemm: activation 'Elu' is not one kiln fuses");
  // K = 0: oneDNN takes no zero dimension, and the activation has no other
  // implementation (the fusion pass leaves such products alone).
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {operand<float>({2, 0}, {}), operand<float>({0, 4}, {}), bias}, y,
                         activationParams({FusedActivation::kRelu})),
            "kiln.FusedMatMul: K is 0; the fused residual and activation run only on oneDNN");
  // Without residual or activation, the loop kernel computes K = 0 (bias only).
  EXPECT_EQ(prepareError("kiln.FusedMatMul", {operand<float>({2, 0}, {}), operand<float>({0, 4}, {}), bias}, y, none),
            "(no error)");
}

}  // namespace
}  // namespace kiln
