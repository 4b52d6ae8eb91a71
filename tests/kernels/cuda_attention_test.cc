// What the cuda Attention kernel takes, declines (the step then runs on
// the host) and refuses, decided when it is prepared: host-side logic, so
// it needs no GPU. Its numbers on a GPU are checked against the CPU kernel
// in tests/cli/test_cuda_attention.py.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kernel.h"

namespace kiln {
namespace {

const TensorInfo kOmitted{};

// Prepares the cuda kernel of ONNX Attention for these inputs and outputs.
void prepare(const std::vector<TensorInfo>& inputs, const std::vector<TensorInfo>& outputs,
             const ParamMap& params = {}) {
  const KernelDef* kernel = KernelRegistry::cuda().find("Attention");
  ASSERT_NE(kernel, nullptr);
  const std::vector<const std::byte*> constants(inputs.size(), nullptr);
  const KernelSetup setup{params, inputs, outputs, constants};
  EXPECT_NE(kernel->prepare(setup), nullptr);
}

TensorInfo f32(std::vector<int64_t> shape) { return TensorInfo{DType::kF32, std::move(shape)}; }

TEST(CudaAttention, TakesMasksGroupedHeadsAnd3DInputs) {
  EXPECT_NO_THROW(prepare({f32({2, 8, 5, 32}), f32({2, 2, 7, 32}), f32({2, 2, 7, 16}), TensorInfo{DType::kBool, {5, 7}}},
                          {f32({2, 8, 5, 16})}));
  ParamMap heads;
  heads.set("q_num_heads", int64_t{4});
  heads.set("kv_num_heads", int64_t{4});
  heads.set("is_causal", int64_t{1});
  EXPECT_NO_THROW(prepare({f32({1, 9, 128}), f32({1, 9, 128}), f32({1, 9, 128}), f32({4, 9, 9})}, {f32({1, 9, 128})},
                          heads));
  EXPECT_NO_THROW(prepare({TensorInfo{DType::kF16, {1, 2, 3, 128}}, TensorInfo{DType::kF16, {1, 2, 3, 128}},
                           TensorInfo{DType::kF16, {1, 2, 3, 128}}, f32({3, 3})},
                          {TensorInfo{DType::kF16, {1, 2, 3, 128}}}));
}

TEST(CudaAttention, DeclinesWhatRunsOnTheHost) {
  const TensorInfo q = f32({1, 2, 3, 32}), past = f32({1, 2, 4, 32});
  // A past key/value cache, with its present outputs.
  EXPECT_THROW(prepare({q, q, q, kOmitted, past, past}, {q, f32({1, 2, 7, 32}), f32({1, 2, 7, 32})}),
               KernelUnsupported);
  // The scores output (the executor gives every output a tensor).
  EXPECT_THROW(prepare({q, q, q}, {q, q, q, f32({1, 2, 3, 3})}), KernelUnsupported);
  // Heads past 128.
  const TensorInfo wide = f32({1, 2, 3, 160});
  EXPECT_THROW(prepare({wide, wide, wide}, {wide}), KernelUnsupported);
}

TEST(CudaAttention, RefusesInvalidNodesAsTheCpuKernelDoes) {
  // K's head size differs from Q's: wrong everywhere, not a variant for the host.
  try {
    prepare({f32({1, 2, 3, 32}), f32({1, 2, 3, 16}), f32({1, 2, 3, 32})}, {f32({1, 2, 3, 32})});
    FAIL() << "no error";
  } catch (const KernelUnsupported& error) {
    FAIL() << "declined: " << error.what();
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("do not agree"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace kiln
