// MatMul (numpy semantics) and Gemm (ONNX) on the CPU in f32, through
// oneDNN's matmul primitive, with a plain loop kernel for what oneDNN cannot
// take (empty tensors, K = 0, more than 12 dimensions, a refused primitive).
// MatMul in the other types ONNX allows (f64, f16, bf16, i32, i64, u32, u64)
// runs on the loop kernel only: f16 and bf16 accumulate in f32 and round once
// per element, f64 in f64, the integer types in 64 bits (wrapping as numpy
// does for the 32-bit ones).
//
// prepare describes the product once (1-D operands promoted, batch dimensions
// broadcast and collapsed), creates the oneDNN primitive for exactly those
// shapes and, when B is a constant, reorders it once into the layout the
// primitive prefers (format_tag::any), kept in the state. Gemm's alpha is an
// output scale; its C is a bias when that is exact and on oneDNN's fast path
// (alpha 1 and C one row: oneDNN computes alpha * (A x B + bias), and other
// bias shapes go to its reference implementation), otherwise run copies C into
// Y and a sum post-op adds it scaled by beta.
//
// kiln.FusedMatMul and kiln.FusedGemm (made by passes/matmul_fusion.cc) are
// the same products with more done by the same primitive: FusedMatMul's bias
// [N] takes the path of a Gemm's one-row C; a residual of Y's shape is a
// binary_add post-op; the activation (core/fused_activation.h) is an eltwise
// post-op after everything else. The residual and the activation exist only as
// post-ops: where oneDNN cannot run the product (K = 0, too many dimensions)
// prepare refuses a step that has them, and the fusion pass does not make
// such steps.
//
// Concurrency and allocation: execution slots (see onednn_support.h), made
// at prepare. dnnl_primitive_execute itself still allocates a few small
// objects on every call (6 allocations for 4 arguments in oneDNN 2.6);
// tests/kernels measures it. The loop kernel allocates nothing.
#include <dnnl.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/fused_activation.h"
#include "core/log.h"
#include "kernels/cpu/cpu_kernels.h"
#include "core/float_formats.h"
#include "core/math_mode.h"
#include "kernels/cpu/onednn_support.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using onednn::Dims;
using onednn::ExecutionSlot;

constexpr const char* kKernel = "MatMul/Gemm";

// Columns of Y per block in the loop kernel: 64 bytes of f32.
constexpr int64_t kBlock = 16;

// Y[t] = alpha * A[t] x B[t] (+ beta * C) for every batch index t. All strides
// are in elements; transposes are strides.
struct Product {
  // Collapsed batch dimensions of Y, and each operand's stride along them (0
  // where it broadcasts). Y is dense: [batch..., m, n].
  uint32_t batch_rank = 0;
  std::array<int64_t, kMaxRank> batch{};
  std::array<int64_t, kMaxRank> a_batch_stride{};
  std::array<int64_t, kMaxRank> b_batch_stride{};
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t a_m = 0;  // A(i, kk) is a[i * a_m + kk * a_k]
  int64_t a_k = 0;
  int64_t b_k = 0;  // B(kk, j) is b[kk * b_k + j * b_n]
  int64_t b_n = 0;
  float alpha = 1;
  float beta = 0;
  bool has_c = false;  // Gemm's C with beta != 0: C(i, j) is c[i * c_m + j * c_n], 0 along a broadcast dimension
  int64_t c_m = 0;
  int64_t c_n = 0;
  int64_t c_rows = 1;  // C's own shape as [c_rows, c_cols]
  int64_t c_cols = 1;
  // Multiply in bf16, summing in f32 (the step's math attribute is "bf16",
  // core/math_mode.h): B, a constant, is converted once, A per call.
  bool bf16 = false;
};

// ------------------------------------------------------------- loop kernel

// How the loop kernel reads and writes one element type: Storage in memory,
// Acc to accumulate in. Only F32 has Gemm's alpha, beta and C.
struct F32 {
  using Storage = float;
  using Acc = float;
  static Acc load(Storage v) { return v; }
  static Storage store(Acc v) { return v; }
};
struct F64 {
  using Storage = double;
  using Acc = double;
  static Acc load(Storage v) { return v; }
  static Storage store(Acc v) { return v; }
};
struct F16 {
  using Storage = uint16_t;
  using Acc = float;
  static Acc load(Storage v) { return halfToFloat(v); }
  static Storage store(Acc v) { return floatToHalf(v); }
};
struct BF16 {
  using Storage = uint16_t;
  using Acc = float;
  static Acc load(Storage v) { return bfloat16ToFloat(v); }
  static Storage store(Acc v) { return floatToBfloat16(v); }
};
// Integers accumulate in 64 bits, unsigned so that overflow wraps (defined).
template <typename T>
struct Integer {
  using Storage = T;
  using Acc = uint64_t;
  static Acc load(Storage v) { return static_cast<Acc>(static_cast<int64_t>(v)); }
  static Storage store(Acc v) { return static_cast<Storage>(v); }
};

// One matrix of Y. kUnitN: B's rows are contiguous, so the block loads vectorise.
template <typename E, bool kUnitN>
void productMatrix(const typename E::Storage* a, const typename E::Storage* b, const typename E::Storage* c,
                   typename E::Storage* y, const Product& p) {
  using Acc = typename E::Acc;
  const auto finish = [&](Acc acc, const typename E::Storage* c_row, int64_t j) {
    if constexpr (std::is_same_v<E, F32>) {
      const float v = p.alpha * acc;
      return p.has_c ? v + p.beta * c_row[j * p.c_n] : v;
    } else {
      (void)c_row;
      (void)j;
      return E::store(acc);
    }
  };
  for (int64_t i = 0; i < p.m; ++i) {
    const auto* a_row = a + i * p.a_m;
    const auto* c_row = p.has_c ? c + i * p.c_m : nullptr;
    auto* y_row = y + i * p.n;
    int64_t j = 0;
    // A fixed-size block of accumulators vectorises at -O2 (see mapBlocked in
    // elementwise.cc) and stays in L1 while k runs.
    for (; j + kBlock <= p.n; j += kBlock) {
      Acc acc[kBlock] = {};
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const Acc av = E::load(a_row[kk * p.a_k]);
        const auto* b_block = b + kk * p.b_k + j * p.b_n;
        for (int64_t jj = 0; jj < kBlock; ++jj) acc[jj] += av * E::load(b_block[kUnitN ? jj : jj * p.b_n]);
      }
      for (int64_t jj = 0; jj < kBlock; ++jj) y_row[j + jj] = finish(acc[jj], c_row, j + jj);
    }
    for (; j < p.n; ++j) {
      Acc acc = 0;
      for (int64_t kk = 0; kk < p.k; ++kk) acc += E::load(a_row[kk * p.a_k]) * E::load(b[kk * p.b_k + j * p.b_n]);
      y_row[j] = finish(acc, c_row, j);
    }
  }
}

template <typename E>
void loopProduct(const typename E::Storage* a, const typename E::Storage* b, const typename E::Storage* c,
                 typename E::Storage* y, const Product& p) {
  if (p.m == 0 || p.n == 0) return;
  int64_t count = 1;
  for (uint32_t d = 0; d < p.batch_rank; ++d) count *= p.batch[d];
  std::array<int64_t, kMaxRank> index{};
  int64_t ao = 0;
  int64_t bo = 0;
  for (int64_t t = 0; t < count; ++t) {
    auto* y_matrix = y + t * p.m * p.n;
    if (p.b_n == 1) {
      productMatrix<E, true>(a + ao, b + bo, c, y_matrix, p);
    } else {
      productMatrix<E, false>(a + ao, b + bo, c, y_matrix, p);
    }
    for (uint32_t d = p.batch_rank; d-- > 0;) {
      ao += p.a_batch_stride[d];
      bo += p.b_batch_stride[d];
      if (++index[d] < p.batch[d]) break;
      ao -= p.a_batch_stride[d] * p.batch[d];
      bo -= p.b_batch_stride[d] * p.batch[d];
      index[d] = 0;
    }
  }
}

// The loop kernel for a MatMul of element type `dtype` (not f32).
template <typename E>
void typedLoopProduct(const KernelCall& call, const Product& p) {
  using T = typename E::Storage;
  loopProduct<E>(call.inputs[0].as<const T>(), call.inputs[1].as<const T>(), nullptr, call.outputs[0].as<T>(), p);
}

using TypedLoop = void (*)(const KernelCall& call, const Product& p);

// The loop for a MatMul in `dtype`, or nullptr when there is none.
TypedLoop typedLoop(DType dtype) {
  switch (dtype) {
    case DType::kF64: return &typedLoopProduct<F64>;
    case DType::kF16: return &typedLoopProduct<F16>;
    case DType::kBF16: return &typedLoopProduct<BF16>;
    case DType::kI32: return &typedLoopProduct<Integer<int32_t>>;
    case DType::kI64: return &typedLoopProduct<Integer<int64_t>>;
    case DType::kU32: return &typedLoopProduct<Integer<uint32_t>>;
    case DType::kU64: return &typedLoopProduct<Integer<uint64_t>>;
    default: return nullptr;
  }
}

// Y = C broadcast to [m, n] (Gemm only: no batch), before a sum post-op adds beta * Y.
void copyBroadcastC(const float* c, float* y, const Product& p) {
  for (int64_t i = 0; i < p.m; ++i) {
    const float* c_row = c + i * p.c_m;
    float* y_row = y + i * p.n;
    if (p.c_n == 1) {
      std::memcpy(y_row, c_row, static_cast<size_t>(p.n) * sizeof(float));
    } else {
      std::fill_n(y_row, p.n, c_row[0]);
    }
  }
}

// ------------------------------------------------------------------ oneDNN

enum class CMode {
  kNone,  // no C, or beta = 0
  kBias,  // C (or beta * C when constant) as oneDNN's bias
  kSum,   // Y = C before executing, then a sum post-op scaled by beta
};

// What a fused step does after the product and the bias or C: add a residual
// (input 3 of FusedMatMul), then apply an activation.
struct PostOps {
  bool residual = false;
  FusedActivation activation = FusedActivation::kNone;
  float alpha = 0;  // the activation's parameters (core/fused_activation.h)
  float beta = 0;

  bool any() const { return residual || activation != FusedActivation::kNone; }
};

struct MatMulState final : KernelState {
  Product product;
  PostOps post_ops;
  int residual_arg = 0;  // the execute argument of the residual's binary post-op
  bool use_dnnl = false;
  TypedLoop typed_loop = nullptr;  // MatMul in a type other than f32
  dnnl::matmul primitive;
  bool weights_packed = false;
  dnnl::memory packed_weights;
  CMode c_mode = CMode::kNone;
  // bf16 products: A (f32, per call) into the slot's bf16 src.
  std::optional<dnnl::reorder> src_reorder;
  bool bias_from_call = false;
  dnnl::memory constant_bias;
  // A slot's weights point at the packed weights for good, or at B per call;
  // its bias at the constant bias for good, or at C per call.
  onednn::ExecutionSlots slots;
};

// The dimensions and strides of one operand as oneDNN sees it: the batch
// dimensions (1 where the operand broadcasts) then its two matrix dimensions.
void operandLayout(const Product& p, const std::array<int64_t, kMaxRank>& batch_stride, int64_t rows, int64_t cols,
                   int64_t row_stride, int64_t col_stride, Dims& dims, Dims& strides) {
  dims.assign(p.batch_rank + 2, 1);
  strides.assign(p.batch_rank + 2, 0);
  dims[p.batch_rank] = rows;
  dims[p.batch_rank + 1] = cols;
  strides[p.batch_rank] = row_stride;
  strides[p.batch_rank + 1] = col_stride;
  int64_t outer = rows * cols;  // the stride a size-1 dimension gets, as in a dense layout
  for (uint32_t d = p.batch_rank; d-- > 0;) {
    if (batch_stride[d] != 0) {
      dims[d] = p.batch[d];
      strides[d] = batch_stride[d];
      outer = batch_stride[d] * p.batch[d];
    } else {
      strides[d] = outer;
    }
  }
}

// Builds the primitive and the slots; throws dnnl::error where oneDNN refuses.
void prepareDnnl(MatMulState& state, const std::byte* b_constant, const std::byte* c_constant) {
  const Product& p = state.product;
  const dnnl::engine& engine = onednn::cpuEngine();
  Dims dims;
  Dims strides;
  operandLayout(p, p.a_batch_stride, p.m, p.k, p.a_m, p.a_k, dims, strides);
  const dnnl::memory::desc src_plain = onednn::f32Desc(dims, strides);
  // bf16 where asked, B is a constant and the CPU multiplies bf16 natively
  // (AVX-512 BF16); oneDNN elsewhere would emulate it, slower than f32.
  const bool bf16 = p.bf16 && b_constant != nullptr &&
                    dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  const dnnl::memory::data_type compute = bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  const dnnl::memory::desc src =
      bf16 ? dnnl::memory::desc(dims, compute, onednn::denseStrides(dims)) : src_plain;
  operandLayout(p, p.b_batch_stride, p.k, p.n, p.b_k, p.b_n, dims, strides);
  const dnnl::memory::desc weights_plain = onednn::f32Desc(dims, strides);
  const dnnl::memory::desc weights =
      b_constant != nullptr ? dnnl::memory::desc(dims, compute, dnnl::memory::format_tag::any) : weights_plain;
  Dims dst_dims(p.batch_rank + 2);
  for (uint32_t d = 0; d < p.batch_rank; ++d) dst_dims[d] = p.batch[d];
  dst_dims[p.batch_rank] = p.m;
  dst_dims[p.batch_rank + 1] = p.n;
  const dnnl::memory::desc dst = onednn::plainDesc(dst_dims);

  state.c_mode = CMode::kNone;
  if (p.has_c) {
    const bool row = p.c_rows == 1;
    if (p.alpha == 1 && row && (c_constant != nullptr || (p.beta == 1 && p.c_cols == p.n))) {
      state.c_mode = CMode::kBias;
    } else {
      state.c_mode = CMode::kSum;
    }
  }
  Dims bias_dims(p.batch_rank + 2, 1);
  bias_dims[p.batch_rank + 1] = p.n;
  Dims bias_strides(p.batch_rank + 2, p.n);
  bias_strides[p.batch_rank + 1] = 1;
  const dnnl::memory::desc bias = onednn::f32Desc(bias_dims, bias_strides);

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1) attr.set_output_scales(0, {p.alpha});
  // Post-ops run in this order: beta * C (a sum), the residual, the activation.
  dnnl::post_ops post_ops;
  if (state.c_mode == CMode::kSum) post_ops.append_sum(p.beta);
  if (state.post_ops.residual) {
    state.residual_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(post_ops.len()) | DNNL_ARG_SRC_1;
    post_ops.append_binary(dnnl::algorithm::binary_add, dst);
  }
  onednn::appendActivation(post_ops, state.post_ops.activation, state.post_ops.alpha, state.post_ops.beta);
  if (post_ops.len() > 0) attr.set_post_ops(post_ops);
  const dnnl::matmul::desc desc = state.c_mode == CMode::kBias ? dnnl::matmul::desc(src, weights, bias, dst)
                                                               : dnnl::matmul::desc(src, weights, dst);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine);
  state.primitive = dnnl::matmul(pd);
  if (bf16) state.src_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, src_plain, engine, pd.src_desc()));

  if (b_constant != nullptr && pd.weights_desc() != weights_plain) {
    state.packed_weights = onednn::reorderConstant(weights_plain, b_constant, pd.weights_desc());
    state.weights_packed = true;
  }
  if (state.c_mode == CMode::kBias) {
    state.bias_from_call = c_constant == nullptr;
    if (c_constant != nullptr) {
      // beta * C, expanded to the full row once.
      state.constant_bias = dnnl::memory(bias, engine);
      float* values = static_cast<float*>(state.constant_bias.get_data_handle());
      for (int64_t j = 0; j < p.n; ++j) {
        float c;
        std::memcpy(&c, c_constant + static_cast<size_t>(j * p.c_n) * sizeof(float), sizeof c);
        values[j] = p.beta * c;
      }
    }
  }

  state.slots.create(engine, pd.scratchpad_desc());
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    ExecutionSlot& slot = state.slots[i];
    if (state.src_reorder) {
      // Each slot converts A into a buffer of its own (allocated here, once).
      slot.src_plain = dnnl::memory(src_plain, engine, DNNL_MEMORY_NONE);
      slot.src = dnnl::memory(pd.src_desc(), engine);
    } else {
      slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    }
    slot.weights = dnnl::memory(pd.weights_desc(), engine,
                                state.weights_packed ? state.packed_weights.get_data_handle() : DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
    if (state.c_mode == CMode::kBias) {
      slot.bias =
          dnnl::memory(bias, engine, state.bias_from_call ? DNNL_MEMORY_NONE : state.constant_bias.get_data_handle());
    }
    if (state.post_ops.residual) slot.binary = dnnl::memory(dst, engine, DNNL_MEMORY_NONE);
  }
  state.use_dnnl = true;
}

std::unique_ptr<KernelState> makeState(std::string_view op, const Product& p, const std::byte* b_constant,
                                       const std::byte* c_constant, const PostOps& post_ops = {}) {
  auto state = std::make_unique<MatMulState>();
  state->product = p;
  state->post_ops = post_ops;
  bool empty = p.m == 0 || p.n == 0;
  for (uint32_t d = 0; d < p.batch_rank; ++d) empty = empty || p.batch[d] == 0;
  if (empty) return state;  // Y has no elements: nothing to compute
  std::string refusal;
  if (p.k == 0) {
    refusal = "K is 0";  // oneDNN refuses zero dimensions; the loop kernel writes zeros or beta * C
  } else if (p.batch_rank + 2 > DNNL_MAX_NDIMS) {
    refusal = fmt::format("{} batch dimensions are more than oneDNN takes", p.batch_rank);
  } else {
    try {
      prepareDnnl(*state, b_constant, c_constant);
      return state;
    } catch (const dnnl::error& e) {
      refusal = fmt::format("oneDNN refused the product ({})", e.what());
    }
  }
  if (post_ops.any()) {
    throw UsageError(fmt::format("{}: {}; the fused residual and activation run only on oneDNN", op, refusal));
  }
  if (p.k != 0) log::debug("{}: {}; using the loop kernel", op, refusal);
  state = std::make_unique<MatMulState>();
  state->product = p;
  return state;
}

void runProduct(const KernelCall& call) {
  const auto& state = static_cast<const MatMulState&>(*call.state);
  const Product& p = state.product;
  if (state.typed_loop != nullptr) {
    state.typed_loop(call, p);
    return;
  }
  const float* a = call.inputs[0].as<const float>();
  const float* b = call.inputs[1].as<const float>();
  const float* c = p.has_c ? call.inputs[2].as<const float>() : nullptr;
  float* y = call.outputs[0].as<float>();
  if (!state.use_dnnl) {
    loopProduct<F32>(a, b, c, y, p);
    return;
  }
  if (state.c_mode == CMode::kSum) copyBroadcastC(c, y, p);

  ExecutionSlot& slot = state.slots.claim();
  dnnl_exec_arg_t args[6];
  int count = 0;
  if (state.src_reorder) {
    onednn::setHandle(kKernel, slot.src_plain, call.inputs[0].data);
    onednn::reorderSource(kKernel, *state.src_reorder, slot);
  } else {
    onednn::setHandle(kKernel, slot.src, call.inputs[0].data);
  }
  args[count++] = {DNNL_ARG_SRC, slot.src.get()};
  if (!state.weights_packed) onednn::setHandle(kKernel, slot.weights, call.inputs[1].data);
  args[count++] = {DNNL_ARG_WEIGHTS, slot.weights.get()};
  onednn::setHandle(kKernel, slot.dst, y);
  args[count++] = {DNNL_ARG_DST, slot.dst.get()};
  if (state.c_mode == CMode::kBias) {
    if (state.bias_from_call) onednn::setHandle(kKernel, slot.bias, call.inputs[2].data);
    args[count++] = {DNNL_ARG_BIAS, slot.bias.get()};
  }
  if (state.post_ops.residual) {
    onednn::setHandle(kKernel, slot.binary, call.inputs[3].data);
    args[count++] = {state.residual_arg, slot.binary.get()};
  }
  onednn::execute(kKernel, state.primitive, state.slots, slot, args, count);
}

// ------------------------------------------------------------------ prepare

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

std::string shapeString(const std::vector<int64_t>& shape) {
  return TensorInfo{DType::kUndefined, shape}.shapeString();
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// Checks counts, f32 and static shapes of the inputs present.
void expectF32Inputs(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    const std::string expected =
        min_inputs == max_inputs ? std::to_string(min_inputs) : fmt::format("{} to {}", min_inputs, max_inputs);
    throw UsageError(fmt::format("{}: expects {} inputs, got {}", op, expected, setup.inputs.size()));
  }
  if (setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  }
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (input.dtype == DType::kUndefined) continue;  // an omitted optional input
    if (input.dtype != DType::kF32) {
      throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32{}); input {} is {}", op,
                                   dtypeName(input.dtype), op == "MatMul" ? "; f64, f16, bf16, i32, i64, u32, u64 of one type" : "",
                                   i, typeString(input)));
    }
    if (!input.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
}

void expectOutput(std::string_view op, const KernelSetup& setup, const std::vector<int64_t>& shape,
                  DType dtype = DType::kF32) {
  const TensorInfo expected{dtype, shape};
  if (setup.outputs[0] != expected) {
    throw UsageError(
        fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]), typeString(expected)));
  }
}

// The product of inputs 0 and 1 with numpy.matmul semantics; checks the
// output's shape. Input counts and types are checked already.
Product describeMatMul(std::string_view op, const KernelSetup& setup) {
  const std::vector<int64_t>& a = setup.inputs[0].shape;
  const std::vector<int64_t>& b = setup.inputs[1].shape;
  for (size_t i = 0; i < 2; ++i) {
    if (setup.inputs[i].shape.empty()) {
      throw UsageError(fmt::format("{}: input {} is a scalar; MatMul needs at least one dimension", op, i));
    }
  }
  // A 1-D A is a row [1, K] and a 1-D B a column [K, 1]; the promoted
  // dimension is then dropped from the output (numpy.matmul).
  const bool a_vector = a.size() == 1;
  const bool b_vector = b.size() == 1;
  Product p;
  p.m = a_vector ? 1 : a[a.size() - 2];
  p.k = a.back();
  const int64_t k_of_b = b_vector ? b[0] : b[b.size() - 2];
  p.n = b_vector ? 1 : b.back();
  if (p.k != k_of_b) {
    throw UsageError(fmt::format("{}: {} x {}: the inner dimensions differ ({} and {})", op,
                                 typeString(setup.inputs[0]), typeString(setup.inputs[1]), p.k, k_of_b));
  }

  // Broadcast the batch dimensions, right-aligned.
  const std::vector<int64_t> a_batch(a.begin(), a.end() - (a_vector ? 1 : 2));
  const std::vector<int64_t> b_batch(b.begin(), b.end() - (b_vector ? 1 : 2));
  const size_t rank = std::max(a_batch.size(), b_batch.size());
  std::vector<int64_t> out;
  struct Dim {
    int64_t size;
    bool a_full;  // false: A broadcasts along it
    bool b_full;
  };
  std::vector<Dim> collapsed;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t ad = d + a_batch.size() >= rank ? a_batch[d + a_batch.size() - rank] : 1;
    const int64_t bd = d + b_batch.size() >= rank ? b_batch[d + b_batch.size() - rank] : 1;
    if (ad != bd && ad != 1 && bd != 1) {
      throw UsageError(fmt::format("{}: the batch dimensions of {} and {} do not broadcast ({} and {})", op,
                                   shapeString(a), shapeString(b), ad, bd));
    }
    const int64_t size = ad == 1 ? bd : ad;
    out.push_back(size);
    if (size == 1) continue;
    const Dim dim{size, ad == size, bd == size};
    // Neighbours that both operands walk the same way are one dimension.
    if (!collapsed.empty() && collapsed.back().a_full == dim.a_full && collapsed.back().b_full == dim.b_full) {
      collapsed.back().size *= size;
    } else {
      collapsed.push_back(dim);
    }
  }
  if (!a_vector) out.push_back(p.m);
  if (!b_vector) out.push_back(p.n);
  expectOutput(op, setup, out, setup.inputs[0].dtype);

  p.a_m = p.k;
  p.a_k = 1;
  p.b_k = p.n;
  p.b_n = 1;
  bool a_everywhere = true;
  bool b_nowhere = true;
  for (const Dim& dim : collapsed) {
    a_everywhere = a_everywhere && dim.a_full;
    b_nowhere = b_nowhere && !dim.b_full;
  }
  if (a_everywhere && b_nowhere) {
    // One B for every batch and a dense A: the batch folds into M, one plain GEMM.
    for (const Dim& dim : collapsed) p.m *= dim.size;
  } else {
    p.batch_rank = static_cast<uint32_t>(collapsed.size());
    int64_t a_outer = p.m * p.k;
    int64_t b_outer = p.k * p.n;
    for (size_t d = collapsed.size(); d-- > 0;) {
      p.batch[d] = collapsed[d].size;
      p.a_batch_stride[d] = collapsed[d].a_full ? a_outer : 0;
      p.b_batch_stride[d] = collapsed[d].b_full ? b_outer : 0;
      if (collapsed[d].a_full) a_outer *= collapsed[d].size;
      if (collapsed[d].b_full) b_outer *= collapsed[d].size;
    }
  }
  return p;
}

std::unique_ptr<KernelState> prepareMatMul(const KernelSetup& setup) {
  const DType dtype = setup.inputs.size() == 2 ? setup.inputs[0].dtype : DType::kF32;
  if (const TypedLoop loop = typedLoop(dtype); loop != nullptr && setup.inputs[1].dtype == dtype) {
    // The loop kernel in that type; the checks expectF32Inputs makes.
    for (const TensorInfo& input : setup.inputs) {
      if (!input.isStatic()) throw UsageError(fmt::format("MatMul: needs static shapes, got {}", typeString(input)));
    }
    if (setup.outputs.size() != 1) throw UsageError("MatMul: expects 1 output");
    auto state = std::make_unique<MatMulState>();
    state->product = describeMatMul("MatMul", setup);
    state->typed_loop = loop;
    return state;
  }
  expectF32Inputs("MatMul", setup, 2, 2);
  Product p = describeMatMul("MatMul", setup);
  p.bf16 = allowsBf16(setup.params);
  return makeState("MatMul", p, constantInput(setup, 1), nullptr);
}

// Gemm, or FusedGemm with `post_ops`.
std::unique_ptr<KernelState> prepareGemmAs(std::string_view op, const KernelSetup& setup, const PostOps& post_ops) {
  expectF32Inputs(op, setup, 2, 3);
  const TensorInfo& a = setup.inputs[0];
  const TensorInfo& b = setup.inputs[1];
  for (size_t i = 0; i < 2; ++i) {
    if (setup.inputs[i].shape.size() != 2) {
      throw UsageError(fmt::format("{}: input {} must be 2-D, got {}", op, i, typeString(setup.inputs[i])));
    }
  }
  const bool trans_a = setup.params.getInt("transA", 0) != 0;
  const bool trans_b = setup.params.getInt("transB", 0) != 0;
  Product p;
  p.m = trans_a ? a.shape[1] : a.shape[0];
  p.k = trans_a ? a.shape[0] : a.shape[1];
  const int64_t k_of_b = trans_b ? b.shape[1] : b.shape[0];
  p.n = trans_b ? b.shape[0] : b.shape[1];
  if (p.k != k_of_b) {
    throw UsageError(fmt::format("{}: A {} (transA {}) and B {} (transB {}) give K = {} and {}", op, a.shapeString(),
                                 trans_a ? 1 : 0, b.shapeString(), trans_b ? 1 : 0, p.k, k_of_b));
  }
  p.a_m = trans_a ? 1 : p.k;
  p.a_k = trans_a ? p.m : 1;
  p.b_k = trans_b ? 1 : p.n;
  p.b_n = trans_b ? p.k : 1;
  p.alpha = static_cast<float>(setup.params.getFloat("alpha", 1.0));
  p.beta = static_cast<float>(setup.params.getFloat("beta", 1.0));
  p.bf16 = allowsBf16(setup.params);

  const bool has_c = setup.inputs.size() == 3 && setup.inputs[2].dtype != DType::kUndefined;
  if (has_c) {
    // C broadcasts to [M, N] unidirectionally.
    const std::vector<int64_t>& c = setup.inputs[2].shape;
    const bool fits = c.size() <= 2 && (c.size() < 1 || c.back() == 1 || c.back() == p.n) &&
                      (c.size() < 2 || c[0] == 1 || c[0] == p.m);
    if (!fits) {
      throw UsageError(
          fmt::format("{}: C {} does not broadcast to [M, N] = [{}, {}]", op, typeString(setup.inputs[2]), p.m, p.n));
    }
    p.c_rows = c.size() == 2 ? c[0] : 1;
    p.c_cols = c.empty() ? 1 : c.back();
    p.has_c = p.beta != 0;  // ONNX: beta * C; with beta 0, C is not read
    if (p.has_c) {
      p.c_m = p.c_rows == 1 ? 0 : p.c_cols;
      p.c_n = p.c_cols == 1 ? 0 : 1;
    }
  }
  expectOutput(op, setup, {p.m, p.n});
  return makeState(op, p, constantInput(setup, 1), has_c ? constantInput(setup, 2) : nullptr, post_ops);
}

std::unique_ptr<KernelState> prepareGemm(const KernelSetup& setup) { return prepareGemmAs("Gemm", setup, {}); }

// ------------------------------------------------------------ fused forms

bool hasInput(const KernelSetup& setup, size_t index) {
  return index < setup.inputs.size() && setup.inputs[index].dtype != DType::kUndefined;
}

// The activation and its parameters (core/fused_activation.h).
PostOps readPostOps(std::string_view op, const ParamMap& params) {
  const std::string name = params.getString(std::string(kActivationAttribute), "");
  const std::optional<FusedActivation> activation = parseFusedActivation(name);
  if (!activation) throw UsageError(fmt::format("{}: activation '{}' is not one kiln fuses", op, name));
  PostOps post;
  post.activation = *activation;
  post.alpha = static_cast<float>(params.getFloat(std::string(kActivationAlphaAttribute), 0.0));
  post.beta = static_cast<float>(params.getFloat(std::string(kActivationBetaAttribute), 0.0));
  if (post.activation == FusedActivation::kClip && !(post.alpha <= post.beta)) {
    throw UsageError(fmt::format("{}: Clip's min {} is not at most its max {}", op, post.alpha, post.beta));
  }
  return post;
}

std::unique_ptr<KernelState> prepareFusedGemm(const KernelSetup& setup) {
  return prepareGemmAs("kiln.FusedGemm", setup, readPostOps("kiln.FusedGemm", setup.params));
}

// act(MatMul(A, B) + bias + residual); see nn_ops.cc for the operator.
std::unique_ptr<KernelState> prepareFusedMatMul(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.FusedMatMul";
  expectF32Inputs(op, setup, 2, 4);
  for (size_t i = 0; i < 2; ++i) {
    if (setup.inputs[i].shape.size() < 2) {
      throw UsageError(fmt::format("{}: input {} must have rank 2 or more, got {}", op, i, typeString(setup.inputs[i])));
    }
  }
  Product p = describeMatMul(op, setup);
  p.bf16 = allowsBf16(setup.params);
  const std::vector<int64_t>& y = setup.outputs[0].shape;
  if (hasInput(setup, 2)) {
    const std::vector<int64_t>& bias = setup.inputs[2].shape;
    bool fits = !bias.empty() && bias.size() <= y.size() && bias.back() == p.n;
    for (size_t d = 0; fits && d + 1 < bias.size(); ++d) fits = bias[d] == 1;
    if (!fits) {
      throw UsageError(fmt::format("{}: the bias {} must be [N] or [1, ..., N] with N = {} (the output is {})", op,
                                   typeString(setup.inputs[2]), p.n, shapeString(y)));
    }
    // The bias is what a Gemm's one-row C with beta 1 is, in every matrix.
    p.has_c = true;
    p.beta = 1;
    p.c_rows = 1;
    p.c_cols = p.n;
    p.c_m = 0;
    p.c_n = 1;
  }
  PostOps post = readPostOps(op, setup.params);
  post.residual = hasInput(setup, 3);
  if (post.residual && setup.inputs[3].shape != y) {
    throw UsageError(fmt::format("{}: the residual {} must have the output's shape {}", op, typeString(setup.inputs[3]),
                                 shapeString(y)));
  }
  return makeState(op, p, constantInput(setup, 1), hasInput(setup, 2) ? constantInput(setup, 2) : nullptr, post);
}



}  // namespace

void registerMatMulKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"MatMul", &prepareMatMul, &runProduct});
  registry.add(KernelDef{"Gemm", &prepareGemm, &runProduct});
  registry.add(KernelDef{"kiln.FusedMatMul", &prepareFusedMatMul, &runProduct});
  registry.add(KernelDef{"kiln.FusedGemm", &prepareFusedGemm, &runProduct});
}

}  // namespace kiln
