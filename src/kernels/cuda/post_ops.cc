#include "kernels/cuda/post_ops.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/fused_post_ops.h"

#include "kernels/kernel.h"

namespace kiln::cuda {

namespace {

// The slot holding the value the next op reads: the last result, or input 0.
int64_t current(const ElementwiseProgram& program) {
  return program.ops.empty() ? 0 : program.resultSlot(program.ops.size() - 1);
}

void push(ElementwiseProgram& program, ElementwiseOp op, int64_t a, int64_t b, float alpha = 0, float beta = 0) {
  program.ops.push_back(op);
  program.operands.push_back(a);
  program.operands.push_back(b);
  program.alpha.push_back(alpha);
  program.beta.push_back(beta);
}

}  // namespace

void appendActivation(ElementwiseProgram& program, FusedActivation activation, float alpha, float beta) {
  using F = FusedActivation;
  using E = ElementwiseOp;
  const int64_t x = current(program);
  switch (activation) {
    case F::kNone: return;
    case F::kRelu: return push(program, E::kRelu, x, kNoOperand);
    case F::kLeakyRelu: return push(program, E::kLeakyRelu, x, kNoOperand, alpha);
    case F::kSigmoid: return push(program, E::kSigmoid, x, kNoOperand);
    case F::kTanh: return push(program, E::kTanh, x, kNoOperand);
    case F::kClip: return push(program, E::kClip, x, kNoOperand, alpha, beta);
    case F::kGelu: return push(program, E::kGelu, x, kNoOperand);
    case F::kGeluTanh: return push(program, E::kGeluTanh, x, kNoOperand);
    case F::kHardSwish: return push(program, E::kHardSwish, x, kNoOperand);
    case F::kSwish:  // x * sigmoid(x)
      push(program, E::kSigmoid, x, kNoOperand);
      return push(program, E::kMul, x, current(program));
    case F::kLinear: {  // alpha * x + beta, through two immediates
      // Immediates come before results: renumber the results read so far.
      const auto first_result = static_cast<int64_t>(program.input_count + program.immediates.size());
      for (int64_t& operand : program.operands) {
        if (operand >= first_result) operand += 2;
      }
      program.immediates.push_back(alpha);
      program.immediates.push_back(beta);
      const int64_t scale = first_result, shift = first_result + 1;
      push(program, E::kMul, current(program), scale);
      return push(program, E::kAdd, current(program), shift);
    }
  }
}

std::optional<FusedActivation> readActivation(std::string_view op, const ParamMap& params, float* alpha, float* beta) {
  const std::string name = params.getString(std::string(kActivationAttribute), "");
  const std::optional<FusedActivation> activation = parseFusedActivation(name);
  if (!activation) throw KernelUnsupported(fmt::format("{} on cuda: activation '{}'", op, name));
  *alpha = static_cast<float>(params.getFloat(std::string(kActivationAlphaAttribute), 0.0));
  *beta = static_cast<float>(params.getFloat(std::string(kActivationBetaAttribute), 0.0));
  if (*activation == FusedActivation::kNone) return std::nullopt;
  return activation;
}

std::optional<ElementwiseProgram> postOpProgram(std::string_view op, const ParamMap& params, bool with_bias) {
  std::vector<PostOp> list;
  try {
    list = readPostOps(std::string(op), params);
  } catch (const UsageError& e) {
    throw KernelUnsupported(e.what());
  }
  if (list.empty() && !with_bias) return std::nullopt;
  ElementwiseProgram program;
  const bool residual = std::any_of(list.begin(), list.end(), [](const PostOp& post) { return post.add; });
  program.input_count = 1 + (with_bias ? 1 : 0) + (residual ? 1 : 0);
  const int64_t residual_slot = with_bias ? 2 : 1;
  if (with_bias) push(program, ElementwiseOp::kAdd, 0, 1);
  for (const PostOp& post : list) {
    if (post.add) {
      push(program, ElementwiseOp::kAdd, current(program), residual_slot);
    } else {
      appendActivation(program, post.activation, post.alpha, post.beta);
    }
  }
  return program;
}

std::optional<FloatStorage> floatStorageOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return FloatStorage::kF32;
    case DType::kF16: return FloatStorage::kF16;
    case DType::kBF16: return FloatStorage::kBF16;
    default: return std::nullopt;
  }
}

Indexing perChannelIndexing(int64_t batch, int64_t channels, int64_t pixels, bool has_bias, bool has_residual,
                            FloatStorage storage) {
  Indexing ix;
  ix.direct = false;
  ix.rank = 3;
  ix.out_dims[0] = batch;
  ix.out_dims[1] = channels;
  ix.out_dims[2] = pixels;
  const int64_t full[3] = {channels * pixels, pixels, 1};
  const int64_t per_channel[3] = {0, 1, 0};
  for (int d = 0; d < 3; ++d) {
    ix.strides[0][d] = full[d];
    if (has_bias) ix.strides[1][d] = per_channel[d];
    if (has_residual) ix.strides[has_bias ? 2 : 1][d] = full[d];
  }
  const int inputs = 1 + (has_bias ? 1 : 0) + (has_residual ? 1 : 0);
  for (int k = 0; k < inputs; ++k) ix.storage[k] = storage;
  ix.storage_out = storage;
  return ix;
}

DeviceProgram toDeviceProgram(std::string_view op, const ElementwiseProgram& program) {
  if (program.ops.size() > kMaxElementwiseOps || program.immediates.size() > kMaxElementwiseImmediates ||
      program.input_count > kMaxElementwiseInputs) {
    throw KernelUnsupported(fmt::format("{} on cuda: a program larger than the kernel takes", op));
  }
  DeviceProgram p;
  p.ops = static_cast<int>(program.ops.size());
  p.inputs = static_cast<int>(program.input_count);
  p.immediates = static_cast<int>(program.immediates.size());
  for (size_t j = 0; j < program.ops.size(); ++j) {
    p.op[j] = static_cast<uint8_t>(program.ops[j]);
    p.a[j] = static_cast<int8_t>(program.operands[2 * j]);
    p.b[j] = static_cast<int8_t>(program.operands[2 * j + 1]);
    p.alpha[j] = program.alpha[j];
    p.beta[j] = program.beta[j];
  }
  for (size_t k = 0; k < program.immediates.size(); ++k) p.immediate[k] = program.immediates[k];
  return p;
}

}  // namespace kiln::cuda
