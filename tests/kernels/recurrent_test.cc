// RNN, GRU and LSTM against the ONNX equations written out per step here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
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

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

// Sizes: 3 steps, batch 2, input 2, hidden 2, one direction.
constexpr int64_t kSeq = 3, kBatch = 2, kInput = 2, kHidden = 2;

// Row `row` of W x + R h + Wb + Rb for batch b.
double pre(const std::vector<float>& w, const std::vector<float>& r, const std::vector<float>& bias, int64_t gates,
           int64_t row, const float* x, const std::vector<double>& h) {
  double v = bias[static_cast<size_t>(row)] + bias[static_cast<size_t>(gates * kHidden + row)];
  for (int64_t i = 0; i < kInput; ++i) v += w[static_cast<size_t>(row * kInput + i)] * x[i];
  for (int64_t j = 0; j < kHidden; ++j) v += r[static_cast<size_t>(row * kHidden + j)] * h[static_cast<size_t>(j)];
  return v;
}

// Runs `op` forward (or reverse) and checks Y and Y_h against `cell`, which
// updates h (and c) for one step.
template <typename Cell>
void checkRecurrent(const std::string& op, int64_t gates, bool reverse, const ParamMap& extra, Cell cell,
                    bool zero_bias = false) {
  const auto x = randomValues<float>(static_cast<size_t>(kSeq * kBatch * kInput), 1, -1, 1);
  const auto w = randomValues<float>(static_cast<size_t>(gates * kHidden * kInput), 2, -1, 1);
  const auto r = randomValues<float>(static_cast<size_t>(gates * kHidden * kHidden), 3, -1, 1);
  const auto bias = zero_bias ? std::vector<float>(static_cast<size_t>(2 * gates * kHidden), 0.0f)
                              : randomValues<float>(static_cast<size_t>(2 * gates * kHidden), 4, -1, 1);
  std::vector<Operand> inputs = {operand<float>({kSeq, kBatch, kInput}, x), operand<float>({1, gates * kHidden, kInput}, w),
                                 operand<float>({1, gates * kHidden, kHidden}, r),
                                 operand<float>({1, 2 * gates * kHidden}, bias)};
  std::vector<Operand> outputs = {output(DType::kF32, {kSeq, 1, kBatch, kHidden}), output(DType::kF32, {1, kBatch, kHidden})};
  ParamMap p = extra;
  p.set("hidden_size", kHidden);
  if (reverse) p.set("direction", std::string("reverse"));
  PreparedKernel(op, inputs, outputs, p).run(inputs, outputs);
  std::vector<double> want_y(static_cast<size_t>(kSeq * kBatch * kHidden)), want_h;
  for (int64_t b = 0; b < kBatch; ++b) {
    std::vector<double> h(kHidden, 0.0), c(kHidden, 0.0);
    for (int64_t i = 0; i < kSeq; ++i) {
      const int64_t t = reverse ? kSeq - 1 - i : i;
      const float* xt = x.data() + (t * kBatch + b) * kInput;
      cell([&](int64_t row, const std::vector<double>& hh) { return pre(w, r, bias, gates, row, xt, hh); }, h, c);
      for (int64_t j = 0; j < kHidden; ++j) want_y[static_cast<size_t>((t * kBatch + b) * kHidden + j)] = h[static_cast<size_t>(j)];
    }
    want_h.insert(want_h.end(), h.begin(), h.end());
  }
  const auto y = outputs[0].values<float>();
  const auto y_h = outputs[1].values<float>();
  for (size_t i = 0; i < want_y.size(); ++i) EXPECT_NEAR(y[i], want_y[i], 1e-5) << op << " Y " << i;
  for (size_t i = 0; i < want_h.size(); ++i) EXPECT_NEAR(y_h[i], want_h[i], 1e-5) << op << " Y_h " << i;
}

TEST(RecurrentKernel, RnnForwardAndReverse) {
  for (bool reverse : {false, true}) {
    checkRecurrent("RNN", 1, reverse, {}, [](auto pre_of, std::vector<double>& h, std::vector<double>&) {
      std::vector<double> next(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) next[static_cast<size_t>(j)] = std::tanh(pre_of(j, h));
      h = next;
    });
  }
}

TEST(RecurrentKernel, GruWithAndWithoutLinearBeforeReset) {
  for (int64_t linear : {0, 1}) {
    ParamMap p;
    p.set("linear_before_reset", linear);
    // Without linear_before_reset the candidate uses R (r * h); with it,
    // r * (R h + Rb). With linear_before_reset the biases are 0, so that the
    // helper's rows (which include both biases) give r * R h exactly.
    checkRecurrent("GRU", 3, false, p, [linear](auto pre_of, std::vector<double>& h, std::vector<double>&) {
      std::vector<double> z(kHidden), r(kHidden), next(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) {
        z[static_cast<size_t>(j)] = sigmoid(pre_of(j, h));
        r[static_cast<size_t>(j)] = sigmoid(pre_of(kHidden + j, h));
      }
      std::vector<double> rh(kHidden), zero(kHidden, 0.0);
      for (int64_t j = 0; j < kHidden; ++j) rh[static_cast<size_t>(j)] = r[static_cast<size_t>(j)] * h[static_cast<size_t>(j)];
      for (int64_t j = 0; j < kHidden; ++j) {
        const int64_t row = 2 * kHidden + j;
        double v;
        if (linear == 0) {
          v = pre_of(row, rh);
        } else {  // W x + r * (R h), the biases being 0 in this case
          v = pre_of(row, zero) + r[static_cast<size_t>(j)] * (pre_of(row, h) - pre_of(row, zero));
        }
        next[static_cast<size_t>(j)] = std::tanh(v);
      }
      for (int64_t j = 0; j < kHidden; ++j) {
        const auto k = static_cast<size_t>(j);
        h[k] = (1 - z[k]) * next[k] + z[k] * h[k];
      }
    }, linear == 1);
  }
}

TEST(RecurrentKernel, LstmForward) {
  checkRecurrent("LSTM", 4, false, {}, [](auto pre_of, std::vector<double>& h, std::vector<double>& c) {
    std::vector<double> next(kHidden);
    for (int64_t j = 0; j < kHidden; ++j) {
      const auto k = static_cast<size_t>(j);
      const double i = sigmoid(pre_of(j, h));
      const double o = sigmoid(pre_of(kHidden + j, h));
      const double f = sigmoid(pre_of(2 * kHidden + j, h));
      const double g = std::tanh(pre_of(3 * kHidden + j, h));
      c[k] = f * c[k] + i * g;
      next[k] = o * std::tanh(c[k]);
    }
    h = next;
  });
}

#if defined(_OPENMP)
// With 2+ threads and R of 1 MiB or more, LSTM and GRU split the hidden
// units across the threads (recurrent.cc, stepsAcrossThreads); one thread
// runs the plain loop. Both sum every column in the same order, so their
// outputs agree to rounding: bidirectional, batch 3 with one shorter
// sequence, 5 steps (odd: the last h is in the second buffer), with and
// without biases.
TEST(RecurrentKernel, HiddenSplitAcrossThreadsMatchesOneThread) {
  constexpr int64_t seq = 5, batch = 3, input = 24, hidden = 300;
  for (const auto& [op, gates, lbr, bias] :
       {std::tuple{"LSTM", 4, 0, true}, std::tuple{"GRU", 3, 0, true}, std::tuple{"GRU", 3, 1, true},
        std::tuple{"LSTM", 4, 0, false}, std::tuple{"GRU", 3, 1, false}}) {
    const int64_t g = gates * hidden;
    std::vector<Operand> inputs = {
        operand<float>({seq, batch, input}, randomValues<float>(seq * batch * input, 1, -1, 1)),
        operand<float>({2, g, input}, randomValues<float>(static_cast<size_t>(2 * g * input), 2, -0.2f, 0.2f)),
        operand<float>({2, g, hidden}, randomValues<float>(static_cast<size_t>(2 * g * hidden), 3, -0.1f, 0.1f)),
        bias ? operand<float>({2, 2 * g}, randomValues<float>(static_cast<size_t>(4 * g), 4, -0.5f, 0.5f))
             : omitted(),
        operand<int32_t>({batch}, {5, 2, 5})};
    ParamMap p;
    p.set("hidden_size", hidden);
    p.set("direction", std::string("bidirectional"));
    p.set("linear_before_reset", int64_t{lbr});
    std::vector<std::vector<float>> results;
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<Operand> outputs = {output(DType::kF32, {seq, 2, batch, hidden}), output(DType::kF32, {2, batch, hidden})};
      PreparedKernel(op, inputs, outputs, p).run(inputs, outputs);
      auto y = outputs[0].values<float>();
      const auto y_h = outputs[1].values<float>();
      y.insert(y.end(), y_h.begin(), y_h.end());
      results.push_back(y);
    }
    omp_set_num_threads(saved);
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      ASSERT_NEAR(results[1][i], results[0][i], 1e-5)
          << op << " linear_before_reset " << lbr << (bias ? "" : " without biases") << " at " << i;
    }
  }
}
#endif

TEST(RecurrentKernel, SequenceLengthsZeroTheTail) {
  // Batch 2 with lengths 1 and 0: batch 1 keeps its initial state, Y rows 0.
  std::vector<Operand> inputs = {operand<float>({2, 2, 1}, {1, 1, 1, 1}), operand<float>({1, 1, 1}, {1}),
                                 operand<float>({1, 1, 1}, {1}), omitted(), operand<int32_t>({2}, {1, 0}),
                                 operand<float>({1, 2, 1}, {0.5f, 0.25f})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 1, 2, 1}), output(DType::kF32, {1, 2, 1})};
  PreparedKernel("RNN", inputs, outputs, params({{"hidden_size", int64_t{1}}})).run(inputs, outputs);
  const float h = std::tanh(1.0f + 0.5f);
  EXPECT_THAT(outputs[0].values<float>(), ::testing::ElementsAre(::testing::FloatEq(h), 0.0f, 0.0f, 0.0f));
  EXPECT_THAT(outputs[1].values<float>(), ::testing::ElementsAre(::testing::FloatEq(h), 0.25f));
}

TEST(RecurrentKernel, Errors) {
  std::vector<Operand> inputs = {operand<float>({1, 1, 1}, {1}), operand<float>({1, 1, 1}, {1}),
                                 operand<float>({1, 1, 1}, {1})};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 1, 1, 1})};
  EXPECT_THAT(prepareError("RNN", inputs, outputs), HasSubstr("positive hidden_size"));
  EXPECT_THAT(prepareError("RNN", inputs, outputs, params({{"hidden_size", int64_t{2}}})), HasSubstr("W (input 1)"));
  EXPECT_THAT(prepareError("GRU", inputs, outputs, params({{"hidden_size", int64_t{1}}, {"direction", std::string("up")}})),
              HasSubstr("direction is 'up'"));
}

}  // namespace
}  // namespace kiln
