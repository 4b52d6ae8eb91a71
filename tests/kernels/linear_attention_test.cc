// LinearAttention and CausalConvWithState against references written here
// plainly in double, step by step as onnx/reference/ops/op_linear_attention.py
// and op_causal_conv_with_state.py compute them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/float_staging.h"
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
using ::kiln::testing::randomValues;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

void expectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << "element " << i;
  }
}

// ----------------------------------------------------------- LinearAttention

struct LinearCase {
  int64_t batch = 2, seq = 3, q_heads = 4, kv_heads = 2, d_k = 3, d_v = 2;
  std::string rule = "gated_delta";
  bool past = true;
  bool decay_per_key = true;
  int64_t beta_heads = 2;  // kv_heads or 1
  double scale = 0;        // 0: 1 / sqrt(d_k)
};

struct LinearInputs {
  std::vector<float> q, k, v, past, decay, beta;
};

LinearInputs linearInputs(const LinearCase& c) {
  const auto n = [&](int64_t last) { return static_cast<size_t>(c.batch * c.seq * last); };
  LinearInputs in;
  in.q = randomValues<float>(n(c.q_heads * c.d_k), 1, -1, 1);
  in.k = randomValues<float>(n(c.kv_heads * c.d_k), 2, -1, 1);
  in.v = randomValues<float>(n(c.kv_heads * c.d_v), 3, -1, 1);
  in.past = randomValues<float>(static_cast<size_t>(c.batch * c.kv_heads * c.d_k * c.d_v), 4, -0.5, 0.5);
  in.decay = randomValues<float>(n(c.decay_per_key ? c.kv_heads * c.d_k : c.kv_heads), 5, -1, 0);
  in.beta = randomValues<float>(n(c.beta_heads), 6, 0, 1);
  return in;
}

// Output [B, T, Hq * d_v] and the final state [B, Hkv, d_k, d_v].
std::pair<std::vector<double>, std::vector<double>> referenceLinear(const LinearCase& c, const LinearInputs& in) {
  const bool gated = c.rule == "gated" || c.rule == "gated_delta";
  const bool delta = c.rule == "delta" || c.rule == "gated_delta";
  const double scale = c.scale == 0 ? 1 / std::sqrt(static_cast<double>(c.d_k)) : c.scale;
  std::vector<double> y(static_cast<size_t>(c.batch * c.seq * c.q_heads * c.d_v));
  std::vector<double> state(static_cast<size_t>(c.batch * c.kv_heads * c.d_k * c.d_v), 0.0);
  if (c.past) state.assign(in.past.begin(), in.past.end());
  const auto S = [&](int64_t b, int64_t h, int64_t i, int64_t m) -> double& {
    return state[static_cast<size_t>(((b * c.kv_heads + h) * c.d_k + i) * c.d_v + m)];
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t t = 0; t < c.seq; ++t) {
      const int64_t bt = b * c.seq + t;
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        const auto key = [&](int64_t i) { return double{in.k[static_cast<size_t>((bt * c.kv_heads + h) * c.d_k + i)]}; };
        std::vector<double> u(static_cast<size_t>(c.d_v));
        for (int64_t m = 0; m < c.d_v; ++m) u[m] = in.v[static_cast<size_t>((bt * c.kv_heads + h) * c.d_v + m)];
        if (gated) {
          for (int64_t i = 0; i < c.d_k; ++i) {
            const size_t at = c.decay_per_key ? static_cast<size_t>((bt * c.kv_heads + h) * c.d_k + i)
                                              : static_cast<size_t>(bt * c.kv_heads + h);
            for (int64_t m = 0; m < c.d_v; ++m) S(b, h, i, m) *= std::exp(double{in.decay[at]});
          }
        }
        if (delta) {
          const double beta = in.beta[static_cast<size_t>(bt * c.beta_heads + (c.beta_heads == 1 ? 0 : h))];
          for (int64_t m = 0; m < c.d_v; ++m) {
            double retrieved = 0;
            for (int64_t i = 0; i < c.d_k; ++i) retrieved += S(b, h, i, m) * key(i);
            u[m] = beta * (u[m] - retrieved);
          }
        }
        for (int64_t i = 0; i < c.d_k; ++i) {
          for (int64_t m = 0; m < c.d_v; ++m) S(b, h, i, m) += key(i) * u[m];
        }
      }
      for (int64_t hq = 0; hq < c.q_heads; ++hq) {
        const int64_t h = hq / (c.q_heads / c.kv_heads);
        for (int64_t m = 0; m < c.d_v; ++m) {
          double sum = 0;
          for (int64_t i = 0; i < c.d_k; ++i) sum += in.q[static_cast<size_t>((bt * c.q_heads + hq) * c.d_k + i)] * S(b, h, i, m);
          y[static_cast<size_t>((bt * c.q_heads + hq) * c.d_v + m)] = scale * sum;
        }
      }
    }
  }
  return {y, state};
}

std::vector<Operand> linearOperands(const LinearCase& c, const LinearInputs& in) {
  const bool gated = c.rule == "gated" || c.rule == "gated_delta";
  const bool delta = c.rule == "delta" || c.rule == "gated_delta";
  return {operand<float>({c.batch, c.seq, c.q_heads * c.d_k}, in.q),
          operand<float>({c.batch, c.seq, c.kv_heads * c.d_k}, in.k),
          operand<float>({c.batch, c.seq, c.kv_heads * c.d_v}, in.v),
          c.past ? operand<float>({c.batch, c.kv_heads, c.d_k, c.d_v}, in.past) : omitted(),
          gated ? operand<float>({c.batch, c.seq, c.decay_per_key ? c.kv_heads * c.d_k : c.kv_heads}, in.decay) : omitted(),
          delta ? operand<float>({c.batch, c.seq, c.beta_heads}, in.beta) : omitted()};
}

ParamMap linearParams(const LinearCase& c) {
  return params({{"q_num_heads", c.q_heads}, {"kv_num_heads", c.kv_heads}, {"update_rule", c.rule}, {"scale", c.scale}});
}

void checkLinear(const LinearCase& c) {
  const LinearInputs in = linearInputs(c);
  std::vector<Operand> inputs = linearOperands(c, in);
  std::vector<Operand> outputs = {output(DType::kF32, {c.batch, c.seq, c.q_heads * c.d_v}),
                                  output(DType::kF32, {c.batch, c.kv_heads, c.d_k, c.d_v})};
  PreparedKernel kernel("LinearAttention", inputs, outputs, linearParams(c));
  kernel.run(inputs, outputs);
  const auto [y, state] = referenceLinear(c, in);
  expectNear(outputs[0].values<float>(), y, 1e-5);
  expectNear(outputs[1].values<float>(), state, 1e-5);
}

TEST(LinearAttention, GatedDeltaGroupedPerKeyDecayWithPast) { checkLinear(LinearCase{}); }

TEST(LinearAttention, EachRule) {
  for (const char* rule : {"linear", "gated", "delta"}) {
    SCOPED_TRACE(rule);
    LinearCase c;
    c.rule = rule;
    c.past = false;
    c.decay_per_key = false;
    checkLinear(c);
  }
}

TEST(LinearAttention, ScalarBetaExplicitScaleMultiQuery) {
  LinearCase c;
  c.kv_heads = 1;
  c.beta_heads = 1;
  c.scale = 0.25;
  c.seq = 1;
  checkLinear(c);
}

TEST(LinearAttention, WithoutPresentStateOutput) {
  const LinearCase c;
  const LinearInputs in = linearInputs(c);
  std::vector<Operand> inputs = linearOperands(c, in);
  std::vector<Operand> outputs = {output(DType::kF32, {c.batch, c.seq, c.q_heads * c.d_v})};
  PreparedKernel kernel("LinearAttention", inputs, outputs, linearParams(c));
  kernel.run(inputs, outputs);
  kernel.run(inputs, outputs);  // the scratch state starts again from past_state
  expectNear(outputs[0].values<float>(), referenceLinear(c, in).first, 1e-5);
}

TEST(LinearAttention, HalfInputsWithFloatState) {
  LinearCase c;
  c.rule = "linear";
  const LinearInputs in = linearInputs(c);
  auto half = [](Ints shape, const std::vector<float>& values) {
    std::vector<uint16_t> bits;
    for (float v : values) bits.push_back(fp::floatToHalf(v));
    Operand op = operand<uint16_t>(std::move(shape), bits);
    op.info.dtype = DType::kF16;
    return op;
  };
  // The reference sees the inputs as rounded to f16.
  LinearInputs rounded = in;
  for (auto* values : {&rounded.q, &rounded.k, &rounded.v}) {
    for (float& v : *values) v = fp::halfToFloat(fp::floatToHalf(v));
  }
  std::vector<Operand> inputs = {half({c.batch, c.seq, c.q_heads * c.d_k}, in.q),
                                 half({c.batch, c.seq, c.kv_heads * c.d_k}, in.k),
                                 half({c.batch, c.seq, c.kv_heads * c.d_v}, in.v),
                                 operand<float>({c.batch, c.kv_heads, c.d_k, c.d_v}, in.past)};
  std::vector<Operand> outputs = {output(DType::kF16, {c.batch, c.seq, c.q_heads * c.d_v}),
                                  output(DType::kF32, {c.batch, c.kv_heads, c.d_k, c.d_v})};
  PreparedKernel kernel("LinearAttention", inputs, outputs, linearParams(c));
  kernel.run(inputs, outputs);
  const auto [y, state] = referenceLinear(c, rounded);
  std::vector<float> got;
  for (uint16_t bits : outputs[0].values<uint16_t>()) got.push_back(fp::halfToFloat(bits));
  expectNear(got, y, 2e-3);
  expectNear(outputs[1].values<float>(), state, 1e-5);
}

TEST(LinearAttention, Errors) {
  LinearCase c;
  const LinearInputs in = linearInputs(c);
  const std::vector<Operand> outputs = {output(DType::kF32, {c.batch, c.seq, c.q_heads * c.d_v}),
                                        output(DType::kF32, {c.batch, c.kv_heads, c.d_k, c.d_v})};
  std::vector<Operand> inputs = linearOperands(c, in);
  EXPECT_THAT(prepareError("LinearAttention", inputs, outputs, params({{"q_num_heads", int64_t{3}}, {"kv_num_heads", int64_t{2}}})),
              HasSubstr("must be a positive multiple of kv_num_heads"));
  ParamMap linear = linearParams(c);
  linear.set("update_rule", std::string("linear"));
  EXPECT_THAT(prepareError("LinearAttention", inputs, outputs, linear), HasSubstr("'linear' forbids decay"));
  inputs[3] = operand<float>({c.batch, c.kv_heads, c.d_v, c.d_k}, in.past);
  EXPECT_THAT(prepareError("LinearAttention", inputs, outputs, linearParams(c)), HasSubstr("past_state must be [2, 2, 3, 2]"));
  inputs = linearOperands(c, in);
  inputs[0] = operand<int64_t>({1}, {0});
  EXPECT_THAT(prepareError("LinearAttention", inputs, outputs, linearParams(c)), HasSubstr("no kernel for i64[1] query"));
}

// ------------------------------------------------------- CausalConvWithState

struct ConvCase {
  int64_t batch = 2, channels = 3, length = 5, taps = 4;
  bool bias = true, past = true, silu = false;
};

void checkConv(const ConvCase& c) {
  const int64_t carry = c.taps - 1;
  const auto x = randomValues<float>(static_cast<size_t>(c.batch * c.channels * c.length), 11, -2, 2);
  const auto w = randomValues<float>(static_cast<size_t>(c.channels * c.taps), 12, -1, 1);
  const auto bias = randomValues<float>(static_cast<size_t>(c.channels), 13, -1, 1);
  const auto past = randomValues<float>(static_cast<size_t>(c.batch * c.channels * carry), 14, -2, 2);
  std::vector<Operand> inputs = {operand<float>({c.batch, c.channels, c.length}, x),
                                 operand<float>({c.channels, 1, c.taps}, w),
                                 c.bias ? operand<float>({c.channels}, bias) : omitted(),
                                 c.past ? operand<float>({c.batch, c.channels, carry}, past) : omitted()};
  std::vector<Operand> outputs = {output(DType::kF32, {c.batch, c.channels, c.length}),
                                  output(DType::kF32, {c.batch, c.channels, carry})};
  PreparedKernel kernel("CausalConvWithState", inputs, outputs,
                        params({{"activation", std::string(c.silu ? "silu" : "none")}}));
  kernel.run(inputs, outputs);
  std::vector<double> want_y, want_state;
  for (int64_t row = 0; row < c.batch * c.channels; ++row) {
    const int64_t ch = row % c.channels;
    std::vector<double> padded;  // [past or zeros | x]
    for (int64_t j = 0; j < carry; ++j) padded.push_back(c.past ? past[static_cast<size_t>(row * carry + j)] : 0.0);
    for (int64_t l = 0; l < c.length; ++l) padded.push_back(x[static_cast<size_t>(row * c.length + l)]);
    for (int64_t l = 0; l < c.length; ++l) {
      double sum = c.bias ? bias[static_cast<size_t>(ch)] : 0.0;
      for (int64_t i = 0; i < c.taps; ++i) sum += w[static_cast<size_t>(ch * c.taps + i)] * padded[static_cast<size_t>(l + i)];
      want_y.push_back(c.silu ? sum / (1 + std::exp(-sum)) : sum);
    }
    want_state.insert(want_state.end(), padded.end() - carry, padded.end());
  }
  expectNear(outputs[0].values<float>(), want_y, 1e-5);
  expectNear(outputs[1].values<float>(), want_state, 0);
}

TEST(CausalConvWithState, BiasPastAndSilu) {
  checkConv(ConvCase{});
  checkConv(ConvCase{.silu = true});
}

TEST(CausalConvWithState, InputShorterThanTheCarryWithoutPast) {
  checkConv(ConvCase{.length = 2, .taps = 4, .bias = false, .past = false});
}

TEST(CausalConvWithState, KernelSizeOneKeepsNoState) { checkConv(ConvCase{.taps = 1}); }

TEST(CausalConvWithState, Errors) {
  const std::vector<Operand> outputs = {output(DType::kF32, {1, 2, 3}), output(DType::kF32, {1, 2, 1})};
  const Operand x = operand<float>({1, 2, 3}, std::vector<float>(6, 1));
  EXPECT_THAT(prepareError("CausalConvWithState", {x, operand<float>({2, 2, 2}, std::vector<float>(8, 1))}, outputs),
              HasSubstr("weight must be [2, 1, k]"));
  const Operand w = operand<float>({2, 1, 2}, std::vector<float>(4, 1));
  EXPECT_THAT(prepareError("CausalConvWithState", {x, w, omitted(), operand<float>({1, 2, 2}, std::vector<float>(4, 1))}, outputs),
              HasSubstr("past_state must be [1, 2, 1]"));
  EXPECT_THAT(prepareError("CausalConvWithState", {x, w}, outputs, params({{"activation", std::string("gelu")}})),
              HasSubstr("activation 'gelu'"));
}

}  // namespace
}  // namespace kiln
