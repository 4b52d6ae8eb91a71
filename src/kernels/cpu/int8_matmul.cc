#include "kernels/cpu/int8_matmul.h"

namespace kiln {
namespace {

constexpr const char* kKernel = "int8 matmul";

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dt integerType(DType dtype) { return dtype == DType::kU8 ? dt::u8 : dt::s8; }

// The primitive for a [m, k] x b [k, n] (+ bias [n], i32, when given) into
// `dst` under `attr`, B packed, the bias copied, the slots made; nullptr
// where oneDNN refuses.
std::unique_ptr<Int8MatMul> makeInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype, dt dst,
                                           dnnl::primitive_attr& attr, const int8_t* b, const int32_t* bias = nullptr) {
  const dnnl::engine& engine = onednn::cpuEngine();
  const dnnl::memory::desc src({m, k}, integerType(a_dtype), tag::ab);
  const dnnl::memory::desc weights_plain({k, n}, dt::s8, tag::ab);
  const dnnl::memory::desc weights_any({k, n}, dt::s8, tag::any);
  const dnnl::memory::desc bias_desc({1, n}, dt::s32, tag::ab);
  const dnnl::memory::desc dst_desc({m, n}, dst, tag::ab);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = bias == nullptr
             ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights_any, dst_desc), attr, engine)
             : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights_any, bias_desc, dst_desc), attr, engine);
  } catch (const dnnl::error&) {
    return nullptr;
  }
  auto matmul = std::make_unique<Int8MatMul>();
  if (bias != nullptr) {
    matmul->bias_values.assign(bias, bias + n);
    matmul->bias = dnnl::memory(bias_desc, engine, matmul->bias_values.data());
  }
  matmul->primitive = dnnl::matmul(pd);
  matmul->packed_b = onednn::reorderConstant(weights_plain, reinterpret_cast<const std::byte*>(b), pd.weights_desc());
  matmul->slots.create(engine, pd.scratchpad_desc());
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    onednn::ExecutionSlot& slot = matmul->slots[i];
    slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
  }
  return matmul;
}

const dnnl::memory::desc& zeroPointDesc() {
  static const dnnl::memory::desc desc({1}, dt::s32, tag::x);
  return desc;
}

}  // namespace

std::unique_ptr<Int8MatMul> prepareInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype, const int8_t* b,
                                              int8_t b_zero) {
  dnnl::primitive_attr attr;
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (b_zero != 0) attr.set_zero_points(DNNL_ARG_WEIGHTS, 0, {b_zero});
  std::unique_ptr<Int8MatMul> matmul = makeInt8MatMul(m, n, k, a_dtype, dt::s32, attr, b);
  if (!matmul) return nullptr;
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    matmul->slots[i].zero_point = dnnl::memory(zeroPointDesc(), onednn::cpuEngine(), DNNL_MEMORY_NONE);
  }
  return matmul;
}

void runInt8MatMul(const Int8MatMul& matmul, const std::byte* a, int32_t a_zero, int32_t* y) {
  onednn::ExecutionSlot& slot = matmul.slots.claim();
  onednn::setHandle(kKernel, slot.src, const_cast<std::byte*>(a));
  onednn::setHandle(kKernel, slot.dst, y);
  onednn::setHandle(kKernel, slot.zero_point, &a_zero);
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, slot.src.get()},
                             {DNNL_ARG_WEIGHTS, matmul.packed_b.get()},
                             {DNNL_ARG_DST, slot.dst.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, slot.zero_point.get()}};
  onednn::execute(kKernel, matmul.primitive, matmul.slots, slot, args, 4);
}

std::unique_ptr<Int8MatMul> prepareRequantizedInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype,
                                                         DType y_dtype, const int8_t* b,
                                                         const std::vector<float>& scales, int32_t a_zero,
                                                         int32_t y_zero, const int32_t* bias) {
  dnnl::primitive_attr attr;
  attr.set_output_scales(scales.size() == 1 ? 0 : 1 << 1, scales);
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  std::unique_ptr<Int8MatMul> matmul = makeInt8MatMul(m, n, k, a_dtype, integerType(y_dtype), attr, b, bias);
  if (!matmul) return nullptr;
  matmul->zeros[0] = a_zero;
  matmul->zeros[1] = y_zero;
  matmul->src_zero = dnnl::memory(zeroPointDesc(), onednn::cpuEngine(), &matmul->zeros[0]);
  matmul->dst_zero = dnnl::memory(zeroPointDesc(), onednn::cpuEngine(), &matmul->zeros[1]);
  return matmul;
}

void runRequantizedInt8MatMul(const Int8MatMul& matmul, const std::byte* a, std::byte* y) {
  onednn::ExecutionSlot& slot = matmul.slots.claim();
  onednn::setHandle(kKernel, slot.src, const_cast<std::byte*>(a));
  onednn::setHandle(kKernel, slot.dst, y);
  dnnl_exec_arg_t args[7] = {{DNNL_ARG_SRC, slot.src.get()},
                             {DNNL_ARG_WEIGHTS, matmul.packed_b.get()},
                             {DNNL_ARG_DST, slot.dst.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, matmul.src_zero.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, matmul.dst_zero.get()},
                             {DNNL_ARG_BIAS, matmul.bias.get(true)}};  // empty without a bias: not passed
  // The last entry is execute's, for the scratchpad.
  onednn::execute(kKernel, matmul.primitive, matmul.slots, slot, args, matmul.bias_values.empty() ? 5 : 6);
}

}  // namespace kiln
