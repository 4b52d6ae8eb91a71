#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/pointwise_conv.h"

#include "core/math_mode.h"

#include <string>
#include <vector>

#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_pass.h"
#include "kernels/cuda/post_ops.h"

namespace kiln::cuda {
namespace {

using setup_helpers::present;

struct PointwiseState final : KernelState {
  int64_t batch = 0, in_channels = 0, out_channels = 0, pixels = 0;
  bool has_bias = false, has_residual = false, has_post = false;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // CUBLAS_COMPUTE_32F_FAST_TF32 where the step allows TF32
  cudaDataType_t type = CUDA_R_32F;  // of every tensor: CUDA_R_16F under `kiln compile --fp16` (f32 sums)
  ElementwisePass post;  // over y, the bias, the residual
};


bool allOnes(const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    if (v != 1) return false;
  }
  return true;
}

bool allZeros(const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    if (v != 0) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<KernelState> preparePointwiseConv(std::string_view op, const KernelSetup& setup) {
  if (setup.inputs.size() < 2 || setup.outputs.size() != 1) return nullptr;
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];
  const TensorInfo& y = setup.outputs[0];
  const std::optional<FloatStorage> storage = floatStorageOf(x.dtype);
  if (!storage || !setup_helpers::presentInputsAre(setup, x.dtype) || y.dtype != x.dtype) return nullptr;
  if (x.shape.size() < 3 || w.shape.size() != x.shape.size() || y.shape.size() != x.shape.size()) return nullptr;
  const std::vector<int64_t> kernel(w.shape.begin() + 2, w.shape.end());
  const std::string auto_pad = setup.params.getString("auto_pad", "NOTSET");
  if (!allOnes(kernel) || setup.params.getInt("group", 1) != 1 || !allOnes(setup.params.getInts("strides", {})) ||
      !allZeros(setup.params.getInts("pads", {})) || (auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty())) {
    return nullptr;
  }
  auto state = std::make_unique<PointwiseState>();
  state->batch = x.shape[0];
  state->in_channels = x.shape[1];
  state->out_channels = w.shape[0];
  state->pixels = static_cast<int64_t>(x.numElements()) / (state->batch * state->in_channels);
  if (static_cast<uint64_t>(state->batch * state->out_channels * state->pixels) != y.numElements() ||
      state->pixels > INT32_MAX || state->in_channels > INT32_MAX || state->out_channels > INT32_MAX ||
      y.numElements() >= (1ull << 31)) {
    return nullptr;
  }
  state->has_bias = present(setup, 2);
  if (allowsTf32(setup.params) && *storage == FloatStorage::kF32) state->compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (*storage == FloatStorage::kF16) state->type = CUDA_R_16F;
  if (*storage == FloatStorage::kBF16) state->type = CUDA_R_16BF;
  if (const std::optional<ElementwiseProgram> post = postOpProgram(op, setup.params, state->has_bias)) {
    state->has_post = true;
    state->has_residual = post->input_count > (state->has_bias ? 2u : 1u);
    if (state->has_residual && (!present(setup, 3) || setup.inputs[3].numElements() != y.numElements())) {
      return nullptr;
    }
    const Indexing ix = perChannelIndexing(state->batch, state->out_channels, state->pixels, state->has_bias,
                                           state->has_residual, *storage);
    state->post.prepare(toDeviceProgram(op, *post), ix, y.numElements(), queueOf(setup.queue));
  }
  return state;
}

bool isPointwiseConv(const KernelState* state) { return dynamic_cast<const PointwiseState*>(state) != nullptr; }

void runPointwiseConv(const KernelCall& call) {
  const auto& s = *static_cast<const PointwiseState*>(call.state);
  const CudaQueue& queue = queueOf(call.queue);
  float* y = call.outputs[0].as<float>();
  // Column-major: y[n]^T [pixels, Cout] = x[n]^T [pixels, Cin] * W^T [Cin, Cout].
  const float one = 1.0f, zero = 0.0f;
  const auto pixels = static_cast<int>(s.pixels);
  const auto cin = static_cast<int>(s.in_channels);
  const auto cout = static_cast<int>(s.out_channels);
  cublasGemmStridedBatchedEx(queue.cublas, CUBLAS_OP_N, CUBLAS_OP_N, pixels, cout, cin, &one,
                             call.inputs[0].data, s.type, pixels, s.in_channels * s.pixels, call.inputs[1].data,
                             s.type, cin, 0, &zero, y, s.type, pixels, s.out_channels * s.pixels,
                             static_cast<int>(s.batch), s.compute, CUBLAS_GEMM_DEFAULT);
  if (!s.has_post) return;
  Pointers pointers;
  pointers.in[0] = y;
  int next = 1;
  if (s.has_bias) pointers.in[next++] = call.inputs[2].as<const float>();
  if (s.has_residual) pointers.in[next++] = call.inputs[3].as<const float>();
  pointers.out = y;
  s.post.launch(pointers, queue.stream);
}

}  // namespace kiln::cuda
