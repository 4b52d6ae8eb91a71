// kiln.DynamicInt8MatMul: activations quantized per row in groups of 32,
// int8 products. Checked against a double-precision reference of the
// documented formula (src/kernels/cpu/dynamic_int8_matmul.h), the VNNI path
// against the portable one bit for bit, and the result against the exact
// f32 product within the quantization's error bound.
#include "kernels/cpu/dynamic_int8_matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace kiln {
namespace {

using testing::operand;
using testing::output;
using testing::prepareError;
using testing::PreparedKernel;
using testing::randomValues;

struct Case {
  int64_t m, k, n;
};

// The quantized row and, per group, scale and zero point, as the header
// defines them (written out independently of the kernel).
struct QuantizedRow {
  std::vector<int> q;
  std::vector<double> scale, zero;
};

QuantizedRow quantizeReference(const float* x, int64_t k) {
  QuantizedRow row;
  for (int64_t begin = 0; begin < k; begin += kDynamicInt8Group) {
    const int64_t end = std::min(k, begin + kDynamicInt8Group);
    float lo = 0.0f;
    float hi = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    float s = (hi - lo) / 255.0f;
    if (!(s >= std::numeric_limits<float>::min())) s = 1.0f;
    const float inverse = 1.0f / s;
    const float z = std::clamp(std::nearbyint(-lo * inverse), 0.0f, 255.0f);
    for (int64_t i = begin; i < end; ++i) {
      row.q.push_back(static_cast<int>(std::clamp(std::nearbyint(x[i] * inverse) + z, 0.0f, 255.0f)));
    }
    row.scale.push_back(s);
    row.zero.push_back(z);
  }
  return row;
}

// y in double: sum over k of (q - z) s w, times w_scale, plus bias.
std::vector<double> reference(const Case& c, const std::vector<float>& x, const std::vector<int8_t>& w,
                              const std::vector<float>& w_scale, const std::vector<float>& bias) {
  std::vector<double> y(static_cast<size_t>(c.m * c.n));
  for (int64_t r = 0; r < c.m; ++r) {
    const QuantizedRow row = quantizeReference(x.data() + r * c.k, c.k);
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0;
      for (int64_t i = 0; i < c.k; ++i) {
        const auto g = static_cast<size_t>(i / kDynamicInt8Group);
        sum += (row.q[static_cast<size_t>(i)] - row.zero[g]) * row.scale[g] * w[static_cast<size_t>(i * c.n + j)];
      }
      y[static_cast<size_t>(r * c.n + j)] = sum * w_scale[static_cast<size_t>(j)] + (bias.empty() ? 0.0 : bias[static_cast<size_t>(j)]);
    }
  }
  return y;
}

struct Operands {
  std::vector<float> x;
  std::vector<int8_t> w;
  std::vector<float> w_scale, bias;
};

Operands randomOperands(const Case& c, uint32_t seed, bool with_bias) {
  Operands o;
  o.x = randomValues<float>(static_cast<size_t>(c.m * c.k), seed, -2.0, 3.0);
  // An outlier in some rows: its group gets a coarse scale, the others not.
  for (int64_t r = 0; r < c.m; r += 3) o.x[static_cast<size_t>(r * c.k + (r % c.k))] = 40.0f;
  o.w = randomValues<int8_t>(static_cast<size_t>(c.k * c.n), seed + 1, -128, 127);
  o.w_scale = randomValues<float>(static_cast<size_t>(c.n), seed + 2, 0.001, 0.02);
  if (with_bias) o.bias = randomValues<float>(static_cast<size_t>(c.n), seed + 3, -1.0, 1.0);
  return o;
}

std::vector<float> run(const DynamicInt8MatMul& mm, const Case& c, const std::vector<float>& x) {
  std::vector<float> y(static_cast<size_t>(c.m * c.n), std::numeric_limits<float>::quiet_NaN());
  runDynamicInt8MatMul(mm, c.m, x.data(), y.data());
  return y;
}

const std::vector<Case> kCases = {{1, 1, 1},    {1, 32, 32},  {5, 33, 17},   {7, 100, 65},
                                  {13, 64, 96}, {6, 384, 48}, {2, 1000, 31}, {40, 77, 130}};

TEST(DynamicInt8MatMul, MatchesTheDocumentedFormula) {
  for (const Case& c : kCases) {
    for (bool with_bias : {false, true}) {
      const Operands o = randomOperands(c, 11, with_bias);
      const auto mm = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(),
                                               with_bias ? o.bias.data() : nullptr);
      const std::vector<float> y = run(*mm, c, o.x);
      const std::vector<double> expected = reference(c, o.x, o.w, o.w_scale, o.bias);
      double largest = 0.0;
      for (double v : expected) largest = std::max(largest, std::abs(v));
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], expected[i], 1e-5 * largest + 1e-6)
            << "m=" << c.m << " k=" << c.k << " n=" << c.n << " bias=" << with_bias << " at " << i;
      }
    }
  }
}

TEST(DynamicInt8MatMul, VnniAndPortablePathsAgreeBitForBit) {
  if (!dynamicInt8UsesVnni()) GTEST_SKIP() << "this CPU (or KILN_CPU_ISA) runs the portable path only";
  for (const Case& c : kCases) {
    const Operands o = randomOperands(c, 23, true);
    const auto vnni = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(), o.bias.data());
    const auto portable = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(), o.bias.data(), false);
    ASSERT_TRUE(vnni->vnni);
    ASSERT_FALSE(portable->vnni);
    EXPECT_EQ(run(*vnni, c, o.x), run(*portable, c, o.x)) << "m=" << c.m << " k=" << c.k << " n=" << c.n;
  }
}

// Each activation moves by at most its group's step s (half of one by
// rounding; a whole one where the zero point's rounding pushes the group's
// top value past 255), so |y - exact| <= w_scale * sum over k of |w| s.
TEST(DynamicInt8MatMul, StaysWithinTheQuantizationBoundOfTheExactProduct) {
  const Case c{9, 200, 40};
  const Operands o = randomOperands(c, 5, true);
  const auto mm = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(), o.bias.data());
  const std::vector<float> y = run(*mm, c, o.x);
  for (int64_t r = 0; r < c.m; ++r) {
    const QuantizedRow row = quantizeReference(o.x.data() + r * c.k, c.k);
    for (int64_t j = 0; j < c.n; ++j) {
      double exact = 0.0;
      double bound = 0.0;
      for (int64_t i = 0; i < c.k; ++i) {
        const double w = o.w[static_cast<size_t>(i * c.n + j)];
        exact += o.x[static_cast<size_t>(r * c.k + i)] * w;
        bound += std::abs(w) * row.scale[static_cast<size_t>(i / kDynamicInt8Group)];
      }
      exact = exact * o.w_scale[static_cast<size_t>(j)] + o.bias[static_cast<size_t>(j)];
      bound = bound * o.w_scale[static_cast<size_t>(j)] * 1.001 + 1e-5;
      EXPECT_LE(std::abs(y[static_cast<size_t>(r * c.n + j)] - exact), bound) << "row " << r << " column " << j;
    }
  }
}

TEST(DynamicInt8MatMul, ZerosAndSmallIntegersAreExact) {
  // Rows of zeros give the bias; a group of integers in [0, 255] whose
  // range is [0, 255] has the step 1 and zero point 0: exact.
  const Case c{2, 64, 3};
  std::vector<float> x(static_cast<size_t>(c.m * c.k), 0.0f);
  for (int64_t i = 0; i < c.k; ++i) x[static_cast<size_t>(c.k + i)] = static_cast<float>((i * 37) % 256);
  x[static_cast<size_t>(c.k)] = 255.0f;
  x[static_cast<size_t>(c.k + 32)] = 255.0f;
  std::vector<int8_t> w = randomValues<int8_t>(static_cast<size_t>(c.k * c.n), 3, -128, 127);
  const std::vector<float> w_scale = {1.0f, 0.5f, 0.25f};
  const std::vector<float> bias = {0.5f, -1.0f, 2.0f};
  const auto mm = prepareDynamicInt8MatMul(c.k, c.n, w.data(), w_scale.data(), bias.data());
  const std::vector<float> y = run(*mm, c, x);
  for (int64_t j = 0; j < c.n; ++j) {
    EXPECT_EQ(y[static_cast<size_t>(j)], bias[static_cast<size_t>(j)]);
    double exact = 0.0;
    for (int64_t i = 0; i < c.k; ++i) exact += x[static_cast<size_t>(c.k + i)] * w[static_cast<size_t>(i * c.n + j)];
    EXPECT_EQ(y[static_cast<size_t>(c.n + j)], static_cast<float>(exact * w_scale[static_cast<size_t>(j)] + bias[static_cast<size_t>(j)]));
  }
}

TEST(DynamicInt8MatMul, KernelRunsOverLeadingDimensions) {
  const Case c{2 * 3, 48, 20};
  const Operands o = randomOperands(c, 8, true);
  std::vector<testing::Operand> inputs = {operand<float>({2, 3, c.k}, o.x), operand<int8_t>({c.k, c.n}, o.w, true),
                                          operand<float>({c.n}, o.w_scale, true), operand<float>({c.n}, o.bias, true)};
  std::vector<testing::Operand> outputs = {output(DType::kF32, {2, 3, c.n})};
  PreparedKernel("kiln.DynamicInt8MatMul", inputs, outputs).run(inputs, outputs);
  const auto mm = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(), o.bias.data());
  EXPECT_EQ(outputs[0].values<float>(), run(*mm, c, o.x));
}

TEST(DynamicInt8MatMul, KernelAppliesTheFusedActivation) {
  const Case c{7, 40, 70};
  const Operands o = randomOperands(c, 9, true);
  const auto plain = prepareDynamicInt8MatMul(c.k, c.n, o.w.data(), o.w_scale.data(), o.bias.data());
  const std::vector<float> before = run(*plain, c, o.x);
  for (const char* activation : {"Relu", "Gelu", "Clip"}) {
    std::vector<testing::Operand> inputs = {operand<float>({c.m, c.k}, o.x), operand<int8_t>({c.k, c.n}, o.w, true),
                                            operand<float>({c.n}, o.w_scale, true), operand<float>({c.n}, o.bias, true)};
    std::vector<testing::Operand> outputs = {output(DType::kF32, {c.m, c.n})};
    PreparedKernel("kiln.DynamicInt8MatMul", inputs, outputs,
                   testing::params({{"activation", std::string(activation)}, {"activation_alpha", -0.5},
                                    {"activation_beta", 0.25}}))
        .run(inputs, outputs);
    const vec::Unary unary = *vec::unaryForActivation(*parseFusedActivation(activation));
    std::vector<float> want(before.size());
    vec::vectorKernels().unaryFn(unary)(before.data(), want.data(), static_cast<int64_t>(want.size()), -0.5f, 0.25f);
    EXPECT_EQ(outputs[0].values<float>(), want) << activation;
  }
  std::vector<testing::Operand> inputs = {operand<float>({c.m, c.k}, o.x), operand<int8_t>({c.k, c.n}, o.w, true),
                                          operand<float>({c.n}, o.w_scale, true)};
  EXPECT_NE(prepareError("kiln.DynamicInt8MatMul", inputs, {output(DType::kF32, {c.m, c.n})},
                         testing::params({{"activation", std::string("Swish")}}))
                .find("activation 'Swish' is not one this kernel applies"),
            std::string::npos);
}

TEST(DynamicInt8MatMul, EmptyBatchWritesNothing) {
  const std::vector<int8_t> w(64 * 3, 1);
  const std::vector<float> scale(3, 1.0f);
  const auto mm = prepareDynamicInt8MatMul(64, 3, w.data(), scale.data(), nullptr);
  runDynamicInt8MatMul(*mm, 0, nullptr, nullptr);
}

TEST(DynamicInt8MatMul, KernelErrors) {
  const std::vector<float> x(2 * 8, 1.0f);
  const std::vector<int8_t> w(8 * 4, 1);
  const std::vector<float> scale(4, 1.0f);
  auto error = [&](bool w_constant, std::vector<int64_t> x_shape, std::vector<int64_t> out_shape) {
    return prepareError("kiln.DynamicInt8MatMul",
                        {operand<float>(x_shape, std::vector<float>(testing::elementCount(x_shape), 1.0f)),
                         operand<int8_t>({8, 4}, w, w_constant), operand<float>({4}, scale, true)},
                        {output(DType::kF32, out_shape)});
  };
  EXPECT_EQ(error(true, {2, 8}, {2, 4}), "(no error)");
  EXPECT_NE(error(false, {2, 8}, {2, 4}).find("the weights (input 1) must be a constant"), std::string::npos);
  EXPECT_NE(error(true, {2, 7}, {2, 4}).find("must end in k = 8"), std::string::npos);
  EXPECT_NE(error(true, {2, 8}, {2, 5}).find("output 0"), std::string::npos);
  EXPECT_NE(prepareError("kiln.DynamicInt8MatMul",
                         {operand<float>({2, 8}, x), operand<float>({8, 4}, std::vector<float>(32, 1.0f), true),
                          operand<float>({4}, scale, true)},
                         {output(DType::kF32, {2, 4})})
                .find("must be i8"),
            std::string::npos);
  const std::vector<int8_t> deep(static_cast<size_t>(kDynamicInt8MaxDepth + 1), 1);
  EXPECT_THROW(prepareDynamicInt8MatMul(kDynamicInt8MaxDepth + 1, 1, deep.data(), scale.data(), nullptr), UsageError);
}

}  // namespace
}  // namespace kiln
