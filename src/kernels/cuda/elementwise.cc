// Elementwise work on cuda: kiln.FusedElementwise programs
// (core/elementwise_program.h) and the single f32 ONNX ops, which run as
// one-instruction programs of the same kernel. Operands and result may each
// be f16 (`kiln compile --fp16`); the arithmetic is f32.
//
// Each step is one ElementwisePass (elementwise_pass.h): a kernel the
// runtime compiler specializes to the program and shapes at load, or the
// interpreter kernel. prepare works out where each input's element lies
// (broadcast strides, adjacent dimensions merged); a run is one launch with
// nothing to set up. Ops not in ElementwiseOp, and other dtypes, are
// declined (KernelUnsupported): they run as host steps.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/elementwise_program.h"
#include "core/float_formats.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/elementwise_pass.h"
#include "kernels/cuda/post_ops.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxInputs = kMaxElementwiseInputs;
constexpr int kMaxDims = kMaxElementwiseDims;
using E = ElementwiseOp;

struct ElementwiseState final : KernelState {
  ElementwisePass pass;
};

[[noreturn]] void decline(const std::string& op, const std::string& why) {
  throw KernelUnsupported(fmt::format("{} on cuda: {}", op, why));
}

// Merges adjacent dimensions that every input walks contiguously (or
// broadcasts along both), so that the kernel divides by fewer sizes: a bias
// [C] over [N, T, C] becomes [N * T, C].
void collapse(Indexing& indexing, int inputs) {
  int rank = 0;
  for (int d = 0; d < indexing.rank; ++d) {
    if (indexing.out_dims[d] == 1) continue;  // size-1 dimensions move nothing
    bool merge = rank > 0;
    for (int k = 0; merge && k < inputs; ++k) {
      merge = indexing.strides[k][rank - 1] == indexing.strides[k][d] * indexing.out_dims[d];
    }
    if (merge) {
      indexing.out_dims[rank - 1] *= indexing.out_dims[d];
      for (int k = 0; k < inputs; ++k) indexing.strides[k][rank - 1] = indexing.strides[k][d];
    } else {
      indexing.out_dims[rank] = indexing.out_dims[d];
      for (int k = 0; k < inputs; ++k) indexing.strides[k][rank] = indexing.strides[k][d];
      ++rank;
    }
  }
  indexing.rank = rank;
}

// The broadcast strides of every input against the output; declines what
// the kernel's fixed limits cannot hold.
Indexing planIndexing(const std::string& op, const KernelSetup& setup) {
  const TensorInfo& out = setup.outputs[0];
  if (out.shape.size() > kMaxDims) decline(op, fmt::format("more than {} dimensions", kMaxDims));
  if (setup.inputs.size() > kMaxInputs) decline(op, fmt::format("more than {} inputs", kMaxInputs));
  Indexing indexing;
  indexing.rank = static_cast<int>(out.shape.size());
  for (int d = 0; d < indexing.rank; ++d) indexing.out_dims[d] = out.shape[d];
  for (size_t k = 0; k < setup.inputs.size(); ++k) {
    const TensorInfo& in = setup.inputs[k];
    const std::optional<FloatStorage> storage = floatStorageOf(in.dtype);
    if (!storage) decline(op, fmt::format("{} inputs", dtypeName(in.dtype)));
    indexing.storage[k] = *storage;
    indexing.scalar[k] = in.numElements() == 1;
    if (!indexing.scalar[k] && in.numElements() != out.numElements()) indexing.direct = false;
    // Right-aligned (numpy) broadcasting.
    int64_t stride = 1;
    const int offset = indexing.rank - static_cast<int>(in.shape.size());
    for (int d = static_cast<int>(in.shape.size()) - 1; d >= 0; --d) {
      const int64_t size = in.shape[d];
      indexing.strides[k][d + offset] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }
  // A full-size input of another shape (a [N] input against a [1, N]
  // output) is still read element by element in order.
  if (!indexing.direct) collapse(indexing, static_cast<int>(setup.inputs.size()));
  indexing.storage_out = floatStorageOf(out.dtype).value_or(FloatStorage::kF32);  // checked by finish()
  return indexing;
}

std::unique_ptr<KernelState> finish(const std::string& op, const KernelSetup& setup, const ElementwiseProgram& program) {
  if (setup.outputs.size() != 1 || !floatStorageOf(setup.outputs[0].dtype)) {
    decline(op, "an output other than f32, f16 or bf16");
  }
  auto state = std::make_unique<ElementwiseState>();
  state->pass.prepare(toDeviceProgram(op, program), planIndexing(op, setup), setup.outputs[0].numElements(),
                      queueOf(setup.queue));
  return state;
}

std::unique_ptr<KernelState> prepareFused(const KernelSetup& setup) {
  return finish("kiln.FusedElementwise", setup, readElementwiseProgram(setup.params, setup.inputs.size()));
}

// A single ONNX op as a one-instruction program over its inputs.
ElementwiseProgram singleOp(ElementwiseOp op, size_t inputs, float alpha, float beta) {
  ElementwiseProgram program;
  program.input_count = inputs;
  program.ops = {op};
  program.operands = {0, isBinary(op) ? 1 : kNoOperand};
  program.alpha = {alpha};
  program.beta = {beta};
  return program;
}

template <ElementwiseOp kOp>
std::unique_ptr<KernelState> prepareSingle(const KernelSetup& setup) {
  const std::string name(elementwiseOpName(kOp));
  const size_t arity = isBinary(kOp) ? 2 : 1;
  if (setup.inputs.size() != arity) decline(name, fmt::format("{} inputs", setup.inputs.size()));
  float alpha = 0, beta = 0;
  switch (kOp) {
    case E::kLeakyRelu: alpha = static_cast<float>(setup.params.getFloat("alpha", 0.01)); break;
    case E::kElu: alpha = static_cast<float>(setup.params.getFloat("alpha", 1.0)); break;
    case E::kHardSigmoid:
      alpha = static_cast<float>(setup.params.getFloat("alpha", 0.2));
      beta = static_cast<float>(setup.params.getFloat("beta", 0.5));
      break;
    default: break;
  }
  return finish(name, setup, singleOp(kOp, arity, alpha, beta));
}

// Gelu: approximate "none" (erf) or "tanh".
std::unique_ptr<KernelState> prepareGelu(const KernelSetup& setup) {
  const std::string approximate = setup.params.getString("approximate", "none");
  const E op = approximate == "tanh" ? E::kGeluTanh : E::kGelu;
  if (setup.inputs.size() != 1) decline("Gelu", "not one input");
  return finish("Gelu", setup, singleOp(op, 1, 0, 0));
}

// Clip: bounds from constant inputs 1 and 2 (or the attributes of old
// opsets); a bound computed at run time is declined.
std::unique_ptr<KernelState> prepareClip(const KernelSetup& setup) {
  float bounds[2] = {-INFINITY, INFINITY};
  bounds[0] = static_cast<float>(setup.params.getFloat("min", -INFINITY));
  bounds[1] = static_cast<float>(setup.params.getFloat("max", INFINITY));
  for (size_t k = 1; k < setup.inputs.size() && k < 3; ++k) {
    if (setup.inputs[k].dtype == DType::kUndefined) continue;
    if (setup.constants[k] == nullptr) decline("Clip", "bounds known only at run time");
    if (setup.inputs[k].dtype == DType::kF16 || setup.inputs[k].dtype == DType::kBF16) {
      uint16_t bits;
      std::memcpy(&bits, setup.constants[k], sizeof bits);
      bounds[k - 1] = setup.inputs[k].dtype == DType::kF16 ? halfToFloat(bits) : bfloat16ToFloat(bits);
    } else if (setup.inputs[k].dtype == DType::kF32) {
      std::memcpy(&bounds[k - 1], setup.constants[k], sizeof(float));
    } else {
      decline("Clip", fmt::format("{} bounds", dtypeName(setup.inputs[k].dtype)));
    }
  }
  KernelSetup data_only{setup.params, setup.inputs.first(1), setup.outputs, setup.constants.first(1), setup.queue};
  return finish("Clip", data_only, singleOp(E::kClip, 1, bounds[0], bounds[1]));
}

void run(const KernelCall& call) {
  const auto& s = *static_cast<const ElementwiseState*>(call.state);
  Pointers pointers;
  for (int k = 0; k < s.pass.inputs(); ++k) pointers.in[k] = call.inputs[k].as<const float>();
  pointers.out = call.outputs[0].as<float>();
  s.pass.launch(pointers, queueOf(call.queue).stream);
}

template <ElementwiseOp kOp>
void add(KernelRegistry& registry, const char* name) {
  registry.add(KernelDef{name, &prepareSingle<kOp>, &run});
}

}  // namespace

void registerCudaElementwiseKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"kiln.FusedElementwise", &prepareFused, &run});
  registry.add(KernelDef{"Gelu", &prepareGelu, &run});
  registry.add(KernelDef{"Clip", &prepareClip, &run});
  add<E::kRelu>(registry, "Relu");
  add<E::kLeakyRelu>(registry, "LeakyRelu");
  add<E::kElu>(registry, "Elu");
  add<E::kSigmoid>(registry, "Sigmoid");
  add<E::kHardSigmoid>(registry, "HardSigmoid");
  add<E::kHardSwish>(registry, "HardSwish");
  add<E::kSoftplus>(registry, "Softplus");
  add<E::kTanh>(registry, "Tanh");
  add<E::kExp>(registry, "Exp");
  add<E::kLog>(registry, "Log");
  add<E::kSqrt>(registry, "Sqrt");
  add<E::kErf>(registry, "Erf");
  add<E::kAbs>(registry, "Abs");
  add<E::kNeg>(registry, "Neg");
  add<E::kReciprocal>(registry, "Reciprocal");
  add<E::kFloor>(registry, "Floor");
  add<E::kCeil>(registry, "Ceil");
  add<E::kAdd>(registry, "Add");
  add<E::kSub>(registry, "Sub");
  add<E::kMul>(registry, "Mul");
  add<E::kDiv>(registry, "Div");
  add<E::kMax>(registry, "Max");
  add<E::kMin>(registry, "Min");
}

}  // namespace kiln::cuda
