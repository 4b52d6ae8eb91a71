// The programs the cuda kernels build for fused post-ops
// (kernels/cuda/post_ops.h) compute what the post-op list says. They run
// here through the CPU kernel of kiln.FusedElementwise, which executes the
// same ElementwiseProgram, so this needs no GPU; each case is checked
// against the post-ops written out by hand.
#include "kernels/cuda/post_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/evaluate_once.h"

namespace kiln {
namespace {

ParamMap postOps(const std::string& kinds, std::vector<double> alpha, std::vector<double> beta) {
  ParamMap params;
  params.set("post_ops", kinds);
  params.set("post_op_alpha", std::move(alpha));
  params.set("post_op_beta", std::move(beta));
  return params;
}

// Runs `program` over inputs (each of `count` floats) on the CPU kernel.
std::vector<float> runProgram(const ElementwiseProgram& program, const std::vector<std::vector<float>>& inputs) {
  ParamMap params;
  params.set(std::string(kProgramOpsAttribute), joinElementwiseOps(program.ops));
  params.set(std::string(kProgramOperandsAttribute), program.operands);
  params.set(std::string(kProgramAlphaAttribute), std::vector<double>(program.alpha.begin(), program.alpha.end()));
  params.set(std::string(kProgramBetaAttribute), std::vector<double>(program.beta.begin(), program.beta.end()));
  if (!program.immediates.empty()) {
    params.set(std::string(kProgramImmediatesAttribute),
               std::vector<double>(program.immediates.begin(), program.immediates.end()));
  }
  const auto count = static_cast<int64_t>(inputs.front().size());
  std::vector<TensorInfo> infos(inputs.size(), TensorInfo{DType::kF32, {count}});
  std::vector<const std::byte*> data;
  for (const auto& input : inputs) data.push_back(reinterpret_cast<const std::byte*>(input.data()));
  const std::vector<TensorInfo> outputs = {TensorInfo{DType::kF32, {count}}};
  const auto result = evaluateOnce("kiln.FusedElementwise", params, infos, data, outputs);
  EXPECT_TRUE(result.has_value());
  std::vector<float> y(static_cast<size_t>(count));
  if (result) std::memcpy(y.data(), result->front().data(), y.size() * sizeof(float));
  return y;
}

const std::vector<float> kX = {-3.0f, -0.5f, 0.0f, 0.25f, 2.0f, 7.0f};
const std::vector<float> kBias = {0.5f, 0.5f, -1.0f, 1.0f, 0.0f, -2.0f};
const std::vector<float> kResidual = {1.0f, -1.0f, 2.0f, 0.5f, -4.0f, 3.0f};

void expectEach(const std::vector<float>& got, const std::function<float(size_t)>& want) {
  ASSERT_EQ(got.size(), kX.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want(i), 1e-6f) << i;
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

TEST(CudaPostOps, AddThenReluReadsTheResidual) {
  const auto program = cuda::postOpProgram("test", postOps("Add,Relu", {0, 0}, {0, 0}));
  ASSERT_TRUE(program);
  EXPECT_EQ(program->input_count, 2u);
  expectEach(runProgram(*program, {kX, kResidual}), [](size_t i) { return std::max(0.0f, kX[i] + kResidual[i]); });
}

TEST(CudaPostOps, ABiasComesFirstAndTheResidualAfterIt) {
  const auto program = cuda::postOpProgram("test", postOps("Swish,Add", {0, 0}, {0, 0}), /*with_bias=*/true);
  ASSERT_TRUE(program);
  EXPECT_EQ(program->input_count, 3u);
  expectEach(runProgram(*program, {kX, kBias, kResidual}), [](size_t i) {
    const float v = kX[i] + kBias[i];
    return v * sigmoid(v) + kResidual[i];
  });
}

// Linear's two immediates come before the results in slot order, so the
// results read so far move by two: the chain must still read the right ones.
TEST(CudaPostOps, LinearAfterOtherOpsKeepsTheirResults) {
  const auto program = cuda::postOpProgram("test", postOps("Add,Relu,Linear,Clip", {0, 0, 0.5, -1}, {0, 0, 2, 2.5}));
  ASSERT_TRUE(program);
  EXPECT_EQ(program->immediates, (std::vector<float>{0.5f, 2.0f}));
  expectEach(runProgram(*program, {kX, kResidual}), [](size_t i) {
    const float v = 0.5f * std::max(0.0f, kX[i] + kResidual[i]) + 2.0f;
    return std::min(2.5f, std::max(-1.0f, v));
  });
}

TEST(CudaPostOps, ABiasAloneIsAProgramAndNoPostOpsIsNone) {
  EXPECT_FALSE(cuda::postOpProgram("test", ParamMap{}));
  const auto program = cuda::postOpProgram("test", ParamMap{}, /*with_bias=*/true);
  ASSERT_TRUE(program);
  expectEach(runProgram(*program, {kX, kBias}), [](size_t i) { return kX[i] + kBias[i]; });
}

TEST(CudaPostOps, AnUnknownKindIsDeclined) {
  EXPECT_THROW(cuda::postOpProgram("test", postOps("Add,Mystery", {0, 0}, {0, 0})), KernelUnsupported);
}

TEST(CudaPostOps, ProgramsLongerThanTheKernelTakesAreDeclined) {
  ElementwiseProgram program;
  program.input_count = 1;
  for (size_t i = 0; i <= kCudaMaxProgramOps; ++i) {
    program.ops.push_back(ElementwiseOp::kRelu);
    program.operands.push_back(i == 0 ? 0 : program.resultSlot(i - 1));
    program.operands.push_back(kNoOperand);
    program.alpha.push_back(0);
    program.beta.push_back(0);
  }
  EXPECT_THROW(cuda::toDeviceProgram("test", program), KernelUnsupported);
  program.ops.pop_back();
  EXPECT_EQ(cuda::toDeviceProgram("test", program).ops, static_cast<int>(kCudaMaxProgramOps));
}

}  // namespace
}  // namespace kiln
