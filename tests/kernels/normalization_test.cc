// BatchNormalization, LayerNormalization, Softmax and LogSoftmax against
// double-precision references written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::shapeText;
using Ints = std::vector<int64_t>;

::testing::AssertionResult near(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, want " << want.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tolerance * (1 + std::abs(want[i])))) {
      if (mismatches++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first: " << first;
}

// ------------------------------------------------------ BatchNormalization

void checkBatchNorm(const Ints& xs, double epsilon, uint32_t seed) {
  const int64_t c = xs[1];
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -3, 3);
  const std::vector<float> scale = randomValues<float>(static_cast<size_t>(c), seed + 1, -2, 2);
  const std::vector<float> bias = randomValues<float>(static_cast<size_t>(c), seed + 2, -1, 1);
  const std::vector<float> mean = randomValues<float>(static_cast<size_t>(c), seed + 3, -1, 1);
  const std::vector<float> var = randomValues<float>(static_cast<size_t>(c), seed + 4, 0.1, 3);
  int64_t inner = 1;
  for (size_t i = 2; i < xs.size(); ++i) inner *= xs[i];
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t ch = (i / static_cast<size_t>(inner)) % static_cast<size_t>(c);
    want[i] = (x[i] - static_cast<double>(mean[ch])) / std::sqrt(static_cast<double>(var[ch]) + epsilon) * scale[ch] +
              bias[ch];
  }
  ParamMap p;
  p.set("epsilon", epsilon);
  for (bool constant : {false, true}) {
    std::vector<Operand> inputs = {operand(xs, x), operand<float>({c}, scale, constant), operand<float>({c}, bias, constant),
                                   operand<float>({c}, mean, constant), operand<float>({c}, var, constant)};
    std::vector<Operand> outputs = {output(DType::kF32, xs)};
    const PreparedKernel kernel("BatchNormalization", inputs, outputs, p);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(near(outputs[0].values<float>(), want, 1e-5)) << shapeText(xs) << (constant ? " constant" : "");
  }
}

TEST(BatchNormKernel, Shapes) {
  checkBatchNorm({2, 3}, 1e-5, 1);
  checkBatchNorm({2, 3, 17}, 1e-5, 2);
  checkBatchNorm({2, 5, 7, 9}, 1e-3, 3);
  checkBatchNorm({1, 16, 14, 14}, 1e-5, 4);
  checkBatchNorm({1, 3, 2, 3, 4}, 0.5, 5);
}

TEST(BatchNormKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({1, 2, 3}, std::vector<float>(6, 0));
  const auto v = operand<float>({2}, {1.0f, 1.0f});
  EXPECT_EQ(prepareError("BatchNormalization", {x, v, v, v, v}, {output(DType::kF32, {1, 2, 3})}), "(no error)");
  EXPECT_THAT(prepareError("BatchNormalization", {x, v, v, v, v},
                           {output(DType::kF32, {1, 2, 3}), output(DType::kF32, {2}), output(DType::kF32, {2})}),
              HasSubstr("only the inference form with one output (Y) is supported"));
  ParamMap training;
  training.set("training_mode", int64_t{1});
  const auto s = output(DType::kF32, {2});
  EXPECT_THAT(prepareError("BatchNormalization", {x, v, v, v, v}, {output(DType::kF32, {1, 2, 3}), s, s, s, s}, training),
              HasSubstr("saved statistics outputs of opsets before 14 are not supported"));
  EXPECT_THAT(prepareError("BatchNormalization", {x, v, v, operand<float>({3}, {0, 0, 0}), v},
                           {output(DType::kF32, {1, 2, 3})}),
              HasSubstr("mean (input 3) is f32[3] but must be [2]"));
  EXPECT_THAT(prepareError("BatchNormalization", {x, v, v, v}, {output(DType::kF32, {1, 2, 3})}),
              HasSubstr("expects 5 inputs, got 4"));
}

// ------------------------------------------------------ LayerNormalization

void checkLayerNorm(const Ints& xs, int64_t axis, const Ints& scale_shape, bool with_bias, bool stats, uint32_t seed) {
  const size_t a = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(xs.size()) : axis);
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -3, 3);
  const std::vector<float> scale = randomValues<float>(elementCount(scale_shape), seed + 1, -2, 2);
  const std::vector<float> bias = randomValues<float>(elementCount(scale_shape), seed + 2, -1, 1);
  int64_t rows = 1, size = 1;
  for (size_t i = 0; i < xs.size(); ++i) (i < a ? rows : size) *= xs[i];
  const double epsilon = 1e-5;
  std::vector<double> want(x.size()), means, inv_stds;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < size; ++i) mean += x[static_cast<size_t>(r * size + i)];
    mean /= static_cast<double>(size);
    for (int64_t i = 0; i < size; ++i) {
      const double d = x[static_cast<size_t>(r * size + i)] - mean;
      var += d * d;
    }
    var /= static_cast<double>(size);
    const double inv = 1 / std::sqrt(var + epsilon);
    means.push_back(mean);
    inv_stds.push_back(inv);
    for (int64_t i = 0; i < size; ++i) {
      const size_t k = scale.size() == 1 ? 0 : static_cast<size_t>(i);
      want[static_cast<size_t>(r * size + i)] =
          (x[static_cast<size_t>(r * size + i)] - mean) * inv * scale[k] + (with_bias ? bias[k] : 0.0);
    }
  }
  Ints stats_shape(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(a));
  stats_shape.insert(stats_shape.end(), xs.size() - a, 1);
  ParamMap p;
  p.set("axis", axis);
  std::vector<Operand> inputs = {operand(xs, x), operand(scale_shape, scale)};
  if (with_bias) inputs.push_back(operand(scale_shape, bias));
  std::vector<Operand> outputs = {output(DType::kF32, xs)};
  if (stats) {
    outputs.push_back(output(DType::kF32, stats_shape));
    outputs.push_back(output(DType::kF32, stats_shape));
  }
  const PreparedKernel kernel("LayerNormalization", inputs, outputs, p);
  kernel.run(inputs, outputs);
  EXPECT_TRUE(near(outputs[0].values<float>(), want, 2e-5)) << shapeText(xs) << " axis " << axis;
  if (stats) {
    EXPECT_TRUE(near(outputs[1].values<float>(), means, 1e-5)) << shapeText(xs) << " Mean";
    EXPECT_TRUE(near(outputs[2].values<float>(), inv_stds, 1e-5)) << shapeText(xs) << " InvStdDev";
  }
}

TEST(LayerNormKernel, Shapes) {
  uint32_t seed = 1;
  checkLayerNorm({4, 7}, -1, {7}, true, false, seed += 10);
  checkLayerNorm({2, 3, 37}, -1, {37}, true, false, seed += 10);
  checkLayerNorm({2, 3, 768}, 2, {768}, false, false, seed += 10);
  checkLayerNorm({2, 3, 4, 5}, 1, {3, 4, 5}, true, false, seed += 10);
  checkLayerNorm({2, 3, 4, 5}, -2, {1, 4, 5}, true, false, seed += 10);  // leading 1s
  checkLayerNorm({2, 3, 16}, -1, {1}, true, false, seed += 10);          // one value
  checkLayerNorm({3, 5, 33}, -1, {33}, true, true, seed += 10);          // Mean and InvStdDev
  checkLayerNorm({6}, 0, {6}, true, true, seed += 10);
}

TEST(LayerNormKernel, ScaleAndBiasOfOneValueMixWithWholeOnes) {
  const Ints xs = {3, 40};
  const std::vector<float> x = randomValues<float>(120, 21, -3, 3);
  const std::vector<float> full = randomValues<float>(40, 22, -2, 2);
  const float one = 0.75f;
  for (bool scale_is_one : {true, false}) {
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < 3; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < 40; ++i) mean += x[static_cast<size_t>(r * 40 + i)];
      mean /= 40;
      for (int64_t i = 0; i < 40; ++i) var += std::pow(x[static_cast<size_t>(r * 40 + i)] - mean, 2);
      const double inv = 1 / std::sqrt(var / 40 + 1e-5);
      for (int64_t i = 0; i < 40; ++i) {
        const size_t k = static_cast<size_t>(r * 40 + i);
        const double scale = scale_is_one ? one : full[static_cast<size_t>(i)];
        const double bias = scale_is_one ? full[static_cast<size_t>(i)] : one;
        want[k] = (x[k] - mean) * inv * scale + bias;
      }
    }
    std::vector<Operand> inputs = {operand(xs, x), scale_is_one ? operand<float>({1}, {one}) : operand<float>({40}, full),
                                   scale_is_one ? operand<float>({40}, full) : operand<float>({1}, {one})};
    std::vector<Operand> outputs = {output(DType::kF32, xs)};
    PreparedKernel("LayerNormalization", inputs, outputs).run(inputs, outputs);
    EXPECT_TRUE(near(outputs[0].values<float>(), want, 2e-5)) << (scale_is_one ? "one scale" : "one bias");
  }
}

TEST(LayerNormKernel, LargeMeanKeepsVariance) {
  // Values around 1000 with a spread of 1: a one-pass E[x^2] - E[x]^2 in f32 would lose it.
  std::vector<float> x = randomValues<float>(256, 5, 999, 1001);
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= 256;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= 256;
  std::vector<double> want;
  for (float v : x) want.push_back((v - mean) / std::sqrt(var + 1e-5));
  std::vector<Operand> inputs = {operand<float>({1, 256}, x), operand<float>({256}, std::vector<float>(256, 1.0f))};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 256})};
  const PreparedKernel kernel("LayerNormalization", inputs, outputs);
  kernel.run(inputs, outputs);
  EXPECT_TRUE(near(outputs[0].values<float>(), want, 1e-3));
}

TEST(LayerNormKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({2, 3, 4}, std::vector<float>(24, 0));
  EXPECT_EQ(prepareError("LayerNormalization", {x, operand<float>({4}, std::vector<float>(4, 1))},
                         {output(DType::kF32, {2, 3, 4})}),
            "(no error)");
  EXPECT_THAT(prepareError("LayerNormalization", {x, operand<float>({3, 1}, std::vector<float>(3, 1))},
                           {output(DType::kF32, {2, 3, 4})}),
              HasSubstr("input 1 f32[3, 1] must have the normalised shape [4]"));
  ParamMap axis;
  axis.set("axis", int64_t{3});
  EXPECT_THAT(prepareError("LayerNormalization", {x, operand<float>({4}, std::vector<float>(4, 1))},
                           {output(DType::kF32, {2, 3, 4})}, axis),
              HasSubstr("axis 3 is out of range for rank 3"));
  ParamMap stash;
  stash.set("stash_type", int64_t{11});
  EXPECT_THAT(prepareError("LayerNormalization", {x, operand<float>({4}, std::vector<float>(4, 1))},
                           {output(DType::kF32, {2, 3, 4})}, stash),
              HasSubstr("stash_type 11 is not supported"));
  EXPECT_THAT(prepareError("LayerNormalization", {x, operand<float>({4}, std::vector<float>(4, 1))},
                           {output(DType::kF32, {2, 3, 4}), output(DType::kF32, {2, 3})}),
              HasSubstr("output 1 is f32[2, 3] but the inputs give f32[2, 3, 1]"));
}

// ------------------------------------------------------ Softmax, LogSoftmax

std::vector<double> softmaxReference(const Ints& xs, const std::vector<float>& x, size_t axis, bool log) {
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= xs[i];
  for (size_t i = axis + 1; i < xs.size(); ++i) inner *= xs[i];
  const int64_t n = xs.empty() ? 1 : xs[axis];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const auto at = [&](int64_t a) { return static_cast<size_t>((o * n + a) * inner + j); };
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (int64_t a = 0; a < n; ++a) m = std::max(m, static_cast<double>(x[at(a)]));
      for (int64_t a = 0; a < n; ++a) s += std::exp(x[at(a)] - m);
      for (int64_t a = 0; a < n; ++a) y[at(a)] = log ? x[at(a)] - m - std::log(s) : std::exp(x[at(a)] - m) / s;
    }
  }
  return y;
}

void checkSoftmax(const Ints& xs, int64_t axis, double lo, double hi, uint32_t seed) {
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, lo, hi);
  const size_t a = xs.empty() ? 0 : static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(xs.size()) : axis);
  for (bool log : {false, true}) {
    const char* op = log ? "LogSoftmax" : "Softmax";
    ParamMap p;
    if (axis != -1) p.set("axis", axis);
    std::vector<Operand> inputs = {operand(xs, x)};
    std::vector<Operand> outputs = {output(DType::kF32, xs)};
    const PreparedKernel kernel(op, inputs, outputs, p);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(near(outputs[0].values<float>(), softmaxReference(xs, x, a, log), 1e-5))
        << op << " " << shapeText(xs) << " axis " << axis;
  }
}

TEST(SoftmaxKernel, Shapes) {
  uint32_t seed = 1;
  checkSoftmax({5}, -1, -3, 3, seed += 10);
  checkSoftmax({4, 10}, -1, -3, 3, seed += 10);
  checkSoftmax({3, 1000}, 1, -5, 5, seed += 10);
  checkSoftmax({2, 7, 5}, 1, -3, 3, seed += 10);    // inner 5: a partial block
  checkSoftmax({2, 7, 37}, 1, -3, 3, seed += 10);   // inner 37: two blocks and a tail
  checkSoftmax({3, 4, 5, 6}, 0, -3, 3, seed += 10);
  checkSoftmax({3, 4, 5, 6}, -3, -3, 3, seed += 10);
  checkSoftmax({2, 1, 3}, 1, -3, 3, seed += 10);    // one element along the axis
  checkSoftmax({}, -1, -3, 3, seed += 10);          // a scalar
}

TEST(SoftmaxKernel, LargeValuesStayFinite) {
  checkSoftmax({4, 33}, -1, 80, 100, 7);      // exp(100) overflows f32 without the max
  checkSoftmax({3, 9, 17}, 1, -100, -80, 8);  // and underflows to 0 / 0
}

TEST(SoftmaxKernel, InPlace) {
  const Ints xs = {3, 20};
  const std::vector<float> x = randomValues<float>(60, 3, -3, 3);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    std::vector<Operand> inputs = {operand(xs, x)};
    std::vector<Operand> outputs = {output(DType::kF32, xs)};
    const PreparedKernel kernel(op, inputs, outputs);
    auto bound = kernel.bind(inputs, outputs);
    bound->outputs[0].data = bound->inputs[0].data;
    kernel.run(bound->call);
    EXPECT_TRUE(near(inputs[0].values<float>(), softmaxReference(xs, x, 1, std::string(op) == "LogSoftmax"), 1e-5))
        << op;
  }
}

TEST(SoftmaxKernel, InPlaceDownColumns) {
  // Softmax over axis 1 of [2, 7, 300]: 300 columns, more than one chunk.
  const Ints xs = {2, 7, 300};
  const std::vector<float> x = randomValues<float>(elementCount(xs), 4, -3, 3);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    std::vector<Operand> inputs = {operand(xs, x)};
    std::vector<Operand> outputs = {output(DType::kF32, xs)};
    ParamMap p;
    p.set("axis", int64_t{1});
    const PreparedKernel kernel(op, inputs, outputs, p);
    auto bound = kernel.bind(inputs, outputs);
    bound->outputs[0].data = bound->inputs[0].data;
    kernel.run(bound->call);
    EXPECT_TRUE(near(inputs[0].values<float>(), softmaxReference(xs, x, 1, std::string(op) == "LogSoftmax"), 1e-5))
        << op;
  }
}

TEST(SoftmaxKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({2, 3}, std::vector<float>(6, 0));
  ParamMap axis;
  axis.set("axis", int64_t{-3});
  EXPECT_THAT(prepareError("Softmax", {x}, {output(DType::kF32, {2, 3})}, axis),
              HasSubstr("Softmax: axis -3 is out of range for rank 2"));
  EXPECT_THAT(prepareError("LogSoftmax", {operand<double>({2}, {0.0, 1.0})}, {output(DType::kF64, {2})}),
              HasSubstr("LogSoftmax: no kernel for f64 inputs (supports f32)"));
  EXPECT_THAT(prepareError("Softmax", {x}, {output(DType::kF32, {3, 2})}),
              HasSubstr("output 0 is f32[3, 2] but the inputs give f32[2, 3]"));
}


// ------------------------------------------------------------- allocation

// The loops of normalization.cc and pool.cc (global pools, and the pooling
// loop kernel that AveragePool with count_include_pad and ceil_mode padding
// uses) allocate nothing per call.
TEST(NormalizationAllocations, LoopKernelsDoNotAllocate) {
  struct Case {
    std::string op;
    std::vector<Operand> inputs;
    std::vector<Operand> outputs;
    ParamMap params;
  };
  const auto f = [](const Ints& shape, uint32_t seed, bool constant = false) {
    return operand(shape, randomValues<float>(elementCount(shape), seed, 0.5, 2), constant);
  };
  std::vector<Case> cases;
  for (bool constant : {false, true}) {
    cases.push_back({"BatchNormalization",
                     {f({2, 8, 5, 5}, 1), f({8}, 2, constant), f({8}, 3, constant), f({8}, 4, constant),
                      f({8}, 5, constant)},
                     {output(DType::kF32, {2, 8, 5, 5})},
                     {}});
  }
  cases.push_back({"LayerNormalization",
                   {f({4, 6, 40}, 6), f({40}, 7), f({40}, 8)},
                   {output(DType::kF32, {4, 6, 40}), output(DType::kF32, {4, 6, 1}), output(DType::kF32, {4, 6, 1})},
                   {}});
  cases.push_back({"Softmax", {f({8, 100}, 9)}, {output(DType::kF32, {8, 100})}, {}});
  ParamMap axis1;
  axis1.set("axis", int64_t{1});
  cases.push_back({"LogSoftmax", {f({2, 9, 37}, 10)}, {output(DType::kF32, {2, 9, 37})}, axis1});
  cases.push_back({"GlobalAveragePool", {f({2, 8, 7, 7}, 11)}, {output(DType::kF32, {2, 8, 1, 1})}, {}});
  cases.push_back({"GlobalMaxPool", {f({2, 8, 7, 7}, 12)}, {output(DType::kF32, {2, 8, 1, 1})}, {}});
  ParamMap ceil_include;
  ceil_include.set("kernel_shape", Ints{2, 2});
  ceil_include.set("strides", Ints{2, 2});
  ceil_include.set("ceil_mode", int64_t{1});
  ceil_include.set("count_include_pad", int64_t{1});
  cases.push_back({"AveragePool", {f({1, 3, 7, 7}, 13)}, {output(DType::kF32, {1, 3, 4, 4})}, ceil_include});
  for (Case& c : cases) {
    const PreparedKernel kernel(c.op, c.inputs, c.outputs, c.params);
    const auto bound = kernel.bind(c.inputs, c.outputs);
    kernel.run(bound->call);
    ::kiln::testing::startCountingAllocations();
    for (int i = 0; i < 100; ++i) kernel.run(bound->call);
    const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
    EXPECT_EQ(count.news, 0u) << c.op;
    EXPECT_EQ(count.mallocs, 0u) << c.op;
  }
}

}  // namespace
}  // namespace kiln
