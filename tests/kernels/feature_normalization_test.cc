// InstanceNormalization, GroupNormalization, MeanVarianceNormalization,
// LpNormalization, Hardmax, LRN and BatchNormalization's training mode
// against references written here.
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

using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

void expectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << i;
}

// (x - mean) / sqrt(var + eps) over each run of `size` contiguous elements.
std::vector<double> normalizedRuns(const std::vector<float>& x, size_t size, double epsilon) {
  std::vector<double> out(x.size());
  for (size_t start = 0; start < x.size(); start += size) {
    double mean = 0, var = 0;
    for (size_t i = start; i < start + size; ++i) mean += x[i] / static_cast<double>(size);
    for (size_t i = start; i < start + size; ++i) var += (x[i] - mean) * (x[i] - mean) / static_cast<double>(size);
    for (size_t i = start; i < start + size; ++i) out[i] = (x[i] - mean) / std::sqrt(var + epsilon);
  }
  return out;
}

TEST(InstanceNormalizationKernel, PerChannelStatistics) {
  const Ints shape{2, 3, 5};
  const auto x = randomValues<float>(30, 1, -2, 2);
  const std::vector<float> scale = {1, 2, 3}, bias = {0, -1, 1};
  std::vector<Operand> inputs = {operand(shape, x), operand<float>({3}, scale), operand<float>({3}, bias)};
  std::vector<Operand> outputs = {output(DType::kF32, shape)};
  PreparedKernel("InstanceNormalization", inputs, outputs, params({{"epsilon", 1e-3}})).run(inputs, outputs);
  std::vector<double> want = normalizedRuns(x, 5, 1e-3);
  for (size_t i = 0; i < want.size(); ++i) want[i] = want[i] * scale[i / 5 % 3] + bias[i / 5 % 3];
  expectNear(outputs[0].values<float>(), want, 1e-5);
}

TEST(GroupNormalizationKernel, PerChannelAndPerGroupParameters) {
  const Ints shape{1, 4, 3};
  const auto x = randomValues<float>(12, 2, -2, 2);
  const std::vector<double> normalized = normalizedRuns(x, 6, 1e-5);  // 2 groups of 2 channels
  for (bool per_channel : {true, false}) {
    const std::vector<float> scale = per_channel ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{2, 3};
    const std::vector<float> bias = per_channel ? std::vector<float>{0, 1, 0, 1} : std::vector<float>{1, 0};
    const int64_t n = per_channel ? 4 : 2;
    std::vector<Operand> inputs = {operand(shape, x), operand<float>({n}, scale), operand<float>({n}, bias)};
    std::vector<Operand> outputs = {output(DType::kF32, shape)};
    PreparedKernel("GroupNormalization", inputs, outputs, params({{"num_groups", int64_t{2}}})).run(inputs, outputs);
    std::vector<double> want(12);
    for (size_t i = 0; i < 12; ++i) {
      const size_t p = per_channel ? i / 3 : i / 6;
      want[i] = normalized[i] * scale[p] + bias[p];
    }
    expectNear(outputs[0].values<float>(), want, 1e-5);
  }
  std::vector<Operand> inputs = {operand(shape, x), operand<float>({3}, {1, 1, 1}), operand<float>({3}, {1, 1, 1})};
  EXPECT_THAT(prepareError("GroupNormalization", inputs, {output(DType::kF32, shape)}, params({{"num_groups", int64_t{3}}})),
              HasSubstr("do not divide into 3 groups"));
}

TEST(MeanVarianceNormalizationKernel, DefaultAxesAndOthers) {
  const Ints shape{2, 2, 1, 3};
  const auto x = randomValues<float>(12, 3, -2, 2);
  std::vector<Operand> inputs = {operand(shape, x)};
  std::vector<Operand> outputs = {output(DType::kF32, shape)};
  // axes [3]: each run of 3.
  PreparedKernel("MeanVarianceNormalization", inputs, outputs, params({{"axes", Ints{3}}})).run(inputs, outputs);
  expectNear(outputs[0].values<float>(), normalizedRuns(x, 3, 0), 1e-5);
  // Default [0, 2, 3]: per channel, over both batch elements.
  PreparedKernel("MeanVarianceNormalization", inputs, outputs).run(inputs, outputs);
  std::vector<float> channel0, channel1;
  for (size_t i = 0; i < 12; ++i) (i / 3 % 2 == 0 ? channel0 : channel1).push_back(x[i]);
  const auto n0 = normalizedRuns(channel0, 6, 0), n1 = normalizedRuns(channel1, 6, 0);
  std::vector<double> want;
  for (size_t i = 0; i < 12; ++i) want.push_back(i / 3 % 2 == 0 ? n0[i / 6 * 3 + i % 3] : n1[i / 6 * 3 + i % 3]);
  expectNear(outputs[0].values<float>(), want, 1e-5);
}

TEST(LpNormalizationKernel, L1AndL2AlongAnAxisWithZeroNorms) {
  std::vector<Operand> inputs = {operand<float>({2, 2}, {3, 0, 4, 0})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 2})};
  PreparedKernel("LpNormalization", inputs, outputs, params({{"axis", int64_t{0}}})).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{0.6f, 0, 0.8f, 0}));
  PreparedKernel("LpNormalization", inputs, outputs, params({{"p", int64_t{1}}})).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{1, 0, 1, 0}));
  EXPECT_THAT(prepareError("LpNormalization", inputs, outputs, params({{"p", int64_t{3}}})), HasSubstr("p is 3"));
}

TEST(HardmaxKernel, FirstMaximumAlongTheAxis) {
  std::vector<Operand> inputs = {operand<float>({2, 3}, {1, 3, 3, 0, -1, -2})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 3})};
  PreparedKernel("Hardmax", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{0, 1, 0, 1, 0, 0}));
  PreparedKernel("Hardmax", inputs, outputs, params({{"axis", int64_t{0}}})).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{1, 1, 1, 0, 0, 0}));
}

// An empty tensor whose other dimensions are vast: nothing to walk (the
// loops once ran over 2^40 rows of an empty axis, as CumSum's did).
TEST(HardmaxKernel, EmptyTensorWithVastDimensionsReturnsAtOnce) {
  const Ints shape{int64_t{1} << 40, 0, 3};
  for (const char* op : {"Hardmax", "LpNormalization"}) {
    std::vector<Operand> inputs = {operand<float>(shape, {})};
    std::vector<Operand> outputs = {output(DType::kF32, shape)};
    PreparedKernel(op, inputs, outputs, params({{"axis", int64_t{1}}})).run(inputs, outputs);
    EXPECT_TRUE(outputs[0].values<float>().empty()) << op;
  }
}

TEST(LrnKernel, WindowOverChannels) {
  const Ints shape{1, 4, 1, 1};
  const std::vector<float> x = {1, 2, 3, 4};
  std::vector<Operand> inputs = {operand(shape, x)};
  std::vector<Operand> outputs = {output(DType::kF32, shape)};
  const double alpha = 0.1, beta = 0.75, bias = 2;
  PreparedKernel("LRN", inputs, outputs, params({{"size", int64_t{2}}, {"alpha", alpha}, {"beta", beta}, {"bias", bias}}))
      .run(inputs, outputs);
  // size 2: channels [c, c + 1].
  std::vector<double> want;
  for (size_t c = 0; c < 4; ++c) {
    double squares = x[c] * x[c] + (c + 1 < 4 ? x[c + 1] * x[c + 1] : 0);
    want.push_back(x[c] / std::pow(bias + alpha / 2 * squares, beta));
  }
  expectNear(outputs[0].values<float>(), want, 1e-6);
  EXPECT_THAT(prepareError("LRN", inputs, outputs), HasSubstr("positive size"));
}

TEST(BatchNormalizationKernel, TrainingModeUsesBatchStatisticsAndUpdatesRunningOnes) {
  const Ints shape{2, 2, 3};
  const auto x = randomValues<float>(12, 4, -2, 2);
  std::vector<Operand> inputs = {operand(shape, x), operand<float>({2}, {1, 2}), operand<float>({2}, {0, 1}),
                                 operand<float>({2}, {0.5f, -0.5f}), operand<float>({2}, {1, 2})};
  std::vector<Operand> outputs = {output(DType::kF32, shape), output(DType::kF32, {2}), output(DType::kF32, {2})};
  PreparedKernel("BatchNormalization", inputs, outputs, params({{"training_mode", int64_t{1}}, {"momentum", 0.8}}))
      .run(inputs, outputs);
  const double scale[2] = {1, 2}, bias[2] = {0, 1}, mean_in[2] = {0.5, -0.5}, var_in[2] = {1, 2};
  std::vector<double> want(12), running_mean, running_var;
  for (size_t c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (size_t n = 0; n < 2; ++n)
      for (size_t i = 0; i < 3; ++i) mean += x[(n * 2 + c) * 3 + i] / 6.0;
    for (size_t n = 0; n < 2; ++n)
      for (size_t i = 0; i < 3; ++i) var += std::pow(x[(n * 2 + c) * 3 + i] - mean, 2) / 6.0;
    for (size_t n = 0; n < 2; ++n)
      for (size_t i = 0; i < 3; ++i) {
        const size_t at = (n * 2 + c) * 3 + i;
        want[at] = (x[at] - mean) / std::sqrt(var + 1e-5) * scale[c] + bias[c];
      }
    running_mean.push_back(mean_in[c] * 0.8 + mean * 0.2);
    running_var.push_back(var_in[c] * 0.8 + var * 0.2);
  }
  expectNear(outputs[0].values<float>(), want, 1e-5);
  expectNear(outputs[1].values<float>(), running_mean, 1e-6);
  expectNear(outputs[2].values<float>(), running_var, 1e-6);
}

}  // namespace
}  // namespace kiln
