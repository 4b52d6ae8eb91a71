// MatMul, Gemm, kiln.FusedMatMul and kiln.FusedGemm on cuda, through
// cuBLASLt in f32 (CUBLAS_COMPUTE_32F), or in TF32 where the step allows it
// (core/math_mode.h: `kiln compile --tf32`; CUBLAS_COMPUTE_32F_FAST_TF32).
// Steps whose operands are all f16 (`kiln compile --fp16`) multiply f16 on
// tensor cores and sum in f32 (CUBLAS_COMPUTE_32F), as onnxruntime does.
//
// Row-major products on a column-major library: Y = op(A) op(B) is computed
// as Y^T = op(B)^T op(A)^T, which in column-major terms reads A and B where
// they lie, so nothing is transposed in memory. Y^T's rows are Y's columns,
// so a bias over N (a linear layer's) is cuBLASLt's per-row bias epilogue.
//
//   bias       FusedMatMul's [N] bias, or a Gemm's C of one row with beta 1:
//              the BIAS epilogue (RELU_BIAS when the activation is Relu).
//   C          a Gemm's full [M, N] C, or FusedMatMul's residual: cuBLASLt's
//              C operand with beta (1 for the residual).
//   activation Relu in the epilogue; the others (core/fused_activation.h)
//              as a one-launch elementwise program over Y afterwards.
//   batches    MatMul's batch dimensions: B without them is one product
//              with A's batches folded into M; equal batches, or one side
//              with a single batch, are a strided batch (stride 0 repeats).
// Anything else (other dtypes, C shapes that broadcast otherwise, batch
// dimensions that broadcast partially, empty tensors) is declined and runs
// on the host. prepare picks the algorithm with cuBLASLt's heuristic for
// the queue's workspace; run only enqueues.
#include <cublasLt.h>
#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "core/fused_activation.h"
#include "core/math_mode.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_pass.h"
#include "kernels/cuda/post_ops.h"

namespace kiln::cuda {
namespace {

[[noreturn]] void decline(std::string_view op, const std::string& why) {
  throw KernelUnsupported(fmt::format("{} on cuda: {}", op, why));
}

// The product in row-major terms.
struct Shape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_y = 0;  // elements between batches
  float alpha = 1, beta = 0;
  enum class Bias { kNone, kRow } bias = Bias::kNone;  // input `bias_input` as an [N] bias
  int bias_input = -1;
  int c_input = -1;  // input read as the [M, N] C operand (beta)
};

struct ProductState final : KernelState {
  Shape shape;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, y_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_activation = false;
  ElementwisePass activation;  // over Y in place

  ~ProductState() override {
    if (a_layout != nullptr) cublasLtMatrixLayoutDestroy(a_layout);
    if (b_layout != nullptr) cublasLtMatrixLayoutDestroy(b_layout);
    if (y_layout != nullptr) cublasLtMatrixLayoutDestroy(y_layout);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t result = nullptr;
  check(cublasLtMatrixLayoutCreate(&result, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
        "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check(cublasLtMatrixLayoutSetAttribute(result, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
          "cublasLtMatrixLayoutSetAttribute");
    check(cublasLtMatrixLayoutSetAttribute(result, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                           sizeof(stride)),
          "cublasLtMatrixLayoutSetAttribute");
  }
  return result;
}

// The activation as a program over Y (input 0), or nullopt for none or for
// Relu, which goes to the epilogue instead.
std::optional<ElementwiseProgram> activationProgram(std::string_view op, const ParamMap& params) {
  float alpha = 0, beta = 0;
  const std::optional<FusedActivation> activation = readActivation(op, params, &alpha, &beta);
  if (!activation || *activation == FusedActivation::kRelu) return std::nullopt;
  ElementwiseProgram program;
  program.input_count = 1;
  appendActivation(program, *activation, alpha, beta);
  return program;
}

bool reluIn(const ParamMap& params) {
  return params.getString(std::string(kActivationAttribute), "") == fusedActivationName(FusedActivation::kRelu);
}

bool present(const KernelSetup& setup, size_t i) {
  return i < setup.inputs.size() && setup.inputs[i].dtype != DType::kUndefined;
}

std::unique_ptr<KernelState> build(std::string_view op, const KernelSetup& setup, const Shape& s, bool relu,
                                   const std::optional<ElementwiseProgram>& activation) {
  // All f32, or all f16 or bf16 (`kiln compile --fp16`, `--bf16`: 16-bit
  // operands, f32 sums).
  const DType dtype = setup.outputs[0].dtype;
  const std::optional<FloatStorage> storage = floatStorageOf(dtype);
  if (!storage) decline(op, "an output other than f32, f16 or bf16");
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    if (present(setup, i) && setup.inputs[i].dtype != dtype) decline(op, "inputs of another type than its output");
  }
  const cudaDataType_t type = dtype == DType::kF16 ? CUDA_R_16F : dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (s.m == 0 || s.n == 0 || s.k == 0) decline(op, "an empty product");
  const CudaQueue& queue = queueOf(setup.queue);
  auto state = std::make_unique<ProductState>();
  state->shape = s;
  const cublasComputeType_t compute =
      dtype == DType::kF32 && allowsTf32(setup.params) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasLtMatmulDescCreate(&state->desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // Column-major: Y^T [N, M] = opB^T [N, K] x opA^T [K, M].
  const cublasOperation_t op_b = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(state->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(state->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)), "TRANSB");
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (s.bias == Shape::Bias::kRow) epilogue = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  else if (relu) epilogue = CUBLASLT_EPILOGUE_RELU;
  check(cublasLtMatmulDescSetAttribute(state->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "EPILOGUE");
  if (s.bias == Shape::Bias::kRow) {
    const int32_t bias_type = type;  // the bias as stored, whatever the output's type
    check(cublasLtMatmulDescSetAttribute(state->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          "BIAS_DATA_TYPE");
  }
  // Stored (column-major) shapes: B is [N, K] (ld N) or, transposed, [K, N]
  // (ld K); A is [K, M] (ld K) or [M, K] (ld M).
  state->b_layout = s.trans_b ? layout(type, s.k, s.n, s.k, s.batch, s.stride_b)
                              : layout(type, s.n, s.k, s.n, s.batch, s.stride_b);
  state->a_layout = s.trans_a ? layout(type, s.m, s.k, s.m, s.batch, s.stride_a)
                              : layout(type, s.k, s.m, s.k, s.batch, s.stride_a);
  state->y_layout = layout(type, s.n, s.m, s.n, s.batch, s.stride_y);

  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = queue.workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(queue.cublas_lt, state->desc, state->b_layout, state->a_layout, state->y_layout,
                                     state->y_layout, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) decline(op, "cuBLASLt has no algorithm for this product");
  state->algo = result.algo;
  if (activation) {
    Indexing over_y;
    over_y.storage[0] = over_y.storage_out = *storage;
    state->activation.prepare(toDeviceProgram(op, *activation), over_y, setup.outputs[0].numElements(), queue);
    state->has_activation = true;
  }
  return state;
}

// MatMul's batch handling (see the file comment); fills m, n, k and batch.
Shape describeMatMul(std::string_view op, const KernelSetup& setup) {
  const std::vector<int64_t>& a = setup.inputs[0].shape;
  const std::vector<int64_t>& b = setup.inputs[1].shape;
  if (a.size() < 2 || b.size() < 2) decline(op, "a 1-D operand");
  Shape s;
  s.k = a.back();
  s.n = b.back();
  if (b[b.size() - 2] != s.k) decline(op, "mismatched K");
  int64_t a_batch = 1, b_batch = 1;
  for (size_t d = 0; d + 2 < a.size(); ++d) a_batch *= a[d];
  for (size_t d = 0; d + 2 < b.size(); ++d) b_batch *= b[d];
  const int64_t rows = a[a.size() - 2];
  if (b_batch == 1) {  // weights: fold A's batches into M
    s.m = a_batch * rows;
    return s;
  }
  // Batches must be the same dimensions, or one side a single batch.
  const std::vector<int64_t> a_dims(a.begin(), a.end() - 2), b_dims(b.begin(), b.end() - 2);
  if (a_batch != 1 && a_batch != b_batch) decline(op, "batch dimensions that broadcast partially");
  if (a_batch == b_batch) {
    const size_t rank = std::max(a_dims.size(), b_dims.size());
    for (size_t i = 0; i < rank; ++i) {
      const int64_t da = i < rank - a_dims.size() ? 1 : a_dims[i - (rank - a_dims.size())];
      const int64_t db = i < rank - b_dims.size() ? 1 : b_dims[i - (rank - b_dims.size())];
      if (da != db) decline(op, "batch dimensions that broadcast partially");
    }
  }
  s.m = rows;
  s.batch = b_batch;
  s.stride_a = a_batch == 1 ? 0 : rows * s.k;
  s.stride_b = s.k * s.n;
  s.stride_y = rows * s.n;
  return s;
}

std::unique_ptr<KernelState> prepareMatMul(const KernelSetup& setup) {
  return build("MatMul", setup, describeMatMul("MatMul", setup), false, std::nullopt);
}

std::unique_ptr<KernelState> prepareFusedMatMul(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.FusedMatMul";
  Shape s = describeMatMul(op, setup);
  if (present(setup, 2)) {
    if (setup.inputs[2].numElements() != static_cast<uint64_t>(s.n)) decline(op, "a bias that is not [N]");
    s.bias = Shape::Bias::kRow;
    s.bias_input = 2;
  }
  if (present(setup, 3)) {
    s.c_input = 3;
    s.beta = 1;
  }
  return build(op, setup, s, reluIn(setup.params), activationProgram(op, setup.params));
}

std::unique_ptr<KernelState> prepareGemmAs(std::string_view op, const KernelSetup& setup, bool fused) {
  const std::vector<int64_t>& a = setup.inputs[0].shape;
  const std::vector<int64_t>& b = setup.inputs[1].shape;
  if (a.size() != 2 || b.size() != 2) decline(op, "operands that are not 2-D");
  Shape s;
  s.trans_a = setup.params.getInt("transA", 0) != 0;
  s.trans_b = setup.params.getInt("transB", 0) != 0;
  s.m = s.trans_a ? a[1] : a[0];
  s.k = s.trans_a ? a[0] : a[1];
  s.n = s.trans_b ? b[0] : b[1];
  s.alpha = static_cast<float>(setup.params.getFloat("alpha", 1.0));
  const float beta = static_cast<float>(setup.params.getFloat("beta", 1.0));
  if (present(setup, 2) && beta != 0) {
    const TensorInfo& c = setup.inputs[2];
    const bool row = c.numElements() == static_cast<uint64_t>(s.n) && (c.shape.size() < 2 || c.shape[0] == 1);
    if (row && beta == 1 && s.alpha == 1) {
      s.bias = Shape::Bias::kRow;
      s.bias_input = 2;
    } else if (c.shape.size() == 2 && c.shape[0] == s.m && c.shape[1] == s.n) {
      s.c_input = 2;
      s.beta = beta;
    } else {
      decline(op, "a C that broadcasts other than as a bias row");
    }
  }
  const bool relu = fused && reluIn(setup.params);
  return build(op, setup, s, relu, fused ? activationProgram(op, setup.params) : std::nullopt);
}

std::unique_ptr<KernelState> prepareGemm(const KernelSetup& setup) { return prepareGemmAs("Gemm", setup, false); }
std::unique_ptr<KernelState> prepareFusedGemm(const KernelSetup& setup) {
  return prepareGemmAs("kiln.FusedGemm", setup, true);
}

void runProduct(const KernelCall& call) {
  auto& s = *const_cast<ProductState*>(static_cast<const ProductState*>(call.state));
  const CudaQueue& queue = queueOf(call.queue);
  const Shape& shape = s.shape;
  if (shape.bias_input >= 0) {
    // The bias lives at a device address known only now; setting it is a
    // host-side descriptor update.
    const void* bias = call.inputs[shape.bias_input].data;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }
  float* y = call.outputs[0].as<float>();  // or f16: cuBLASLt reads the layouts' type
  const void* c = shape.c_input >= 0 ? static_cast<const void*>(call.inputs[shape.c_input].data) : y;
  const float beta = shape.c_input >= 0 ? shape.beta : 0.0f;
  cublasLtMatmul(queue.cublas_lt, s.desc, &shape.alpha, call.inputs[1].data, s.b_layout, call.inputs[0].data,
                 s.a_layout, &beta, c, s.y_layout, y, s.y_layout, &s.algo, queue.workspace, queue.workspace_bytes,
                 queue.stream);
  if (s.has_activation) {
    Pointers pointers;
    pointers.in[0] = y;
    pointers.out = y;
    s.activation.launch(pointers, queue.stream);
  }
}

}  // namespace

void registerCudaMatMulKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"MatMul", &prepareMatMul, &runProduct});
  registry.add(KernelDef{"Gemm", &prepareGemm, &runProduct});
  registry.add(KernelDef{"kiln.FusedMatMul", &prepareFusedMatMul, &runProduct});
  registry.add(KernelDef{"kiln.FusedGemm", &prepareFusedGemm, &runProduct});
}

}  // namespace kiln::cuda
