// The ai.onnx.ml kernels: ArrayFeatureExtractor, Binarizer and TreeEnsemble,
// against values worked out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;
using Doubles = std::vector<double>;

TEST(ArrayFeatureExtractor, PicksAlongTheLastAxis) {
  std::vector<Operand> inputs = {operand<float>({2, 3}, {1, 2, 3, 4, 5, 6}), operand<int64_t>({1, 3}, {2, 0, 2})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 3})};
  PreparedKernel("ai.onnx.ml.ArrayFeatureExtractor", inputs, outputs).run(inputs, outputs);
  EXPECT_THAT(outputs[0].values<float>(), ElementsAre(3, 1, 3, 6, 4, 6));
  // A 1-D X gives one row; an index out of range (run cannot fail) gives 0.
  std::vector<Operand> row = {operand<int64_t>({3}, {7, 8, 9}), operand<int64_t>({2}, {1, 5})};
  std::vector<Operand> picked = {output(DType::kI64, {1, 2})};
  PreparedKernel("ai.onnx.ml.ArrayFeatureExtractor", row, picked).run(row, picked);
  EXPECT_THAT(picked[0].values<int64_t>(), ElementsAre(8, 0));
}

TEST(ArrayFeatureExtractor, ConstantIndicesAreChecked) {
  const std::vector<Operand> inputs = {operand<float>({2, 3}, std::vector<float>(6, 0)),
                                       operand<int64_t>({1}, {3}, /*constant=*/true)};
  EXPECT_THAT(prepareError("ai.onnx.ml.ArrayFeatureExtractor", inputs, {output(DType::kF32, {2, 1})}),
              HasSubstr("index 3 is out of range for the 3 features"));
}

TEST(Binarizer, OneAboveTheThreshold) {
  std::vector<Operand> inputs = {operand<double>({4}, {-1, 0.5, 0.6, 2})};
  std::vector<Operand> outputs = {output(DType::kF64, {4})};
  PreparedKernel("ai.onnx.ml.Binarizer", inputs, outputs, params({{"threshold", 0.5}})).run(inputs, outputs);
  EXPECT_THAT(outputs[0].values<double>(), ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(prepareError("ai.onnx.ml.Binarizer", {operand<uint8_t>({1}, {1})}, {output(DType::kU8, {1})}),
              HasSubstr("no kernel for u8[1] X"));
}

// Two trees over two features, three targets:
//   tree 0: x0 <= 1 ? leaf 0 (target 0, 1.0) : (x1 in {2, 3} ? leaf 1 (target 1, 10) : leaf 2 (target 1, 20))
//   tree 1: x1 > 0 ? leaf 3 (target 0, 100) : leaf 4 (target 2, -1); NaN goes true
ParamMap forest(int64_t aggregate, int64_t post) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return params({{"nodes_featureids", Ints{0, 1, 1}},
                 {"nodes_splits", Doubles{1, 0, 0}},
                 {"nodes_modes", Ints{0, 6, 3}},
                 {"nodes_truenodeids", Ints{0, 1, 3}},
                 {"nodes_falsenodeids", Ints{1, 2, 4}},
                 {"nodes_trueleafs", Ints{1, 1, 1}},
                 {"nodes_falseleafs", Ints{0, 1, 1}},
                 {"nodes_missing_value_tracks_true", Ints{0, 0, 1}},
                 {"membership_values", Doubles{2, 3, nan}},
                 {"leaf_targetids", Ints{0, 1, 1, 0, 2}},
                 {"leaf_weights", Doubles{1, 10, 20, 100, -1}},
                 {"tree_roots", Ints{0, 2}},
                 {"n_targets", int64_t{3}},
                 {"aggregate_function", aggregate},
                 {"post_transform", post}});
}

std::vector<float> runForest(const ParamMap& p) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Operand> inputs = {operand<float>({3, 2}, {0, 5, 2, 3, 2, nan})};
  std::vector<Operand> outputs = {output(DType::kF32, {3, 3})};
  PreparedKernel("ai.onnx.ml.TreeEnsemble", inputs, outputs, p).run(inputs, outputs);
  return outputs[0].values<float>();
}

TEST(TreeEnsemble, SumOfTheLeavesEachRowReaches) {
  // Row 0 (0, 5): leaf 0 and leaf 3. Row 1 (2, 3): leaf 1 and leaf 3.
  // Row 2 (2, NaN): NaN is no member -> leaf 2; NaN tracks true -> leaf 3.
  EXPECT_THAT(runForest(forest(1, 0)), ElementsAre(101, 0, 0, 100, 10, 0, 100, 20, 0));
}

TEST(TreeEnsemble, AverageMinMax) {
  EXPECT_THAT(runForest(forest(0, 0)), ElementsAre(50.5, 0, 0, 50, 5, 0, 50, 10, 0));
  const float max = std::numeric_limits<float>::max();
  EXPECT_THAT(runForest(forest(2, 0)), ElementsAre(1, max, max, 100, 10, max, 100, 20, max));
  EXPECT_THAT(runForest(forest(3, 0)), ElementsAre(100, -max, -max, 100, 10, -max, 100, 20, -max));
}

TEST(TreeEnsemble, PostTransforms) {
  const std::vector<float> logistic = runForest(forest(1, 2));
  EXPECT_NEAR(logistic[4], 1 / (1 + std::exp(-10.0)), 1e-6);
  EXPECT_NEAR(logistic[5], 0.5, 1e-6);
  const std::vector<float> softmax = runForest(forest(1, 1));
  const double e = std::exp(-90.0);  // row 1: scores 100, 10, 0
  EXPECT_NEAR(softmax[3], 1 / (1 + e + std::exp(-100.0)), 1e-6);
  const std::vector<float> softmax_zero = runForest(forest(1, 3));
  EXPECT_EQ(softmax_zero[5], 0.0f);  // a zero score stays zero
  EXPECT_NEAR(softmax_zero[3] + softmax_zero[4], 1.0, 1e-6);
  ParamMap probit = forest(1, 4);
  probit.set("leaf_weights", Doubles{0.975, 0, 0, 0, 0.5});  // row 0 target 0: 0.975 -> 1.95996
  EXPECT_NEAR(runForest(probit)[0], 1.959964, 1e-4);
}

TEST(TreeEnsemble, Errors) {
  const std::vector<Operand> inputs = {operand<float>({3, 2}, std::vector<float>(6, 0))};
  const std::vector<Operand> outputs = {output(DType::kF32, {3, 3})};
  ParamMap loop = forest(1, 0);
  loop.set("nodes_falseleafs", Ints{0, 1, 0});
  loop.set("nodes_falsenodeids", Ints{1, 2, 2});  // node 2 branches to itself
  EXPECT_THAT(prepareError("ai.onnx.ml.TreeEnsemble", inputs, outputs, loop), HasSubstr("a branch loops"));
  ParamMap feature = forest(1, 0);
  feature.set("nodes_featureids", Ints{0, 1, 2});
  EXPECT_THAT(prepareError("ai.onnx.ml.TreeEnsemble", inputs, outputs, feature), HasSubstr("node 2 reads feature 2 of 2"));
  ParamMap members = forest(1, 0);
  members.set("membership_values", Doubles{2, 3});
  EXPECT_THAT(prepareError("ai.onnx.ml.TreeEnsemble", inputs, outputs, members), HasSubstr("no NaN-ended set"));
}

}  // namespace
}  // namespace kiln
