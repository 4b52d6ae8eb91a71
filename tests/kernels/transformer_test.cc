// Attention, RotaryEmbedding, RMSNormalization and SwiGLU against references
// written here plainly (Attention: the whole score row, then softmax, as
// onnx/reference/ops/op_attention.py does).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/float_staging.h"
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

void expectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << "element " << i;
  }
}

// ---------------------------------------------------------------- Attention

struct AttentionCase {
  int64_t batch = 1, q_heads = 2, kv_heads = 2, q_seq = 3, kv_seq = 4, past = 0, head = 4, v_head = 5;
  bool causal = false;
  double softcap = 0;
  std::vector<bool> mask;  // [q_seq, total] when not empty
};

// Reference, 4-D layouts, in double: Y, present_key, scores (mode 3).
struct AttentionResult {
  std::vector<double> y, present_key, probabilities;
};

AttentionResult referenceAttention(const AttentionCase& c, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<float>& past_k,
                                   const std::vector<float>& past_v) {
  const int64_t total = c.past + c.kv_seq;
  AttentionResult r;
  r.y.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_seq * c.v_head), 0.0);
  r.probabilities.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_seq * total), 0.0);
  auto key = [&](int64_t b, int64_t h, int64_t j, int64_t e) -> double {
    return j < c.past ? past_k[static_cast<size_t>(((b * c.kv_heads + h) * c.past + j) * c.head + e)]
                      : k[static_cast<size_t>(((b * c.kv_heads + h) * c.kv_seq + j - c.past) * c.head + e)];
  };
  auto value = [&](int64_t b, int64_t h, int64_t j, int64_t e) -> double {
    return j < c.past ? past_v[static_cast<size_t>(((b * c.kv_heads + h) * c.past + j) * c.v_head + e)]
                      : v[static_cast<size_t>(((b * c.kv_heads + h) * c.kv_seq + j - c.past) * c.v_head + e)];
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      for (int64_t j = 0; j < total; ++j) {
        for (int64_t e = 0; e < c.head; ++e) r.present_key.push_back(key(b, h, j, e));
      }
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head));
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      const int64_t kv = h / (c.q_heads / c.kv_heads);
      for (int64_t i = 0; i < c.q_seq; ++i) {
        std::vector<double> z(static_cast<size_t>(total));
        double max = -INFINITY;
        bool any = false;
        for (int64_t j = 0; j < total; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < c.head; ++e) {
            dot += q[static_cast<size_t>(((b * c.q_heads + h) * c.q_seq + i) * c.head + e)] * key(b, kv, j, e);
          }
          double s = dot * scale;
          if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
          bool allowed = !(c.causal && j > i + c.past);
          if (!c.mask.empty()) allowed = allowed && c.mask[static_cast<size_t>(i * total + j)];
          z[static_cast<size_t>(j)] = allowed ? s : -INFINITY;
          any = any || allowed;
          if (allowed) max = std::max(max, s);
        }
        if (!any) continue;
        double sum = 0;
        for (double& x : z) sum += (x = std::exp(x - max));
        for (int64_t j = 0; j < total; ++j) {
          const double p = z[static_cast<size_t>(j)] / sum;
          r.probabilities[static_cast<size_t>(((b * c.q_heads + h) * c.q_seq + i) * total + j)] = p;
          for (int64_t e = 0; e < c.v_head; ++e) {
            r.y[static_cast<size_t>(((b * c.q_heads + h) * c.q_seq + i) * c.v_head + e)] += p * value(b, kv, j, e);
          }
        }
      }
    }
  }
  return r;
}

void checkAttention(const AttentionCase& c) {
  const int64_t total = c.past + c.kv_seq;
  const Ints qs{c.batch, c.q_heads, c.q_seq, c.head}, ks{c.batch, c.kv_heads, c.kv_seq, c.head},
      vs{c.batch, c.kv_heads, c.kv_seq, c.v_head};
  const Ints pks{c.batch, c.kv_heads, c.past, c.head}, pvs{c.batch, c.kv_heads, c.past, c.v_head};
  const auto q = randomValues<float>(elementCount(qs), 1, -2, 2);
  const auto k = randomValues<float>(elementCount(ks), 2, -2, 2);
  const auto v = randomValues<float>(elementCount(vs), 3, -2, 2);
  const auto pk = randomValues<float>(elementCount(pks), 4, -2, 2);
  const auto pv = randomValues<float>(elementCount(pvs), 5, -2, 2);
  std::vector<Operand> inputs = {operand(qs, q), operand(ks, k), operand(vs, v), omitted()};
  if (!c.mask.empty()) {
    std::vector<uint8_t> bytes(c.mask.begin(), c.mask.end());
    Operand mask = operand<uint8_t>({c.q_seq, total}, bytes);
    mask.info.dtype = DType::kBool;
    inputs[3] = mask;
  }
  if (c.past > 0) {
    inputs.push_back(operand(pks, pk));
    inputs.push_back(operand(pvs, pv));
  }
  std::vector<Operand> outputs = {output(DType::kF32, {c.batch, c.q_heads, c.q_seq, c.v_head}),
                                  output(DType::kF32, {c.batch, c.kv_heads, total, c.head}),
                                  output(DType::kF32, {c.batch, c.kv_heads, total, c.v_head}),
                                  output(DType::kF32, {c.batch, c.q_heads, c.q_seq, total})};
  ParamMap p = params({{"is_causal", int64_t{c.causal}}, {"qk_matmul_output_mode", int64_t{3}}});
  if (c.softcap > 0) p.set("softcap", c.softcap);
  PreparedKernel kernel("Attention", inputs, outputs, p);
  kernel.run(inputs, outputs);
  const AttentionResult want = referenceAttention(c, q, k, v, pk, pv);
  expectNear(outputs[0].values<float>(), want.y, 1e-5);
  expectNear(outputs[1].values<float>(), want.present_key, 0);
  expectNear(outputs[3].values<float>(), want.probabilities, 1e-5);
  // Y alone: the blocked fast path where the case allows it (no past, no
  // softcap), the per-row path otherwise; the same values either way.
  std::vector<Operand> y_only = {output(DType::kF32, {c.batch, c.q_heads, c.q_seq, c.v_head})};
  ParamMap y_params = params({{"is_causal", int64_t{c.causal}}});
  if (c.softcap > 0) y_params.set("softcap", c.softcap);
  PreparedKernel("Attention", inputs, y_only, y_params).run(inputs, y_only);
  expectNear(y_only[0].values<float>(), want.y, 1e-5);
}

TEST(AttentionKernel, MultiHead) { checkAttention({}); }

TEST(AttentionKernel, GroupedQueryCausalWithPast) {
  AttentionCase c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.past = 3;
  c.causal = true;
  checkAttention(c);
}

TEST(AttentionKernel, SoftcapAndBoolMaskWithFullyMaskedRow) {
  AttentionCase c;
  c.softcap = 2.0;
  // Row 1 masks every key: its Y and probabilities are 0.
  c.mask = {true, false, true, true, false, false, false, false, true, true, false, true};
  checkAttention(c);
}

// Long sequences (one task per head with enough heads; blocks of 64 queries
// per task with few), key counts and head sizes that are not whole vectors,
// grouped heads, a causal frontier and a mask with a fully masked row.
TEST(AttentionKernel, LongSequencesAndOddSizes) {
  AttentionCase c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_seq = 70;
  c.kv_seq = 37;
  c.head = 40;
  c.v_head = 24;
  checkAttention(c);
  c.causal = true;
  checkAttention(c);
  // Two heads only: each head's queries split over several tasks.
  c.batch = 1;
  c.q_heads = 2;
  c.kv_heads = 1;
  c.q_seq = 150;
  checkAttention(c);
  c.causal = false;
  c.q_seq = 5;
  c.mask.assign(static_cast<size_t>(c.q_seq * c.kv_seq), true);
  for (int64_t j = 0; j < c.kv_seq; ++j) c.mask[static_cast<size_t>(2 * c.kv_seq + j)] = false;  // row 2
  for (int64_t j = 30; j < c.kv_seq; ++j) c.mask[static_cast<size_t>(4 * c.kv_seq + j)] = false;
  checkAttention(c);
}

// 3-D layouts: [batch, seq, heads * size] in and out, same values as 4-D.
TEST(AttentionKernel, ThreeDimensionalLayoutMatchesFourDimensional) {
  const int64_t b = 1, h = 2, s = 3, d = 2;
  const auto q = randomValues<float>(static_cast<size_t>(b * h * s * d), 7, -1, 1);
  const auto k = randomValues<float>(static_cast<size_t>(b * h * s * d), 8, -1, 1);
  const auto v = randomValues<float>(static_cast<size_t>(b * h * s * d), 9, -1, 1);
  // [b, h, s, d] -> [b, s, h * d]
  auto to3d = [&](const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t ss = 0; ss < s; ++ss)
        for (int64_t dd = 0; dd < d; ++dd) out[static_cast<size_t>((ss * h + hh) * d + dd)] = x[static_cast<size_t>((hh * s + ss) * d + dd)];
    return out;
  };
  std::vector<Operand> in4 = {operand<float>({b, h, s, d}, q), operand<float>({b, h, s, d}, k), operand<float>({b, h, s, d}, v)};
  std::vector<Operand> out4 = {output(DType::kF32, {b, h, s, d})};
  PreparedKernel("Attention", in4, out4).run(in4, out4);
  std::vector<Operand> in3 = {operand<float>({b, s, h * d}, to3d(q)), operand<float>({b, s, h * d}, to3d(k)),
                              operand<float>({b, s, h * d}, to3d(v))};
  std::vector<Operand> out3 = {output(DType::kF32, {b, s, h * d})};
  PreparedKernel("Attention", in3, out3, params({{"q_num_heads", h}, {"kv_num_heads", h}})).run(in3, out3);
  EXPECT_EQ(out3[0].values<float>(), to3d(out4[0].values<float>()));
}

TEST(AttentionKernel, Errors) {
  std::vector<Operand> inputs = {output(DType::kF32, {1, 2, 3, 4}), output(DType::kF32, {1, 2, 3, 4}),
                                 output(DType::kF32, {1, 2, 3, 4})};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 2, 3, 4})};
  EXPECT_THAT(prepareError("Attention", inputs, outputs, params({{"qk_matmul_output_mode", int64_t{5}}})),
              HasSubstr("qk_matmul_output_mode 5"));
  std::vector<Operand> ints = {output(DType::kI32, {1, 2, 3, 4}), output(DType::kI32, {1, 2, 3, 4}),
                               output(DType::kI32, {1, 2, 3, 4})};
  EXPECT_THAT(prepareError("Attention", ints, outputs), HasSubstr("no kernel for i32"));
  std::vector<Operand> three = {output(DType::kF32, {1, 3, 8}), output(DType::kF32, {1, 3, 8}),
                                output(DType::kF32, {1, 3, 8})};
  EXPECT_THAT(prepareError("Attention", three, {output(DType::kF32, {1, 3, 8})}), HasSubstr("q_num_heads"));
  inputs.push_back(output(DType::kF32, {1, 1, 3, 9}));  // longer than the 3 keys
  EXPECT_THAT(prepareError("Attention", inputs, outputs), HasSubstr("longer than the 3 keys"));
}

// f16 runs through f32 and rounds once at the end.
TEST(AttentionKernel, Float16) {
  const std::vector<float> values = {0.5f, -1.0f, 0.25f, 2.0f};
  std::vector<uint16_t> half;
  for (float v : values) half.push_back(fp::floatToHalf(v));
  auto f16 = [&](Ints shape) {
    Operand op = operand<uint16_t>(std::move(shape), half);
    op.info.dtype = DType::kF16;
    return op;
  };
  std::vector<Operand> inputs = {f16({1, 1, 2, 2}), f16({1, 1, 2, 2}), f16({1, 1, 2, 2})};
  std::vector<Operand> outputs = {output(DType::kF16, {1, 1, 2, 2})};
  std::vector<Operand> inputs32 = {operand<float>({1, 1, 2, 2}, values), operand<float>({1, 1, 2, 2}, values),
                                   operand<float>({1, 1, 2, 2}, values)};
  std::vector<Operand> outputs32 = {output(DType::kF32, {1, 1, 2, 2})};
  PreparedKernel("Attention", inputs, outputs).run(inputs, outputs);
  PreparedKernel("Attention", inputs32, outputs32).run(inputs32, outputs32);
  const auto got = outputs[0].values<uint16_t>();
  const auto want = outputs32[0].values<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], fp::floatToHalf(want[i])) << i;
}

// ---------------------------------------------------------- RotaryEmbedding

TEST(RotaryEmbeddingKernel, HalvesAndInterleavedWithPositions) {
  // One batch, one position, one head of 4: rotate (x0, x2) and (x1, x3), or
  // (x0, x1) and (x2, x3) interleaved, by the cached angle of position 1.
  const std::vector<float> x = {1, 2, 3, 4};
  const float c0 = 0.6f, s0 = 0.8f, c1 = 0.0f, s1 = 1.0f;
  const std::vector<float> cos = {1, 1, c0, c1};  // [2 positions, 2]
  const std::vector<float> sin = {0, 0, s0, s1};
  for (bool interleaved : {false, true}) {
    std::vector<Operand> inputs = {operand<float>({1, 1, 1, 4}, x), operand<float>({2, 2}, cos),
                                   operand<float>({2, 2}, sin), operand<int64_t>({1, 1}, {1})};
    std::vector<Operand> outputs = {output(DType::kF32, {1, 1, 1, 4})};
    PreparedKernel("RotaryEmbedding", inputs, outputs, params({{"interleaved", int64_t{interleaved}}}))
        .run(inputs, outputs);
    const std::vector<float> want =
        interleaved ? std::vector<float>{c0 * 1 - s0 * 2, s0 * 1 + c0 * 2, c1 * 3 - s1 * 4, s1 * 3 + c1 * 4}
                    : std::vector<float>{c0 * 1 - s0 * 3, c1 * 2 - s1 * 4, s0 * 1 + c0 * 3, s1 * 2 + c1 * 4};
    EXPECT_EQ(outputs[0].values<float>(), want) << interleaved;
  }
}

TEST(RotaryEmbeddingKernel, PartialRotationKeepsTheRest) {
  // 3-D input [1, 1, 2 heads * 4], rotary_embedding_dim 2: only (x0, x1) turn.
  std::vector<Operand> inputs = {operand<float>({1, 1, 8}, {1, 2, 3, 4, 5, 6, 7, 8}), operand<float>({1, 1, 1}, {0}),
                                 operand<float>({1, 1, 1}, {1})};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 1, 8})};
  PreparedKernel("RotaryEmbedding", inputs, outputs, params({{"num_heads", int64_t{2}}, {"rotary_embedding_dim", int64_t{2}}}))
      .run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{-2, 1, 3, 4, -6, 5, 7, 8}));
  EXPECT_THAT(prepareError("RotaryEmbedding", inputs, outputs, params({{"num_heads", int64_t{3}}})),
              HasSubstr("num_heads"));
}

// --------------------------------------------------------- RMSNormalization

TEST(RmsNormalizationKernel, NormalisesFromTheAxis) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<Operand> inputs = {operand<float>({2, 3}, x), operand<float>({3}, {1, 2, 0.5f})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 3})};
  PreparedKernel("RMSNormalization", inputs, outputs, params({{"epsilon", 0.0}})).run(inputs, outputs);
  std::vector<double> want;
  const double scale[3] = {1, 2, 0.5};
  for (int r = 0; r < 2; ++r) {
    double squares = 0;
    for (int e = 0; e < 3; ++e) squares += x[static_cast<size_t>(r * 3 + e)] * x[static_cast<size_t>(r * 3 + e)];
    for (int e = 0; e < 3; ++e) want.push_back(x[static_cast<size_t>(r * 3 + e)] / std::sqrt(squares / 3) * scale[e]);
  }
  expectNear(outputs[0].values<float>(), want, 1e-6);
  // axis 0 with a scale broadcast over the last axis.
  std::vector<Operand> whole = {operand<float>({2, 3}, x), operand<float>({1, 3}, {1, 1, 1})};
  PreparedKernel("RMSNormalization", whole, outputs, params({{"axis", int64_t{0}}, {"epsilon", 0.0}})).run(whole, outputs);
  double squares = 0;
  for (float v : x) squares += v * v;
  EXPECT_NEAR(outputs[0].values<float>()[5], 6 / std::sqrt(squares / 6), 1e-6);
  std::vector<Operand> bad = {operand<float>({2, 3}, x), operand<float>({2}, {1, 1})};
  EXPECT_THAT(prepareError("RMSNormalization", bad, outputs), HasSubstr("does not broadcast"));
}

// ------------------------------------------------------------------- SwiGLU

TEST(SwigluKernel, GatesBByTheSwishOfA) {
  std::vector<Operand> inputs = {operand<float>({3}, {0, 1, -2}), operand<float>({3}, {5, 2, 3})};
  std::vector<Operand> outputs = {output(DType::kF32, {3})};
  PreparedKernel("SwiGLU", inputs, outputs, params({{"alpha", 0.5}})).run(inputs, outputs);
  auto swish = [](double a) { return a / (1 + std::exp(-0.5 * a)); };
  expectNear(outputs[0].values<float>(), {0, swish(1) * 2, swish(-2) * 3}, 1e-6);
  std::vector<Operand> mismatched = {operand<float>({3}, {0, 1, 2}), operand<float>({1}, {1})};
  EXPECT_THAT(prepareError("SwiGLU", mismatched, outputs), HasSubstr("no broadcasting"));
}

}  // namespace
}  // namespace kiln
