// NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss and Dropout against
// hand-computed values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::testing::HasSubstr;

// Scores [N = 2, C = 3, D = 2], as [n][c][d].
const std::vector<float> kScores = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f,   // n = 0
                                    -1.0f, 1.0f, 2.0f, -2.0f, 0.0f, 3.0f};  // n = 1
const std::vector<int64_t> kTargets = {2, 0, 1, -1};                     // [n][d]; -1 is ignored below

float score(int64_t n, int64_t c, int64_t d) { return kScores[static_cast<size_t>((n * 3 + c) * 2 + d)]; }

TEST(NllLossKernel, ReductionsWeightsAndIgnoreIndex) {
  const std::vector<float> weight = {1.0f, 2.0f, 0.5f};
  // Counted elements: (0,0) class 2, (0,1) class 0, (1,0) class 1.
  const double l00 = -score(0, 2, 0) * 0.5, l01 = -score(0, 0, 1) * 1.0, l10 = -score(1, 1, 0) * 2.0;
  for (const char* reduction : {"none", "sum", "mean"}) {
    std::vector<Operand> inputs = {operand<float>({2, 3, 2}, kScores), operand<int64_t>({2, 2}, kTargets),
                                   operand<float>({3}, weight)};
    const bool none = std::string(reduction) == "none";
    std::vector<Operand> outputs = {output(DType::kF32, none ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{})};
    PreparedKernel("NegativeLogLikelihoodLoss", inputs, outputs,
                   params({{"reduction", std::string(reduction)}, {"ignore_index", int64_t{-1}}}))
        .run(inputs, outputs);
    const std::vector<float> got = outputs[0].values<float>();
    if (none) {
      EXPECT_THAT(got, ::testing::Pointwise(::testing::FloatNear(1e-6f), std::vector<float>{
                                                static_cast<float>(l00), static_cast<float>(l01),
                                                static_cast<float>(l10), 0.0f}));
    } else if (std::string(reduction) == "sum") {
      EXPECT_NEAR(got[0], l00 + l01 + l10, 1e-6);
    } else {
      EXPECT_NEAR(got[0], (l00 + l01 + l10) / (0.5 + 1.0 + 2.0), 1e-6);
    }
  }
}

TEST(SoftmaxCrossEntropyKernel, LossAndLogProbabilities) {
  const std::vector<int64_t> targets = {2, 0, 1, 2};
  std::vector<Operand> inputs = {operand<float>({2, 3, 2}, kScores), operand<int64_t>({2, 2}, targets)};
  std::vector<Operand> outputs = {output(DType::kF32, {}), output(DType::kF32, {2, 3, 2})};
  PreparedKernel("SoftmaxCrossEntropyLoss", inputs, outputs).run(inputs, outputs);
  double total = 0;
  const std::vector<float> log_prob = outputs[1].values<float>();
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t d = 0; d < 2; ++d) {
      double sum = 0;
      for (int64_t c = 0; c < 3; ++c) sum += std::exp(score(n, c, d));
      for (int64_t c = 0; c < 3; ++c) {
        EXPECT_NEAR(log_prob[static_cast<size_t>((n * 3 + c) * 2 + d)], score(n, c, d) - std::log(sum), 1e-6);
      }
      total -= score(n, targets[static_cast<size_t>(n * 2 + d)], d) - std::log(sum);
    }
  }
  EXPECT_NEAR(outputs[0].values<float>()[0], total / 4, 1e-6);
}

TEST(LossKernels, Errors) {
  std::vector<Operand> outputs = {output(DType::kF32, {})};
  std::vector<Operand> wrong_target = {operand<float>({2, 3, 2}, kScores), operand<int64_t>({2}, {0, 1})};
  EXPECT_THAT(prepareError("NegativeLogLikelihoodLoss", wrong_target, outputs), HasSubstr("without the class axis"));
  std::vector<Operand> float_target = {operand<float>({2, 3, 2}, kScores), operand<float>({2, 2}, {0, 1, 0, 1})};
  EXPECT_THAT(prepareError("SoftmaxCrossEntropyLoss", float_target, outputs), HasSubstr("i32 or i64"));
  std::vector<Operand> inputs = {operand<float>({2, 3, 2}, kScores), operand<int64_t>({2, 2}, kTargets)};
  EXPECT_THAT(prepareError("NegativeLogLikelihoodLoss", inputs, outputs, params({{"reduction", std::string("max")}})),
              HasSubstr("reduction is 'max'"));
}

// ------------------------------------------------------------------ Dropout

TEST(DropoutKernel, InferencePassesThroughWithAMaskOfOnes) {
  std::vector<Operand> inputs = {operand<float>({4}, {1, 2, 3, 4}), operand<float>({}, {0.5f})};
  std::vector<Operand> outputs = {output(DType::kF32, {4}), output(DType::kBool, {4})};
  PreparedKernel("Dropout", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(outputs[1].values<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 1}));
}

TEST(DropoutKernel, TrainingDropsAndScalesDeterministicallyWithASeed) {
  auto training = [](float ratio) {
    Operand mode = operand<uint8_t>({}, {1});
    mode.info.dtype = DType::kBool;
    std::vector<Operand> inputs = {operand<float>({1000}, std::vector<float>(1000, 1.0f)), operand<float>({}, {ratio}),
                                   mode};
    std::vector<Operand> outputs = {output(DType::kF32, {1000}), output(DType::kBool, {1000})};
    PreparedKernel("Dropout", inputs, outputs, params({{"seed", int64_t{3}}})).run(inputs, outputs);
    return outputs;
  };
  const auto first = training(0.25f);
  const auto again = training(0.25f);
  EXPECT_EQ(first[0].values<float>(), again[0].values<float>());
  const std::vector<float> y = first[0].values<float>();
  const std::vector<uint8_t> mask = first[1].values<uint8_t>();
  int kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_FLOAT_EQ(y[i], mask[i] != 0 ? 1.0f / 0.75f : 0.0f);
    kept += mask[i];
  }
  EXPECT_GT(kept, 650);  // about 750
  EXPECT_LT(kept, 850);
  const auto zero = training(0.0f);  // ratio 0 keeps everything, unscaled
  EXPECT_EQ(zero[0].values<float>(), std::vector<float>(1000, 1.0f));
}

TEST(DropoutKernel, Errors) {
  std::vector<Operand> ints = {operand<int32_t>({2}, {1, 2})};
  EXPECT_THAT(prepareError("Dropout", ints, {output(DType::kI32, {2})}), HasSubstr("no kernel for i32"));
  std::vector<Operand> ratio = {operand<float>({2}, {1, 2}), operand<float>({2}, {0.1f, 0.2f})};
  EXPECT_THAT(prepareError("Dropout", ratio, {output(DType::kF32, {2})}), HasSubstr("ratio must be one"));
}

}  // namespace
}  // namespace kiln
