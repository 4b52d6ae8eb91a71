// FlexAttention and its kiln parts (FlexAttentionScores, FlexAttentionOutput)
// against the whole-row reference of op_flex_attention.py written here in
// double: scores, softmax, times V.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

struct FlexCase {
  int64_t batch = 2, q_heads = 4, kv_heads = 2, q_seq = 3, kv_seq = 5, head = 4, v_head = 6;
  double scale = 0;  // 0: 1 / sqrt(head)
};

struct FlexReference {
  std::vector<double> scores, y;
};

template <typename T>
FlexReference reference(const FlexCase& c, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v) {
  const double scale = c.scale == 0 ? 1 / std::sqrt(static_cast<double>(c.head)) : c.scale;
  FlexReference r;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      const int64_t kv = b * c.kv_heads + h / (c.q_heads / c.kv_heads);
      for (int64_t i = 0; i < c.q_seq; ++i) {
        const int64_t row = (b * c.q_heads + h) * c.q_seq + i;
        std::vector<double> p;
        for (int64_t j = 0; j < c.kv_seq; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < c.head; ++e) dot += double{q[row * c.head + e]} * k[(kv * c.kv_seq + j) * c.head + e];
          p.push_back(dot * scale);
        }
        r.scores.insert(r.scores.end(), p.begin(), p.end());
        double max = p[0], sum = 0;
        for (double z : p) max = std::max(max, z);
        for (double& z : p) sum += (z = std::exp(z - max));
        for (int64_t e = 0; e < c.v_head; ++e) {
          double y = 0;
          for (int64_t j = 0; j < c.kv_seq; ++j) y += p[j] / sum * v[(kv * c.kv_seq + j) * c.v_head + e];
          r.y.push_back(y);
        }
      }
    }
  }
  return r;
}

template <typename T>
void expectNear(const std::vector<T>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << i;
}

template <typename T>
void checkFused(const FlexCase& c, double tolerance) {
  const auto q = randomValues<T>(static_cast<size_t>(c.batch * c.q_heads * c.q_seq * c.head), 1, -1, 1);
  const auto k = randomValues<T>(static_cast<size_t>(c.batch * c.kv_heads * c.kv_seq * c.head), 2, -1, 1);
  const auto v = randomValues<T>(static_cast<size_t>(c.batch * c.kv_heads * c.kv_seq * c.v_head), 3, -1, 1);
  std::vector<Operand> inputs = {operand<T>({c.batch, c.q_heads, c.q_seq, c.head}, q),
                                 operand<T>({c.batch, c.kv_heads, c.kv_seq, c.head}, k),
                                 operand<T>({c.batch, c.kv_heads, c.kv_seq, c.v_head}, v)};
  std::vector<Operand> outputs = {output(dtypeOf<T>(), {c.batch, c.q_heads, c.q_seq, c.v_head})};
  ParamMap p;
  if (c.scale != 0) p.set("scale", c.scale);
  PreparedKernel kernel("ai.onnx.preview.FlexAttention", inputs, outputs, p);
  kernel.run(inputs, outputs);
  expectNear(outputs[0].values<T>(), reference(c, q, k, v).y, tolerance);
}

TEST(FlexAttention, GroupedQueryHeadsF32) { checkFused<float>(FlexCase{}, 1e-5); }

TEST(FlexAttention, DoubleWithScale) { checkFused<double>(FlexCase{.kv_heads = 4, .scale = 0.3}, 1e-7); }

TEST(FlexAttention, PartsWithASoftmaxInTheOutput) {
  const FlexCase c;
  const auto q = randomValues<float>(static_cast<size_t>(c.batch * c.q_heads * c.q_seq * c.head), 4, -1, 1);
  const auto k = randomValues<float>(static_cast<size_t>(c.batch * c.kv_heads * c.kv_seq * c.head), 5, -1, 1);
  const auto v = randomValues<float>(static_cast<size_t>(c.batch * c.kv_heads * c.kv_seq * c.v_head), 6, -1, 1);
  const FlexReference want = reference(c, q, k, v);
  std::vector<Operand> qk = {operand<float>({c.batch, c.q_heads, c.q_seq, c.head}, q),
                             operand<float>({c.batch, c.kv_heads, c.kv_seq, c.head}, k)};
  std::vector<Operand> scores = {output(DType::kF32, {c.batch, c.q_heads, c.q_seq, c.kv_seq})};
  PreparedKernel("kiln.FlexAttentionScores", qk, scores).run(qk, scores);
  expectNear(scores[0].values<float>(), want.scores, 1e-5);
  std::vector<Operand> pv = {scores[0], operand<float>({c.batch, c.kv_heads, c.kv_seq, c.v_head}, v)};
  std::vector<Operand> y = {output(DType::kF32, {c.batch, c.q_heads, c.q_seq, c.v_head})};
  PreparedKernel("kiln.FlexAttentionOutput", pv, y, params({{"softmax", int64_t{1}}})).run(pv, y);
  expectNear(y[0].values<float>(), want.y, 1e-5);
  // Without the softmax: P V as given (the probabilities of a prob_mod).
  std::vector<float> ones(static_cast<size_t>(c.batch * c.q_heads * c.q_seq * c.kv_seq), 1.0f);
  pv[0] = operand<float>({c.batch, c.q_heads, c.q_seq, c.kv_seq}, ones);
  PreparedKernel("kiln.FlexAttentionOutput", pv, y, params({{"softmax", int64_t{0}}})).run(pv, y);
  EXPECT_NEAR(y[0].values<float>()[0], v[0] + v[6] + v[12] + v[18] + v[24], 1e-5);  // head 0, column 0
}

TEST(FlexAttention, Errors) {
  const Operand q = operand<float>({1, 3, 2, 4}, std::vector<float>(24, 0));
  const Operand k = operand<float>({1, 2, 2, 4}, std::vector<float>(16, 0));
  const std::vector<Operand> y = {output(DType::kF32, {1, 3, 2, 4})};
  EXPECT_THAT(prepareError("ai.onnx.preview.FlexAttention", {q, k, k}, y), HasSubstr("query heads a multiple"));
  const Operand x = operand<float>({1, 2, 2, 4}, std::vector<float>(16, 0));
  EXPECT_THAT(prepareError("ai.onnx.preview.FlexAttention", {x, x, x}, {output(DType::kF32, {1, 2, 2, 4})},
                           params({{"softmax_precision", int64_t{10}}})),
              HasSubstr("softmax_precision 10 is not supported"));
  EXPECT_THAT(prepareError("kiln.FlexAttentionOutput", {operand<double>({1, 2, 2, 2}, std::vector<double>(8, 0)), x},
                           {output(DType::kF32, {1, 2, 2, 4})}),
              HasSubstr("the probabilities must be f32"));
}

}  // namespace
}  // namespace kiln
