// MatMul and Gemm against double-precision references (matmul_reference.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/evaluate_once.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "core/float_formats.h"
#include "tests/kernels/matmul_reference.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
using ::kiln::testing::GemmCase;
using ::kiln::testing::gemmReference;
using ::kiln::testing::matches;
using ::kiln::testing::matmulReference;
using ::kiln::testing::matmulShape;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::Reference;
using ::kiln::testing::shapeText;

// ------------------------------------------------------------------- MatMul

void checkMatMul(const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape, uint32_t seed) {
  const std::vector<float> a = randomValues<float>(elementCount(a_shape), seed, -1, 1);
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), seed + 1, -1, 1);
  const std::vector<int64_t> out_shape = matmulShape(a_shape, b_shape);
  const Reference want = matmulReference(a_shape, a, b_shape, b);
  for (bool constant_b : {false, true}) {
    std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b, constant_b)};
    std::vector<Operand> outputs = {output(DType::kF32, out_shape)};
    PreparedKernel kernel("MatMul", inputs, outputs);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(), want))
        << shapeText(a_shape) << " x " << shapeText(b_shape) << (constant_b ? " (constant B)" : "");
    // A second run on new A values: nothing of the first call is kept.
    const std::vector<float> a2 = randomValues<float>(a.size(), seed + 2, -1, 1);
    inputs[0] = operand(a_shape, a2);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(), matmulReference(a_shape, a2, b_shape, b)))
        << shapeText(a_shape) << " x " << shapeText(b_shape) << " second run";
  }
}

TEST(MatMulKernel, TwoDimensional) {
  uint32_t seed = 1;
  for (const auto& [a, b] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{{{1, 1}, {1, 1}},
                                                                                               {{3, 5}, {5, 7}},
                                                                                               {{17, 33}, {33, 19}},
                                                                                               {{64, 128}, {128, 96}},
                                                                                               {{1, 300}, {300, 20}},
                                                                                               {{40, 1}, {1, 30}}}) {
    checkMatMul(a, b, seed += 10);
  }
}

TEST(MatMulKernel, OneDimensionalOperandsArePromoted) {
  uint32_t seed = 100;
  for (const auto& [a, b] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{5}, {5, 7}}, {{3, 5}, {5}}, {{5}, {5}}, {{6}, {2, 6, 4}}, {{2, 3, 6}, {6}}, {{2, 1, 3, 6}, {6}}}) {
    checkMatMul(a, b, seed += 10);
  }
}

TEST(MatMulKernel, BatchedWithBroadcastBatchDimensions) {
  uint32_t seed = 200;
  for (const auto& [a, b] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3, 4, 5}, {2, 3, 5, 6}},  // same batch
           {{2, 1, 4, 5}, {1, 3, 5, 6}},  // both broadcast
           {{4, 5}, {2, 3, 5, 6}},        // A shared
           {{2, 3, 4, 5}, {5, 6}},        // B shared: batch folds into M
           {{2, 3, 4, 5}, {1, 1, 5, 6}},  // B shared with explicit ones
           {{3, 1, 4, 5}, {2, 5, 6}},     // rank differs
           {{1, 4, 5}, {3, 5, 6}},        // A batch of one
           {{2, 3, 4, 5}, {1, 3, 5, 6}},  // B broadcast along the first
           {{2, 3, 2, 4, 5}, {2, 1, 2, 5, 6}}}) {
    checkMatMul(a, b, seed += 10);
  }
}

TEST(MatMulKernel, MoreDimensionsThanOneDnnTakesUseTheLoopKernel) {
  // 13 batch dimensions that alternate which operand broadcasts cannot be
  // collapsed: 15 dimensions, beyond oneDNN's 12.
  std::vector<int64_t> a, b;
  for (int d = 0; d < 13; ++d) {
    a.push_back(d % 2 == 0 ? 2 : 1);
    b.push_back(d % 2 == 0 ? 1 : 2);
  }
  a.insert(a.end(), {2, 3});
  b.insert(b.end(), {3, 2});
  checkMatMul(a, b, 300);
}

TEST(MatMulKernel, EmptyAndZeroK) {
  checkMatMul({0, 5}, {5, 3}, 400);
  checkMatMul({2, 0, 4, 5}, {5, 6}, 401);
  checkMatMul({4, 0}, {0, 3}, 402);  // K = 0: zeros
  checkMatMul({3, 0}, {0}, 403);
}

TEST(MatMulKernel, ConcurrentRunsOnOneState) {
  // More threads than the kernel's execution slots, so some wait for one.
  const std::vector<int64_t> a_shape = {32, 64}, b_shape = {64, 48};
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), 7, -1, 1);
  std::vector<Operand> inputs = {operand(a_shape, randomValues<float>(elementCount(a_shape), 8, -1, 1)),
                                 operand(b_shape, b, /*constant=*/true)};
  std::vector<Operand> outputs = {output(DType::kF32, {32, 48})};
  const PreparedKernel kernel("MatMul", inputs, outputs);
  constexpr int kThreads = 6;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<float> a = randomValues<float>(elementCount(a_shape), 1000 + t, -1, 1);
      std::vector<Operand> my_inputs = {operand(a_shape, a), operand(b_shape, b)};
      std::vector<Operand> my_outputs = {output(DType::kF32, {32, 48})};
      const Reference want = matmulReference(a_shape, a, b_shape, b);
      for (int i = 0; i < 20; ++i) {
        std::fill(my_outputs[0].bytes.begin(), my_outputs[0].bytes.end(), std::byte{0});
        kernel.run(my_inputs, my_outputs);
        if (!matches(my_outputs[0].values<float>(), want)) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

// The loop kernel in the other types: f64 against the double reference
// (exact to rounding), integers exactly, f16 to f16 precision.
TEST(MatMulKernel, OtherElementTypes) {
  const std::vector<int64_t> a_shape{2, 3, 17};
  const std::vector<int64_t> b_shape{17, 20};
  const std::vector<float> a = randomValues<float>(elementCount(a_shape), 11, -1, 1);
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), 12, -1, 1);
  const Reference want = matmulReference(a_shape, a, b_shape, b);
  const std::vector<int64_t> out_shape{2, 3, 20};
  {
    std::vector<Operand> inputs = {operand(a_shape, std::vector<double>(a.begin(), a.end())),
                                   operand(b_shape, std::vector<double>(b.begin(), b.end()))};
    std::vector<Operand> outputs = {output(DType::kF64, out_shape)};
    PreparedKernel("MatMul", inputs, outputs).run(inputs, outputs);
    const std::vector<double> got = outputs[0].values<double>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.values[i], 1e-12) << i;
  }
  {
    std::vector<uint16_t> a16;
    std::vector<uint16_t> b16;
    for (float v : a) a16.push_back(floatToHalf(v));
    for (float v : b) b16.push_back(floatToHalf(v));
    Operand a_op = operand(a_shape, a16);
    Operand b_op = operand(b_shape, b16);
    a_op.info.dtype = b_op.info.dtype = DType::kF16;
    std::vector<Operand> inputs = {a_op, b_op};
    std::vector<Operand> outputs = {output(DType::kF16, out_shape)};
    PreparedKernel("MatMul", inputs, outputs).run(inputs, outputs);
    const std::vector<uint16_t> got = outputs[0].values<uint16_t>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(halfToFloat(got[i]), want.values[i], 1e-2) << i;
  }
  {
    // Integers, 1-D B: [2, 3] x [3] -> [2].
    std::vector<Operand> inputs = {operand<int32_t>({2, 3}, {1, -2, 3, 4, 5, -6}), operand<int32_t>({3}, {7, 8, 9})};
    std::vector<Operand> outputs = {output(DType::kI32, {2})};
    PreparedKernel("MatMul", inputs, outputs).run(inputs, outputs);
    EXPECT_EQ(outputs[0].values<int32_t>(), (std::vector<int32_t>{7 - 16 + 27, 28 + 40 - 54}));
  }
}

TEST(MatMulKernel, PrepareErrors) {
  const Operand f23 = operand<float>({2, 3}, std::vector<float>(6, 1));
  const Operand f45 = operand<float>({4, 5}, std::vector<float>(20, 1));
  const Operand f35 = operand<float>({3, 5}, std::vector<float>(15, 1));
  EXPECT_EQ(prepareError("MatMul", {f23, f45}, {output(DType::kF32, {2, 5})}),
            "MatMul: f32[2, 3] x f32[4, 5]: the inner dimensions differ (3 and 4)");
  EXPECT_EQ(prepareError("MatMul", {f23, f35}, {output(DType::kF32, {2, 6})}),
            "MatMul: output is f32[2, 6] but the inputs give f32[2, 5]");
  EXPECT_EQ(
      prepareError("MatMul", {operand<int32_t>({2, 3}, std::vector<int32_t>(6)), f35}, {output(DType::kI32, {2, 5})}),
      "MatMul: no kernel for i32 inputs (supports f32; f64, f16, bf16, i32, i64, u32, u64 of one type); input 0 is "
      "i32[2, 3]");
  EXPECT_EQ(prepareError("MatMul", {operand<float>({}, {1}), f35}, {output(DType::kF32, {5})}),
            "MatMul: input 0 is a scalar; MatMul needs at least one dimension");
  EXPECT_EQ(prepareError(
                "MatMul",
                {operand<float>({2, 3, 4}, std::vector<float>(24)), operand<float>({5, 4, 6}, std::vector<float>(120))},
                {output(DType::kF32, {2, 3, 6})}),
            "MatMul: the batch dimensions of [2, 3, 4] and [5, 4, 6] do not broadcast (2 and 5)");
  Operand dynamic = f35;
  dynamic.info.shape = {kDynamicDim, 5};
  EXPECT_EQ(prepareError("MatMul", {f23, dynamic}, {output(DType::kF32, {2, 5})}),
            "MatMul: needs static shapes, input 1 is f32[?, 5]");
  EXPECT_EQ(prepareError("MatMul", {f23}, {output(DType::kF32, {2, 5})}), "MatMul: expects 2 inputs, got 1");
}


void checkGemm(const GemmCase& g, int64_t m, int64_t k, int64_t n, uint32_t seed) {
  const std::vector<int64_t> a_shape = g.trans_a ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
  const std::vector<int64_t> b_shape = g.trans_b ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  const std::vector<float> a = randomValues<float>(elementCount(a_shape), seed, -1, 1);
  const std::vector<float> b = randomValues<float>(elementCount(b_shape), seed + 1, -1, 1);
  const std::vector<float> c = randomValues<float>(elementCount(g.c_shape), seed + 2, -1, 1);
  std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b, g.constant_b)};
  if (g.has_c) inputs.push_back(operand(g.c_shape, c, g.constant_c));
  std::vector<Operand> outputs = {output(DType::kF32, {m, n})};
  ParamMap params;
  params.set("transA", int64_t{g.trans_a});
  params.set("transB", int64_t{g.trans_b});
  params.set("alpha", double{g.alpha});
  params.set("beta", double{g.beta});
  PreparedKernel kernel("Gemm", inputs, outputs, params);
  kernel.run(inputs, outputs);
  EXPECT_TRUE(matches(outputs[0].values<float>(), gemmReference(g, m, k, n, a, b, c)))
      << "transA " << g.trans_a << " transB " << g.trans_b << " C "
      << (g.has_c ? shapeText(g.c_shape) : std::string("none")) << " alpha " << g.alpha << " beta " << g.beta
      << (g.constant_b ? " constant B" : "") << (g.constant_c ? " constant C" : "") << " m k n " << m << " " << k << " "
      << n;
}

TEST(GemmKernel, EveryTransposeCShapeAndScale) {
  const int64_t m = 6, k = 7, n = 33;
  const std::vector<std::pair<std::vector<int64_t>, bool>> c_shapes = {{{}, false},    {{n}, true},    {{1, n}, true},
                                                                       {{m, 1}, true}, {{m, n}, true}, {{}, true},
                                                                       {{1, 1}, true}, {{1}, true}};
  const std::vector<std::pair<float, float>> scales = {{1, 1}, {0.5f, 2}, {1, 0.5f}, {2, 0}, {-1, 1}};
  uint32_t seed = 500;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (const auto& [c_shape, has_c] : c_shapes) {
        for (const auto& [alpha, beta] : scales) {
          for (int constants = 0; constants < 4; ++constants) {
            const GemmCase g{trans_a, trans_b, c_shape, has_c, alpha, beta, (constants & 1) != 0, (constants & 2) != 0};
            checkGemm(g, m, k, n, seed += 3);
          }
        }
      }
    }
  }
}

TEST(GemmKernel, LinearLayerShapes) {
  // y = x W^T + b with constant W and b, the commonest Gemm in exported models.
  checkGemm(GemmCase{false, true, {128}, true, 1, 1, true, true}, 64, 256, 128, 600);
  checkGemm(GemmCase{false, true, {128}, true, 1, 1, false, false}, 1, 256, 128, 601);
  checkGemm(GemmCase{false, false, {1, 96}, true, 1, 1, true, false}, 33, 64, 96, 602);
}

TEST(GemmKernel, ZeroKGivesBetaC) {
  checkGemm(GemmCase{false, false, {3, 4}, true, 1, 0.5f, false, false}, 3, 0, 4, 700);
  checkGemm(GemmCase{true, true, {4}, true, 2, 1, true, true}, 3, 0, 4, 701);
  checkGemm(GemmCase{false, false, {}, false, 1, 1, false, false}, 3, 0, 4, 702);
}

TEST(GemmKernel, OmittedCAndBetaZeroIgnoreC) {
  const std::vector<float> a = randomValues<float>(6, 1, -1, 1), b = randomValues<float>(12, 2, -1, 1);
  std::vector<Operand> inputs = {operand<float>({2, 3}, a), operand<float>({3, 4}, b), omitted()};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 4})};
  PreparedKernel("Gemm", inputs, outputs).run(inputs, outputs);
  const GemmCase g{false, false, {}, false, 1, 1, false, false};
  EXPECT_TRUE(matches(outputs[0].values<float>(), gemmReference(g, 2, 3, 4, a, b, {})));
}

TEST(GemmKernel, PrepareErrors) {
  const Operand f23 = operand<float>({2, 3}, std::vector<float>(6, 1));
  const Operand f45 = operand<float>({4, 5}, std::vector<float>(20, 1));
  const Operand f35 = operand<float>({3, 5}, std::vector<float>(15, 1));
  EXPECT_EQ(prepareError("Gemm", {f23, operand<float>({3}, {1, 2, 3})}, {output(DType::kF32, {2, 1})}),
            "Gemm: input 1 must be 2-D, got f32[3]");
  EXPECT_EQ(prepareError("Gemm", {f23, f45}, {output(DType::kF32, {2, 5})}),
            "Gemm: A [2, 3] (transA 0) and B [4, 5] (transB 0) give K = 3 and 4");
  ParamMap trans;
  trans.set("transA", int64_t{1});
  EXPECT_EQ(prepareError("Gemm", {f23, f45}, {output(DType::kF32, {3, 5})}, trans),
            "Gemm: A [2, 3] (transA 1) and B [4, 5] (transB 0) give K = 2 and 4");
  EXPECT_EQ(
      prepareError("Gemm", {f23, f35, operand<float>({3, 2}, std::vector<float>(6))}, {output(DType::kF32, {2, 5})}),
      "Gemm: C f32[3, 2] does not broadcast to [M, N] = [2, 5]");
  EXPECT_EQ(
      prepareError("Gemm", {f23, f35, operand<double>({5}, std::vector<double>(5))}, {output(DType::kF32, {2, 5})}),
      "Gemm: no kernel for f64 inputs (supports f32); input 2 is f64[5]");
  EXPECT_EQ(prepareError("Gemm", {f23, f35}, {output(DType::kF32, {5, 2})}),
            "Gemm: output is f32[5, 2] but the inputs give f32[2, 5]");
}

// Constant folding of a crafted model handed MatMul two values whose type
// lenient inference left undefined: the kernel took them for omitted inputs
// and wrote a float into the 0-byte output (graph_run_fuzz). Such values
// are not evaluated.
// A chain of GatherNDs grows the rank by two a step; a view of rank 34
// wrote past its 32 dimensions (graph_run_fuzz).
TEST(ViewOf, RefusesMoreDimensionsThanAViewHolds) {
  const TensorInfo deep{DType::kF32, std::vector<int64_t>(kMaxRank + 2, 1)};
  EXPECT_THROW(viewOf(deep, nullptr), UsageError);
  const TensorView widest = viewOf(TensorInfo{DType::kF32, std::vector<int64_t>(kMaxRank, 1)}, nullptr);
  EXPECT_EQ(widest.rank, kMaxRank);
}

TEST(EvaluateOnce, RefusesValuesWithoutAType) {
  const std::vector<TensorInfo> inputs = {TensorInfo{DType::kUndefined, {0}}, TensorInfo{DType::kUndefined, {0}}};
  const std::vector<const std::byte*> data = {nullptr, nullptr};
  EXPECT_FALSE(evaluateOnce("MatMul", ParamMap{}, inputs, data, std::vector<TensorInfo>{{DType::kUndefined, {}}}));
  EXPECT_FALSE(evaluateOnce("MatMul", ParamMap{}, inputs, data, std::vector<TensorInfo>{{DType::kF32, {}}}));
  const std::vector<float> row = {1, 2};
  const std::vector<TensorInfo> typed = {TensorInfo{DType::kF32, {2}}, TensorInfo{DType::kF32, {2}}};
  const std::vector<const std::byte*> typed_data = {reinterpret_cast<const std::byte*>(row.data()),
                                                    reinterpret_cast<const std::byte*>(row.data())};
  const auto dot = evaluateOnce("MatMul", ParamMap{}, typed, typed_data, std::vector<TensorInfo>{{DType::kF32, {}}});
  ASSERT_TRUE(dot);
  float value;
  std::memcpy(&value, (*dot)[0].data(), sizeof value);
  EXPECT_EQ(value, 5.0f);
}

}  // namespace
}  // namespace kiln
